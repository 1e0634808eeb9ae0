/* gguf.h — mmapped GGUF files (versions 2 and 3): metadata, tensor directory, validation.
 *
 * A GGUF file is a little-endian header ("GGUF", version, tensor count, metadata count), the typed
 * metadata key/value pairs, the tensor directory (name, dims, ggml type, offset per tensor),
 * padding to the alignment (metadata `general.alignment`, default 32), then the tensor data. This
 * loader maps the file read-only and validates all of it before handing anything out: counts that
 * cannot fit in the file are rejected before any allocation, every length is checked against the
 * bytes that remain, tensor byte sizes come from the ggml type's block size, and tensor ranges must
 * be aligned, inside the file and overlap-free. Failures return MK_EFORMAT (malformed) or
 * MK_ENOTSUP (GGUF v1, big-endian GGUF) with a message naming the file, the key or tensor, and
 * expected vs found. Nothing reachable from the file aborts (libFuzzer target: fuzz/fuzz_gguf.c).
 *
 * Pointers and lifetimes: everything returned (keys, scalar strings, tensor names, tensor data,
 * array data) lives until mk_gguf_close(). Keys, tensor names and scalar string values are
 * NUL-terminated copies; array data and string-array elements point into the mapping and are
 * NOT NUL-terminated and may be unaligned (read numeric array elements with memcpy, or use the
 * mk_gguf_arr_f32 / mk_gguf_arr_i32 copy helpers).
 *
 * Thread-safety: an mk_gguf is read-only after parse/open except for the tensors' `used` flags.
 *
 * Usage:
 *   mk_gguf *g; mk_err err;
 *   if (mk_gguf_open("model.gguf", &g, &err)) { fprintf(stderr, "%s\n", err.msg); ... }
 *   uint32_t n_layer; int found;
 *   mk_gguf_get_u32(g, "llama.block_count", &n_layer, NULL, &err);  // found == NULL: required
 *   mk_gguf_tensor *t = mk_gguf_find(g, "token_embd.weight");     // t->data, t->ne[0..3]
 *   mk_gguf_close(g);
 */
#ifndef MK_IO_GGUF_H
#define MK_IO_GGUF_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

/* Metadata value types, numbered as in the GGUF spec. */
typedef enum {
    MK_GGUF_T_UINT8 = 0,
    MK_GGUF_T_INT8 = 1,
    MK_GGUF_T_UINT16 = 2,
    MK_GGUF_T_INT16 = 3,
    MK_GGUF_T_UINT32 = 4,
    MK_GGUF_T_INT32 = 5,
    MK_GGUF_T_FLOAT32 = 6,
    MK_GGUF_T_BOOL = 7,
    MK_GGUF_T_STRING = 8,
    MK_GGUF_T_ARRAY = 9,
    MK_GGUF_T_UINT64 = 10,
    MK_GGUF_T_INT64 = 11,
    MK_GGUF_T_FLOAT64 = 12,
    MK_GGUF_T_COUNT
} mk_gguf_type;

/* ggml tensor type ids (ggml.h numbering; gaps are types ggml removed). */
enum {
    MK_GGML_F32 = 0, MK_GGML_F16 = 1, MK_GGML_Q4_0 = 2, MK_GGML_Q4_1 = 3, MK_GGML_Q5_0 = 6,
    MK_GGML_Q5_1 = 7, MK_GGML_Q8_0 = 8, MK_GGML_Q8_1 = 9, MK_GGML_Q2_K = 10, MK_GGML_Q3_K = 11,
    MK_GGML_Q4_K = 12, MK_GGML_Q5_K = 13, MK_GGML_Q6_K = 14, MK_GGML_Q8_K = 15,
    MK_GGML_IQ2_XXS = 16, MK_GGML_IQ2_XS = 17, MK_GGML_IQ3_XXS = 18, MK_GGML_IQ1_S = 19,
    MK_GGML_IQ4_NL = 20, MK_GGML_IQ3_S = 21, MK_GGML_IQ2_S = 22, MK_GGML_IQ4_XS = 23,
    MK_GGML_I8 = 24, MK_GGML_I16 = 25, MK_GGML_I32 = 26, MK_GGML_I64 = 27, MK_GGML_F64 = 28,
    MK_GGML_IQ1_M = 29, MK_GGML_BF16 = 30, MK_GGML_TQ1_0 = 34, MK_GGML_TQ2_0 = 35,
    MK_GGML_MXFP4 = 39,
};

#define MK_GGUF_MAX_DIMS 4
#define MK_GGUF_DEFAULT_ALIGNMENT 32

typedef struct {
    const char *name;   /* NUL-terminated, owned by the mk_gguf */
    uint32_t type;      /* ggml type id (MK_GGML_*) */
    int n_dims;         /* 1..4 */
    uint64_t ne[4];     /* elements per dim; ne[0] = innermost (row length); unused dims = 1 */
    const void *data;   /* into the mapping: data start + offset (aligned to the file alignment) */
    size_t nbytes;      /* (ne[0] / block_elems) * block_bytes * ne[1] * ne[2] * ne[3] */
    int used;           /* set by model binders to report unconsumed tensors */
    uint64_t offset;    /* as in the file: relative to the aligned start of the data section */
} mk_gguf_tensor;

typedef struct mk_gguf mk_gguf;

/* Parse a whole GGUF image from memory (the fuzzer and tests). Does not own buf; buf must outlive
 * the result. fname names the buffer in messages (NULL: "<buffer>"). */
int mk_gguf_parse(const uint8_t *buf, size_t len, const char *fname, mk_gguf **out, mk_err *err);
/* mmap path read-only and parse it. */
int mk_gguf_open(const char *path, mk_gguf **out, mk_err *err);
void mk_gguf_close(mk_gguf *g);

int mk_gguf_version(const mk_gguf *g);        /* 2 or 3 */
uint32_t mk_gguf_alignment(const mk_gguf *g);  /* general.alignment or 32 */
uint64_t mk_gguf_data_offset(const mk_gguf *g); /* file offset of the aligned data section */
const char *mk_gguf_fname(const mk_gguf *g);

/* ---- metadata ----------------------------------------------------------------------------------
 * Getters return MK_OK and set *found = 1 with the value, or MK_OK with *found = 0 (and *out
 * untouched) when the key is absent. Pass found == NULL to make the key required: absence is then
 * MK_EFORMAT "missing required key". A key present with an incompatible type, or with a value that
 * does not fit, is MK_EFORMAT naming the key, the expected type and the type (value) found. */

size_t mk_gguf_n_kv(const mk_gguf *g);
const char *mk_gguf_key(const mk_gguf *g, size_t i);      /* NULL when i is out of range */
int mk_gguf_kv_type(const mk_gguf *g, size_t i);          /* MK_GGUF_T_*, -1 out of range */
/* Index of key, or -1. O(1) average (hash table). */
int64_t mk_gguf_find_key(const mk_gguf *g, const char *key);
/* "uint32", "string", "array", ... ("unknown" otherwise). */
const char *mk_gguf_type_name(int type);
/* One-line description of value i into buf ("uint32 30", "string \"llama\"",
 * "array[string; 49152]"); returns buf. */
const char *mk_gguf_format_kv(const mk_gguf *g, size_t i, char *buf, size_t cap);

/* Any integer type whose value fits in uint32 (u8..u64, i8..i64 that are >= 0 and small enough). */
int mk_gguf_get_u32(const mk_gguf *g, const char *key, uint32_t *out, int *found, mk_err *err);
/* Any integer type whose value fits in int64 (uint64 above INT64_MAX is rejected). */
int mk_gguf_get_i64(const mk_gguf *g, const char *key, int64_t *out, int *found, mk_err *err);
/* float32, or float64 that is finite-in-float-range (rounded to nearest float). */
int mk_gguf_get_f32(const mk_gguf *g, const char *key, float *out, int *found, mk_err *err);
/* string: *s is NUL-terminated, *len is the byte length (authoritative: a value may hold NULs).
 * len may be NULL. */
int mk_gguf_get_str(const mk_gguf *g, const char *key, const char **s, size_t *len, int *found,
                    mk_err *err);
/* bool: *out = 0 or 1. */
int mk_gguf_get_bool(const mk_gguf *g, const char *key, int *out, int *found, mk_err *err);

/* Array: element type (MK_GGUF_T_*), element count and a pointer to the raw little-endian elements
 * in the mapping (unaligned; for string arrays it points at the first element's length prefix:
 * use mk_gguf_arr_str). Any of elem_type, n, data may be NULL. Arrays of arrays are rejected at
 * parse time, so elem_type is never MK_GGUF_T_ARRAY. */
int mk_gguf_get_arr(const mk_gguf *g, const char *key, int *elem_type, uint64_t *n,
                    const void **data, int *found, mk_err *err);
/* Element i of a string array, O(1) (offset index built at parse time). *s is NOT NUL-terminated.
 * Returns MK_OK, or MK_EINVAL when the key is absent, not a string array, or i >= count. */
int mk_gguf_arr_str(const mk_gguf *g, const char *key, uint64_t i, const char **s, size_t *len);
/* Copy a whole numeric array, which must have exactly n elements, converting to the destination
 * type: _f32 accepts float32/float64 elements, _i32 accepts integer elements that fit in int32.
 * MK_EFORMAT naming the key (and element index) otherwise; absent keys honour found as above. */
int mk_gguf_arr_f32(const mk_gguf *g, const char *key, float *dst, uint64_t n, int *found,
                    mk_err *err);
int mk_gguf_arr_i32(const mk_gguf *g, const char *key, int32_t *dst, uint64_t n, int *found,
                    mk_err *err);

/* ---- tensors ------------------------------------------------------------------------------------
 * In file order. mk_gguf_find is O(1) average (hash table). */
size_t mk_gguf_n_tensors(const mk_gguf *g);
mk_gguf_tensor *mk_gguf_tensor_at(mk_gguf *g, size_t i);
mk_gguf_tensor *mk_gguf_find(mk_gguf *g, const char *name);
/* Sum of all tensors' nbytes. */
size_t mk_gguf_total_bytes(const mk_gguf *g);

/* ---- ggml types ---------------------------------------------------------------------------------
 * "Q4_K", "BF16", ... or "unknown". */
const char *mk_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block of a ggml type (1 and the element size for plain types).
 * Returns block_bytes (> 0) for known types; 0 with both outputs set to 0 for unknown or removed
 * types. Either output may be NULL. */
int mk_ggml_type_size(uint32_t type, int *block_elems, int *block_bytes);

#endif
