/* kv.h — the paged KV block pool: fixed-size blocks carved from one allocation, reference counts,
 * a prefix-cache index of full (and partial) blocks keyed by a hash chain, an LRU list of cached
 * blocks nobody uses, and an invariant checker.
 *
 * The pool knows nothing about what a block holds: a model's cache (llama: K and V rows of every
 * layer; DeepSeek-V4: the compressed entries of every layer for the block's token span) asks for
 * bytes_per_block at create and addresses a block's memory with mk_kv_block_data. One logical
 * block covers the same span of block_tokens token positions in every layer and every group of a
 * hybrid cache, so a sequence has one block table.
 *
 * Life of a block (exactly one of these at any time; mk_kv_check verifies it):
 *   free      on the free list, no contents, refs 0
 *   owned     refs > 0: in the block tables of that many sequences (shared prefix blocks have > 1)
 *   cached    refs 0 but registered in the prefix index: on the LRU list, reusable by a lookup
 *             until evicted. Allocation takes free blocks first, then evicts the LRU head.
 * A sequence that ends releases its blocks last-to-first, so its tail blocks reach the LRU first
 * and are evicted first (vLLM's policy: the shared head of a prompt lives longest).
 *
 * Prefix keys: key(block i) = H(key(block i-1), the block's token ids, extra) where extra carries
 * anything that changes the contents for the same tokens (the request's cache_salt goes into the
 * first block's extra, so tenants with different salts never share). The index stores each
 * registered block's parent key and token ids and compares them on lookup, so a 64-bit hash
 * collision can never return wrong contents. A block registered with fewer than block_tokens
 * tokens is a partial block. Any registered block can also serve a prompt that shares only the
 * beginning of its span (mk_kv_lookup_partial): the caller copies it (copy-on-write) and appends.
 *
 * Not thread-safe: owned by the engine thread.
 */
#ifndef MK_KV_KV_H
#define MK_KV_KV_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct mk_kv_pool mk_kv_pool;

int mk_kv_pool_create(int n_blocks, int block_tokens, size_t bytes_per_block, mk_kv_pool **out, mk_err *err);
void mk_kv_pool_free(mk_kv_pool *p);

int mk_kv_n_blocks(const mk_kv_pool *p);
int mk_kv_block_tokens(const mk_kv_pool *p);
void *mk_kv_block_data(mk_kv_pool *p, int block);

/* A block for a sequence (refs = 1): a free one, else the least recently used cached one (its
 * index entry is dropped). -1 when every block is owned. */
int mk_kv_alloc(mk_kv_pool *p);
/* Blocks that mk_kv_alloc could return now (free + cached). */
int mk_kv_n_available(const mk_kv_pool *p);
void mk_kv_ref(mk_kv_pool *p, int block);
/* Drops one reference; at 0 the block becomes cached (if registered) at the LRU tail, else free. */
void mk_kv_unref(mk_kv_pool *p, int block);

/* Key of a block from its parent's key (0 for the first block), its token ids and extra. */
uint64_t mk_kv_key(uint64_t parent, const int32_t *tokens, int n, uint64_t extra);
/* 64-bit hash of a byte string (for cache_salt -> extra). */
uint64_t mk_kv_hash_bytes(const void *data, size_t n);

/* Registers an owned block under (parent, tokens[0, n), extra); n <= block_tokens. A block
 * already registered under the same key keeps the older entry (returns 0, nothing changes).
 * Returns 1 when registered. */
int mk_kv_register(mk_kv_pool *p, int block, uint64_t parent, const int32_t *tokens, int n, uint64_t extra);
/* Finds the full block after `parent` holding exactly tokens[0, block_tokens) under extra; on a
 * hit the block gains a reference (leaving the LRU if it was cached). -1 on a miss. */
int mk_kv_lookup_full(mk_kv_pool *p, uint64_t parent, const int32_t *tokens, uint64_t extra);
/* The registered block (partial or full) after `parent` under extra that shares the longest common
 * prefix with tokens[0, n) (n < block_tokens allowed): a block's first c positions depend only on
 * its first c tokens, so those positions can be reused. On a hit *matched = c >= 1 and the block
 * gains a reference; the caller copies what it needs (copy-on-write). -1 on a miss. */
int mk_kv_lookup_partial(mk_kv_pool *p, uint64_t parent, const int32_t *tokens, int n, uint64_t extra,
                         int *matched);

typedef struct {
    int n_blocks, n_free, n_cached, n_owned;
    uint64_t evictions;
} mk_kv_stats;
void mk_kv_stats_get(const mk_kv_pool *p, mk_kv_stats *st);

/* Invariant: every block is exactly one of free / owned / cached; the free and LRU lists hold
 * exactly the free and cached blocks; the index holds exactly the registered blocks. When
 * expected_refs is given ([n_blocks], the references the caller's block tables hold), each
 * block's count must equal it. MK_EINTERNAL with the first violation described. */
int mk_kv_check(const mk_kv_pool *p, const int *expected_refs, mk_err *err);

#endif
