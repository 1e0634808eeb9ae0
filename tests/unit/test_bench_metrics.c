/* test_bench_metrics.c — unit tests of the arithmetic of `minke bench` (src/bench/metrics.h) and
 * of its Prometheus counter parser (src/bench/serverinfo.c).
 *
 * What is checked, on synthetic timestamps with hand-computed answers: percentiles equal numpy's
 * default linear method on small samples (values computed with numpy.percentile and written
 * here); TTFT, TPOT = (E2EL - TTFT) / (n - 1), undefined and left out for a one-token request,
 * pooled ITL, E2EL; failed requests excluded from every latency and counted; throughputs, TPGS,
 * cost per 1M output tokens; goodput under each SLO (a one-token request meets a TPOT SLO, as in
 * vLLM); interactivity = 1 / P90 of per-request ITL; peak output tokens/s in 1 s buckets with the
 * usage count spread over chunks; the prompt/output length checks; gamma arrivals: rescaled to end
 * at exactly n / rate, repeatable with a seed, Poisson-like spread at burstiness 1 and narrower /
 * wider at other shapes; the gamma sampler's mean; random length ranges; /metrics parsing.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/metrics.h"

#define EPS 1e-9
static void near(double a, double b, const char *what) {
    cr_assert(fabs(a - b) < EPS * (1 + fabs(b)), "%s: got %.12g, want %.12g", what, a, b);
}

/* ---- percentiles --------------------------------------------------------------------------- */

Test(bench_metrics, percentiles_match_numpy_linear) {
    double a[] = {1, 2, 3, 4};
    near(mk_bench_percentile_sorted(a, 4, 50), 2.5, "p50 of 1..4");
    near(mk_bench_percentile_sorted(a, 4, 95), 3.85, "p95 of 1..4");
    near(mk_bench_percentile_sorted(a, 4, 99), 3.97, "p99 of 1..4");
    near(mk_bench_percentile_sorted(a, 4, 0), 1, "p0");
    near(mk_bench_percentile_sorted(a, 4, 100), 4, "p100");
    double b[] = {1, 2, 4, 8, 16};
    near(mk_bench_percentile_sorted(b, 5, 50), 4.0, "p50 of powers");
    near(mk_bench_percentile_sorted(b, 5, 90), 12.8, "p90 of powers");
    near(mk_bench_percentile_sorted(b, 5, 95), 14.4, "p95 of powers");
    near(mk_bench_percentile_sorted(b, 5, 99), 15.68, "p99 of powers");
    double one[] = {5};
    near(mk_bench_percentile_sorted(one, 1, 99), 5, "one value");
    near(mk_bench_percentile_sorted(one, 0, 50), 0, "empty sample");
}

Test(bench_metrics, dist_sorts_a_copy) {
    double v[] = {3, 1, 2};
    mk_bench_dist d;
    cr_assert_eq(mk_bench_dist_of(v, 3, &d), 0);
    cr_assert_eq(d.n, 3);
    near(d.mean, 2, "mean");
    near(d.median, 2, "median");
    near(d.min, 1, "min");
    near(d.max, 3, "max");
    near(mk_bench_percentile_sorted((double[]){1, 2, 3}, 3, 37.5), 1.75, "p37.5");
    cr_assert(v[0] == 3 && v[1] == 1 && v[2] == 2, "input was modified");
    cr_assert_eq(mk_bench_dist_of(v, 0, &d), 0);
    cr_assert(d.n == 0 && d.mean == 0 && d.p99 == 0, "empty dist is all zeros");
}

/* ---- a synthetic run ----------------------------------------------------------------------- */

/* A: 4 tokens, chunks at .1 .15 .2 .3, E2EL .32        -> TTFT .1, TPOT .22/3, ITL .05 .05 .1
 * B: 1 token, one chunk at .2, E2EL .25                 -> TPOT undefined
 * C: failed (HTTP 500)
 * D: 3 tokens, chunks at .4 .5 .6, E2EL .6, start 1.2   -> TTFT .4, TPOT .1, ITL .1 .1 */
static double ta[] = {0.1, 0.15, 0.2, 0.3}, tb[] = {0.2}, td[] = {0.4, 0.5, 0.6};

static void make_run(mk_bench_req r[4]) {
    memset(r, 0, sizeof(mk_bench_req) * 4);
    r[0] = (mk_bench_req){.id = 0, .session = -1, .ok = 1, .start = 0.0, .ttft = 0.1, .e2el = 0.32, .chunk_t = ta,
                          .n_chunks = 4, .prompt_tokens = 10, .output_tokens = 4, .cached_tokens = 4,
                          .expected_prompt_tokens = 10, .expected_output_tokens = 4};
    r[1] = (mk_bench_req){.id = 1, .session = -1, .ok = 1, .start = 0.5, .ttft = 0.2, .e2el = 0.25, .chunk_t = tb,
                          .n_chunks = 1, .prompt_tokens = 20, .output_tokens = 1, .cached_tokens = -1,
                          .expected_prompt_tokens = 21, .expected_output_tokens = 1};
    r[2] = (mk_bench_req){.id = 2, .session = -1, .ok = 0, .start = 0.6, .e2el = 0.01, .prompt_tokens = -1,
                          .output_tokens = 0, .cached_tokens = -1, .usage_missing = 1, .expected_prompt_tokens = 30,
                          .expected_output_tokens = 8};
    strcpy(r[2].error, "HTTP 500: injected");
    r[3] = (mk_bench_req){.id = 3, .session = -1, .ok = 1, .start = 1.2, .ttft = 0.4, .e2el = 0.6, .chunk_t = td,
                          .n_chunks = 3, .prompt_tokens = 30, .output_tokens = 3, .cached_tokens = -1,
                          .expected_prompt_tokens = 30, .expected_output_tokens = 5};
}

Test(bench_metrics, tpot_and_request_itl) {
    mk_bench_req r[4];
    make_run(r);
    near(mk_bench_tpot(&r[0]), 0.22 / 3, "TPOT of A");
    cr_assert_eq(mk_bench_tpot(&r[1]), -1, "TPOT of a one-token request is undefined");
    cr_assert_eq(mk_bench_tpot(&r[2]), -1, "TPOT of a failed request is undefined");
    near(mk_bench_tpot(&r[3]), 0.1, "TPOT of D");
    near(mk_bench_req_itl(&r[0]), 0.2 / 3, "per-request ITL of A");
    cr_assert_eq(mk_bench_req_itl(&r[1]), -1);
}

Test(bench_metrics, summary_of_a_run) {
    mk_bench_req r[4];
    make_run(r);
    mk_bench_slo slo = {.ttft = 0.25, .tpot = 0.08};
    mk_bench_summary s;
    cr_assert_eq(mk_bench_summarize(r, 4, 2.0, &slo, 2, 3.6, &s), 0);
    cr_assert_eq(s.completed, 3);
    cr_assert_eq(s.failed, 1);
    cr_assert_eq(s.total_input, 60, "failed requests add no tokens");
    cr_assert_eq(s.total_output, 8);
    cr_assert_eq(s.total_cached, 4);
    near(s.duration, 2.0, "duration");
    near(s.request_throughput, 1.5, "req/s");
    near(s.output_throughput, 4.0, "output tok/s");
    near(s.total_throughput, 34.0, "total tok/s");
    near(s.tpgs, 17.0, "TPGS over 2 GPUs");
    /* $3.6/h x 2 GPUs / (4 tok/s x 3600 s) x 1e6 */
    near(s.cost_per_1m_output, 500.0, "cost per 1M output tokens");
    /* TTFT over A, B, D = .1 .2 .4 */
    cr_assert_eq(s.ttft.n, 3);
    near(s.ttft.mean, 0.7 / 3, "TTFT mean");
    near(s.ttft.median, 0.2, "TTFT median");
    near(s.ttft.p95, 0.38, "TTFT p95");
    near(s.ttft.p99, 0.396, "TTFT p99");
    /* TPOT over A and D only */
    cr_assert_eq(s.tpot.n, 2, "the one-token request has no TPOT");
    near(s.tpot.mean, (0.22 / 3 + 0.1) / 2, "TPOT mean");
    near(s.tpot.median, (0.22 / 3 + 0.1) / 2, "TPOT median");
    /* pooled ITL .05 .05 .1 .1 .1 */
    cr_assert_eq(s.itl.n, 5);
    near(s.itl.mean, 0.08, "ITL mean");
    near(s.itl.median, 0.1, "ITL median");
    near(s.itl.p95, 0.1, "ITL p95");
    /* E2EL .32 .25 .6 */
    cr_assert_eq(s.e2el.n, 3);
    near(s.e2el.median, 0.32, "E2EL median");
    /* interactivity: 1 / p90 of {.2/3, .1} = 1 / 0.0966666... */
    near(s.interactivity, 1.0 / (0.2 / 3 + 0.9 * (0.1 - 0.2 / 3)), "interactivity");
    /* goodput: A (TTFT .1, TPOT .073) and B (TTFT .2, TPOT undefined) meet it, D (TTFT .4) not */
    cr_assert_eq(s.good, 2);
    near(s.goodput, 1.0, "goodput");
    /* length checks: B's prompt differs from its built length; D stopped early */
    cr_assert_eq(s.prompt_checked, 3);
    cr_assert_eq(s.prompt_exact, 2);
    cr_assert_eq(s.output_checked, 3);
    cr_assert_eq(s.output_exact, 2);
    /* peak: bucket 0 holds A's 4 tokens and B's 1, bucket 1 D's 3 */
    near(s.peak_output_throughput, 5.0, "peak output tok/s");
    cr_assert_eq(s.peak_concurrency, 2);
}

Test(bench_metrics, slo_kinds) {
    mk_bench_req r[4];
    make_run(r);
    mk_bench_slo e2el = {.e2el = 0.3}, tpot = {.tpot = 0.09}, none = {0};
    cr_assert(!mk_bench_meets_slo(&r[0], &e2el) && mk_bench_meets_slo(&r[1], &e2el) && !mk_bench_meets_slo(&r[3], &e2el));
    cr_assert(mk_bench_meets_slo(&r[0], &tpot), "A's TPOT .073 <= .09");
    cr_assert(mk_bench_meets_slo(&r[1], &tpot), "a one-token request meets any TPOT SLO");
    cr_assert(!mk_bench_meets_slo(&r[3], &tpot), "D's TPOT .1 > .09");
    cr_assert(!mk_bench_meets_slo(&r[2], &none), "a failed request never counts as good");
    mk_bench_summary s;
    cr_assert_eq(mk_bench_summarize(r, 4, 2.0, &none, 1, 0, &s), 0);
    cr_assert_eq(s.goodput, 0, "no SLO: goodput is not reported");
    cr_assert_eq(s.cost_per_1m_output, 0, "no price: no cost");
}

Test(bench_metrics, all_failed_and_empty) {
    mk_bench_req r[4];
    make_run(r);
    mk_bench_summary s;
    cr_assert_eq(mk_bench_summarize(&r[2], 1, 1.0, NULL, 1, 0, &s), 0);
    cr_assert_eq(s.completed, 0);
    cr_assert_eq(s.failed, 1);
    cr_assert(s.ttft.n == 0 && s.tpot.n == 0 && s.itl.n == 0 && s.e2el.n == 0);
    cr_assert_eq(s.peak_output_throughput, 0);
    cr_assert_eq(s.interactivity, 0);
    cr_assert_eq(mk_bench_summarize(NULL, 0, 0, NULL, 1, 0, &s), 0);
}

Test(bench_metrics, peak_spreads_usage_over_chunks) {
    /* 6 tokens in 2 chunks (3 per event), one in each second; another request of 2 tokens in 1 chunk */
    double t1[] = {0.5, 1.5}, t2[] = {1.1};
    mk_bench_req r[2] = {
        {.ok = 1, .start = 0.2, .ttft = 0.5, .e2el = 1.6, .chunk_t = t1, .n_chunks = 2, .output_tokens = 6},
        {.ok = 1, .start = 0.6, .ttft = 1.1, .e2el = 1.2, .chunk_t = t2, .n_chunks = 1, .output_tokens = 2},
    };
    int pc;
    /* buckets from t0 = 0.2: chunk .7 -> 0 (3), chunk 1.7 -> 1 (3), chunk 1.7 -> 1 (2) */
    near(mk_bench_peak_output(r, 2, &pc), 5.0, "peak");
    cr_assert_eq(pc, 2);
}

/* ---- arrivals ------------------------------------------------------------------------------ */

static double cv_of_gaps(const double *t, int n) {
    double m = t[n - 1] / n, v = 0, prev = 0;
    for (int i = 0; i < n; i++) {
        double g = t[i] - prev;
        prev = t[i];
        v += (g - m) * (g - m);
    }
    return sqrt(v / n) / m;
}

Test(bench_metrics, gamma_arrivals_rescaled_and_seeded) {
    enum { N = 4000 };
    static double a[N], b[N];
    mk_bench_rng g;
    mk_bench_rng_seed(&g, 42);
    mk_bench_arrivals(&g, 100, 10.0, 1.0, a);
    near(a[99], 10.0, "100 requests at 10/s end at exactly 10 s");
    for (int i = 1; i < 100; i++) cr_assert(a[i] >= a[i - 1], "arrivals are sorted");
    cr_assert(a[0] > 0, "the first request waits one gap too");
    mk_bench_rng_seed(&g, 42);
    mk_bench_arrivals(&g, 100, 10.0, 1.0, b);
    cr_assert(!memcmp(a, b, 100 * sizeof(double)), "same seed, same arrivals");
    mk_bench_rng_seed(&g, 43);
    mk_bench_arrivals(&g, 100, 10.0, 1.0, b);
    cr_assert(memcmp(a, b, 100 * sizeof(double)), "another seed, other arrivals");
    /* shape: Poisson gaps have CV 1; gamma(k) gaps CV 1/sqrt(k) */
    mk_bench_rng_seed(&g, 7);
    mk_bench_arrivals(&g, N, 5.0, 1.0, a);
    near(a[N - 1], N / 5.0, "end time");
    double cv = cv_of_gaps(a, N);
    cr_assert(cv > 0.9 && cv < 1.1, "burstiness 1: CV %.3f, want ~1", cv);
    mk_bench_arrivals(&g, N, 5.0, 0.25, a);
    cv = cv_of_gaps(a, N);
    cr_assert(cv > 1.7 && cv < 2.3, "burstiness 0.25: CV %.3f, want ~2", cv);
    mk_bench_arrivals(&g, N, 5.0, 100, a);
    cv = cv_of_gaps(a, N);
    cr_assert(cv > 0.08 && cv < 0.12, "burstiness 100: CV %.3f, want ~0.1", cv);
    mk_bench_arrivals(&g, 10, INFINITY, 1.0, a);
    for (int i = 0; i < 10; i++) cr_assert_eq(a[i], 0, "rate inf: everything at 0");
}

Test(bench_metrics, gamma_sampler_mean) {
    mk_bench_rng g;
    mk_bench_rng_seed(&g, 1);
    double shapes[] = {0.5, 1, 2.5, 9}, sum;
    for (int k = 0; k < 4; k++) {
        sum = 0;
        for (int i = 0; i < 40000; i++) sum += mk_bench_rng_gamma(&g, shapes[k], 2.0);
        double mean = sum / 40000, want = shapes[k] * 2.0;
        cr_assert(fabs(mean - want) < 0.03 * want, "gamma(%g, 2): mean %.4f, want %.4f", shapes[k], mean, want);
    }
}

Test(bench_metrics, random_lengths) {
    mk_bench_rng g;
    mk_bench_rng_seed(&g, 3);
    int lo = 1 << 30, hi = 0;
    for (int i = 0; i < 5000; i++) {
        int v = mk_bench_len_sample(&g, 100, 0.5);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    cr_assert(lo == 50 && hi == 150, "range [%d, %d], want [50, 150]", lo, hi);
    cr_assert_eq(mk_bench_len_sample(&g, 100, 0), 100);
    cr_assert_eq(mk_bench_len_sample(&g, 1, 0.9), 1, "at least 1 token");
}

/* ---- /metrics ------------------------------------------------------------------------------ */

Test(bench_metrics, prometheus_counters) {
    const char *t = "# HELP vllm:prefix_cache_queries Prefix cache queries\n"
                    "# TYPE vllm:prefix_cache_queries counter\n"
                    "vllm:prefix_cache_queries_total{model_name=\"a b\",engine=\"0\"} 100\n"
                    "vllm:prefix_cache_queries_total{model_name=\"a b\",engine=\"1\"} 28\n"
                    "vllm:prefix_cache_hits{model_name=\"m\"} 64.0\n"
                    "vllm:prefix_cache_hits_created 1.7e9\n"
                    "vllm:spec_decode_num_drafts_total 10\n"
                    "vllm:spec_decode_num_draft_tokens_total 30\n"
                    "vllm:spec_decode_num_accepted_tokens_total 21\n"
                    "vllm:generation_tokens_total 5e2\n"
                    "vllm:num_requests_running 3\n";
    mk_bench_prom p;
    mk_bench_prom_parse(t, &p);
    near(p.prefix_queries, 128, "queries summed over engines");
    near(p.prefix_hits, 64, "hits without _total; _created ignored");
    near(p.spec_drafts, 10, "drafts");
    near(p.spec_draft_tokens, 30, "draft tokens");
    near(p.spec_accepted, 21, "accepted");
    near(p.generation_tokens, 500, "generation tokens");
    cr_assert_eq(p.prompt_tokens, -1, "absent counter is -1");
    cr_assert_eq(p.preemptions, -1);
}
