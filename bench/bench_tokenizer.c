/* bench_tokenizer.c — encode throughput of minke's tokenizer (driven by bench/bench_tokenizer.py,
 * which measures HF `tokenizers` on the same documents in the same run).
 *
 * Usage: bench_tokenizer TOKENIZER.json DOCS.jsonl REPEATS
 * DOCS.jsonl holds one JSON string per line; each document is encoded on its own (one call of
 * mk_tok_encode, add_special = 0), single-threaded, REPEATS times over the whole set. Prints one
 * JSON line: bytes, tokens, best and median seconds per pass, MB/s (best) and an FNV-1a hash of all
 * ids (so the caller can check the ids equal HF's).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TOKENIZER.json DOCS.jsonl REPEATS\n", argv[0]);
        return 2;
    }
    int reps = atoi(argv[3]);
    if (reps < 1 || reps > 1000) reps = 3;
    mk_err err;
    mk_tok *t;
    if (mk_tok_load(argv[1], &t, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    /* documents: [n_docs] strings with their lengths */
    char **doc = NULL;
    size_t *dlen = NULL, nd = 0, cap = 0, total = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t r;
    while ((r = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *s = json_loadb(line, (size_t)r, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!json_is_string(s)) {
            fprintf(stderr, "%s: line %zu is not a JSON string\n", argv[2], nd + 1);
            return 1;
        }
        if (nd == cap) {
            cap = cap ? cap * 2 : 1024;
            doc = realloc(doc, cap * sizeof *doc);
            dlen = realloc(dlen, cap * sizeof *dlen);
            if (!doc || !dlen) return 1;
        }
        dlen[nd] = json_string_length(s);
        doc[nd] = malloc(dlen[nd] + 1);
        if (!doc[nd]) return 1;
        memcpy(doc[nd], json_string_value(s), dlen[nd] + 1);
        total += dlen[nd];
        nd++;
        json_decref(s);
    }
    free(line);
    fclose(f);

    double *secs = calloc((size_t)reps, sizeof *secs);
    uint64_t hash = 0;
    size_t tokens = 0;
    for (int rep = 0; rep < reps; rep++) {
        uint64_t h = 0xcbf29ce484222325ull;
        size_t nt = 0;
        double t0 = now();
        for (size_t i = 0; i < nd; i++) {
            int32_t *ids;
            size_t n;
            if (mk_tok_encode(t, doc[i], dlen[i], 0, &ids, &n, &err)) {
                fprintf(stderr, "document %zu: %s\n", i, err.msg);
                return 1;
            }
            for (size_t k = 0; k < n; k++) h = (h ^ (uint64_t)(uint32_t)ids[k]) * 0x100000001b3ull;
            nt += n;
            free(ids);
        }
        secs[rep] = now() - t0;
        hash = h;
        tokens = nt;
    }
    qsort(secs, (size_t)reps, sizeof *secs, cmp_double);
    printf("{\"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"best_s\": %.6f, \"median_s\": %.6f, "
           "\"mbps\": %.3f, \"hash\": \"%016llx\"}\n",
           nd, total, tokens, secs[0], secs[reps / 2], (double)total / secs[0] / 1e6, (unsigned long long)hash);
    for (size_t i = 0; i < nd; i++) free(doc[i]);
    free(doc);
    free(dlen);
    free(secs);
    mk_tok_free(t);
    return 0;
}
