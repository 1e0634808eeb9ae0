/* sched.c — continuous-batching step scheduler (sched.h). */
#include "engine/sched.h"

#include <stdlib.h>
#include <string.h>

struct mk_sched {
    mk_sched_opts o;
    mk_kv_pool *pool;
    int bt;
    mk_sreq *running, *waiting; /* running: admission order; waiting: priority, then arrival */
    int n_running, n_waiting;
    mk_sched_stats st;
    int *refs; /* scratch for mk_sched_check */
};

/* The block a partial prefix hit is copied from, kept referenced until the step has copied it.
 * Stored in keys[cap_blocks] (one spare slot) to keep mk_sreq small. */
#define COW_SRC(r) ((r)->keys[(r)->cap_blocks])

int mk_sched_create(const mk_sched_opts *o, mk_kv_pool *pool, mk_sched **out, mk_err *err) {
    *out = NULL;
    if (o->max_num_seqs < 1) return mk_fail(err, MK_EINVAL, "max_num_seqs must be >= 1, got %d", o->max_num_seqs);
    if (o->max_num_batched_tokens < 1)
        return mk_fail(err, MK_EINVAL, "max_num_batched_tokens must be >= 1, got %d", o->max_num_batched_tokens);
    if (o->long_prefill_token_threshold < 0 || o->replay < 0)
        return mk_fail(err, MK_EINVAL, "long_prefill_token_threshold and replay must be >= 0");
    mk_sched *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ENOMEM, "out of memory");
    s->o = *o;
    s->pool = pool;
    s->bt = mk_kv_block_tokens(pool);
    s->refs = calloc((size_t)mk_kv_n_blocks(pool), sizeof *s->refs);
    if (!s->refs) { free(s); return mk_fail(err, MK_ENOMEM, "out of memory"); }
    *out = s;
    return MK_OK;
}

void mk_sched_free(mk_sched *s) {
    if (!s) return;
    free(s->refs);
    free(s);
}

int mk_sreq_init(mk_sreq *r, int cap_tokens, int block_tokens, mk_err *err) {
    memset(r, 0, sizeof *r);
    r->cap_tokens = cap_tokens;
    r->cap_blocks = (cap_tokens + block_tokens - 1) / block_tokens;
    r->tokens = malloc(sizeof *r->tokens * (size_t)cap_tokens);
    r->blocks = malloc(sizeof *r->blocks * (size_t)r->cap_blocks);
    r->keys = malloc(sizeof *r->keys * (size_t)(r->cap_blocks + 1));
    if (!r->tokens || !r->blocks || !r->keys) {
        mk_sreq_release(r);
        return mk_fail(err, MK_ENOMEM, "out of memory for a request of %d tokens", cap_tokens);
    }
    COW_SRC(r) = (uint64_t)-1;
    return MK_OK;
}

void mk_sreq_release(mk_sreq *r) {
    free(r->tokens);
    free(r->blocks);
    free(r->keys);
    r->tokens = NULL;
    r->blocks = NULL;
    r->keys = NULL;
}

/* ---- lists ---------------------------------------------------------------------------------- */

static void unlink_req(mk_sreq **head, mk_sreq *r) {
    for (mk_sreq **pp = head; *pp; pp = &(*pp)->next)
        if (*pp == r) { *pp = r->next; r->next = NULL; return; }
}

static void waiting_insert(mk_sched *s, mk_sreq *r, int front) {
    mk_sreq **pp = &s->waiting;
    if (!front)
        while (*pp && ((*pp)->priority < r->priority || ((*pp)->priority == r->priority && (*pp)->arrival <= r->arrival)))
            pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    r->state = MK_SR_WAITING;
    s->n_waiting++;
}

static void running_append(mk_sched *s, mk_sreq *r) {
    mk_sreq **pp = &s->running;
    while (*pp) pp = &(*pp)->next;
    r->next = NULL;
    *pp = r;
    r->state = MK_SR_RUNNING;
    s->n_running++;
}

/* ---- blocks --------------------------------------------------------------------------------- */

static void release_blocks(mk_sched *s, mk_sreq *r) {
    if (COW_SRC(r) != (uint64_t)-1) {
        mk_kv_unref(s->pool, (int)COW_SRC(r));
        COW_SRC(r) = (uint64_t)-1;
    }
    for (int i = r->n_blocks - 1; i >= 0; i--) mk_kv_unref(s->pool, r->blocks[i]); /* tail first */
    r->n_blocks = 0;
    r->n_registered = 0;
    r->n_computed = 0;
}

/* Blocks for positions [0, upto). 0 or -1 when the pool ran out (blocks got so far are kept). */
static int ensure_blocks(mk_sched *s, mk_sreq *r, int upto) {
    int need = (upto + s->bt - 1) / s->bt;
    while (r->n_blocks < need) {
        int b = mk_kv_alloc(s->pool);
        if (b < 0) return -1;
        r->blocks[r->n_blocks++] = b;
    }
    return 0;
}

static void preempt(mk_sched *s, mk_sreq *v) {
    unlink_req(&s->running, v);
    s->n_running--;
    release_blocks(s, v);
    v->n_preempted++;
    s->st.preemptions++;
    waiting_insert(s, v, 1); /* back to the front of the queue */
}

static uint64_t extra_of(const mk_sreq *r, int block) { return block == 0 ? r->salt : 0; }

/* Prefix lookup at admission: shared full blocks, then a partial block to copy. Returns the
 * number of prompt tokens found; *copy_from / *copy_to describe a pending copy-on-write. */
static int lookup_prefix(mk_sched *s, mk_sreq *r, int *copy_from, int *copy_to) {
    *copy_from = *copy_to = -1;
    int limit = r->n_tokens - 1; /* the last token is always computed: its logits are needed */
    int hit = 0;
    uint64_t parent = 0;
    while (hit + s->bt <= limit) {
        int i = r->n_blocks;
        int b = mk_kv_lookup_full(s->pool, parent, r->tokens + hit, extra_of(r, i));
        if (b < 0) break;
        r->blocks[r->n_blocks++] = b;
        parent = r->keys[i] = mk_kv_key(parent, r->tokens + hit, s->bt, extra_of(r, i));
        r->n_registered = r->n_blocks;
        hit += s->bt;
    }
    if (limit - hit > 0 && !s->o.no_partial_hits) {
        int m = 0, i = r->n_blocks;
        int b = mk_kv_lookup_partial(s->pool, parent, r->tokens + hit, limit - hit, extra_of(r, i), &m);
        if (b >= 0) {
            int nb = mk_kv_alloc(s->pool);
            if (nb < 0) {
                mk_kv_unref(s->pool, b);
            } else {
                r->blocks[r->n_blocks++] = nb;
                COW_SRC(r) = (uint64_t)b;
                *copy_from = b;
                *copy_to = i;
                hit += m;
            }
        }
    }
    return hit;
}

/* ---- public --------------------------------------------------------------------------------- */

void mk_sched_add(mk_sched *s, mk_sreq *r) {
    r->n_computed = r->n_blocks = r->n_registered = 0;
    COW_SRC(r) = (uint64_t)-1;
    waiting_insert(s, r, 0);
}

void mk_sched_remove(mk_sched *s, mk_sreq *r) {
    if (r->state == MK_SR_RUNNING) { unlink_req(&s->running, r); s->n_running--; }
    else if (r->state == MK_SR_WAITING) { unlink_req(&s->waiting, r); s->n_waiting--; }
    release_blocks(s, r);
    r->state = MK_SR_DONE;
}

int mk_sched_step(mk_sched *s, mk_sched_item *items, int cap, mk_sreq **preempted, int *n_preempted) {
    int n = 0, budget = s->o.max_num_batched_tokens, thr = s->o.long_prefill_token_threshold;
    *n_preempted = 0;
    /* 1. running requests, in admission order */
    for (mk_sreq *r = s->running, *nx; r && budget > 0 && n < cap; r = nx) {
        nx = r->next;
        int want = r->n_tokens - r->n_computed;
        if (want <= 0) continue;
        int k = want < budget ? want : budget;
        if (thr && k > thr) k = thr;
        int self_preempted = 0;
        while (ensure_blocks(s, r, r->n_computed + k)) {
            mk_sreq *v = s->running;
            while (v->next) v = v->next; /* the most recently admitted */
            if (v == nx) nx = v->next;
            preempt(s, v);
            preempted[(*n_preempted)++] = v;
            if (v == r) { self_preempted = 1; break; }
        }
        if (self_preempted) continue;
        items[n++] = (mk_sched_item){.req = r, .start = r->n_computed, .n = k,
                                     .logits = r->n_computed + k == r->n_tokens, .copy_from = -1, .copy_to = -1};
        budget -= k;
    }
    /* 2. waiting requests */
    while (s->waiting && s->n_running < s->o.max_num_seqs && budget > 0 && n < cap) {
        mk_sreq *r = s->waiting;
        int cf = -1, ct = -1, hit = 0;
        if (s->o.prefix_caching) {
            hit = lookup_prefix(s, r, &cf, &ct);
            s->st.prefix_queries += (uint64_t)r->n_tokens;
            s->st.prefix_hits += (uint64_t)hit;
        }
        r->n_cached = hit;
        r->n_computed = hit > s->o.replay ? hit - s->o.replay : 0;
        int want = r->n_tokens - r->n_computed;
        int k = want < budget ? want : budget;
        if (thr && k > thr) k = thr;
        if (ensure_blocks(s, r, r->n_computed + k)) {
            if (s->o.prefix_caching) {
                s->st.prefix_queries -= (uint64_t)r->n_tokens;
                s->st.prefix_hits -= (uint64_t)hit;
            }
            release_blocks(s, r); /* no room now: it waits (no preemption for admission) */
            break;
        }
        s->waiting = r->next;
        s->n_waiting--;
        running_append(s, r);
        items[n++] = (mk_sched_item){.req = r, .start = r->n_computed, .n = k,
                                     .logits = r->n_computed + k == r->n_tokens, .copy_from = cf, .copy_to = ct};
        budget -= k;
    }
    return n;
}

void mk_sched_commit(mk_sched *s, const mk_sched_item *items, int n) {
    for (int i = 0; i < n; i++) {
        mk_sreq *r = items[i].req;
        if (!r || r->state != MK_SR_RUNNING) continue; /* NULL: dropped by the engine (its request left) */
        if (COW_SRC(r) != (uint64_t)-1) {
            mk_kv_unref(s->pool, (int)COW_SRC(r));
            COW_SRC(r) = (uint64_t)-1;
        }
        if (items[i].failed) continue;
        r->n_computed = items[i].start + items[i].n;
        if (!s->o.prefix_caching) continue;
        while ((r->n_registered + 1) * s->bt <= r->n_computed) {
            int b = r->n_registered;
            uint64_t parent = b ? r->keys[b - 1] : 0;
            mk_kv_register(s->pool, r->blocks[b], parent, r->tokens + (size_t)b * s->bt, s->bt, extra_of(r, b));
            r->keys[b] = mk_kv_key(parent, r->tokens + (size_t)b * s->bt, s->bt, extra_of(r, b));
            r->n_registered++;
        }
        /* end of the prompt: its partial last block is cached too (short prompts get hits) */
        int tail = r->n_computed - r->n_registered * s->bt;
        if (!s->o.no_partial_hits && items[i].logits && r->n_computed == r->n_prompt && tail > 0 &&
            r->n_registered < r->n_blocks) {
            int b = r->n_registered;
            mk_kv_register(s->pool, r->blocks[b], b ? r->keys[b - 1] : 0, r->tokens + (size_t)b * s->bt, tail,
                           extra_of(r, b));
        }
    }
}

void mk_sched_append(mk_sched *s, mk_sreq *r, int32_t token) {
    (void)s;
    if (r->n_tokens < r->cap_tokens) r->tokens[r->n_tokens++] = token;
}

void mk_sched_stats_get(const mk_sched *s, mk_sched_stats *st) {
    *st = s->st;
    st->running = s->n_running;
    st->waiting = s->n_waiting;
}

int mk_sched_check(const mk_sched *s, mk_err *err) {
    int nb = mk_kv_n_blocks(s->pool);
    memset(s->refs, 0, sizeof *s->refs * (size_t)nb);
    int nr = 0, nw = 0;
    for (int pass = 0; pass < 2; pass++)
        for (const mk_sreq *r = pass ? s->waiting : s->running; r; r = r->next) {
            if (r->state != (pass ? MK_SR_WAITING : MK_SR_RUNNING))
                return mk_fail(err, MK_EINTERNAL, "sched: a request on the %s list has state %d", pass ? "waiting" : "running", r->state);
            pass ? nw++ : nr++;
            for (int i = 0; i < r->n_blocks; i++) s->refs[r->blocks[i]]++;
            if (COW_SRC(r) != (uint64_t)-1) s->refs[COW_SRC(r)]++;
            if (r->n_computed > r->n_blocks * s->bt)
                return mk_fail(err, MK_EINTERNAL, "sched: %d tokens computed in %d blocks", r->n_computed, r->n_blocks);
        }
    if (nr != s->n_running || nw != s->n_waiting)
        return mk_fail(err, MK_EINTERNAL, "sched: lists hold %d running / %d waiting, counters %d / %d", nr, nw,
                       s->n_running, s->n_waiting);
    return mk_kv_check(s->pool, s->refs, err);
}
