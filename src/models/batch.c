/* batch.c — mk_kvcache and mk_model_forward_batch (batch.h).
 *
 * Llama family: paged. The pool's blocks hold K and V^T of every layer (llama.h has the layout);
 * a step copies the blocks of partial prefix hits (copy-on-write), then runs every piece in one
 * llama_forward call (rows of all pieces concatenated, attention over each piece's block table).
 * Pool size: kv_bytes / bytes per block, or with kv_bytes = 0 room for n_slots full-length
 * sequences capped at LLAMA_KV_DEFAULT_CAP bytes, and never less than one full-length sequence.
 *
 * DeepSeek-V4: paged hybrid KV (dsv4_kv_layout, dsv4.h; src/kv/README.md). The pool's blocks hold
 * every layer's compressed entries of their 256 positions plus the slot-state snapshot at their
 * end; each slot is a paged dsv4_seq (window rings, compressor state, scratch) bound to the
 * piece's block table for the call. A request's first piece in a slot starts it afresh (start 0)
 * or restores it from the snapshot of the last prefix-hit block; then all pieces of the step run
 * as one dsv4_forward_batch (rows of all pieces concatenated through every linear and routed
 * expert: each weight matrix read once per step; attention, compressors and window per piece),
 * which computes for each piece exactly what its request alone through mk_seq computes. Pool
 * size as for llama.
 *
 * DeepSeek-V4 on the GPU (MK_WITH_CUDA builds, a model loaded with MK_DEVICE_CUDA): the blocks
 * live in a dsv4_cuda_pool (device memory, the same layout) and the host mk_kv_pool keeps only
 * their accounting (no host data); each slot is a paged dsv4_cuda_seq; a step is one
 * dsv4_cuda_forward_batch over one dsv4_cuda_work sized for the engine's token budget (max_rows)
 * and n_slots pieces. The rounds, the preparation of a piece (bind, start afresh / restore /
 * position check) and the fallback are the CPU's, through the slot operations (dsv4_slot_ops)
 * of either device. Default pool: room for n_slots full-length sequences, not capped (the
 * device's memory is the limit: a pool that does not fit fails naming its size).
 */
#include "models/batch.h"
#include "base/status.h"
#include "models/dsv4.h"
#include "models/llama.h"
#include "models/model.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define LLAMA_KV_BLOCK_TOKENS 32
#define LLAMA_KV_DEFAULT_CAP ((size_t)512 << 20)
#define DSV4_STEP_MAX 256 /* pieces per batched forward (more run in further rounds) */

typedef struct dsv4_slot_ops dsv4_slot_ops;

struct mk_kvcache {
    mk_model *m;
    mk_kvcache_caps caps;
    mk_kv_pool *pool;    /* blocks and their accounting (no data on the GPU) */
    /* paged (deepseek_v4) */
    dsv4_model *dm;
    const dsv4_slot_ops *ops; /* the slots' device: CPU or GPU */
    dsv4_seq **dseqs;    /* [n_slots] CPU */
    uint8_t *kv_base;
    dsv4_cuda *g;        /* GPU: the uploaded model, */
    dsv4_cuda_pool *gpool;      /* the blocks' data, */
    dsv4_cuda_work *gwork;      /* the step scratch */
    dsv4_cuda_seq **gseqs;      /* [n_slots] */
    /* paged (llama) */
    llama_model *lm;
    llama_work *work;
    llama_piece *pieces; /* [n_slots] */
    int *which;          /* [n_slots] the item of each piece */
    size_t bpb;          /* bytes per block */
    /* steps launched (mk_model_batch_launch) and not waited for, oldest first: the GPU's still
     * queued (gpu), or the status of one that ran at its launch */
    struct { int gpu, rc; } pend[2]; /* gpu: 1 queued, 2 queued and waited for (rc) */
    int n_pend;
    int32_t *pick;       /* [n_slots] CPU: each slot's token picked in the last launched step (feed), */
    char *pick_ok;       /* and whether it has one */
};

/* What a DeepSeek-V4 cache does with its slots, on the CPU (paged dsv4_seq) or the GPU (paged
 * dsv4_cuda_seq): the rounds of forward_dsv4 and prep_dsv4_piece are written once over these. */
struct dsv4_slot_ops {
    int (*bind)(mk_kvcache *c, int slot, const int *blocks, int n_blocks, mk_err *err);
    int (*reset)(mk_kvcache *c, int slot, mk_err *err);
    int (*restore)(mk_kvcache *c, int slot, int pos, mk_err *err);
    int (*pos)(const mk_kvcache *c, int slot);
    /* one batched forward over np pieces on distinct slots (draws[k]: piece k's draw, or NULL) */
    int (*forward)(mk_kvcache *c, const int *slots, const int32_t *const *tokens, const int *n, float *const *logits,
                   int32_t *const *argmax, const mk_sample_draw *const *draws, int np, mk_err *err);
    int writes_argmax; /* forward writes the argmax (or the draw) of pieces that ask for it (else only logits) */
};

static int cpu_bind(mk_kvcache *c, int slot, const int *blocks, int n_blocks, mk_err *err) {
    (void)err;
    dsv4_seq_bind(c->dseqs[slot], c->kv_base, blocks, n_blocks);
    return MK_OK;
}
static int cpu_reset(mk_kvcache *c, int slot, mk_err *err) {
    (void)err;
    dsv4_seq_reset(c->dseqs[slot]);
    return MK_OK;
}
static int cpu_restore(mk_kvcache *c, int slot, int pos, mk_err *err) { return dsv4_seq_restore(c->dseqs[slot], pos, err); }
static int cpu_pos(const mk_kvcache *c, int slot) { return dsv4_seq_pos(c->dseqs[slot]); }
static int cpu_forward(mk_kvcache *c, const int *slots, const int32_t *const *tokens, const int *n, float *const *logits,
                       int32_t *const *argmax, const mk_sample_draw *const *draws, int np, mk_err *err) {
    (void)argmax, (void)draws; /* the CPU fills the logits; the sampler takes the token there */
    dsv4_seq *seqs[DSV4_STEP_MAX];
    for (int k = 0; k < np; k++) seqs[k] = c->dseqs[slots[k]];
    return dsv4_forward_batch(seqs, tokens, n, logits, np, err);
}
static const dsv4_slot_ops CPU_OPS = {cpu_bind, cpu_reset, cpu_restore, cpu_pos, cpu_forward, 0};

#ifdef MK_WITH_CUDA
static int gpu_bind(mk_kvcache *c, int slot, const int *blocks, int n_blocks, mk_err *err) {
    return dsv4_cuda_seq_bind(c->gseqs[slot], blocks, n_blocks, err);
}
static int gpu_reset(mk_kvcache *c, int slot, mk_err *err) { return dsv4_cuda_seq_reset(c->gseqs[slot], err); }
static int gpu_restore(mk_kvcache *c, int slot, int pos, mk_err *err) { return dsv4_cuda_seq_restore(c->gseqs[slot], pos, err); }
static int gpu_pos(const mk_kvcache *c, int slot) { return dsv4_cuda_seq_pos(c->gseqs[slot]); }
static int gpu_forward(mk_kvcache *c, const int *slots, const int32_t *const *tokens, const int *n, float *const *logits,
                       int32_t *const *argmax, const mk_sample_draw *const *draws, int np, mk_err *err) {
    dsv4_cuda_seq *seqs[DSV4_STEP_MAX];
    for (int k = 0; k < np; k++) seqs[k] = c->gseqs[slots[k]];
    return dsv4_cuda_forward_batch_am(c->gwork, seqs, tokens, n, logits, argmax, draws, np, err);
}
static const dsv4_slot_ops GPU_OPS = {gpu_bind, gpu_reset, gpu_restore, gpu_pos, gpu_forward, 1};
#endif

/* Blocks of bpb bytes for the pool: kv_bytes / bpb, or with kv_bytes = 0 room for n_slots
 * full-length sequences capped at cap bytes (0 = no cap) and never less than one full-length
 * sequence. Fails naming the numbers when kv_bytes does not hold one full-length sequence. */
static int pool_blocks(const mk_kvcache_caps *caps, int bt, size_t bpb, size_t kv_bytes, size_t cap, int *out, mk_err *err) {
    const long per_seq = (caps->max_model_len + bt - 1) / bt;
    long n;
    if (kv_bytes == 0) {
        n = per_seq * caps->n_slots;
        if (cap && n > (long)(cap / bpb)) n = (long)(cap / bpb);
        if (n < per_seq) n = per_seq;
        if (n > INT_MAX)
            return mk_fail(err, MK_ERANGE, "kv cache: %d sequences of %d tokens need %ld blocks (more than %d)", caps->n_slots,
                           caps->max_model_len, n, INT_MAX);
    } else {
        size_t nb = kv_bytes / bpb;
        n = nb > INT_MAX ? INT_MAX : (long)nb;
        if (n < per_seq)
            return mk_fail(err, MK_EINVAL,
                           "kv cache: kv_bytes %zu holds %ld blocks of %d tokens (%zu bytes each); one sequence of "
                           "max_model_len %d needs %ld blocks (%zu bytes)",
                           kv_bytes, n, bt, bpb, caps->max_model_len, per_seq, (size_t)per_seq * bpb);
    }
    *out = (int)n;
    return MK_OK;
}

static int create_paged(mk_kvcache *c, size_t kv_bytes, mk_err *err) {
    const int bt = LLAMA_KV_BLOCK_TOKENS, n_slots = c->caps.n_slots, len = c->caps.max_model_len;
    if (len > llama_model_context(c->lm))
        return mk_fail(err, MK_ERANGE, "kv cache: max_model_len %d exceeds the model's context %d", len,
                       llama_model_context(c->lm));
    c->bpb = llama_block_bytes(c->lm, bt);
    int rc = pool_blocks(&c->caps, bt, c->bpb, kv_bytes, LLAMA_KV_DEFAULT_CAP, &c->caps.n_blocks, err);
    if (rc) return rc;
    c->caps.block_tokens = bt;
    c->caps.block_bytes = c->bpb;
    c->caps.prefix_caching = 1;
    c->caps.partial_hits = 1;
    c->caps.chunked_prefill = 1;
    c->caps.replay = 0;
    if ((rc = mk_kv_pool_create(c->caps.n_blocks, bt, c->bpb, &c->pool, err))) return rc;
    if ((rc = llama_work_create(c->lm, len, &c->work, err))) return rc;
    c->pieces = malloc(sizeof *c->pieces * (size_t)n_slots);
    c->which = malloc(sizeof *c->which * (size_t)n_slots);
    if (!c->pieces || !c->which) return mk_fail(err, MK_ENOMEM, "out of memory");
    c->caps.bytes = (size_t)c->caps.n_blocks * c->bpb + llama_work_bytes(c->work);
    return MK_OK;
}

/* What both devices share for DeepSeek-V4: the length check, the block layout, the caps. */
static int dsv4_caps(mk_kvcache *c, dsv4_kv_layout *lay, mk_err *err) {
    const int len = c->caps.max_model_len;
    if (len > c->dm->max_seq_len)
        return mk_fail(err, MK_ERANGE, "kv cache: max_model_len %d exceeds the model's context %d", len, c->dm->max_seq_len);
    int rc = dsv4_kv_layout_init(c->dm, 1, lay, err);
    if (rc) return rc;
    c->bpb = lay->bytes;
    c->caps.block_tokens = lay->block_tokens;
    c->caps.block_bytes = lay->bytes;
    c->caps.prefix_caching = 1;
    c->caps.partial_hits = 0; /* the slot state is restorable at block ends only */
    c->caps.chunked_prefill = 1;
    c->caps.replay = 0;
    return MK_OK;
}

static int create_dsv4(mk_kvcache *c, size_t kv_bytes, mk_err *err) {
    const int n_slots = c->caps.n_slots, len = c->caps.max_model_len;
    dsv4_kv_layout lay;
    int rc = dsv4_caps(c, &lay, err);
    if (rc) return rc;
    if ((rc = pool_blocks(&c->caps, lay.block_tokens, c->bpb, kv_bytes, LLAMA_KV_DEFAULT_CAP, &c->caps.n_blocks, err))) return rc;
    if ((rc = mk_kv_pool_create(c->caps.n_blocks, lay.block_tokens, c->bpb, &c->pool, err))) return rc;
    c->ops = &CPU_OPS;
    c->caps.picks = c->ops->writes_argmax;
    c->kv_base = mk_kv_block_data(c->pool, 0);
    c->dseqs = calloc((size_t)n_slots, sizeof *c->dseqs);
    if (!c->dseqs) return mk_fail(err, MK_ENOMEM, "out of memory");
    c->caps.bytes = (size_t)c->caps.n_blocks * c->bpb;
    for (int i = 0; i < n_slots; i++) {
        if ((rc = dsv4_seq_create_paged(c->dm, len, &lay, &c->dseqs[i], err))) {
            mk_err_prefix(err, "kv cache: slot %d of %d (max_model_len %d)", i, n_slots, len);
            return rc;
        }
        c->caps.bytes += sizeof(float) * (c->dseqs[i]->arena_floats + c->dseqs[i]->scratch_floats);
    }
    return MK_OK;
}

#ifdef MK_WITH_CUDA
/* The GPU twin of create_dsv4: the accounting pool on the host, the blocks, the step scratch and
 * the slots on the device. Nothing is capped: a pool the device cannot hold fails naming it. */
static int create_dsv4_cuda(mk_kvcache *c, size_t kv_bytes, int max_rows, mk_err *err) {
    const int n_slots = c->caps.n_slots, len = c->caps.max_model_len;
    /* The engine calls the forward from its own thread, whose current CUDA device is 0 (the
     * device is per thread and nothing selects it there yet): refuse other devices clearly. */
    const int dev = mk_cuda_ctx_caps(mk_model_cuda_ctx(c->m))->device;
    if (dev != 0)
        return mk_fail(err, MK_ENOTSUP,
                       "kv cache on the GPU: the engine runs on CUDA device 0 only for now (device %d asked); "
                       "select the GPU with CUDA_VISIBLE_DEVICES=%d instead",
                       dev, dev);
    dsv4_kv_layout lay;
    int rc = dsv4_caps(c, &lay, err);
    if (rc) return rc;
    const int bt = lay.block_tokens;
    if ((rc = pool_blocks(&c->caps, bt, c->bpb, kv_bytes, 0, &c->caps.n_blocks, err))) return rc;
    const int nb = c->caps.n_blocks;
    if ((rc = mk_kv_pool_create(nb, bt, 0 /* no host data */, &c->pool, err))) return rc;
    c->ops = &GPU_OPS;
    c->caps.picks = c->ops->writes_argmax;
    if ((rc = dsv4_cuda_pool_create(c->g, nb, &c->gpool, err))) {
        mk_err_prefix(err, "kv cache on the GPU: a pool of %d blocks of %d tokens (%.2f GiB, %s; if the device's memory "
                      "is short: lower --max-num-seqs or --max-model-len, or set --kv-cache-memory-bytes)",
                      nb, bt, (double)nb * (double)c->bpb / (1u << 30),
                      kv_bytes ? "from kv_bytes" : "room for every slot at max_model_len");
        return rc;
    }
    c->bpb = c->caps.block_bytes = dsv4_cuda_pool_block_bytes(c->gpool);
    if (max_rows <= 0) max_rows = len > 2048 ? len : 2048;
    if ((rc = dsv4_cuda_work_create(c->g, max_rows, n_slots, len, &c->gwork, err))) {
        mk_err_prefix(err, "kv cache on the GPU: the step scratch (%d tokens, %d pieces, max_model_len %d)", max_rows,
                      n_slots, len);
        return rc;
    }
    c->caps.bytes = (size_t)nb * c->bpb + dsv4_cuda_work_bytes(c->gwork);
    c->gseqs = calloc((size_t)n_slots, sizeof *c->gseqs);
    if (!c->gseqs) return mk_fail(err, MK_ENOMEM, "out of memory");
    for (int i = 0; i < n_slots; i++) {
        if ((rc = dsv4_cuda_seq_create_paged(c->g, len, c->gpool, &c->gseqs[i], err))) {
            mk_err_prefix(err, "kv cache on the GPU: slot %d of %d (max_model_len %d)", i, n_slots, len);
            return rc;
        }
        c->caps.bytes += dsv4_cuda_seq_bytes(c->gseqs[i]);
    }
    mk_log(MK_LOG_INFO, "kv cache on the GPU: %d blocks of %d tokens (%zu bytes each), %d slots, step scratch for %d tokens; %.2f GiB in all",
           nb, bt, c->bpb, n_slots, max_rows, (double)c->caps.bytes / (1u << 30));
    return MK_OK;
}
#endif

int mk_kvcache_create(mk_model *m, const mk_kvcache_options *o, mk_kvcache **out, mk_err *err) {
    *out = NULL;
    if (o->n_slots < 1) return mk_fail(err, MK_EINVAL, "kv cache: need at least one slot, got %d", o->n_slots);
    if (o->max_model_len < 1) return mk_fail(err, MK_EINVAL, "kv cache: max_model_len must be >= 1, got %d", o->max_model_len);
    if (o->max_rows < 0) return mk_fail(err, MK_EINVAL, "kv cache: max_rows must be >= 0, got %d", o->max_rows);
    mk_kvcache *c = calloc(1, sizeof *c);
    if (!c) return mk_fail(err, MK_ENOMEM, "out of memory");
    c->m = m;
    c->caps.n_slots = o->n_slots;
    c->caps.max_model_len = o->max_model_len;
    c->lm = mk_model_llama(m);
    c->dm = mk_model_dsv4(m);
    c->g = mk_model_dsv4_cuda(m);
    int rc;
    if (c->g) {
#ifdef MK_WITH_CUDA
        rc = create_dsv4_cuda(c, o->kv_bytes, o->max_rows, err);
#else
        rc = mk_fail(err, MK_EINTERNAL, "kv cache: a GPU model in a build without the CUDA backend");
#endif
    } else {
        rc = c->lm   ? create_paged(c, o->kv_bytes, err)
             : c->dm ? create_dsv4(c, o->kv_bytes, err)
                     : mk_fail(err, MK_ENOTSUP, "kv cache: unknown model family");
    }
    c->caps.async = c->g != NULL;
    c->pick = calloc((size_t)o->n_slots, sizeof *c->pick);
    c->pick_ok = calloc((size_t)o->n_slots, 1);
    if (!rc && (!c->pick || !c->pick_ok)) rc = mk_fail(err, MK_ENOMEM, "out of memory");
    if (rc) {
        mk_kvcache_free(c);
        return rc;
    }
    *out = c;
    return MK_OK;
}

float *mk_kvcache_host_floats(mk_kvcache *c, size_t n) {
#ifdef MK_WITH_CUDA
    if (c && c->g) {
        void *p = NULL;
        mk_err e = {0};
        return mk_cuda_host_alloc(sizeof(float) * n, &p, &e) ? NULL : p;
    }
#endif
    (void)c;
    return malloc(sizeof(float) * (n ? n : 1));
}

void mk_kvcache_host_free(mk_kvcache *c, float *p) {
#ifdef MK_WITH_CUDA
    if (c && c->g) {
        mk_cuda_host_free(p);
        return;
    }
#endif
    (void)c;
    free(p);
}

void mk_kvcache_free(mk_kvcache *c) {
    if (!c) return;
    if (c->dseqs)
        for (int i = 0; i < c->caps.n_slots; i++) dsv4_seq_free(c->dseqs[i]);
    free(c->dseqs);
#ifdef MK_WITH_CUDA
    if (c->gseqs)
        for (int i = 0; i < c->caps.n_slots; i++) dsv4_cuda_seq_free(c->gseqs[i]);
    dsv4_cuda_work_free(c->gwork);
    dsv4_cuda_pool_free(c->gpool);
#endif
    free(c->gseqs);
    free(c->pick);
    free(c->pick_ok);
    llama_work_free(c->work);
    free(c->pieces);
    free(c->which);
    mk_kv_pool_free(c->pool);
    free(c);
}

void mk_kvcache_caps_get(const mk_kvcache *c, mk_kvcache_caps *caps) { *caps = c->caps; }
mk_kv_pool *mk_kvcache_pool(mk_kvcache *c) { return c->pool; }

/* Paged step: copies, checks, then one llama_forward over every valid piece. */
static int forward_paged(mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    int last = MK_OK, np = 0;
    const int nb = mk_kv_n_blocks(c->pool);
    /* copy-on-write of partial prefix hits first: a source may be written by its owner's piece */
    for (int i = 0; i < n; i++) {
        mk_batch_item *it = &items[i];
        it->status = MK_OK;
        if (it->copy_from < 0) continue;
        if (it->copy_from >= nb || it->copy_to < 0 || it->copy_to >= it->n_blocks || it->blocks[it->copy_to] < 0 ||
            it->blocks[it->copy_to] >= nb) {
            last = it->status = mk_fail(err, MK_EINTERNAL, "batch: copy of block %d into table entry %d (of %d) is invalid",
                                        it->copy_from, it->copy_to, it->n_blocks);
            continue;
        }
        memcpy(mk_kv_block_data(c->pool, it->blocks[it->copy_to]), mk_kv_block_data(c->pool, it->copy_from), c->bpb);
    }
    for (int i = 0; i < n; i++) {
        mk_batch_item *it = &items[i];
        if (it->status) continue;
        if (np >= c->caps.n_slots) {
            last = it->status = mk_fail(err, MK_EINTERNAL, "batch: more than %d pieces in a step", c->caps.n_slots);
            continue;
        }
        llama_piece *p = &c->pieces[np];
        *p = (llama_piece){.tokens = it->tokens, .pos = it->start, .n = it->n, .blocks = it->blocks,
                           .n_blocks = it->n_blocks, .ub_lo = 0, .ub_hi = it->n_prompt, .logits = it->logits};
        if ((it->status = llama_piece_check(c->lm, c->work, c->pool, p, err))) {
            last = it->status;
            continue;
        }
        c->which[np++] = i;
    }
    if (np) {
        int rc = llama_forward(c->lm, c->work, c->pool, c->pieces, np, err);
        if (rc) {
            for (int k = 0; k < np; k++) items[c->which[k]].status = rc;
            last = rc;
        }
    }
    return last;
}

/* Readies one DeepSeek-V4 piece: the slot bound to the piece's block table, started afresh /
 * restored for the request's first piece in the slot. */
static int prep_dsv4_piece(mk_kvcache *c, mk_batch_item *it, mk_err *err) {
    const int bt = c->caps.block_tokens, nb = mk_kv_n_blocks(c->pool);
    if (it->slot < 0 || it->slot >= c->caps.n_slots)
        return mk_fail(err, MK_EINTERNAL, "batch: slot %d outside [0, %d)", it->slot, c->caps.n_slots);
    if (it->copy_from >= 0)
        return mk_fail(err, MK_EINTERNAL, "batch: a partial prefix hit (copy of block %d) cannot restore a DeepSeek-V4 slot",
                       it->copy_from);
    if (it->n < 1 || it->start < 0 || (long)it->n_blocks * bt < (long)it->start + it->n)
        return mk_fail(err, MK_EINTERNAL, "batch: piece [%d, %d) is not covered by its %d blocks", it->start,
                       it->start + it->n, it->n_blocks);
    for (int b = 0; b < it->n_blocks; b++)
        if (it->blocks[b] < 0 || it->blocks[b] >= nb)
            return mk_fail(err, MK_EINTERNAL, "batch: block table entry %d is %d (pool of %d)", b, it->blocks[b], nb);
    const dsv4_slot_ops *ops = c->ops;
    int rc = ops->bind(c, it->slot, it->blocks, it->n_blocks, err);
    if (rc) return rc;
    if (it->fresh || it->start == 0) {
        if (it->start == 0) return ops->reset(c, it->slot, err);
        return ops->restore(c, it->slot, it->start, err);
    }
    if (ops->pos(c, it->slot) != it->start)
        return mk_fail(err, MK_EINTERNAL, "batch: slot %d is at position %d, the piece starts at %d", it->slot,
                       ops->pos(c, it->slot), it->start);
    return MK_OK;
}

/* All pieces of a step, in rounds of at most one piece per slot (a slot named twice runs its
 * pieces in order): each round is one batched forward of the pieces that got ready. If that
 * fails (a check or an allocation, before any state changed), each piece runs alone so that only
 * the failing ones are marked. A GPU call that fails after its checks marks its sequences broken,
 * so their lone re-runs fail too rather than continue from a half-updated state. */
static int forward_dsv4(mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    int last = MK_OK, left = n;
    char done[DSV4_STEP_MAX];
    const int32_t *toks[DSV4_STEP_MAX];
    int cnt[DSV4_STEP_MAX], which[DSV4_STEP_MAX], slots[DSV4_STEP_MAX];
    float *lg[DSV4_STEP_MAX];
    int32_t *am[DSV4_STEP_MAX];
    const mk_sample_draw *dr[DSV4_STEP_MAX];
    for (int i0 = 0; i0 < n; i0 += DSV4_STEP_MAX) {
        int m = n - i0 < DSV4_STEP_MAX ? n - i0 : DSV4_STEP_MAX;
        mk_batch_item *its = items + i0;
        memset(done, 0, sizeof done);
        left = m;
        while (left > 0) {
            int np = 0;
            for (int i = 0; i < m; i++) {
                if (done[i]) continue;
                int dup = 0;
                for (int k = 0; k < np; k++) dup |= its[which[k]].slot == its[i].slot;
                for (int k = 0; k < i; k++) dup |= !done[k] && its[k].slot == its[i].slot;
                if (dup) continue; /* an earlier piece of this slot comes first */
                done[i] = 1;
                left--;
                if ((its[i].status = prep_dsv4_piece(c, &its[i], err))) {
                    last = its[i].status;
                    continue;
                }
                which[np] = i;
                slots[np] = its[i].slot;
                toks[np] = its[i].tokens;
                cnt[np] = its[i].n;
                lg[np] = its[i].logits;
                am[np] = its[i].logits && c->ops->writes_argmax ? its[i].argmax : NULL;
                dr[np] = am[np] ? its[i].draw : NULL;
                np++;
            }
            if (!np) continue;
            int rc = c->ops->forward(c, slots, toks, cnt, lg, am, dr, np, err);
            if (rc && np > 1) {
                for (int k = 0; k < np; k++) {
                    mk_batch_item *it = &its[which[k]];
                    if ((it->status = c->ops->forward(c, &slots[k], &toks[k], &cnt[k], &lg[k], &am[k], &dr[k], 1, err)))
                        last = it->status;
                    else if (am[k]) it->argmax_done = 1;
                }
            } else if (rc) {
                its[which[0]].status = last = rc;
            } else {
                for (int k = 0; k < np; k++)
                    if (am[k]) its[which[k]].argmax_done = 1;
            }
        }
    }
    return last;
}

int mk_model_forward_batch(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    (void)m;
    if (c->lm) return forward_paged(c, items, n, err);
    return forward_dsv4(c, items, n, err);
}

/* ---- asynchronous steps (mk_model_batch_launch / _wait) ------------------------------------- */

/* A DeepSeek-V4 step on the GPU queued as one call: 1 when queued, 0 when it must run as
 * forward_dsv4 does (slots named twice, too many pieces, a piece that is not ready), or the
 * failure of a launch whose pieces were ready (every piece's status set). */
#ifdef MK_WITH_CUDA
static int launch_dsv4_gpu(mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    if (n < 1 || n > DSV4_STEP_MAX) return 0;
    dsv4_cuda_seq *seqs[DSV4_STEP_MAX];
    const int32_t *toks[DSV4_STEP_MAX];
    int cnt[DSV4_STEP_MAX];
    float *lg[DSV4_STEP_MAX];
    int32_t *am[DSV4_STEP_MAX];
    const mk_sample_draw *dr[DSV4_STEP_MAX];
    char feed[DSV4_STEP_MAX];
    for (int i = 0; i < n; i++)
        for (int k = 0; k < i; k++)
            if (items[k].slot == items[i].slot) return 0;
    mk_err e0 = {0};
    for (int i = 0; i < n; i++) {
        mk_batch_item *it = &items[i];
        it->status = MK_OK;
        it->argmax_done = 0;
        if (prep_dsv4_piece(c, it, &e0)) return 0; /* forward_dsv4 marks it */
        seqs[i] = c->gseqs[it->slot];
        toks[i] = it->tokens;
        cnt[i] = it->n;
        lg[i] = it->logits;
        am[i] = it->logits ? it->argmax : NULL;
        dr[i] = am[i] ? it->draw : NULL;
        feed[i] = (char)(it->feed != 0);
    }
    int rc = dsv4_cuda_batch_launch(c->gwork, seqs, toks, cnt, lg, am, dr, feed, n, err);
    if (rc) {
        for (int i = 0; i < n; i++) items[i].status = rc;
        return rc;
    }
    return 1;
}
#endif

int mk_model_batch_launch(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    if (c->n_pend >= 2)
        return mk_fail(err, MK_EINTERNAL, "batch: a step launched while two are not waited for");
    int fed = 0, gpu = 0, rc = MK_OK;
    for (int i = 0; i < n; i++) fed |= items[i].feed != 0;
#ifdef MK_WITH_CUDA
    if (c->g) {
        int q = launch_dsv4_gpu(c, items, n, err);
        if (q == 1) gpu = 1;
        else if (q < 0) rc = q;
        else if (fed) { /* only a queued call reads the picks on the device */
            rc = mk_fail(err, MK_EINTERNAL, "batch: a step with fed pieces cannot run as one call");
            for (int i = 0; i < n; i++) items[i].status = rc;
        } else {
            /* a step of its own, after the one still queued, if any (waited for here: its results
             * are delivered by its own wait) */
            if (c->n_pend && c->pend[0].gpu == 1) {
                mk_err e1 = {0};
                c->pend[0].rc = dsv4_cuda_batch_wait(c->gwork, &e1);
                c->pend[0].gpu = 2;
            }
            rc = mk_model_forward_batch(m, c, items, n, err);
        }
    } else
#endif
    {
        for (int i = 0; i < n && !rc; i++) { /* the CPU's: the previous step's picks */
            mk_batch_item *it = &items[i];
            if (!it->feed) continue;
            if (it->slot < 0 || it->slot >= c->caps.n_slots || !c->pick_ok[it->slot] || it->n != 1)
                rc = mk_fail(err, MK_EINTERNAL, "batch: piece %d is fed from slot %d, which picked no token", i, it->slot);
            else
                it->tokens = &c->pick[it->slot];
        }
        if (rc) {
            for (int i = 0; i < n; i++) items[i].status = rc;
        } else {
            rc = mk_model_forward_batch(m, c, items, n, err);
            const int V = mk_model_vocab_size(m);
            for (int i = 0; i < n; i++) {
                mk_batch_item *it = &items[i];
                const int s = it->slot >= 0 && it->slot < c->caps.n_slots ? it->slot : -1;
                if (s >= 0) c->pick_ok[s] = 0;
                if (it->status || !it->logits || !it->argmax || it->draw || it->argmax_done) continue;
                *it->argmax = mk_sample_argmax(it->logits, V); /* the sampler's greedy rule */
                it->argmax_done = 1;
                if (s >= 0) c->pick[s] = *it->argmax < 0 ? 0 : *it->argmax, c->pick_ok[s] = 1;
            }
        }
    }
    c->pend[c->n_pend].gpu = gpu;
    c->pend[c->n_pend].rc = rc;
    c->n_pend++;
    return rc;
}

int mk_model_batch_wait(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    (void)m;
    if (!c->n_pend) return mk_fail(err, MK_EINTERNAL, "batch: no launched step to wait for");
    const int gpu = c->pend[0].gpu;
    int rc = c->pend[0].rc;
    c->pend[0] = c->pend[1];
    c->n_pend--;
#ifdef MK_WITH_CUDA
    if (gpu) {
        if (gpu == 1) rc = dsv4_cuda_batch_wait(c->gwork, err);
        else if (rc) mk_fail(err, rc, "batch: the step failed on the GPU");
        for (int i = 0; i < n; i++) {
            items[i].status = rc;
            items[i].argmax_done = !rc && items[i].logits && items[i].argmax;
        }
    }
#else
    (void)gpu, (void)items, (void)n;
#endif
    return rc;
}
