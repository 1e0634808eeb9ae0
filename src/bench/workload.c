/* workload.c — the prompts of `minke bench serve` (bench.h).
 *
 * Every prompt starts as token ids drawn from a pool: the distinct ids of a built-in English text
 * as the server's own /tokenize splits it (so no special tokens, no ids outside the vocabulary, and
 * the same code works for any model the server runs). Then:
 *   - completions with token-id prompts: the ids are sent as they are; their count is exact;
 *   - completions with text, and chat: the ids are turned into text by /detokenize and the text is
 *     re-fitted (tokenize, cut or extend, detokenize again) until it tokenizes to the asked length;
 *     the length the server will see (special tokens, chat template) is then asked from /tokenize
 *     with the final prompt, so the expected count is exact in every mode.
 * Workloads:
 *   random            input/output lengths uniform around --random-input-len/--random-output-len
 *                     (--random-range-ratio); outputs pinned with ignore_eos.
 *   prefix-repetition P prefixes of L tokens, each followed by unique suffixes of S tokens, the
 *                     requests shuffled (num_prompts / P per prefix, the remainder spread).
 *   sharegpt          the first human turn of each conversation of a ShareGPT-format file, the
 *                     answer's length as max_tokens (or --sharegpt-output-len); vLLM's filter
 *                     (prompt and answer >= 4 tokens, prompt <= 1024, sum <= 2048); conversations
 *                     taken in a seeded shuffled order.
 *   agentic           sessions after SemiAnalysis AgentX: a shared system prompt, a first user
 *                     message, then each turn resends the whole history plus the previous answer
 *                     and a tool result (sent as a user message: a synthetic tool has no call id);
 *                     exponential think times; a session spawns sub-agents with probability p at
 *                     a seeded turn, whose answers come back in the parent's next tool result.
 * All randomness comes from --seed through mk_bench_rng, one generator per session, so the prompts
 * do not depend on thread timing (the text of answers, fed back in agentic histories, does).
 */
#include "base/status.h"
#include "bench/bench.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Varied everyday English: its tokens are what random prompts are made of. */
static const char pool_text[] =
    "The morning train left the station a few minutes late, and most passengers were reading, "
    "sleeping or looking out at the wet fields. A teacher corrected essays about the history of "
    "bridges; two students argued over a chemistry problem involving copper, oxygen and heat. "
    "Outside, farmers moved cattle toward a barn while a small airplane crossed the grey sky. "
    "In the city, engineers were testing new software for traffic lights, measuring delays at "
    "every crossing and writing careful reports. Meanwhile the museum opened an exhibition of "
    "ancient maps, musical instruments, and photographs of mountains, rivers and distant islands. "
    "Children asked questions: why is the ocean salty, how do birds find their way home, what "
    "makes thunder so loud? Their parents answered patiently, sometimes guessing, often laughing. "
    "Later that evening a chef prepared soup with garlic, onions, tomatoes and fresh bread, while "
    "the radio played an old song about summer, friendship and the long road back to the village. "
    "Numbers such as 42, 1999 and 3.14 appeared in the newspaper next to stories about elections, "
    "football, weather forecasts, markets, science, medicine and the price of coffee.";

void mk_bench_prompt_free(mk_bench_prompt *p) {
    if (!p) return;
    free(p->ids);
    free(p->text);
    free(p->messages);
    memset(p, 0, sizeof *p);
}

void mk_bench_ctx_free(mk_bench_ctx *ctx) {
    free(ctx->pool);
    free(ctx->sys_ids);
    free(ctx->sys_text);
    ctx->pool = ctx->sys_ids = NULL;
    ctx->sys_text = NULL;
}

/* ---- the server's tokenizer ---------------------------------------------------------------- */

/* POST body to url; on 200 returns the parsed response in *out. */
static int post_json(mk_bench_http *h, const char *url, json_t *body, json_t **out, mk_err *err) {
    char *s = json_dumps(body, JSON_COMPACT);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    mk_bench_resp r;
    int rc = mk_bench_http_call(h, url, s, 60, &r, err);
    free(s);
    if (rc) return rc;
    json_error_t je;
    *out = r.status == 200 ? json_loads(r.body, 0, &je) : NULL;
    if (!*out) {
        rc = mk_fail(err, MK_EIO, "%s answered %ld: %.300s", url, r.status, r.body ? r.body : "");
    }
    free(r.body);
    return rc;
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int mk_bench_tokenize(mk_bench_ctx *ctx, mk_bench_http *h, const char *text, int add_special, int32_t **ids, int *n,
                      mk_err *err) {
    json_t *b = json_pack("{s:s, s:s, s:b}", "model", ctx->model, "prompt", text, "add_special_tokens", add_special);
    json_t *r = NULL;
    int rc = post_json(h, ctx->url_tokenize, b, &r, err);
    json_decref(b);
    if (rc) return rc;
    json_t *t = json_object_get(r, "tokens");
    if (!json_is_array(t)) {
        json_decref(r);
        return mk_fail(err, MK_EIO, "%s: the answer has no \"tokens\" array", ctx->url_tokenize);
    }
    int m = (int)json_array_size(t);
    *ids = malloc(sizeof(int32_t) * (size_t)(m ? m : 1));
    if (!*ids) {
        json_decref(r);
        return mk_fail(err, MK_ENOMEM, "out of memory");
    }
    for (int i = 0; i < m; i++) (*ids)[i] = (int32_t)json_integer_value(json_array_get(t, (size_t)i));
    *n = m;
    json_decref(r);
    return MK_OK;
}

int mk_bench_count_chat(mk_bench_ctx *ctx, mk_bench_http *h, const char *messages, int *n, mk_err *err) {
    json_t *msgs = json_loads(messages, 0, NULL);
    if (!msgs) return mk_fail(err, MK_EINTERNAL, "messages are not JSON");
    json_t *b = json_pack("{s:s, s:o, s:b}", "model", ctx->model, "messages", msgs, "add_generation_prompt", 1);
    json_t *r = NULL;
    int rc = post_json(h, ctx->url_tokenize, b, &r, err);
    json_decref(b);
    if (rc) return rc;
    json_t *c = json_object_get(r, "count"), *t = json_object_get(r, "tokens");
    if (json_is_integer(c)) *n = (int)json_integer_value(c);
    else if (json_is_array(t)) *n = (int)json_array_size(t);
    else rc = mk_fail(err, MK_EIO, "%s: the answer has neither \"count\" nor \"tokens\"", ctx->url_tokenize);
    json_decref(r);
    return rc;
}

int mk_bench_detokenize(mk_bench_ctx *ctx, mk_bench_http *h, const int32_t *ids, int n, char **text, mk_err *err) {
    json_t *b = json_pack("{s:s, s:o}", "model", ctx->model, "tokens", ids_json(ids, n));
    json_t *r = NULL;
    int rc = post_json(h, ctx->url_detokenize, b, &r, err);
    json_decref(b);
    if (rc) return rc;
    const char *s = json_string_value(json_object_get(r, "prompt"));
    if (!s) rc = mk_fail(err, MK_EIO, "%s: the answer has no \"prompt\" string", ctx->url_detokenize);
    else if (!(*text = strdup(s))) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    json_decref(r);
    return rc;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

int mk_bench_pool_init(mk_bench_ctx *ctx, mk_bench_http *h, mk_err *err) {
    int32_t *ids;
    int n;
    int rc = mk_bench_tokenize(ctx, h, pool_text, 0, &ids, &n, err);
    if (rc) return mk_err_prefix(err, "building the token pool");
    qsort(ids, (size_t)n, sizeof(int32_t), cmp_i32);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (!m || ids[m - 1] != ids[i]) ids[m++] = ids[i];
    if (m < 16) {
        free(ids);
        return mk_fail(err, MK_EIO, "%s split a %zu-byte text into only %d distinct tokens", ctx->url_tokenize,
                       strlen(pool_text), m);
    }
    ctx->pool = ids;
    ctx->n_pool = m;
    return MK_OK;
}

/* ---- building prompts ---------------------------------------------------------------------- */

static void sample_ids(const mk_bench_ctx *ctx, mk_bench_rng *g, int32_t *ids, int n) {
    for (int i = 0; i < n; i++) ids[i] = ctx->pool[mk_bench_rng_range(g, 0, ctx->n_pool - 1)];
}

/* Text that tokenizes (without special tokens) to n tokens, starting from ids[n] (modified). A few
 * rounds of detokenize / tokenize / cut or extend; the result is the closest found. */
static int fit_text(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_rng *g, int32_t *ids, int n, char **out,
                    mk_err *err) {
    char *best = NULL;
    int best_d = -1;
    int32_t *cur = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!cur) return mk_fail(err, MK_ENOMEM, "out of memory");
    memcpy(cur, ids, sizeof(int32_t) * (size_t)n);
    int rc = MK_OK;
    for (int round = 0; round < 6; round++) {
        char *text;
        int32_t *t;
        int m;
        if ((rc = mk_bench_detokenize(ctx, h, cur, n, &text, err))) break;
        if ((rc = mk_bench_tokenize(ctx, h, text, 0, &t, &m, err))) {
            free(text);
            break;
        }
        int d = abs(m - n);
        if (best_d < 0 || d < best_d) {
            free(best);
            best = text;
            best_d = d;
        } else {
            free(text);
        }
        if (d == 0) {
            free(t);
            break;
        }
        /* keep the re-tokenized ids, cut to n or extended with fresh ones */
        int keep = m < n ? m : n;
        memcpy(cur, t, sizeof(int32_t) * (size_t)keep);
        if (keep < n) sample_ids(ctx, g, cur + keep, n - keep);
        free(t);
    }
    free(cur);
    if (rc) {
        free(best);
        return rc;
    }
    *out = best;
    return MK_OK;
}

static char *user_messages(const char *system, const char *user) {
    json_t *a = json_array();
    if (system) json_array_append_new(a, json_pack("{s:s, s:s}", "role", "system", "content", system));
    json_array_append_new(a, json_pack("{s:s, s:s}", "role", "user", "content", user));
    char *s = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return s;
}

/* Finishes p from a prompt given as ids (token-id mode) or as text (other modes). Takes ownership
 * of neither input. */
static int finish_prompt(mk_bench_ctx *ctx, mk_bench_http *h, const int32_t *ids, int n, const char *text,
                         int max_tokens, mk_bench_prompt *p, mk_err *err) {
    memset(p, 0, sizeof *p);
    p->max_tokens = max_tokens;
    p->expected_prompt = -1;
    if (ctx->cfg->endpoint == MK_BENCH_EP_COMPLETIONS && ctx->cfg->prompt_ids) {
        p->ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        if (!p->ids) return mk_fail(err, MK_ENOMEM, "out of memory");
        memcpy(p->ids, ids, sizeof(int32_t) * (size_t)n);
        p->n_ids = n;
        p->expected_prompt = n;
        return MK_OK;
    }
    if (ctx->cfg->endpoint == MK_BENCH_EP_COMPLETIONS) {
        int32_t *t;
        int m;
        if (!(p->text = strdup(text))) return mk_fail(err, MK_ENOMEM, "out of memory");
        int rc = mk_bench_tokenize(ctx, h, text, 1, &t, &m, err);
        if (rc) return rc;
        free(t);
        p->expected_prompt = m;
        return MK_OK;
    }
    if (!(p->messages = user_messages(NULL, text))) return mk_fail(err, MK_ENOMEM, "out of memory");
    return mk_bench_count_chat(ctx, h, p->messages, &p->expected_prompt, err);
}

static int build_random(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prompt *ps, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    mk_bench_rng g;
    mk_bench_rng_seed(&g, c->seed * 0x9E3779B97F4A7C15ULL + 1);
    for (int i = 0; i < c->num_prompts; i++) {
        int in = mk_bench_len_sample(&g, c->input_len, c->range_ratio);
        int out = mk_bench_len_sample(&g, c->output_len, c->range_ratio);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)in);
        if (!ids) return mk_fail(err, MK_ENOMEM, "out of memory");
        sample_ids(ctx, &g, ids, in);
        char *text = NULL;
        int rc = c->endpoint == MK_BENCH_EP_COMPLETIONS && c->prompt_ids ? 0 : fit_text(ctx, h, &g, ids, in, &text, err);
        if (!rc) rc = finish_prompt(ctx, h, ids, in, text, out, &ps[i], err);
        free(ids);
        free(text);
        if (rc) return rc;
    }
    return MK_OK;
}

static int build_prefix(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prompt *ps, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    int P = c->prefix_num, L = c->prefix_len, S = c->suffix_len, N = c->num_prompts;
    int ids_mode = c->endpoint == MK_BENCH_EP_COMPLETIONS && c->prompt_ids;
    mk_bench_rng g;
    mk_bench_rng_seed(&g, c->seed * 0x9E3779B97F4A7C15ULL + 2);
    int32_t *pre = malloc(sizeof(int32_t) * (size_t)P * (size_t)(L ? L : 1));
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)(L + S + 1));
    char **pre_text = calloc((size_t)P, sizeof(char *));
    int *order = malloc(sizeof(int) * (size_t)N);
    int rc = MK_OK;
    if (!pre || !buf || !pre_text || !order) {
        rc = mk_fail(err, MK_ENOMEM, "out of memory");
        goto done;
    }
    for (int p = 0; p < P; p++) {
        sample_ids(ctx, &g, pre + (size_t)p * L, L);
        if (!ids_mode && L > 0 && (rc = fit_text(ctx, h, &g, pre + (size_t)p * L, L, &pre_text[p], err))) goto done;
    }
    /* request i uses prefix i % P; then a seeded shuffle (Fisher-Yates) mixes them */
    for (int i = 0; i < N; i++) order[i] = i % P;
    for (int i = N - 1; i > 0; i--) {
        int j = (int)mk_bench_rng_range(&g, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < N; i++) {
        int p = order[i];
        int out = mk_bench_len_sample(&g, c->output_len, c->range_ratio);
        memcpy(buf, pre + (size_t)p * L, sizeof(int32_t) * (size_t)L);
        sample_ids(ctx, &g, buf + L, S);
        char *text = NULL;
        if (!ids_mode) {
            char *suf = NULL;
            if ((rc = fit_text(ctx, h, &g, buf + L, S, &suf, err))) goto done;
            size_t a = pre_text[p] ? strlen(pre_text[p]) : 0, b = strlen(suf);
            text = malloc(a + b + 1);
            if (!text) {
                free(suf);
                rc = mk_fail(err, MK_ENOMEM, "out of memory");
                goto done;
            }
            if (a) memcpy(text, pre_text[p], a);
            memcpy(text + a, suf, b + 1);
            free(suf);
        }
        rc = finish_prompt(ctx, h, buf, L + S, text, out, &ps[i], err);
        free(text);
        if (rc) goto done;
    }
done:
    if (pre_text)
        for (int p = 0; p < P; p++) free(pre_text[p]);
    free(pre_text);
    free(pre);
    free(buf);
    free(order);
    return rc;
}

/* The first human turn and the answer after it, from one ShareGPT conversation. */
static int sharegpt_pair(json_t *conv, const char **q, const char **a) {
    json_t *turns = json_object_get(conv, "conversations");
    if (!turns) turns = json_object_get(conv, "conversation");
    if (!json_is_array(turns) || json_array_size(turns) < 2) return 0;
    json_t *t0 = json_array_get(turns, 0), *t1 = json_array_get(turns, 1);
    const char *v0 = json_string_value(json_object_get(t0, "value"));
    const char *v1 = json_string_value(json_object_get(t1, "value"));
    if (!v0) v0 = json_string_value(json_object_get(t0, "content"));
    if (!v1) v1 = json_string_value(json_object_get(t1, "content"));
    if (!v0 || !v1) return 0;
    *q = v0;
    *a = v1;
    return 1;
}

static int build_sharegpt(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prompt *ps, int *n_out, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    if (!c->dataset_path) return mk_fail(err, MK_EINVAL, "--dataset sharegpt needs --dataset-path FILE");
    json_error_t je;
    json_t *root = json_load_file(c->dataset_path, 0, &je);
    if (!root) return mk_fail(err, MK_EIO, "%s:%d:%d: %s", c->dataset_path, je.line, je.column, je.text);
    if (!json_is_array(root)) {
        json_decref(root);
        return mk_fail(err, MK_EFORMAT, "%s: expected a JSON array of conversations", c->dataset_path);
    }
    int total = (int)json_array_size(root), rc = MK_OK, k = 0;
    int *order = malloc(sizeof(int) * (size_t)(total ? total : 1));
    if (!order) {
        json_decref(root);
        return mk_fail(err, MK_ENOMEM, "out of memory");
    }
    mk_bench_rng g;
    mk_bench_rng_seed(&g, c->seed * 0x9E3779B97F4A7C15ULL + 3);
    for (int i = 0; i < total; i++) order[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int j = (int)mk_bench_rng_range(&g, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < total && k < c->num_prompts; i++) {
        const char *q, *a;
        if (!sharegpt_pair(json_array_get(root, (size_t)order[i]), &q, &a)) continue;
        int32_t *qi, *ai;
        int nq, na;
        if ((rc = mk_bench_tokenize(ctx, h, q, 1, &qi, &nq, err))) break;
        if ((rc = mk_bench_tokenize(ctx, h, a, 0, &ai, &na, err))) {
            free(qi);
            break;
        }
        free(ai);
        int out = c->sharegpt_output_len > 0 ? c->sharegpt_output_len : na;
        /* vLLM's filter: drop too short and too long pairs */
        if (nq < 4 || (c->sharegpt_output_len <= 0 && out < 4) || nq > 1024 || nq + out > 2048) {
            free(qi);
            continue;
        }
        rc = finish_prompt(ctx, h, qi, nq, q, out, &ps[k], err);
        free(qi);
        if (rc) break;
        k++;
    }
    free(order);
    json_decref(root);
    if (!rc && k == 0) rc = mk_fail(err, MK_EINVAL, "%s: no usable conversation (need a human turn and an answer)",
                                    c->dataset_path);
    *n_out = k;
    return rc;
}

int mk_bench_build_prompts(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prompt **out, int *n, mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    mk_bench_prompt *ps = calloc((size_t)c->num_prompts, sizeof *ps);
    if (!ps) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc, k = c->num_prompts;
    switch (c->dataset) {
    case MK_BENCH_DS_RANDOM: rc = build_random(ctx, h, ps, err); break;
    case MK_BENCH_DS_PREFIX: rc = build_prefix(ctx, h, ps, err); break;
    case MK_BENCH_DS_SHAREGPT: rc = build_sharegpt(ctx, h, ps, &k, err); break;
    default: rc = mk_fail(err, MK_EINTERNAL, "dataset %d has no prompt list", c->dataset);
    }
    if (rc) {
        for (int i = 0; i < c->num_prompts; i++) mk_bench_prompt_free(&ps[i]);
        free(ps);
        return rc;
    }
    *out = ps;
    *n = k;
    return MK_OK;
}

/* ---- agentic sessions ---------------------------------------------------------------------- */

struct mk_bench_session {
    mk_bench_ctx *ctx;
    mk_bench_rng rng;
    int index, sub;
    int turns, turn;     /* planned turns; turns answered so far */
    int spawn_after;     /* sub-agents start after this turn is answered (-1: never) */
    int32_t *hist;       /* token-id mode: the whole history */
    int n_hist, cap_hist;
    char *text;          /* completions text mode: the whole history */
    json_t *msgs;        /* chat mode: the messages */
    int last_len;        /* prompt tokens of the last turn sent */
    long reused, total;  /* prompt tokens already sent earlier in this session; all prompt tokens */
};

static int ids_mode(const mk_bench_ctx *ctx) {
    return ctx->cfg->endpoint == MK_BENCH_EP_COMPLETIONS && ctx->cfg->prompt_ids;
}

int mk_bench_agentic_init(mk_bench_ctx *ctx, mk_bench_http *h, mk_err *err) {
    int n = ctx->cfg->ag_system_len;
    mk_bench_rng g;
    mk_bench_rng_seed(&g, ctx->cfg->seed * 0x9E3779B97F4A7C15ULL + 4);
    ctx->sys_ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!ctx->sys_ids) return mk_fail(err, MK_ENOMEM, "out of memory");
    sample_ids(ctx, &g, ctx->sys_ids, n);
    ctx->n_sys = n;
    if (ids_mode(ctx) || n == 0) return MK_OK;
    return fit_text(ctx, h, &g, ctx->sys_ids, n, &ctx->sys_text, err);
}

static int hist_add(mk_bench_session *s, const int32_t *ids, int n) {
    if (s->n_hist + n > s->cap_hist) {
        int cap = s->cap_hist ? s->cap_hist : 1024;
        while (cap < s->n_hist + n) cap *= 2;
        int32_t *q = realloc(s->hist, sizeof(int32_t) * (size_t)cap);
        if (!q) return MK_ENOMEM;
        s->hist = q;
        s->cap_hist = cap;
    }
    memcpy(s->hist + s->n_hist, ids, sizeof(int32_t) * (size_t)n);
    s->n_hist += n;
    return MK_OK;
}

static int text_add(mk_bench_session *s, const char *t) {
    size_t a = s->text ? strlen(s->text) : 0, b = strlen(t);
    char *q = realloc(s->text, a + b + 1);
    if (!q) return MK_ENOMEM;
    memcpy(q + a, t, b + 1);
    s->text = q;
    return MK_OK;
}

/* Random text (or ids, in token-id mode) of about n tokens appended to the history; role is the
 * chat role it is sent under. */
static int add_random(mk_bench_session *s, mk_bench_http *h, int n, const char *prefix, const char *role,
                      mk_err *err) {
    mk_bench_ctx *ctx = s->ctx;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!ids) return mk_fail(err, MK_ENOMEM, "out of memory");
    sample_ids(ctx, &s->rng, ids, n);
    int rc = MK_OK;
    if (ids_mode(ctx)) {
        if (hist_add(s, ids, n)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    } else {
        char *t = NULL;
        if (n > 0) rc = fit_text(ctx, h, &s->rng, ids, n, &t, err);
        if (!rc && ctx->cfg->endpoint == MK_BENCH_EP_COMPLETIONS) {
            if ((prefix && text_add(s, prefix)) || (t && text_add(s, t))) rc = mk_fail(err, MK_ENOMEM, "out of memory");
        } else if (!rc) {
            size_t a = prefix ? strlen(prefix) : 0, b = t ? strlen(t) : 0;
            char *c = malloc(a + b + 1);
            if (!c) {
                rc = mk_fail(err, MK_ENOMEM, "out of memory");
            } else {
                memcpy(c, prefix ? prefix : "", a);
                memcpy(c + a, t ? t : "", b + 1);
                json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", role, "content", c));
                free(c);
            }
        }
        free(t);
    }
    free(ids);
    return rc;
}

int mk_bench_session_new(mk_bench_ctx *ctx, mk_bench_http *h, int index, int sub, mk_bench_session **out,
                         mk_err *err) {
    const mk_bench_config *c = ctx->cfg;
    mk_bench_session *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->ctx = ctx;
    s->index = index;
    s->sub = sub;
    mk_bench_rng_seed(&s->rng, (c->seed * 0x9E3779B97F4A7C15ULL + 5) ^ ((unsigned long long)index << 20) ^
                                   (unsigned long long)sub);
    s->turns = mk_bench_len_sample(&s->rng, sub ? c->ag_subagent_turns : c->ag_turns, c->range_ratio);
    s->spawn_after = -1;
    if (!sub && c->ag_subagents > 0 && s->turns >= 2 && mk_bench_rng_uniform(&s->rng) < c->ag_subagent_prob)
        s->spawn_after = (int)mk_bench_rng_range(&s->rng, 0, s->turns - 2);
    int rc = MK_OK;
    if (ids_mode(ctx)) {
        if (hist_add(s, ctx->sys_ids, ctx->n_sys)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    } else if (c->endpoint == MK_BENCH_EP_COMPLETIONS) {
        if (ctx->sys_text && text_add(s, ctx->sys_text)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    } else {
        s->msgs = json_array();
        if (ctx->sys_text)
            json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", "system", "content", ctx->sys_text));
    }
    if (!rc) rc = add_random(s, h, mk_bench_len_sample(&s->rng, c->ag_first_len, c->range_ratio), NULL, "user", err);
    if (rc) {
        mk_bench_session_free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

void mk_bench_session_free(mk_bench_session *s) {
    if (!s) return;
    free(s->hist);
    free(s->text);
    json_decref(s->msgs);
    free(s);
}

int mk_bench_session_next(mk_bench_session *s, mk_bench_http *h, mk_bench_prompt *p, mk_err *err) {
    const mk_bench_config *c = s->ctx->cfg;
    memset(p, 0, sizeof *p);
    if (s->turn >= s->turns) return 1;
    p->max_tokens = mk_bench_len_sample(&s->rng, c->ag_output_len, c->range_ratio);
    int rc = MK_OK;
    if (ids_mode(s->ctx)) {
        p->ids = malloc(sizeof(int32_t) * (size_t)(s->n_hist ? s->n_hist : 1));
        if (!p->ids) return mk_fail(err, MK_ENOMEM, "out of memory");
        memcpy(p->ids, s->hist, sizeof(int32_t) * (size_t)s->n_hist);
        p->n_ids = p->expected_prompt = s->n_hist;
    } else if (c->endpoint == MK_BENCH_EP_COMPLETIONS) {
        int32_t *t;
        if (!(p->text = strdup(s->text ? s->text : ""))) return mk_fail(err, MK_ENOMEM, "out of memory");
        if ((rc = mk_bench_tokenize(s->ctx, h, p->text, 1, &t, &p->expected_prompt, err))) return rc;
        free(t);
    } else {
        if (!(p->messages = json_dumps(s->msgs, JSON_COMPACT))) return mk_fail(err, MK_ENOMEM, "out of memory");
        if ((rc = mk_bench_count_chat(s->ctx, h, p->messages, &p->expected_prompt, err))) return rc;
    }
    /* the context is full: the session ends (its first turn always goes out) */
    if (s->turn > 0 && c->ag_max_context > 0 && p->expected_prompt + p->max_tokens > c->ag_max_context) {
        mk_bench_prompt_free(p);
        return 1;
    }
    if (s->turn > 0) s->reused += s->last_len;
    s->total += p->expected_prompt;
    s->last_len = p->expected_prompt;
    return MK_OK;
}

int mk_bench_session_advance(mk_bench_session *s, mk_bench_http *h, const char *answer, const char *extra,
                             mk_err *err) {
    const mk_bench_config *c = s->ctx->cfg;
    int rc = MK_OK, tool = mk_bench_len_sample(&s->rng, c->ag_tool_len, c->range_ratio);
    s->turn++;
    if (ids_mode(s->ctx)) {
        const char *parts[2] = {answer, extra};
        for (int k = 0; k < 2 && !rc; k++) {
            if (!parts[k] || !*parts[k]) continue;
            int32_t *t;
            int m;
            if ((rc = mk_bench_tokenize(s->ctx, h, parts[k], 0, &t, &m, err))) break;
            if (hist_add(s, t, m)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
            free(t);
        }
        if (!rc) rc = add_random(s, h, tool, NULL, "user", err);
    } else if (c->endpoint == MK_BENCH_EP_COMPLETIONS) {
        if (text_add(s, answer ? answer : "") || (extra && text_add(s, extra)))
            return mk_fail(err, MK_ENOMEM, "out of memory");
        rc = add_random(s, h, tool, NULL, "user", err);
    } else {
        json_array_append_new(s->msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", answer ? answer : ""));
        rc = add_random(s, h, tool, extra, "user", err);
    }
    return rc;
}

int mk_bench_session_spawns(const mk_bench_session *s) {
    return s->spawn_after >= 0 && s->turn == s->spawn_after ? s->ctx->cfg->ag_subagents : 0;
}

double mk_bench_session_think(mk_bench_session *s) {
    return mk_bench_rng_exp(&s->rng, s->ctx->cfg->ag_think_ms / 1000.0);
}

void mk_bench_session_reuse(const mk_bench_session *s, long *reused, long *total) {
    *reused = s->reused;
    *total = s->total;
}
