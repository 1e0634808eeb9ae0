/* misc.c — the routes around generation: GET /v1/models[/{id}], POST /tokenize and /detokenize
 * (vLLM's shapes), GET /version.
 *
 *   /tokenize    {prompt, add_special_tokens=true} or {messages, tools, tool_choice,
 *                chat_template_kwargs, reasoning_effort, add_generation_prompt,
 *                add_special_tokens=false} -> {count, max_model_len, tokens, token_strs}
 *                (the messages form renders exactly as /v1/chat/completions does)
 *   /detokenize  {tokens} -> {prompt}
 */
#include "server/srv.h"

#include <stdlib.h>
#include <string.h>

#ifndef MK_GIT_COMMIT
#define MK_GIT_COMMIT "unknown"
#endif

#define NUL SRV_T_NULL

const srv_field srv_tokenize_fields[] = {
    {"model", SRV_T_STR | NUL, 0, 0, 0, "the served model name", NULL},
    {"prompt", SRV_T_STR | NUL, 0, 0, 0, "text to tokenize (or give messages)", NULL},
    {"messages", SRV_T_ARR | NUL, 0, 0, 0, "a conversation, rendered as /v1/chat/completions renders it", NULL},
    {"add_special_tokens", SRV_T_BOOL | NUL, 0, 0, 0, "apply the tokenizer's post-processor (default: true for prompt, false for messages)", NULL},
    {"add_generation_prompt", SRV_T_BOOL | NUL, 0, 0, 0, NULL, NULL},
    {"continue_final_message", SRV_T_BOOL | NUL, 0, 0, 0, "only false is supported", "{\"type\":[\"boolean\",\"null\"],\"enum\":[false,null]}"},
    {"return_token_strs", SRV_T_BOOL | NUL, 0, 0, 0, "also return each token's text", NULL},
    {"tools", SRV_T_ARR | NUL, 0, 0, 0, "function tools (DeepSeek-V4)", NULL},
    {"tool_choice", SRV_T_STR | SRV_T_OBJ | NUL, 0, 0, 0, NULL, NULL},
    {"chat_template_kwargs", SRV_T_OBJ | NUL, 0, 0, 0, "thinking / enable_thinking (DeepSeek-V4)", NULL},
    {"reasoning_effort", SRV_T_STR | NUL, 0, 0, 0, NULL, NULL},
};
const int srv_n_tokenize_fields = (int)(sizeof srv_tokenize_fields / sizeof srv_tokenize_fields[0]);

const srv_field srv_detokenize_fields[] = {
    {"model", SRV_T_STR | NUL, 0, 0, 0, "the served model name", NULL},
    {"tokens", SRV_T_ARR, SRV_F_REQUIRED, 0, 0, NULL,
     "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":\"VOCAB_MAX\"},\"description\":\"token ids\"}"},
};
const int srv_n_detokenize_fields = (int)(sizeof srv_detokenize_fields / sizeof srv_detokenize_fields[0]);

static json_t *model_obj(mk_srv *s) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", s->model_name, "object", "model", "created",
                     (json_int_t)s->created, "owned_by", "minke", "root", mk_chat_model_path(s->chat), "parent",
                     "max_model_len", s->max_model_len);
}

int srv_h_models(const srv_http *h, const char *id, srv_reply *rep) {
    mk_srv *s = h->s;
    if (id) {
        if (strcmp(id, s->model_name)) {
            srv_err e;
            srv_fail(&e, 404, "model", "The model `%s` does not exist (this server serves `%s`).", id, s->model_name);
            e.code = "model_not_found";
            return srv_reply_err(rep, &e);
        }
        rep->status = 200;
        rep->json = model_obj(s);
        return 0;
    }
    rep->status = 200;
    rep->json = json_pack("{s:s, s:[o]}", "object", "list", "data", model_obj(s));
    return 0;
}

int srv_h_tokenize(const srv_http *h, json_t *b, srv_reply *rep) {
    mk_srv *s = h->s;
    srv_err e = {0};
    srv_req r;
    memset(&r, 0, sizeof r);
    r.n = 1;
    json_t *res = NULL;
    if (srv_check_fields(b, srv_tokenize_fields, srv_n_tokenize_fields, NULL, &e) || srv_check_model(s, b, &r, &e)) goto fail;
    const char *prompt = srv_get_str(b, "prompt");
    json_t *msgs = json_object_get(b, "messages");
    if (!prompt == !(msgs && !json_is_null(msgs))) {
        srv_fail(&e, 400, prompt ? "messages" : "prompt", "give exactly one of prompt and messages");
        goto fail;
    }
    int add_special = prompt != NULL;
    srv_get_bool(b, "add_special_tokens", &add_special);
    int32_t *ids = NULL;
    size_t n = 0;
    mk_err err = {0};
    if (prompt) {
        if (mk_tok_encode(mk_chat_tok(s->chat), prompt, strlen(prompt), add_special, &ids, &n, &err)) {
            srv_fail(&e, 400, "prompt", "%s", err.msg);
            goto fail;
        }
    } else {
        if (srv_chat_build_prompt(s, b, &r, &e)) goto fail;
        if (add_special) {
            if (mk_tok_encode(mk_chat_tok(s->chat), r.prompt_text, strlen(r.prompt_text), 1, &ids, &n, &err)) {
                srv_fail(&e, 400, "messages", "%s", err.msg);
                goto fail;
            }
        } else {
            ids = r.prompts[0].ids;
            n = (size_t)r.prompts[0].n;
            r.prompts[0].ids = NULL;
        }
    }
    json_t *toks = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(toks, json_integer(ids[i]));
    res = json_pack("{s:i, s:i, s:o, s:n}", "count", (int)n, "max_model_len", s->max_model_len, "tokens", toks, "token_strs");
    int strs = 0;
    if (srv_get_bool(b, "return_token_strs", &strs) && strs) {
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++) {
            const char *t = mk_tok_id_to_token(mk_chat_tok(s->chat), ids[i]);
            json_array_append_new(a, json_string(t ? t : ""));
        }
        json_object_set_new(res, "token_strs", a);
    }
    free(ids);
    srv_req_free(&r);
    rep->status = 200;
    rep->json = res;
    rep->prompt_tokens = (int)n;
    return 0;
fail:
    srv_req_free(&r);
    return srv_reply_err(rep, &e);
}

int srv_h_detokenize(const srv_http *h, json_t *b, srv_reply *rep) {
    mk_srv *s = h->s;
    srv_err e = {0};
    srv_req r;
    memset(&r, 0, sizeof r);
    if (srv_check_fields(b, srv_detokenize_fields, srv_n_detokenize_fields, NULL, &e) || srv_check_model(s, b, &r, &e)) {
        srv_req_free(&r);
        return srv_reply_err(rep, &e);
    }
    srv_req_free(&r);
    json_t *a = json_object_get(b, "tokens");
    size_t n = json_array_size(a);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return srv_reply_err(rep, (srv_fail(&e, 500, NULL, "out of memory"), &e));
    for (size_t i = 0; i < n; i++) {
        long long v;
        if (!srv_json_int(json_array_get(a, i), &v) || v < 0 || v >= s->vocab) {
            free(ids);
            return srv_reply_err(rep, (srv_fail(&e, 400, "tokens", "tokens[%zu] must be a token id in [0, %d)", i, s->vocab), &e));
        }
        ids[i] = (int32_t)v;
    }
    char *text = NULL;
    size_t tl = 0;
    mk_err err = {0};
    int rc = mk_tok_decode(mk_chat_tok(s->chat), ids, n, 0, &text, &tl, &err);
    free(ids);
    if (rc) return srv_reply_err(rep, (srv_fail(&e, 500, NULL, "%s", err.msg), &e));
    rep->status = 200;
    rep->json = json_pack("{s:s%}", "prompt", text, tl);
    free(text);
    return 0;
}

int srv_h_version(const srv_http *h, srv_reply *rep) {
    (void)h;
    rep->status = 200;
    rep->json = json_pack("{s:s, s:s}", "version", MK_VERSION, "commit", MK_GIT_COMMIT);
    return 0;
}
