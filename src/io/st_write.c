/* st_write.c — safetensors writer (st_write.h). */
#include "io/st_write.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    mk_dtype dt;
    int ndim;
    int64_t shape[MK_ST_MAX_DIMS];
    void *data;
    size_t nbytes;
} stw_item;

struct mk_stw {
    stw_item *it;
    int n, cap;
};

mk_stw *mk_stw_create(void) { return calloc(1, sizeof(mk_stw)); }

void mk_stw_clear(mk_stw *w) {
    for (int i = 0; i < w->n; i++) { free(w->it[i].name); free(w->it[i].data); }
    w->n = 0;
}

void mk_stw_free(mk_stw *w) {
    if (!w) return;
    mk_stw_clear(w);
    free(w->it);
    free(w);
}

int mk_stw_count(const mk_stw *w) { return w->n; }

int mk_stw_add(mk_stw *w, const char *name, mk_dtype dt, int ndim, const int64_t *shape, const void *data) {
    if (ndim > MK_ST_MAX_DIMS || (dt != MK_DT_F32 && dt != MK_DT_I64)) return MK_EINVAL;
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 64;
        stw_item *ni = realloc(w->it, sizeof(stw_item) * (size_t)nc);
        if (!ni) return MK_ENOMEM;
        w->it = ni;
        w->cap = nc;
    }
    stw_item *x = &w->it[w->n];
    size_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    x->nbytes = n * mk_dtype_size(dt);
    x->data = malloc(x->nbytes ? x->nbytes : 1);
    /* unique name: a tensor dumped twice in one call (e.g. the MTP block) gets a suffix */
    int dup = 0;
    for (int i = 0; i < w->n; i++)
        if (!strncmp(w->it[i].name, name, strlen(name)) &&
            (w->it[i].name[strlen(name)] == 0 || w->it[i].name[strlen(name)] == '.'))
            dup++;
    char buf[256];
    if (dup) snprintf(buf, sizeof buf, "%s.%d", name, dup);
    else snprintf(buf, sizeof buf, "%s", name);
    x->name = strdup(buf);
    if (!x->data || !x->name) { free(x->data); free(x->name); return MK_ENOMEM; }
    memcpy(x->data, data, x->nbytes);
    x->dt = dt;
    x->ndim = ndim;
    memcpy(x->shape, shape, sizeof(int64_t) * (size_t)ndim);
    w->n++;
    return MK_OK;
}

int mk_stw_write(mk_stw *w, const char *path, mk_err *err) {
    json_t *root = json_object();
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        stw_item *x = &w->it[i];
        json_t *t = json_object(), *sh = json_array(), *of = json_array();
        for (int d = 0; d < x->ndim; d++) json_array_append_new(sh, json_integer(x->shape[d]));
        json_array_append_new(of, json_integer((json_int_t)off));
        json_array_append_new(of, json_integer((json_int_t)(off + x->nbytes)));
        json_object_set_new(t, "dtype", json_string(mk_dtype_name(x->dt)));
        json_object_set_new(t, "shape", sh);
        json_object_set_new(t, "data_offsets", of);
        json_object_set_new(root, x->name, t);
        off += x->nbytes;
    }
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(meta, "producer", json_string("minke " MK_VERSION));
    json_object_set_new(root, "__metadata__", meta);
    char *hdr = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!hdr) return mk_fail(err, MK_ENOMEM, "out of memory");
    size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) { free(hdr); return mk_fail(err, MK_EIO, "%s: cannot open for writing", path); }
    uint64_t n = hl + pad;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; i < w->n && ok; i++) ok = fwrite(w->it[i].data, 1, w->it[i].nbytes, f) == w->it[i].nbytes;
    free(hdr);
    if (fclose(f) || !ok) return mk_fail(err, MK_EIO, "%s: write failed", path);
    return MK_OK;
}
