/* server.h — `minke serve`: the HTTP front of the engine (OpenAI and Anthropic APIs, vLLM extras).
 *
 * The server owns no model state. HTTP threads (libmicrohttpd, one thread per connection) parse
 * and validate each JSON body into a typed request, render the chat and tokenize it (text/chat.h),
 * submit token ids and sampling parameters to the engine (engine/engine.h), read the request's
 * events, detokenize, match stop strings (cancelling the engine request when one matches), split
 * DeepSeek-V4 output into reasoning / content / tool calls, and answer as JSON or server-sent
 * events. A client that goes away cancels its engine requests; nothing a request sends can abort
 * the process. Endpoints, fields and limits: see src/server/http.c and GET /openapi.json.
 *
 * Lifecycle (cmd_serve.c): mk_srv_create, mk_srv_start (binds, prints nothing), on SIGTERM
 * mk_srv_drain (new inference requests get 503), wait for mk_srv_active to reach 0 or a timeout,
 * mk_srv_cancel_all, mk_srv_stop (closes connections, joins threads), mk_srv_free.
 *
 * Where minke differs from vLLM / OpenAI / Anthropic (on purpose, or not yet done):
 *   - no structured output: response_format json_object / json_schema, guided_* are 400s;
 *   - tool_choice required / named (DeepSeek-V4) is forced without a grammar: the server writes
 *     the DSML call structure and the model fills the tool name (required, several tools) and each
 *     required parameter's value (gen.c); optional parameters are never written;
 *   - tool_choice none leaves the tools out of the prompt (vLLM keeps them by default);
 *   - tools with GGUF (ChatML / Llama-3) models are a 400: their templates are rendered in C
 *     without tool support;
 *   - echo with logprobs is a 400 (no prompt logprobs); chat echo and continue_final_message are
 *     400s; best_of, n > 16, more than 64 prompts or choices per request are 400s;
 *   - logprobs list every generated token, the stop token included (its text is "" when special
 *     tokens are skipped), so token texts join to the output text; a token that ends inside a
 *     UTF-8 character shows U+FFFD in its own text;
 *   - a request that times out (--request-timeout) or is cancelled at shutdown ends with
 *     finish_reason "abort" (vLLM's word); Anthropic gets stop_reason "end_turn";
 *   - thinking.budget_tokens is accepted and not enforced (max_tokens bounds the output);
 *   - the OpenAI error `type` is OpenAI's (invalid_request_error, authentication_error, ...), not
 *     vLLM's exception names.
 *
 * Files: http.c (daemon, routing, auth, bodies, streaming, access log), openai.c (chat and
 * completions), anthropic.c (messages), gen.c (engine requests -> text, logprobs, tool calls),
 * split.c (DeepSeek-V4 reasoning / tool-call splitter), misc.c (models, tokenize, health,
 * version), metrics.c (/metrics), openapi.c (/openapi.json), util.c (errors, field tables).
 */
#ifndef MK_SERVER_SERVER_H
#define MK_SERVER_SERVER_H

#include <stddef.h>

#include "engine/engine.h"
#include "text/chat.h"

typedef struct {
    const char *host;              /* address to bind (default "127.0.0.1") */
    int port;                      /* 0 = any free port (mk_srv_port tells which) */
    const char *api_key;           /* NULL = no authentication */
    const char *served_model_name; /* the model's name in the API */
    size_t max_body_bytes;         /* larger bodies get 413 */
    double request_timeout_s;      /* per engine request; 0 = none */
    int max_json_depth;            /* deeper bodies get 400; 0 = 64 */
    int max_model_len;             /* prompt + output tokens per request */
    int quiet;                     /* 1: no access log (tests) */
    int prompt_tokens_details;     /* 1: usage.prompt_tokens_details.cached_tokens (vLLM's
                                    * --enable-prompt-tokens-details) */
} mk_srv_options;

typedef struct mk_srv mk_srv;

/* eng may be NULL (tests, fuzzing: everything up to submitting works). chat and eng are borrowed. */
int mk_srv_create(mk_chat *chat, mk_engine *eng, const mk_srv_options *o, mk_srv **out, mk_err *err);
int mk_srv_start(mk_srv *s, mk_err *err);
int mk_srv_port(const mk_srv *s);
void mk_srv_drain(mk_srv *s);
int mk_srv_active(mk_srv *s);     /* generations in flight */
void mk_srv_cancel_all(mk_srv *s);
void mk_srv_stop(mk_srv *s);
void mk_srv_free(mk_srv *s);

#endif
