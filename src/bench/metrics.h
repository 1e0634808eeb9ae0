/* metrics.h — the arithmetic of `minke bench`: per-request records and the aggregate numbers
 * computed from them, exactly as shared/docs/benchmarking.md defines them (vLLM `bench serve`
 * semantics, so numbers compare with vLLM's tool).
 *
 * Everything here is a pure function of the records: no clock, no I/O, no global state, so the unit
 * test (tests/unit/test_bench_metrics.c) can feed synthetic timestamps and check every number by
 * hand. Times are seconds (double) relative to the start of the run; reports convert to ms.
 *
 * Definitions (one request):
 *   TTFT  send -> first chunk that carries generated content (text, content, reasoning or tool
 *         calls); role-only and usage-only chunks do not count.
 *   E2EL  send -> last byte of the response.
 *   TPOT  (E2EL - TTFT) / (n - 1) with n the output tokens from the server's usage; undefined for
 *         n <= 1 (such a request is left out of the TPOT statistics and, as vLLM does, passes a
 *         TPOT SLO).
 *   ITL   the gaps between consecutive content chunks; pooled over all requests for the ITL
 *         statistics.
 *   per-request ITL (for interactivity): (t_last_content - t_first_content) / (n - 1), the mean
 *         gap per token of one request; interactivity = 1 / P90 over requests of that, in
 *         tokens/s/user (the slow tail user, as SemiAnalysis InferenceX plots it).
 * Aggregates: mean, median, p95, p99 with numpy's default ("linear") percentile; request, output
 * and total token throughput over the run's duration; peak output tokens/s in 1 s buckets from the
 * earliest start (each content chunk carries output_tokens / n_chunks tokens, which is vLLM's one token
 * per chunk when the server streams one token per event); goodput = requests meeting every SLO /
 * duration; cost per 1M output tokens = $/GPU-hour x GPUs / (output tokens per hour) x 1e6;
 * TPGS = total tokens / s / GPUs.
 */
#ifndef MK_BENCH_METRICS_H
#define MK_BENCH_METRICS_H

#include <stddef.h>

/* One request as measured. Owned by the run (runner.c) that fills it; chunk times are malloc'd. */
typedef struct {
    int id;            /* index in the run (arrival order) */
    int session, turn; /* agentic workload: session index (-1 otherwise) and turn (0-based) */
    int subagent;      /* agentic: 0 for a main session, k >= 1 for the k-th sub-agent */
    int ok;            /* 1: HTTP 200 and a complete stream */
    char error[256];   /* failure reason when !ok */
    double start;      /* send time, seconds since the run started */
    double ttft;       /* seconds; valid when n_chunks > 0 */
    double e2el;       /* seconds */
    double *chunk_t;   /* [n_chunks] arrival of each content chunk, seconds since `start` */
    int n_chunks;
    int prompt_tokens;          /* usage.prompt_tokens (-1: no usage) */
    int output_tokens;          /* usage.completion_tokens (falls back to n_chunks, see usage_missing) */
    int cached_tokens;          /* usage.prompt_tokens_details.cached_tokens (-1: not reported) */
    int usage_missing;          /* the stream carried no usage object */
    int expected_prompt_tokens; /* the prompt as built (-1: unknown) */
    int expected_output_tokens; /* max_tokens asked */
} mk_bench_req;

/* mean, median, p95, p99 (and p90, used by interactivity) of one sample; n = its size. */
typedef struct {
    int n;
    double mean, median, p90, p95, p99, min, max;
} mk_bench_dist;

/* SLOs in seconds; <= 0 means "not set". */
typedef struct {
    double ttft, tpot, e2el;
} mk_bench_slo;

typedef struct {
    int completed, failed;
    double duration;     /* seconds, run start -> last response */
    long total_input;    /* sum of prompt tokens of completed requests (usage; else the built length) */
    long total_output;   /* sum of output tokens of completed requests */
    long total_cached;   /* sum of usage cached tokens (where reported) */
    double request_throughput, output_throughput, total_throughput; /* per second */
    double peak_output_throughput; /* tokens/s, best 1 s bucket */
    int peak_concurrency;          /* most requests active in one 1 s bucket */
    double goodput;                /* requests/s meeting every SLO set (0 when no SLO) */
    int good;                      /* requests meeting every SLO */
    double interactivity;          /* tokens/s/user = 1 / P90 per-request ITL (0 if undefined) */
    double tpgs;                   /* total tokens / s / GPU */
    double cost_per_1m_output;     /* $ (0 if no --gpu-hour-cost) */
    mk_bench_dist ttft, tpot, itl, e2el, req_itl; /* seconds */
    int prompt_exact, prompt_checked; /* usage.prompt_tokens == built length, over requests checked */
    int output_exact, output_checked; /* usage.completion_tokens == max_tokens, over requests checked */
} mk_bench_summary;

/* numpy.percentile(a, q) with the default linear method on a sorted array of n >= 1 values:
 * position (n - 1) q / 100, linear between the neighbours. */
double mk_bench_percentile_sorted(const double *sorted, int n, double q);
/* Fills d from n values (copied and sorted internally; v is not modified). n == 0 gives all
 * zeros. Returns 0 or MK_ENOMEM. */
int mk_bench_dist_of(const double *v, int n, mk_bench_dist *d);

/* TPOT of one request in seconds, or -1 when undefined (failed, or fewer than 2 output tokens). */
double mk_bench_tpot(const mk_bench_req *r);
/* Per-request mean ITL in seconds, or -1 when undefined. */
double mk_bench_req_itl(const mk_bench_req *r);
/* Whether a completed request meets every SLO that is set (TPOT undefined counts as met). */
int mk_bench_meets_slo(const mk_bench_req *r, const mk_bench_slo *slo);
/* Peak output tokens/s over 1 s buckets counted from the earliest start among completed requests
 * (as vLLM counts); optionally the peak number of requests active in one bucket. Failed requests
 * are not counted. */
double mk_bench_peak_output(const mk_bench_req *r, int n, int *peak_concurrency);

/* Aggregates n records over a run of `duration` seconds. gpus >= 1; gpu_hour_cost <= 0: no cost.
 * Returns 0 or MK_ENOMEM. */
int mk_bench_summarize(const mk_bench_req *r, int n, double duration, const mk_bench_slo *slo, int gpus,
                       double gpu_hour_cost, mk_bench_summary *s);

/* ---- arrivals ------------------------------------------------------------------------------ */

/* A small seeded generator (xoshiro256** seeded by splitmix64): the same seed gives the same
 * workload and arrival times on every machine. */
typedef struct {
    unsigned long long s[4];
} mk_bench_rng;

void mk_bench_rng_seed(mk_bench_rng *g, unsigned long long seed);
unsigned long long mk_bench_rng_next(mk_bench_rng *g);
double mk_bench_rng_uniform(mk_bench_rng *g);            /* [0, 1) */
long mk_bench_rng_range(mk_bench_rng *g, long lo, long hi); /* integer in [lo, hi] */
double mk_bench_rng_gamma(mk_bench_rng *g, double shape, double scale);
double mk_bench_rng_exp(mk_bench_rng *g, double mean);

/* Send times of n requests at `rate` requests/s (rate <= 0 or infinite: all at 0): gamma
 * inter-arrival gaps with shape = burstiness and mean 1/rate, the first request also waiting one
 * gap; the cumulative times are then rescaled so the last request goes out at exactly n / rate
 * seconds (vLLM does the same, so two seeds give the same mean rate). */
void mk_bench_arrivals(mk_bench_rng *g, int n, double rate, double burstiness, double *t);

/* Lengths for the random workload: uniform integers in [floor(len (1 - r)), ceil(len (1 + r))],
 * at least 1. */
int mk_bench_len_sample(mk_bench_rng *g, int len, double range_ratio);

#endif
