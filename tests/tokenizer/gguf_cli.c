/* gguf_cli.c — the minke side of tests/tokenizer/gguf_vs_llamacpp.py.
 *
 * Usage: gguf_cli tok  MODEL.gguf < lines   each line a JSON string; prints one JSON object per
 *                                           line: {"ids": encode(add_special = 0),
 *                                           "ids_special": encode(add_special = 1),
 *                                           "decoded": decode(ids)} or {"error": message}
 *        gguf_cli chat MODEL.gguf < lines   each line {"messages": [...], "add_generation_prompt":
 *                                           bool}; prints the rendering with the template detected
 *                                           from tokenizer.chat_template (and its default system
 *                                           message) as a JSON string, or {"error": message}
 * A load failure prints the message and exits 1.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/gguf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

static json_t *id_array(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *do_tok(const mk_tok *t, const json_t *in) {
    mk_err err;
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0;
    if (!json_is_string(in)) return json_pack("{s:s}", "error", "expected a JSON string");
    const char *s = json_string_value(in);
    size_t len = json_string_length(in);
    if (mk_tok_encode(t, s, len, 0, &ids, &n, &err) || mk_tok_encode(t, s, len, 1, &ids2, &n2, &err)) {
        free(ids);
        return json_pack("{s:s}", "error", err.msg);
    }
    json_t *o = json_object();
    json_object_set_new(o, "ids", id_array(ids, n));
    json_object_set_new(o, "ids_special", id_array(ids2, n2));
    char *dec = NULL;
    size_t dl = 0;
    if (mk_tok_decode(t, ids, n, 0, &dec, &dl, &err) == 0) json_object_set_new(o, "decoded", json_stringn(dec, dl));
    free(dec);
    free(ids);
    free(ids2);
    return o;
}

static json_t *do_chat(mk_tmpl tm, const char *dflt, const json_t *in) {
    mk_err err;
    char *s;
    if (mk_tmpl_render(tm, json_object_get(in, "messages"), json_is_true(json_object_get(in, "add_generation_prompt")),
                       dflt, &s, &err))
        return json_pack("{s:s}", "error", err.msg);
    json_t *r = json_string(s);
    free(s);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "tok") && strcmp(argv[1], "chat"))) {
        fprintf(stderr, "usage: %s tok|chat MODEL.gguf < json-lines\n", argv[0]);
        return 2;
    }
    int chat = !strcmp(argv[1], "chat");
    mk_err err;
    mk_gguf *g;
    mk_tok *t = NULL;
    mk_tmpl tm = MK_TMPL_NONE;
    char *dflt = NULL;
    if (mk_gguf_open(argv[2], &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (chat) {
        const char *jinja;
        if (mk_gguf_get_str(g, "tokenizer.chat_template", &jinja, NULL, NULL, &err) ||
            mk_tmpl_detect(jinja, &tm, &err) || mk_tmpl_default_system(jinja, &dflt, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
    } else if (mk_tok_load_gguf(g, &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    mk_gguf_close(g);
    char *line = NULL;
    size_t cap = 0;
    ssize_t r;
    while ((r = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)r, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        json_t *o = !in ? json_pack("{s:s}", "error", "bad input line") : chat ? do_chat(tm, dflt, in) : do_tok(t, in);
        char *js = json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY);
        puts(js ? js : "{\"error\":\"dump failed\"}");
        free(js);
        json_decref(o);
        json_decref(in);
    }
    free(line);
    free(dflt);
    mk_tok_free(t);
    return 0;
}
