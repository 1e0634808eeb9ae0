/* st_write.h — a small safetensors writer for the CLI's outputs (`minke logits --out`, `--dump`).
 * Collects named F32 / I64 tensors in memory and writes one file with a header padded to 8
 * bytes so that readers can map the data aligned. */
#ifndef MK_IO_ST_WRITE_H
#define MK_IO_ST_WRITE_H

#include "io/safetensors.h"

typedef struct mk_stw mk_stw;

mk_stw *mk_stw_create(void);
void mk_stw_free(mk_stw *w);
/* Copies data (dtype F32 or I64). Names must be unique; a repeated name gets a ".N" suffix. */
int mk_stw_add(mk_stw *w, const char *name, mk_dtype dt, int ndim, const int64_t *shape, const void *data);
int mk_stw_count(const mk_stw *w);
int mk_stw_write(mk_stw *w, const char *path, mk_err *err);
void mk_stw_clear(mk_stw *w);

#endif
