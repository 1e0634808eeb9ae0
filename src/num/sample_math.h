/* sample_math.h — the sampler's arithmetic, written once for the host and the GPU.
 *
 * A token drawn on the GPU (a model that samples where its logits are) must be the token the host
 * sampler would draw from the same logits, so every step whose result the draw depends on is
 * defined here with operations both sides compute bit for bit:
 *   - the weight of a token, w = exp((l - max) / T), through mk_sample_exp: IEEE float multiplies
 *     and adds only (no library exp, whose last bit differs between glibc and CUDA; no fused
 *     multiply-add: the device side spells every operation with its round-to-nearest intrinsic, so
 *     nvcc cannot contract them, and the host is built without contraction);
 *   - the mass of a token, an integer: floor(w * 2^31) (w <= 1). Weights below 2^-31 of the top
 *     token's are 0, as if filtered. Masses add exactly in any order, so a parallel sum on the GPU
 *     and a serial one on the host agree; top_p's cut and the draw's inverse CDF use them;
 *   - the draw's target, floor(u * z) for the 53-bit uniform u = u53 / 2^53 and the total mass z,
 *     computed exactly in integers (mk_sample_target).
 * mk_sample_draw carries one request's draw from the sampler (mk_sampler_plain_draw, or
 * mk_sampler_model_step with its per-token adjustments, mk_sample_adjust) through the model's batch
 * (mk_batch_item.draw) to the GPU kernels (mk_cuda_adjust_rows, mk_cuda_sample_rows).
 * Plain C11 for the host; under nvcc the functions are __host__ __device__.
 */
#ifndef MK_ENGINE_SAMPLE_MATH_H
#define MK_ENGINE_SAMPLE_MATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define MK_SM_FN __host__ __device__ static inline
#else
#define MK_SM_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define MK_SM_MUL(a, b) __fmul_rn(a, b)
#define MK_SM_ADD(a, b) __fadd_rn(a, b)
#define MK_SM_SUB(a, b) __fsub_rn(a, b)
#define MK_SM_DIV(a, b) __fdiv_rn(a, b)
#else
#define MK_SM_MUL(a, b) ((a) * (b))
#define MK_SM_ADD(a, b) ((a) + (b))
#define MK_SM_SUB(a, b) ((a) - (b))
#define MK_SM_DIV(a, b) ((a) / (b))
#endif

/* A float's bits and back, on both sides. */
MK_SM_FN uint32_t mk_sm_bits(float v) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(v);
#else
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
#endif
}
MK_SM_FN float mk_sm_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
#endif
}

/* One token's adjustment in a step handed to the model with adjustments (sampler.h:
 * mk_sampler_model_step): what the sampler's processing does to that token's sanitized logit, in
 * its order: logit_bias added (MK_ADJ_BIAS), masked to -inf (MK_ADJ_MASK: a stop token before
 * min_tokens), the penalties of a token seen in the prompt or the output (MK_ADJ_SEEN: repetition,
 * then with count > 0 frequency x count and presence). One entry per token. */
#define MK_ADJ_BIAS 1u
#define MK_ADJ_MASK 2u
#define MK_ADJ_SEEN 4u
typedef struct {
    int32_t id;
    uint32_t flags;
    float bias;
    int32_t count; /* output occurrences */
} mk_sample_adj;

/* At most this many adjusted tokens per row in a step handed to the model (more: the host samples). */
#define MK_SAMPLE_ADJ_MAX 1024

/* One step's draw of a request for the model to pick its token where the logits are: inv_t = 1 /
 * max(temperature, 0.01) as the sampler computes it (> 0; 0: greedy, the argmax, only with
 * adjustments: a plain greedy step has no draw), min_p (0: off), top_p (1: off), top_k (<= 0 or >=
 * vocab: off), and the step's uniform as its 53 bits (mk_philox_u53 of the seed and the step).
 * A plain draw (mk_sampler_plain_draw) has n_adj 0; mk_sampler_model_step's has n_adj adjusted
 * tokens in adj (host memory) with the penalties rep, freq, pres; the model copies them where its
 * kernels read them (adj_off: their place there; the host pointer is not used on the device). */
typedef struct {
    float inv_t, min_p, top_p;
    int top_k;
    uint64_t u53;
    float rep, freq, pres;
    int n_adj;
    int adj_off;
    const mk_sample_adj *adj;
} mk_sample_draw;

/* The logit x (sanitized: no NaN, +inf as FLT_MAX) of the token a describes, adjusted as the
 * sampler adjusts it (sampler.c: process()). With rep >= 1 the result is never NaN or +inf (the
 * sampler hands only such steps to the model), so sanitizing it again leaves it as it is. */
MK_SM_FN float mk_sample_adjust(float x, const mk_sample_adj *a, float rep, float freq, float pres) {
    if (a->flags & MK_ADJ_BIAS) x = MK_SM_ADD(x, a->bias);
    if (a->flags & MK_ADJ_MASK) x = -INFINITY;
    if (a->flags & MK_ADJ_SEEN) {
        if (rep != 1.0f) x = x > 0 ? MK_SM_DIV(x, rep) : MK_SM_MUL(x, rep);
        if (a->count) {
            x = MK_SM_SUB(x, MK_SM_MUL(freq, (float)a->count));
            x = MK_SM_SUB(x, pres);
        }
    }
    return x;
}

#define MK_SAMPLE_MASS_ONE 2147483648.0f /* the mass of weight 1 (the top token): 2^31 */
#define MK_SAMPLE_W_MIN 4.656612873077392578125e-10f /* 2^-31: smaller weights have mass 0 */

/* mk_sample_exp's constants (shared with the four-wide host loop below): log2 e, ln 2 split in a
 * 16-bit head and a tail, 1/7! .. 1/3! */
#define MK_SE_LOG2E 1.44269502162933349609375f
#define MK_SE_LN2_HI 0.693145751953125f
#define MK_SE_LN2_LO 1.428606765330187045e-06f
#define MK_SE_C7 1.98412698e-04f
#define MK_SE_C6 1.38888889e-03f
#define MK_SE_C5 8.33333377e-03f
#define MK_SE_C4 4.16666679e-02f
#define MK_SE_C3 1.66666672e-01f

/* e^x for x <= 0 (0 below -30, where every weight has mass 0 anyway): x = k ln 2 + r with k the
 * nearest integer of x / ln 2 (ln 2 split in a 16-bit head, so k * head is exact, and a tail), e^r
 * by its Taylor polynomial to r^7 (|r| <= 0.35: truncation below 1e-8 relative), times 2^k. About
 * an ulp from the correctly rounded value; what matters here is that both sides get the same bits. */
MK_SM_FN float mk_sample_exp(float x) {
    const int in = x >= -30.0f; /* else 0 (also -inf): selected at the end, so loops vectorize */
    x = in ? x : 0.0f;
    const float kf = floorf(MK_SM_ADD(MK_SM_MUL(x, MK_SE_LOG2E), 0.5f)); /* in [-43, 0] */
    const float r = MK_SM_SUB(MK_SM_SUB(x, MK_SM_MUL(kf, MK_SE_LN2_HI)), MK_SM_MUL(kf, MK_SE_LN2_LO));
    float p = MK_SE_C7;
    p = MK_SM_ADD(MK_SM_MUL(p, r), MK_SE_C6);
    p = MK_SM_ADD(MK_SM_MUL(p, r), MK_SE_C5);
    p = MK_SM_ADD(MK_SM_MUL(p, r), MK_SE_C4);
    p = MK_SM_ADD(MK_SM_MUL(p, r), MK_SE_C3);
    p = MK_SM_ADD(MK_SM_MUL(p, r), 0.5f);
    p = MK_SM_ADD(MK_SM_MUL(p, r), 1.0f);
    p = MK_SM_ADD(MK_SM_MUL(p, r), 1.0f);
    const float two_k = mk_sm_float((uint32_t)(127 + (int)kf) << 23); /* 2^k, a normal float for k >= -43 */
    return in ? MK_SM_MUL(p, two_k) : 0.0f;
}

/* The weight of logit l: exp((l - mx) * inv_t), 0 below 2^-31 (mx: the maximum logit, inv_t: 1 /
 * the temperature). l and mx are sanitized (no NaN, no +inf). */
MK_SM_FN float mk_sample_weight(float l, float mx, float inv_t) {
    const float w = mk_sample_exp(MK_SM_MUL(MK_SM_SUB(l, mx), inv_t));
    return w < MK_SAMPLE_W_MIN ? 0.0f : w;
}

/* The sampler's view of a raw logit (how it sanitizes a row): NaN as -inf, +inf as FLT_MAX. */
MK_SM_FN float mk_sample_sanitize(float v) { return v != v ? -INFINITY : v == INFINITY ? FLT_MAX : v; }

/* The greedy token of raw logits l[0, n) by the sampler's rule: the lowest id of the largest
 * sanitized value, -1 when every value is -inf or NaN. */
MK_SM_FN int32_t mk_sample_argmax(const float *l, int n) {
    int32_t best = -1;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float v = mk_sample_sanitize(l[i]);
        if (v > mx) mx = v, best = i;
    }
    return best;
}

/* w[i] = mk_sample_weight(l[i], mx, inv_t) for i < n, on the host: four at a time with SSE4.1 (the
 * same IEEE operations in the same order: the same bits), the rest one by one. */
#if !defined(__CUDACC__)
#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif
static inline void mk_sample_weights(const float *l, float *w, int n, float mx, float inv_t) {
    int i = 0;
#if defined(__SSE4_1__)
    const __m128 vmx = _mm_set1_ps(mx), vit = _mm_set1_ps(inv_t), lo = _mm_set1_ps(-30.0f);
    const __m128 wmin = _mm_set1_ps(MK_SAMPLE_W_MIN);
    for (; i + 4 <= n; i += 4) {
        __m128 x = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(l + i), vmx), vit);
        const __m128 in = _mm_cmpge_ps(x, lo);
        x = _mm_and_ps(x, in); /* 0 where out of range */
        const __m128 kf = _mm_floor_ps(_mm_add_ps(_mm_mul_ps(x, _mm_set1_ps(MK_SE_LOG2E)), _mm_set1_ps(0.5f)));
        const __m128 r = _mm_sub_ps(_mm_sub_ps(x, _mm_mul_ps(kf, _mm_set1_ps(MK_SE_LN2_HI))),
                                    _mm_mul_ps(kf, _mm_set1_ps(MK_SE_LN2_LO)));
        __m128 p = _mm_set1_ps(MK_SE_C7);
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(MK_SE_C6));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(MK_SE_C5));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(MK_SE_C4));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(MK_SE_C3));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.5f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
        p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(1.0f));
        const __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(kf), _mm_set1_epi32(127)), 23);
        __m128 v = _mm_and_ps(_mm_mul_ps(p, _mm_castsi128_ps(e)), in);
        v = _mm_and_ps(v, _mm_cmpge_ps(v, wmin));
        _mm_storeu_ps(w + i, v);
    }
#endif
    for (; i < n; i++) w[i] = mk_sample_weight(l[i], mx, inv_t);
}
#endif

/* ---- the GPU draw's radix passes (src/ops/cuda/sample.cu), their decisions shared with the host
 * model of the same algorithm in tests/unit/test_sampler.c ---- */

/* Order-preserving key of a sanitized logit (no NaN): a larger logit has a larger key; -0 and +0,
 * equal to the sampler's comparisons, share one. mk_sample_unkey inverts it (-0 comes back +0). */
MK_SM_FN uint32_t mk_sample_key(float v) {
    const uint32_t u = v != 0.0f ? mk_sm_bits(v) : 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
MK_SM_FN float mk_sample_unkey(uint32_t k) {
    return mk_sm_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
/* A candidate's place in the sampler's order (logit descending, id ascending) as one 64-bit key:
 * larger = earlier. */
MK_SM_FN unsigned long long mk_sample_order_key(float v, int id) {
    return (unsigned long long)mk_sample_key(v) << 32 | (uint32_t)~(uint32_t)id;
}

/* top_k's radix select, one pass: hist[256] counts the candidates under the current prefix by
 * their next key byte; the bin holding the k-th largest (k >= 1, at most the candidates counted),
 * with *k_in (the rank left inside that bin). */
MK_SM_FN int mk_sample_topk_bin(const unsigned long long *hist, unsigned long long k, unsigned long long *k_in) {
    unsigned long long c = 0;
    int b = 255;
    for (; b > 0 && c + hist[b] < k; b--) c += hist[b];
    *k_in = k - c;
    return b;
}

/* top_p's radix descent, one pass: hist[256] holds the masses of the candidates under the current
 * prefix by their next order-key byte, above the mass of every candidate before that prefix. The
 * lowest non-empty bin whose first candidate is kept (the mass before it < target), with *above_in
 * (the mass before that bin); -1 when none is (not when the prefix is a kept candidate's). */
MK_SM_FN int mk_sample_topp_bin(const unsigned long long *hist, unsigned long long above, double target,
                                unsigned long long *above_in) {
    unsigned long long s = 0;
    int sb = -1;
    *above_in = above;
    for (int b = 255; b >= 0; b--) {
        if (!hist[b]) continue;
        if (!((double)(above + s) < target)) break;
        sb = b, *above_in = above + s;
        s += hist[b];
    }
    return sb;
}

/* The integer mass of weight w (0 <= w <= 1): floor(w * 2^31), exact (a power-of-two scale). */
MK_SM_FN uint32_t mk_sample_mass(float w) { return (uint32_t)MK_SM_MUL(w, MK_SAMPLE_MASS_ONE); }

/* ---- weight bins: the host sampler's top_k / top_p cuts (sampler.c) and the GPU draw's (tuning
 * sample_bins) first sort the candidates into bins by weight ----
 * The bin of a weight w in [2^-31, 1]: its float bits' top 12 (exponent and 3 mantissa bits), counted
 * down from w = 1's, so bin 0 holds w = 1 and later bins smaller weights, an eighth of an octave each
 * (2^-31 is bin 248; w = 0 is clamped into the last, 255, which no candidate reaches). mk_sample_exp is
 * not monotonic (2861 adjacent floats x in [-30, 0] have e^x one ulp below e^x of the float before),
 * but its bins are: as x grows, mk_sample_wbin(mk_sample_exp(x)) never grows (checked for every float
 * in [-30, 0]; tests/unit/test_sampler.c re-checks every float near each bin's edge). A weight is
 * mk_sample_exp of (l - max) * inv_t, which does not decrease as l grows, so a token in an earlier bin
 * has a larger logit than any token in a later one: the bins cut the candidate order (logit
 * descending) into consecutive runs, and a cut by count (top_k) or by mass (top_p) is settled for
 * every bin but the one where the count or the mass runs out. */
#define MK_SAMPLE_WBINS 256
MK_SM_FN int mk_sample_wbin(float w) {
    const int k = (int)(0x3F8u - (mk_sm_bits(w) >> 20));
    return k < 0 ? 0 : k >= MK_SAMPLE_WBINS ? MK_SAMPLE_WBINS - 1 : k;
}

/* The least mass of a candidate in bin b (its lower edge's, at least 1): a bin with mass m holds at
 * most m / mk_sample_wbin_min_mass(b) candidates (at most 1.125x the count: a bin spans an eighth of
 * an octave). */
MK_SM_FN uint32_t mk_sample_wbin_min_mass(int b) {
    const uint32_t m = mk_sample_mass(mk_sm_float((0x3F8u - (uint32_t)b) << 20)); /* 0 below bin 248's edge, 2^-31 */
    return m ? m : 1u;
}

/* top_k by bins: cnt[MK_SAMPLE_WBINS] counts the candidates by bin (cnt[255] ignored: w = 0), and
 * k (>= 1) is at most their number. The bin holding the k-th candidate (in candidate order), with
 * *before (the candidates in earlier bins: fewer than k). */
MK_SM_FN int mk_sample_topk_wbin(const unsigned long long *cnt, unsigned long long k, unsigned long long *before) {
    int b = 0;
    unsigned long long c = 0;
    while (b < MK_SAMPLE_WBINS - 1 && c + cnt[b] < k) c += cnt[b++];
    *before = c;
    return b;
}

/* top_p by bins: mass[MK_SAMPLE_WBINS] holds the candidates' masses by bin, target (> 0) top_p
 * times their total. The bin where the running mass reaches the target, with *before (the mass of
 * the earlier bins: < target). The earlier bins' candidates are kept (the mass before each is below
 * *before), the later ones' dropped (the mass before each reaches the target); in bin b, those
 * whose mass before them, counting *before, is below the target. */
MK_SM_FN int mk_sample_topp_wbin(const unsigned long long *mass, double target, unsigned long long *before) {
    int b = 0;
    unsigned long long c = 0;
    while (b < MK_SAMPLE_WBINS - 1 && (double)(c + mass[b]) < target) c += mass[b++];
    *before = c;
    return b;
}

/* The GPU draw's bound on the candidates of one bin it gathers into shared memory (tuning
 * sample_bins; more: the radix passes run over the whole row). */
#define MK_SAMPLE_GATHER 2048

/* floor(u53 * z / 2^53) for u53 < 2^53: the draw's target in [0, z) (z > 0), exact: the high
 * 64 bits of the 128-bit product (u53 * 2^11) * z. */
MK_SM_FN uint64_t mk_sample_target(uint64_t u53, uint64_t z) {
    const uint64_t a = u53 << 11;
#if defined(__CUDA_ARCH__)
    return __umul64hi(a, z);
#else
    const uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)z, b1 = z >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (uint32_t)p01 + (uint32_t)p10; /* < 3 * 2^32: no overflow */
    return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
#endif
}

#endif
