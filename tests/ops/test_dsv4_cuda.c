/* test_dsv4_cuda.c — the DeepSeek-V4 GPU forward (src/models/dsv4_cuda.c) against the reference's
 * golden files (tests/data/dsv4/<case>/golden.safetensors), in the two modes of
 * tests/golden/test_dsv4_golden.c and with the same pass rules and tolerances (copied from each
 * case's README, as there):
 *   forced   the GPU takes the reference's expert and indexer choices (dsv4_golden hooks); logits
 *            of every call, the mHC stream after every layer of every call, and the MTP logits
 *            must be within the case's forced tolerances; argmax must match where binding;
 *   natural  the GPU decides; the wide case must pass with no flipped decision; on the narrow
 *            cases the first flip must be legitimate (a gate margin below the case's threshold
 *            or an indexer near-tie) and everything before it must match.
 * Plain program (built by `make cuda`): prints one line per case and mode with the worst
 * measured values, exits 1 on any failure and 0 with "skipped: no CUDA device" without a GPU.
 * Usage: test_dsv4_cuda [case-name ...]   (MINKE_TEST_DATA overrides tests/data)
 */
#include "models/dsv4.h"
#include "models/dsv4_cuda.h"
#include "models/dsv4_golden.h"
#include "num/formats.h"
#include "ops/cuda/ops_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    double tl_l2, tl_max, th_l2, th_max;
    double margin_thr;
    int wide;
} gcase;

/* the same table as tests/golden/test_dsv4_golden.c */
static const gcase CASES[] = {
    {"v4-tiny-bf16", 0.053, 0.058, 0.053, 0.071, 1e-3, 0},
    {"v4-tiny-fp8", 0.17, 0.2, 0.18, 0.21, 0.044, 0},
    {"v4-tiny-wide", 0.056, 0.06, 0.055, 0.067, 1e-3, 1},
};

static const char *data_dir(void) {
    const char *d = getenv("MINKE_TEST_DATA");
    return d ? d : "tests/data";
}

typedef struct {
    int n_layers, per_layer;
    float *h;
    dsv4_golden *g;
    dsv4_hooks gh;
} hookctx;

static void hk_dump(void *ctx, const char *name, const float *data, int ndim, const int64_t *shape) {
    hookctx *c = ctx;
    int l;
    char tail[8];
    if (sscanf(name, "L%d.%7s", &l, tail) == 2 && !strcmp(tail, "h") && l < c->n_layers) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        if (n <= (size_t)c->per_layer) memcpy(c->h + (size_t)l * c->per_layer, data, n * sizeof(float));
    }
}
static void hk_moe(void *ctx, int layer, int n_tok, int k, int32_t *idx, const float *margin) {
    hookctx *h = ctx;
    h->gh.moe(h->gh.ctx, layer, n_tok, k, idx, margin);
}
static void hk_idx(void *ctx, int layer, int t, int n_tok, int k, int32_t *sel, const float *sc, int ns) {
    hookctx *h = ctx;
    h->gh.indexer(h->gh.ctx, layer, t, n_tok, k, sel, sc, ns);
}

static void compare(const float *mine, const float *ref, size_t n, double *rel_l2, double *max_rel) {
    double num = 0, den = 0, mx = 0, mref = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(mine[i])) bad = 1;
        double d = (double)mine[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx) mx = fabs(d);
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    *rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    *max_rel = mref > 0 ? mx / mref : mx;
    if (bad) *rel_l2 = *max_rel = INFINITY; /* NaN never passes */
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

static int argmax_binding(const float *ref, int n, double tol_max) {
    int a = argmax(ref, n);
    float second = -INFINITY, mx = 0;
    for (int i = 0; i < n; i++) {
        if (i != a && ref[i] > second) second = ref[i];
        if (fabsf(ref[i]) > mx) mx = fabsf(ref[i]);
    }
    return ref[a] - second > 2 * tol_max * mx;
}

#define CHECK(call)                                                            \
    do {                                                                       \
        if ((call)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg); \
            fails++;                                                           \
            goto out;                                                          \
        }                                                                      \
    } while (0)

static int run_prompt(const gcase *gc, dsv4_model *m, dsv4_cuda *gm, int prompt, int force, double *worst,
                      int *n_calls_out) {
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/dsv4/%s/golden.safetensors", data_dir(), gc->name);
    mk_err err = {0};
    dsv4_golden *g = NULL;
    dsv4_cuda_seq *s = NULL;
    const dsv4_config *c = &m->cfg;
    int fails = 0;
    float *logits = NULL, *ml = NULL;
    hookctx hc = {0};
    if (dsv4_golden_open(gpath, prompt, c->n_layers, &g, &err)) {
        fprintf(stderr, "FAIL %s\n", err.msg);
        return 1;
    }
    dsv4_golden_set_window(g, c->window);
    int S = dsv4_golden_prompt_len(g);
    CHECK(dsv4_cuda_seq_create(gm, 0, 0, &s, &err));
    hc.n_layers = c->n_layers;
    hc.per_layer = S * c->hc * c->dim;
    hc.h = malloc(sizeof(float) * (size_t)hc.n_layers * hc.per_layer);
    hc.g = g;
    dsv4_golden_hooks(g, force, &hc.gh);
    dsv4_hooks hk = {.ctx = &hc, .dump = hk_dump, .moe = hk_moe, .indexer = hk_idx};
    dsv4_cuda_seq_set_hooks(s, &hk);
    int ntok, vocab;
    const int64_t *tokens = dsv4_golden_tokens(g, &ntok);
    logits = malloc(sizeof(float) * (size_t)c->vocab);
    ml = malloc(sizeof(float) * (size_t)c->vocab);
    int n_calls = dsv4_golden_n_calls(g);
    *n_calls_out += n_calls;
    const char *mode = force ? "forced" : "natural";
    int stop_call = n_calls, stop_layer = 0;
    for (int call = 0; call < n_calls; call++) {
        int sp = dsv4_golden_start_pos(g, call), nt = dsv4_golden_n_tokens(g, call);
        if (sp != dsv4_cuda_seq_pos(s)) {
            fprintf(stderr, "FAIL %s p%d: call %d starts at %d, sequence at %d\n", gc->name, prompt, call, sp,
                    dsv4_cuda_seq_pos(s));
            fails++;
            goto out;
        }
        int32_t in[4096];
        for (int i = 0; i < nt; i++) in[i] = (int32_t)tokens[sp + i];
        dsv4_golden_set_call(g, call);
        CHECK(dsv4_cuda_forward(s, in, nt, logits, &err));
        const dsv4_flip *fl = dsv4_golden_first_flip(g);
        if (!force && fl->found && stop_call == n_calls) {
            stop_call = fl->call;
            stop_layer = fl->layer;
            int legit = fl->is_indexer ? (fl->near_tie || fl->margin <= gc->th_max) : fl->margin < gc->margin_thr;
            if (gc->wide || !legit) {
                fprintf(stderr, "FAIL %s p%d natural: decision flip at call %d layer %d token %d (%s, margin %g)\n",
                        gc->name, prompt, fl->call, fl->layer, fl->token, fl->is_indexer ? "indexer" : "experts",
                        fl->margin);
                fails++;
            }
        }
        for (int l = 0; l < c->n_layers; l++) {
            if (call > stop_call || (call == stop_call && l >= stop_layer)) break;
            const float *ref = dsv4_golden_h(g, call, l);
            double r2, mr;
            compare(hc.h + (size_t)l * hc.per_layer, ref, (size_t)nt * c->hc * c->dim, &r2, &mr);
            if (r2 > worst[2]) worst[2] = r2;
            if (mr > worst[3]) worst[3] = mr;
            if (!(r2 <= gc->th_l2 && mr <= gc->th_max)) {
                fprintf(stderr, "FAIL %s p%d %s: call %d layer %d h rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)\n",
                        gc->name, prompt, mode, call, l, r2, gc->th_l2, mr, gc->th_max);
                fails++;
            }
        }
        if (call < stop_call) {
            const float *ref = dsv4_golden_logits(g, call, &vocab);
            double r2, mr;
            compare(logits, ref, (size_t)vocab, &r2, &mr);
            if (r2 > worst[0]) worst[0] = r2;
            if (mr > worst[1]) worst[1] = mr;
            if (!(r2 <= gc->tl_l2 && mr <= gc->tl_max)) {
                fprintf(stderr, "FAIL %s p%d %s: call %d logits rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)\n",
                        gc->name, prompt, mode, call, r2, gc->tl_l2, mr, gc->tl_max);
                fails++;
            }
            if (argmax_binding(ref, vocab, gc->tl_max) && argmax(ref, vocab) != argmax(logits, vocab)) {
                fprintf(stderr, "FAIL %s p%d %s: call %d argmax %d, golden %d\n", gc->name, prompt, mode, call,
                        argmax(logits, vocab), argmax(ref, vocab));
                fails++;
            }
        }
        if (call == 0 && stop_call > 0) {
            int nids;
            const int64_t *mids = dsv4_golden_mtp_ids(g, &nids);
            const float *mref = dsv4_golden_mtp_logits(g);
            if (mids && mref && c->n_mtp) {
                int32_t ids[4096];
                for (int i = 0; i < nids; i++) ids[i] = (int32_t)mids[i];
                CHECK(dsv4_cuda_mtp_forward(s, ids, nids, ml, &err));
                double r2, mr;
                compare(ml, mref, (size_t)c->vocab, &r2, &mr);
                if (r2 > worst[4]) worst[4] = r2;
                if (mr > worst[5]) worst[5] = mr;
                if (!(r2 <= gc->tl_l2 && mr <= gc->tl_max)) {
                    fprintf(stderr, "FAIL %s p%d %s: MTP logits rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)\n",
                            gc->name, prompt, mode, r2, gc->tl_l2, mr, gc->tl_max);
                    fails++;
                }
            }
        }
    }
    if (force)
        printf("  %s p%d forced: %d of the GPU's own decisions differed from the reference's (overridden)\n",
               gc->name, prompt, dsv4_golden_forced_overrides(g));
    else if (dsv4_golden_first_flip(g)->found)
        printf("  %s p%d natural: first flip at call %d layer %d token %d (%s, %s %.4g)\n", gc->name, prompt,
               stop_call, stop_layer, dsv4_golden_first_flip(g)->token,
               dsv4_golden_first_flip(g)->is_indexer ? "indexer" : "experts",
               dsv4_golden_first_flip(g)->is_indexer ? "relative boundary gap" : "golden margin",
               dsv4_golden_first_flip(g)->margin);
out:
    free(logits);
    free(ml);
    free(hc.h);
    dsv4_cuda_seq_free(s);
    dsv4_golden_free(g);
    return fails;
}


/* ---- GPU vs CPU intermediates (both forced to the golden's decisions) -------------------- */

typedef struct {
    int call, n, cap;
    char (*names)[56];
    float **data;
    size_t *len;
    dsv4_hooks gh;
} tracer;

static void tr_dump(void *ctx, const char *name, const float *data, int ndim, const int64_t *shape) {
    tracer *t = ctx;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    if (t->n == t->cap) {
        int nc = t->cap ? 2 * t->cap : 256;
        t->names = realloc(t->names, sizeof *t->names * (size_t)nc);
        t->data = realloc(t->data, sizeof *t->data * (size_t)nc);
        t->len = realloc(t->len, sizeof *t->len * (size_t)nc);
        t->cap = nc;
    }
    snprintf(t->names[t->n], sizeof t->names[0], "c%d.%s", t->call, name);
    t->data[t->n] = malloc(sizeof(float) * n);
    memcpy(t->data[t->n], data, sizeof(float) * n);
    t->len[t->n++] = n;
}
static void tr_moe(void *ctx, int layer, int n_tok, int k, int32_t *idx, const float *margin) {
    tracer *t = ctx;
    t->gh.moe(t->gh.ctx, layer, n_tok, k, idx, margin);
}
static void tr_idx(void *ctx, int layer, int tt, int n_tok, int k, int32_t *sel, const float *sc, int ns) {
    tracer *t = ctx;
    t->gh.indexer(t->gh.ctx, layer, tt, n_tok, k, sel, sc, ns);
}
static void tr_free(tracer *t) {
    for (int i = 0; i < t->n; i++) free(t->data[i]);
    free(t->names);
    free(t->data);
    free(t->len);
}

/* Runs calls 0..ncall-1 of prompt 0 on the CPU model and on the GPU, both forced, and prints how
 * far apart every named intermediate is (the worst, and those above 2e-2 relative L2). */
static void trace_compare(const gcase *gc, dsv4_model *m, dsv4_cuda *gm, int ncall) {
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/dsv4/%s/golden.safetensors", data_dir(), gc->name);
    const dsv4_config *c = &m->cfg;
    mk_err err = {0};
    tracer tc = {0}, tg = {0};
    dsv4_golden *g1 = NULL, *g2 = NULL;
    dsv4_seq *cs = NULL;
    dsv4_cuda_seq *gs = NULL;
    float *lg = malloc(sizeof(float) * (size_t)c->vocab);
    if (dsv4_golden_open(gpath, 0, c->n_layers, &g1, &err) || dsv4_golden_open(gpath, 0, c->n_layers, &g2, &err) ||
        dsv4_seq_create(m, 0, &cs, &err) || dsv4_cuda_seq_create(gm, 0, 0, &gs, &err)) {
        printf("  trace: %s\n", err.msg);
        goto done;
    }
    dsv4_golden_set_window(g1, c->window);
    dsv4_golden_set_window(g2, c->window);
    dsv4_golden_hooks(g1, 1, &tc.gh);
    dsv4_golden_hooks(g2, 1, &tg.gh);
    cs->hooks = (dsv4_hooks){.ctx = &tc, .dump = tr_dump, .moe = tr_moe, .indexer = tr_idx};
    dsv4_hooks hk = {.ctx = &tg, .dump = tr_dump, .moe = tr_moe, .indexer = tr_idx};
    dsv4_cuda_seq_set_hooks(gs, &hk);
    int ntok;
    const int64_t *tokens = dsv4_golden_tokens(g1, &ntok);
    for (int call = 0; call < ncall && call < dsv4_golden_n_calls(g1); call++) {
        int sp = dsv4_golden_start_pos(g1, call), nt = dsv4_golden_n_tokens(g1, call);
        int32_t in[4096];
        for (int i = 0; i < nt; i++) in[i] = (int32_t)tokens[sp + i];
        tc.call = tg.call = call;
        dsv4_golden_set_call(g1, call);
        dsv4_golden_set_call(g2, call);
        if (dsv4_seq_forward(cs, in, nt, lg, &err) || dsv4_cuda_forward(gs, in, nt, lg, &err)) {
            printf("  trace: %s\n", err.msg);
            goto done;
        }
    }
    double worst = 0;
    const char *wn = "-";
    int shown = 0, compared = 0;
    for (int i = 0; i < tc.n; i++)
        for (int j = 0; j < tg.n; j++) {
            if (strcmp(tc.names[i], tg.names[j])) continue;
            if (tc.len[i] != tg.len[j]) {
                printf("  trace %s: %s has %zu values on the CPU, %zu on the GPU\n", gc->name, tc.names[i], tc.len[i], tg.len[j]);
                break;
            }
            double r2, mr;
            compare(tg.data[j], tc.data[i], tc.len[i], &r2, &mr);
            compared++;
            if (!(r2 <= worst)) { worst = r2; wn = tc.names[i]; }
            if (!(r2 <= 2e-2) && shown < 12) {
                printf("  trace %s: %-22s rel L2 %.3g max rel %.3g\n", gc->name, tc.names[i], r2, mr);
                shown++;
            }
            break;
        }
    printf("  trace %s (prompt 0, calls 0..%d, GPU vs CPU, forced): %d tensors compared, worst rel L2 %.3g at %s\n",
           gc->name, ncall - 1, compared, worst, wn);
done:
    free(lg);
    tr_free(&tc);
    tr_free(&tg);
    dsv4_seq_free(cs);
    dsv4_cuda_seq_free(gs);
    dsv4_golden_free(g1);
    dsv4_golden_free(g2);
}

int main(int argc, char **argv) {
    mk_num_init();
    if (mk_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    mk_err err = {0};
    mk_cuda_ctx *ctx;
    if (mk_cuda_ctx_create(0, &ctx, &err)) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        return 1;
    }
    int total_fail = 0, n_runs = 0;
    printf("| case | mode | calls | logits rel L2 | logits max rel | h rel L2 | h max rel | MTP rel L2 / max rel | verdict |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t ci = 0; ci < sizeof CASES / sizeof CASES[0]; ci++) {
        const gcase *gc = &CASES[ci];
        int want = argc <= 1;
        for (int a = 1; a < argc; a++) if (!strcmp(argv[a], gc->name)) want = 1;
        if (!want) continue;
        char dir[512];
        snprintf(dir, sizeof dir, "%s/dsv4/%s", data_dir(), gc->name);
        dsv4_model *m;
        mk_model_options opt = {.n_threads = 1, .max_seq_len = 256};
        if (dsv4_model_load(dir, &opt, &m, &err)) {
            fprintf(stderr, "FAIL %s: %s\n", gc->name, err.msg);
            total_fail++;
            continue;
        }
        dsv4_cuda *gm;
        if (dsv4_cuda_create(ctx, m, &gm, &err)) {
            fprintf(stderr, "FAIL %s: %s\n", gc->name, err.msg);
            total_fail++;
            dsv4_model_free(m);
            continue;
        }
        trace_compare(gc, m, gm, 2);
        for (int force = 1; force >= 0; force--) {
            double worst[6] = {0};
            int fails = 0, calls = 0;
            for (int p = 0; p < 3; p++) fails += run_prompt(gc, m, gm, p, force, worst, &calls);
            printf("| %s | %s | %d | %.4f (tol %.3g) | %.4f (tol %.3g) | %.4f (tol %.3g) | %.4f (tol %.3g) | %.4f / %.4f | %s |\n",
                   gc->name, force ? "forced" : "natural", calls, worst[0], gc->tl_l2, worst[1], gc->tl_max, worst[2],
                   gc->th_l2, worst[3], gc->th_max, worst[4], worst[5], fails ? "FAIL" : "pass");
            fflush(stdout);
            total_fail += fails;
            n_runs++;
        }
        dsv4_cuda_free(gm);
        dsv4_model_free(m);
    }
    mk_cuda_ctx_free(ctx);
    printf("%d case-modes, %d failures\n", n_runs, total_fail);
    return total_fail ? 1 : 0;
}
