/* test_dsv4_chunked.c — chunked prefill of the DeepSeek-V4 forward pass (dsv4.c): a prompt run
 * as one call or split into chunks at any positions (mid compressor group, chunks longer than
 * the window, single tokens, block and non-block boundaries) gives bit-identical logits for its
 * last token, bit-identical state (window rings, compressor state, every compressed entry and
 * indexer key) and identical decodes after it. Every golden case, on its golden prompts (random
 * splits) and on generated 300-700-token prompts (splits at and around the 256-position blocks).
 * Rows run in batch order (dsv4_seq_forward_ex), as the engine runs a prompt's pieces. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/dsv4.h"
#include "models/dsv4_golden.h"
#include "test_util.h"

static const char *CASES[] = {"v4-tiny-bf16", "v4-tiny-fp8", "v4-tiny-wide"};
enum { MAXLEN = 768 };

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static dsv4_model *load(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/%s", mk_test_data_dir(), name);
    mk_err err = {0};
    dsv4_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = MAXLEN};
    cr_assert_eq(dsv4_model_load(dir, &o, &m, &err), 0, "%s", err.msg);
    return m;
}

/* Runs tokens[0, n) in chunks cut at cuts[0..nc) (ascending, inside (0, n)); logits of the last. */
static void run_chunks(dsv4_seq *s, const int32_t *tok, int n, const int *cuts, int nc, float *logits) {
    mk_err err = {0};
    int p = 0;
    for (int i = 0; i <= nc; i++) {
        int e = i < nc ? cuts[i] : n;
        cr_assert_eq(dsv4_seq_forward_ex(s, tok + p, e - p, 1, e == n ? logits : NULL, &err), 0, "%s", err.msg);
        p = e;
    }
    cr_assert_eq(dsv4_seq_pos(s), n);
}

/* Same state: slot (rings, compressor state), entry counts and the whole private block pool. */
static void assert_same_state(const dsv4_seq *a, const dsv4_seq *b, const char *what) {
    const dsv4_config *c = &a->m->cfg;
    cr_assert_eq(a->arena_floats, b->arena_floats);
    cr_assert(!memcmp(a->arena, b->arena, sizeof(float) * a->arena_floats), "%s: slot state differs", what);
    for (int l = 0; l < c->n_layers; l++) {
        cr_assert_eq(a->ls[l].n_ckv, b->ls[l].n_ckv, "%s: layer %d entries", what, l);
        cr_assert_eq(a->ls[l].n_ikv, b->ls[l].n_ikv, "%s: layer %d indexer keys", what, l);
    }
    cr_assert(!memcmp(a->own_kv, b->own_kv, (size_t)a->n_blocks * a->lay.bytes), "%s: compressed entries differ", what);
}

/* One call vs chunks: logits, state, then `dec` one-token decodes on both. */
static void check_split(dsv4_model *m, const int32_t *tok, int n, const int *cuts, int nc, const char *what) {
    mk_err err = {0};
    int V = m->cfg.vocab;
    dsv4_seq *a, *b;
    cr_assert_eq(dsv4_seq_create(m, MAXLEN, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(dsv4_seq_create(m, MAXLEN, &b, &err), 0, "%s", err.msg);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * (size_t)V);
    cr_assert_eq(dsv4_seq_forward(a, tok, n, la, &err), 0, "%s", err.msg);
    run_chunks(b, tok, n, cuts, nc, lb);
    char cutdesc[256] = "";
    for (int i = 0, o = 0; i < nc && o < 200; i++) o += snprintf(cutdesc + o, sizeof cutdesc - (size_t)o, "%d ", cuts[i]);
    cr_assert(!memcmp(la, lb, sizeof(float) * (size_t)V), "%s (%d tokens, cuts %s): logits differ", what, n, cutdesc);
    assert_same_state(a, b, what);
    for (int d = 0; d < 3; d++) {
        int32_t t = (int32_t)(3 + rnd() % (uint64_t)(V - 3));
        cr_assert_eq(dsv4_seq_forward(a, &t, 1, la, &err), 0, "%s", err.msg);
        cr_assert_eq(dsv4_seq_forward(b, &t, 1, lb, &err), 0, "%s", err.msg);
        cr_assert(!memcmp(la, lb, sizeof(float) * (size_t)V), "%s: decode %d after the prompt differs", what, d);
    }
    free(la);
    free(lb);
    dsv4_seq_free(a);
    dsv4_seq_free(b);
}

/* nc random distinct cuts in (0, n), ascending */
static int random_cuts(int n, int want, int *cuts) {
    int nc = 0;
    for (int i = 0; i < want && n > 1; i++) {
        int c = 1 + (int)(rnd() % (uint64_t)(n - 1)), dup = 0;
        for (int j = 0; j < nc; j++) dup |= cuts[j] == c;
        if (!dup) cuts[nc++] = c;
    }
    for (int i = 1; i < nc; i++)
        for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) { int t = cuts[j]; cuts[j] = cuts[j - 1]; cuts[j - 1] = t; }
    return nc;
}

static void golden_prompts(int ci) {
    dsv4_model *m = load(CASES[ci]);
    char gpath[512];
    snprintf(gpath, sizeof gpath, "%s/dsv4/%s/golden.safetensors", mk_test_data_dir(), CASES[ci]);
    for (int p = 0; p < 3; p++) {
        mk_err err = {0};
        dsv4_golden *g;
        cr_assert_eq(dsv4_golden_open(gpath, p, m->cfg.n_layers, &g, &err), 0, "%s", err.msg);
        int S = dsv4_golden_prompt_len(g), nt;
        const int64_t *t64 = dsv4_golden_tokens(g, &nt);
        int32_t tok[512];
        cr_assert_leq(S, 512);
        for (int i = 0; i < S; i++) tok[i] = (int32_t)t64[i];
        char what[64];
        int cuts[64];
        for (int k = 0; k < 4; k++) {
            int nc = random_cuts(S, 1 + k * 3, cuts);
            snprintf(what, sizeof what, "%s p%d split %d", CASES[ci], p, k);
            check_split(m, tok, S, cuts, nc, what);
        }
        /* every token alone (each a one-row chunk in batch order) */
        if (S <= 48) {
            for (int i = 0; i < S - 1; i++) cuts[i] = i + 1;
            snprintf(what, sizeof what, "%s p%d one token per chunk", CASES[ci], p);
            check_split(m, tok, S, cuts, S - 1, what);
        }
        dsv4_golden_free(g);
    }
    dsv4_model_free(m);
}

static void long_prompts(int ci) {
    dsv4_model *m = load(CASES[ci]);
    int V = m->cfg.vocab;
    static int32_t tok[MAXLEN];
    const int lens[] = {300, 517, 700};
    for (int li = 0; li < 3; li++) {
        int n = lens[li];
        for (int i = 0; i < n; i++) tok[i] = (int32_t)(3 + rnd() % (uint64_t)(V - 3));
        char what[64];
        /* block boundaries, one past / before them, a window-sized run, mid-group cuts */
        int a[] = {256, 512}, b[] = {255, 257, 513}, cc[] = {1, 2, 130, 131, 258, 390, 511};
        int na = n > 512 ? 2 : 1, nb = n > 513 ? 3 : 2, ncc = 0;
        for (int i = 0; i < 7; i++)
            if (cc[i] < n) ncc = i + 1;
        snprintf(what, sizeof what, "%s %d tokens at blocks", CASES[ci], n);
        check_split(m, tok, n, a, na, what);
        snprintf(what, sizeof what, "%s %d tokens around blocks", CASES[ci], n);
        check_split(m, tok, n, b, nb, what);
        snprintf(what, sizeof what, "%s %d tokens mixed", CASES[ci], n);
        check_split(m, tok, n, cc, ncc, what);
        int cuts[16];
        int nc = random_cuts(n, 5, cuts);
        snprintf(what, sizeof what, "%s %d tokens random", CASES[ci], n);
        check_split(m, tok, n, cuts, nc, what);
    }
    dsv4_model_free(m);
}

Test(dsv4_chunked, golden_bf16, .timeout = MK_TEST_TIMEOUT(300)) { golden_prompts(0); }
Test(dsv4_chunked, golden_fp8, .timeout = MK_TEST_TIMEOUT(300)) { golden_prompts(1); }
Test(dsv4_chunked, golden_wide, .timeout = MK_TEST_TIMEOUT(300)) { golden_prompts(2); }
Test(dsv4_chunked, long_bf16, .timeout = MK_TEST_TIMEOUT(600)) { long_prompts(0); }
Test(dsv4_chunked, long_fp8, .timeout = MK_TEST_TIMEOUT(600)) { long_prompts(1); }
Test(dsv4_chunked, long_wide, .timeout = MK_TEST_TIMEOUT(600)) { long_prompts(2); }
