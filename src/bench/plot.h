/* plot.h — `minke bench plot`: SVG charts from result files of `minke bench serve`, written by
 * hand (no plotting library).
 *
 * One SVG with four panels: TTFT, TPOT and E2EL percentiles (p50 solid, p95 dashed, p99 dotted)
 * against concurrency (log2 axis when the sweep spans a factor of 4 or more), and output
 * throughput against interactivity (tokens/s/user) — the Pareto curve of a concurrency sweep, each
 * point labelled with its concurrency and the non-dominated points joined. Each result file is one
 * colour (legend: its --label, else model @ server). A run without a concurrency cap is placed at
 * its peak number of concurrent requests.
 */
#ifndef MK_BENCH_PLOT_H
#define MK_BENCH_PLOT_H

#include "minke.h"

/* Reads n result files and writes the chart to out. title may be NULL. */
int mk_bench_plot(const char *const *files, int n, const char *out, const char *title, mk_err *err);

#endif
