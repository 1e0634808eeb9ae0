/* bench_dsv4_cuda.c — batch-1 decode speed of minke's DeepSeek-V4 GPU forward (dsv4_cuda.c).
 *
 * Loads a checkpoint directory (e.g. one from tools/gen_dsv4.py with V4-Flash's full widths),
 * uploads it, prefills a fixed pseudo-random prompt, then decodes greedily (each step feeds the
 * argmax of the last), timing every step on the host clock (a step ends with the logits copied
 * back, so it is complete). Reports the median step, tokens/s, the weight bytes one step reads,
 * the achieved bytes/s against a device-to-device copy measured in the same run, and the first
 * greedy tokens (for a cross-check with another engine on the same weights).
 * Usage: bench_dsv4_cuda DIR [prompt_len=16] [decode_steps=64] [out.md]
 * No CUDA graph capture: positions and cache sizes are kernel arguments chosen on the host.
 */
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

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [prompt_len] [decode_steps] [out.md]\n", argv[0]);
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
    mk_model_options opt = {.n_threads = 1, .max_seq_len = P + N + 16};
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
    if (dsv4_cuda_seq_create(g, P + N + 8, P, &s, &err)) {
        fprintf(stderr, "seq: %s\n", err.msg);
        return 1;
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(P + N + 8));
    float *logits = malloc(sizeof(float) * (size_t)c->vocab);
    double *dt = malloc(sizeof(double) * (size_t)N);
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
                     "| achieved / copy | %.1f%% |\n\n",
                     cp->name, argv[1], c->n_layers, c->dim, c->n_heads, c->head_dim, c->n_experts, c->n_act,
                     c->moe_inter, c->vocab, (int)m->layers[0].experts[0].w1.kind, dsv4_cuda_weight_bytes(g) / 1e9,
                     t_load, t_up, P, t_pre * 1e3, nt, med * 1e3, mn * 1e3, tps, wb / 1e6, gbs, bw,
                     100.0 * gbs / bw);
    fwrite(line, 1, (size_t)n, stdout);
    if (md) fwrite(line, 1, (size_t)n, md);
    printf("greedy tokens:");
    for (int i = 0; i < 16 && i < N; i++) printf(" %d", toks[P + i]);
    printf("\nprompt:");
    for (int i = 0; i < P; i++) printf(" %d", toks[i]);
    printf("\n");
    if (md) fclose(md);
    free(srt);
    free(dt);
    free(logits);
    free(toks);
    dsv4_cuda_seq_free(s);
    dsv4_cuda_free(g);
    mk_cuda_ctx_free(ctx);
    dsv4_model_free(m);
    return 0;
}
