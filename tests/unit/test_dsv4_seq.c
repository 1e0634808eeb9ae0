/* test_dsv4_seq.c — sequence lifecycle of the DeepSeek-V4 forward pass: a reset sequence and a
 * fresh one compute bit-identical logits (clean state), two sequences of one model do not share
 * state, and calls that overflow or carry bad ids fail with a clear error (multi-token calls after
 * the prefill are chunks: tests/unit/test_dsv4_chunked.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "models/dsv4.h"
#include "test_util.h"

static dsv4_model *load(const char *name, int max_len) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/%s", mk_test_data_dir(), name);
    mk_err err = {0};
    dsv4_model *m;
    mk_model_options o = {.n_threads = 2, .max_seq_len = max_len};
    cr_assert_eq(dsv4_model_load(dir, &o, &m, &err), 0, "%s", err.msg);
    return m;
}

/* prefill of n tokens then `dec` decodes; logits of the last call into out */
static void run(dsv4_seq *s, int n, int dec, float *out) {
    mk_err err = {0};
    int32_t t[64];
    for (int i = 0; i < n; i++) t[i] = (i * 131 + 7) % 512;
    cr_assert_eq(dsv4_seq_forward(s, t, n, out, &err), 0, "%s", err.msg);
    for (int i = 0; i < dec; i++) {
        int32_t x = (i * 17 + 3) % 512;
        cr_assert_eq(dsv4_seq_forward(s, &x, 1, out, &err), 0, "%s", err.msg);
    }
}

Test(dsv4_seq, reset_equals_fresh) {
    dsv4_model *m = load("v4-tiny-fp8", 256);
    mk_err err = {0};
    dsv4_seq *a, *b;
    cr_assert_eq(dsv4_seq_create(m, 0, &a, &err), 0);
    cr_assert_eq(dsv4_seq_create(m, 0, &b, &err), 0);
    static float la[512], lb[512], lc[512];
    run(a, 37, 9, la);                 /* leaves window, compressor state and caches dirty */
    dsv4_seq_reset(a);
    cr_assert_eq(dsv4_seq_pos(a), 0);
    run(a, 6, 5, la);                  /* a short prompt: s < ratio leaves state slots unused */
    run(b, 6, 5, lb);
    cr_assert(!memcmp(la, lb, sizeof la), "a reset sequence must compute what a fresh one does");
    /* interleaving two sequences on one model: each only sees its own state */
    dsv4_seq_reset(a);
    dsv4_seq_reset(b);
    run(a, 20, 0, la);
    run(b, 33, 3, lc);
    int32_t x = 5;
    cr_assert_eq(dsv4_seq_forward(a, &x, 1, la, &err), 0);
    dsv4_seq_reset(b);
    run(b, 20, 0, lb);
    cr_assert_eq(dsv4_seq_forward(b, &x, 1, lb, &err), 0);
    cr_assert(!memcmp(la, lb, sizeof la));
    dsv4_seq_free(a);
    dsv4_seq_free(b);
    dsv4_model_free(m);
}

Test(dsv4_seq, errors) {
    dsv4_model *m = load("v4-tiny-bf16", 64);
    mk_err err = {0};
    dsv4_seq *s;
    static float lg[512];
    cr_assert_eq(dsv4_seq_create(m, 128, &s, &err), MK_ERANGE, "longer than max_seq_len");
    cr_assert(strstr(err.msg, "max_seq_len"));
    cr_assert_eq(dsv4_seq_create(m, 0, &s, &err), 0);
    int32_t t[70] = {0};
    cr_assert_eq(dsv4_seq_forward(s, t, 70, lg, &err), MK_ERANGE);
    cr_assert(strstr(err.msg, "exceeds"), "%s", err.msg);
    t[3] = 512;
    cr_assert_eq(dsv4_seq_forward(s, t, 8, lg, &err), MK_ERANGE);
    cr_assert(strstr(err.msg, "vocabulary"), "%s", err.msg);
    t[3] = 1;
    cr_assert_eq(dsv4_seq_forward(s, t, 0, lg, &err), MK_EINVAL);
    cr_assert_eq(dsv4_seq_forward(s, t, 8, lg, &err), 0);
    t[1] = 512;
    cr_assert_eq(dsv4_seq_forward(s, t, 2, lg, &err), MK_ERANGE);
    cr_assert_eq(dsv4_seq_pos(s), 8, "a failed call leaves the position unchanged");
    t[1] = 1;
    cr_assert_eq(dsv4_seq_forward(s, t, 2, lg, &err), 0, "a chunk after the prefill (chunked prefill): %s", err.msg);
    cr_assert_eq(dsv4_seq_pos(s), 10);
    dsv4_seq_free(s);
    dsv4_model_free(m);
}
