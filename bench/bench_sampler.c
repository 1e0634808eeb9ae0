/* bench_sampler.c — the host sampler's cost per step at DeepSeek-V4's vocabulary (129280), one core.
 *
 * Usage: bench_sampler [--quick]. Logits: a Philox-drawn spread of ~12 nats (a few hundred tokens
 * within reach of the top, like a model's output). Per setting, the median over repeated steps of
 * mk_sampler_sample (the logits copied back before each step, outside the timing). The settings are
 * those of sampler.h's cost note: greedy, plain temperature, top_p 0.95, top_k 50 + top_p, min_p.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/philox.h"
#include "engine/sampler.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const int quick = argc > 1 && !strcmp(argv[1], "--quick"), V = 129280, reps = quick ? 5 : 41;
    float *base = malloc(sizeof(float) * V), *l = malloc(sizeof(float) * V);
    double *t = malloc(sizeof(double) * reps);
    if (!base || !l || !t) return 1;
    for (int i = 0; i < V; i++) {
        const double u = mk_philox_uniform(2026, (uint64_t)i, 0);
        base[i] = (float)(u * u * u * 12.0 - 4.0); /* most tokens low, a few near the top */
    }
    struct { const char *name; float T, top_p, min_p; int top_k; } set[] = {
        {"greedy", 0, 1, 0, 0},
        {"temperature 1", 1, 1, 0, 0},
        {"top_p 0.95", 0.8f, 0.95f, 0, 0},
        {"top_k 50 + top_p 0.9", 0.7f, 0.9f, 0, 50},
        {"min_p 0.05", 1, 1, 0.05f, 0},
    };
    printf("| setting (vocab %d, one core) | ms per step (median of %d) |\n| --- | ---: |\n", V, reps);
    for (size_t c = 0; c < sizeof set / sizeof set[0]; c++) {
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        p.temperature = set[c].T, p.top_p = set[c].top_p, p.min_p = set[c].min_p, p.top_k = set[c].top_k;
        p.seed = 7, p.has_seed = 1;
        mk_sampler *s = NULL;
        mk_err err = {0};
        if (mk_sampler_create(&p, V, NULL, 0, NULL, 0, &s, &err)) {
            fprintf(stderr, "bench_sampler: %s\n", err.msg);
            return 1;
        }
        for (int r = 0; r < reps; r++) {
            memcpy(l, base, sizeof(float) * V);
            mk_sample_out out;
            const double t0 = now_ms();
            if (mk_sampler_sample(s, l, &out, &err)) {
                fprintf(stderr, "bench_sampler: %s\n", err.msg);
                return 1;
            }
            t[r] = now_ms() - t0;
            mk_sampler_accept(s, out.token);
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        printf("| %s | %.3f |\n", set[c].name, t[reps / 2]);
        mk_sampler_free(s);
    }
    free(base), free(l), free(t);
    return 0;
}
