/* cmd_text.c — text subcommands that need no forward pass:
 *
 *   minke tokenize (--model DIR | --tokenizer FILE) [--special] [--decode]
 *       encode: text on stdin -> JSON list of ids on stdout (--special: apply the tokenizer's
 *       post-processor, e.g. add BOS); decode (--decode): ids on stdin (a JSON list, or numbers
 *       separated by commas/whitespace) -> text (--special: keep special tokens' text).
 *   minke render --messages FILE.json [--tools FILE.json] [--model DIR] [--thinking]
 *                [--keep-thinking] [--reasoning-effort E]
 *       prints the prompt exactly as DeepSeek's V4 encoder renders it (no trailing newline).
 *       FILE.json is a list of messages or an object {"messages": [...], "tools": [...]}.
 */
#include "cli/cli.h"
#include "text/chat_dsv4.h"
#include "text/tokenizer.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loads the tokenizer named by --tokenizer, else the one in --model DIR. */
static mk_tok *load_tok(const char *cmd, const char *model, const char *file) {
    mk_err err = {0};
    mk_tok *t = NULL;
    const char *path = file ? file : model;
    if (!path) {
        fprintf(stderr, "minke %s: give --model DIR or --tokenizer FILE\n", cmd);
        return NULL;
    }
    if (mk_tok_load(path, &t, &err)) {
        fprintf(stderr, "minke %s: %s\n", cmd, err.msg);
        return NULL;
    }
    return t;
}

/* Parses ids from text: a JSON list or numbers separated by commas / whitespace. */
static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 256;
    *n = 0;
    *ids = malloc(cap * sizeof(int32_t));
    const char *p = s;
    while (*p) {
        while (*p && (isspace((unsigned char)*p) || *p == ',' || *p == '[' || *p == ']')) p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff) return -1;
        if (*n == cap) *ids = realloc(*ids, (cap *= 2) * sizeof(int32_t));
        (*ids)[(*n)++] = (int32_t)v;
        p = end;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    cli_opt o[] = {
        {"--model", "DIR", "model directory holding tokenizer.json", NULL},
        {"--tokenizer", "FILE", "a tokenizer.json file", NULL},
        {"--special", NULL, "encode: add the post-processor's special tokens; decode: keep special tokens", NULL},
        {"--decode", NULL, "read ids on stdin and print text", NULL},
    };
    int n = 4, pr = cli_parse("tokenize", "(--model DIR | --tokenizer FILE) [--special] [--decode] < input", argc, argv, o, n);
    if (pr) return pr > 0 ? 0 : 2;
    mk_tok *t = load_tok("tokenize", o[0].value, o[1].value);
    if (!t) return 1;
    size_t len;
    char *in = cli_read_file("-", &len);
    int rc = 1;
    mk_err err = {0};
    if (!in) { fprintf(stderr, "minke tokenize: cannot read stdin\n"); goto out; }
    if (o[3].value) {
        int32_t *ids;
        size_t ni;
        if (parse_ids(in, &ids, &ni)) {
            fprintf(stderr, "minke tokenize --decode: stdin must hold token ids (a JSON list or numbers separated by commas/spaces)\n");
            free(ids);
            rc = 2;
            goto out;
        }
        char *text;
        size_t tl;
        if (mk_tok_decode(t, ids, ni, !o[2].value, &text, &tl, &err)) {
            fprintf(stderr, "minke tokenize: %s\n", err.msg);
            free(ids);
            goto out;
        }
        fwrite(text, 1, tl, stdout);
        free(text);
        free(ids);
    } else {
        int32_t *ids;
        size_t ni;
        if (mk_tok_encode(t, in, len, o[2].value != NULL, &ids, &ni, &err)) {
            fprintf(stderr, "minke tokenize: %s\n", err.msg);
            goto out;
        }
        putchar('[');
        for (size_t i = 0; i < ni; i++) printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
        free(ids);
    }
    rc = 0;
out:
    free(in);
    mk_tok_free(t);
    return rc;
}

/* Chooses the chat encoding from the model's config.json (only DeepSeek-V4's for now). */
static int check_model_encoding(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!c) {
        fprintf(stderr, "minke render: %s: %s\n", path, je.text);
        return -1;
    }
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    int ok = mt && !strcmp(mt, "deepseek_v4");
    if (!ok) fprintf(stderr, "minke render: %s: model_type \"%s\" has no chat encoding here (supported: deepseek_v4)\n", path, mt ? mt : "?");
    json_decref(c);
    return ok ? 0 : -1;
}

static json_t *load_json(const char *cmd, const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j) fprintf(stderr, "minke %s: %s: line %d column %d: %s\n", cmd, path, je.line, je.column, je.text);
    return j;
}

int cmd_render(int argc, char **argv) {
    cli_opt o[] = {
        {"--messages", "FILE", "JSON list of messages, or {\"messages\": [...], \"tools\": [...]}", NULL},
        {"--tools", "FILE", "JSON list of OpenAI tool definitions", NULL},
        {"--model", "DIR", "model directory (selects the chat encoding from config.json)", NULL},
        {"--thinking", NULL, "thinking mode (default: chat mode)", NULL},
        {"--keep-thinking", NULL, "keep reasoning of earlier turns (drop_thinking = false)", NULL},
        {"--reasoning-effort", "E", "reasoning effort (as DeepSeek's encoder accepts, e.g. max)", NULL},
    };
    int n = 6, pr = cli_parse("render", "--messages FILE.json [options]", argc, argv, o, n);
    if (pr) return pr > 0 ? 0 : 2;
    if (!o[0].value) { fprintf(stderr, "minke render: --messages is required\n"); return 2; }
    if (o[2].value && check_model_encoding(o[2].value)) return 1;
    json_t *doc = load_json("render", o[0].value), *tools_doc = NULL;
    if (!doc) return 1;
    json_t *msgs = doc, *tools = NULL;
    if (json_is_object(doc)) {
        msgs = json_object_get(doc, "messages");
        tools = json_object_get(doc, "tools");
    }
    if (o[1].value) {
        tools_doc = load_json("render", o[1].value);
        if (!tools_doc) { json_decref(doc); return 1; }
        tools = tools_doc;
    }
    if (!json_is_array(msgs)) {
        fprintf(stderr, "minke render: %s: expected a list of messages or an object with \"messages\"\n", o[0].value);
        json_decref(doc);
        json_decref(tools_doc);
        return 2;
    }
    mk_dsv4_opts opts;
    mk_dsv4_opts_default(&opts);
    opts.thinking = o[3].value != NULL;
    if (o[4].value) opts.drop_thinking = 0;
    opts.reasoning_effort = o[5].value;
    char *out = NULL;
    mk_err err = {0};
    int rc = mk_dsv4_render(msgs, tools, &opts, &out, &err);
    if (rc) fprintf(stderr, "minke render: %s\n", err.msg);
    else fputs(out, stdout);
    free(out);
    json_decref(doc);
    json_decref(tools_doc);
    return rc ? 1 : 0;
}
