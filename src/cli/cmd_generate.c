/* cmd_generate.c — `minke generate` and `minke chat`: text in, text out.
 *
 *   minke generate --model DIR [--tokenizer FILE] --prompt TEXT [--chat] [--thinking]
 *                  [--max-tokens N] [--device cpu|cuda] [sampling flags]
 *       streams the completion to stdout; prompt and generation tokens/s go to stderr at the end.
 *       --device cuda (env MINKE_DEVICE) runs a DeepSeek-V4 checkpoint on the GPU (build-cuda/minke).
 *       --chat renders the prompt as one user message with the model's chat encoding
 *       (DeepSeek-V4: BOS, <｜User｜>, <｜Assistant｜>, chat or thinking mode); without it the text
 *       is tokenized as is, with the tokenizer's post-processor (e.g. BOS).
 *   minke chat --model DIR [--tokenizer FILE] [--thinking] [--system TEXT] [sampling flags]
 *       an interactive loop with history; Ctrl-C stops the current answer, Ctrl-D (EOF) or /exit
 *       leaves.
 *
 * Sampling defaults come from the model's generation_config.json when present, then flags. The
 * model, tokenizer, chat encoding and EOS ids are set up by the shared text/chat.h (as for
 * `minke serve`).
 */
#include "cli/cli.h"
#include "engine/generate.h"
#include "text/chat.h"
#include "text/chat_dsv4.h"
#include "text/chat_template.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Options shared by generate and chat (indices used below). */
enum { O_MODEL, O_TOK, O_THINK, O_MAXTOK, O_TEMP, O_TOPK, O_TOPP, O_MINP, O_PRES, O_FREQ, O_REP, O_SEED,
       O_MINTOK, O_STOP, O_STOPIDS, O_IGNEOS, O_BIAS, O_LOGPROBS, O_THREADS, O_SPECIAL, O_TMPL, O_DEVICE, O_CUDADEV,
       O_COMMON };

#define COMMON_OPTS                                                                                  \
    {"--model", "PATH", "DeepSeek-V4 checkpoint directory or a .gguf file (default: SmolLM2-135M-Instruct)", NULL}, \
    {"--tokenizer", "FILE", "tokenizer.json to use instead of DIR/tokenizer.json", NULL},             \
    {"--thinking", NULL, "chat encoding in thinking mode (default: chat mode)", NULL},                \
    {"--max-tokens", "N", "tokens to generate at most (default 256)", NULL},                          \
    {"--temperature", "T", "sampling temperature, 0 = greedy (default: generation_config or 1)", NULL}, \
    {"--top-k", "K", "keep the K most likely tokens (-1 = off)", NULL},                                \
    {"--top-p", "P", "nucleus sampling (0, 1]", NULL},                                                 \
    {"--min-p", "P", "drop tokens below P x the top probability [0, 1]", NULL},                        \
    {"--presence-penalty", "X", "[-2, 2]", NULL},                                                      \
    {"--frequency-penalty", "X", "[-2, 2]", NULL},                                                     \
    {"--repetition-penalty", "X", "> 0 (1 = off)", NULL},                                              \
    {"--seed", "S", "RNG seed: the same seed gives the same tokens", NULL},                            \
    {"--min-tokens", "N", "do not stop before N tokens", NULL},                                        \
    {"--stop", "STR", "stop string (repeat the option for several)", NULL},                            \
    {"--stop-token-ids", "IDS", "comma-separated token ids that end generation", NULL},               \
    {"--ignore-eos", NULL, "keep generating after EOS", NULL},                                         \
    {"--logit-bias", "ID:B,...", "add B in [-100, 100] to token ID's logit", NULL},                   \
    {"--logprobs", "N", "print each token's logprob and the N most likely alternatives to stderr", NULL}, \
    {"--threads", "N", "CPU threads (default: all cores)", NULL},                                      \
    {"--show-special", NULL, "print special tokens' text in the output", NULL},                        \
    {"--chat-template", "NAME", "chat template for GGUF models: chatml or llama3 (default: from the GGUF)", NULL}, \
    {"--device", "cpu|cuda", CLI_DEVICE_HELP, NULL, "MINKE_DEVICE", CLI_ANY, 0, 0, "cpu"},              \
    {"--cuda-device", "N", CLI_CUDA_DEVICE_HELP, NULL, "MINKE_CUDA_DEVICE", CLI_INT, 0, 1024, "0"}

typedef struct {
    mk_chat *chat;        /* model, tokenizer, chat encoding, EOS ids, generation defaults */
    mk_seq *seq;
    mk_sampling_params sp;
    int32_t stop_ids[256], bias_ids[256];
    float bias_vals[256];
    const char *stops[16];
    int n_stops;
    long max_tokens;
    int show_logprobs;
    int thinking;
} gen_setup;

static volatile sig_atomic_t g_cancel;
static void on_sigint(int sig) { (void)sig; g_cancel = 1; }

static void print_text(void *ctx, const char *t, size_t n) {
    (void)ctx;
    fwrite(t, 1, n, stdout);
    fflush(stdout);
}

static void print_token(void *ctx, const mk_sample_out *so) {
    gen_setup *g = ctx;
    if (!g->show_logprobs) return;
    fprintf(stderr, "[token %d logprob %.4f", so->token, so->logprob);
    for (int i = 0; i < so->n_top; i++) fprintf(stderr, " | %d:%.4f", so->top_ids[i], so->top_logprobs[i]);
    fprintf(stderr, "]\n");
}

/* Collects all --stop values (the table keeps only the last). */
static void collect_stops(int argc, char **argv, gen_setup *g) {
    for (int i = 0; i + 1 < argc && g->n_stops < 16; i++)
        if (!strcmp(argv[i], "--stop")) g->stops[g->n_stops++] = argv[++i];
}

static int parse_id_list(const char *cmd, const char *opt, const char *s, int32_t *ids, float *vals, int cap, int *n) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff || *n >= cap) goto bad;
        ids[*n] = (int32_t)v;
        p = end;
        if (vals) {
            if (*p != ':') goto bad;
            double b = strtod(p + 1, &end);
            if (end == p + 1) goto bad;
            vals[*n] = (float)b;
            p = end;
        }
        (*n)++;
        if (*p == ',') p++;
        else if (*p) goto bad;
    }
    return 0;
bad:
    fprintf(stderr, "minke %s: %s: cannot parse '%s' (expected %s)\n", cmd, opt, s,
            vals ? "ID:BIAS pairs separated by commas" : "token ids separated by commas");
    return -1;
}

/* Loads model, tokenizer, generation defaults and flags. Returns 0, or an exit code. */
static int setup(const char *cmd, cli_opt *o, int argc, char **argv, gen_setup *g) {
    memset(g, 0, sizeof *g);
    mk_err err = {0};
    long threads = 0;
    if (o[O_THREADS].value && cli_int(cmd, "--threads", o[O_THREADS].value, 1, 1024, &threads)) return 2;
    int device;
    if (cli_device(cmd, o[O_DEVICE].value, &device)) return 2;
    g->max_tokens = 256;
    if (o[O_MAXTOK].value && cli_int(cmd, "--max-tokens", o[O_MAXTOK].value, 0, 1 << 20, &g->max_tokens)) return 2;
    mk_tmpl t;
    if (o[O_TMPL].value && mk_tmpl_by_name(o[O_TMPL].value, &t, &err)) { fprintf(stderr, "minke %s: %s\n", cmd, err.msg); return 2; }
    /* flags are checked before the (slow) model load */
    mk_sampling_params fl;
    mk_sampling_defaults(&fl);
    int set[6] = {0};
    double d;
#define FLOATOPT(k, idx, name, lo, hi, field) \
    if (o[idx].value) { if (cli_float(cmd, name, o[idx].value, lo, hi, &d)) return 2; fl.field = (float)d; set[k] = 1; }
    FLOATOPT(0, O_TEMP, "--temperature", 0, 1e6, temperature);
    FLOATOPT(1, O_TOPP, "--top-p", 0, 1, top_p);
    FLOATOPT(2, O_MINP, "--min-p", 0, 1, min_p);
    FLOATOPT(3, O_PRES, "--presence-penalty", -2, 2, presence_penalty);
    FLOATOPT(4, O_FREQ, "--frequency-penalty", -2, 2, frequency_penalty);
    FLOATOPT(5, O_REP, "--repetition-penalty", 1e-6, 1e6, repetition_penalty);
#undef FLOATOPT
    long top_k = 0, min_tokens = 0;
    if (o[O_TOPK].value && cli_int(cmd, "--top-k", o[O_TOPK].value, -1, 1 << 30, &top_k)) return 2;
    if (o[O_MINTOK].value && cli_int(cmd, "--min-tokens", o[O_MINTOK].value, 0, 1 << 20, &min_tokens)) return 2;
    unsigned long long seed = 0;
    if (o[O_SEED].value) {
        char *end;
        errno = 0;
        seed = strtoull(o[O_SEED].value, &end, 10);
        if (errno || *end || end == o[O_SEED].value) { fprintf(stderr, "minke %s: --seed expects an unsigned integer\n", cmd); return 2; }
    }
    long logprobs = 0;
    if (o[O_LOGPROBS].value && cli_int(cmd, "--logprobs", o[O_LOGPROBS].value, 0, MK_SAMPLER_MAX_TOP_LOGPROBS, &logprobs)) return 2;
    int n_stop_ids = 0, n_bias = 0;
    if (o[O_STOPIDS].value && parse_id_list(cmd, "--stop-token-ids", o[O_STOPIDS].value, g->stop_ids, NULL, 256, &n_stop_ids)) return 2;
    if (o[O_BIAS].value && parse_id_list(cmd, "--logit-bias", o[O_BIAS].value, g->bias_ids, g->bias_vals, 256, &n_bias)) return 2;
    collect_stops(argc, argv, g);
    g->thinking = o[O_THINK].value != NULL;

    /* 4096 tokens per sequence whatever the model's own context (the interactive chat keeps
     * long histories) */
    mk_chat_options co = {.model = o[O_MODEL].value, .tokenizer = o[O_TOK].value, .chat_template = o[O_TMPL].value,
                          .n_threads = (int)threads, .max_model_len = 4096, .device = device,
                          .cuda_device = atoi(o[O_CUDADEV].value)};
    if (mk_chat_load(&co, &g->chat, &err)) { fprintf(stderr, "minke %s: %s\n", cmd, err.msg); return 1; }

    /* generation_config.json defaults, then the flags */
    mk_chat_sampling_defaults(g->chat, &g->sp);
    if (set[0]) g->sp.temperature = fl.temperature;
    if (set[1]) g->sp.top_p = fl.top_p;
    if (set[2]) g->sp.min_p = fl.min_p;
    if (set[3]) g->sp.presence_penalty = fl.presence_penalty;
    if (set[4]) g->sp.frequency_penalty = fl.frequency_penalty;
    if (set[5]) g->sp.repetition_penalty = fl.repetition_penalty;
    if (o[O_TOPK].value) g->sp.top_k = (int)top_k;
    if (o[O_MINTOK].value) g->sp.min_tokens = (int)min_tokens;
    if (o[O_SEED].value) { g->sp.seed = seed; g->sp.has_seed = 1; }
    if (o[O_LOGPROBS].value) {
        g->sp.logprobs = 1;
        g->sp.top_logprobs = (int)logprobs;
        g->show_logprobs = 1;
    }
    g->sp.ignore_eos = o[O_IGNEOS].value != NULL;
    if (n_stop_ids) { g->sp.stop_ids = g->stop_ids; g->sp.n_stop_ids = n_stop_ids; }
    if (n_bias) { g->sp.bias_ids = g->bias_ids; g->sp.bias_vals = g->bias_vals; g->sp.n_bias = n_bias; }
    if (mk_sampling_validate(&g->sp, mk_chat_vocab_size(g->chat), &err)) { fprintf(stderr, "minke %s: %s\n", cmd, err.msg); return 2; }
    if (mk_seq_create(mk_chat_model(g->chat), 0, &g->seq, &err)) { fprintf(stderr, "minke %s: %s\n", cmd, err.msg); return 1; }
    return 0;
}

static void teardown(gen_setup *g) {
    mk_seq_free(g->seq);
    mk_chat_free(g->chat);
}

/* Renders messages with the chat encoding and tokenizes the result (the BOS is in the text). */
static int chat_prompt(gen_setup *g, json_t *msgs, int32_t **ids, size_t *n, mk_err *err) {
    mk_chat_render_opts ro;
    mk_chat_render_opts_default(&ro);
    ro.thinking = g->thinking;
    return mk_chat_encode(g->chat, msgs, NULL, &ro, ids, n, err);
}

static int run(gen_setup *g, const int32_t *ids, size_t n, mk_gen_result *res, const char *cmd) {
    int n_eos;
    const int32_t *eos = mk_chat_eos(g->chat, &n_eos);
    mk_gen_request req = {
        .sampling = &g->sp, .eos_ids = eos, .n_eos = n_eos, .stop = g->stops, .n_stop = g->n_stops,
        .max_tokens = (int)g->max_tokens, .skip_special = 1, .on_text = print_text, .on_token = print_token,
        .ctx = g, .cancel = &g_cancel,
    };
    mk_err err = {0};
    g_cancel = 0;
    int rc = mk_generate(g->seq, mk_chat_tok(g->chat), ids, (int)n, &req, res, &err);
    if (rc) fprintf(stderr, "minke %s: %s\n", cmd, err.msg);
    return rc;
}

static void print_stats(const mk_gen_result *r) {
    static const char *fin[] = {"none", "stop", "length", "cancelled"};
    fprintf(stderr, "\n[prompt: %d tokens, %.2f tokens/s | generation: %d tokens, %.2f tokens/s | finish: %s]\n",
            r->n_prompt, r->prefill_s > 0 ? r->n_prompt / r->prefill_s : 0.0, r->n_generated,
            r->decode_s > 0 ? r->n_generated / r->decode_s : 0.0, fin[r->finish]);
}

int cmd_generate(int argc, char **argv) {
    cli_opt o[] = {COMMON_OPTS,
                   {"--prompt", "TEXT", "the prompt", NULL},
                   {"--chat", NULL, "render the prompt as a user message with the chat encoding", NULL}};
    int no = O_COMMON + 2;
    int pr = cli_parse("generate", "--model DIR --prompt TEXT [--chat] [--thinking] [sampling flags]", argc, argv, o, no);
    if (pr) return pr > 0 ? 0 : 2;
    const char *prompt = o[O_COMMON].value;
    if (!prompt) { fprintf(stderr, "minke generate: --prompt TEXT is required\n"); return 2; }
    gen_setup g;
    int rc = setup("generate", o, argc, argv, &g);
    if (rc) { teardown(&g); return rc; }
    int32_t *ids = NULL;
    size_t n = 0;
    mk_err err = {0};
    if (o[O_COMMON + 1].value) {
        json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", prompt);
        rc = chat_prompt(&g, msgs, &ids, &n, &err);
        json_decref(msgs);
    } else {
        rc = mk_tok_encode(mk_chat_tok(g.chat), prompt, strlen(prompt), 1, &ids, &n, &err);
    }
    if (rc) {
        fprintf(stderr, "minke generate: %s\n", err.msg);
        teardown(&g);
        return 1;
    }
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    mk_gen_result res;
    rc = run(&g, ids, n, &res, "generate");
    if (!rc) print_stats(&res);
    free(res.tokens);
    free(ids);
    teardown(&g);
    return rc ? 1 : 0;
}

int cmd_chat(int argc, char **argv) {
    cli_opt o[] = {COMMON_OPTS, {"--system", "TEXT", "system prompt", NULL}};
    int no = O_COMMON + 1;
    int pr = cli_parse("chat", "--model DIR [--thinking] [--system TEXT] [sampling flags]", argc, argv, o, no);
    if (pr) return pr > 0 ? 0 : 2;
    gen_setup g;
    int rc = setup("chat", o, argc, argv, &g);
    if (rc) { teardown(&g); return rc; }
    /* no SA_RESTART: Ctrl-C interrupts a blocking read, so it never kills the program */
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    json_t *hist = json_array();
    if (o[O_COMMON].value) json_array_append_new(hist, json_pack("{s:s, s:s}", "role", "system", "content", o[O_COMMON].value));
    fprintf(stderr, "minke chat: type a message; Ctrl-C stops an answer, /reset clears the history, Ctrl-D or /exit quits.\n");
    char line[65536];
    for (;;) {
        fputs("> ", stdout);
        fflush(stdout);
        g_cancel = 0;
        if (!fgets(line, sizeof line, stdin)) {
            if (ferror(stdin) && errno == EINTR) { clearerr(stdin); fputs("\n(Ctrl-D or /exit to quit)\n", stdout); continue; }
            break;
        }
        size_t L = strlen(line);
        while (L && (line[L - 1] == '\n' || line[L - 1] == '\r')) line[--L] = 0;
        if (!L) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(hist);
            if (o[O_COMMON].value) json_array_append_new(hist, json_pack("{s:s, s:s}", "role", "system", "content", o[O_COMMON].value));
            continue;
        }
        json_array_append_new(hist, json_pack("{s:s, s:s}", "role", "user", "content", line));
        int32_t *ids = NULL;
        size_t n = 0;
        mk_err err = {0};
        if (chat_prompt(&g, hist, &ids, &n, &err)) {
            fprintf(stderr, "minke chat: %s\n", err.msg);
            json_array_remove(hist, json_array_size(hist) - 1);
            continue;
        }
        mk_gen_result res;
        if (run(&g, ids, n, &res, "chat")) {
            json_array_remove(hist, json_array_size(hist) - 1);
            free(ids);
            free(res.tokens);
            continue;
        }
        putchar('\n');
        if (res.finish == MK_FINISH_CANCEL) fputs("[stopped]\n", stdout);
        /* keep the answer's content (not its reasoning) in the history */
        char *text = NULL;
        size_t tl = 0;
        mk_dsv4_msg msg = {0};
        int dsv4 = mk_chat_is_dsv4(g.chat);
        if (!mk_tok_decode(mk_chat_tok(g.chat), res.tokens, (size_t)res.n_generated, !dsv4, &text, &tl, &err) && dsv4 &&
            !mk_dsv4_parse(text, tl, g.thinking, &msg, &err) && msg.content)
            json_array_append_new(hist, json_pack("{s:s, s:s}", "role", "assistant", "content", msg.content));
        else
            json_array_append_new(hist, json_pack("{s:s, s:s}", "role", "assistant", "content", text ? text : ""));
        mk_dsv4_msg_free(&msg);
        free(text);
        free(res.tokens);
        free(ids);
    }
    json_decref(hist);
    teardown(&g);
    return 0;
}
