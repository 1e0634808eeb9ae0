/* fuzz_request.c — libFuzzer target for `minke serve`'s request side: JSON body -> typed request.
 *
 * The first input byte picks what the rest is fed to; the rest is a request body as a client
 * would send it:
 *   0 POST /v1/chat/completions    (srv_chat_parse: fields, messages, tools, tool_choice, thinking,
 *                                   rendering with DeepSeek-V4's encoder, tokenization, limits)
 *   1 POST /v1/completions         (prompt forms, batches, echo, logprobs)
 *   2 POST /v1/messages            (Anthropic -> OpenAI conversion, tools, thinking)
 *   3 POST /v1/messages/count_tokens
 *   4 POST /tokenize, 5 POST /detokenize (the handlers themselves: they need no engine)
 *   6 the DeepSeek-V4 output splitter: the bytes as generated text, fed in chunks whose sizes come
 *     from the text itself, in thinking mode with tool parsing
 * Every input must end in an accepted request or an error with an HTTP status in [400, 600) and a
 * message; nothing may crash, leak (LeakSanitizer) or trip UBSan. An accepted request must hold
 * what the engine will check: prompt ids in the vocabulary, prompt + max_tokens within the
 * context, min_tokens <= max_tokens. No engine runs here (mk_srv with no engine).
 * Uses the tiny golden DeepSeek-V4 checkpoint's config and the 512-token tokenizer from tests/data
 * (run from the repository root, as `make fuzz` does). Seeds: fuzz/seeds/fuzz_request/.
 */
#include "server/srv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static mk_chat *chat;
static mk_srv *srv;

static void init(void) {
    if (srv) return;
    mk_err err = {0};
    mk_chat_options o = {.model = "tests/data/dsv4/v4-tiny-fp8", .tokenizer = "tests/data/tok512/tokenizer.json",
                         .no_weights = 1, .max_model_len = 512};
    if (mk_chat_load(&o, &chat, &err)) {
        fprintf(stderr, "fuzz_request: %s (run from the repository root)\n", err.msg);
        abort();
    }
    mk_srv_options so = {.served_model_name = "tiny", .max_model_len = 512, .quiet = 1};
    if (mk_srv_create(chat, NULL, &so, &srv, &err)) abort();
}

static void check_err(const srv_err *e) {
    if (e->status < 400 || e->status >= 600 || !e->msg[0]) __builtin_trap();
}

static void check_req(const srv_req *r) {
    if (r->n_prompts < 1 || r->n < 1 || r->max_tokens < 1) __builtin_trap();
    for (int i = 0; i < r->n_prompts; i++) {
        if (r->prompts[i].n < 1 || r->prompts[i].n + r->max_tokens > srv->max_model_len) __builtin_trap();
        for (int k = 0; k < r->prompts[i].n; k++)
            if (r->prompts[i].ids[k] < 0 || r->prompts[i].ids[k] >= srv->vocab) __builtin_trap();
    }
    if (r->sp.min_tokens > r->max_tokens) __builtin_trap();
}

static void split(const uint8_t *d, size_t n) {
    srv_split *s;
    if (srv_split_create(1, 1, &s)) return;
    srv_buf re = {0}, co = {0};
    srv_calls calls = {0};
    size_t i = 0;
    while (i < n) {
        size_t k = 1 + d[i] % 7;
        if (k > n - i) k = n - i;
        srv_split_feed(s, (const char *)d + i, k, &re, &co, &calls);
        i += k;
    }
    srv_split_finish(s, &re, &co, &calls);
    for (int c = 0; c < calls.n; c++)
        if (!calls.v[c].name || !calls.v[c].args) __builtin_trap();
    srv_split_free(s);
    sb_free(&re);
    sb_free(&co);
    srv_calls_free(&calls);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (!size) return 0;
    int which = data[0] % 7;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    if (which == 6) {
        split(data + 1, len);
        return 0;
    }
    srv_err e;
    memset(&e, 0, sizeof e);
    json_t *j = NULL;
    if (srv_parse_body(body, len, 64, &j, &e)) {
        check_err(&e);
        return 0;
    }
    srv_req r;
    memset(&r, 0, sizeof r);
    int rc = 0, n = 0;
    switch (which) {
    case 0: rc = srv_chat_parse(srv, j, &r, &e); break;
    case 1: rc = srv_completion_parse(srv, j, &r, &e); break;
    case 2: rc = srv_messages_parse(srv, j, &r, &e); break;
    case 3: rc = srv_count_tokens_parse(srv, j, &n, &e); break;
    default: {
        srv_http h = {.s = srv, .fd = -1, .method = "POST", .path = which == 4 ? "/tokenize" : "/detokenize"};
        srv_reply rep;
        memset(&rep, 0, sizeof rep);
        rc = which == 4 ? srv_h_tokenize(&h, j, &rep) : srv_h_detokenize(&h, j, &rep);
        if (rc) check_err(&rep.err);
        else if (rep.status != 200 || !rep.json) __builtin_trap();
        json_decref(rep.json);
        json_decref(j);
        return 0;
    }
    }
    if (rc) check_err(&e);
    else if (which <= 2) check_req(&r);
    srv_req_free(&r);
    json_decref(j);
    return 0;
}
