/* model.h — what the engine's batch code (batch.c) and the CLI need from an mk_model beyond the
 * public API (include/minke.h): the device a model runs on and the backend objects behind it.
 *
 * A DeepSeek-V4 model on the GPU (mk_model_options.device = MK_DEVICE_CUDA, in a build with
 * MK_WITH_CUDA) keeps its host dsv4_model (config, mmapped checkpoint: mk_model_dsv4 in dsv4.h
 * returns it, for the config and the golden tools) and adds the device context and the uploaded
 * weights (mk_model_dsv4_cuda). Its mk_seq is a standalone dsv4_cuda_seq (the CLI's generate,
 * chat and logits); the engine's sequences are paged dsv4_cuda_seqs owned by the KV cache
 * (batch.c), on the same device stream. mk_seq_dsv4 (dsv4.h) is NULL for a GPU sequence: its
 * state lives on the device; mk_seq_set_dsv4_hooks reaches either kind.
 */
#ifndef MK_MODELS_MODEL_H
#define MK_MODELS_MODEL_H

#include "minke.h"
#include "models/dsv4.h"
#include "models/dsv4_cuda.h"

/* The uploaded DeepSeek-V4 model behind m: non-NULL only for a model loaded with MK_DEVICE_CUDA
 * (which a build without MK_WITH_CUDA refuses to load). */
dsv4_cuda *mk_model_dsv4_cuda(mk_model *m);
/* Its device context (NULL where mk_model_dsv4_cuda is). */
mk_cuda_ctx *mk_model_cuda_ctx(mk_model *m);

/* Sets the debugging / golden hooks (dsv4.h; copied, NULL clears) of a DeepSeek-V4 sequence on
 * either device. The GPU honours them as dsv4_cuda.h says (decision hooks, and dumps of the mHC
 * stream "L<l>.h" only). MK_ENOTSUP for other families. */
int mk_seq_set_dsv4_hooks(mk_seq *s, const dsv4_hooks *h, mk_err *err);

#endif
