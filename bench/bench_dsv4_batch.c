/* bench_dsv4_batch.c — one DeepSeek-V4 engine step of N decode rows (N requests, one new token
 * each) on the CPU, run the old way (the pieces one after another, each through every weight
 * matrix) and batched (dsv4_forward_batch: the rows of all pieces through each linear and routed
 * expert in one call, so each matrix is read once per step).
 *
 *   bench_dsv4_batch DIR [threads] [steps]
 *
 * DIR is a checkpoint made by tools/gen_dsv4.py (e.g. --preset tiny, or a mid size whose weights
 * exceed the caches). For N = 1, 4, 16: N sequences, each prefilled with 32 different tokens,
 * then `steps` timed steps of one token per sequence, sequential vs batched, each from the same
 * state. Reports ms per step and rows (tokens) per second, and checks that both ways give the
 * same logits bit for bit.
 */
#include "models/dsv4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NMAX = 16, PREFILL = 32 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(const mk_err *err) {
    fprintf(stderr, "bench_dsv4_batch: %s\n", err->msg);
    return 1;
}

/* N sequences prefilled with distinct prompts; a[i] sequential, b[i] batched copies */
static int setup(dsv4_model *m, int N, int len, dsv4_seq **s, mk_err *err) {
    int vocab = dsv4_model_vocab_size(m);
    for (int i = 0; i < N; i++) {
        int32_t p[PREFILL];
        for (int t = 0; t < PREFILL; t++) p[t] = (int32_t)((7 + 31 * i + 17 * t) % (vocab - 3)) + 3;
        int rc = dsv4_seq_create(m, len, &s[i], err);
        if (!rc) rc = dsv4_seq_forward(s[i], p, PREFILL, NULL, err);
        if (rc) return rc;
    }
    return MK_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_dsv4_batch DIR [threads] [steps]\n");
        return 2;
    }
    int nt = argc > 2 ? atoi(argv[2]) : 1, steps = argc > 3 ? atoi(argv[3]) : 8;
    if (nt < 1) nt = 1;
    if (steps < 1) steps = 1;
    mk_err err = {0};
    dsv4_model *m;
    int len = PREFILL + steps + 8;
    mk_model_options o = {.n_threads = nt, .max_seq_len = len};
    if (dsv4_model_load(argv[1], &o, &m, &err)) return fail(&err);
    int vocab = dsv4_model_vocab_size(m);
    printf("bench_dsv4_batch: %s, %d thread(s), %d steps per N\n", argv[1], nt, steps);
    printf("%4s  %14s  %14s  %12s  %12s  %7s  %s\n", "N", "seq ms/step", "batch ms/step", "seq rows/s",
           "batch rows/s", "speedup", "bits");
    static const int Ns[] = {1, 4, 16};
    int bad = 0;
    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) {
        int N = Ns[ni];
        dsv4_seq *a[NMAX], *b[NMAX];
        if (setup(m, N, len, a, &err) || setup(m, N, len, b, &err)) return fail(&err);
        float *la = malloc(sizeof(float) * (size_t)N * vocab), *lb = malloc(sizeof(float) * (size_t)N * vocab);
        int32_t tok[NMAX];
        const int32_t *tp[NMAX];
        int one[NMAX];
        float *lp[NMAX];
        for (int i = 0; i < N; i++) {
            tok[i] = (int32_t)(5 + 13 * i) % vocab;
            tp[i] = &tok[i];
            one[i] = 1;
            lp[i] = lb + (size_t)i * vocab;
        }
        double ta = 0, tb = 0;
        int same = 1;
        for (int st = 0; st < steps; st++) {
            double t0 = now();
            for (int i = 0; i < N; i++)
                if (dsv4_seq_forward(a[i], &tok[i], 1, la + (size_t)i * vocab, &err)) return fail(&err);
            double t1 = now();
            if (dsv4_forward_batch(b, tp, one, lp, N, &err)) return fail(&err);
            double t2 = now();
            ta += t1 - t0;
            tb += t2 - t1;
            if (memcmp(la, lb, sizeof(float) * (size_t)N * vocab)) same = 0;
            for (int i = 0; i < N; i++) { /* next token: the argmax (same for both when the bits are) */
                int best = 0;
                for (int v = 1; v < vocab; v++)
                    if (la[(size_t)i * vocab + v] > la[(size_t)i * vocab + best]) best = v;
                tok[i] = best;
            }
        }
        bad |= !same;
        printf("%4d  %14.2f  %14.2f  %12.1f  %12.1f  %6.2fx  %s\n", N, 1e3 * ta / steps, 1e3 * tb / steps,
               N * steps / ta, N * steps / tb, ta / tb, same ? "identical" : "DIFFER");
        for (int i = 0; i < N; i++) {
            dsv4_seq_free(a[i]);
            dsv4_seq_free(b[i]);
        }
        free(la);
        free(lb);
    }
    dsv4_model_free(m);
    return bad;
}
