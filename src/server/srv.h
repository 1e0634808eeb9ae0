/* srv.h — the server's internal types, shared by its files (server.h has the public API).
 *
 *   mk_srv      the server: borrowed chat + engine, options, the daemon, the registry of running
 *               generations (for shutdown), metrics, the cached OpenAPI document.
 *   srv_req     one validated request, fully typed: prompts as token ids, sampling parameters,
 *               limits, stop strings, output options. Built by the endpoint parsers (openai.c,
 *               anthropic.c) from JSON; nothing after parsing looks at the JSON again.
 *   srv_gen     a request running on the engine: one srv_choice per engine request (n choices
 *               per prompt), each with its detokenizer, stop matcher, DeepSeek-V4 splitter and
 *               accumulated text, tool calls and logprobs (gen.c).
 *   srv_reply   what a handler answers: a JSON body, a text body, or a stream (a producer that
 *               the HTTP layer calls from libmicrohttpd's content reader).
 */
#ifndef MK_SERVER_SRV_H
#define MK_SERVER_SRV_H

#include <pthread.h>
#include <time.h>

#include "engine/stop.h"
#include "server/server.h"
#include "server/split.h"
#include "server/util.h"

#define SRV_MAX_STOPS 64
#define SRV_MAX_N 16        /* n per prompt */
#define SRV_MAX_PROMPTS 64  /* completions batch */
#define SRV_MAX_CHOICES 64  /* prompts x n */

typedef struct srv_metrics srv_metrics;
typedef struct srv_gen srv_gen;

struct mk_srv {
    mk_chat *chat;
    mk_engine *eng;
    mk_srv_options o;
    char model_name[256];
    char api_key[512];
    int has_key;
    char host[256];
    struct MHD_Daemon *d;
    int port;
    int draining;          /* atomic: 1 after mk_srv_drain */
    pthread_mutex_t mu;    /* guards the registry below */
    srv_gen *active;       /* running generations (doubly linked through srv_gen) */
    int n_active;
    srv_metrics *metrics;
    char *openapi;         /* GET /openapi.json body, built once */
    time_t created;
    int vocab, max_model_len;
    int think_begin, think_end; /* ids of "<think>" / "</think>" (-1), kept in the text */
};

typedef enum { SRV_API_CHAT, SRV_API_COMPLETION, SRV_API_MESSAGES } srv_api;
typedef enum { SRV_TC_NONE, SRV_TC_AUTO, SRV_TC_REQUIRED, SRV_TC_NAMED } srv_tool_choice;

typedef struct {
    int32_t *ids;
    int n;
    char *text; /* the prompt as text, for echo (completions) */
} srv_prompt;

/* A forced tool call (tool_choice required / named on DeepSeek-V4): the candidate tools and the
 * parameters the call will carry (the schema's required ones). */
typedef struct {
    char *name;
    int is_string; /* schema type "string" (or none): string="true" in DSML */
} srv_fparam;

typedef struct {
    char *name;
    srv_fparam *params;
    int n_params;
} srv_ftool;

typedef struct {
    srv_api api;
    char *model;                 /* the name answers carry */
    srv_prompt *prompts;
    int n_prompts;
    int n;                       /* choices per prompt */
    int max_tokens;              /* per choice, resolved */
    mk_sampling_params sp;       /* arrays point into the fields below */
    int32_t *bias_ids, *stop_ids;
    float *bias_vals;
    char **stops;
    int n_stops;
    int include_stop_str;
    int skip_special;
    int priority;
    int stream, include_usage, continuous_usage;
    int logprobs;                /* chat: 1 = logprobs; completions: 1 = logprobs asked (top = N) */
    int top_logprobs;            /* alternatives per token */
    int echo;                    /* completions: the prompt text precedes the output */
    int thinking;                /* DeepSeek-V4 thinking mode: split reasoning from content */
    int parse_tools;             /* DeepSeek-V4: parse DSML tool calls */
    srv_tool_choice tool_choice;
    srv_ftool *ftools;           /* forced call: candidates (named: one); NULL otherwise */
    int n_ftools;
    char *prompt_text;           /* the rendered prompt (a forced call re-prompts with it) */
    char *cache_salt;            /* prefix-cache tenant key (vLLM's cache_salt), or NULL */
} srv_req;

void srv_req_free(srv_req *r);

/* ---- generation (gen.c) ------------------------------------------------------------------------ */

typedef struct {
    int index;          /* in the response's choices */
    int prompt;         /* which prompt it continues */
    mk_ereq *er;
    mk_detok *dt;
    mk_stop *st;
    srv_split *sp;
    srv_buf content, reasoning;
    srv_calls calls;
    mk_sample_out *toks; /* shown tokens with logprobs (when asked) */
    int n_toks, cap_toks;
    int n_gen;          /* tokens the engine produced (stop token included) */
    int done;
    const char *finish; /* "stop" | "length" | "tool_calls" | "abort" | "error" */
    int stop_str;       /* matched stop string, or -1 */
    int32_t stop_tok;   /* the stop token that ended it (stop_token_ids or EOS), or -1 */
    int stop_tok_is_eos;
    char errmsg[256];
    double t_first, t_last, t_done;
    int metrics_done;
    size_t lp_off;      /* completions logprobs: text offset of the next token */
    int sent_role;      /* chat stream: the role chunk went out */
    /* forced tool call (gen.c): the phase, the tool and parameter being written, the assistant
     * text so far (reasoning + "</think>" + DSML), the current phase's text, tokens left */
    int fphase, ftool, fparam, fbudget;
    srv_buf fblock, fval;
    int fmaxed;         /* the current phase ended at its token budget */
} srv_choice;

struct srv_gen {
    mk_srv *s;
    srv_req *r;          /* borrowed */
    srv_choice *ch;
    int n_ch, n_done;
    double t_arrive;
    time_t created;
    char id[64];
    int prompt_tokens;   /* usage: summed over prompts */
    srv_gen *prev, *next;
    int registered;
    int rr;              /* round-robin start for polling */
    srv_buf dc, dr;      /* scratch: one delta's content / reasoning */
};

/* One choice's news from one engine event. */
typedef struct {
    srv_choice *c;
    const char *content;   /* new content text */
    size_t content_len;
    const char *reasoning; /* new reasoning text */
    size_t reasoning_len;
    int call_from, call_to; /* new tool calls: c->calls.v[call_from, call_to) */
    const mk_sample_out *tok; /* the token this delta shows (when logprobs were asked), or NULL */
    int finished;           /* c->finish is set */
} srv_delta;

typedef int (*srv_delta_fn)(void *ctx, srv_gen *g, const srv_delta *d);

/* Fills r->ftools for a forced call on `tools` (OpenAI tool objects; named: only that one). */
int srv_forced_tools(srv_req *r, const json_t *tools, const char *named, srv_err *e);

/* Submits every choice's engine request (all or none). 429 / 503 / 400 from the engine's answer. */
int srv_gen_start(mk_srv *s, srv_req *r, double t_arrive, const char *id_prefix, srv_gen **out, srv_err *e);
/* Waits up to timeout_s for events and handles them, calling fn (may be NULL) per delta.
 * Returns the number of deltas, or -1 when fn returned non-zero. */
int srv_gen_poll(srv_gen *g, double timeout_s, srv_delta_fn fn, void *ctx);
/* Runs to the end (non-streaming); returns -1 when the client at fd went away (then cancelled). */
int srv_gen_run(srv_gen *g, int fd);
void srv_gen_cancel(srv_gen *g);
/* Cancels what is unfinished, releases the engine handles, records metrics. */
void srv_gen_free(srv_gen *g);
int srv_gen_completion_tokens(const srv_gen *g);
/* Prompt tokens found in the prefix cache, summed over the prompts (first choice of each). */
int srv_gen_cached_tokens(const srv_gen *g);
/* First choice's queue time and TTFT (seconds from arrival), for the access log; -1 if unknown. */
void srv_gen_timing(const srv_gen *g, double *queue_s, double *ttft_s);
/* The text of one token (special tokens included), malloc'd. */
char *srv_token_text(mk_srv *s, int32_t id, size_t *len);

/* ---- replies (http.c) ------------------------------------------------------------------------- */

typedef struct srv_stream srv_stream;
/* Appends to st->out whatever is ready within timeout_s; sets st->done after the last bytes. */
typedef int (*srv_produce_fn)(srv_stream *st, double timeout_s);

struct srv_stream {
    mk_srv *s;
    srv_req *req;      /* owned */
    srv_gen *g;        /* owned */
    srv_buf out;
    size_t off;
    int done;
    int fd;            /* the client's socket, for disconnect checks */
    srv_produce_fn produce;
    int begun;
    /* Anthropic: the content block open now */
    int blk_open, blk_kind, blk_index;
    /* OpenAI: choices that already sent their first (role) chunk */
    /* access log */
    char method[16], path[256], client[64];
    int status;
    double t_arrive;
};

typedef struct {
    int status;
    json_t *json;           /* JSON body (owned) */
    char *text;             /* or a text body (owned) */
    const char *content_type;
    srv_stream *stream;     /* or a stream (owned until handed to the HTTP layer) */
    int anthropic;          /* errors in Anthropic's shape */
    srv_err err;            /* status >= 400 without json: the error to send */
    int prompt_tokens, output_tokens;
    double queue_s, ttft_s;
} srv_reply;

/* Per-request context handed to handlers. */
typedef struct {
    mk_srv *s;
    int fd;
    double t_arrive;
    const char *method, *path, *client;
} srv_http;

/* Fills rep with an error and returns -1. */
int srv_reply_err(srv_reply *rep, const srv_err *e);
srv_stream *srv_stream_new(mk_srv *s, const srv_http *h, srv_req *req, srv_gen *g, srv_produce_fn fn);
void srv_stream_free(srv_stream *st);
int srv_client_gone(int fd);

/* ---- endpoints -------------------------------------------------------------------------------- */

/* Shared request pieces (openai.c): model check, max tokens, sampling fields. */
int srv_check_model(mk_srv *s, const json_t *body, srv_req *r, srv_err *e);
/* max_tokens: asked (has_asked) or the room left in the context; checks every prompt fits. */
int srv_resolve_max_tokens(mk_srv *s, srv_req *r, long long asked, int has_asked, srv_err *e);
/* The sampling fields every endpoint shares (those present in the body; names as vLLM's). */
int srv_parse_sampling(mk_srv *s, const json_t *b, srv_req *r, srv_err *e);
/* stop strings: a string or an array of strings (field name for messages). */
int srv_parse_stops(const json_t *v, const char *name, srv_req *r, srv_err *e);
/* Renders a chat (OpenAI-style messages) into r's single prompt (text kept in r->prompt_text). */
int srv_render_prompt(mk_srv *s, const json_t *messages, const json_t *tools, int thinking,
                      const char *effort, int add_gen, srv_req *r, srv_err *e);
/* Validates OpenAI tool definitions [{type: function, function: {name, description, parameters,
 * strict}}]; where names the field. */
int srv_check_tools(const json_t *tools, const char *where, srv_err *e);

int srv_chat_parse(mk_srv *s, const json_t *body, srv_req *r, srv_err *e);
/* The chat request's prompt part (messages, tools, tool_choice, thinking) -> r's prompt. */
int srv_chat_build_prompt(mk_srv *s, const json_t *body, srv_req *r, srv_err *e);
int srv_completion_parse(mk_srv *s, const json_t *body, srv_req *r, srv_err *e);
int srv_messages_parse(mk_srv *s, const json_t *body, srv_req *r, srv_err *e);
/* /v1/messages/count_tokens: the prompt's token count. */
int srv_count_tokens_parse(mk_srv *s, const json_t *body, int *n_tokens, srv_err *e);

json_t *srv_chat_response(srv_gen *g);
json_t *srv_completion_response(srv_gen *g);
json_t *srv_messages_response(srv_gen *g);

int srv_chat_produce(srv_stream *st, double timeout_s);
int srv_completion_produce(srv_stream *st, double timeout_s);
int srv_messages_produce(srv_stream *st, double timeout_s);

/* Handlers: fill rep (JSON, text or stream). */
int srv_h_chat(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_completions(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_messages(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_count_tokens(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_tokenize(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_detokenize(const srv_http *h, json_t *body, srv_reply *rep);
int srv_h_models(const srv_http *h, const char *id, srv_reply *rep);
int srv_h_version(const srv_http *h, srv_reply *rep);
int srv_h_metrics(const srv_http *h, srv_reply *rep);
int srv_h_openapi(const srv_http *h, srv_reply *rep);

/* Field tables (for openapi.c). */
extern const srv_field srv_chat_fields[];
extern const int srv_n_chat_fields;
extern const srv_field srv_completion_fields[];
extern const int srv_n_completion_fields;
extern const srv_field srv_messages_fields[];
extern const int srv_n_messages_fields;
extern const srv_field srv_count_tokens_fields[];
extern const int srv_n_count_tokens_fields;
extern const srv_field srv_tokenize_fields[];
extern const int srv_n_tokenize_fields;
extern const srv_field srv_detokenize_fields[];
extern const int srv_n_detokenize_fields;
char *srv_openapi_build(mk_srv *s);

/* ---- metrics (metrics.c) --------------------------------------------------------------------- */
srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics *m);
/* One engine request finished: reason is "stop", "length" or "abort". ttft/queue < 0: unknown. */
void srv_metrics_request(srv_metrics *m, const char *reason, int prompt_tokens, int gen_tokens,
                         double ttft_s, double e2e_s, double queue_s);
void srv_metrics_itl(srv_metrics *m, double s);
char *srv_metrics_render(mk_srv *s);

#endif
