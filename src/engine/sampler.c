/* sampler.c — logits -> token for one request (see sampler.h for the semantics and their order).
 *
 * Memory: one allocation per sampler, carved into the copied parameter arrays and the per-vocab
 * arrays: w (weights of one step), idx (candidate ids for top-k/top-p selection), raw (the raw
 * logits, only when logprobs are asked) and the penalty state (counts, flags, seen; only when a
 * penalty is active). mk_sampler_sample works inside these and allocates nothing.
 *
 * Cost of one step: a few passes over the vocabulary (bias and penalties touch only the listed and
 * seen tokens). top-k and top-p never sort the vocabulary: top-k is a quickselect of the k-th
 * token, top-p a quickselect-like descent that finds the kept prefix by mass in expected linear
 * time; only the last <= 16 candidates of that descent are sorted. The draw walks ids in ascending
 * order, so its result depends on the kept set and the weights, not on how they were found.
 */
#include "engine/sampler.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "engine/philox.h"
#include "num/sample_math.h"

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

#define FLAG_PROMPT 1u /* token occurs in the prompt */
#define FLAG_OUTPUT 2u /* token occurs in the output */

struct mk_sampler {
    int vocab;
    mk_sampling_params p; /* copy; pointer fields aimed at the owned arrays below */
    uint64_t seed;
    uint64_t step;        /* RNG counter: tokens accepted so far */
    int n_generated;
    int want_lp;          /* logprobs or top_logprobs asked */
    int32_t *eos;         /* [n_eos] */
    int n_eos;
    int32_t *bias_ids;    /* [p.n_bias] */
    float *bias_vals;     /* [p.n_bias] */
    int32_t *stop_ids;    /* [p.n_stop_ids] */
    float *w;             /* [vocab] unnormalized kept probabilities of the current step */
    int32_t *idx;         /* [vocab] candidate ids during top-k / top-p */
    float *raw;           /* [vocab] raw logits of the step (NULL unless want_lp) */
    int32_t *counts;      /* [vocab] output occurrences (NULL unless penalties) */
    uint8_t *flags;       /* [vocab] FLAG_PROMPT | FLAG_OUTPUT */
    int32_t *seen;        /* [n_seen] distinct ids with a flag set, in first-seen order */
    int n_seen;
    int bias_dup;         /* a token listed twice in logit_bias (its bias is added twice, in order) */
    void *block;          /* the one allocation all arrays above live in */
};

void mk_sampling_defaults(mk_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
}

/* ---- validation ---------------------------------------------------------------------------- */

static int in_range(float x, float lo, float hi) { return x >= lo && x <= hi; } /* false for NaN */

int mk_sampling_validate(const mk_sampling_params *p, int vocab, mk_err *err) {
    if (vocab <= 0) return mk_fail(err, MK_EINVAL, "sampling: vocabulary size %d", vocab);
    if (!(p->temperature >= 0) || isinf(p->temperature))
        return mk_fail(err, MK_EINVAL, "temperature must be a finite number >= 0, got %g",
                       (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return mk_fail(err, MK_EINVAL, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (p->top_k < -1)
        return mk_fail(err, MK_EINVAL, "top_k must be -1 or 0 (off) or >= 1, got %d", p->top_k);
    if (!in_range(p->min_p, 0, 1))
        return mk_fail(err, MK_EINVAL, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!in_range(p->presence_penalty, -2, 2))
        return mk_fail(err, MK_EINVAL, "presence_penalty must be in [-2, 2], got %g",
                       (double)p->presence_penalty);
    if (!in_range(p->frequency_penalty, -2, 2))
        return mk_fail(err, MK_EINVAL, "frequency_penalty must be in [-2, 2], got %g",
                       (double)p->frequency_penalty);
    if (!(p->repetition_penalty > 0) || isinf(p->repetition_penalty))
        return mk_fail(err, MK_EINVAL, "repetition_penalty must be a finite number > 0, got %g",
                       (double)p->repetition_penalty);
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_vals)))
        return mk_fail(err, MK_EINVAL, "logit_bias: %d entries without ids or values", p->n_bias);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= vocab)
            return mk_fail(err, MK_EINVAL,
                           "logit_bias: token id %d is outside the vocabulary [0, %d)",
                           (int)p->bias_ids[i], vocab);
        if (!in_range(p->bias_vals[i], -100, 100))
            return mk_fail(err, MK_EINVAL, "logit_bias: value for token %d must be in [-100, 100], got %g",
                           (int)p->bias_ids[i], (double)p->bias_vals[i]);
    }
    if (p->min_tokens < 0)
        return mk_fail(err, MK_EINVAL, "min_tokens must be >= 0, got %d", p->min_tokens);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids))
        return mk_fail(err, MK_EINVAL, "stop_token_ids: %d entries without ids", p->n_stop_ids);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab)
            return mk_fail(err, MK_EINVAL,
                           "stop_token_ids: token id %d is outside the vocabulary [0, %d)",
                           (int)p->stop_ids[i], vocab);
    if (p->top_logprobs < 0 || p->top_logprobs > MK_SAMPLER_MAX_TOP_LOGPROBS)
        return mk_fail(err, MK_EINVAL, "top_logprobs must be in [0, %d], got %d",
                       MK_SAMPLER_MAX_TOP_LOGPROBS, p->top_logprobs);
    return MK_OK;
}

/* ---- generation_config.json ---------------------------------------------------------------- */

/* A numeric key: 0 absent or null, 1 read into *v, MK_EFORMAT for another type. */
static int gc_num(json_t *root, const char *key, const char *path, double *v, mk_err *err) {
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_number(j))
        return mk_fail(err, MK_EFORMAT, "%s: %s must be a number", path, key);
    *v = json_number_value(j);
    return 1;
}

static int gc_range(const char *path, const char *key, double v, int ok, const char *range,
                    mk_err *err) {
    if (ok) return MK_OK;
    return mk_fail(err, MK_EFORMAT, "%s: %s must be %s, got %g", path, key, range, v);
}

static int gc_parse(json_t *root, const char *path, mk_sampling_params *p, int32_t *eos_ids,
                    int *n_eos, int cap, mk_err *err) {
    if (!json_is_object(root))
        return mk_fail(err, MK_EFORMAT, "%s: top level must be an object", path);
    double v;
    int r;
    /* Parse everything into a copy first, so a failure leaves the caller's parameters intact. */
    mk_sampling_params q = *p;
    if ((r = gc_num(root, "temperature", path, &v, err)) < 0) return r;
    if (r) {
        if ((r = gc_range(path, "temperature", v, v >= 0 && isfinite(v), "a finite number >= 0", err)))
            return r;
        q.temperature = (float)v;
    }
    if ((r = gc_num(root, "top_p", path, &v, err)) < 0) return r;
    if (r) {
        if ((r = gc_range(path, "top_p", v, v > 0 && v <= 1, "in (0, 1]", err))) return r;
        q.top_p = (float)v;
    }
    if ((r = gc_num(root, "min_p", path, &v, err)) < 0) return r;
    if (r) {
        if ((r = gc_range(path, "min_p", v, v >= 0 && v <= 1, "in [0, 1]", err))) return r;
        q.min_p = (float)v;
    }
    if ((r = gc_num(root, "repetition_penalty", path, &v, err)) < 0) return r;
    if (r) {
        if ((r = gc_range(path, "repetition_penalty", v, v > 0 && isfinite(v), "a finite number > 0",
                          err)))
            return r;
        q.repetition_penalty = (float)v;
    }
    json_t *j = json_object_get(root, "top_k");
    if (j && !json_is_null(j)) {
        if (!json_is_integer(j))
            return mk_fail(err, MK_EFORMAT, "%s: top_k must be an integer", path);
        json_int_t k = json_integer_value(j);
        if (k < -1 || k > INT32_MAX)
            return mk_fail(err, MK_EFORMAT, "%s: top_k must be -1, 0 or a positive int32, got %lld",
                           path, (long long)k);
        q.top_k = (int)k;
    }
    /* do_sample=false is Hugging Face's greedy switch; it overrides any temperature */
    j = json_object_get(root, "do_sample");
    if (j && !json_is_null(j)) {
        if (!json_is_boolean(j))
            return mk_fail(err, MK_EFORMAT, "%s: do_sample must be true or false", path);
        if (json_is_false(j)) q.temperature = 0;
    }
    j = json_object_get(root, "eos_token_id");
    int n = -1; /* -1: key absent */
    if (j && !json_is_null(j)) {
        size_t cnt = json_is_array(j) ? json_array_size(j) : 1;
        if (!json_is_array(j) && !json_is_integer(j))
            return mk_fail(err, MK_EFORMAT, "%s: eos_token_id must be an integer or a list of integers",
                           path);
        if (cnt > (size_t)cap)
            return mk_fail(err, MK_ERANGE, "%s: eos_token_id has %zu ids, room for %d", path, cnt,
                           cap);
        for (size_t i = 0; i < cnt; i++) {
            json_t *e = json_is_array(j) ? json_array_get(j, i) : j;
            if (!json_is_integer(e) || json_integer_value(e) < 0 ||
                json_integer_value(e) > INT32_MAX)
                return mk_fail(err, MK_EFORMAT, "%s: eos_token_id[%zu] must be a non-negative int32",
                               path, i);
        }
        for (size_t i = 0; i < cnt; i++)
            eos_ids[i] = (int32_t)json_integer_value(json_is_array(j) ? json_array_get(j, i) : j);
        n = (int)cnt;
    }
    *p = q;
    if (n >= 0) *n_eos = n;
    return MK_OK;
}

int mk_generation_config_load(const char *model_dir, mk_sampling_params *p, int32_t *eos_ids,
                              int *n_eos, int cap, mk_err *err) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/generation_config.json", model_dir) >= sizeof path)
        return mk_fail(err, MK_EINVAL, "generation config: directory name too long");
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return MK_OK; /* optional file */
        return mk_fail(err, MK_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root)
        return mk_fail(err, MK_EFORMAT, "%s: line %d column %d: %s", path, je.line, je.column,
                       je.text);
    int rc = gc_parse(root, path, p, eos_ids, n_eos, cap, err);
    json_decref(root);
    return rc;
}

/* ---- create / free ------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A seed for a request that gave none: OS entropy, else the clock mixed with a process-wide
 * counter (so two samplers created in the same nanosecond still differ). */
static uint64_t fresh_seed(void) {
    static atomic_uint_fast64_t counter;
    uint64_t v;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) == (ssize_t)sizeof v) return v;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return splitmix64(t ^ splitmix64(atomic_fetch_add(&counter, 1)));
}

/* Bump allocator over one block: each array aligned to 64 bytes. */
static size_t carve(size_t *off, size_t bytes) {
    size_t at = (*off + 63) & ~(size_t)63;
    *off = at + bytes;
    return at;
}

int mk_sampler_create(const mk_sampling_params *p, int vocab, const int32_t *eos_ids, int n_eos,
                      const int32_t *prompt, int n_prompt, mk_sampler **out, mk_err *err) {
    *out = NULL;
    int rc = mk_sampling_validate(p, vocab, err);
    if (rc) return rc;
    if (n_eos < 0 || (n_eos > 0 && !eos_ids) || n_prompt < 0 || (n_prompt > 0 && !prompt))
        return mk_fail(err, MK_EINVAL, "sampler: bad eos (%d) or prompt (%d) arrays", n_eos, n_prompt);
    for (int i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || eos_ids[i] >= vocab)
            return mk_fail(err, MK_EINVAL, "sampler: eos token id %d is outside the vocabulary [0, %d)",
                           (int)eos_ids[i], vocab);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= vocab)
            return mk_fail(err, MK_EINVAL, "sampler: prompt token %d at position %d is outside the "
                           "vocabulary [0, %d)", (int)prompt[i], i, vocab);

    int penalties = p->repetition_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                    p->presence_penalty != 0.0f;
    int want_lp = p->logprobs || p->top_logprobs > 0;
    size_t V = (size_t)vocab, off = 0;
    size_t o_eos = carve(&off, sizeof(int32_t) * (size_t)n_eos);
    size_t o_bid = carve(&off, sizeof(int32_t) * (size_t)p->n_bias);
    size_t o_bval = carve(&off, sizeof(float) * (size_t)p->n_bias);
    size_t o_stop = carve(&off, sizeof(int32_t) * (size_t)p->n_stop_ids);
    size_t o_w = carve(&off, sizeof(float) * V);
    size_t o_idx = carve(&off, sizeof(int32_t) * V);
    size_t o_raw = want_lp ? carve(&off, sizeof(float) * V) : 0;
    size_t o_cnt = penalties ? carve(&off, sizeof(int32_t) * V) : 0;
    size_t o_seen = penalties ? carve(&off, sizeof(int32_t) * V) : 0;
    size_t o_flag = penalties ? carve(&off, V) : 0;

    mk_sampler *s = calloc(1, sizeof *s);
    char *b = aligned_alloc(64, (off + 63) & ~(size_t)63);
    if (!s || !b) {
        free(s);
        free(b);
        return mk_fail(err, MK_ENOMEM, "sampler: out of memory (vocab %d)", vocab);
    }
    s->block = b;
    s->vocab = vocab;
    s->p = *p;
    s->want_lp = want_lp;
    s->seed = p->has_seed ? p->seed : fresh_seed();
    s->eos = (int32_t *)(b + o_eos);
    s->n_eos = n_eos;
    s->bias_ids = (int32_t *)(b + o_bid);
    s->bias_vals = (float *)(b + o_bval);
    s->stop_ids = (int32_t *)(b + o_stop);
    if (n_eos) memcpy(s->eos, eos_ids, sizeof(int32_t) * (size_t)n_eos);
    if (p->n_bias) {
        memcpy(s->bias_ids, p->bias_ids, sizeof(int32_t) * (size_t)p->n_bias);
        memcpy(s->bias_vals, p->bias_vals, sizeof(float) * (size_t)p->n_bias);
    }
    if (p->n_stop_ids) memcpy(s->stop_ids, p->stop_ids, sizeof(int32_t) * (size_t)p->n_stop_ids);
    for (int i = 0; i < p->n_bias && !s->bias_dup; i++)
        for (int j = 0; j < i; j++)
            if (s->bias_ids[j] == s->bias_ids[i]) s->bias_dup = 1;
    s->p.bias_ids = s->bias_ids;
    s->p.bias_vals = s->bias_vals;
    s->p.stop_ids = s->stop_ids;
    s->w = (float *)(b + o_w);
    s->idx = (int32_t *)(b + o_idx);
    s->raw = want_lp ? (float *)(b + o_raw) : NULL;
    if (penalties) {
        s->counts = (int32_t *)(b + o_cnt);
        s->seen = (int32_t *)(b + o_seen);
        s->flags = (uint8_t *)(b + o_flag);
        memset(s->counts, 0, sizeof(int32_t) * V);
        memset(s->flags, 0, V);
        /* the prompt matters only to the repetition penalty */
        if (p->repetition_penalty != 1.0f)
            for (int i = 0; i < n_prompt; i++) {
                int32_t t = prompt[i];
                if (!s->flags[t]) s->seen[s->n_seen++] = t;
                s->flags[t] |= FLAG_PROMPT;
            }
    }
    *out = s;
    return MK_OK;
}

void mk_sampler_free(mk_sampler *s) {
    if (!s) return;
    free(s->block);
    free(s);
}

/* ---- ordering and selection ---------------------------------------------------------------- */

/* The candidate order: logit descending, then id ascending. Strict and total (ids are unique). */
static inline int before(const float *l, int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

static inline void swap_i32(int32_t *x, int i, int j) {
    int32_t t = x[i];
    x[i] = x[j];
    x[j] = t;
}

/* Partitions idx[lo, hi) (at least 2 entries) around a median-of-three pivot. Returns the pivot's
 * final position p: idx[lo, p) come before it in candidate order, idx(p, hi) after. */
static int partition(const float *l, int32_t *idx, int lo, int hi) {
    int mid = lo + (hi - lo) / 2, last = hi - 1;
    if (before(l, idx[mid], idx[lo])) swap_i32(idx, mid, lo);
    if (before(l, idx[last], idx[lo])) swap_i32(idx, last, lo);
    if (before(l, idx[mid], idx[last])) swap_i32(idx, mid, last); /* idx[last] = median */
    const int32_t pv = idx[last];
    const float lp = l[pv];
    int store = lo;
    /* branchless (the comparisons are coin flips to a branch predictor): x goes to store, what
     * was there to i, and store advances when x comes before the pivot; idx[lo, store) come before
     * it and idx[store, i] do not, as with a swap taken only for those */
    for (int i = lo; i < last; i++) {
        const int32_t x = idx[i];
        const float lx = l[x];
        const int b = (lx > lp) | ((lx == lp) & (x < pv));
        idx[i] = idx[store];
        idx[store] = x;
        store += b;
    }
    swap_i32(idx, store, last);
    return store;
}

/* Rearranges idx[0, n) so that idx[r] is the r-th in candidate order, earlier ones before it and
 * later ones after it (quickselect). */
static void select_rank(const float *l, int32_t *idx, int n, int r) {
    int lo = 0, hi = n;
    while (hi - lo > 1) {
        int p = partition(l, idx, lo, hi);
        if (p == r) return;
        if (r < p) hi = p;
        else lo = p + 1;
    }
}

static void insertion_sort(const float *l, int32_t *idx, int lo, int hi) {
    for (int i = lo + 1; i < hi; i++) {
        int32_t v = idx[i];
        int j = i;
        while (j > lo && before(l, v, idx[j - 1])) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = v;
    }
}

/* top-p: rearranges idx[0, n) so that its first m entries are exactly the candidates whose mass
 * strictly before them (in candidate order; integer masses, sample_math.h) is < target, and
 * returns m (>= 1 when target > 0). Each partition either drops the pivot and everything after it
 * (the mass before the pivot already reaches target) or keeps everything up to the pivot, so only
 * one side is ever revisited. The masses are exact, so the kept set does not depend on the order
 * they are added in. */
static int top_p_prefix(const float *l, const float *w, int32_t *idx, int n, uint64_t acc, double target) {
    int lo = 0, hi = n; /* acc: the mass of the kept entries idx[0, lo), and of any kept before idx */
    while (hi - lo > 16) {
        int p = partition(l, idx, lo, hi);
        uint64_t mass = 0;
        for (int i = lo; i < p; i++) mass += mk_sample_mass(w[idx[i]]);
        if ((double)(acc + mass) >= target) {
            hi = p;
        } else {
            acc += mass + mk_sample_mass(w[idx[p]]);
            lo = p + 1;
        }
    }
    insertion_sort(l, idx, lo, hi);
    int i = lo;
    for (; i < hi && (double)acc < target; i++) acc += mk_sample_mass(w[idx[i]]);
    return i;
}

#if defined(__SSE4_1__)
/* mk_sample_wbin (sample_math.h: a later bin, a smaller logit) of four weights: the same integer steps. */
static inline __m128i weight_bins4(__m128 w) {
    const __m128i k = _mm_sub_epi32(_mm_set1_epi32(0x3F8), _mm_srli_epi32(_mm_castps_si128(w), 20));
    return _mm_min_epi32(_mm_max_epi32(k, _mm_setzero_si128()), _mm_set1_epi32(MK_SAMPLE_WBINS - 1));
}
#endif

/* top_p: zeroes the weight of every candidate whose mass strictly before it (candidate order, exact
 * integer masses) reaches top_p times their total. The candidates: idx[0, n) when idx holds them
 * (after top_k), else every id of w[0, n) with a weight. The bins' masses (one pass; four partial
 * histograms, so runs of one bin don't wait on each other's stores) settle every candidate but
 * those of the bin b where the running mass reaches the target: the earlier bins' candidates have
 * less than the target before them (kept), the later ones at least the target (dropped). Only bin
 * b's candidates, gathered into scratch, go through the partition descent after the earlier bins'
 * mass: the same set as a descent over all of them. */
static void top_p_cut(const float *l, float *w, const int32_t *idx, int n, int32_t *scratch, double top_p) {
    uint64_t h[4][MK_SAMPLE_WBINS] = {{0}}, z = 0;
    unsigned long long bin[MK_SAMPLE_WBINS];
    int j = 0;
#if defined(__SSE4_1__)
    const __m128 one = _mm_set1_ps(MK_SAMPLE_MASS_ONE);
#endif
    if (idx) {
        for (; j + 4 <= n; j += 4)
            for (int q = 0; q < 4; q++) h[q][mk_sample_wbin(w[idx[j + q]])] += mk_sample_mass(w[idx[j + q]]);
        for (; j < n; j++) h[0][mk_sample_wbin(w[idx[j]])] += mk_sample_mass(w[idx[j]]);
    } else { /* w = 0 adds mass 0 to the last bin */
#if defined(__SSE4_1__)
        for (; j + 4 <= n; j += 4) {
            const __m128 v = _mm_loadu_ps(w + j);
            const __m128i k = weight_bins4(v), m = _mm_cvttps_epi32(_mm_mul_ps(v, one)); /* 2^31 -> 0x80000000 */
            h[0][_mm_cvtsi128_si32(k)] += (uint32_t)_mm_cvtsi128_si32(m);
            h[1][_mm_extract_epi32(k, 1)] += (uint32_t)_mm_extract_epi32(m, 1);
            h[2][_mm_extract_epi32(k, 2)] += (uint32_t)_mm_extract_epi32(m, 2);
            h[3][_mm_extract_epi32(k, 3)] += (uint32_t)_mm_extract_epi32(m, 3);
        }
#endif
        for (; j + 4 <= n; j += 4)
            for (int q = 0; q < 4; q++) h[q][mk_sample_wbin(w[j + q])] += mk_sample_mass(w[j + q]);
        for (; j < n; j++) h[0][mk_sample_wbin(w[j])] += mk_sample_mass(w[j]);
    }
    for (int b = 0; b < MK_SAMPLE_WBINS; b++) z += bin[b] = h[0][b] + h[1][b] + h[2][b] + h[3][b];
    const double target = top_p * (double)z;
    unsigned long long before; /* the mass of the bins before bb */
    const int bb = mk_sample_topp_wbin(bin, target, &before);
    int m = 0; /* bin bb's candidates, gathered at scratch[0, m); the later bins' dropped */
    j = 0;
#if defined(__SSE4_1__)
    if (!idx) { /* w = 0 is in the last bin, after bb (the target is reached where the mass is) */
        const __m128i vbb = _mm_set1_epi32(bb);
        for (; j + 4 <= n; j += 4) {
            const __m128 v = _mm_loadu_ps(w + j);
            const __m128i k = weight_bins4(v);
            _mm_storeu_ps(w + j, _mm_andnot_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(k, vbb)), v));
            int eq = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(k, vbb)));
            for (; eq; eq &= eq - 1) scratch[m++] = j + __builtin_ctz((unsigned)eq);
        }
    }
#endif
    for (; j < n; j++) {
        const int32_t x = idx ? idx[j] : j;
        if (!(w[x] > 0)) continue;
        const int o = mk_sample_wbin(w[x]);
        if (o == bb) scratch[m++] = x;
        else if (o > bb) w[x] = 0;
    }
    const int keep = top_p_prefix(l, w, scratch, m, before, target);
    for (j = keep; j < m; j++) w[scratch[j]] = 0;
}

/* top_k: zeroes the weight of every id (of w[0, V)) after the k-th in candidate order, except those
 * tied with the k-th's logit (kept, as vLLM does), and leaves the survivors in idx[0, n) (any
 * order); returns n. The weights' bins (mk_sample_wbin: a later bin, a smaller logit) are counted in one
 * pass; the bin b holding the k-th settles every other: earlier bins' ids are kept (their logits
 * exceed the k-th's), later ones dropped (below it). Only bin b's ids go through the selection. */
static int top_k_cut(const float *l, float *w, int V, int k, int32_t *idx) {
    int c4[4][MK_SAMPLE_WBINS] = {{0}}, n = 0;
    unsigned long long cnt[MK_SAMPLE_WBINS];
    int i = 0;
#if defined(__SSE4_1__)
    for (; i + 4 <= V; i += 4) {
        const __m128i b = weight_bins4(_mm_loadu_ps(w + i));
        c4[0][_mm_cvtsi128_si32(b)]++;
        c4[1][_mm_extract_epi32(b, 1)]++;
        c4[2][_mm_extract_epi32(b, 2)]++;
        c4[3][_mm_extract_epi32(b, 3)]++;
    }
#endif
    for (; i < V; i++) c4[0][mk_sample_wbin(w[i])]++;
    /* w = 0 lands in the last bin, which no kept weight reaches (2^-31 is bin 248) */
    for (int b = 0; b < MK_SAMPLE_WBINS; b++) cnt[b] = c4[0][b] + c4[1][b] + c4[2][b] + c4[3][b];
    cnt[MK_SAMPLE_WBINS - 1] = 0;
    for (int b = 0; b < MK_SAMPLE_WBINS; b++) n += (int)cnt[b];
    if (n <= k) { /* nothing to cut */
        n = 0;
        for (i = 0; i < V; i++)
            if (w[i] > 0) idx[n++] = i;
        return n;
    }
    unsigned long long bk; /* ids in the bins before bb: fewer than k */
    const int bb = mk_sample_topk_wbin(cnt, (unsigned long long)k, &bk), before = (int)bk;
    int a = 0, c = before; /* earlier bins' ids at idx[0, before), bin bb's at idx[before, ...) */
    i = 0;
#if defined(__SSE4_1__)
    const __m128i vbb = _mm_set1_epi32(bb);
    for (; i + 4 <= V; i += 4) {
        const __m128 v = _mm_loadu_ps(w + i);
        const __m128i b = weight_bins4(v);
        const __m128i later = _mm_cmpgt_epi32(b, vbb), earlier = _mm_cmpgt_epi32(vbb, b);
        _mm_storeu_ps(w + i, _mm_andnot_ps(_mm_castsi128_ps(later), v));
        if (_mm_movemask_ps(_mm_castsi128_ps(later)) == 15) continue;
        int e = _mm_movemask_ps(_mm_castsi128_ps(earlier));
        int q = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(b, vbb)));
        for (; e; e &= e - 1) idx[a++] = i + __builtin_ctz((unsigned)e);
        for (; q; q &= q - 1) idx[c++] = i + __builtin_ctz((unsigned)q);
    }
#endif
    for (; i < V; i++) {
        if (!(w[i] > 0)) continue;
        const int b = mk_sample_wbin(w[i]);
        if (b < bb) idx[a++] = i;
        else if (b == bb) idx[c++] = i;
        else w[i] = 0;
    }
    select_rank(l, idx + before, c - before, k - 1 - before);
    const float thr = l[idx[k - 1]];
    int m = k;
    for (int j = k; j < c; j++) {
        if (l[idx[j]] < thr) w[idx[j]] = 0;
        else idx[m++] = idx[j]; /* tied with the k-th: kept, as vLLM does */
    }
    return m;
}

/* ---- one step ------------------------------------------------------------------------------ */

/* 1 / the temperature, 0.01 at least (vLLM's floor): what the weights divide by. */
static float inv_temperature(const mk_sampling_params *p) { return 1.0f / fmaxf(p->temperature, 0.01f); }

/* Whether the step `ahead` tokens after the next one (0: the next) leaves the logits as the model
 * made them before the temperature: no logprobs to report, no bias, no penalties, no stop token
 * masked by min_tokens (process() masks them while fewer than min_tokens were generated). Then the
 * model may pick the token itself (plain greedy / plain draw). */
static int unprocessed_at(const mk_sampler *s, int ahead) {
    const mk_sampling_params *p = &s->p;
    if (s->want_lp || p->n_bias || s->counts) return 0;
    return !(s->n_generated + ahead < p->min_tokens && (s->n_eos > 0 || p->n_stop_ids > 0));
}

static int unprocessed(const mk_sampler *s) { return unprocessed_at(s, 0); }

/* The first id of the largest of the (sanitized: no NaN) logits l, -1 when all are -inf: what a scan
 * keeping the strictly larger value finds (the lowest id wins ties, -0 and +0 tie). Two passes with
 * SSE4.1: the maximum's value, then the first id holding a value equal to it. */
static int32_t argmax_first(const float *l, int V) {
    int i = 0;
    float mx = -INFINITY;
#if defined(__SSE4_1__)
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0;
    for (; i + 8 <= V; i += 8) {
        m0 = _mm_max_ps(m0, _mm_loadu_ps(l + i));
        m1 = _mm_max_ps(m1, _mm_loadu_ps(l + i + 4));
    }
    float t[4];
    _mm_storeu_ps(t, _mm_max_ps(m0, m1));
    for (int j = 0; j < 4; j++) mx = t[j] > mx ? t[j] : mx;
#endif
    for (; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    if (mx == -INFINITY) return -1;
    i = 0;
#if defined(__SSE4_1__)
    const __m128 vm = _mm_set1_ps(mx);
    for (; i + 4 <= V; i += 4) {
        const int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(l + i), vm));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; i < V; i++)
        if (l[i] == mx) return i;
    return -1; /* not reached: mx is one of them */
}

/* Steps 1-7 of sampler.h on the (sanitized) logits l. Greedy: *greedy = the argmax. Otherwise
 * *greedy = -1 and s->w holds the kept tokens' unnormalized probabilities (0 elsewhere). */
static int process(mk_sampler *s, float *l, int32_t *greedy, mk_err *err) {
    const mk_sampling_params *p = &s->p;
    const int V = s->vocab;
    for (int i = 0; i < p->n_bias; i++) l[s->bias_ids[i]] += s->bias_vals[i];
    if (s->n_generated < p->min_tokens) {
        for (int i = 0; i < s->n_eos; i++) l[s->eos[i]] = -INFINITY;
        for (int i = 0; i < p->n_stop_ids; i++) l[s->stop_ids[i]] = -INFINITY;
    }
    if (s->counts) /* the arithmetic a model step's GPU adjustment repeats (sample_math.h) */
        for (int j = 0; j < s->n_seen; j++) {
            const int32_t t = s->seen[j];
            const mk_sample_adj a = {t, MK_ADJ_SEEN, 0.0f, s->counts[t]};
            l[t] = mk_sample_adjust(l[t], &a, p->repetition_penalty, p->frequency_penalty, p->presence_penalty);
        }
    const int32_t am = argmax_first(l, V);
    if (am < 0) return mk_fail(err, MK_ERANGE, "sampler: every token is masked (all logits -inf)");
    const float mx = l[am];
    if (p->temperature < MK_SAMPLER_GREEDY_EPS) {
        *greedy = am;
        return MK_OK;
    }
    *greedy = -1;
    const float inv_t = inv_temperature(p);
    float *w = s->w;
    /* w = exp((l - max) / T): the softmax numerator, 1 at the max, 0 for -inf and below 2^-31
     * (sample_math.h: the arithmetic a GPU draw reproduces) */
    mk_sample_weights(l, w, V, mx, inv_t);
    if (p->min_p > 0) { /* p_i >= min_p * p_max  <=>  w_i >= min_p, since w_max = 1 */
        int i = 0;
#if defined(__SSE4_1__)
        const __m128 mp = _mm_set1_ps(p->min_p);
        for (; i + 4 <= V; i += 4) {
            const __m128 v = _mm_loadu_ps(w + i);
            _mm_storeu_ps(w + i, _mm_andnot_ps(_mm_cmplt_ps(v, mp), v));
        }
#endif
        for (; i < V; i++)
            if (w[i] < p->min_p) w[i] = 0;
    }
    const int use_k = p->top_k > 0 && p->top_k < V, use_p = p->top_p < 1.0f;
    if (!use_k && !use_p) return MK_OK;
    int32_t *idx = s->idx;
    if (!use_k) { /* top_p alone: over every id with a weight, read from w */
        top_p_cut(l, w, NULL, V, idx, (double)p->top_p);
        return MK_OK;
    }
    const int n = top_k_cut(l, w, V, p->top_k, idx);
    if (use_p && n > 1) top_p_cut(l, w, idx, n, idx, (double)p->top_p); /* scratch idx: written behind the reads */
    return MK_OK;
}

/* NaN -> -inf (never chosen), +inf -> FLT_MAX (keeps exp((l - max)/T) finite). */
static void sanitize(float *l, int V) {
    int i = 0;
#if defined(__SSE4_1__)
    const __m128 ninf = _mm_set1_ps(-INFINITY), pinf = _mm_set1_ps(INFINITY), big = _mm_set1_ps(FLT_MAX);
    for (; i + 4 <= V; i += 4) {
        __m128 x = _mm_loadu_ps(l + i);
        x = _mm_blendv_ps(x, ninf, _mm_cmpunord_ps(x, x));
        x = _mm_blendv_ps(x, big, _mm_cmpeq_ps(x, pinf));
        _mm_storeu_ps(l + i, x);
    }
#endif
    for (; i < V; i++) l[i] = mk_sample_sanitize(l[i]);
}

/* The sum of the masses of w[0, n) (exact integers; SSE4.1: four at a time, each mass the
 * truncation of w * 2^31, whose out-of-range result 0x80000000 is the mass of w = 1 exactly). */
static uint64_t mass_sum(const float *w, int n) {
    uint64_t z = 0;
    int i = 0;
#if defined(__SSE4_1__)
    const __m128 one = _mm_set1_ps(MK_SAMPLE_MASS_ONE);
    __m128i a = _mm_setzero_si128(), b = _mm_setzero_si128();
    for (; i + 4 <= n; i += 4) {
        const __m128i m = _mm_cvttps_epi32(_mm_mul_ps(_mm_loadu_ps(w + i), one));
        a = _mm_add_epi64(a, _mm_cvtepu32_epi64(m));
        b = _mm_add_epi64(b, _mm_cvtepu32_epi64(_mm_srli_si128(m, 8)));
    }
    a = _mm_add_epi64(a, b);
    z = (uint64_t)_mm_extract_epi64(a, 0) + (uint64_t)_mm_extract_epi64(a, 1);
#endif
    for (; i < n; i++) z += mk_sample_mass(w[i]);
    return z;
}

/* Inverse CDF in id order over the integer masses: the first kept id whose cumulative mass exceeds
 * t = floor(u53 * z / 2^53), z the total (t < z, so some id does). Exact integers: the same id
 * whatever order a GPU adds them in. The ids are walked in runs of DRAW_RUN, a run's total first. */
#define DRAW_RUN 256
static int32_t draw(const float *w, int V, uint64_t u53) {
    const uint64_t t = mk_sample_target(u53, mass_sum(w, V));
    uint64_t c = 0;
    for (int i0 = 0; i0 < V; i0 += DRAW_RUN) {
        const int n = V - i0 < DRAW_RUN ? V - i0 : DRAW_RUN;
        const uint64_t r = mass_sum(w + i0, n);
        if (c + r <= t) {
            c += r;
            continue;
        }
        for (int i = i0; i < i0 + n; i++) {
            c += mk_sample_mass(w[i]);
            if (c > t) return i;
        }
    }
    for (int i = V - 1; i >= 0; i--) /* not reached (t < z): the last kept id */
        if (w[i] > 0) return i;
    return -1;
}

/* log-sum-exp of the raw logits and the top-n by logit (descending, id ascending). */
static double raw_lse_top(const float *raw, int V, int n, mk_sample_out *out) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmaxf(mx, raw[i]);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += expf(raw[i] - mx);
    const double lse = (double)mx + log(sum);
    int cnt = 0;
    for (int i = 0; i < V && n > 0; i++) {
        float x = raw[i];
        /* ids arrive ascending, so an equal logit never displaces an earlier id */
        if (cnt == n && !(x > out->top_logprobs[cnt - 1])) continue;
        int j = cnt < n ? cnt++ : n - 1;
        while (j > 0 && x > out->top_logprobs[j - 1]) {
            out->top_logprobs[j] = out->top_logprobs[j - 1];
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_logprobs[j] = x;
        out->top_ids[j] = i;
    }
    out->n_top = cnt;
    for (int j = 0; j < cnt; j++) out->top_logprobs[j] = (float)(out->top_logprobs[j] - lse);
    return lse;
}

int mk_sampler_sample(mk_sampler *s, float *logits, mk_sample_out *out, mk_err *err) {
    const int V = s->vocab;
    out->token = -1;
    out->logprob = 0;
    out->n_top = 0;
    sanitize(logits, V);
    double lse = 0;
    if (s->want_lp) {
        memcpy(s->raw, logits, sizeof(float) * (size_t)V);
        lse = raw_lse_top(s->raw, V, s->p.top_logprobs < V ? s->p.top_logprobs : V, out);
    }
    int32_t g;
    int rc = process(s, logits, &g, err);
    if (rc) return rc;
    out->token = g >= 0 ? g : draw(s->w, V, mk_philox_u53(s->seed, s->step, 0));
    if (out->token < 0) return mk_fail(err, MK_EINTERNAL, "sampler: empty candidate set");
    if (s->want_lp) out->logprob = (float)((double)s->raw[out->token] - lse);
    return MK_OK;
}

int mk_sampler_candidates(mk_sampler *s, float *logits, int32_t *ids, float *probs, int *n,
                          mk_err *err) {
    const int V = s->vocab;
    *n = 0;
    sanitize(logits, V);
    int32_t g;
    int rc = process(s, logits, &g, err);
    if (rc) return rc;
    if (g >= 0) {
        ids[0] = g;
        if (probs) probs[0] = 1;
        *n = 1;
        return MK_OK;
    }
    uint64_t z = 0;
    for (int i = 0; i < V; i++) z += mk_sample_mass(s->w[i]);
    for (int i = 0; i < V; i++)
        if (s->w[i] > 0) {
            if (probs) probs[*n] = (float)((double)mk_sample_mass(s->w[i]) / (double)z);
            ids[(*n)++] = i;
        }
    return MK_OK;
}

int mk_sampler_plain_greedy(const mk_sampler *s) {
    return s->p.temperature < MK_SAMPLER_GREEDY_EPS && unprocessed(s);
}

int mk_sampler_plain_draw_ahead(const mk_sampler *s, int ahead, mk_sample_draw *d) {
    const mk_sampling_params *p = &s->p;
    const float inv_t = inv_temperature(p);
    if (ahead < 0 || p->temperature < MK_SAMPLER_GREEDY_EPS || !unprocessed_at(s, ahead) || !(inv_t > 0.0f)) return 0;
    *d = (mk_sample_draw){.inv_t = inv_t, .min_p = p->min_p, .top_p = p->top_p, .top_k = p->top_k,
                          .u53 = mk_philox_u53(s->seed, s->step + (uint64_t)ahead, 0), .rep = 1.0f};
    return 1;
}

int mk_sampler_plain_draw(const mk_sampler *s, mk_sample_draw *d) { return mk_sampler_plain_draw_ahead(s, 0, d); }

/* Whether a processed step may be handed to the model with its adjustments (mk_sampler_model_step):
 * no logprobs (they need the raw logits on the host), a repetition penalty of at least 1 (below 1 it
 * can turn a huge logit into +inf, which the model's kernels would read as FLT_MAX), no token biased
 * twice (its two biases add in order: one entry cannot say that). */
static int model_adjustable(const mk_sampler *s) {
    return !s->want_lp && !(s->counts && s->p.repetition_penalty < 1.0f) && !s->bias_dup;
}

static int cmp_adj(const void *a, const void *b) {
    const mk_sample_adj *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id;
}

int mk_sampler_model_step(const mk_sampler *s, mk_sample_draw *d, mk_sample_adj *adj, int cap) {
    const mk_sampling_params *p = &s->p;
    if (unprocessed(s) || !model_adjustable(s)) return 0;
    int n = 0;
    for (int i = 0; i < p->n_bias; i++) {
        if (n == cap) return 0;
        adj[n++] = (mk_sample_adj){s->bias_ids[i], MK_ADJ_BIAS, s->bias_vals[i], 0};
    }
    if (s->n_generated < p->min_tokens) {
        for (int i = 0; i < s->n_eos + p->n_stop_ids; i++) {
            if (n == cap) return 0;
            adj[n++] = (mk_sample_adj){i < s->n_eos ? s->eos[i] : s->stop_ids[i - s->n_eos], MK_ADJ_MASK, 0, 0};
        }
    }
    /* one entry per token: the few biased and masked ones sorted and merged (a token is biased once,
     * masked maybe twice), then each seen token (listed once) merged into its entry there, found by
     * binary search, or added: no sort of the seen list, which grows with the request */
    qsort(adj, (size_t)n, sizeof *adj, cmp_adj);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && adj[m - 1].id == adj[i].id) {
            mk_sample_adj *a = &adj[m - 1];
            if (adj[i].flags & MK_ADJ_BIAS) a->bias = adj[i].bias;
            a->flags |= adj[i].flags;
        } else {
            adj[m++] = adj[i];
        }
    }
    const int few = m;
    if (s->counts)
        for (int j = 0; j < s->n_seen; j++) {
            const mk_sample_adj key = {s->seen[j], 0, 0, 0};
            mk_sample_adj *a = few ? bsearch(&key, adj, (size_t)few, sizeof *adj, cmp_adj) : NULL;
            if (a) {
                a->flags |= MK_ADJ_SEEN;
                a->count = s->counts[key.id];
            } else {
                if (m == cap) return 0;
                adj[m++] = (mk_sample_adj){key.id, MK_ADJ_SEEN, 0, s->counts[key.id]};
            }
        }
    const float rep = s->counts ? p->repetition_penalty : 1.0f;
    *d = (mk_sample_draw){.inv_t = p->temperature < MK_SAMPLER_GREEDY_EPS ? 0.0f : inv_temperature(p),
                          .min_p = p->min_p, .top_p = p->top_p, .top_k = p->top_k,
                          .u53 = mk_philox_u53(s->seed, s->step, 0), .rep = rep, .freq = p->frequency_penalty,
                          .pres = p->presence_penalty, .n_adj = m, .adj_off = 0, .adj = adj};
    return 1;
}

int mk_sampler_take(const mk_sampler *s, int32_t token, mk_sample_out *out, mk_err *err) {
    out->token = -1;
    out->logprob = 0;
    out->n_top = 0;
    if (!unprocessed(s) && !model_adjustable(s)) /* plain greedy, a plain draw, or a model step */
        return mk_fail(err, MK_EINVAL, "sampler: a token taken for a request whose step the model cannot pick "
                       "(logprobs, a repetition penalty below 1, or a token biased twice)");
    if (token < 0) return mk_fail(err, MK_ERANGE, "sampler: every token is masked (all logits -inf)");
    if (token >= s->vocab)
        return mk_fail(err, MK_EINVAL, "sampler: token %d is outside the vocabulary [0, %d)", (int)token, s->vocab);
    out->token = token;
    return MK_OK;
}

void mk_sampler_accept(mk_sampler *s, int32_t token) {
    s->step++;
    s->n_generated++;
    if (!s->counts || token < 0 || token >= s->vocab) return;
    if (!s->flags[token]) s->seen[s->n_seen++] = token;
    s->flags[token] |= FLAG_OUTPUT;
    s->counts[token]++;
}

int mk_sampler_is_stop_token(const mk_sampler *s, int32_t token) {
    for (int i = 0; i < s->p.n_stop_ids; i++)
        if (s->stop_ids[i] == token) return 1;
    if (s->p.ignore_eos) return 0;
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == token) return 1;
    return 0;
}

int mk_sampler_n_generated(const mk_sampler *s) { return s->n_generated; }
uint64_t mk_sampler_seed(const mk_sampler *s) { return s->seed; }
