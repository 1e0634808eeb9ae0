/* main.c — the `minke` command line: subcommands dispatch to their own functions.
 *
 *   minke logits --model DIR --tokens 0,5,7,... --prefill S [--out F.safetensors] [--dump DIR]
 *                [--force-decisions GOLDEN.safetensors] [--threads N] [--top K] [--device cpu|cuda]
 *       (on the GPU the dump holds the mHC stream after each layer, "L<l>.h", only)
 *   minke info --model DIR
 *   minke tokenize | render (cmd_text.c), generate | chat (cmd_generate.c), serve (cmd_serve.c)
 *
 * Options are declared once per subcommand in a table (name, argument, help) that produces the
 * help text and rejects unknown options with a message naming them.
 */
#include "cli/cli.h"
#include "io/st_write.h"
#include "models/dsv4.h"
#include "models/dsv4_golden.h"
#include "models/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- minke logits -------------------------------------------------------------------------- */

typedef struct {
    mk_stw *dump;
    dsv4_golden *g;
    dsv4_hooks gh;
} cli_hooks;

static void cli_dump(void *ctx, const char *name, const float *data, int ndim, const int64_t *shape) {
    cli_hooks *h = ctx;
    if (h->dump) mk_stw_add(h->dump, name, MK_DT_F32, ndim, shape, data);
}
static void cli_moe(void *ctx, int layer, int n_tok, int k, int32_t *idx, const float *margin) {
    cli_hooks *h = ctx;
    if (h->g) h->gh.moe(h->gh.ctx, layer, n_tok, k, idx, margin);
}
static void cli_idx(void *ctx, int layer, int t, int n_tok, int k, int32_t *sel, const float *sc, int ns) {
    cli_hooks *h = ctx;
    if (h->g) h->gh.indexer(h->gh.ctx, layer, t, n_tok, k, sel, sc, ns);
}

int cmd_logits(int argc, char **argv) {
    cli_opt o[] = {
        {"--model", "DIR", "checkpoint directory (config.json + safetensors)", NULL},
        {"--tokens", "IDS", "comma-separated token ids", NULL},
        {"--prefill", "S", "run the first S tokens as one prefill, the rest as one-token decodes (default: all)", NULL},
        {"--out", "FILE", "write every call's logits to FILE.safetensors ('logits', f32 [calls, vocab])", NULL},
        {"--dump", "DIR", "write every named intermediate tensor of call c to DIR/call<c>.safetensors", NULL},
        {"--force-decisions", "GOLDEN", "use the reference's expert and indexer choices from a golden file", NULL},
        {"--threads", "N", "CPU threads (default: all cores)", NULL},
        {"--top", "K", "top logits printed per call (default 5)", NULL},
        {"--device", "cpu|cuda", CLI_DEVICE_HELP " (on the GPU --dump writes the L<l>.h streams only)", NULL, "MINKE_DEVICE", CLI_ANY, 0, 0, "cpu"},
        {"--cuda-device", "N", CLI_CUDA_DEVICE_HELP, NULL, "MINKE_CUDA_DEVICE", CLI_INT, 0, 1024, "0"},
    };
    int n = (int)(sizeof o / sizeof o[0]);
    int pr = cli_parse("logits", "--model DIR --tokens IDS [options]", argc, argv, o, n);
    if (pr) return pr > 0 ? 0 : 2;
    if (!o[0].value || !o[1].value) {
        fprintf(stderr, "minke logits: --model and --tokens are required (see minke logits --help)\n");
        return 2;
    }
    /* tokens */
    int cap = 1024, ntok = 0;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)cap);
    for (const char *p = o[1].value; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7fffffff) {
            fprintf(stderr, "minke logits: --tokens: '%s' is not a comma-separated list of token ids\n", o[1].value);
            free(tok);
            return 2;
        }
        if (ntok == cap) { cap *= 2; tok = realloc(tok, sizeof(int32_t) * (size_t)cap); }
        tok[ntok++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "minke logits: --tokens: unexpected character '%c' in '%s'\n", *p, o[1].value);
            free(tok);
            return 2;
        }
    }
    if (!ntok) { fprintf(stderr, "minke logits: --tokens is empty\n"); free(tok); return 2; }
    long S = ntok, threads = 0, top = 5;
    int device;
    if ((o[2].value && cli_int("logits", "--prefill", o[2].value, 1, ntok, &S)) ||
        (o[6].value && cli_int("logits", "--threads", o[6].value, 1, 1024, &threads)) ||
        (o[7].value && cli_int("logits", "--top", o[7].value, 1, 100, &top)) || cli_device("logits", o[8].value, &device)) {
        free(tok);
        return 2;
    }
    mk_err err = {0};
    mk_model *m;
    mk_model_options mo = {.n_threads = (int)threads, .max_seq_len = ntok + 16 > 4096 ? ntok + 16 : 4096,
                           .device = device, .cuda_device = atoi(o[9].value)};
    if (mk_model_load(o[0].value, &mo, &m, &err)) {
        fprintf(stderr, "minke logits: %s\n", err.msg);
        free(tok);
        return 1;
    }
    int rc = 1;
    mk_seq *s = NULL;
    cli_hooks ch = {0};
    dsv4_hooks hk = {.ctx = &ch}; /* set on s (CPU or GPU) for dumps and forced decisions */
    mk_stw *outw = NULL;
    float *all = NULL, *lg = NULL;
    int vocab = mk_model_vocab_size(m);
    int n_calls = 1 + (ntok - (int)S);
    if (mk_seq_create(m, ntok + 1, &s, &err)) goto done;
    if (!mk_model_dsv4(m) && (o[4].value || o[5].value)) {
        snprintf(err.msg, sizeof err.msg, "--dump and --force-decisions are only available for DeepSeek-V4 models");
        goto done;
    }
    if (o[4].value) {
        if (mkdir(o[4].value, 0755) && errno != EEXIST) {
            fprintf(stderr, "minke logits: --dump: cannot create directory %s\n", o[4].value);
            goto done;
        }
        ch.dump = mk_stw_create();
        hk.dump = cli_dump;
    }
    if (o[5].value) {
        int j = dsv4_golden_find_prompt(o[5].value, tok, ntok, &err);
        if (j < 0) {
            if (j == -1) snprintf(err.msg, sizeof err.msg, "%s: no recorded prompt starts with these tokens", o[5].value);
            goto done;
        }
        if (dsv4_golden_open(o[5].value, j, mk_model_dsv4(m)->cfg.n_layers, &ch.g, &err)) goto done;
        dsv4_golden_set_window(ch.g, mk_model_dsv4(m)->cfg.window);
        dsv4_golden_hooks(ch.g, 1, &ch.gh);
        hk.moe = cli_moe;
        hk.indexer = cli_idx;
        fprintf(stderr, "minke logits: forcing the reference's decisions of prompt p%d\n", j);
    }
    if ((hk.dump || hk.moe) && mk_seq_set_dsv4_hooks(s, &hk, &err)) goto done;
    all = malloc(sizeof(float) * (size_t)n_calls * vocab);
    if (!all) { snprintf(err.msg, sizeof err.msg, "out of memory"); goto done; }
    for (int c = 0; c < n_calls; c++) {
        int pos = c == 0 ? 0 : (int)S + c - 1, cnt = c == 0 ? (int)S : 1;
        lg = all + (size_t)c * vocab;
        if (ch.g) dsv4_golden_set_call(ch.g, c);
        if (mk_seq_forward(s, tok + pos, cnt, lg, &err)) goto done;
        printf("call %d (%s, positions %d..%d): top", c, c ? "decode" : "prefill", pos, pos + cnt - 1);
        int32_t best[100];
        for (int k = 0; k < top; k++) best[k] = -1;
        for (int i = 0; i < vocab; i++) {
            int p = (int)top;
            while (p > 0 && (best[p - 1] < 0 || lg[best[p - 1]] < lg[i])) p--;
            if (p >= top) continue;
            for (int t = (int)top - 1; t > p; t--) best[t] = best[t - 1];
            best[p] = i;
        }
        for (int k = 0; k < top && k < vocab; k++) printf(" %d:%.4f", best[k], lg[best[k]]);
        printf("\n");
        if (ch.dump) {
            char path[1200];
            snprintf(path, sizeof path, "%s/call%03d.safetensors", o[4].value, c);
            if (mk_stw_write(ch.dump, path, &err)) goto done;
            mk_stw_clear(ch.dump);
        }
    }
    if (o[3].value) {
        outw = mk_stw_create();
        int64_t sh[2] = {n_calls, vocab};
        mk_stw_add(outw, "logits", MK_DT_F32, 2, sh, all);
        if (mk_stw_write(outw, o[3].value, &err)) goto done;
    }
    rc = 0;
done:
    if (rc) fprintf(stderr, "minke logits: %s\n", err.msg);
    mk_stw_free(outw);
    mk_stw_free(ch.dump);
    dsv4_golden_free(ch.g);
    free(all);
    mk_seq_free(s);
    mk_model_free(m);
    free(tok);
    return rc;
}

/* ---- minke info ---------------------------------------------------------------------------- */

int cmd_info(int argc, char **argv) {
    cli_opt o[] = {{"--model", "PATH", "DeepSeek-V4 checkpoint directory or .gguf file", NULL}};
    int pr = cli_parse("info", "--model DIR", argc, argv, o, 1);
    if (pr) return pr > 0 ? 0 : 2;
    if (!o[0].value) { fprintf(stderr, "minke info: --model is required\n"); return 2; }
    mk_err err = {0};
    mk_model *m;
    mk_model_options mo = {.n_threads = 1, .max_seq_len = 4096};
    if (mk_model_load(o[0].value, &mo, &m, &err)) {
        fprintf(stderr, "minke info: %s\n", err.msg);
        return 1;
    }
    mk_model_print_info(m, stdout);
    mk_model_free(m);
    return 0;
}

static void usage(void) {
    printf("minke %s — exact DeepSeek-V4 inference in C\n\n"
           "usage: minke <command> [options]\n\n"
           "commands:\n"
           "  logits   run tokens through the model (prefill + decodes), print/write logits, dump tensors\n"
           "  info     print a checkpoint's architecture, parameter counts and memory needs\n"
           "  tokenize encode text (stdin) to token ids, or decode ids to text (--decode)\n"
           "  render   print the chat prompt DeepSeek-V4's encoder makes from a messages file\n"
           "  generate stream a completion of --prompt (--chat: as a chat turn)\n"
           "  chat     interactive chat with history\n"
           "  serve    HTTP server: OpenAI (chat, completions), Anthropic (messages) and vLLM APIs\n"
           "  bench    benchmark an OpenAI-compatible server (bench serve) and chart results (bench plot)\n"
           "  help     this text; `minke <command> --help` for a command's options\n",
           MK_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("minke %s\n", MK_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(argv[1], "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "render")) return cmd_render(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 2, argv + 2);
    fprintf(stderr, "minke: unknown command '%s' (see minke help)\n", argv[1]);
    return 2;
}
