/* bench_decode.c — batch-1 decode speed of DeepSeek-V4 on the CPU, as effective weight
 * bandwidth, next to the machine's memory bandwidth measured in the same run.
 *
 *   bench_decode DIR [threads] [decode_steps]
 *
 * Loads the checkpoint (normally one made by tools/gen_dsv4.py with V4-Flash's full widths and a
 * few layers, larger than the caches), runs a 16-token prefill, then timed one-token decodes.
 * "Weight bytes per token" counts what one decode step must read: every dense matrix of every
 * layer (attention, compressors, indexer, gate, shared expert), the routed experts actually
 * selected (n_act per layer, as stored: FP4 + scales), and the output head. Reported:
 * tokens/s, weight GB/s, and its ratio to a plain memcpy loop's bandwidth (bytes copied per
 * second, and read + write bytes as STREAM counts copy) and to a read-only loop's bandwidth, all
 * measured here with the same thread count. Decode reads weights and writes almost nothing, so the
 * read-only number is the tightest bound.
 */
#include "models/dsv4.h"

#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct { char *src, *dst; size_t n; double sum; int mode; } bw_arg;

/* Read-only pass with 256-bit loads and cheap integer XORs, so the loop is limited by memory,
 * not by add latency. */
__attribute__((target("avx2"))) static double read_all(const char *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (double)_mm256_extract_epi32(a0, 0);
}

static void *bw_worker(void *p) {
    bw_arg *a = p;
    if (a->mode == 0) memcpy(a->dst, a->src, a->n);
    else a->sum = read_all(a->src, a->n);
    return NULL;
}

/* Best-of-5 bandwidth in GB/s over a 1 GiB buffer with nt threads. mode 0: copy (2x bytes);
 * mode 1: read-only sum. */
static double bandwidth(int nt, int mode) {
    size_t n = (size_t)1 << 30;
    char *a = aligned_alloc(64, n), *b = aligned_alloc(64, n);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64];
        bw_arg args[64];
        size_t per = n / (size_t)nt;
        double t0 = now();
        for (int t = 0; t < nt; t++) {
            args[t] = (bw_arg){a + per * t, b + per * t, per, 0, mode};
            pthread_create(&th[t], NULL, bw_worker, &args[t]);
        }
        for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
        double dt = now() - t0;
        double gbs = (mode == 0 ? 2.0 : 1.0) * n / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(a);
    free(b);
    return best;
}

static size_t wbytes(const mk_wmat *w) { return w->w ? mk_wmat_bytes(w) : 0; }

static size_t bytes_per_token(const dsv4_model *m) {
    const dsv4_config *c = &m->cfg;
    size_t b = wbytes(&m->head) + (size_t)c->dim * 2; /* head + one embedding row */
    for (int l = 0; l < c->n_layers; l++) {
        const dsv4_layer *L = &m->layers[l];
        b += wbytes(&L->wq_a) + wbytes(&L->wq_b) + wbytes(&L->wkv) + wbytes(&L->wo_a) + wbytes(&L->wo_b);
        b += 2 * (size_t)c->hc * c->dim * (2 + c->hc) * c->hc * 4; /* hc_attn_fn, hc_ffn_fn */
        if (L->ratio) b += wbytes(&L->cmp.wkv) + wbytes(&L->cmp.wgate);
        if (L->ratio == 4) b += wbytes(&L->idx_cmp.wkv) + wbytes(&L->idx_cmp.wgate) + wbytes(&L->idx_wq_b) + wbytes(&L->idx_wproj);
        b += wbytes(&L->gate) + wbytes(&L->shared.w1) + wbytes(&L->shared.w2) + wbytes(&L->shared.w3);
        b += (size_t)c->n_act * (wbytes(&L->experts[0].w1) + wbytes(&L->experts[0].w2) + wbytes(&L->experts[0].w3));
    }
    return b;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_decode DIR [threads] [decode_steps]\n");
        return 2;
    }
    int nt = argc > 2 ? atoi(argv[2]) : 1, steps = argc > 3 ? atoi(argv[3]) : 16;
    mk_err err = {0};
    dsv4_model *m;
    mk_model_options o = {.n_threads = nt, .max_seq_len = 1024};
    if (dsv4_model_load(argv[1], &o, &m, &err)) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        return 1;
    }
    dsv4_seq *s;
    if (dsv4_seq_create(m, 1024, &s, &err)) { fprintf(stderr, "bench_decode: %s\n", err.msg); return 1; }
    int V = m->cfg.vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = (i * 7919) % V;
    double t0 = now();
    if (dsv4_seq_forward(s, prompt, 16, lg, &err)) { fprintf(stderr, "bench_decode: %s\n", err.msg); return 1; }
    double t_pre = now() - t0;
    int32_t tok = 1;
    /* one untimed decode to fault in pages the prefill did not touch */
    if (dsv4_seq_forward(s, &tok, 1, lg, &err)) { fprintf(stderr, "bench_decode: %s\n", err.msg); return 1; }
    t0 = now();
    for (int i = 0; i < steps; i++) {
        tok = (tok * 31 + 7) % V;
        if (dsv4_seq_forward(s, &tok, 1, lg, &err)) { fprintf(stderr, "bench_decode: %s\n", err.msg); return 1; }
    }
    double dt = (now() - t0) / steps;
    size_t bpt = bytes_per_token(m);
    double wbw = bpt / dt / 1e9;
    double copy = bandwidth(nt, 0), rd = bandwidth(nt, 1);
    printf("decode  threads %d: %.3f tokens/s (%.1f ms/token), prefill 16 tokens %.2f s\n", nt, 1 / dt, dt * 1e3, t_pre);
    printf("        weight bytes/token %.3f GB -> %.2f GB/s effective weight bandwidth\n", bpt / 1e9, wbw);
    printf("        copy loop (memcpy, same threads): %.2f GB/s copied = %.2f GB/s read+write (STREAM convention)\n",
           copy / 2, copy);
    printf("        read-only loop: %.2f GB/s\n", rd);
    printf("RESULT threads=%d tok_s=%.3f weight_GBs=%.2f copy_GBs=%.2f copy_rw_GBs=%.2f read_GBs=%.2f "
           "ratio_copy=%.2f ratio_copy_rw=%.2f ratio_read=%.2f\n",
           nt, 1 / dt, wbw, copy / 2, copy, rd, wbw / (copy / 2), wbw / copy, wbw / rd);
    free(lg);
    dsv4_seq_free(s);
    dsv4_model_free(m);
    return 0;
}
