/* model.c — the public mk_model / mk_seq API (include/minke.h): picks the model family from what
 * the path holds and forwards every call to that family's implementation, on the CPU or the GPU.
 *
 *   a directory with config.json whose model_type is deepseek_v4  -> src/models/dsv4*.c
 *   a .gguf file (general.architecture llama, or Llama-like)        -> src/models/llama.c
 *
 * MK_DEVICE_CUDA (builds with MK_WITH_CUDA only: `make cuda` builds build-cuda/minke): a
 * DeepSeek-V4 checkpoint is loaded and validated exactly as for the CPU (mmapped), then its
 * weights are uploaded once (dsv4_cuda_create on a context of the chosen device); the load logs
 * one line naming the device, the bytes uploaded and the linear kernels a decode uses. A sequence
 * of a GPU model is a standalone dsv4_cuda_seq (its state in device memory); the engine's paged
 * sequences are built by batch.c from mk_model_dsv4_cuda (model.h). The CUDA backend runs
 * DeepSeek-V4 only: a GGUF with MK_DEVICE_CUDA is refused before anything is loaded.
 *
 * Family-specific tools (golden tests, `minke logits`) use the family's own API directly.
 */
#include "models/model.h"
#include "base/status.h"
#include "models/llama.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { FAM_DSV4 = 1, FAM_LLAMA = 2 };

struct mk_model {
    int family;
    int device;             /* MK_DEVICE_* */
    char device_name[320];  /* "cpu", "cuda:0 (NVIDIA H200)" */
    dsv4_model *dsv4;       /* DeepSeek-V4 (also on the GPU: config, mmapped checkpoint) */
    llama_model *llama;
    mk_cuda_ctx *cuda;      /* MK_DEVICE_CUDA: the device context ... */
    dsv4_cuda *gpu;         /* ... and the uploaded weights */
};

struct mk_seq {
    mk_model *m;
    dsv4_seq *dsv4;
    llama_seq *llama;
    dsv4_cuda_seq *gpu;
    int gpu_cap;            /* tokens the GPU sequence holds */
    int reset_rc;           /* a GPU reset failed: the next forward reports it (reset_err) */
    mk_err reset_err;
};

static int is_gguf(const char *path) {
    size_t n = strlen(path);
    struct stat st;
    return n > 5 && !strcmp(path + n - 5, ".gguf") && !stat(path, &st) && S_ISREG(st.st_mode);
}

#ifdef MK_WITH_CUDA
/* Uploads a loaded DeepSeek-V4 model to device dev and logs what runs there (one line). */
static int upload_cuda(mk_model *m, int dev, mk_err *err) {
    int rc = mk_cuda_ctx_create(dev, &m->cuda, err);
    if (rc) {
        mk_err_prefix(err, "--device cuda (device %d)", dev);
        return rc;
    }
    if ((rc = dsv4_cuda_create(m->cuda, m->dsv4, &m->gpu, err))) {
        mk_err_prefix(err, "uploading %s to the GPU", m->dsv4->dir);
        return rc;
    }
    const mk_cuda_caps *caps = mk_cuda_ctx_caps(m->cuda);
    snprintf(m->device_name, sizeof m->device_name, "cuda:%d (%s)", caps->device, caps->name);
    char desc[2048];
    mk_cuda_ctx_describe(m->cuda, desc, sizeof desc);
    char *more = strchr(desc, '\n'); /* capabilities, then kernels: one line */
    if (more) *more++ = 0;
    /* the main linear kinds of a decode step (m = 1): attention, routed and shared experts, head */
    const dsv4_layer *l0 = &m->dsv4->layers[0];
    const mk_cuda_kernel K = MK_CUDA_K_AUTO;
    mk_cuda_tuning tu;
    mk_cuda_ctx_get_tuning(m->cuda, &tu);
    fprintf(stderr,
            "minke: cuda: %s; %s; weights uploaded: %.2f GiB (%zu bytes); decode kernels (m = 1): attention "
            "wq_a %s, routed experts %s, shared expert %s, head %s; decode steps %s\n",
            desc, more ? more : "", (double)dsv4_cuda_weight_bytes(m->gpu) / (1u << 30), dsv4_cuda_weight_bytes(m->gpu),
            mk_cuda_linear_kernel_name(m->cuda, K, &l0->wq_a, 1), mk_cuda_linear_kernel_name(m->cuda, K, &l0->experts[0].w1, 1),
            mk_cuda_linear_kernel_name(m->cuda, K, &l0->shared.w1, 1), mk_cuda_linear_kernel_name(m->cuda, K, &m->dsv4->head, 1),
            tu.graphs && tu.cmp_step ? "replayed as CUDA graphs (MINKE_CUDA_GRAPHS=0: as launches)"
                                     : "as launches (CUDA graphs off by MINKE_CUDA_GRAPHS / MINKE_CUDA_CMP_STEP)");
    return MK_OK;
}
#endif

int mk_model_load(const char *path, const mk_model_options *opt, mk_model **out, mk_err *err) {
    *out = NULL;
    const int device = opt ? opt->device : MK_DEVICE_CPU;
    const int gguf = is_gguf(path);
    if (device != MK_DEVICE_CPU && device != MK_DEVICE_CUDA)
        return mk_fail(err, MK_EINVAL, "model: device %d is neither MK_DEVICE_CPU (0) nor MK_DEVICE_CUDA (1)", device);
    if (device == MK_DEVICE_CUDA) {
#ifndef MK_WITH_CUDA
        return mk_fail(err, MK_ENOTSUP, "this minke was built without the CUDA backend (build build-cuda/minke with `make cuda`)");
#else
        if (gguf)
            return mk_fail(err, MK_ENOTSUP, "%s: the CUDA backend runs DeepSeek-V4 checkpoints only; use --device cpu", path);
        if (opt->cuda_device < 0) return mk_fail(err, MK_EINVAL, "model: CUDA device index %d is negative", opt->cuda_device);
#endif
    }
    mk_model *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "out of memory");
    m->device = MK_DEVICE_CPU;
    snprintf(m->device_name, sizeof m->device_name, "cpu");
    int rc;
    if (gguf) {
        m->family = FAM_LLAMA;
        rc = llama_model_load(path, opt, &m->llama, err);
    } else {
        m->family = FAM_DSV4;
        rc = dsv4_model_load(path, opt, &m->dsv4, err);
    }
#ifdef MK_WITH_CUDA
    if (!rc && device == MK_DEVICE_CUDA) {
        m->device = MK_DEVICE_CUDA;
        rc = upload_cuda(m, opt->cuda_device, err);
    }
#endif
    if (rc) {
        mk_model_free(m);
        return rc;
    }
    *out = m;
    return MK_OK;
}

void mk_model_free(mk_model *m) {
    if (!m) return;
#ifdef MK_WITH_CUDA
    dsv4_cuda_free(m->gpu);
    mk_cuda_ctx_free(m->cuda);
#endif
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
int mk_model_device(const mk_model *m) { return m->device; }
const char *mk_model_device_name(const mk_model *m) { return m->device_name; }

int mk_seq_create(mk_model *m, int max_len, mk_seq **out, mk_err *err) {
    *out = NULL;
    mk_seq *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->m = m;
    int rc;
    if (m->gpu) {
#ifdef MK_WITH_CUDA
        s->gpu_cap = max_len > 0 ? max_len : m->dsv4->max_seq_len;
        rc = dsv4_cuda_seq_create(m->gpu, s->gpu_cap, 0, &s->gpu, err);
#else
        rc = mk_fail(err, MK_EINTERNAL, "a GPU model in a build without the CUDA backend");
#endif
    } else {
        rc = m->family == FAM_LLAMA ? llama_seq_create(m->llama, max_len, &s->llama, err)
                                    : dsv4_seq_create(m->dsv4, max_len, &s->dsv4, err);
    }
    if (rc) { free(s); return rc; }
    *out = s;
    return MK_OK;
}

void mk_seq_free(mk_seq *s) {
    if (!s) return;
#ifdef MK_WITH_CUDA
    dsv4_cuda_seq_free(s->gpu);
#endif
    dsv4_seq_free(s->dsv4);
    llama_seq_free(s->llama);
    free(s);
}

void mk_seq_reset(mk_seq *s) {
    if (s->llama) llama_seq_reset(s->llama);
    else if (s->dsv4) dsv4_seq_reset(s->dsv4);
#ifdef MK_WITH_CUDA
    /* the public reset cannot fail; a device error is kept for the next forward call */
    else s->reset_rc = dsv4_cuda_seq_reset(s->gpu, &s->reset_err);
#endif
}

int mk_seq_pos(const mk_seq *s) {
#ifdef MK_WITH_CUDA
    if (s->gpu) return dsv4_cuda_seq_pos(s->gpu);
#endif
    return s->llama ? llama_seq_pos(s->llama) : dsv4_seq_pos(s->dsv4);
}

int mk_seq_capacity(const mk_seq *s) {
    if (s->gpu) return s->gpu_cap;
    return s->llama ? llama_seq_capacity(s->llama) : dsv4_seq_capacity(s->dsv4);
}

int mk_seq_vocab_size(const mk_seq *s) { return mk_model_vocab_size(s->m); }

int mk_seq_forward(mk_seq *s, const int32_t *tokens, int n, float *logits, mk_err *err) {
#ifdef MK_WITH_CUDA
    if (s->gpu) {
        if (s->reset_rc) {
            if (err) {
                *err = s->reset_err;
                mk_err_prefix(err, "the sequence's reset on the GPU failed");
            }
            return s->reset_rc;
        }
        return dsv4_cuda_forward(s->gpu, tokens, n, logits, err);
    }
#endif
    return s->llama ? llama_seq_forward(s->llama, tokens, n, logits, err)
                    : dsv4_seq_forward(s->dsv4, tokens, n, logits, err);
}

int mk_seq_set_dsv4_hooks(mk_seq *s, const dsv4_hooks *h, mk_err *err) {
    if (s->dsv4) {
        if (h) s->dsv4->hooks = *h;
        else memset(&s->dsv4->hooks, 0, sizeof s->dsv4->hooks);
        return MK_OK;
    }
#ifdef MK_WITH_CUDA
    if (s->gpu) {
        dsv4_cuda_seq_set_hooks(s->gpu, h);
        return MK_OK;
    }
#endif
    return mk_fail(err, MK_ENOTSUP, "hooks (--dump, --force-decisions) exist for DeepSeek-V4 models only");
}

dsv4_model *mk_model_dsv4(mk_model *m) { return m->dsv4; }
dsv4_seq *mk_seq_dsv4(mk_seq *s) { return s->dsv4; }
llama_model *mk_model_llama(mk_model *m) { return m->llama; }
dsv4_cuda *mk_model_dsv4_cuda(mk_model *m) { return m->gpu; }
mk_cuda_ctx *mk_model_cuda_ctx(mk_model *m) { return m->cuda; }
