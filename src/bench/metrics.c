/* metrics.c — per-request and aggregate benchmark numbers, the seeded generator and arrival times
 * (metrics.h). Pure functions: the only allocations are scratch copies for sorting. */
#include "bench/metrics.h"
#include "base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- percentiles --------------------------------------------------------------------------- */

double mk_bench_percentile_sorted(const double *a, int n, double q) {
    if (n <= 0) return 0;
    if (n == 1) return a[0];
    double pos = (double)(n - 1) * q / 100.0;
    int lo = (int)floor(pos);
    if (lo < 0) lo = 0;
    if (lo >= n - 1) return a[n - 1];
    double frac = pos - lo;
    /* numpy's linear method: a[lo] + (a[lo+1] - a[lo]) * frac */
    return a[lo] + (a[lo + 1] - a[lo]) * frac;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int mk_bench_dist_of(const double *v, int n, mk_bench_dist *d) {
    memset(d, 0, sizeof *d);
    if (n <= 0) return MK_OK;
    double *s = malloc(sizeof(double) * (size_t)n);
    if (!s) return MK_ENOMEM;
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += s[i];
    d->n = n;
    d->mean = sum / n;
    d->median = mk_bench_percentile_sorted(s, n, 50);
    d->p90 = mk_bench_percentile_sorted(s, n, 90);
    d->p95 = mk_bench_percentile_sorted(s, n, 95);
    d->p99 = mk_bench_percentile_sorted(s, n, 99);
    d->min = s[0];
    d->max = s[n - 1];
    free(s);
    return MK_OK;
}

/* ---- one request --------------------------------------------------------------------------- */

double mk_bench_tpot(const mk_bench_req *r) {
    if (!r->ok || r->output_tokens < 2 || r->n_chunks < 1) return -1;
    return (r->e2el - r->ttft) / (r->output_tokens - 1);
}

double mk_bench_req_itl(const mk_bench_req *r) {
    if (!r->ok || r->output_tokens < 2 || r->n_chunks < 1) return -1;
    return (r->chunk_t[r->n_chunks - 1] - r->chunk_t[0]) / (r->output_tokens - 1);
}

int mk_bench_meets_slo(const mk_bench_req *r, const mk_bench_slo *slo) {
    if (!r->ok) return 0;
    if (slo->ttft > 0 && (r->n_chunks < 1 || r->ttft > slo->ttft)) return 0;
    if (slo->e2el > 0 && r->e2el > slo->e2el) return 0;
    if (slo->tpot > 0) {
        double t = mk_bench_tpot(r);
        /* vLLM counts a one-token request's TPOT as 0 for goodput: it meets any TPOT SLO */
        if (t > slo->tpot) return 0;
    }
    return 1;
}

double mk_bench_peak_output(const mk_bench_req *r, int n, int *peak_concurrency) {
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (!r[i].ok) continue;
        if (r[i].start < t0) t0 = r[i].start;
        if (r[i].start + r[i].e2el > t1) t1 = r[i].start + r[i].e2el;
    }
    if (peak_concurrency) *peak_concurrency = 0;
    if (!(t1 >= t0)) return 0;
    int nb = (int)ceil(t1 - t0) + 1;
    double *tok = calloc((size_t)nb, sizeof(double));
    int *act = calloc((size_t)nb, sizeof(int));
    if (!tok || !act) {
        free(tok);
        free(act);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        const mk_bench_req *q = &r[i];
        if (!q->ok) continue;
        /* tokens per chunk: the usage count spread evenly over the content chunks */
        double per = q->n_chunks ? (double)q->output_tokens / q->n_chunks : 0;
        for (int c = 0; c < q->n_chunks; c++) {
            int b = (int)floor(q->start + q->chunk_t[c] - t0);
            if (b >= 0 && b < nb) tok[b] += per;
        }
        int b0 = (int)floor(q->start - t0), b1 = (int)floor(q->start + q->e2el - t0);
        for (int b = b0; b <= b1 && b < nb; b++)
            if (b >= 0) act[b]++;
    }
    double best = 0;
    int bestc = 0;
    for (int b = 0; b < nb; b++) {
        if (tok[b] > best) best = tok[b];
        if (act[b] > bestc) bestc = act[b];
    }
    if (peak_concurrency) *peak_concurrency = bestc;
    free(tok);
    free(act);
    return best;
}

/* ---- the run ------------------------------------------------------------------------------- */

int mk_bench_summarize(const mk_bench_req *r, int n, double duration, const mk_bench_slo *slo, int gpus,
                       double gpu_hour_cost, mk_bench_summary *s) {
    memset(s, 0, sizeof *s);
    s->duration = duration;
    long n_itl = 0;
    for (int i = 0; i < n; i++)
        if (r[i].ok && r[i].n_chunks > 1) n_itl += r[i].n_chunks - 1;
    size_t cap = (size_t)(n > 0 ? n : 1);
    double *ttft = malloc(sizeof(double) * cap), *tpot = malloc(sizeof(double) * cap);
    double *e2el = malloc(sizeof(double) * cap), *ritl = malloc(sizeof(double) * cap);
    double *itl = malloc(sizeof(double) * (size_t)(n_itl > 0 ? n_itl : 1));
    int rc = MK_ENOMEM;
    if (!ttft || !tpot || !e2el || !ritl || !itl) goto done;
    int nt = 0, np = 0, ne = 0, nr = 0;
    long ni = 0;
    for (int i = 0; i < n; i++) {
        const mk_bench_req *q = &r[i];
        if (!q->ok) {
            s->failed++;
            continue;
        }
        s->completed++;
        s->total_input += q->prompt_tokens >= 0 ? q->prompt_tokens
                          : q->expected_prompt_tokens > 0 ? q->expected_prompt_tokens : 0;
        s->total_output += q->output_tokens;
        if (q->cached_tokens > 0) s->total_cached += q->cached_tokens;
        if (q->n_chunks > 0) ttft[nt++] = q->ttft;
        e2el[ne++] = q->e2el;
        double t = mk_bench_tpot(q);
        if (t >= 0) tpot[np++] = t;
        double ri = mk_bench_req_itl(q);
        if (ri >= 0) ritl[nr++] = ri;
        for (int c = 1; c < q->n_chunks; c++) itl[ni++] = q->chunk_t[c] - q->chunk_t[c - 1];
        if (slo && mk_bench_meets_slo(q, slo)) s->good++;
        if (q->prompt_tokens >= 0 && q->expected_prompt_tokens >= 0) {
            s->prompt_checked++;
            s->prompt_exact += q->prompt_tokens == q->expected_prompt_tokens;
        }
        if (!q->usage_missing && q->expected_output_tokens > 0) {
            s->output_checked++;
            s->output_exact += q->output_tokens == q->expected_output_tokens;
        }
    }
    if ((rc = mk_bench_dist_of(ttft, nt, &s->ttft)) || (rc = mk_bench_dist_of(tpot, np, &s->tpot)) ||
        (rc = mk_bench_dist_of(e2el, ne, &s->e2el)) || (rc = mk_bench_dist_of(itl, (int)ni, &s->itl)) ||
        (rc = mk_bench_dist_of(ritl, nr, &s->req_itl)))
        goto done;
    if (duration > 0) {
        s->request_throughput = s->completed / duration;
        s->output_throughput = (double)s->total_output / duration;
        s->total_throughput = (double)(s->total_input + s->total_output) / duration;
        int slo_set = slo && (slo->ttft > 0 || slo->tpot > 0 || slo->e2el > 0);
        s->goodput = slo_set ? s->good / duration : 0;
    }
    if (s->req_itl.n > 0 && s->req_itl.p90 > 0) s->interactivity = 1.0 / s->req_itl.p90;
    if (gpus < 1) gpus = 1;
    s->tpgs = s->total_throughput / gpus;
    if (gpu_hour_cost > 0 && s->output_throughput > 0)
        s->cost_per_1m_output = gpu_hour_cost * gpus / (s->output_throughput * 3600.0) * 1e6;
    s->peak_output_throughput = mk_bench_peak_output(r, n, &s->peak_concurrency);
    rc = MK_OK;
done:
    free(ttft);
    free(tpot);
    free(e2el);
    free(ritl);
    free(itl);
    return rc;
}

/* ---- generator and arrivals ---------------------------------------------------------------- */

static unsigned long long splitmix64(unsigned long long *x) {
    unsigned long long z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void mk_bench_rng_seed(mk_bench_rng *g, unsigned long long seed) {
    for (int i = 0; i < 4; i++) g->s[i] = splitmix64(&seed);
}

static unsigned long long rotl(unsigned long long x, int k) { return (x << k) | (x >> (64 - k)); }

unsigned long long mk_bench_rng_next(mk_bench_rng *g) {
    unsigned long long *s = g->s;
    unsigned long long r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

double mk_bench_rng_uniform(mk_bench_rng *g) { return (double)(mk_bench_rng_next(g) >> 11) * 0x1.0p-53; }

long mk_bench_rng_range(mk_bench_rng *g, long lo, long hi) {
    if (hi <= lo) return lo;
    unsigned long long span = (unsigned long long)(hi - lo) + 1;
    return lo + (long)(mk_bench_rng_next(g) % span); /* bias < span / 2^64: irrelevant here */
}

static double normal(mk_bench_rng *g) {
    /* Box-Muller; 1 - u keeps the log argument in (0, 1] */
    double u = 1.0 - mk_bench_rng_uniform(g), v = mk_bench_rng_uniform(g);
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

double mk_bench_rng_gamma(mk_bench_rng *g, double shape, double scale) {
    if (shape <= 0) return 0;
    if (shape < 1) {
        /* Gamma(a) = Gamma(a + 1) * U^(1/a) */
        double u = 1.0 - mk_bench_rng_uniform(g);
        return mk_bench_rng_gamma(g, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    /* Marsaglia and Tsang's squeeze method */
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = normal(g);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = 1.0 - mk_bench_rng_uniform(g);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
    }
}

double mk_bench_rng_exp(mk_bench_rng *g, double mean) {
    if (mean <= 0) return 0;
    return -log(1.0 - mk_bench_rng_uniform(g)) * mean;
}

void mk_bench_arrivals(mk_bench_rng *g, int n, double rate, double burstiness, double *t) {
    if (n <= 0) return;
    if (!(rate > 0) || isinf(rate)) {
        for (int i = 0; i < n; i++) t[i] = 0;
        return;
    }
    if (!(burstiness > 0)) burstiness = 1;
    /* gaps ~ Gamma(shape = b, scale = 1 / (rate b)): mean 1/rate, coefficient of variation 1/sqrt(b) */
    double acc = 0;
    for (int i = 0; i < n; i++) {
        acc += mk_bench_rng_gamma(g, burstiness, 1.0 / (rate * burstiness));
        t[i] = acc;
    }
    if (acc > 0) {
        double f = ((double)n / rate) / acc;
        for (int i = 0; i < n; i++) t[i] *= f;
    }
}

int mk_bench_len_sample(mk_bench_rng *g, int len, double r) {
    if (r <= 0) return len < 1 ? 1 : len;
    long lo = (long)floor(len * (1.0 - r)), hi = (long)ceil(len * (1.0 + r));
    if (lo < 1) lo = 1;
    if (hi < lo) hi = lo;
    return (int)mk_bench_rng_range(g, lo, hi);
}
