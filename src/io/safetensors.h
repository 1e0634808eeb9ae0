/* safetensors.h — mmapped safetensors checkpoints, single-file or sharded.
 *
 * A checkpoint is either one `*.safetensors` file or a directory holding `model.safetensors` or a
 * `model.safetensors.index.json` whose `weight_map` names the shard of every tensor. Files are
 * mmapped read-only; tensors point straight into the mapping and are never copied. The header
 * parser validates everything a corrupt file could get wrong (length prefix, JSON, dtype names,
 * shapes, offsets within the data section, overlap-free and in-bounds ranges, byte sizes that
 * match shape x dtype) and returns MK_EFORMAT with a message naming the file and tensor; it never
 * crashes on bad input (libFuzzer target: fuzz/fuzz_safetensors.c).
 *
 * Every tensor carries a `used` flag so a model binder can report tensors it did not consume
 * ("extra tensor") after binding.
 */
#ifndef MK_IO_SAFETENSORS_H
#define MK_IO_SAFETENSORS_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum {
    MK_DT_UNKNOWN = 0,
    MK_DT_F32,
    MK_DT_F16,
    MK_DT_BF16,
    MK_DT_F64,
    MK_DT_F8_E4M3,
    MK_DT_F8_E5M2,
    MK_DT_F8_E8M0,
    MK_DT_I8,
    MK_DT_U8,
    MK_DT_I16,
    MK_DT_I32,
    MK_DT_I64,
    MK_DT_BOOL,
} mk_dtype;

#define MK_ST_MAX_DIMS 8

typedef struct {
    char *name;                     /* owned by the mk_st */
    mk_dtype dtype;
    int ndim;
    int64_t shape[MK_ST_MAX_DIMS];
    int64_t numel;
    const void *data;               /* points into the mmap */
    size_t nbytes;
    int file;                       /* index of the shard file */
    int used;                       /* set by binders */
} mk_st_tensor;

typedef struct mk_st mk_st;

/* Bytes per element (0 for unknown). */
size_t mk_dtype_size(mk_dtype dt);
/* Safetensors dtype name ("BF16", "F8_E4M3", ...) <-> enum. */
const char *mk_dtype_name(mk_dtype dt);
mk_dtype mk_dtype_from_name(const char *name);

/* Parse a safetensors header from memory: buf holds the whole file (8-byte length, JSON, data).
 * On success *out holds the tensors (data pointers into buf). Used by mk_st_open and the fuzzer. */
int mk_st_parse(const uint8_t *buf, size_t len, const char *fname, mk_st **out, mk_err *err);

/* Open a checkpoint: a .safetensors file, or a directory (index.json or model.safetensors). */
int mk_st_open(const char *path, mk_st **out, mk_err *err);
void mk_st_close(mk_st *st);

size_t mk_st_count(const mk_st *st);
mk_st_tensor *mk_st_at(mk_st *st, size_t i);
/* Tensor by name, or NULL. O(1) average (hash table). */
mk_st_tensor *mk_st_find(mk_st *st, const char *name);
/* Path of shard file i (for messages). */
const char *mk_st_file_path(const mk_st *st, int i);
/* Total bytes of tensor data over all tensors. */
size_t mk_st_total_bytes(const mk_st *st);

#endif
