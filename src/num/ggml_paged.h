/* ggml_paged.h — llama.cpp's f16 dot products (num/ggml_exact.h) over rows whose elements are
 * scattered over KV blocks: the attention's KQV product read straight from a paged cache.
 *
 * Why: in the paged KV cache (src/kv/, layout in src/kv/README.md) a sequence's V^T row for one
 * value dimension is cut into pieces of block_tokens positions, one per block of its block table.
 * KQV is, per value dimension, a dot product along positions, and ggml's summation order carries
 * its accumulators across the whole row (4 accumulators of W lanes over steps of 4W for
 * ggml_vec_dot_f16, one of KN lanes for tinyBLAS), so the row cannot be cut into per-block dots
 * and summed. These kernels walk the block pieces with the accumulators carried over, and give
 * the same bits as mk_gx_dot_f16_n on the row gathered into contiguous memory — without the
 * gather.
 *
 * Addressing: element j of row i lies at seg[j / seg_len] + i * row_stride + j % seg_len (seg has
 * one pointer per block: that block's part of row 0). seg_len must be a multiple of the level's
 * lane count (16 for MK_GX_AVX512, 8 for MK_GX_AVX2; anything for MK_GX_SCALAR), so that no vector
 * load straddles two blocks.
 */
#ifndef MK_NUM_GGML_PAGED_H
#define MK_NUM_GGML_PAGED_H

#include <stddef.h>
#include <stdint.h>

#include "num/ggml_exact.h"

/* out[i] = dot(row i [0, n), y [0, n)) for i < count, in tinyBLAS order (tb != 0) or
 * ggml_vec_dot_f16 order, bit-identical to mk_gx_dot_f16_n(isa, tb, n, <row i contiguous>, ...).
 * Invalid seg_len (see above), or tb with n not a multiple of the lane count (or MK_GX_SCALAR):
 * out is NaN. */
void mk_gx_dot_f16_paged(mk_gx_isa isa, int tb, int n, const uint16_t *const *seg, int seg_len, size_t row_stride,
                         int count, const uint16_t *y, float *out);

#endif
