/* fuzz_gguf.c — libFuzzer target for the GGUF header, metadata and tensor-directory parser.
 *
 * Feeds arbitrary bytes to mk_gguf_parse(). A rejected input must come with a negative status and
 * a message. Whatever is accepted must be safe to use: every metadata value is read through the
 * getters (each string's bytes and every string-array element are touched, so ASan reports any
 * pointer outside the input), every key and tensor is found again by its own name, and every
 * tensor's first and last data byte is read and its size re-derived from the ggml block size.
 * Seeds (written by tests/gguf/make_gguf.py --seeds) live in fuzz/seeds/fuzz_gguf/.
 * Build and run: `make fuzz`.
 */
#include "io/gguf.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void touch(const void *p, size_t n, const uint8_t *data, size_t size) {
    if (!n) return;
    const uint8_t *b = p;
    if (b < data || b + n > data + size) __builtin_trap();
    sink ^= b[0];
    sink ^= b[n - 1];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mk_gguf *g = NULL;
    mk_err err;
    memset(&err, 0, sizeof err);
    if (mk_gguf_parse(data, size, "fuzz.gguf", &g, &err)) {
        if (!err.msg[0] || err.status >= 0 || g) __builtin_trap();
        return 0;
    }
    int v = mk_gguf_version(g);
    if (v != 2 && v != 3) __builtin_trap();
    uint32_t al = mk_gguf_alignment(g);
    if (!al || (al & (al - 1))) __builtin_trap();

    for (size_t i = 0; i < mk_gguf_n_kv(g); i++) {
        const char *k = mk_gguf_key(g, i);
        if (!k || !k[0] || mk_gguf_find_key(g, k) != (int64_t)i) __builtin_trap();
        char buf[256];
        mk_gguf_format_kv(g, i, buf, sizeof buf);
        int t = mk_gguf_kv_type(g, i), found = 0;
        uint32_t u32;
        int64_t i64;
        float f;
        int b;
        const char *s;
        size_t sl;
        /* each getter either succeeds or fails with a message; never crashes */
        mk_gguf_get_u32(g, k, &u32, &found, &err);
        mk_gguf_get_i64(g, k, &i64, &found, &err);
        mk_gguf_get_f32(g, k, &f, &found, &err);
        mk_gguf_get_bool(g, k, &b, &found, &err);
        if (mk_gguf_get_str(g, k, &s, &sl, &found, &err) == MK_OK) {
            if (t != MK_GGUF_T_STRING || !found || s[sl] != 0) __builtin_trap();
            if (sl) sink ^= (uint8_t)s[0] ^ (uint8_t)s[sl - 1];
        }
        int et;
        uint64_t n;
        const void *p;
        if (mk_gguf_get_arr(g, k, &et, &n, &p, &found, &err) == MK_OK) {
            if (t != MK_GGUF_T_ARRAY || et == MK_GGUF_T_ARRAY) __builtin_trap();
            if (et == MK_GGUF_T_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    if (mk_gguf_arr_str(g, k, j, &s, &sl)) __builtin_trap();
                    touch(s, sl, data, size);
                }
                if (mk_gguf_arr_str(g, k, n, &s, &sl) == MK_OK) __builtin_trap();
            } else if (n) {
                /* copy helpers over small arrays (bounded so a fuzzed count stays cheap) */
                if (n <= 4096) {
                    float fb[4096];
                    int32_t ib[4096];
                    mk_gguf_arr_f32(g, k, fb, n, &found, &err);
                    mk_gguf_arr_i32(g, k, ib, n, &found, &err);
                }
                touch(p, 1, data, size);
            }
        }
    }

    size_t total = 0;
    for (size_t i = 0; i < mk_gguf_n_tensors(g); i++) {
        mk_gguf_tensor *t = mk_gguf_tensor_at(g, i);
        if (!t->name[0] || mk_gguf_find(g, t->name) != t) __builtin_trap();
        if (t->n_dims < 1 || t->n_dims > MK_GGUF_MAX_DIMS) __builtin_trap();
        int be, bb;
        if (!mk_ggml_type_size(t->type, &be, &bb) || t->ne[0] % (uint64_t)be) __builtin_trap();
        uint64_t want = t->ne[0] / (uint64_t)be * (uint64_t)bb * t->ne[1] * t->ne[2] * t->ne[3];
        if (want != t->nbytes || t->offset % al) __builtin_trap();
        touch(t->data, t->nbytes, data, size);
        total += t->nbytes;
    }
    if (total != mk_gguf_total_bytes(g) || total > size) __builtin_trap();
    mk_gguf_close(g);
    (void)sink;
    return 0;
}
