/* sched.h — the step scheduler of continuous batching: which requests run this step, with how many
 * tokens each, over which KV blocks.
 *
 * Policy (vLLM V1's, see ../shared/docs/serving.md):
 *   1. Running requests first, in admission order: a decoding request gets its 1 token, a request
 *      still in prefill gets its next chunk, capped by long_prefill_token_threshold (so one long
 *      prompt cannot stall everyone's decode) and by the token budget left
 *      (max_num_batched_tokens). Blocks for the new positions are allocated from the pool; when the
 *      pool is out, the most recently admitted running request is preempted (its blocks released,
 *      recomputed from scratch later: it goes back to the front of the waiting queue) until the
 *      allocation succeeds or the request itself would be the victim.
 *   2. Then waiting requests, in priority order (lower first, then arrival), while fewer than
 *      max_num_seqs run and budget is left: a prefix-cache lookup finds the longest run of cached
 *      full blocks of the prompt (and, for a prompt tail shorter than a block, a cached partial
 *      block, which is copied: copy-on-write) and the first chunk of the rest is scheduled. A
 *      request is admitted only when its chunk's blocks can be allocated without preempting.
 *   At least one token of the prompt is always recomputed (the step needs logits); a family
 *   whose cache cannot be fully restored from blocks would recompute `replay` more tokens before
 *   the hit boundary, and one that restores only at block ends (DeepSeek-V4: window and
 *   compressor snapshots) sets no_partial_hits.
 *
 * Prefix-cache keys cover a request's tokens (prompt, then generated) block by block; a block is
 * registered when its tokens are all computed (full blocks) and, when a prefill completes, its
 * last partial block too, so short prompts get hits. cache_salt goes into the first block's key.
 *
 * The scheduler owns the block tables; the engine owns everything else about a request. Not
 * thread-safe: the engine thread only.
 */
#ifndef MK_ENGINE_SCHED_H
#define MK_ENGINE_SCHED_H

#include <stdint.h>

#include "kv/kv.h"

typedef struct {
    int max_num_seqs;                /* requests running at once */
    int max_num_batched_tokens;      /* tokens per step, all requests together */
    int long_prefill_token_threshold; /* prefill tokens per request per step (0 = no cap) */
    int replay;                      /* tokens recomputed before a prefix-cache hit boundary */
    int prefix_caching;              /* 0 disables lookups and registration */
    int no_partial_hits;             /* only whole cached blocks are hits: no copy-on-write of a
                                      * partially matching block, no registration of partial
                                      * blocks (DeepSeek-V4: its slot state is restorable only at
                                      * block ends) */
} mk_sched_opts;

typedef enum { MK_SR_WAITING = 0, MK_SR_RUNNING, MK_SR_DONE } mk_sr_state;

/* The scheduler's view of one request. The engine fills tokens/n_tokens (prompt, then each
 * accepted token), priority, arrival, salt; the scheduler keeps the rest. */
typedef struct mk_sreq {
    int32_t *tokens;   /* [cap_tokens]: prompt then generated */
    int n_tokens, cap_tokens;
    int n_prompt;
    int priority;
    uint64_t arrival;
    uint64_t salt;     /* mk_kv_hash_bytes(cache_salt) or 0 */
    void *owner;       /* the engine's request */
    /* scheduler state */
    mk_sr_state state;
    int n_computed;    /* tokens whose KV is in the blocks */
    int *blocks;       /* [cap_blocks] block table */
    int n_blocks, cap_blocks;
    uint64_t *keys;    /* [cap_blocks] prefix key of each full block (chain) */
    int n_registered;  /* full blocks registered so far */
    int n_cached;      /* prompt tokens found in the prefix cache at the last admission */
    int n_preempted;
    struct mk_sreq *next; /* list links (waiting / running), scheduler-owned */
} mk_sreq;

/* One scheduled piece of work: tokens[start, start + n) of req, in req's block table.
 * copy_from >= 0: before running, copy that block's contents into req->blocks[copy_to]
 * (a partial prefix hit, copy-on-write). logits: the step must produce logits for the last
 * token (the request's computed tokens reach n_tokens). */
typedef struct {
    mk_sreq *req;
    int start, n;
    int logits;
    int copy_from, copy_to;
    int failed;        /* set by the caller before mk_sched_commit: the forward of this piece
                          failed, so its blocks hold nothing to register (the request is ended) */
} mk_sched_item;

typedef struct mk_sched mk_sched;

int mk_sched_create(const mk_sched_opts *o, mk_kv_pool *pool, mk_sched **out, mk_err *err);
void mk_sched_free(mk_sched *s);

/* Allocates the per-request tables for up to cap_tokens tokens; state = waiting. */
int mk_sreq_init(mk_sreq *r, int cap_tokens, int block_tokens, mk_err *err);
void mk_sreq_release(mk_sreq *r);

/* Queue a waiting request (priority, then arrival order). */
void mk_sched_add(mk_sched *s, mk_sreq *r);
/* Remove a request in any state (finished, cancelled): its blocks are released last-to-first. */
void mk_sched_remove(mk_sched *s, mk_sreq *r);

/* Plans one step into items[cap] (returns the count). Preempted requests are appended to
 * preempted[*n_preempted] (they are waiting again; the engine resets their model state). */
int mk_sched_step(mk_sched *s, mk_sched_item *items, int cap, mk_sreq **preempted, int *n_preempted);
/* After the step ran: items' tokens are computed; newly full blocks (and, at the end of a
 * prefill, the partial last block) are registered in the prefix cache. Items marked failed are
 * not: their tokens stay uncomputed and nothing of theirs enters the cache. */
void mk_sched_commit(mk_sched *s, const mk_sched_item *items, int n);
/* Appends an accepted token to a running request (the next step will decode it). */
void mk_sched_append(mk_sched *s, mk_sreq *r, int32_t token);

typedef struct {
    int running, waiting;
    uint64_t prefix_queries, prefix_hits; /* in tokens, like vLLM's counters */
    uint64_t preemptions;
} mk_sched_stats;
void mk_sched_stats_get(const mk_sched *s, mk_sched_stats *st);

/* Block invariant over the pool and every request's table (mk_kv_check with exact counts). */
int mk_sched_check(const mk_sched *s, mk_err *err);

#endif
