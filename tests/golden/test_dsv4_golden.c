/* test_dsv4_golden.c — DeepSeek-V4-Flash against the reference's outputs (tests/data/dsv4/).
 *
 * For every case and prompt, runs the reference's call pattern (prefill, then one-token decodes
 * teacher-forced with the recorded tokens, plus the MTP call after the prefill) and compares as
 * each case's README defines passing:
 *   forced mode   minke takes the reference's expert and indexer choices; logits of every call
 *                 and the mHC stream h after every layer of every call must be within the case's
 *                 forced tolerances (relative L2 and max-abs relative); argmax must match where
 *                 the golden's top-2 gap exceeds 2 x TOL_MAX x max|logit|;
 *   natural mode  minke decides; the wide case must pass the same tolerances with no flipped
 *                 decision; on the narrow cases the first flipped decision must be at a golden
 *                 margin below the case's threshold (or an indexer near-tie), and every call and
 *                 layer before it must match.
 * The tolerances below are copied from each case's README ("Tolerance" and "Expert-margin
 * threshold" sections).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/dsv4.h"
#include "models/dsv4_golden.h"
#include "test_util.h"

typedef struct {
    const char *name;
    double tl_l2, tl_max, th_l2, th_max; /* forced (and, for wide, natural) tolerances */
    double margin_thr;
    int wide;
} gcase;

static const gcase CASES[] = {
    {"v4-tiny-bf16", 0.053, 0.058, 0.053, 0.071, 1e-3, 0},
    {"v4-tiny-fp8", 0.17, 0.2, 0.18, 0.21, 0.044, 0},
    {"v4-tiny-wide", 0.056, 0.06, 0.055, 0.067, 1e-3, 1},
};

/* capture of "L<l>.h" dumps of the current call */
typedef struct {
    int n_layers, per_layer;
    float *h; /* [n_layers, per_layer] */
} hcap;

static void cap_dump(void *ctx, const char *name, const float *data, int ndim, const int64_t *shape) {
    hcap *c = ctx;
    int l;
    char tail[8];
    if (sscanf(name, "L%d.%7s", &l, tail) == 2 && !strcmp(tail, "h") && l < c->n_layers) {
        size_t n = 1;
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
        if (n <= (size_t)c->per_layer) memcpy(c->h + (size_t)l * c->per_layer, data, n * sizeof(float));
    }
}

/* the hooks struct carries one ctx: route dumps to the capture, decisions to the golden */
typedef struct {
    hcap *cap;
    dsv4_golden *g;
    dsv4_hooks gh;
} hookctx;
static void hk_dump(void *ctx, const char *n, const float *d, int nd, const int64_t *sh) {
    cap_dump(((hookctx *)ctx)->cap, n, d, nd, sh);
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
    for (size_t i = 0; i < n; i++) {
        double d = (double)mine[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx) mx = fabs(d);
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    *rel_l2 = den > 0 ? sqrt(num / den) : sqrt(num);
    *max_rel = mref > 0 ? mx / mref : mx;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[b]) b = i;
    return b;
}

/* Returns 1 when the golden's top-2 gap is large enough that the argmax must match. */
static int argmax_binding(const float *ref, int n, double tol_max) {
    int a = argmax(ref, n);
    float second = -INFINITY, mx = 0;
    for (int i = 0; i < n; i++) {
        if (i != a && ref[i] > second) second = ref[i];
        if (fabsf(ref[i]) > mx) mx = fabsf(ref[i]);
    }
    return ref[a] - second > 2 * tol_max * mx;
}

/* Runs one prompt; returns the number of failures (and prints what failed). */
static int run_prompt(const gcase *gc, dsv4_model *m, int prompt, int force, double *worst) {
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/dsv4/%s/golden.safetensors", mk_test_data_dir(), gc->name);
    mk_err err = {0};
    dsv4_golden *g;
    const dsv4_config *c = &m->cfg;
    if (dsv4_golden_open(gpath, prompt, c->n_layers, &g, &err)) {
        cr_log_error("%s", err.msg);
        return 1;
    }
    dsv4_golden_set_window(g, c->window);
    dsv4_seq *s;
    cr_assert_eq(dsv4_seq_create(m, 0, &s, &err), 0, "%s", err.msg);
    int S = dsv4_golden_prompt_len(g);
    hcap cap = {c->n_layers, S * c->hc * c->dim, NULL};
    cap.h = malloc(sizeof(float) * (size_t)cap.n_layers * cap.per_layer);
    hookctx hc = {&cap, g, {0}};
    dsv4_golden_hooks(g, force, &hc.gh);
    s->hooks.ctx = &hc;
    s->hooks.dump = hk_dump;
    s->hooks.moe = hk_moe;
    s->hooks.indexer = hk_idx;
    int ntok, vocab, fails = 0;
    const int64_t *tokens = dsv4_golden_tokens(g, &ntok);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab);
    int n_calls = dsv4_golden_n_calls(g);
    const char *mode = force ? "forced" : "natural";
    int stop_call = n_calls, stop_layer = 0; /* natural: compare only before the first flip */
    for (int call = 0; call < n_calls; call++) {
        int sp = dsv4_golden_start_pos(g, call), nt = dsv4_golden_n_tokens(g, call);
        cr_assert_eq(sp, dsv4_seq_pos(s));
        int32_t in[4096];
        for (int i = 0; i < nt; i++) in[i] = (int32_t)tokens[sp + i];
        dsv4_golden_set_call(g, call);
        cr_assert_eq(dsv4_seq_forward(s, in, nt, logits, &err), 0, "%s", err.msg);
        const dsv4_flip *fl = dsv4_golden_first_flip(g);
        if (!force && fl->found && stop_call == n_calls) {
            stop_call = fl->call;
            stop_layer = fl->layer;
            /* Indexer flips: the golden records no margin for them. The index scores come from
             * FP4-simulated q and keys, where one grid step moves a product by up to a third, so
             * an independent implementation whose values agree within the case's tolerance can
             * reorder entries whose scores differ by that much. A first indexer flip is accepted
             * as a near-tie when minke's own boundary gap, relative to the row's largest score,
             * is within the case's h tolerance (TOL_MAX). */
            int legit = fl->is_indexer ? (fl->near_tie || fl->margin <= gc->th_max) : fl->margin < gc->margin_thr;
            if (gc->wide || !legit) {
                cr_log_error("%s p%d natural: decision flip at call %d layer %d token %d (%s, golden margin %g%s) is not a near-tie",
                             gc->name, prompt, fl->call, fl->layer, fl->token, fl->is_indexer ? "indexer" : "experts",
                             fl->margin, fl->is_indexer ? (fl->near_tie ? ", near tie" : ", not a near tie") : "");
                fails++;
            }
        }
        /* h per layer */
        for (int l = 0; l < c->n_layers; l++) {
            if (call > stop_call || (call == stop_call && l >= stop_layer)) break;
            const float *ref = dsv4_golden_h(g, call, l);
            double r2, mr;
            compare(cap.h + (size_t)l * cap.per_layer, ref, (size_t)nt * c->hc * c->dim, &r2, &mr);
            if (r2 > worst[2]) worst[2] = r2;
            if (mr > worst[3]) worst[3] = mr;
            if (r2 > gc->th_l2 || mr > gc->th_max) {
                cr_log_error("%s p%d %s: call %d layer %d h rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)", gc->name,
                             prompt, mode, call, l, r2, gc->th_l2, mr, gc->th_max);
                fails++;
            }
        }
        if (call < stop_call) {
            const float *ref = dsv4_golden_logits(g, call, &vocab);
            double r2, mr;
            compare(logits, ref, (size_t)vocab, &r2, &mr);
            if (r2 > worst[0]) worst[0] = r2;
            if (mr > worst[1]) worst[1] = mr;
            if (r2 > gc->tl_l2 || mr > gc->tl_max) {
                cr_log_error("%s p%d %s: call %d logits rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)", gc->name,
                             prompt, mode, call, r2, gc->tl_l2, mr, gc->tl_max);
                fails++;
            }
            if (argmax_binding(ref, vocab, gc->tl_max) && argmax(ref, vocab) != argmax(logits, vocab)) {
                cr_log_error("%s p%d %s: call %d argmax %d, golden %d", gc->name, prompt, mode, call,
                             argmax(logits, vocab), argmax(ref, vocab));
                fails++;
            }
        }
        if (call == 0 && stop_call > 0) {
            /* the MTP call: h = the final stream of the prefill, ids = prompt[1:] + argmax */
            int nids;
            const int64_t *mids = dsv4_golden_mtp_ids(g, &nids);
            const float *mref = dsv4_golden_mtp_logits(g);
            if (mids && mref && c->n_mtp) {
                int32_t ids[4096];
                for (int i = 0; i < nids; i++) ids[i] = (int32_t)mids[i];
                float *ml = malloc(sizeof(float) * (size_t)c->vocab);
                cr_assert_eq(dsv4_mtp_forward(s, s->h_last, ids, nids, ml, &err), 0, "%s", err.msg);
                double r2, mr;
                compare(ml, mref, (size_t)c->vocab, &r2, &mr);
                if (r2 > worst[4]) worst[4] = r2;
                if (mr > worst[5]) worst[5] = mr;
                if (r2 > gc->tl_l2 || mr > gc->tl_max) {
                    cr_log_error("%s p%d %s: MTP logits rel L2 %.4g (tol %.3g), max rel %.4g (tol %.3g)", gc->name,
                                 prompt, mode, r2, gc->tl_l2, mr, gc->tl_max);
                    fails++;
                }
                free(ml);
            }
        }
    }
    if (force)
        cr_log_info("%s p%d forced: %d of minke's own decisions differed from the reference's and were overridden",
                    gc->name, prompt, dsv4_golden_forced_overrides(g));
    else if (dsv4_golden_first_flip(g)->found)
        fprintf(stderr, "golden %s p%d natural: first flip at call %d layer %d token %d (%s, %s %.4g)\n", gc->name, prompt,
                stop_call, stop_layer, dsv4_golden_first_flip(g)->token,
                dsv4_golden_first_flip(g)->is_indexer ? "indexer" : "experts",
                dsv4_golden_first_flip(g)->is_indexer ? "relative boundary gap" : "golden margin",
                dsv4_golden_first_flip(g)->margin);
    free(logits);
    free(cap.h);
    dsv4_seq_free(s);
    dsv4_golden_free(g);
    return fails;
}

static void run_case(int ci, int force) {
    const gcase *gc = &CASES[ci];
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/%s", mk_test_data_dir(), gc->name);
    mk_err err = {0};
    dsv4_model *m;
    mk_model_options opt = {.n_threads = 2, .max_seq_len = 256};
    cr_assert_eq(dsv4_model_load(dir, &opt, &m, &err), 0, "%s", err.msg);
    int fails = 0;
    double worst[6] = {0};
    for (int p = 0; p < 3; p++) fails += run_prompt(gc, m, p, force, worst);
    cr_log_info("%s %s: worst logits rel L2 %.4f max rel %.4f; h rel L2 %.4f max rel %.4f; MTP %.4f / %.4f",
                gc->name, force ? "forced" : "natural", worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]);
    fprintf(stderr, "golden %s %s: worst logits rel L2 %.4f max rel %.4f; h rel L2 %.4f max rel %.4f; MTP %.4f / %.4f\n",
            gc->name, force ? "forced" : "natural", worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]);
    dsv4_model_free(m);
    cr_assert_eq(fails, 0, "%s %s: %d comparisons out of tolerance (see log)", gc->name, force ? "forced" : "natural", fails);
}

Test(golden_forced, bf16, .timeout = MK_TEST_TIMEOUT(600)) { run_case(0, 1); }
Test(golden_forced, fp8, .timeout = MK_TEST_TIMEOUT(600)) { run_case(1, 1); }
Test(golden_forced, wide, .timeout = MK_TEST_TIMEOUT(600)) { run_case(2, 1); }
Test(golden_natural, bf16, .timeout = MK_TEST_TIMEOUT(600)) { run_case(0, 0); }
Test(golden_natural, fp8, .timeout = MK_TEST_TIMEOUT(600)) { run_case(1, 0); }
Test(golden_natural, wide, .timeout = MK_TEST_TIMEOUT(600)) { run_case(2, 0); }
