/* tok_cli.c — the minke side of the tokenizer property test (tests/tokenizer/prop_test.py).
 *
 * Usage: tok_cli TOKENIZER.json < lines
 * Each input line is one JSON string. For each, one output line is printed: a JSON object with
 *   ids          encode(text, add_special = 0)
 *   ids_special  encode(text, add_special = 1)
 *   decoded      decode(ids, skip_special = 0)
 *   decoded_skip decode(ids, skip_special = 1)
 *   stream       the streaming detokenizer fed ids one at a time, then flushed (skip_special = 0)
 * or {"error": message} when encoding fails. A load failure prints the message and exits 1.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

static json_t *id_array(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *process(const mk_tok *t, mk_detok *d, const char *s, size_t len) {
    mk_err err;
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0;
    if (mk_tok_encode(t, s, len, 0, &ids, &n, &err) || mk_tok_encode(t, s, len, 1, &ids2, &n2, &err)) {
        free(ids);
        return json_pack("{s:s}", "error", err.msg);
    }
    json_t *o = json_object();
    json_object_set_new(o, "ids", id_array(ids, n));
    json_object_set_new(o, "ids_special", id_array(ids2, n2));
    char *dec = NULL;
    size_t dl = 0;
    for (int skip = 0; skip < 2; skip++) {
        if (mk_tok_decode(t, ids, n, skip, &dec, &dl, &err) == 0)
            json_object_set_new(o, skip ? "decoded_skip" : "decoded", json_stringn(dec, dl));
        free(dec);
    }
    /* streaming */
    char *acc = malloc(1);
    size_t al = 0;
    int bad = 0;
    for (size_t i = 0; i <= n && acc; i++) {
        const char *piece;
        size_t pl;
        if ((i < n ? mk_detok_push(d, ids[i], &piece, &pl) : mk_detok_flush(d, &piece, &pl)) != 0) bad = 1;
        char *p = realloc(acc, al + pl + 1);
        if (!p) break;
        acc = p;
        memcpy(acc + al, piece, pl);
        al += pl;
    }
    if (acc && !bad) json_object_set_new(o, "stream", json_stringn(acc, al));
    free(acc);
    free(ids);
    free(ids2);
    return o;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s TOKENIZER.json < json-lines\n", argv[0]);
        return 2;
    }
    mk_err err;
    mk_tok *t;
    mk_detok *d;
    if (mk_tok_load(argv[1], &t, &err) || mk_detok_create(t, 0, &d, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t r;
    while ((r = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)r, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je), *out;
        if (!json_is_string(in)) out = json_pack("{s:s}", "error", "input line is not a JSON string");
        else out = process(t, d, json_string_value(in), json_string_length(in));
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(s ? s : "{\"error\":\"dump\"}");
        free(s);
        json_decref(out);
        json_decref(in);
    }
    free(line);
    mk_detok_free(d);
    mk_tok_free(t);
    return 0;
}
