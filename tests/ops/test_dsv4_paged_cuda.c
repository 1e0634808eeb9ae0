/* test_dsv4_paged_cuda.c — how the DeepSeek-V4 GPU forward (src/models/dsv4_cuda.c) splits, batches
 * and pages its work, checked bit for bit against itself on tests/data/dsv4/v4-tiny-fp8 (window 16,
 * compress ratios 4 and 128, so rings wrap and blocks fill within a 700-token prompt):
 *   chunks   a 700-token prompt as one call, in uneven chunks (1, 3, 60, 192, 255, 100, 89) and
 *            token by token give identical logits, and identical logits for 6 decodes after it;
 *   batch    three paged sequences in one pool run interleaved pieces (prefill chunks next to
 *            decodes of the others) through dsv4_cuda_forward_batch: every piece's logits equal
 *            those of its sequence run alone through the same calls;
 *   restore  a fourth paged sequence whose table shares the first two blocks of the 700-token one
 *            restores at 512 from their snapshots and runs the rest: its logits equal the cold run.
 * Plain program (built by `make cuda`): exits 1 on a failure, 0 with "skipped: no CUDA device"
 * without a GPU. MINKE_TEST_DATA overrides tests/data.
 */
#include "models/dsv4.h"
#include "models/dsv4_cuda.h"
#include "num/formats.h"
#include "ops/cuda/ops_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN 1024
#define NDEC 6

static int fails;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "pass" : "FAIL", what);
    fflush(stdout);
    if (!ok) fails++;
}

static void die(const char *where, const mk_err *err) {
    fprintf(stderr, "FAIL %s: %s\n", where, err->msg);
    exit(1);
}

static void fill(int32_t *t, int n, int vocab, unsigned seed) {
    unsigned x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (int32_t)((x >> 8) % (unsigned)vocab);
    }
}

static dsv4_cuda_graph_counts last_counts; /* the graph counts of run_alone's sequence */

/* A standalone sequence fed `chunks` (summing to n) of toks, then NDEC decodes of dec; the logits
 * after the prompt into out[0], after decode i into out[1 + i]. */
static void run_alone(dsv4_cuda *g, const int32_t *toks, const int *chunks, int nch, const int32_t *dec, int vocab,
                      float *out) {
    mk_err err = {0};
    dsv4_cuda_seq *s;
    if (dsv4_cuda_seq_create(g, LEN, 0, &s, &err)) die("seq_create", &err);
    int pos = 0;
    for (int c = 0; c < nch; c++) {
        if (dsv4_cuda_forward(s, toks + pos, chunks[c], c == nch - 1 ? out : NULL, &err)) die("forward", &err);
        pos += chunks[c];
    }
    for (int i = 0; i < NDEC; i++)
        if (dsv4_cuda_forward(s, dec + i, 1, out + (size_t)(1 + i) * vocab, &err)) die("decode", &err);
    dsv4_cuda_work_graph_counts(dsv4_cuda_seq_work(s), &last_counts);
    dsv4_cuda_seq_free(s);
}

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, sizeof(float) * n); }

int main(void) {
    mk_num_init();
    if (mk_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    const char *dd = getenv("MINKE_TEST_DATA");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/dsv4/v4-tiny-fp8", dd ? dd : "tests/data");
    mk_err err = {0};
    mk_cuda_ctx *ctx;
    if (mk_cuda_ctx_create(0, &ctx, &err)) die("ctx", &err);
    dsv4_model *m;
    mk_model_options opt = {.n_threads = 1, .max_seq_len = LEN};
    if (dsv4_model_load(dir, &opt, &m, &err)) die(dir, &err);
    dsv4_cuda *g;
    if (dsv4_cuda_create(ctx, m, &g, &err)) die("upload", &err);
    const int V = m->cfg.vocab;
    const size_t per = (size_t)(1 + NDEC) * V;

    enum { L0 = 700, L1 = 300, L2 = 50 };
    int32_t p0[L0], p1[L1], p2[L2], dec[3][NDEC];
    fill(p0, L0, V, 1);
    fill(p1, L1, V, 2);
    fill(p2, L2, V, 3);
    for (int i = 0; i < 3; i++) fill(dec[i], NDEC, V, 10 + i);

    /* chunks */
    float *one = malloc(sizeof(float) * per), *chk = malloc(sizeof(float) * per), *tbt = malloc(sizeof(float) * per);
    int c_one[] = {L0}, c_uneven[] = {1, 3, 60, 192, 255, 100, 89}, *c_tbt = malloc(sizeof(int) * L0);
    for (int i = 0; i < L0; i++) c_tbt[i] = 1;
    run_alone(g, p0, c_one, 1, dec[0], V, one);
    run_alone(g, p0, c_uneven, 7, dec[0], V, chk);
    run_alone(g, p0, c_tbt, L0, dec[0], V, tbt);
    const dsv4_cuda_graph_counts gc = last_counts;
    check(same(one, chk, V), "chunks: 700 tokens in 7 uneven chunks = one call (logits after the prompt)");
    check(same(one + V, chk + V, (size_t)NDEC * V), "chunks: 6 decodes after the chunked prompt = after one call");
    check(same(one, tbt, per), "chunks: token by token = one call (prompt and 6 decodes)");
    {
        char what[160];
        snprintf(what, sizeof what, "graphs: the token-by-token run's steps were replayed (%ld captured, %ld replayed, "
                 "%ld as launches)", gc.captured, gc.replayed, gc.eager);
        check(!gc.off && gc.replayed >= L0 - 40 && gc.captured >= 2 && gc.captured <= 16, what);
        /* the same run as launches, each compressor entry from the host-launched chain */
        mk_cuda_tuning tu0, tu;
        mk_cuda_ctx_get_tuning(ctx, &tu0);
        tu = tu0;
        tu.graphs = 0;
        tu.cmp_step = 0;
        mk_cuda_ctx_set_tuning(ctx, &tu);
        float *eag = malloc(sizeof(float) * per);
        run_alone(g, p0, c_tbt, L0, dec[0], V, eag);
        mk_cuda_ctx_set_tuning(ctx, &tu0);
        check(last_counts.off && last_counts.replayed == 0, "graphs: off by tuning, no step replayed");
        check(same(eag, tbt, per), "graphs: token by token as launches (host-decided compressor entries) = replayed");
        free(eag);
        /* the experts' layout is the tuning's at upload: a call under the other fp4_tiles is refused,
         * naming it, and the sequence still runs once the tuning is back */
        tu = tu0;
        tu.fp4_tiles = !tu0.fp4_tiles;
        mk_cuda_ctx_set_tuning(ctx, &tu);
        dsv4_cuda_seq *s;
        mk_err e2 = {0};
        if (dsv4_cuda_seq_create(g, LEN, 0, &s, &e2)) die("seq_create", &e2);
        const int rc = dsv4_cuda_forward(s, p0, 4, NULL, &e2);
        mk_cuda_ctx_set_tuning(ctx, &tu0);
        check(rc == MK_EINVAL && strstr(e2.msg, "fp4_tiles"), "layout: a call under the other fp4_tiles is refused");
        mk_err e3 = {0};
        check(!dsv4_cuda_forward(s, p0, 4, NULL, &e3), "layout: the same sequence runs under the upload's tuning");
        dsv4_cuda_seq_free(s);
    }

    /* batch: the same calls alone and interleaved */
    int s0c[] = {256, 444}, s1c[] = {300}, s2c[] = {50};
    float *ref[3], *got[3];
    for (int i = 0; i < 3; i++) {
        ref[i] = malloc(sizeof(float) * per);
        got[i] = calloc(per, sizeof(float));
    }
    float *ref0_256 = malloc(sizeof(float) * V), *got0_256 = malloc(sizeof(float) * V);
    {
        int c256[] = {256};
        int32_t none[NDEC];
        memcpy(none, dec[0], sizeof none);
        float *tmp = malloc(sizeof(float) * per);
        run_alone(g, p0, c256, 1, none, V, tmp); /* logits at 256 */
        memcpy(ref0_256, tmp, sizeof(float) * V);
        free(tmp);
    }
    run_alone(g, p0, s0c, 2, dec[0], V, ref[0]);
    run_alone(g, p1, s1c, 1, dec[1], V, ref[1]);
    run_alone(g, p2, s2c, 1, dec[2], V, ref[2]);
    dsv4_cuda_pool *pool;
    dsv4_cuda_work *w;
    if (dsv4_cuda_pool_create(g, 16, &pool, &err)) die("pool", &err);
    if (dsv4_cuda_work_create(g, 1024, 4, LEN, &w, &err)) die("work", &err);
    dsv4_cuda_seq *ps[4];
    for (int i = 0; i < 4; i++)
        if (dsv4_cuda_seq_create_paged(g, LEN, pool, &ps[i], &err)) die("paged seq", &err);
    int tb[4][4] = {{0, 1, 2, -1}, {3, 4, -1, -1}, {5, -1, -1, -1}, {0, 1, 9, 10}};
    int ntb[4] = {3, 2, 1, 4};
    for (int i = 0; i < 4; i++)
        if (dsv4_cuda_seq_bind(ps[i], tb[i], ntb[i], &err)) die("bind", &err);
    /* step 1: s0 [0, 256), s1 [0, 300), s2 [0, 50) */
    {
        dsv4_cuda_seq *sq[3] = {ps[0], ps[1], ps[2]};
        const int32_t *tk[3] = {p0, p1, p2};
        int n[3] = {256, 300, 50};
        float *lg[3] = {got0_256, got[1], got[2]};
        if (dsv4_cuda_forward_batch(w, sq, tk, n, lg, 3, &err)) die("batch step 1", &err);
    }
    /* step 2: s1 and s2 decode 0, s0 [256, 700) */
    {
        dsv4_cuda_seq *sq[3] = {ps[1], ps[0], ps[2]};
        const int32_t *tk[3] = {&dec[1][0], p0 + 256, &dec[2][0]};
        int n[3] = {1, 444, 1};
        float *lg[3] = {got[1] + V, got[0], got[2] + V};
        if (dsv4_cuda_forward_batch(w, sq, tk, n, lg, 3, &err)) die("batch step 2", &err);
    }
    /* decodes: s0 all six, s1 and s2 the rest, in one call each step */
    for (int st = 0; st < NDEC; st++) {
        dsv4_cuda_seq *sq[3];
        const int32_t *tk[3];
        int n[3], np = 0;
        float *lg[3];
        sq[np] = ps[0], tk[np] = &dec[0][st], n[np] = 1, lg[np++] = got[0] + (size_t)(1 + st) * V;
        for (int i = 1; i < 3; i++)
            if (st + 1 < NDEC) sq[np] = ps[i], tk[np] = &dec[i][st + 1], n[np] = 1, lg[np++] = got[i] + (size_t)(2 + st) * V;
        if (dsv4_cuda_forward_batch(w, sq, tk, n, lg, np, &err)) die("batch decode", &err);
    }
    check(same(ref0_256, got0_256, V), "batch: a 256-token chunk next to a 300-token prompt and a 50-token one = alone");
    for (int i = 0; i < 3; i++) {
        char what[128];
        snprintf(what, sizeof what, "batch: sequence %d (prompt + 6 decodes, interleaved with the others) = alone", i);
        check(same(ref[i], got[i], per), what);
    }
    check(same(ref[0], one, per), "batch: the 256 + 444 split alone = one call");
    {
        dsv4_cuda_graph_counts wc;
        dsv4_cuda_work_graph_counts(w, &wc);
        char what[160];
        snprintf(what, sizeof what, "graphs: the batched decodes of the paged pool (snapshots on) were graphs (%ld "
                 "captured, %ld replayed, %ld as launches)", wc.captured, wc.replayed, wc.eager);
        check(wc.captured + wc.replayed == NDEC && wc.replayed >= 3, what);
    }

    /* restore from the snapshots of the shared blocks 0 and 1 */
    {
        float *lg = malloc(sizeof(float) * per);
        if (dsv4_cuda_seq_restore(ps[3], 512, &err)) die("restore", &err);
        const int32_t *tk = p0 + 512;
        int n = L0 - 512;
        float *l0 = lg;
        if (dsv4_cuda_forward_batch(w, &ps[3], &tk, &n, &l0, 1, &err)) die("restored forward", &err);
        for (int st = 0; st < NDEC; st++) {
            const int32_t *t1 = &dec[0][st];
            int one1 = 1;
            float *l1 = lg + (size_t)(1 + st) * V;
            if (dsv4_cuda_forward_batch(w, &ps[3], &t1, &one1, &l1, 1, &err)) die("restored decode", &err);
        }
        check(same(lg, one, per), "restore: 512 positions from the block snapshots, then 188 + 6 decodes = cold run");
        free(lg);
    }
    /* a call past its block table fails cleanly and changes nothing */
    {
        const int32_t *tk = p0;
        int n = 300;
        int rc = dsv4_cuda_forward_batch(w, &ps[2], &tk, &n, NULL, 1, &err);
        check(rc != 0 && dsv4_cuda_seq_pos(ps[2]) == L2 + NDEC, "a piece beyond its block table is refused");
    }
    for (int i = 0; i < 4; i++) dsv4_cuda_seq_free(ps[i]);
    dsv4_cuda_work_free(w);
    dsv4_cuda_pool_free(pool);
    for (int i = 0; i < 3; i++) {
        free(ref[i]);
        free(got[i]);
    }
    free(ref0_256);
    free(got0_256);
    free(one);
    free(chk);
    free(tbt);
    free(c_tbt);
    dsv4_cuda_free(g);
    dsv4_model_free(m);
    mk_cuda_ctx_free(ctx);
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
