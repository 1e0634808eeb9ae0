/* bench.h — `minke bench serve`: the configuration of one benchmark run and the pieces that carry
 * it out, shared by the modules of src/bench/.
 *
 *   workload.c     prompts built from token ids (random, prefix-repetition, ShareGPT file) and the
 *                  agentic multi-turn sessions, using the server's /tokenize and /detokenize so
 *                  that every prompt's length is known exactly before it is sent
 *   runner.c       sending: arrival times, the concurrency cap, worker threads, one streamed
 *                  request -> one mk_bench_req record; agentic lanes with think times and
 *                  sub-agent fan-out
 *   serverinfo.c   /v1/models, /version, /metrics (Prometheus text) before and after a run
 *   report.c       the human table and the result JSON (every record plus the configuration)
 *   plot.c         SVG charts from result files
 *   metrics.c      the arithmetic (pure functions, unit-tested)
 *
 * The client talks to any OpenAI-compatible server (minke, vLLM, SGLang, llama-server); the
 * /tokenize and /detokenize routes follow vLLM's shapes. Token-id prompts are sent to
 * /v1/completions as `"prompt": [ids]`; the chat endpoint gets text built from ids and its exact
 * length is asked from /tokenize with the messages. Output lengths are pinned with vLLM's
 * `ignore_eos` extension field.
 */
#ifndef MK_BENCH_BENCH_H
#define MK_BENCH_BENCH_H

#include "bench/http_client.h"
#include "bench/metrics.h"
#include "minke.h"

#include <stdint.h>

enum { MK_BENCH_EP_COMPLETIONS = 0, MK_BENCH_EP_CHAT = 1 };
enum { MK_BENCH_DS_RANDOM = 0, MK_BENCH_DS_PREFIX, MK_BENCH_DS_AGENTIC, MK_BENCH_DS_SHAREGPT };

typedef struct {
    /* server */
    const char *base_url; /* "http://127.0.0.1:8000" (a trailing "/" or "/v1" is removed) */
    const char *model;    /* NULL: the first id of /v1/models */
    const char *api_key;  /* NULL: none */
    const char *label;    /* legend in plots; NULL: "model @ base_url" */
    int endpoint;         /* MK_BENCH_EP_* */
    int prompt_ids;       /* completions: send token ids (1) or text (0) */
    double timeout_s;     /* per request */
    double temperature;
    int ignore_eos;
    /* workload */
    int dataset; /* MK_BENCH_DS_* */
    const char *dataset_path;
    int num_prompts;
    unsigned long long seed;
    int input_len, output_len; /* random; prefix-repetition uses output_len */
    double range_ratio;
    int prefix_num, prefix_len, suffix_len;
    int sharegpt_output_len; /* > 0 overrides the lengths of the file's answers */
    int ag_lanes, ag_sessions, ag_turns, ag_subagents, ag_subagent_turns;
    int ag_system_len, ag_first_len, ag_tool_len, ag_output_len, ag_max_context;
    double ag_think_ms, ag_subagent_prob;
    /* arrivals */
    double request_rate; /* requests/s; INFINITY: all at once */
    double burstiness;
    int max_concurrency; /* 0: no cap */
    int num_warmups;
    /* reporting */
    mk_bench_slo slo;
    int gpus;
    double gpu_hour_cost;
    int quiet;
} mk_bench_config;

/* Counters scraped from /metrics; -1 when the server does not export them. */
typedef struct {
    double prefix_queries, prefix_hits;
    double spec_drafts, spec_draft_tokens, spec_accepted;
    double prompt_tokens, generation_tokens, preemptions;
} mk_bench_prom;

/* What one run needs while it runs: URLs, the resolved model, the token pool. */
typedef struct {
    const mk_bench_config *cfg;
    char base[512];
    char url_completions[600], url_chat[600], url_tokenize[600], url_detokenize[600];
    char model[256];
    int32_t *pool; /* distinct token ids of a built-in English text, as the server tokenizes it */
    int n_pool;
    /* agentic: the system prompt every session starts with (a prefix shared across sessions) */
    int32_t *sys_ids; /* [n_sys] token-id prompts */
    int n_sys;
    char *sys_text; /* text and chat prompts */
} mk_bench_ctx;

void mk_bench_ctx_free(mk_bench_ctx *ctx);

/* One prompt ready to send. Exactly one of ids / text / messages is set. */
typedef struct {
    int32_t *ids; /* completions, token ids */
    int n_ids;
    char *text;     /* completions, text */
    char *messages; /* chat: the JSON array of messages */
    int expected_prompt; /* the server's token count of this prompt, -1 if unknown */
    int max_tokens;
} mk_bench_prompt;

void mk_bench_prompt_free(mk_bench_prompt *p);

/* ---- serverinfo.c -------------------------------------------------------------------------- */

/* Fills ctx URLs from cfg->base_url and resolves the model (cfg->model or /v1/models). */
int mk_bench_ctx_init(mk_bench_ctx *ctx, const mk_bench_config *cfg, mk_bench_http *h, mk_err *err);
/* GET /version: the body as malloc'd JSON text, or NULL if the route is missing. */
char *mk_bench_server_version(mk_bench_ctx *ctx, mk_bench_http *h);
/* GET /metrics into *p; returns MK_EIO when the route is missing (p then all -1). */
int mk_bench_scrape(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prom *p);
/* Parses Prometheus text (exposed for the unit test): sums every series of each counter, accepting
 * the names with and without the `_total` suffix. */
void mk_bench_prom_parse(const char *text, mk_bench_prom *p);

/* ---- workload.c ---------------------------------------------------------------------------- */

/* /tokenize of text (add_special: the server adds BOS etc. as for a text prompt). *ids malloc'd. */
int mk_bench_tokenize(mk_bench_ctx *ctx, mk_bench_http *h, const char *text, int add_special, int32_t **ids, int *n,
                      mk_err *err);
/* /tokenize of a chat (messages JSON array, with the generation prompt): the prompt's length. */
int mk_bench_count_chat(mk_bench_ctx *ctx, mk_bench_http *h, const char *messages, int *n, mk_err *err);
/* /detokenize; *text malloc'd. */
int mk_bench_detokenize(mk_bench_ctx *ctx, mk_bench_http *h, const int32_t *ids, int n, char **text, mk_err *err);
/* Builds the token pool (ctx->pool). */
int mk_bench_pool_init(mk_bench_ctx *ctx, mk_bench_http *h, mk_err *err);

/* The prompts of a random, prefix-repetition or ShareGPT workload (cfg->num_prompts of them, or
 * fewer for a ShareGPT file with fewer usable conversations). *out malloc'd. */
int mk_bench_build_prompts(mk_bench_ctx *ctx, mk_bench_http *h, mk_bench_prompt **out, int *n, mk_err *err);

/* Builds the shared system prompt of the agentic sessions (ctx->sys_*). */
int mk_bench_agentic_init(mk_bench_ctx *ctx, mk_bench_http *h, mk_err *err);

/* An agentic session: a growing history resent every turn. */
typedef struct mk_bench_session mk_bench_session;
/* Session `index` (sub > 0: its sub-th sub-agent, with fewer turns). Deterministic from the seed. */
int mk_bench_session_new(mk_bench_ctx *ctx, mk_bench_http *h, int index, int sub, mk_bench_session **out,
                         mk_err *err);
void mk_bench_session_free(mk_bench_session *s);
/* The next turn's prompt; returns 1 when the session is over (turns done or context full). */
int mk_bench_session_next(mk_bench_session *s, mk_bench_http *h, mk_bench_prompt *p, mk_err *err);
/* Appends the answer and the tool result (extra: text that sub-agents returned, may be NULL). */
int mk_bench_session_advance(mk_bench_session *s, mk_bench_http *h, const char *answer, const char *extra,
                             mk_err *err);
/* After the turn just answered, the number of sub-agents to spawn (0 for none). */
int mk_bench_session_spawns(const mk_bench_session *s);
/* Think time before the next turn, seconds. */
double mk_bench_session_think(mk_bench_session *s);
/* Whether the prompt of turn t reused the previous turn's prompt as prefix: prompt tokens that
 * were already sent in this session (a perfect prefix cache's hits) so far, and all prompt tokens. */
void mk_bench_session_reuse(const mk_bench_session *s, long *reused, long *total);

/* ---- runner.c ------------------------------------------------------------------------------ */

typedef struct {
    mk_bench_req *reqs;
    int n;
    double duration; /* seconds, run start -> last response */
    int concurrency; /* the run's concurrency cap (max_concurrency, or lanes for agentic; 0 none) */
    long reused_tokens, session_tokens; /* agentic: prompt tokens already sent earlier in the session */
} mk_bench_results;

void mk_bench_results_free(mk_bench_results *r);

/* The JSON body (malloc'd text) that is POSTed for prompt p: model, prompt or messages,
 * max_tokens, temperature, ignore_eos, stream with include_usage. NULL when out of memory. */
char *mk_bench_request_body(const mk_bench_ctx *ctx, const mk_bench_prompt *p);

/* Runs the workload: warm-ups, then the measured requests. For random / prefix-repetition /
 * ShareGPT, prompts[n] is sent under the arrival process and cap; for agentic, prompts is NULL and
 * cfg->ag_lanes lanes run sessions. */
int mk_bench_run(mk_bench_ctx *ctx, const mk_bench_prompt *prompts, int n, mk_bench_results *out, mk_err *err);

#endif
