/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser.
 *
 * Feeds arbitrary bytes to mk_st_parse(). Whatever it accepts must be safe to use: every tensor's
 * first and last data byte is read (ASan reports any pointer outside the input), sizes must agree
 * with shape x dtype, and mk_st_find must return each tensor by its own name. Seeds live in
 * fuzz/seeds/fuzz_safetensors/. Build and run: `make fuzz`.
 */
#include "io/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mk_st *st = NULL;
    mk_err err;
    if (mk_st_parse(data, size, "fuzz.safetensors", &st, &err)) {
        /* a rejected input must come with a message */
        if (!err.msg[0] || err.status >= 0) __builtin_trap();
        return 0;
    }
    volatile uint8_t sink = 0;
    size_t total = 0;
    for (size_t i = 0; i < mk_st_count(st); i++) {
        mk_st_tensor *t = mk_st_at(st, i);
        if ((uint64_t)t->numel * mk_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
        if (t->ndim < 0 || t->ndim > MK_ST_MAX_DIMS || !t->name[0]) __builtin_trap();
        if (t->nbytes) {
            const uint8_t *p = t->data;
            if (p < data || p + t->nbytes > data + size) __builtin_trap();
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        if (mk_st_find(st, t->name) != t) __builtin_trap();
        total += t->nbytes;
    }
    if (total != mk_st_total_bytes(st) || total > size) __builtin_trap();
    (void)sink;
    mk_st_close(st);
    return 0;
}
