/* bench_dsv4_cuda.c — batch-1 decode speed of minke's DeepSeek-V4 GPU forward (dsv4_cuda.c).
 *
 * Loads a checkpoint directory (e.g. one from tools/gen_dsv4.py with V4-Flash's full widths),
 * uploads it, prefills a fixed pseudo-random prompt, then decodes greedily (each step feeds the
 * argmax of the last), timing every step on the host clock (a step ends with the logits copied
 * back, so it is complete). Reports the median step, tokens/s, the weight bytes one step reads,
 * the achieved bytes/s against a device-to-device copy measured in the same run, and the first
 * greedy tokens (for a cross-check with another engine on the same weights).
 * Then the engine's batched path (dsv4_cuda_forward_batch over paged sequences in one pool, the
 * calls the server makes): prefill throughput of one prompt of prefill_len tokens in one call, and
 * decode throughput at each batch size B (B sequences, a 16-token prompt each in one batched call,
 * then steps of B one-token pieces, every piece's logits copied back as the engine needs them),
 * next to the bf16 GEMM throughput (cuBLAS, 8192^3) measured in the same run and the linear FLOPs
 * one token costs.
 * Usage: bench_dsv4_cuda DIR [prompt_len=16] [decode_steps=64] [out.md] [batches=64,256]
 *        [prefill_len=2048]
 * Decode steps run as the library runs them: replayed CUDA graphs unless MINKE_CUDA_GRAPHS=0 (the
 * report counts the batch-1 sequence's captured / replayed steps); the traced step runs as launches.
 * MINKE_CUDA_TRACE_PREFILL=FILE: the same for one more run of the prefill (after the timed one).
 * MINKE_CUDA_PROFILE=1: phase tables of each section (synchronized, so the timings of that run
 * are not the benchmark's).
 * A sampled request's step (temperature 0.8, top_p 0.95, seeded) is timed both ways: the token drawn
 * on the GPU (mk_sampler_plain_draw's draw through dsv4_cuda_forward_batch_am, MINKE_MODEL_DRAW's
 * path) and the logits row to the host for the host sampler. DSV4_SAMPLE_T sets another temperature
 * (a lower one makes the generated checkpoint's near-uniform rows peaked). A request with penalties
 * and a logit_bias is timed the same two ways: picked on the GPU with the sampler's adjusted tokens
 * (mk_sampler_model_step, the engine's MINKE_MODEL_ADJUST path), and on the host.
 */
#include "engine/sampler.h"
#include "models/dsv4.h"
#include "models/dsv4_cuda.h"
#include "num/formats.h"
#include "ops/cuda/ops_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* MINKE_CUDA_TRACE=FILE: one more decode step with an event after every launch; the launches in
 * order (GPU interval, when queued, when done) go to FILE, and a table by launch name to stdout:
 * the real kernel durations at full clocks, and whether the GPU waited for the host. */
typedef struct {
    const char *name;
    int n;
    double us;
} trace_row;

static int cmp_trace(const void *a, const void *b) {
    double x = ((const trace_row *)a)->us, y = ((const trace_row *)b)->us;
    return x > y ? -1 : x < y;
}

/* Writes the trace recorded since mk_cuda_trace_start (wall: the host time of the traced call). */
static int trace_report(mk_cuda_ctx *ctx, const char *title, double wall, const char *path) {
    enum { CAP = 16384 };
    static const char *names[CAP];
    static float us[CAP], qd[CAP], dn[CAP];
    static trace_row rows[CAP];
    mk_err err = {0};
    int n = mk_cuda_trace_stop(ctx, CAP, names, us, qd, dn, &err);
    if (n < 0) {
        fprintf(stderr, "trace: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(path, "w");
    int nr = 0, starved = 0;
    double tot = 0.0;
    for (int i = 0; i < n; i++) {
        if (f) fprintf(f, "%4d %-36s %9.2f us  queued %9.1f  done %9.1f\n", i, names[i], us[i], qd[i], dn[i]);
        tot += us[i];
        if (dn[i] - qd[i] < 20.0f) starved++;
        int j = 0;
        while (j < nr && strcmp(rows[j].name, names[i])) j++;
        if (j == nr) rows[nr++] = (trace_row){names[i], 0, 0.0};
        rows[j].n++;
        rows[j].us += us[i];
    }
    if (f) fclose(f);
    qsort(rows, (size_t)nr, sizeof rows[0], cmp_trace);
    printf("\n## %s (MINKE_CUDA_TRACE): %d launches, %.1f us on the GPU, %.1f us wall; "
           "the host queued the last launch at %.1f us; %d launches finished < 20 us after being queued\n\n"
           "| launch | count | us | %% |\n| --- | --- | --- | --- |\n",
           title, n, tot, wall * 1e6, n ? qd[n - 1] : 0.0f, starved);
    for (int j = 0; j < nr; j++)
        printf("| %s | %d | %.1f | %.1f |\n", rows[j].name, rows[j].n, rows[j].us, 100.0 * rows[j].us / tot);
    return 0;
}

static int trace_step(mk_cuda_ctx *ctx, dsv4_cuda_seq *s, int32_t *toks, int at, float *logits, const char *path) {
    mk_err err = {0};
    double a = now();
    if (mk_cuda_trace_start(ctx, &err) || dsv4_cuda_forward(s, &toks[at], 1, logits, &err)) {
        fprintf(stderr, "trace: %s\n", err.msg);
        return 1;
    }
    return trace_report(ctx, "one traced decode step", now() - a, path);
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Linear FLOPs of one token (2 n k per weight it multiplies: dense, n_act routed experts, shared,
 * head), the counterpart of dsv4_cuda_decode_weight_bytes. */
static double token_flops(const dsv4_model *m) {
    const dsv4_config *c = &m->cfg;
    double f = 2.0 * m->head.n * m->head.k;
    for (int l = 0; l < c->n_layers; l++) {
        const dsv4_layer *L = &m->layers[l];
        const mk_wmat *ws[] = {&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->gate,
                               &L->shared.w1, &L->shared.w2, &L->shared.w3, &L->cmp.wkv,
                               &L->cmp.wgate, &L->idx_cmp.wkv, &L->idx_cmp.wgate, &L->idx_wq_b,
                               &L->idx_wproj};
        int nw = L->ratio == 4 ? 15 : L->ratio ? 11 : 9;
        for (int i = 0; i < nw; i++) f += 2.0 * ws[i]->n * ws[i]->k;
        f += 2.0 * c->n_act * 3.0 * L->experts[0].w1.n * L->experts[0].w1.k;
    }
    return f;
}

/* cuBLAS bf16 GEMM TFLOP/s at 8192^3 (the matrix-throughput reference; 0 without cuBLAS). */
static double gemm_tflops(mk_cuda_ctx *ctx) {
    const int n = 8192, k = 8192, m = 8192;
    mk_err err = {0};
    uint16_t *hw = malloc(sizeof(uint16_t) * (size_t)n * k);
    if (!hw) return 0;
    for (size_t i = 0; i < (size_t)n * k; i++) hw[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 256);
    mk_wmat h = {.kind = MK_W_BF16, .n = n, .k = k, .w = hw}, d;
    float *x = NULL, *y = NULL;
    void *scr = NULL;
    double tf = 0;
    size_t sb = mk_cuda_linear_scratch(ctx, &h, m);
    if (!mk_cuda_wmat_upload(ctx, &h, &d, &err) && !mk_cuda_alloc(ctx, sizeof(float) * (size_t)m * k, (void **)&x, &err) &&
        !mk_cuda_alloc(ctx, sizeof(float) * (size_t)m * n, (void **)&y, &err) && !mk_cuda_alloc(ctx, sb, &scr, &err) &&
        !mk_cuda_memset(ctx, x, 0, sizeof(float) * (size_t)m * k, &err)) {
        int ok = 1;
        for (int it = 0; it < 2 && ok; it++)
            ok = !mk_cuda_linear_ex(ctx, MK_CUDA_K_GEMM, 0, &d, x, m, y, 0, scr, sb, &err);
        ok = ok && !mk_cuda_ctx_sync(ctx, &err);
        double a = now();
        for (int it = 0; it < 10 && ok; it++)
            ok = !mk_cuda_linear_ex(ctx, MK_CUDA_K_GEMM, 0, &d, x, m, y, 0, scr, sb, &err);
        ok = ok && !mk_cuda_ctx_sync(ctx, &err);
        if (ok) tf = 10 * 2.0 * m * n * k / (now() - a) / 1e12;
        else fprintf(stderr, "gemm reference: %s\n", err.msg);
        mk_cuda_wmat_free(ctx, &d);
    }
    mk_cuda_free(ctx, x);
    mk_cuda_free(ctx, y);
    mk_cuda_free(ctx, scr);
    free(hw);
    return tf;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* N decode steps of s sampled on the host (the logits row to mk_sampler_sample), each step's time
 * in dt; *tk: the token fed, then the last one sampled. 0, or 1 with a message naming what. */
static int host_sampled_steps(dsv4_cuda_seq *s, mk_sampler *smp, int32_t *tk, int N, float *logits, double *dt,
                              const char *what) {
    mk_err err = {0};
    for (int i = 0; i < N; i++) {
        mk_sample_out so;
        double a = now();
        if (dsv4_cuda_forward(s, tk, 1, logits, &err) || mk_sampler_sample(smp, logits, &so, &err)) {
            fprintf(stderr, "decode (%s) %d: %s\n", what, i, err.msg);
            return 1;
        }
        dt[i] = now() - a;
        mk_sampler_accept(smp, so.token);
        *tk = so.token;
    }
    return 0;
}

/* The median of dt[3, N) (the first 3 steps are warm-up; sorts that part in place). */
static double median_after_warmup(double *dt, int N) {
    qsort(dt + 3, (size_t)(N - 3), sizeof(double), cmpd);
    return dt[3 + (N - 3) / 2];
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [prompt_len] [decode_steps] [out.md] [batches, e.g. 64,256, or none] [prefill_len]\n", argv[0]);
        return 2;
    }
    mk_num_init();
    if (mk_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    int P = argc > 2 ? atoi(argv[2]) : 16, N = argc > 3 ? atoi(argv[3]) : 64;
    if (P < 1) P = 1;
    if (N < 4) N = 4;
    mk_err err = {0};
    double t0 = now();
    dsv4_model *m;
    /* room for the sequence below: the prefill, 6 x N steps and the graph probe */
    mk_model_options opt = {.n_threads = 1, .max_seq_len = (P + 7 * N + 8 > 4096 ? P + 7 * N + 8 : 4096) + 16};
    if (dsv4_model_load(argv[1], &opt, &m, &err)) {
        fprintf(stderr, "load: %s\n", err.msg);
        return 1;
    }
    const dsv4_config *c = &m->cfg;
    double t_load = now() - t0;
    mk_cuda_ctx *ctx;
    if (mk_cuda_ctx_create(0, &ctx, &err)) {
        fprintf(stderr, "cuda: %s\n", err.msg);
        return 1;
    }
    double bw = 0;
    if (mk_cuda_copy_bandwidth(ctx, (size_t)2 << 30, 20, &bw, &err)) {
        fprintf(stderr, "bandwidth: %s\n", err.msg);
        return 1;
    }
    t0 = now();
    dsv4_cuda *g;
    if (dsv4_cuda_create(ctx, m, &g, &err)) {
        fprintf(stderr, "upload: %s\n", err.msg);
        return 1;
    }
    double t_up = now() - t0;
    dsv4_cuda_seq *s;
    if (dsv4_cuda_seq_create(g, P + 7 * N + 8, P, &s, &err)) { /* prefill, 7 x N steps, the probe */
        fprintf(stderr, "seq: %s\n", err.msg);
        return 1;
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(P + 2 * N + 8));
    float *logits = malloc(sizeof(float) * (size_t)c->vocab);
    double *dt = malloc(sizeof(double) * (size_t)N), *dta = malloc(sizeof(double) * (size_t)N);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < P; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((r >> 33) % (uint64_t)c->vocab);
    }
    t0 = now();
    if (dsv4_cuda_forward(s, toks, P, logits, &err)) {
        fprintf(stderr, "prefill: %s\n", err.msg);
        return 1;
    }
    double t_pre = now() - t0;
    toks[P] = argmax(logits, c->vocab);
    for (int i = 0; i < N; i++) {
        double a = now();
        if (dsv4_cuda_forward(s, &toks[P + i], 1, logits, &err)) {
            fprintf(stderr, "decode %d: %s\n", i, err.msg);
            return 1;
        }
        dt[i] = now() - a;
        toks[P + i + 1] = argmax(logits, c->vocab);
    }
    dsv4_cuda_profile_report(stdout, "batch-1 prefill + decode");
    if (getenv("MINKE_CUDA_TRACE") && trace_step(ctx, s, toks, P + N, logits, getenv("MINKE_CUDA_TRACE")))
        return 1;
    /* N more steps the way the server runs a plain greedy request: the token picked on the GPU, one
     * int to the host instead of the logits row (and no host argmax over the vocabulary) */
    int32_t *ta = malloc(sizeof(int32_t) * (size_t)(N + 1));
    ta[0] = toks[P + N];
    for (int i = 0; i < N; i++) {
        double a = now();
        if (dsv4_cuda_forward_argmax(s, &ta[i], 1, &ta[i + 1], &err)) {
            fprintf(stderr, "decode (argmax) %d: %s\n", i, err.msg);
            return 1;
        }
        dta[i] = now() - a;
    }
    /* N more chained as the engine's asynchronous scheduling runs them: step i + 1 is queued, its
     * token fed on the device from step i's pick, before the host waits for step i's token; a
     * step's time is from one token's arrival to the next */
    double medc = 0;
    {
        dsv4_cuda_work *sw = dsv4_cuda_seq_work(s);
        int32_t *tc = malloc(sizeof(int32_t) * (size_t)(N + 1));
        double *dc = malloc(sizeof(double) * (size_t)N);
        float dummy = 0.0f, *lg = &dummy;
        const int one = 1;
        const char fed = 1;
        tc[0] = ta[N];
        const int32_t *tp = &tc[0];
        int32_t *gp = &tc[1];
        if (dsv4_cuda_batch_launch(sw, &s, &tp, &one, &lg, &gp, NULL, NULL, 1, &err)) {
            fprintf(stderr, "decode (chained) 0: %s\n", err.msg);
            return 1;
        }
        double a = now();
        for (int i = 0; i < N; i++) {
            gp = &tc[i + 2 <= N ? i + 2 : N];
            if (i + 1 < N && dsv4_cuda_batch_launch(sw, &s, &tp, &one, &lg, &gp, NULL, &fed, 1, &err)) {
                fprintf(stderr, "decode (chained) %d: %s\n", i + 1, err.msg);
                return 1;
            }
            if (dsv4_cuda_batch_wait(sw, &err) || tc[i + 1] < 0) {
                fprintf(stderr, "decode (chained) %d: %s\n", i, tc[i + 1] < 0 ? "no token" : err.msg);
                return 1;
            }
            double b = now();
            dc[i] = b - a;
            a = b;
        }
        medc = median_after_warmup(dc, N);
        printf("chained greedy tokens:");
        for (int i = 1; i <= N && i <= 8; i++) printf(" %d", tc[i]);
        printf("\n");
        free(tc), free(dc);
    }
    /* 2 x N more steps as a seeded sampled request: the token drawn on the GPU, then the logits row
     * to the host for the host sampler */
    double medd = 0, medh = 0, medad = 0, medah = 0;
    int nadj = 0;
    float sample_t = 0.8f;
    {
        const char *ts = getenv("DSV4_SAMPLE_T");
        if (ts) {
            char *end = NULL;
            sample_t = strtof(ts, &end);
            if (end == ts || *end || !(sample_t > 0.0f && sample_t <= 100.0f)) {
                fprintf(stderr, "DSV4_SAMPLE_T: expected a temperature in (0, 100], got \"%s\"\n", ts);
                return 1;
            }
        }
        mk_sampling_params sp;
        mk_sampling_defaults(&sp);
        sp.temperature = sample_t, sp.top_p = 0.95f, sp.seed = 1, sp.has_seed = 1;
        mk_sampler *smp = NULL;
        if (mk_sampler_create(&sp, c->vocab, NULL, 0, NULL, 0, &smp, &err)) {
            fprintf(stderr, "sampler: %s\n", err.msg);
            return 1;
        }
        double *d2 = malloc(sizeof(double) * (size_t)N), *h2 = malloc(sizeof(double) * (size_t)N);
        int32_t tk = ta[N];
        const int one = 1;
        for (int i = 0; i < N; i++) {
            mk_sample_draw dd;
            if (!mk_sampler_plain_draw(smp, &dd)) {
                fprintf(stderr, "sampler: not a plain draw\n");
                return 1;
            }
            float dummy = 0.0f, *lg = &dummy;
            int32_t got = -1, *gp2 = &got;
            const mk_sample_draw *dp = &dd;
            const int32_t *tp = &tk;
            double a = now();
            if (dsv4_cuda_forward_batch_am(dsv4_cuda_seq_work(s), &s, &tp, &one, &lg, &gp2, &dp, 1, &err)) {
                fprintf(stderr, "decode (GPU draw) %d: %s\n", i, err.msg);
                return 1;
            }
            if (got < 0) {
                fprintf(stderr, "decode (GPU draw) %d: no token\n", i);
                return 1;
            }
            d2[i] = now() - a;
            mk_sampler_accept(smp, got);
            tk = got;
        }
        if (host_sampled_steps(s, smp, &tk, N, logits, h2, "host sampler")) return 1;
        medd = median_after_warmup(d2, N), medh = median_after_warmup(h2, N);
        mk_sampler_free(smp);
        smp = NULL;
        /* 2 x N more as a request with adjustments (penalties and a logit_bias): picked on the GPU
         * with the sampler's list of adjusted tokens (mk_sampler_model_step, MINKE_MODEL_ADJUST's
         * path), then the logits row to the host sampler. The sampler is not given the prompt, so its
         * list holds the biased and the generated tokens only (a long prompt's would pass
         * MK_SAMPLE_ADJ_MAX, a step the engine samples on the host); a step that still is not a model
         * step ends the GPU loop and the row says so */
        static const int32_t bias_ids[4] = {11, 257, 4099, 65537};
        static const float bias_vals[4] = {2.0f, -3.0f, 1.5f, -100.0f};
        sp.presence_penalty = 0.5f, sp.frequency_penalty = 0.3f, sp.repetition_penalty = 1.1f;
        int nb = 0; /* the ids below the vocabulary (ascending) */
        while (nb < 4 && bias_ids[nb] < c->vocab) nb++;
        sp.bias_ids = bias_ids, sp.bias_vals = bias_vals, sp.n_bias = nb, sp.seed = 2;
        mk_sample_adj *adj = malloc(sizeof(mk_sample_adj) * MK_SAMPLE_ADJ_MAX);
        if (!adj || mk_sampler_create(&sp, c->vocab, NULL, 0, NULL, 0, &smp, &err)) {
            fprintf(stderr, "sampler (adjusted): %s\n", adj ? err.msg : "out of memory");
            return 1;
        }
        int max_adj = 0, n_gpu = 0;
        for (int i = 0; i < N; i++, n_gpu++) {
            mk_sample_draw dd;
            double a = now(); /* the list of adjusted tokens is built per step, as the engine does */
            if (!mk_sampler_model_step(smp, &dd, adj, MK_SAMPLE_ADJ_MAX)) {
                fprintf(stderr, "adjusted request, step %d: not a model step (more than %d adjusted tokens?): "
                        "not timed\n", i, MK_SAMPLE_ADJ_MAX);
                break;
            }
            if (dd.n_adj > max_adj) max_adj = dd.n_adj;
            float dummy = 0.0f, *lg = &dummy;
            int32_t got = -1, *gp2 = &got;
            const mk_sample_draw *dp = &dd;
            const int32_t *tp = &tk;
            mk_sample_out so;
            if (dsv4_cuda_forward_batch_am(dsv4_cuda_seq_work(s), &s, &tp, &one, &lg, &gp2, &dp, 1, &err) ||
                mk_sampler_take(smp, got, &so, &err)) {
                fprintf(stderr, "decode (GPU, adjusted) %d: %s\n", i, err.msg);
                return 1;
            }
            d2[i] = now() - a;
            mk_sampler_accept(smp, so.token);
            tk = so.token;
        }
        if (n_gpu == N) {
            if (host_sampled_steps(s, smp, &tk, N, logits, h2, "host sampler, adjusted")) return 1;
            medad = median_after_warmup(d2, N), medah = median_after_warmup(h2, N), nadj = max_adj;
        }
        free(adj);
        free(d2), free(h2);
        mk_sampler_free(smp);
    }
    double meda;
    {
        double *sa2 = malloc(sizeof(double) * (size_t)(N - 3));
        memcpy(sa2, dta + 3, sizeof(double) * (size_t)(N - 3));
        qsort(sa2, (size_t)(N - 3), sizeof(double), cmpd);
        meda = sa2[(N - 3) / 2];
        free(sa2);
    }
    /* the first 3 steps are warm-up */
    int nt = N - 3;
    double *srt = malloc(sizeof(double) * (size_t)nt);
    memcpy(srt, dt + 3, sizeof(double) * (size_t)nt);
    qsort(srt, (size_t)nt, sizeof(double), cmpd);
    double med = srt[nt / 2], mn = srt[0];
    double tps = 1.0 / med;
    size_t wb = dsv4_cuda_decode_weight_bytes(g);
    double gbs = (double)wb / med / 1e9;
    const mk_cuda_caps *cp = mk_cuda_ctx_caps(ctx);
    char adjcell[64];
    if (medad > 0) snprintf(adjcell, sizeof adjcell, "%.3f / %.3f", medad * 1e3, medah * 1e3);
    else snprintf(adjcell, sizeof adjcell, "not measured (not a model step: see stderr)");
    FILE *md = argc > 4 ? fopen(argv[4], "w") : NULL;
    char line[4096];
    int n = snprintf(line, sizeof line,
                     "## minke GPU decode (%s)\n\n"
                     "checkpoint %s: %d layers, dim %d, %d heads x %d, %d experts (top-%d) of inter %d, vocab %d, "
                     "experts kind %d (4 = FP4), weights on the device %.2f GB\n\n"
                     "| metric | value |\n| --- | --- |\n"
                     "| load (mmap) / upload s | %.2f / %.2f |\n"
                     "| prefill %d tokens ms | %.2f |\n"
                     "| decode steps timed (after 3 warm-up) | %d |\n"
                     "| decode step median / min ms | %.3f / %.3f |\n"
                     "| decode tokens/s (median) | %.1f |\n"
                     "| weight bytes read per token | %.1f MB |\n"
                     "| achieved weight bytes/s | %.0f GB/s |\n"
                     "| device-to-device copy (read + write), same run | %.0f GB/s |\n"
                     "| achieved / copy | %.1f%% |\n"
                     "| decode step median, token picked on the GPU (the server's greedy path; %d steps) ms | %.3f |\n"
                     "| decode tokens/s / achieved / copy, that path | %.1f / %.0f GB/s / %.1f%% |\n"
                     "| decode step median, chained: step k + 1 queued (its token fed on the GPU) before step k's "
                     "token is read (the engine's async scheduling) ms | %.3f |\n"
                     "| decode tokens/s / achieved / copy, chained | %.1f / %.0f GB/s / %.1f%% |\n"
                     "| sampled step (T %g, top_p 0.95) median ms: drawn on the GPU / logits to the host sampler | "
                     "%.3f / %.3f |\n"
                     "| step with penalties and a logit_bias (same T and top_p; up to %d adjusted tokens) median ms: "
                     "picked on the GPU / logits to the host sampler | %s |\n\n",
                     cp->name, argv[1], c->n_layers, c->dim, c->n_heads, c->head_dim, c->n_experts, c->n_act,
                     c->moe_inter, c->vocab, (int)m->layers[0].experts[0].w1.kind, dsv4_cuda_weight_bytes(g) / 1e9,
                     t_load, t_up, P, t_pre * 1e3, nt, med * 1e3, mn * 1e3, tps, wb / 1e6, gbs, bw,
                     100.0 * gbs / bw, nt, meda * 1e3, 1.0 / meda, (double)wb / meda / 1e9,
                     100.0 * ((double)wb / meda / 1e9) / bw, medc * 1e3, 1.0 / medc, (double)wb / medc / 1e9,
                     100.0 * ((double)wb / medc / 1e9) / bw, (double)sample_t, medd * 1e3, medh * 1e3, nadj, adjcell);
    fwrite(line, 1, (size_t)n, stdout);
    if (md) fwrite(line, 1, (size_t)n, md);
    {
        dsv4_cuda_graph_counts gc;
        dsv4_cuda_work_graph_counts(dsv4_cuda_seq_work(s), &gc);
        mk_cuda_tuning tu;
        mk_cuda_ctx_get_tuning(ctx, &tu);
        n = snprintf(line, sizeof line, "decode calls of the batch-1 sequence as CUDA graphs: %ld captured, %ld replayed, "
                     "%ld as launches%s; L2 lane %d MiB (%ld prefetch launches captured in all)\n\n", gc.captured,
                     gc.replayed, gc.eager, gc.off ? " (graphs off)" : "", tu.l2_lane, mk_cuda_lane_count(ctx));
        fwrite(line, 1, (size_t)n, stdout);
        if (md) fwrite(line, 1, (size_t)n, md);
    }
    /* what a CUDA graph would save on the GPU: the same step as a stream of launches and as a
     * replayed graph (MINKE_CUDA_GRAPH_PROBE=0: skipped) */
    const char *gp = getenv("MINKE_CUDA_GRAPH_PROBE");
    if (!gp || strcmp(gp, "0")) {
        dsv4_cuda_graph_stats gs;
        int prc = MK_EINVAL;
        for (int tries = 0; tries < 5 && prc == MK_EINVAL; tries++) {
            prc = dsv4_cuda_graph_probe(s, toks[P + N], 50, &gs, &err);
            if (prc == MK_EINVAL && dsv4_cuda_forward(s, &toks[P + N], 1, logits, &err)) {
                fprintf(stderr, "graph probe: step: %s\n", err.msg);
                return 1;
            }
        }
        n = prc ? snprintf(line, sizeof line, "graph probe failed: %s\n\n", err.msg)
                : snprintf(line, sizeof line,
                           "| CUDA graph probe: one decode step (position %d) 50 times | ms per step |\n| --- | --- |\n"
                           "| the forward call's launches, back to back (no host wait per step) | %.3f |\n"
                           "| captured once (%zu nodes, capture + instantiate %.2f ms), replayed | %.3f (%.1f%% less) |\n"
                           "| argmax of the stream / graph step | %d / %d%s |\n\n",
                           dsv4_cuda_seq_pos(s), gs.ms_stream, gs.nodes, gs.ms_capture, gs.ms_graph,
                           100.0 * (1.0 - gs.ms_graph / gs.ms_stream), gs.argmax_stream, gs.argmax_graph,
                           gs.argmax_stream == gs.argmax_graph ? "" : " MISMATCH");
        fwrite(line, 1, (size_t)n, stdout);
        if (md) fwrite(line, 1, (size_t)n, md);
        if (!prc && gs.argmax_stream != gs.argmax_graph) return 1;
    }
    printf("greedy tokens:");
    for (int i = 0; i < 16 && i < N; i++) printf(" %d", toks[P + i]);
    printf("\nprompt:");
    for (int i = 0; i < P; i++) printf(" %d", toks[i]);
    printf("\n");
    /* ---- the engine's batched path ---- */
    dsv4_cuda_seq_free(s);
    s = NULL;
    int batches[8], nbat = 0, PF = argc > 6 ? atoi(argv[6]) : 2048;
    {
        char bl[128];
        snprintf(bl, sizeof bl, "%s", argc > 5 ? argv[5] : "64,256");
        for (char *tk = strtok(bl, ","); tk && nbat < 8; tk = strtok(NULL, ",")) if (atoi(tk) > 0) batches[nbat++] = atoi(tk);
    }
    if (argc > 5 && !strcmp(argv[5], "none")) nbat = 0, PF = 0; /* batch 1 only (e.g. under ncu) */
    double tflops = nbat || PF > 0 ? gemm_tflops(ctx) : 0.0, fl = token_flops(m);
    if (nbat || PF > 0) n = snprintf(line, sizeof line,
                 "## batched (dsv4_cuda_forward_batch, paged KV)\n\n"
                 "linear FLOPs per token %.2f GFLOP; cuBLAS bf16 GEMM 8192^3 in the same run: %.0f TFLOP/s\n\n"
                 "| run | tokens | time ms | tokens/s | linear TFLOP/s | of the GEMM |\n| --- | --- | --- | --- | --- | --- |\n",
                 fl / 1e9, tflops);
    else n = 0;
    fwrite(line, 1, (size_t)n, stdout);
    if (md) fwrite(line, 1, (size_t)n, md);
    int maxb = 1;
    for (int i = 0; i < nbat; i++) if (batches[i] > maxb) maxb = batches[i];
    const int BP = 16, BN = 16, len = (PF > BP + BN + 8 ? PF : BP + BN + 8) + 8;
    int rows = maxb * BP > PF ? maxb * BP : PF;
    int bpseq = (len + DSV4_BLOCK_TOKENS - 1) / DSV4_BLOCK_TOKENS;
    dsv4_cuda_pool *pool = NULL;
    dsv4_cuda_work *w = NULL;
    dsv4_cuda_seq **ps = calloc((size_t)maxb, sizeof *ps);
    float **lg = calloc((size_t)maxb, sizeof *lg);
    const int32_t **tk = calloc((size_t)maxb, sizeof *tk);
    int *cnt = calloc((size_t)maxb, sizeof *cnt), *tbl = malloc(sizeof(int) * (size_t)bpseq);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(rows + maxb));
    float *lgbuf = NULL; /* page-locked, as the engine's (mk_kvcache_host_floats) */
    if (mk_cuda_host_alloc(sizeof(float) * (size_t)maxb * c->vocab, (void **)&lgbuf, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rc = dsv4_cuda_pool_create(g, maxb * bpseq, &pool, &err);
    if (!rc) rc = dsv4_cuda_work_create(g, rows, maxb, len, &w, &err);
    for (int i = 0; i < maxb && !rc; i++) {
        rc = dsv4_cuda_seq_create_paged(g, len, pool, &ps[i], &err);
        for (int b = 0; b < bpseq; b++) tbl[b] = i * bpseq + b;
        if (!rc) rc = dsv4_cuda_seq_bind(ps[i], tbl, bpseq, &err);
        lg[i] = lgbuf + (size_t)i * c->vocab;
    }
    for (int i = 0; i < rows + maxb; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        bt[i] = (int32_t)((r >> 33) % (uint64_t)c->vocab);
    }
    if (!rc && PF > 0) { /* prefill: one prompt of PF tokens in one call (two runs, the second timed) */
        double tp = 0;
        for (int rep = 0; rep < 2 && !rc; rep++) {
            rc = dsv4_cuda_seq_reset(ps[0], &err);
            tk[0] = bt;
            cnt[0] = PF;
            double a = now();
            if (!rc) rc = dsv4_cuda_forward_batch(w, ps, tk, cnt, lg, 1, &err);
            tp = now() - a;
        }
        dsv4_cuda_profile_report(stdout, "prefill (two runs)");
        const char *tp_path = getenv("MINKE_CUDA_TRACE_PREFILL");
        if (!rc && tp_path) { /* a third run, traced launch by launch */
            rc = dsv4_cuda_seq_reset(ps[0], &err);
            double a = now();
            if (!rc) rc = mk_cuda_trace_start(ctx, &err);
            if (!rc) rc = dsv4_cuda_forward_batch(w, ps, tk, cnt, lg, 1, &err);
            char title[64];
            snprintf(title, sizeof title, "one traced prefill of %d tokens", PF);
            if (!rc && trace_report(ctx, title, now() - a, tp_path)) rc = 1;
        }
        if (!rc) {
            n = snprintf(line, sizeof line, "| prefill, 1 prompt | %d | %.2f | %.0f | %.1f | %.1f%% |\n", PF, tp * 1e3,
                         PF / tp, fl * PF / tp / 1e12, tflops > 0 ? 100.0 * fl * PF / tp / 1e12 / tflops : 0.0);
            fwrite(line, 1, (size_t)n, stdout);
            if (md) fwrite(line, 1, (size_t)n, md);
        }
    }
    for (int bi = 0; bi < nbat && !rc; bi++) {
        int B = batches[bi];
        for (int i = 0; i < B && !rc; i++) {
            rc = dsv4_cuda_seq_reset(ps[i], &err);
            tk[i] = bt + (size_t)i * BP % (size_t)(rows - BP);
            cnt[i] = BP;
        }
        if (!rc) rc = dsv4_cuda_forward_batch(w, ps, tk, cnt, lg, B, &err);
        double *st = malloc(sizeof(double) * BN);
        for (int step = 0; step < BN && !rc; step++) {
            for (int i = 0; i < B; i++) {
                tk[i] = bt + rows + i;
                cnt[i] = 1;
            }
            double a = now();
            rc = dsv4_cuda_forward_batch(w, ps, tk, cnt, lg, B, &err);
            st[step] = now() - a;
        }
        {
            char t[64];
            snprintf(t, sizeof t, "batch %d: prefill + %d decode steps", B, BN);
            dsv4_cuda_profile_report(stdout, t);
        }
        if (!rc) {
            qsort(st + 3, BN - 3, sizeof(double), cmpd);
            double ms = st[3 + (BN - 3) / 2];
            n = snprintf(line, sizeof line, "| decode, batch %d (step median of %d) | %d | %.2f | %.0f | %.2f | %.2f%% |\n", B,
                         BN - 3, B, ms * 1e3, B / ms, fl * B / ms / 1e12,
                         tflops > 0 ? 100.0 * fl * B / ms / 1e12 / tflops : 0.0);
            fwrite(line, 1, (size_t)n, stdout);
            if (md) fwrite(line, 1, (size_t)n, md);
        }
        free(st);
    }
    if (rc) fprintf(stderr, "batched: %s\n", err.msg);
    for (int i = 0; i < maxb; i++) dsv4_cuda_seq_free(ps[i]);
    dsv4_cuda_work_free(w);
    dsv4_cuda_pool_free(pool);
    free(ps);
    free(lg);
    free(tk);
    free(cnt);
    free(tbl);
    free(bt);
    mk_cuda_host_free(lgbuf);
    if (md) fclose(md);
    free(srt);
    free(dt);
    free(logits);
    free(toks);
    dsv4_cuda_free(g);
    mk_cuda_ctx_free(ctx);
    dsv4_model_free(m);
    return 0;
}
