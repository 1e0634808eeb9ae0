/* report.h — what `minke bench` shows and keeps of a run: the human table on stdout and the
 * result JSON (jansson).
 *
 * A result file is {"tool": "minke bench", "version", "runs": [run...]}: one run per concurrency of
 * a sweep. A run holds the full configuration (server URL, model, server /version, workload and
 * seed), the summary under vLLM `bench serve` key names (mean_ttft_ms, p99_tpot_ms,
 * output_throughput, ...), the server's counters over the run (prefix cache, speculative decoding,
 * token totals, from /metrics before and after), failures by reason, and every request record
 * (times in seconds, as vLLM saves them: start, ttft, e2el, itl gaps, token counts).
 * plot.c reads these files back.
 */
#ifndef MK_BENCH_REPORT_H
#define MK_BENCH_REPORT_H

#include "bench/bench.h"

#include <jansson.h>
#include <stdio.h>

typedef struct {
    const mk_bench_config *cfg;
    const mk_bench_ctx *ctx;
    const char *server_version; /* /version body (JSON text) or NULL */
    int have_prom;              /* /metrics scraped before and after */
    mk_bench_prom before, after;
    const mk_bench_results *res;
    mk_bench_summary sum;
} mk_bench_report;

/* The human summary: counts, throughputs, the latency table (mean / median / p95 / p99 in ms),
 * token-count checks, server counters and failure reasons. */
void mk_bench_print(FILE *f, const mk_bench_report *r);
/* One run as JSON (a new reference). */
json_t *mk_bench_run_json(const mk_bench_report *r);
/* Writes {"tool", "version", "runs"} to path. */
int mk_bench_save(const char *path, json_t *runs, mk_err *err);
/* One summary line per run of a sweep. */
void mk_bench_print_sweep_row(FILE *f, int concurrency, const mk_bench_summary *s, int header);

#endif
