/* bench_llama.c — prompt and generation speed of a Llama-family GGUF (the default model) through
 * minke's public API, for bench/bench_vs_llamacpp.py which measures llama.cpp on the same GGUF,
 * prompt tokens and thread count in the same run.
 *
 *   bench_llama MODEL.gguf THREADS N_GEN IDS     (IDS: comma-separated prompt token ids)
 *
 * Prints one JSON line: {"threads":T,"n_prompt":P,"prompt_s":..,"n_gen":G,"gen_s":..} where
 * prompt_s is the wall time of the prefill forward (best of 3, on a fresh sequence) and gen_s the
 * wall time of G one-token decodes feeding back the argmax (greedy), i.e. what llama.cpp's
 * llama_perf_context reports as prompt eval and eval time. Model loading is not timed.
 */
#include "minke.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: bench_llama MODEL.gguf THREADS N_GEN IDS\n");
        return 2;
    }
    int threads = atoi(argv[2]), n_gen = atoi(argv[3]);
    int32_t ids[4096];
    int n = 0;
    for (char *s = argv[4]; *s && n < 4096;) {
        ids[n++] = (int32_t)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    mk_err err = {0};
    mk_model *m;
    mk_model_options o = {.n_threads = threads, .max_seq_len = n + n_gen + 8};
    if (mk_model_load(argv[1], &o, &m, &err)) { fprintf(stderr, "bench_llama: %s\n", err.msg); return 1; }
    mk_seq *s;
    if (mk_seq_create(m, 0, &s, &err)) { fprintf(stderr, "bench_llama: %s\n", err.msg); return 1; }
    int vocab = mk_model_vocab_size(m);
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        mk_seq_reset(s);
        double t0 = now();
        if (mk_seq_forward(s, ids, n, logits, &err)) { fprintf(stderr, "bench_llama: %s\n", err.msg); return 1; }
        double t = now() - t0;
        if (t < best) best = t;
    }
    double t0 = now();
    for (int g = 0; g < n_gen; g++) {
        int32_t tok = 0;
        for (int i = 1; i < vocab; i++)
            if (logits[i] > logits[tok]) tok = i;
        if (mk_seq_forward(s, &tok, 1, logits, &err)) { fprintf(stderr, "bench_llama: %s\n", err.msg); return 1; }
    }
    double gen = now() - t0;
    printf("{\"threads\":%d,\"n_prompt\":%d,\"prompt_s\":%.6f,\"n_gen\":%d,\"gen_s\":%.6f}\n", threads, n, best, n_gen, gen);
    free(logits);
    mk_seq_free(s);
    mk_model_free(m);
    return 0;
}
