/* model.c — the public mk_model / mk_seq API (include/minke.h): picks the model family from what
 * the path holds and forwards every call to that family's implementation.
 *
 *   a directory with config.json whose model_type is deepseek_v4  -> src/models/dsv4*.c
 *   a .gguf file (general.architecture llama, or Llama-like)        -> src/models/llama.c
 *
 * Family-specific tools (golden tests, `minke logits`) use the family's own API directly.
 */
#include "minke.h"
#include "base/status.h"
#include "models/dsv4.h"
#include "models/llama.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { FAM_DSV4 = 1, FAM_LLAMA = 2 };

struct mk_model {
    int family;
    dsv4_model *dsv4;
    llama_model *llama;
};

struct mk_seq {
    mk_model *m;
    dsv4_seq *dsv4;
    llama_seq *llama;
};

static int is_gguf(const char *path) {
    size_t n = strlen(path);
    struct stat st;
    return n > 5 && !strcmp(path + n - 5, ".gguf") && !stat(path, &st) && S_ISREG(st.st_mode);
}

int mk_model_load(const char *path, const mk_model_options *opt, mk_model **out, mk_err *err) {
    *out = NULL;
    mk_model *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "out of memory");
    int rc;
    if (is_gguf(path)) {
        m->family = FAM_LLAMA;
        rc = llama_model_load(path, opt, &m->llama, err);
    } else {
        m->family = FAM_DSV4;
        rc = dsv4_model_load(path, opt, &m->dsv4, err);
    }
    if (rc) { free(m); return rc; }
    *out = m;
    return MK_OK;
}

void mk_model_free(mk_model *m) {
    if (!m) return;
    dsv4_model_free(m->dsv4);
    llama_model_free(m->llama);
    free(m);
}

int mk_model_vocab_size(const mk_model *m) {
    return m->family == FAM_LLAMA ? llama_model_vocab_size(m->llama) : dsv4_model_vocab_size(m->dsv4);
}

void mk_model_print_info(const mk_model *m, void *file) {
    if (m->family == FAM_LLAMA) llama_model_print_info(m->llama, file);
    else dsv4_model_print_info(m->dsv4, file);
}

const char *mk_model_family(const mk_model *m) { return m->family == FAM_LLAMA ? "llama" : "deepseek_v4"; }

int mk_seq_create(mk_model *m, int max_len, mk_seq **out, mk_err *err) {
    *out = NULL;
    mk_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->m = m;
    int rc = m->family == FAM_LLAMA ? llama_seq_create(m->llama, max_len, &s->llama, err)
                                    : dsv4_seq_create(m->dsv4, max_len, &s->dsv4, err);
    if (rc) { free(s); return rc; }
    *out = s;
    return MK_OK;
}

void mk_seq_free(mk_seq *s) {
    if (!s) return;
    dsv4_seq_free(s->dsv4);
    llama_seq_free(s->llama);
    free(s);
}

void mk_seq_reset(mk_seq *s) {
    if (s->llama) llama_seq_reset(s->llama);
    else dsv4_seq_reset(s->dsv4);
}

int mk_seq_pos(const mk_seq *s) { return s->llama ? llama_seq_pos(s->llama) : dsv4_seq_pos(s->dsv4); }
int mk_seq_capacity(const mk_seq *s) { return s->llama ? llama_seq_capacity(s->llama) : dsv4_seq_capacity(s->dsv4); }
int mk_seq_vocab_size(const mk_seq *s) { return mk_model_vocab_size(s->m); }

int mk_seq_forward(mk_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err) {
    return s->llama ? llama_seq_forward(s->llama, tokens, n, logits, err)
                    : dsv4_seq_forward(s->dsv4, tokens, n, logits, err);
}

dsv4_model *mk_model_dsv4(mk_model *m) { return m->dsv4; }
dsv4_seq *mk_seq_dsv4(mk_seq *s) { return s->dsv4; }
llama_model *mk_model_llama(mk_model *m) { return m->llama; }
