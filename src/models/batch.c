/* batch.c — mk_kvcache and mk_model_forward_batch (batch.h).
 *
 * Slot mode (every family until its paged forward lands): each slot owns an mk_seq of
 * max_model_len; a piece at start 0 resets the slot; pieces run one after another through
 * mk_seq_forward. The pool exists for the scheduler's accounting (0 bytes per block) and is sized
 * so that every slot can hold a full-length sequence, so slot mode never preempts. */
#include "models/batch.h"

#include <stdlib.h>
#include <string.h>

struct mk_kvcache {
    mk_model *m;
    mk_kvcache_caps caps;
    mk_kv_pool *pool;
    mk_seq **seqs;
};

int mk_kvcache_create(mk_model *m, int n_slots, int max_model_len, size_t kv_bytes, mk_kvcache **out, mk_err *err) {
    (void)kv_bytes;
    *out = NULL;
    if (n_slots < 1) return mk_fail(err, MK_EINVAL, "kv cache: need at least one slot, got %d", n_slots);
    if (max_model_len < 1) return mk_fail(err, MK_EINVAL, "kv cache: max_model_len must be >= 1, got %d", max_model_len);
    mk_kvcache *c = calloc(1, sizeof *c);
    if (!c) return mk_fail(err, MK_ENOMEM, "out of memory");
    c->m = m;
    int is_llama = !strcmp(mk_model_family(m), "llama");
    c->caps.block_tokens = is_llama ? 16 : 256;
    c->caps.n_slots = n_slots;
    c->caps.max_model_len = max_model_len;
    c->caps.prefix_caching = 0;
    c->caps.chunked_prefill = is_llama;
    c->caps.replay = 0;
    int per_seq = (max_model_len + c->caps.block_tokens - 1) / c->caps.block_tokens;
    c->caps.n_blocks = per_seq * n_slots;
    int rc = mk_kv_pool_create(c->caps.n_blocks, c->caps.block_tokens, 0, &c->pool, err);
    if (rc) goto fail;
    c->seqs = calloc((size_t)n_slots, sizeof *c->seqs);
    if (!c->seqs) { rc = mk_fail(err, MK_ENOMEM, "out of memory"); goto fail; }
    for (int i = 0; i < n_slots; i++) {
        if ((rc = mk_seq_create(m, max_model_len, &c->seqs[i], err))) {
            mk_err_prefix(err, "kv cache: slot %d of %d (max_model_len %d)", i, n_slots, max_model_len);
            goto fail;
        }
        if (mk_seq_capacity(c->seqs[i]) < max_model_len) {
            rc = mk_fail(err, MK_ERANGE, "kv cache: max_model_len %d exceeds the model's context %d", max_model_len,
                         mk_seq_capacity(c->seqs[i]));
            goto fail;
        }
    }
    *out = c;
    return MK_OK;
fail:
    mk_kvcache_free(c);
    return rc;
}

void mk_kvcache_free(mk_kvcache *c) {
    if (!c) return;
    if (c->seqs)
        for (int i = 0; i < c->caps.n_slots; i++) mk_seq_free(c->seqs[i]);
    free(c->seqs);
    mk_kv_pool_free(c->pool);
    free(c);
}

void mk_kvcache_caps_get(const mk_kvcache *c, mk_kvcache_caps *caps) { *caps = c->caps; }
mk_kv_pool *mk_kvcache_pool(mk_kvcache *c) { return c->pool; }

int mk_model_forward_batch(mk_model *m, mk_kvcache *c, mk_batch_item *items, int n, mk_err *err) {
    (void)m;
    int last = MK_OK;
    for (int i = 0; i < n; i++) {
        mk_batch_item *it = &items[i];
        if (it->slot < 0 || it->slot >= c->caps.n_slots) {
            last = it->status = mk_fail(err, MK_EINTERNAL, "batch: slot %d outside [0, %d)", it->slot, c->caps.n_slots);
            continue;
        }
        mk_seq *s = c->seqs[it->slot];
        if (it->start == 0) mk_seq_reset(s);
        if (mk_seq_pos(s) != it->start) {
            last = it->status = mk_fail(err, MK_EINTERNAL, "batch: slot %d is at position %d, the piece starts at %d",
                                        it->slot, mk_seq_pos(s), it->start);
            continue;
        }
        it->status = mk_seq_forward(s, it->tokens, it->n, it->logits, err);
        if (it->status) last = it->status;
    }
    return last;
}
