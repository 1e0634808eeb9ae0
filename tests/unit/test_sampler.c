/* test_sampler.c — unit tests of the sampler (src/engine/sampler.h), its Philox RNG
 * (src/engine/philox.h) and the stop-string matcher (src/engine/stop.h).
 *
 * What is checked: Philox4x32-10 against the Random123 known-answer vectors; a seeded request
 * reproduces exactly, also when interleaved with another request; greedy picks the lowest id on
 * ties; top-k / top-p / min-p keep exactly the expected candidate sets on constructed logits (through
 * mk_sampler_candidates, against a brute-force reference, and through the support of many draws),
 * applied in vLLM's order; temperature sampling matches softmax by a chi-square test at fixed seeds
 * (deterministic: the bound is the 0.999 quantile); each penalty and logit bias on constructed inputs;
 * min_tokens; ignore_eos; raw logprobs and sorted top_logprobs; stop strings across piece boundaries;
 * generation_config.json parsing; validation messages.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/philox.h"
#include "num/sample_math.h"
#include "engine/sampler.h"
#include "engine/stop.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static mk_sampler *make(const mk_sampling_params *p, int vocab, const int32_t *eos, int n_eos,
                        const int32_t *prompt, int n_prompt) {
    mk_sampler *s = NULL;
    mk_err err = {0};
    int rc = mk_sampler_create(p, vocab, eos, n_eos, prompt, n_prompt, &s, &err);
    cr_assert_eq(rc, MK_OK, "create: %s", err.msg);
    return s;
}

/* Candidate set of one step as a sorted id list; returns its size. */
static int cands(mk_sampler *s, const float *logits, int vocab, int32_t *ids, float *probs) {
    float *l = malloc(sizeof(float) * (size_t)vocab);
    memcpy(l, logits, sizeof(float) * (size_t)vocab);
    int n = 0;
    mk_err err = {0};
    cr_assert_eq(mk_sampler_candidates(s, l, ids, probs, &n, &err), MK_OK, "%s", err.msg);
    free(l);
    return n;
}

static void expect_set(const int32_t *got, int n, const int32_t *want, int m, const char *what) {
    cr_assert_eq(n, m, "%s: %d candidates, want %d", what, n, m);
    for (int i = 0; i < m; i++) cr_assert_eq(got[i], want[i], "%s: candidate %d is %d, want %d", what, i,
                                             got[i], want[i]);
}

static int32_t sample_once(mk_sampler *s, const float *logits, int vocab, mk_sample_out *o) {
    float *l = malloc(sizeof(float) * (size_t)vocab);
    memcpy(l, logits, sizeof(float) * (size_t)vocab);
    mk_err err = {0};
    cr_assert_eq(mk_sampler_sample(s, l, o, &err), MK_OK, "%s", err.msg);
    free(l);
    return o->token;
}

/* Logits from probabilities: log p (the softmax of these is p). */
static void logits_from_probs(const double *p, int n, float *l) {
    for (int i = 0; i < n; i++) l[i] = (float)log(p[i]);
}

/* ---- the arithmetic a GPU draw reproduces (sample_math.h) ------------------------------------ */

/* mk_sample_exp against the double exp over [-30, 0]: within 3 float ulps (relative 4e-7); 1 at 0,
 * 0 below -30 and at -inf. */
Test(sample_math, exp_accuracy_and_edges) {
    double worst = 0;
    for (int i = 0; i <= 3000000; i++) {
        const float x = (float)(-30.0 * i / 3000000.0);
        const double want = exp((double)x), got = mk_sample_exp(x);
        const double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    cr_log_info("mk_sample_exp: worst relative error %.3g over [-30, 0]", worst);
    cr_assert(worst < 4e-7, "worst relative error %g", worst);
    cr_assert_eq(mk_sample_exp(0.0f), 1.0f);
    cr_assert_eq(mk_sample_exp(-30.001f), 0.0f);
    cr_assert_eq(mk_sample_exp(-INFINITY), 0.0f);
    /* weights: 1 at the max, 0 below 2^-31 of it; masses: floor(w * 2^31) */
    cr_assert_eq(mk_sample_weight(3.0f, 3.0f, 1.0f), 1.0f);
    cr_assert_eq(mk_sample_weight(-22.0f, 0.0f, 1.0f), 0.0f); /* e^-22 = 2.8e-10 < 2^-31 */
    cr_assert(mk_sample_weight(-21.0f, 0.0f, 1.0f) > 0.0f);   /* e^-21 = 7.6e-10 */
    cr_assert_eq(mk_sample_mass(1.0f), 2147483648u);
    cr_assert_eq(mk_sample_mass(0.5f), 1073741824u);
    cr_assert_eq(mk_sample_mass(MK_SAMPLE_W_MIN), 1u);
}

/* mk_sample_weights (SSE4.1 where built with it) = mk_sample_weight one by one, bit for bit: random
 * logits at several temperatures, ties with the max, -inf, FLT_MAX, -0, and the edges around -30 and
 * 2^-31. */
Test(sample_math, weights_vector_equals_scalar) {
    enum { N = 1 << 16 };
    static float l[N], w[N];
    const float temps[4] = {100.0f, 1.0f, 0.7f, 1.0f / 3.0f};
    int checked = 0;
    for (int rep = 0; rep < 24; rep++) {
        for (int i = 0; i < N; i++) {
            const double u = mk_philox_uniform(4242 + (uint64_t)rep, (uint64_t)i, 2);
            l[i] = (float)(u * 64.0 - 50.0);
        }
        l[7] = -INFINITY, l[9] = -0.0f, l[11] = 0.0f, l[13] = 3.4028235e38f * (rep & 1 ? 1.0f : -1.0f);
        const float mx = rep & 1 ? 3.4028235e38f : 14.0f, inv_t = temps[rep % 4];
        if (!(rep & 1)) l[15] = mx, l[16] = mx - 30.0f / inv_t, l[17] = mx - 21.487562f / inv_t;
        mk_sample_weights(l, w, N - (rep % 4), mx, inv_t);
        for (int i = 0; i < N - (rep % 4); i++) {
            const float want = mk_sample_weight(l[i], mx, inv_t);
            cr_assert(!memcmp(&w[i], &want, sizeof want), "rep %d i %d: l %a -> %a, scalar %a", rep, i, (double)l[i],
                      (double)w[i], (double)want);
            checked++;
        }
    }
    cr_log_info("mk_sample_weights = mk_sample_weight on %d values", checked);
}

/* The weight bins (sample_math.h) that the host sampler's cuts and the GPU draw's rely on: as x grows,
 * the bin of mk_sample_exp(x) never grows, though mk_sample_exp itself is not monotonic (checked
 * here for every float within 2^14 ulps of each bin edge's x, where a step back could cross an
 * edge, and every 61st float of [-30, 0]); a bin's least mass is its lower edge's, where the bin
 * starts. */
Test(sample_math, weight_bins_follow_the_logits) {
    long checked = 0;
    for (int b = 1; b <= 248; b++) {
        const uint32_t eb = (0x3F8u - (uint32_t)b) << 20; /* bin b's lower edge: bin b - 1 starts above it */
        float e, below;
        memcpy(&e, &eb, sizeof e);
        const uint32_t bb = eb - 1;
        memcpy(&below, &bb, sizeof below);
        cr_assert_eq(mk_sample_wbin(e), b);
        cr_assert_eq(mk_sample_wbin(below), b + 1 > 255 ? 255 : b + 1);
        cr_assert_eq(mk_sample_wbin_min_mass(b), mk_sample_mass(e) ? mk_sample_mass(e) : 1u);
        cr_assert(mk_sample_mass(below) <= mk_sample_mass(e));
        float xe = logf(e); /* x near the edge (negative: walking up means the bits go down) */
        uint32_t u;
        memcpy(&u, &xe, sizeof u);
        int prev = 999;
        for (uint32_t q = u + 16384; q >= u - 16384 && q >= 0x80000000u; q--) {
            float x;
            memcpy(&x, &q, sizeof x);
            const float w = mk_sample_weight(x, 0.0f, 1.0f);
            if (!(w > 0.0f)) continue;
            const int k = mk_sample_wbin(w);
            cr_assert(prev == 999 || k <= prev, "x %a: bin %d after %d", (double)x, k, prev);
            prev = k;
            checked++;
        }
    }
    const float lo = -30.0f;
    uint32_t ulo;
    memcpy(&ulo, &lo, sizeof ulo);
    int prev = 999;
    for (uint32_t q = ulo; q > 0x80000000u; q -= q > 0x80000000u + 61 ? 61 : q - 0x80000000u) {
        float x;
        memcpy(&x, &q, sizeof x);
        const float w = mk_sample_weight(x, 0.0f, 1.0f);
        if (!(w > 0.0f)) continue;
        const int k = mk_sample_wbin(w);
        cr_assert(prev == 999 || k <= prev, "x %a: bin %d after %d", (double)x, k, prev);
        prev = k;
        checked++;
    }
    cr_assert_eq(mk_sample_wbin(1.0f), 0);
    cr_assert_eq(mk_sample_wbin(0.0f), MK_SAMPLE_WBINS - 1);
    cr_assert_eq(mk_sample_wbin(MK_SAMPLE_W_MIN), 248);
    cr_log_info("weight bins never grow with x on %ld floats", checked);
}

/* The GPU draw's algorithm (src/ops/cuda/sample.cu's k_sample_rows) run serially on the host with
 * the same sample_math.h pieces: the weights, top_k's radix select over the logit keys, top_p's
 * radix descent over the order keys with integer masses, the inverse CDF in id order. With bins
 * (the tuning's sample_bins) top_k and top_p first find the weight bin where their cut falls
 * (mk_sample_topk_wbin / mk_sample_topp_wbin) and, where that bin's candidates fit the kernel's
 * gather (MK_SAMPLE_GATHER, bounded as the kernel bounds them), run the radix passes over those only;
 * top_p's descent stops after the logit bytes where the cut's logit has no tie (radix_topp).
 * Returns the token, -1 when every logit is -inf / NaN; cut[0] counts the cuts made over the whole
 * row, cut[1] those made over a gathered bin. */
typedef struct {
    unsigned long long key;
    uint32_t mass;
} radix_item;

/* top_k's radix select over it[0, n): the value of the k-th largest key (k <= n) */
static uint32_t radix_topk(const radix_item *it, int n, unsigned long long k) {
    unsigned long long hist[256];
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        for (int i = 0; i < n; i++)
            if (((uint32_t)it[i].key & mask) == prefix) hist[((uint32_t)it[i].key >> shift) & 255u]++;
        prefix |= (uint32_t)mk_sample_topk_bin(hist, k, &k) << shift;
        mask |= 255u << shift;
    }
    return prefix;
}

/* top_p's radix descent over it[0, n) after the mass above: a key k such that the kept candidates
 * are those with keys >= k (the last kept one's key). With bins the last logit byte's pass also
 * counts: where the last kept candidate's logit is the only one of its value, the id bytes can't
 * split anything and the descent stops there (the logit's key with zero id bits). */
static int n_early;
static unsigned long long radix_topp(const radix_item *it, int n, unsigned long long above, double target, int bins) {
    unsigned long long hist[256], prefix = 0, mask = 0;
    unsigned cnt[256];
    for (int shift = 56; shift >= 0; shift -= 8) {
        memset(hist, 0, sizeof hist);
        memset(cnt, 0, sizeof cnt);
        for (int i = 0; i < n; i++)
            if ((it[i].key & mask) == prefix) hist[(it[i].key >> shift) & 255u] += it[i].mass, cnt[(it[i].key >> shift) & 255u]++;
        const int b = mk_sample_topp_bin(hist, above, target, &above);
        cr_assert(b >= 0, "top_p pass at shift %d: no kept bin", shift);
        prefix |= (unsigned long long)b << shift;
        mask |= 255ull << shift;
        if (bins && shift == 32 && cnt[b] == 1) {
            n_early++;
            break;
        }
    }
    return prefix;
}

static int32_t radix_draw_bins(const float *lg, int V, const mk_sample_draw *d, int bins, int *cut) {
    float *l = malloc(sizeof(float) * (size_t)V), *w = malloc(sizeof(float) * (size_t)V);
    radix_item *it = malloc(sizeof(radix_item) * (size_t)V);
    cr_assert(l && w && it);
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) {
        l[i] = isnan(lg[i]) ? -INFINITY : lg[i] == INFINITY ? 3.4028235e38f : lg[i];
        mx = fmaxf(mx, l[i]);
    }
    int32_t tok = -1;
    if (mx == -INFINITY) goto out;
    unsigned long long n = 0, hist[MK_SAMPLE_WBINS];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < V; i++) {
        w[i] = mk_sample_weight(l[i], mx, d->inv_t);
        if (d->min_p > 0.0f && w[i] < d->min_p) w[i] = 0.0f;
        n += w[i] > 0.0f;
        if (w[i] > 0.0f) hist[mk_sample_wbin(w[i])]++;
    }
    float thr = -INFINITY;
    if (d->top_k > 0 && d->top_k < V && n > (unsigned long long)d->top_k) {
        unsigned long long k = (unsigned long long)d->top_k, before;
        const int bb = mk_sample_topk_wbin(hist, k, &before);
        int m = 0;
        if (bins && hist[bb] <= MK_SAMPLE_GATHER) { /* the bin's candidates only, the rank left in it */
            for (int i = 0; i < V; i++)
                if (w[i] > 0.0f && mk_sample_wbin(w[i]) == bb) it[m++] = (radix_item){mk_sample_key(l[i]), 0};
            cr_assert_eq((unsigned long long)m, hist[bb]);
            k -= before;
            cut[1]++;
        } else {
            cut[0]++;
            for (int i = 0; i < V; i++)
                if (w[i] > 0.0f) it[m++] = (radix_item){mk_sample_key(l[i]), 0};
        }
        thr = mk_sample_unkey(radix_topk(it, m, k));
    }
    unsigned long long kstar = 0;
    if (d->top_p < 1.0f) {
        unsigned long long n2 = 0, z = 0;
        memset(hist, 0, sizeof hist);
        for (int i = 0; i < V; i++)
            if (w[i] > 0.0f && l[i] >= thr) n2++, z += mk_sample_mass(w[i]), hist[mk_sample_wbin(w[i])] += mk_sample_mass(w[i]);
        if (n2 > 1) {
            const double target = (double)d->top_p * (double)z;
            unsigned long long above;
            const int bb = mk_sample_topp_wbin(hist, target, &above);
            int m = 0;
            if (bins && hist[bb] / mk_sample_wbin_min_mass(bb) <= MK_SAMPLE_GATHER) {
                for (int i = 0; i < V; i++)
                    if (w[i] > 0.0f && l[i] >= thr && mk_sample_wbin(w[i]) == bb)
                        it[m++] = (radix_item){mk_sample_order_key(l[i], i), mk_sample_mass(w[i])};
                cr_assert(m >= 1 && m <= MK_SAMPLE_GATHER, "bin %d: %d gathered", bb, m);
                cut[1]++;
            } else {
                cut[0]++;
                above = 0;
                for (int i = 0; i < V; i++)
                    if (w[i] > 0.0f && l[i] >= thr) it[m++] = (radix_item){mk_sample_order_key(l[i], i), mk_sample_mass(w[i])};
            }
            kstar = radix_topp(it, m, above, target, bins);
        }
    }
    unsigned long long total = 0, c = 0;
    for (int i = 0; i < V; i++)
        if (w[i] > 0.0f && l[i] >= thr && mk_sample_order_key(l[i], i) >= kstar) total += mk_sample_mass(w[i]);
    const unsigned long long t = mk_sample_target(d->u53, total);
    for (int i = 0; i < V && tok < 0; i++)
        if (w[i] > 0.0f && l[i] >= thr && mk_sample_order_key(l[i], i) >= kstar && (c += mk_sample_mass(w[i])) > t) tok = i;
out:
    free(l), free(w), free(it);
    return tok;
}

/* The draw both ways (without and with bins): the same token, which it returns. bin_cuts counts the
 * cuts with bins over the whole row ([0]) and over a gathered bin ([1]). */
static int bin_cuts[2];
static int32_t radix_draw(const float *lg, int V, const mk_sample_draw *d) {
    int plain[2] = {0, 0};
    const int32_t a = radix_draw_bins(lg, V, d, 0, plain), b = radix_draw_bins(lg, V, d, 1, bin_cuts);
    cr_assert_eq(a, b, "the draw with bins gives %d, without %d", b, a);
    cr_assert_eq(plain[1], 0);
    return a;
}

/* That algorithm = mk_sampler_sample, token for token: 5000 spread logits, 1000 on a 0.25 grid
 * (massive ties) and 5000 near-uniform ones (the cuts' weight bins too crowded to gather), settings of temperature, min_p, top_k and top_p, many seeds; rows with NaN, -inf,
 * -0 / +0, +inf; an all -inf row. What the GPU kernel adds to this is the parallel plumbing only. */
Test(sample_math, gpu_draw_algorithm_equals_sampler) {
    static const struct { float T, min_p; int k; float top_p; } set[] = {
        {1, 0, 0, 1},          {0.7f, 0, 0, 0.95f}, {1, 0, 50, 0.9f}, {1.3f, 0.05f, 0, 1}, {0.6f, 0.02f, 200, 0.8f},
        {1, 0, 1, 1},          {0.005f, 0, 0, 1},   {2, 0, 0, 1e-4f}, {1, 0, 0, 0.5f},     {0.8f, 0, 5, 1},
        {1.5f, 0.1f, 7, 0.6f}, {3, 0, 0, 0.999f},
    };
    enum { VMAX = 5000 };
    static float row[VMAX], l[VMAX];
    int checked = 0, nontrivial = 0;
    for (int shape = 0; shape < 3; shape++) {
        const int V = shape == 1 ? 1000 : VMAX;
        for (int r = 0; r < 40; r++) {
            for (int i = 0; i < V; i++) {
                const double u = mk_philox_uniform(600 + (uint64_t)r + 100 * (uint64_t)shape, (uint64_t)i, 3);
                row[i] = shape == 1   ? (float)(floor(u * 40) * 0.25 - 5)
                         : shape == 2 ? (float)(u * 0.05 + 1.0) /* near-uniform: the cuts' bins are crowded */
                                      : (float)(u * u * u * 14.0 - 4.0);
            }
            if (r % 5 == 1) row[3] = NAN, row[V / 2] = -INFINITY, row[V - 1] = -0.0f, row[V - 2] = 0.0f;
            if (r == 7) row[11] = INFINITY, row[V - 7] = INFINITY;
            if (r == 39)
                for (int i = 0; i < V; i++) row[i] = -INFINITY;
            for (size_t c = 0; c < sizeof set / sizeof set[0]; c++) {
                mk_sampling_params p;
                mk_sampling_defaults(&p);
                p.temperature = set[c].T, p.min_p = set[c].min_p, p.top_k = set[c].k, p.top_p = set[c].top_p;
                p.seed = 77000 + (uint64_t)(r * 16 + (int)c), p.has_seed = 1;
                mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
                mk_sample_draw d;
                cr_assert(mk_sampler_plain_draw(s, &d));
                memcpy(l, row, sizeof(float) * (size_t)V);
                mk_sample_out o;
                mk_err err = {0};
                const int st = mk_sampler_sample(s, l, &o, &err);
                const int32_t want = st == MK_OK ? o.token : -1, got = radix_draw(row, V, &d);
                cr_assert(st == MK_OK || (st == MK_ERANGE && r == 39), "row %d setting %zu: %s", r, c, err.msg);
                cr_assert_eq(got, want, "V %d row %d setting %zu: radix draw %d, sampler %d", V, r, c, got, want);
                checked++;
                nontrivial += want > 0;
                mk_sampler_free(s);
            }
        }
    }
    cr_assert(nontrivial > checked / 2);
    /* both of the kernel's ways with bins ran: the cut's bin gathered, and too full to be */
    cr_assert(bin_cuts[0] > 20 && bin_cuts[1] > 200, "cuts over the row %d, over a gathered bin %d", bin_cuts[0],
              bin_cuts[1]);
    cr_assert(n_early > 100, "top_p descents stopped after the logit bytes: %d", n_early);
    cr_log_info("the GPU draw's algorithm = the sampler on %d rows (with bins: %d cuts over a gathered bin, %d over "
                "the row; %d top_p descents stopped after the logit bytes)",
                checked, bin_cuts[1], bin_cuts[0], n_early);
}

/* top_p's target exactly at a weight bin's end: token 0 (weight 1, bin 0) and tokens 1, 2 (weight 0.5
 * each, bin 8) make a total mass of 2^32, and top_p 0.5 puts the target at 2^31, bin 0's mass. Token 1
 * has exactly the target before it, so only token 0 is kept; the cut's bin must be bin 0 (a later
 * one would start at the target, where the GPU draw's descent finds no kept candidate). Just above
 * 0.5, token 1 is kept too. */
Test(sample_math, gpu_draw_top_p_target_at_a_bin_end) {
    enum { V = 16 };
    float row[V], l[V];
    const float half = -0x1.62e43p-1f; /* mk_sample_exp of it is 0.5 exactly */
    cr_assert_eq(mk_sample_weight(half, 0.0f, 1.0f), 0.5f);
    for (int i = 0; i < V; i++) row[i] = -40.0f;
    row[0] = 0.0f, row[1] = row[2] = half;
    unsigned long long mass[MK_SAMPLE_WBINS] = {0}, before = 7;
    mass[0] = 1ull << 31, mass[8] = 1ull << 31;
    cr_assert_eq(mk_sample_topp_wbin(mass, 0.5 * 4294967296.0, &before), 0);
    cr_assert_eq(before, 0);
    const int cuts = bin_cuts[1];
    for (int c = 0; c < 2; c++)
        for (int seed = 0; seed < 24; seed++) {
            mk_sampling_params p;
            mk_sampling_defaults(&p);
            p.temperature = 1.0f, p.top_p = c ? 0.50000006f : 0.5f;
            p.seed = 5100 + (uint64_t)seed, p.has_seed = 1;
            mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
            mk_sample_draw d;
            cr_assert(mk_sampler_plain_draw(s, &d));
            memcpy(l, row, sizeof row);
            mk_sample_out o;
            mk_err err = {0};
            cr_assert_eq(mk_sampler_sample(s, l, &o, &err), MK_OK, "%s", err.msg);
            cr_assert(c ? o.token == 0 || o.token == 1 : o.token == 0, "top_p %g: token %d", (double)p.top_p, o.token);
            cr_assert_eq(radix_draw(row, V, &d), o.token);
            mk_sampler_free(s);
        }
    cr_assert_eq(bin_cuts[1] - cuts, 48); /* every draw cut over a gathered bin */
}

/* mk_sampler_model_step: what the model does with it (the logits sanitized as its kernels read them,
 * mk_sample_adjust on each listed token, then the argmax or the GPU draw's algorithm, radix_draw)
 * = mk_sampler_sample, step after step (the tokens accepted, so the penalties' counts grow), for
 * logit_bias (huge and tiny), min_tokens' masked stop tokens, repetition (prompt and output),
 * frequency and presence penalties, greedy and every filter; and the steps it refuses. */
Test(sampler, model_step_equals_sampler) {
    static const struct {
        float T, min_p;
        int k;
        float top_p, rep, freq, pres;
        int nbias, min_tokens;
    } set[] = {
        {0, 0, 0, 1, 1.3f, 0, 0, 0, 0},      {0, 0, 0, 1, 1, 0.5f, 0.3f, 3, 4}, {0.8f, 0, 0, 1, 1, 0.7f, -0.4f, 0, 0},
        {1, 0.05f, 40, 0.9f, 1.2f, 0.2f, 0.5f, 5, 6}, {0.6f, 0, 0, 0.95f, 1, 0, 0, 4, 0},
        {1.3f, 0.02f, 0, 1, 2.0f, -1.5f, 2.0f, 2, 3}, {0.7f, 0, 5, 1, 1, 0, 0, 0, 10},
    };
    enum { V = 3000, STEPS = 18, NP = 60 };
    static float row[V], l[V], x[V];
    static mk_sample_adj adj[MK_SAMPLE_ADJ_MAX];
    const int32_t eos = 5, stops[2] = {7, 2999};
    int32_t prompt[NP];
    for (int i = 0; i < NP; i++) prompt[i] = (int32_t)(mk_philox_uniform(5, (uint64_t)i, 0) * V);
    int checked = 0, adjusted = 0, drawn = 0;
    for (size_t c = 0; c < sizeof set / sizeof set[0]; c++) {
        int32_t bid[8];
        float bval[8];
        for (int i = 0; i < set[c].nbias; i++) {
            bid[i] = i == 0 ? eos : (int32_t)(mk_philox_uniform(6 + c, (uint64_t)i, 0) * V);
            bval[i] = i % 2 ? -100.0f : (float)(i * 3.7);
        }
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        p.temperature = set[c].T, p.min_p = set[c].min_p, p.top_k = set[c].k, p.top_p = set[c].top_p;
        p.repetition_penalty = set[c].rep, p.frequency_penalty = set[c].freq, p.presence_penalty = set[c].pres;
        p.n_bias = set[c].nbias, p.bias_ids = bid, p.bias_vals = bval;
        p.min_tokens = set[c].min_tokens, p.stop_ids = stops, p.n_stop_ids = 2;
        p.seed = 4242 + c, p.has_seed = 1;
        mk_sampler *s = make(&p, V, &eos, 1, prompt, NP);
        for (int step = 0; step < STEPS; step++) {
            for (int i = 0; i < V; i++) { /* a peaked spread: output tokens repeat, so counts grow */
                const double u = mk_philox_uniform(700 + c, (uint64_t)i, (uint64_t)step);
                row[i] = (float)(u * u * u * 9.0 - 2.0) + (i % 97 == 0 ? 5.0f : 0.0f);
            }
            if (step == 3) row[11] = NAN, row[12] = INFINITY, row[13] = -INFINITY, row[14] = -0.0f;
            memcpy(l, row, sizeof row);
            mk_sample_out o;
            mk_err err = {0};
            cr_assert_eq(mk_sampler_sample(s, l, &o, &err), MK_OK, "set %zu step %d: %s", c, step, err.msg);
            mk_sample_draw d;
            if (mk_sampler_model_step(s, &d, adj, MK_SAMPLE_ADJ_MAX)) {
                cr_assert(d.adj == adj && d.n_adj >= 0 && d.n_adj <= MK_SAMPLE_ADJ_MAX);
            } else { /* once min_tokens is reached with nothing else to adjust: a plain step */
                cr_assert(set[c].nbias == 0 && set[c].rep == 1 && set[c].freq == 0 && set[c].pres == 0 &&
                              step >= set[c].min_tokens,
                          "set %zu step %d: not handed to the model", c, step);
                if (!mk_sampler_plain_draw(s, &d)) {
                    cr_assert(mk_sampler_plain_greedy(s));
                    d = (mk_sample_draw){.inv_t = 0.0f};
                }
            }
            for (int i = 0; i < V; i++) x[i] = isnan(row[i]) ? -INFINITY : row[i] == INFINITY ? 3.4028235e38f : row[i];
            static unsigned char listed[V];
            memset(listed, 0, sizeof listed);
            for (int e = 0; e < d.n_adj; e++) {
                cr_assert(adj[e].id >= 0 && adj[e].id < V && !listed[adj[e].id], "set %zu step %d: entry %d id %d (unique)",
                          c, step, e, adj[e].id);
                listed[adj[e].id] = 1;
                const float v = mk_sample_adjust(x[adj[e].id], &adj[e], d.rep, d.freq, d.pres);
                cr_assert(!isnan(v) && v != INFINITY, "set %zu step %d: token %d adjusted to %g", c, step, adj[e].id,
                          (double)v);
                x[adj[e].id] = v;
            }
            int32_t got;
            if (d.inv_t > 0.0f) {
                got = radix_draw(x, V, &d);
                drawn++;
            } else {
                got = -1;
                float mx = -INFINITY;
                for (int i = 0; i < V; i++)
                    if (x[i] > mx) mx = x[i], got = i;
            }
            cr_assert_eq(got, o.token, "set %zu step %d: the model's way gives %d, the sampler %d", c, step, got,
                         o.token);
            mk_sample_out t;
            cr_assert_eq(mk_sampler_take(s, got, &t, &err), MK_OK, "take: %s", err.msg);
            mk_sampler_accept(s, got);
            checked++;
            adjusted += d.n_adj > 0;
        }
        mk_sampler_free(s);
    }
    cr_assert(adjusted > checked / 2 && drawn > checked / 3, "%d steps, %d adjusted, %d drawn", checked, adjusted, drawn);
    { /* refused: logprobs, a repetition penalty below 1, a token biased twice, more tokens than cap */
        mk_sampling_params p;
        mk_sample_draw d;
        const int32_t twice[2] = {3, 3};
        const float bv[2] = {1, 2};
        for (int k = 0; k < 4; k++) {
            mk_sampling_defaults(&p);
            p.presence_penalty = 0.5f;
            if (k == 0) p.logprobs = 1;
            if (k == 1) p.repetition_penalty = 0.9f;
            if (k == 2) p.n_bias = 2, p.bias_ids = twice, p.bias_vals = bv;
            mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
            for (int t = 0; t < 5; t++) mk_sampler_accept(s, 100 + t);
            cr_assert(!mk_sampler_model_step(s, &d, adj, k == 3 ? 4 : MK_SAMPLE_ADJ_MAX), "case %d handed over", k);
            mk_sampler_free(s);
        }
        mk_sampling_defaults(&p); /* plain: the plain paths', not this one's */
        mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
        cr_assert(!mk_sampler_model_step(s, &d, adj, MK_SAMPLE_ADJ_MAX));
        mk_sampler_free(s);
    }
    cr_log_info("model steps = the sampler on %d steps (%d adjusted, %d drawn)", checked, adjusted, drawn);
}

/* mk_sample_target = floor(u53 * z / 2^53), against 128-bit arithmetic, and always < z. */
Test(sample_math, target_is_exact) {
    for (uint64_t i = 0; i < 200000; i++) {
        const uint64_t u53 = mk_philox_u53(99, i, 0);
        const uint64_t z = (mk_philox_u53(98, i, 0) >> (i % 40)) + 1; /* 1 .. 2^53 */
        const uint64_t want = (uint64_t)(((unsigned __int128)u53 * z) >> 53);
        cr_assert_eq(mk_sample_target(u53, z), want, "u53 %llu z %llu", (unsigned long long)u53,
                     (unsigned long long)z);
        cr_assert(want < z);
    }
    const uint64_t top = (1ull << 53) - 1;
    cr_assert_eq(mk_sample_target(top, 1), 0u);
    cr_assert_eq(mk_sample_target(0, 123456789), 0u);
    cr_assert_eq(mk_sample_target(top, 1ull << 50), (1ull << 50) - 1);
    cr_assert_eq((double)mk_philox_u53(5, 6, 0) / 9007199254740992.0, mk_philox_uniform(5, 6, 0));
}

/* A token whose weight is below 2^-31 of the top token's is not a candidate (mass 0). */
Test(sampler, tiny_weights_are_not_candidates) {
    const float l[4] = {0.0f, -30.0f, -21.0f, -22.0f};
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    mk_sampler *s = make(&p, 4, NULL, 0, NULL, 0);
    int32_t ids[4];
    float pr[4];
    const int32_t want[2] = {0, 2};
    expect_set(ids, cands(s, l, 4, ids, pr), want, 2, "tiny weights");
    cr_assert_float_eq(pr[0], 1.0 / (1.0 + exp(-21.0)), 1e-6);
    mk_sampler_free(s);
}

/* ---- Philox -------------------------------------------------------------------------------- */

/* Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter[4] key[2] -> output[4]. */
Test(philox, known_answers) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        mk_philox4x32_10(kat[v], kat[v] + 4, out);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(out[i], kat[v][6 + i], "vector %d word %d: %08x want %08x", v, i, out[i],
                         kat[v][6 + i]);
    }
}

Test(philox, uniform_range_and_mean) {
    double sum = 0;
    for (uint64_t i = 0; i < 100000; i++) {
        double u = mk_philox_uniform(12345, i, 0);
        cr_assert(u >= 0 && u < 1);
        sum += u;
    }
    /* mean of 1e5 uniforms: sd = 0.2887 / 316 = 0.0009; 5 sd */
    cr_assert(fabs(sum / 100000 - 0.5) < 0.0046, "mean %g", sum / 100000);
    cr_assert_neq(mk_philox_uniform(1, 0, 0), mk_philox_uniform(2, 0, 0));
    cr_assert_neq(mk_philox_uniform(1, 0, 0), mk_philox_uniform(1, 1, 0));
    cr_assert_neq(mk_philox_uniform(1, 0, 0), mk_philox_uniform(1, 0, 1));
    cr_assert_eq(mk_philox_uniform(7, 99, 0), mk_philox_uniform(7, 99, 0));
}

/* ---- reproducibility ----------------------------------------------------------------------- */

#define RV 512 /* vocabulary of the reproducibility tests */

/* A fake model: logits of step t depend on t and the previous token, from a fixed Philox key. */
static void fake_logits(int step, int32_t prev, float *l) {
    for (int i = 0; i < RV; i++)
        l[i] = (float)(6.0 * mk_philox_uniform(0xfeedull + (uint64_t)prev, (uint64_t)step, (uint32_t)i) - 3.0);
}

static void busy_params(mk_sampling_params *p, uint64_t seed) {
    mk_sampling_defaults(p);
    p->temperature = 0.9f;
    p->top_k = 60;
    p->top_p = 0.92f;
    p->min_p = 0.02f;
    p->repetition_penalty = 1.1f;
    p->frequency_penalty = 0.2f;
    p->presence_penalty = 0.1f;
    p->seed = seed;
    p->has_seed = 1;
}

static void generate(mk_sampler *s, int n, int32_t *toks) {
    float l[RV];
    int32_t prev = 0;
    mk_sample_out o;
    for (int t = 0; t < n; t++) {
        fake_logits(t, prev, l);
        mk_err err = {0};
        cr_assert_eq(mk_sampler_sample(s, l, &o, &err), MK_OK, "%s", err.msg);
        toks[t] = prev = o.token;
        mk_sampler_accept(s, o.token);
    }
}

/* The full pipeline (penalties, min_p, top_k, top_p) under one seed, run twice, and once interleaved
 * step by step with another request: the token sequences must be identical. */
Test(sampler, seeded_request_reproduces) {
    const int32_t prompt[] = {1, 2, 3, 4, 5, 400};
    mk_sampling_params p;
    busy_params(&p, 42);
    int32_t a[200], b[200], c[200], a2[200], other[200];
    mk_sampler *s = make(&p, RV, NULL, 0, prompt, 6);
    generate(s, 200, a);
    mk_sampler_free(s);
    s = make(&p, RV, NULL, 0, prompt, 6);
    generate(s, 200, b);
    mk_sampler_free(s);
    cr_assert_arr_eq(a, b, sizeof a, "same seed, different tokens");

    /* interleave seed 42 with seed 7, step by step: neither notices the other */
    mk_sampling_params q;
    busy_params(&q, 7);
    mk_sampler *sa = make(&p, RV, NULL, 0, prompt, 6), *sc = make(&q, RV, NULL, 0, prompt, 6);
    float l[RV];
    mk_sample_out o;
    int32_t pa = 0, pc = 0;
    for (int t = 0; t < 200; t++) {
        fake_logits(t, pc, l);
        cr_assert_eq(mk_sampler_sample(sc, l, &o, NULL), MK_OK);
        c[t] = pc = o.token;
        mk_sampler_accept(sc, o.token);
        fake_logits(t, pa, l);
        cr_assert_eq(mk_sampler_sample(sa, l, &o, NULL), MK_OK);
        a2[t] = pa = o.token;
        mk_sampler_accept(sa, o.token);
    }
    mk_sampler_free(sa);
    mk_sampler_free(sc);
    cr_assert_arr_eq(a, a2, sizeof a, "interleaving changed seed 42's tokens");
    s = make(&q, RV, NULL, 0, prompt, 6);
    generate(s, 200, other);
    mk_sampler_free(s);
    cr_assert_arr_eq(c, other, sizeof c, "interleaving changed seed 7's tokens");
    cr_assert(memcmp(a, c, sizeof a) != 0, "seeds 42 and 7 gave the same 200 tokens");
}

Test(sampler, unseeded_reports_a_replayable_seed) {
    mk_sampling_params p;
    busy_params(&p, 0);
    p.has_seed = 0;
    mk_sampler *s1 = make(&p, RV, NULL, 0, NULL, 0), *s2 = make(&p, RV, NULL, 0, NULL, 0);
    cr_assert_neq(mk_sampler_seed(s1), mk_sampler_seed(s2), "two unseeded requests share a seed");
    int32_t a[100], b[100];
    generate(s1, 100, a);
    p.has_seed = 1;
    p.seed = mk_sampler_seed(s1);
    mk_sampler *r = make(&p, RV, NULL, 0, NULL, 0);
    generate(r, 100, b);
    cr_assert_arr_eq(a, b, sizeof a);
    mk_sampler_free(s1);
    mk_sampler_free(s2);
    mk_sampler_free(r);
}

/* The RNG counter is the accepted-token count, so re-sampling a step (e.g. a retried step)
 * gives the same token. */
Test(sampler, same_step_same_token) {
    mk_sampling_params p;
    busy_params(&p, 3);
    p.repetition_penalty = 1;
    p.frequency_penalty = p.presence_penalty = 0;
    mk_sampler *s = make(&p, RV, NULL, 0, NULL, 0);
    float l[RV];
    fake_logits(0, 0, l);
    mk_sample_out o1, o2;
    sample_once(s, l, RV, &o1);
    sample_once(s, l, RV, &o2);
    cr_assert_eq(o1.token, o2.token, "the RNG moved without accept");
    mk_sampler_free(s);
}

/* ---- greedy -------------------------------------------------------------------------------- */

/* mk_sampler_plain_greedy says when a step is the raw argmax, and mk_sampler_take then gives what
 * mk_sampler_sample gives: on logits with ties, +inf, NaN and all-masked rows, for every setting
 * that keeps the step plain; any setting that processes the logits makes it not plain. */
Test(sampler, plain_greedy_take_equals_sample) {
    const int V = 7;
    const float rows[4][7] = {{1, 3, -INFINITY, 3, NAN, 2, 0},
                              {INFINITY, 5, INFINITY, NAN, 1, 2, 3},
                              {-0.0f, 0.0f, -1, -2, NAN, -INFINITY, -3},
                              {-INFINITY, NAN, -INFINITY, NAN, -INFINITY, -INFINITY, NAN}};
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0;
    p.top_k = 3; /* filters do not matter to greedy */
    p.top_p = 0.5f;
    const int32_t eos = 6;
    mk_sampler *s = make(&p, V, &eos, 1, NULL, 0);
    cr_assert(mk_sampler_plain_greedy(s));
    for (int r = 0; r < 4; r++) {
        /* the argmax as a model picks it (mk_sample_argmax: batch.c's CPU picks; batch.h's rule: NaN =
         * -inf, +inf = FLT_MAX, lowest id), against the sampler's own scan below */
        const int32_t am = mk_sample_argmax(rows[r], V);
        float l[7];
        memcpy(l, rows[r], sizeof l);
        mk_sample_out a, b;
        mk_err e1 = {0}, e2 = {0};
        int r1 = mk_sampler_sample(s, l, &a, &e1), r2 = mk_sampler_take(s, am, &b, &e2);
        cr_assert_eq(r1, r2, "row %d: sample %d, take %d", r, r1, r2);
        if (r1) {
            cr_assert_str_eq(e1.msg, e2.msg);
            continue;
        }
        cr_assert_eq(a.token, b.token, "row %d: sample %d, take %d", r, a.token, b.token);
        cr_assert_eq(b.n_top, 0);
        cr_assert_eq(b.logprob, 0.0f);
    }
    mk_err err = {0};
    mk_sample_out o;
    cr_assert_eq(mk_sampler_take(s, V, &o, &err), MK_EINVAL);
    mk_sampler_free(s);

    /* min_tokens masks the stop tokens until reached: plain only afterwards (or without stop ids) */
    p.min_tokens = 2;
    s = make(&p, V, &eos, 1, NULL, 0);
    cr_assert(!mk_sampler_plain_greedy(s));
    /* not plain, but a step the model can pick with the stop token masked (mk_sampler_model_step) */
    cr_assert_eq(mk_sampler_take(s, 1, &o, &err), MK_OK, "%s", err.msg);
    mk_sampler_accept(s, 1);
    cr_assert(!mk_sampler_plain_greedy(s));
    mk_sampler_accept(s, 1);
    cr_assert(mk_sampler_plain_greedy(s));
    mk_sampler_free(s);
    s = make(&p, V, NULL, 0, NULL, 0);
    cr_assert(mk_sampler_plain_greedy(s), "min_tokens without any stop token masks nothing");
    mk_sampler_free(s);
    p.min_tokens = 0; /* a step whose token needs the host (logprobs): take refuses */
    p.logprobs = 1;
    s = make(&p, V, NULL, 0, NULL, 0);
    cr_assert(!mk_sampler_plain_greedy(s));
    cr_assert_eq(mk_sampler_take(s, 1, &o, &err), MK_EINVAL);
    mk_sampler_free(s);
    p.min_tokens = 0;

    /* every processing step makes the step not plain */
    const int32_t bid = 2;
    const float bval = 1;
    for (int c = 0; c < 6; c++) {
        mk_sampling_params q = p;
        if (c == 0) q.temperature = 0.5f;
        if (c == 1) q.logprobs = 1;
        if (c == 2) q.top_logprobs = 2;
        if (c == 3) q.bias_ids = &bid, q.bias_vals = &bval, q.n_bias = 1;
        if (c == 4) q.repetition_penalty = 1.1f;
        if (c == 5) q.presence_penalty = 0.5f;
        s = make(&q, V, &eos, 1, NULL, 0);
        cr_assert(!mk_sampler_plain_greedy(s), "setting %d", c);
        mk_sampler_free(s);
    }
}

/* mk_sampler_plain_draw: the draw of a step with only temperature / min_p / top_k / top_p (the
 * sampler's inverse temperature and the step's 53-bit uniform), none for greedy or any processing
 * of the logits; mk_sampler_take then records a drawn token, and the uniform follows the step. */
Test(sampler, plain_draw_describes_the_step) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0.005f, p.top_k = 40, p.top_p = 0.9f, p.min_p = 0.05f, p.seed = 77, p.has_seed = 1;
    const int32_t eos = 6;
    mk_sampler *s = make(&p, 7, &eos, 1, NULL, 0);
    mk_sample_draw d;
    cr_assert(mk_sampler_plain_draw(s, &d));
    cr_assert(!mk_sampler_plain_greedy(s));
    cr_assert_eq(d.inv_t, 1.0f / 0.01f, "temperatures below 0.01 are raised to it");
    cr_assert_eq(d.top_k, 40);
    cr_assert_eq(d.top_p, 0.9f);
    cr_assert_eq(d.min_p, 0.05f);
    cr_assert_eq(d.u53, mk_philox_u53(77, 0, 0));
    mk_sample_out o;
    mk_err err = {0};
    cr_assert_eq(mk_sampler_take(s, 3, &o, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(o.token, 3);
    cr_assert_eq(mk_sampler_take(s, 7, &o, &err), MK_EINVAL);
    cr_assert_eq(mk_sampler_take(s, -1, &o, &err), MK_ERANGE);
    mk_sampler_accept(s, 3);
    cr_assert(mk_sampler_plain_draw(s, &d));
    cr_assert_eq(d.u53, mk_philox_u53(77, 1, 0), "the next step's uniform");
    mk_sampler_free(s);
    /* greedy, logprobs, bias, penalties, masked stop tokens: the host samples */
    const int32_t bid = 2;
    const float bval = 1;
    for (int c = 0; c < 6; c++) {
        mk_sampling_params q = p;
        if (c == 0) q.temperature = 0;
        if (c == 1) q.logprobs = 1;
        if (c == 2) q.bias_ids = &bid, q.bias_vals = &bval, q.n_bias = 1;
        if (c == 3) q.frequency_penalty = 0.5f;
        if (c == 4) q.repetition_penalty = 1.2f;
        if (c == 5) q.min_tokens = 1;
        s = make(&q, 7, &eos, 1, NULL, 0);
        cr_assert(!mk_sampler_plain_draw(s, &d), "setting %d", c);
        if (c == 5) { /* min_tokens reached: plain again */
            mk_sampler_accept(s, 1);
            cr_assert(mk_sampler_plain_draw(s, &d));
        }
        mk_sampler_free(s);
    }
}

/* Greedy: the argmax of the processed logits, the lowest id among equal maxima; NaN never wins. */
/* The sampler's passes over the vocabulary (sanitize, argmax, the masses' sums and the draw's walk)
 * run four floats at a time where the CPU has SSE4.1; this pins them to the plain one-at-a-time
 * definitions: every vocabulary size around the vector and run widths, NaN / +-inf / -0 / +0 ties,
 * a token alone at weight 1 (mass 2^31), all but one masked, seeded draws at several temperatures. */
static int32_t ref_argmax(const float *l, int V) { /* on sanitized logits */
    int32_t am = -1;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (l[i] > mx) mx = l[i], am = i;
    return am;
}
static int32_t ref_draw(const float *l, int V, float inv_t, uint64_t u53) {
    const int32_t am = ref_argmax(l, V);
    float *w = malloc(sizeof(float) * (size_t)V);
    uint64_t z = 0;
    for (int i = 0; i < V; i++) w[i] = mk_sample_weight(l[i], l[am], inv_t), z += mk_sample_mass(w[i]);
    const uint64_t t = mk_sample_target(u53, z);
    uint64_t c = 0;
    int32_t tok = -1;
    for (int i = 0; i < V && tok < 0; i++) {
        c += mk_sample_mass(w[i]);
        if (c > t) tok = i;
    }
    free(w);
    return tok;
}
Test(sampler, vector_passes_equal_scalar_definitions) {
    static const int sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 255, 256, 257, 511, 1000, 4099};
    static const float temps[] = {0.0f, 0.3f, 1.0f, 2.5f};
    int n_draws = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int V = sizes[si];
        float *x = malloc(sizeof(float) * (size_t)V), *san = malloc(sizeof(float) * (size_t)V);
        for (int variant = 0; variant < 8; variant++) {
            for (int i = 0; i < V; i++) {
                const double u = mk_philox_uniform(77 + (uint64_t)variant, (uint64_t)i, (uint64_t)V);
                x[i] = variant == 1 ? (float)(floor(u * 4) - 2) /* many ties */
                                    : (float)(u * 20.0 - 10.0);
            }
            if (variant == 2) /* specials: NaN, -inf, and a +inf that wins (FLT_MAX) */
                for (int i = 0; i < V; i += 3) x[i] = i % 2 ? NAN : -INFINITY;
            if (variant == 2 && V > 5) x[V - 2] = INFINITY;
            if (variant == 2 && V <= 5) x[V - 1] = 0.25f; /* not all masked */
            if (variant == 3) /* -0 before +0 at the top: the lowest id wins */
                for (int i = 0; i < V; i++) x[i] = i == V / 2 ? -0.0f : i == V - 1 ? 0.0f : -1.0f - (float)(i % 7);
            if (variant == 4) /* one token alone: weight 1, mass 2^31, the rest masked */
                for (int i = 0; i < V; i++) x[i] = i == (V * 2) / 3 ? 1.5f : -INFINITY;
            if (variant == 5) /* the top token far above the rest: the others' weights underflow */
                x[V / 3] = 60.0f;
            if (variant >= 6) /* most of the mass at the first / last id of a run of the draw's walk */
                x[(variant == 6 ? 256 : 255) % V] = 12.0f;
            for (int i = 0; i < V; i++) san[i] = isnan(x[i]) ? -INFINITY : x[i] == INFINITY ? FLT_MAX : x[i];
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++) {
                for (int seed = 0; seed < 3; seed++) {
                    mk_sampling_params p;
                    mk_sampling_defaults(&p);
                    p.temperature = temps[ti];
                    p.seed = 1000 + (uint64_t)seed, p.has_seed = 1;
                    mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
                    float *l = malloc(sizeof(float) * (size_t)V);
                    memcpy(l, x, sizeof(float) * (size_t)V);
                    mk_sample_out o;
                    mk_err err = {0};
                    cr_assert_eq(mk_sampler_sample(s, l, &o, &err), MK_OK, "V %d variant %d: %s", V, variant, err.msg);
                    for (int i = 0; i < V; i++) /* the logits sanitized in place, bit for bit */
                        cr_assert(memcmp(&l[i], &san[i], sizeof(float)) == 0, "V %d variant %d: logit %d sanitized "
                                  "to %g, want %g", V, variant, i, (double)l[i], (double)san[i]);
                    const int32_t want = temps[ti] == 0.0f ? ref_argmax(san, V)
                                                           : ref_draw(san, V, 1.0f / fmaxf(temps[ti], 0.01f),
                                                                      mk_philox_u53(p.seed, 0, 0));
                    cr_assert_eq(o.token, want, "V %d variant %d T %g seed %d: token %d, want %d", V, variant,
                                 (double)temps[ti], seed, o.token, want);
                    n_draws += temps[ti] > 0.0f;
                    free(l);
                    mk_sampler_free(s);
                }
            }
        }
        free(x), free(san);
    }
    cr_assert_gt(n_draws, 500);
}

Test(sampler, greedy_lowest_id_on_ties) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0;
    const float l[6] = {1, 3, -INFINITY, 3, NAN, 2};
    mk_sampler *s = make(&p, 6, NULL, 0, NULL, 0);
    mk_sample_out o;
    cr_assert_eq(sample_once(s, l, 6, &o), 1);
    mk_sampler_free(s);
    p.temperature = 5e-6f; /* below 1e-5: still greedy */
    s = make(&p, 6, NULL, 0, NULL, 0);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(sample_once(s, l, 6, &o), 1);
        mk_sampler_accept(s, o.token);
    }
    int32_t ids[6];
    cr_assert_eq(cands(s, l, 6, ids, NULL), 1);
    cr_assert_eq(ids[0], 1);
    mk_sampler_free(s);
    /* a NaN or -inf is never chosen; all masked is an error, not a crash */
    const float dead[3] = {-INFINITY, NAN, -INFINITY};
    p.temperature = 1;
    s = make(&p, 3, NULL, 0, NULL, 0);
    float d[3];
    memcpy(d, dead, sizeof d);
    mk_err err = {0};
    cr_assert_eq(mk_sampler_sample(s, d, &o, &err), MK_ERANGE);
    cr_assert(strstr(err.msg, "masked"), "%s", err.msg);
    mk_sampler_free(s);
}

/* ---- candidate sets ------------------------------------------------------------------------ */

/* top_k on logits with pairwise ties: every case's kept set, its renormalized probabilities, and
 * the support of many draws. */
Test(sampler, top_k_keeps_k_best_and_ties) {
    /* order: 1 and 3 (5), 5 and 7 (4), 2 and 9 (3), 4 (2), 0 (1), 6 (0), 8 (-1) */
    const float l[10] = {1, 5, 3, 5, 2, 4, 0, 4, -1, 3};
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    int32_t ids[10];
    float pr[10];
    struct { int k; int n; int32_t want[10]; } cases[] = {
        {1, 2, {1, 3}},             /* tie with the 1st: both kept (vLLM masks < k-th value) */
        {2, 2, {1, 3}},
        {3, 4, {1, 3, 5, 7}},       /* the tie at the boundary is kept */
        {4, 4, {1, 3, 5, 7}},
        {5, 6, {1, 2, 3, 5, 7, 9}},
        {9, 9, {0, 1, 2, 3, 4, 5, 6, 7, 9}},
        {10, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
        {50, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
        {0, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
        {-1, 10, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_k = cases[c].k;
        mk_sampler *s = make(&p, 10, NULL, 0, NULL, 0);
        int n = cands(s, l, 10, ids, pr);
        char what[32];
        snprintf(what, sizeof what, "top_k=%d", cases[c].k);
        expect_set(ids, n, cases[c].want, cases[c].n, what);
        /* renormalized softmax over the kept set */
        double z = 0;
        for (int i = 0; i < n; i++) z += exp(l[ids[i]]);
        for (int i = 0; i < n; i++)
            cr_assert(fabs(pr[i] - exp(l[ids[i]]) / z) < 1e-6, "%s: prob of %d", what, ids[i]);
        mk_sampler_free(s);
    }
    /* the support of 4000 draws at top_k=3 is exactly {1, 3, 5, 7} */
    p.top_k = 3;
    p.seed = 11;
    p.has_seed = 1;
    mk_sampler *s = make(&p, 10, NULL, 0, NULL, 0);
    int seen[10] = {0};
    mk_sample_out o;
    for (int t = 0; t < 4000; t++) {
        seen[sample_once(s, l, 10, &o)]++;
        mk_sampler_accept(s, o.token);
    }
    for (int i = 0; i < 10; i++)
        cr_assert_eq(seen[i] > 0, i == 1 || i == 3 || i == 5 || i == 7, "token %d drawn %d times", i,
                     seen[i]);
    mk_sampler_free(s);
}

/* top_p on four tokens whose probabilities are known exactly; thresholds kept away from the
 * cumulative sums 0.4, 0.7, 0.9, 1.0 so float rounding cannot decide a case. */
Test(sampler, top_p_keeps_smallest_prefix) {
    /* probabilities by id: 0.1 0.4 0.2 0.3 -> order 1 (0.4), 3 (0.3), 2 (0.2), 0 (0.1) */
    const double pr[4] = {0.1, 0.4, 0.2, 0.3};
    float l[4];
    logits_from_probs(pr, 4, l);
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    int32_t ids[4];
    struct { float top_p; int n; int32_t want[4]; } cases[] = {
        {1e-6f, 1, {1}}, {0.3f, 1, {1}}, {0.39f, 1, {1}}, {0.45f, 2, {1, 3}}, {0.65f, 2, {1, 3}},
        {0.75f, 3, {1, 2, 3}}, {0.85f, 3, {1, 2, 3}}, {0.95f, 4, {0, 1, 2, 3}}, {1.0f, 4, {0, 1, 2, 3}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        p.top_p = cases[c].top_p;
        mk_sampler *s = make(&p, 4, NULL, 0, NULL, 0);
        char what[32];
        snprintf(what, sizeof what, "top_p=%g", (double)cases[c].top_p);
        expect_set(ids, cands(s, l, 4, ids, NULL), cases[c].want, cases[c].n, what);
        mk_sampler_free(s);
    }
    /* support of draws at top_p=0.65: exactly {1, 3} */
    p.top_p = 0.65f;
    p.seed = 5;
    p.has_seed = 1;
    mk_sampler *s = make(&p, 4, NULL, 0, NULL, 0);
    int seen[4] = {0};
    mk_sample_out o;
    for (int t = 0; t < 3000; t++) {
        seen[sample_once(s, l, 4, &o)]++;
        mk_sampler_accept(s, o.token);
    }
    cr_assert(seen[1] > 0 && seen[3] > 0 && seen[0] == 0 && seen[2] == 0, "%d %d %d %d", seen[0],
              seen[1], seen[2], seen[3]);
    mk_sampler_free(s);
}

/* Brute-force reference of temperature + min_p + top_k + top_p on a large vocabulary: sort all ids
 * by (logit desc, id asc), apply each rule literally. */
static const float *g_ref_l;
static int by_order(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_ref_l[x] != g_ref_l[y]) return g_ref_l[x] > g_ref_l[y] ? -1 : 1;
    return x < y ? -1 : 1;
}
static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}
static int reference_set(const float *l, int V, float T, float min_p, int k, float top_p,
                         int32_t *out) {
    int32_t *o = malloc(sizeof(int32_t) * (size_t)V);
    for (int i = 0; i < V; i++) o[i] = i;
    g_ref_l = l;
    qsort(o, (size_t)V, sizeof *o, by_order);
    double *w = malloc(sizeof(double) * (size_t)V);
    int n = 0;
    for (int i = 0; i < V; i++) {
        w[i] = exp(((double)l[o[i]] - l[o[0]]) / T);
        if (w[i] >= min_p) n = i + 1; /* sorted: the survivors of min_p are a prefix */
    }
    if (k > 0 && k < n) {
        int m = k;
        while (m < n && l[o[m]] == l[o[k - 1]]) m++;
        n = m;
    }
    double z = 0;
    for (int i = 0; i < n; i++) z += w[i];
    int m = 0;
    for (double acc = 0; m < n && acc < top_p * z; m++) acc += w[m];
    memcpy(out, o, sizeof(int32_t) * (size_t)m);
    qsort(out, (size_t)m, sizeof *out, cmp_id);
    free(o);
    free(w);
    return m;
}

/* 5000 tokens (so top_p goes through the partition descent, not only the small-range sort), with
 * and without massive ties, against the literal sort-everything reference above. */
Test(sampler, filters_match_reference_on_large_vocab) {
    enum { V = 5000 };
    static float l[V];
    static int32_t got[V], want[V];
    for (int tie = 0; tie < 2; tie++) {
        for (int i = 0; i < V; i++) {
            double u = mk_philox_uniform(77 + (uint64_t)tie, (uint64_t)i, 0);
            /* tie = 1: logits on a 0.25 grid, so many exact ties exercise the id order */
            l[i] = tie ? (float)(floor(u * 40) * 0.25 - 5) : (float)(u * 12 - 6);
        }
        struct { float T, min_p; int k; float top_p; } cases[] = {
            {1, 0, 0, 0.5f},  {1, 0, 0, 0.9f},   {0.7f, 0, 0, 0.95f}, {1.5f, 0, 0, 0.3f},
            {1, 0, 100, 1},   {1, 0, 1000, 0.8f}, {1, 0.05f, 0, 1},    {2, 0.3f, 0, 0.9f},
            {1, 0.01f, 400, 0.7f}, {0.5f, 0, 3, 0.99f}, {1, 0, 0, 1e-4f},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            mk_sampling_params p;
            mk_sampling_defaults(&p);
            p.temperature = cases[c].T;
            p.min_p = cases[c].min_p;
            p.top_k = cases[c].k;
            p.top_p = cases[c].top_p;
            mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
            int n = cands(s, l, V, got, NULL);
            int m = reference_set(l, V, cases[c].T, cases[c].min_p, cases[c].k, cases[c].top_p, want);
            char what[96];
            snprintf(what, sizeof what, "ties=%d T=%g min_p=%g k=%d top_p=%g", tie, (double)cases[c].T,
                     (double)cases[c].min_p, cases[c].k, (double)cases[c].top_p);
            expect_set(got, n, want, m, what);
            cr_assert(n >= 1);
            mk_sampler_free(s);
        }
    }
}

/* The host filters settle most ids by their weight's bin (an eighth of an octave) and sort only the
 * bin where top_k's count or top_p's mass runs out. Here that bin's edge is exactly where they run
 * out: k tokens spread over many bins above a gap, the highest id the highest logit, the rest far
 * below; and top_p's target falling in a crowded bin (many equal weights, then a run of distinct
 * ones). Against the literal reference. */
Test(sampler, filters_exact_at_bin_edges) {
    enum { V = 3000 };
    static float l[V];
    static int32_t got[V], want[V];
    for (int lay = 0; lay < 2; lay++) {
        for (int i = 0; i < V; i++) {
            const double u = mk_philox_uniform(91 + (uint64_t)lay, (uint64_t)i, 0);
            if (lay == 0) /* ids 0..39 above a gap of ~15 nats, id 39 the highest */
                l[i] = i < 40 ? (float)(-(39 - i) * 0.07) : (float)(-18 - u * 4);
            else /* 600 ties at 0, then 400 distinct values just below, the rest far below */
                l[i] = i < 600 ? 0.0f : i < 1000 ? (float)(-0.001 * (i - 599)) : (float)(-12 - u * 6);
        }
        struct { float T; int k; float top_p; } cases[] = {
            {1, 40, 1}, {1, 40, 0.9f}, {1, 39, 1}, {1, 41, 1}, {1, 20, 0.7f}, {0.5f, 40, 0.99f}, {1, 0, 0.5f},
            {1, 0, 0.99f}, {1, 600, 1}, {1, 700, 0.95f}, {1, 1000, 1}, {2, 0, 0.8f},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            mk_sampling_params p;
            mk_sampling_defaults(&p);
            p.temperature = cases[c].T, p.top_k = cases[c].k, p.top_p = cases[c].top_p;
            mk_sampler *s = make(&p, V, NULL, 0, NULL, 0);
            const int n = cands(s, l, V, got, NULL);
            const int m = reference_set(l, V, cases[c].T, 0, cases[c].k, cases[c].top_p, want);
            char what[96];
            snprintf(what, sizeof what, "layout %d T=%g k=%d top_p=%g", lay, (double)cases[c].T, cases[c].k,
                     (double)cases[c].top_p);
            expect_set(got, n, want, m, what);
            mk_sampler_free(s);
        }
    }
}

/* min_p compares against the tempered distribution: a higher temperature keeps more tokens. */
Test(sampler, min_p_on_tempered_distribution) {
    const double pr[4] = {0.5, 0.25, 0.15, 0.1};
    float l[4];
    logits_from_probs(pr, 4, l);
    int32_t ids[4];
    struct { float T, min_p; int n; int32_t want[4]; } cases[] = {
        {1, 0.19f, 4, {0, 1, 2, 3}}, {1, 0.25f, 3, {0, 1, 2}}, {1, 0.55f, 1, {0}}, {1, 1.0f, 1, {0}},
        /* T=2: p ~ sqrt(p): relative 1, .707, .548, .447 */
        {1, 0.6f, 1, {0}}, {2, 0.6f, 2, {0, 1}}, {2, 0.45f, 3, {0, 1, 2}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        p.temperature = cases[c].T;
        p.min_p = cases[c].min_p;
        mk_sampler *s = make(&p, 4, NULL, 0, NULL, 0);
        char what[48];
        snprintf(what, sizeof what, "T=%g min_p=%g", (double)cases[c].T, (double)cases[c].min_p);
        expect_set(ids, cands(s, l, 4, ids, NULL), cases[c].want, cases[c].n, what);
        mk_sampler_free(s);
    }
}

/* The order min_p -> top_k -> top_p, with top_p over the renormalized survivors. */
Test(sampler, filter_order_is_vllms) {
    const double pr[4] = {0.4, 0.3, 0.2, 0.1};
    float l[4];
    logits_from_probs(pr, 4, l);
    int32_t ids[4];
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    /* top_k=3 then top_p=0.75: renormalized .444 .333 .222 -> mass before id 2 is .778 >= .75 -> {0,1}.
     * (top_p first on the full distribution would keep {0,1,2}.) */
    p.top_k = 3;
    p.top_p = 0.75f;
    mk_sampler *s = make(&p, 4, NULL, 0, NULL, 0);
    const int32_t w1[] = {0, 1};
    expect_set(ids, cands(s, l, 4, ids, NULL), w1, 2, "top_k then top_p");
    mk_sampler_free(s);
    /* min_p=0.6 keeps {0,1} (.571 .429 renormalized), then top_p=0.5 keeps {0}.
     * (top_p first: mass before id 1 is .4 < .5 -> {0,1}, then min_p -> {0,1}.) */
    mk_sampling_defaults(&p);
    p.min_p = 0.6f;
    p.top_p = 0.5f;
    s = make(&p, 4, NULL, 0, NULL, 0);
    const int32_t w2[] = {0};
    expect_set(ids, cands(s, l, 4, ids, NULL), w2, 1, "min_p then top_p");
    mk_sampler_free(s);
}

/* ---- the distribution of temperature sampling ---------------------------------------------- */

/* Chi-square quantile by Wilson-Hilferty, z = 3.0902 (upper 0.001): accurate to ~1% for df >= 5. */
static double chi2_bound(int df) {
    double a = 2.0 / (9.0 * df), z = 3.0902;
    double x = 1 - a + z * sqrt(a);
    return df * x * x * x;
}

/* Draws n tokens and returns the chi-square statistic against the expected probabilities. */
static double chi2_run(const mk_sampling_params *p, const float *l, int V, const double *expect, int n) {
    mk_sampler *s = make(p, V, NULL, 0, NULL, 0);
    int *cnt = calloc((size_t)V, sizeof *cnt);
    mk_sample_out o;
    for (int t = 0; t < n; t++) {
        cnt[sample_once(s, l, V, &o)]++;
        mk_sampler_accept(s, o.token);
    }
    double chi = 0;
    for (int i = 0; i < V; i++) {
        if (expect[i] == 0) {
            cr_assert_eq(cnt[i], 0, "token %d has probability 0 but was drawn %d times", i, cnt[i]);
            continue;
        }
        cr_assert(expect[i] * n >= 5, "cell %d too small for chi-square", i);
        double e = expect[i] * n;
        chi += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    free(cnt);
    mk_sampler_free(s);
    return chi;
}

/* Empirical frequencies vs softmax(l / T): chi-square below its 0.999 quantile. The seeds are
 * fixed, so the statistic is the same on every run (no flakiness); a wrong temperature, a biased
 * draw or a constant u fails by orders of magnitude. */
Test(sampler, temperature_matches_softmax) {
    const float l8[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -0.3f, 0.8f, -2.0f};
    for (int ti = 0; ti < 3; ti++) {
        const float T = ti == 0 ? 0.7f : ti == 1 ? 1.0f : 1.8f;
        double e[8], z = 0;
        for (int i = 0; i < 8; i++) z += e[i] = exp(l8[i] / T);
        for (int i = 0; i < 8; i++) e[i] /= z;
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        p.temperature = T;
        p.seed = 1000 + (uint64_t)ti;
        p.has_seed = 1;
        double chi = chi2_run(&p, l8, 8, e, 100000);
        cr_log_info("T=%g: chi2 %.2f, bound %.2f (df 7)", (double)T, chi, chi2_bound(7));
        cr_assert(chi < chi2_bound(7), "T=%g: chi2 %g >= %g (df 7)", (double)T, chi, chi2_bound(7));
    }
    /* 64 tokens, T=1.3 */
    float l[64];
    double e[64], z = 0;
    for (int i = 0; i < 64; i++) l[i] = (float)(4 * mk_philox_uniform(9, (uint64_t)i, 0) - 2);
    for (int i = 0; i < 64; i++) z += e[i] = exp(l[i] / 1.3);
    for (int i = 0; i < 64; i++) e[i] /= z;
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 1.3f;
    p.seed = 2024;
    p.has_seed = 1;
    double chi = chi2_run(&p, l, 64, e, 200000);
    cr_log_info("64 tokens T=1.3: chi2 %.2f, bound %.2f (df 63)", chi, chi2_bound(63));
    cr_assert(chi < chi2_bound(63), "chi2 %g >= %g (df 63)", chi, chi2_bound(63));
}

Test(sampler, filtered_distribution_is_renormalized_softmax) {
    /* top_k=4 of 8 at T=0.8: the four best, in proportion exp(l/T) */
    const float l[8] = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -0.3f, 0.8f, -2.0f};
    double e[8] = {0}, z = 0;
    const int keep[4] = {2, 4, 6, 0};
    for (int i = 0; i < 4; i++) z += e[keep[i]] = exp(l[keep[i]] / 0.8);
    for (int i = 0; i < 8; i++) e[i] /= z;
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0.8f;
    p.top_k = 4;
    p.seed = 31337;
    p.has_seed = 1;
    double chi = chi2_run(&p, l, 8, e, 100000);
    cr_log_info("top_k=4 T=0.8: chi2 %.2f, bound %.2f (df 3)", chi, chi2_bound(3));
    cr_assert(chi < chi2_bound(3), "chi2 %g >= %g (df 3)", chi, chi2_bound(3));
}

/* ---- penalties, bias, min_tokens, ignore_eos ------------------------------------------------ */

/* Runs one greedy step after accepting `out` and returns the processed logits in l. */
static void processed(const mk_sampling_params *p, const int32_t *prompt, int n_prompt, const int32_t *out,
                      int n_out, float *l, int V) {
    mk_sampler *s = make(p, V, NULL, 0, prompt, n_prompt);
    for (int i = 0; i < n_out; i++) mk_sampler_accept(s, out[i]);
    mk_sample_out o;
    cr_assert_eq(mk_sampler_sample(s, l, &o, NULL), MK_OK);
    mk_sampler_free(s);
}

static const float PEN_L[8] = {1.0f, 0.7f, 2.0f, -1.0f, 3.0f, 0.5f, 4.0f, 0.0f};
static const int32_t PEN_PROMPT[] = {2, 7};
static const int32_t PEN_OUT[] = {3, 5, 5, 5, 6};

static void expect_logits(const float *got, const float *want, const char *what) {
    for (int i = 0; i < 8; i++)
        cr_assert(fabsf(got[i] - want[i]) < 1e-6f, "%s: logit %d is %g, want %g", what, i, (double)got[i],
                  (double)want[i]);
}

/* The penalty tests read the processed logits that mk_sampler_sample leaves in its input array.
 * Prompt {2, 7}, output 3, 5, 5, 5, 6. */
Test(sampler, repetition_penalty_prompt_and_output) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0;
    p.repetition_penalty = 2;
    float l[8];
    memcpy(l, PEN_L, sizeof l);
    processed(&p, PEN_PROMPT, 2, PEN_OUT, 5, l, 8);
    /* seen: 2, 7 (prompt), 3, 5, 6 (output). positive / 2, non-positive * 2 */
    const float want[8] = {1.0f, 0.7f, 1.0f, -2.0f, 3.0f, 0.25f, 2.0f, 0.0f};
    expect_logits(l, want, "repetition");
}

Test(sampler, frequency_and_presence_count_output_only) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0;
    p.frequency_penalty = 0.5f;
    float l[8];
    memcpy(l, PEN_L, sizeof l);
    processed(&p, PEN_PROMPT, 2, PEN_OUT, 5, l, 8);
    const float wf[8] = {1.0f, 0.7f, 2.0f, -1.5f, 3.0f, -1.0f, 3.5f, 0.0f};
    expect_logits(l, wf, "frequency");
    mk_sampling_defaults(&p);
    p.temperature = 0;
    p.presence_penalty = -0.25f; /* negative: encourages repetition */
    memcpy(l, PEN_L, sizeof l);
    processed(&p, PEN_PROMPT, 2, PEN_OUT, 5, l, 8);
    const float wp[8] = {1.0f, 0.7f, 2.0f, -0.75f, 3.0f, 0.75f, 4.25f, 0.0f};
    expect_logits(l, wp, "presence");
}

Test(sampler, bias_applies_before_penalties) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0;
    const int32_t bid[] = {5, 4, 0};
    const float bval[] = {3.0f, -100.0f, 0.25f};
    p.bias_ids = bid;
    p.bias_vals = bval;
    p.n_bias = 3;
    float l[8];
    memcpy(l, PEN_L, sizeof l);
    processed(&p, NULL, 0, NULL, 0, l, 8);
    const float wb[8] = {1.25f, 0.7f, 2.0f, -1.0f, -97.0f, 3.5f, 4.0f, 0.0f};
    expect_logits(l, wb, "bias");
    /* bias, then repetition, then frequency and presence: 5 -> (0.5 + 3) / 2 - 3 * 0.5 - 0.25 */
    p.repetition_penalty = 2;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    memcpy(l, PEN_L, sizeof l);
    processed(&p, PEN_PROMPT, 2, PEN_OUT, 5, l, 8);
    const float wc[8] = {1.25f, 0.7f, 1.0f, -2.75f, -97.0f, 0.0f, 1.25f, 0.0f};
    expect_logits(l, wc, "bias + penalties");
    /* greedy follows: a -100 bias removes the argmax */
    const float l2[3] = {1, 5, 2};
    const int32_t kill[] = {1};
    const float neg[] = {-100};
    mk_sampling_defaults(&p);
    p.temperature = 0;
    p.bias_ids = kill;
    p.bias_vals = neg;
    p.n_bias = 1;
    mk_sampler *s = make(&p, 3, NULL, 0, NULL, 0);
    mk_sample_out o;
    cr_assert_eq(sample_once(s, l2, 3, &o), 2);
    mk_sampler_free(s);
}

Test(sampler, min_tokens_masks_stop_tokens) {
    /* EOS 1 and stop id 4 are the most likely; min_tokens=3 hides both for three steps */
    const float l[6] = {0.5f, 9.0f, 1.0f, 0.0f, 8.0f, -1.0f};
    const int32_t eos[] = {1};
    const int32_t stop[] = {4};
    for (int ign = 0; ign < 2; ign++) {
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        p.temperature = 0;
        p.min_tokens = 3;
        p.stop_ids = stop;
        p.n_stop_ids = 1;
        p.ignore_eos = ign; /* as in vLLM, EOS is masked during min_tokens even with ignore_eos */
        mk_sampler *s = make(&p, 6, eos, 1, NULL, 0);
        mk_sample_out o;
        for (int t = 0; t < 3; t++) {
            cr_assert_eq(sample_once(s, l, 6, &o), 2, "step %d", t);
            int32_t ids[6];
            int n = cands(s, l, 6, ids, NULL);
            cr_assert_eq(n, 1);
            mk_sampler_accept(s, o.token);
        }
        cr_assert_eq(mk_sampler_n_generated(s), 3);
        cr_assert_eq(sample_once(s, l, 6, &o), 1, "EOS allowed after min_tokens");
        mk_sampler_free(s);
    }
    /* random sampling: the candidate set excludes the stop tokens */
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.min_tokens = 1;
    p.stop_ids = stop;
    p.n_stop_ids = 1;
    mk_sampler *s = make(&p, 6, eos, 1, NULL, 0);
    int32_t ids[6];
    const int32_t want[] = {0, 2, 3, 5};
    expect_set(ids, cands(s, l, 6, ids, NULL), want, 4, "min_tokens random");
    mk_sampler_free(s);
    /* a vocabulary of stop tokens only: masked away -> MK_ERANGE */
    const int32_t all[] = {0, 1};
    const float l2[2] = {1, 2};
    p.n_stop_ids = 0;
    s = make(&p, 2, all, 2, NULL, 0);
    float x[2] = {l2[0], l2[1]};
    mk_sample_out o;
    cr_assert_eq(mk_sampler_sample(s, x, &o, NULL), MK_ERANGE);
    mk_sampler_free(s);
}

Test(sampler, stop_tokens_and_ignore_eos) {
    const int32_t eos[] = {1, 9};
    const int32_t stop[] = {4};
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.stop_ids = stop;
    p.n_stop_ids = 1;
    mk_sampler *s = make(&p, 10, eos, 2, NULL, 0);
    cr_assert(mk_sampler_is_stop_token(s, 1) && mk_sampler_is_stop_token(s, 9));
    cr_assert(mk_sampler_is_stop_token(s, 4) && !mk_sampler_is_stop_token(s, 0));
    mk_sampler_free(s);
    p.ignore_eos = 1;
    s = make(&p, 10, eos, 2, NULL, 0);
    cr_assert(!mk_sampler_is_stop_token(s, 1) && !mk_sampler_is_stop_token(s, 9));
    cr_assert(mk_sampler_is_stop_token(s, 4), "stop_token_ids still stop with ignore_eos");
    /* EOS is not masked by ignore_eos: greedy still picks it when it is the best */
    const float l[10] = {0, 5, 0, 0, 0, 0, 0, 0, 0, 0};
    mk_sample_out o;
    p.temperature = 0;
    mk_sampler_free(s);
    s = make(&p, 10, eos, 2, NULL, 0);
    cr_assert_eq(sample_once(s, l, 10, &o), 1);
    mk_sampler_free(s);
}

/* ---- logprobs ------------------------------------------------------------------------------ */

Test(sampler, logprobs_are_raw_log_softmax) {
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(8 * mk_philox_uniform(4, (uint64_t)i, 0) - 4);
    l[10] = l[20] = l[30] = 5.0f; /* a three-way tie at the top: ids ascending */
    double mx = 5, z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i] - mx);
    const double lse = mx + log(z);
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0.5f; /* processing must not leak into the reported logprobs */
    p.repetition_penalty = 1.5f;
    p.frequency_penalty = 1.0f;
    const int32_t bid[] = {3};
    const float bval[] = {50};
    p.bias_ids = bid;
    p.bias_vals = bval;
    p.n_bias = 1;
    p.logprobs = 1;
    p.top_logprobs = 7;
    p.seed = 8;
    p.has_seed = 1;
    const int32_t prompt[] = {10, 11};
    mk_sampler *s = make(&p, V, NULL, 0, prompt, 2);
    mk_sample_out o;
    for (int t = 0; t < 5; t++) {
        sample_once(s, l, V, &o);
        cr_assert_eq(o.token, 3, "the +50 bias should win");
        cr_assert(fabs(o.logprob - (l[3] - lse)) < 1e-5, "logprob %g want %g", (double)o.logprob,
                  l[3] - lse);
        cr_assert_eq(o.n_top, 7);
        cr_assert(o.top_ids[0] == 10 && o.top_ids[1] == 20 && o.top_ids[2] == 30, "tie order %d %d %d",
                  o.top_ids[0], o.top_ids[1], o.top_ids[2]);
        for (int j = 0; j < o.n_top; j++) {
            cr_assert(fabs(o.top_logprobs[j] - (l[o.top_ids[j]] - lse)) < 1e-5);
            if (j) cr_assert(o.top_logprobs[j] <= o.top_logprobs[j - 1], "not sorted at %d", j);
            /* nothing outside the list beats its last entry */
        }
        for (int i = 0; i < V; i++) {
            int in = 0;
            for (int j = 0; j < o.n_top; j++) in |= o.top_ids[j] == i;
            if (!in) cr_assert(l[i] <= l[o.top_ids[o.n_top - 1]], "id %d should be in the top", i);
        }
        mk_sampler_accept(s, o.token);
    }
    mk_sampler_free(s);
    /* top_logprobs larger than the vocabulary: all of it; logprobs off: zeros */
    const float l3[3] = {0, 1, 2};
    p.n_bias = 0;
    p.repetition_penalty = 1;
    p.frequency_penalty = 0;
    p.top_logprobs = 5;
    s = make(&p, 3, NULL, 0, NULL, 0);
    sample_once(s, l3, 3, &o);
    cr_assert_eq(o.n_top, 3);
    cr_assert(o.top_ids[0] == 2 && o.top_ids[1] == 1 && o.top_ids[2] == 0);
    mk_sampler_free(s);
    p.logprobs = 0;
    p.top_logprobs = 0;
    s = make(&p, 3, NULL, 0, NULL, 0);
    sample_once(s, l3, 3, &o);
    cr_assert(o.n_top == 0 && o.logprob == 0);
    mk_sampler_free(s);
}

/* ---- stop strings -------------------------------------------------------------------------- */

/* Feeds pieces; returns the concatenated emitted text (static buffer) and whether it stopped. */
static const char *feed_all(mk_stop *m, const char *const *pieces, int n, int *stopped) {
    static char acc[65536];
    size_t al = 0;
    *stopped = 0;
    for (int i = 0; i < n; i++) {
        const char *e;
        size_t el;
        int r = mk_stop_feed(m, pieces[i], strlen(pieces[i]), &e, &el);
        cr_assert(r == 0 || r == 1);
        memcpy(acc + al, e, el);
        al += el;
        if (r == 1) *stopped = 1;
    }
    if (!*stopped) {
        const char *e;
        size_t el;
        mk_stop_flush(m, &e, &el);
        memcpy(acc + al, e, el);
        al += el;
    }
    acc[al] = 0;
    return acc;
}

static mk_stop *stop_make(const char *const *stops, int n, int include) {
    mk_stop *m = NULL;
    mk_err err = {0};
    cr_assert_eq(mk_stop_create(stops, n, include, &m, &err), MK_OK, "%s", err.msg);
    return m;
}

Test(stop, holds_back_only_possible_prefixes) {
    const char *stops[] = {"###"};
    mk_stop *m = stop_make(stops, 1, 0);
    const char *e;
    size_t el;
    cr_assert_eq(mk_stop_feed(m, "a#", 2, &e, &el), 0);
    cr_assert(el == 1 && !memcmp(e, "a", 1));
    cr_assert_eq(mk_stop_feed(m, "#", 1, &e, &el), 0);
    cr_assert_eq(el, 0);
    cr_assert_eq(mk_stop_feed(m, "b", 1, &e, &el), 0);
    cr_assert(el == 3 && !memcmp(e, "##b", 3), "got %.*s", (int)el, e);
    cr_assert_eq(mk_stop_feed(m, "xyz", 3, &e, &el), 0);
    cr_assert(el == 3, "text that cannot start a stop string is not delayed");
    cr_assert_eq(mk_stop_matched(m), -1);
    mk_stop_free(m);
}

Test(stop, split_across_pieces) {
    const char *stops[] = {"END"};
    const char *pieces[] = {"hello E", "N", "D more", "after"};
    int st;
    mk_stop *m = stop_make(stops, 1, 0);
    cr_assert_str_eq(feed_all(m, pieces, 4, &st), "hello ");
    cr_assert(st);
    cr_assert_eq(mk_stop_matched(m), 0);
    const char *e;
    size_t el;
    cr_assert_eq(mk_stop_feed(m, "x", 1, &e, &el), 1, "stays stopped");
    cr_assert_eq(el, 0);
    mk_stop_free(m);
    m = stop_make(stops, 1, 1); /* include_stop_str_in_output */
    cr_assert_str_eq(feed_all(m, pieces, 4, &st), "hello END");
    mk_stop_free(m);
    /* a prefix that fails: held text comes back */
    const char *p2[] = {"sE", "Nd", "!"};
    m = stop_make(stops, 1, 0);
    cr_assert_str_eq(feed_all(m, p2, 3, &st), "sENd!");
    cr_assert(!st);
    mk_stop_free(m);
}

Test(stop, overlapping_prefixes_and_several_strings) {
    int st;
    const char *s1[] = {"aab"};
    const char *p1[] = {"xa", "a", "a", "ab", "zz"}; /* "xaaaab": match at 3 */
    mk_stop *m = stop_make(s1, 1, 0);
    cr_assert_str_eq(feed_all(m, p1, 5, &st), "xaa");
    cr_assert(st);
    mk_stop_free(m);
    /* two strings in one piece: the earliest start wins */
    const char *s2[] = {"bc", "ab"};
    const char *p2[] = {"xabc"};
    m = stop_make(s2, 2, 0);
    cr_assert_str_eq(feed_all(m, p2, 1, &st), "x");
    cr_assert_eq(mk_stop_matched(m), 1);
    mk_stop_free(m);
    /* a long stop string partially matched while a short one completes inside it */
    const char *s3[] = {"abcd", "bc"};
    const char *p3[] = {"ab", "c", "d"};
    m = stop_make(s3, 2, 1);
    cr_assert_str_eq(feed_all(m, p3, 3, &st), "abc");
    cr_assert_eq(mk_stop_matched(m), 1);
    mk_stop_free(m);
    /* no stop strings: pass-through */
    const char *p4[] = {"a", "bc", ""};
    m = stop_make(NULL, 0, 0);
    cr_assert_str_eq(feed_all(m, p4, 3, &st), "abc");
    mk_stop_free(m);
}

Test(stop, multibyte_utf8) {
    int st;
    const char *stops[] = {"世界"}; /* e4 b8 96 e7 95 8c */
    const char *p1[] = {"你好世", "界!"};
    mk_stop *m = stop_make(stops, 1, 0);
    cr_assert_str_eq(feed_all(m, p1, 2, &st), "你好");
    cr_assert(st);
    mk_stop_free(m);
    /* pieces that split characters (a byte-level detokenizer) */
    const char *p2[] = {"你好\xe4\xb8", "\x96\xe7", "\x95\x8c", "tail"};
    m = stop_make(stops, 1, 0);
    cr_assert_str_eq(feed_all(m, p2, 4, &st), "你好");
    mk_stop_free(m);
    /* the first character alone, then something else: everything comes back */
    const char *p3[] = {"世", "x世"};
    m = stop_make(stops, 1, 0);
    const char *e;
    size_t el;
    cr_assert_eq(mk_stop_feed(m, p3[0], strlen(p3[0]), &e, &el), 0);
    cr_assert_eq(el, 0, "a possible prefix is held");
    cr_assert_eq(mk_stop_feed(m, p3[1], strlen(p3[1]), &e, &el), 0);
    cr_assert(el == 4 && !memcmp(e, "世x", 4), "emits whole characters only");
    mk_stop_flush(m, &e, &el);
    cr_assert(el == 3 && !memcmp(e, "世", 3));
    mk_stop_free(m);
}

Test(stop, long_piece_grows_buffer) {
    const char *stops[] = {"STOP"};
    static char big[5001];
    memset(big, 'q', 5000);
    memcpy(big + 4000, "STOP", 4);
    const char *pieces[] = {"S", big};
    int st;
    mk_stop *m = stop_make(stops, 1, 0);
    const char *out = feed_all(m, pieces, 2, &st);
    cr_assert(st);
    cr_assert_eq(strlen(out), 4001, "got %zu bytes", strlen(out));
    mk_stop_free(m);
}

/* Random text over {a,b,c}, random piece boundaries: the emitted text equals the text up to the
 * earliest stop-string match, whatever the chunking. */
Test(stop, random_chunking_matches_reference) {
    const char *stops[] = {"abc", "bca", "cc", "abab"};
    char text[64], piece_buf[64][64];
    const char *pieces[64];
    for (int trial = 0; trial < 2000; trial++) {
        int len = 1 + (int)(mk_philox_uniform(55, (uint64_t)trial, 0) * 40);
        for (int i = 0; i < len; i++) text[i] = "abc"[(int)(mk_philox_uniform(56, (uint64_t)trial, (uint32_t)i) * 3)];
        text[len] = 0;
        /* reference: earliest start, first in list order */
        int best = len, which = -1;
        for (int i = 0; i < 4; i++) {
            const char *f = strstr(text, stops[i]);
            if (f && f - text < best) best = (int)(f - text), which = i;
        }
        int np = 0;
        for (int at = 0; at < len;) {
            int pl = 1 + (int)(mk_philox_uniform(57, (uint64_t)trial, (uint32_t)np) * 5);
            if (pl > len - at) pl = len - at;
            memcpy(piece_buf[np], text + at, (size_t)pl);
            piece_buf[np][pl] = 0;
            pieces[np] = piece_buf[np];
            np++;
            at += pl;
        }
        for (int inc = 0; inc < 2; inc++) {
            mk_stop *m = stop_make(stops, 4, inc);
            int st;
            const char *got = feed_all(m, pieces, np, &st);
            char want[64];
            int wl = which < 0 ? len : best + (inc ? (int)strlen(stops[which]) : 0);
            memcpy(want, text, (size_t)wl);
            want[wl] = 0;
            cr_assert_str_eq(got, want, "trial %d text %s include %d", trial, text, inc);
            cr_assert_eq(st, which >= 0);
            cr_assert_eq(mk_stop_matched(m), which);
            mk_stop_free(m);
        }
    }
}

Test(stop, rejects_empty_string) {
    const char *stops[] = {"ok", ""};
    mk_stop *m = NULL;
    mk_err err = {0};
    cr_assert_eq(mk_stop_create(stops, 2, 0, &m, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "stop string 1"), "%s", err.msg);
    cr_assert_null(m);
}

/* ---- generation_config.json ---------------------------------------------------------------- */

static char g_dir[64];

static void write_gc(const char *json) {
    if (!g_dir[0]) {
        strcpy(g_dir, "/tmp/mk_gcXXXXXX");
        cr_assert_not_null(mkdtemp(g_dir));
    }
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
}

static void rm_gc(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/generation_config.json", g_dir);
    unlink(path);
    rmdir(g_dir);
}

Test(genconfig, reads_known_keys) {
    write_gc("{\"_from_model_config\": true, \"bos_token_id\": 0, \"eos_token_id\": 1,\n"
             " \"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.95, \"top_k\": 20,\n"
             " \"min_p\": 0.05, \"repetition_penalty\": 1.1, \"max_new_tokens\": 100}");
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    int32_t eos[4];
    int n = 0;
    mk_err err = {0};
    cr_assert_eq(mk_generation_config_load(g_dir, &p, eos, &n, 4, &err), MK_OK, "%s", err.msg);
    cr_assert_float_eq(p.temperature, 0.6f, 1e-7);
    cr_assert_float_eq(p.top_p, 0.95f, 1e-7);
    cr_assert_eq(p.top_k, 20);
    cr_assert_float_eq(p.min_p, 0.05f, 1e-7);
    cr_assert_float_eq(p.repetition_penalty, 1.1f, 1e-7);
    cr_assert(n == 1 && eos[0] == 1);
    cr_assert_eq(mk_sampling_validate(&p, 100, &err), MK_OK);
    /* do_sample false -> greedy; an EOS list; absent keys keep their values; null ignored */
    write_gc("{\"do_sample\": false, \"temperature\": 0.7, \"eos_token_id\": [7, 3, 9], \"top_p\": null}");
    cr_assert_eq(mk_generation_config_load(g_dir, &p, eos, &n, 4, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(p.temperature, 0.0f);
    cr_assert_float_eq(p.top_p, 0.95f, 1e-7);
    cr_assert(n == 3 && eos[0] == 7 && eos[1] == 3 && eos[2] == 9);
    rm_gc();
}

Test(genconfig, absent_file_changes_nothing) {
    mk_sampling_params p, q;
    mk_sampling_defaults(&p);
    q = p;
    int32_t eos[2] = {5, 5};
    int n = 42;
    mk_err err = {0};
    cr_assert_eq(mk_generation_config_load("/nonexistent-minke-dir", &p, eos, &n, 2, &err), MK_OK);
    cr_assert(!memcmp(&p, &q, sizeof p) && n == 42 && eos[0] == 5);
}

Test(genconfig, errors_name_file_and_key) {
    struct { const char *json; int status; const char *needle; } cases[] = {
        {"{\"temperature\": \"hot\"}", MK_EFORMAT, "temperature must be a number"},
        {"{\"temperature\": -1}", MK_EFORMAT, "temperature must be a finite number >= 0"},
        {"{\"top_p\": 0}", MK_EFORMAT, "top_p must be in (0, 1]"},
        {"{\"top_k\": 2.5}", MK_EFORMAT, "top_k must be an integer"},
        {"{\"min_p\": 1.5}", MK_EFORMAT, "min_p"},
        {"{\"repetition_penalty\": 0}", MK_EFORMAT, "repetition_penalty"},
        {"{\"do_sample\": 1}", MK_EFORMAT, "do_sample"},
        {"{\"eos_token_id\": \"</s>\"}", MK_EFORMAT, "eos_token_id"},
        {"{\"eos_token_id\": [1, -2]}", MK_EFORMAT, "eos_token_id[1]"},
        {"{\"eos_token_id\": [1, 2, 3]}", MK_ERANGE, "room for 2"},
        {"[1, 2]", MK_EFORMAT, "object"},
        {"{\"temperature\": 0.5,", MK_EFORMAT, "line 1"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        write_gc(cases[c].json);
        mk_sampling_params p, q;
        mk_sampling_defaults(&p);
        q = p;
        int32_t eos[2];
        int n = 0;
        mk_err err = {0};
        int rc = mk_generation_config_load(g_dir, &p, eos, &n, 2, &err);
        cr_assert_eq(rc, cases[c].status, "%s: rc %d", cases[c].json, rc);
        cr_assert(strstr(err.msg, cases[c].needle), "%s: message '%s'", cases[c].json, err.msg);
        cr_assert(strstr(err.msg, "generation_config.json"), "message names the file: %s", err.msg);
        cr_assert(!memcmp(&p, &q, sizeof p), "%s: params changed on error", cases[c].json);
    }
    rm_gc();
}

/* ---- validation ---------------------------------------------------------------------------- */

/* One invalid field per case; the message must name the field, the range and the value. */
static const char *invalid_case(int c, mk_sampling_params *p) {
    static const int32_t bad_id[] = {100};
    static const int32_t ok_id[] = {3};
    static const float big[] = {150};
    static const float one[] = {1};
    switch (c) {
    case 0: p->temperature = -0.5f; return "temperature must be a finite number >= 0, got -0.5";
    case 1: p->temperature = NAN; return "temperature must be a finite number >= 0, got nan";
    case 2: p->top_p = 0; return "top_p must be in (0, 1], got 0";
    case 3: p->top_p = 1.5f; return "top_p must be in (0, 1], got 1.5";
    case 4: p->top_k = -2; return "top_k must be -1 or 0 (off) or >= 1, got -2";
    case 5: p->min_p = -0.1f; return "min_p must be in [0, 1], got -0.1";
    case 6: p->presence_penalty = 2.5f; return "presence_penalty must be in [-2, 2], got 2.5";
    case 7: p->frequency_penalty = -3; return "frequency_penalty must be in [-2, 2], got -3";
    case 8: p->repetition_penalty = 0; return "repetition_penalty must be a finite number > 0, got 0";
    case 9:
        p->bias_ids = bad_id, p->bias_vals = one, p->n_bias = 1;
        return "logit_bias: token id 100 is outside the vocabulary [0, 100)";
    case 10:
        p->bias_ids = ok_id, p->bias_vals = big, p->n_bias = 1;
        return "logit_bias: value for token 3 must be in [-100, 100], got 150";
    case 11: p->min_tokens = -1; return "min_tokens must be >= 0, got -1";
    case 12: p->stop_ids = bad_id, p->n_stop_ids = 1; return "stop_token_ids: token id 100 is outside";
    case 13: p->top_logprobs = 21; return "top_logprobs must be in [0, 20], got 21";
    default: return NULL;
    }
}

Test(sampler, validation_messages) {
    for (int c = 0;; c++) {
        mk_sampling_params p;
        mk_sampling_defaults(&p);
        const char *needle = invalid_case(c, &p);
        if (!needle) break;
        mk_err err = {0};
        cr_assert_eq(mk_sampling_validate(&p, 100, &err), MK_EINVAL, "case %d", c);
        cr_assert(strstr(err.msg, needle), "want '%s', got '%s'", needle, err.msg);
        mk_sampler *s = (mk_sampler *)1;
        cr_assert_eq(mk_sampler_create(&p, 100, NULL, 0, NULL, 0, &s, &err), MK_EINVAL);
        cr_assert_null(s);
    }
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    mk_err err = {0};
    cr_assert_eq(mk_sampling_validate(&p, 100, &err), MK_OK, "defaults are valid");
    p.temperature = 5; /* no upper bound, as in vLLM */
    p.top_k = -1;
    cr_assert_eq(mk_sampling_validate(&p, 100, &err), MK_OK);
    /* create checks the EOS and prompt ids too */
    const int32_t eos[] = {100};
    mk_sampler *s = NULL;
    cr_assert_eq(mk_sampler_create(&p, 100, eos, 1, NULL, 0, &s, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "eos token id 100"), "%s", err.msg);
    const int32_t prompt[] = {1, 2, -5};
    cr_assert_eq(mk_sampler_create(&p, 100, NULL, 0, prompt, 3, &s, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "prompt token -5 at position 2"), "%s", err.msg);
}

/* mk_sampler_plain_draw_ahead (the engine's chained steps): the draw `ahead` steps later equals the
 * plain draw made after that many tokens are accepted, field for field (its uniform moves with the
 * sampler's step counter), and min_tokens' masked stop tokens end the plain draws until enough
 * tokens will have been generated. */
static int same_draw(const mk_sample_draw *a, const mk_sample_draw *b) {
    return a->inv_t == b->inv_t && a->min_p == b->min_p && a->top_p == b->top_p && a->top_k == b->top_k &&
           a->u53 == b->u53 && a->rep == b->rep && a->freq == b->freq && a->pres == b->pres && a->n_adj == b->n_adj &&
           a->adj_off == b->adj_off && a->adj == b->adj;
}

Test(sampler, plain_draw_ahead_equals_the_draw_after_accepting) {
    mk_sampling_params p;
    mk_sampling_defaults(&p);
    p.temperature = 0.8f, p.top_p = 0.9f, p.top_k = 40, p.min_p = 0.02f;
    p.seed = 4242, p.has_seed = 1;
    p.min_tokens = 3;
    const int32_t eos = 7;
    mk_sampler *s = make(&p, 64, &eos, 1, NULL, 0);
    mk_sample_draw d0, d1, d2;
    /* 0 tokens generated: the next 3 steps mask the stop token (not plain), the 4th is plain */
    for (int a = 0; a < 3; a++) cr_assert(!mk_sampler_plain_draw_ahead(s, a, &d0), "ahead %d is plain", a);
    cr_assert(mk_sampler_plain_draw_ahead(s, 3, &d1));
    cr_assert(mk_sampler_plain_draw_ahead(s, 4, &d2));
    cr_assert(!mk_sampler_plain_draw_ahead(s, -1, &d0));
    for (int t = 0; t < 3; t++) mk_sampler_accept(s, 10 + t);
    cr_assert(mk_sampler_plain_draw(s, &d0));
    cr_assert(same_draw(&d0, &d1), "the draw 3 ahead differs from the draw after 3 tokens");
    cr_assert(mk_sampler_plain_draw_ahead(s, 1, &d1));
    mk_sampler_accept(s, 20);
    cr_assert(mk_sampler_plain_draw(s, &d0));
    cr_assert(same_draw(&d0, &d1) && same_draw(&d0, &d2),
              "the draw 1 ahead differs from the draw after 1 token");
    mk_sampler_free(s);
    /* greedy: never a plain draw, ahead or not */
    p.temperature = 0.0f, p.min_tokens = 0;
    s = make(&p, 64, &eos, 1, NULL, 0);
    cr_assert(!mk_sampler_plain_draw_ahead(s, 1, &d0));
    mk_sampler_free(s);
}
