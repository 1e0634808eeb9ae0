/* split.c — streaming reasoning / content / DSML tool-call splitter for DeepSeek-V4 (split.h). */
#include "server/split.h"

#include "text/chat_dsv4.h"

#include <stdlib.h>
#include <string.h>

#define TOOLS_START "\n\n<" MK_DSV4_DSML "tool_calls"
#define TOOLS_END "</" MK_DSV4_DSML "tool_calls>"
#define INVOKE_CLOSE "</" MK_DSV4_DSML "invoke"

enum { S_REASON, S_CONTENT, S_TOOLS };

struct srv_split {
    int state, tools;
    srv_buf hold;   /* text not yet decided (S_REASON / S_CONTENT), or the tool block (S_TOOLS) */
    int n_emitted;  /* tool calls returned so far */
    size_t scanned; /* S_TOOLS: invoke closes before this offset were already parsed */
};

void srv_calls_free(srv_calls *c) {
    for (int i = 0; i < c->n; i++) {
        free(c->v[i].name);
        free(c->v[i].args);
    }
    free(c->v);
    memset(c, 0, sizeof *c);
}

int srv_split_create(int thinking, int tools, srv_split **out) {
    srv_split *s = calloc(1, sizeof *s);
    if (!s) return MK_ENOMEM;
    s->state = thinking ? S_REASON : S_CONTENT;
    s->tools = tools;
    *out = s;
    return MK_OK;
}

void srv_split_free(srv_split *s) {
    if (!s) return;
    sb_free(&s->hold);
    free(s);
}

int srv_split_in_tools(const srv_split *s) { return s->state == S_TOOLS; }
int srv_split_in_reasoning(const srv_split *s) { return s->state == S_REASON; }

/* Length of the longest suffix of t[0, n) that is a proper prefix of m. */
static size_t partial_suffix(const char *t, size_t n, const char *m) {
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(t + n - k, m, k)) return k;
    return 0;
}

static void drop_front(srv_buf *b, size_t k) {
    memmove(b->p, b->p + k, b->n - k);
    b->n -= k;
    b->p[b->n] = 0;
}

/* Parses TOOLS_START + block[0, end) + tail as a complete tool-call block; appends calls beyond
 * the ones already returned. Returns 0 when it parsed. */
static int parse_block(srv_split *s, const char *block, size_t end, const char *tail, srv_calls *calls) {
    srv_buf t = {0};
    sb_puts(&t, TOOLS_START);
    sb_put(&t, block, end);
    sb_puts(&t, tail);
    if (t.oom) {
        sb_free(&t);
        return MK_ENOMEM;
    }
    mk_dsv4_msg m;
    mk_err err;
    int rc = mk_dsv4_parse(t.p, t.n, 0, &m, &err);
    sb_free(&t);
    if (rc) return rc;
    for (int i = s->n_emitted; i < m.n_calls; i++) {
        if (calls->n == calls->cap) {
            int cap = calls->cap ? calls->cap * 2 : 4;
            srv_call *v = realloc(calls->v, (size_t)cap * sizeof *v);
            if (!v) break;
            calls->v = v;
            calls->cap = cap;
        }
        srv_call *c = &calls->v[calls->n++];
        srv_rand_id("call_", c->id, sizeof c->id);
        c->name = m.calls[i].name;
        c->args = m.calls[i].arguments;
        m.calls[i].name = m.calls[i].arguments = NULL;
        s->n_emitted++;
    }
    mk_dsv4_msg_free(&m);
    return 0;
}

/* S_TOOLS: parse up to the last closed invoke when a new one closed since the last look. */
static void scan_tools(srv_split *s, srv_calls *calls) {
    const char *p = s->hold.p, *last = NULL;
    if (!p) return;
    size_t cl = strlen(INVOKE_CLOSE);
    for (const char *q = p + s->scanned; (q = memmem(q, s->hold.n - (size_t)(q - p), INVOKE_CLOSE, cl)); q += cl) last = q;
    if (!last) return;
    size_t end = (size_t)(last - p) + cl;
    s->scanned = end;
    parse_block(s, p, end, ">\n" TOOLS_END, calls);
}

static int step(srv_split *s, srv_buf *reasoning, srv_buf *content, srv_calls *calls) {
    for (;;) {
        srv_buf *h = &s->hold;
        if (s->state == S_TOOLS) {
            scan_tools(s, calls);
            return 0;
        }
        if (!h->n) return 0;
        if (s->state == S_REASON) {
            const char *m = memmem(h->p, h->n, MK_DSV4_THINK_END, strlen(MK_DSV4_THINK_END));
            if (m) {
                size_t k = (size_t)(m - h->p);
                sb_put(reasoning, h->p, k);
                drop_front(h, k + strlen(MK_DSV4_THINK_END));
                s->state = S_CONTENT;
                continue;
            }
            size_t keep = partial_suffix(h->p, h->n, MK_DSV4_THINK_END);
            sb_put(reasoning, h->p, h->n - keep);
            drop_front(h, h->n - keep);
            return 0;
        }
        /* S_CONTENT */
        if (!s->tools) {
            sb_put(content, h->p, h->n);
            sb_reset(h);
            return 0;
        }
        const char *m = memmem(h->p, h->n, TOOLS_START, strlen(TOOLS_START));
        if (m) {
            size_t k = (size_t)(m - h->p);
            sb_put(content, h->p, k);
            drop_front(h, k + strlen(TOOLS_START));
            s->state = S_TOOLS;
            s->scanned = 0;
            continue;
        }
        size_t keep = partial_suffix(h->p, h->n, TOOLS_START);
        sb_put(content, h->p, h->n - keep);
        drop_front(h, h->n - keep);
        return 0;
    }
}

int srv_split_feed(srv_split *s, const char *t, size_t n, srv_buf *reasoning, srv_buf *content,
                   srv_calls *calls) {
    sb_put(&s->hold, t, n);
    if (s->hold.oom) return MK_ENOMEM;
    return step(s, reasoning, content, calls);
}

int srv_split_finish(srv_split *s, srv_buf *reasoning, srv_buf *content, srv_calls *calls) {
    int rc = step(s, reasoning, content, calls);
    srv_buf *h = &s->hold;
    if (s->state == S_REASON) sb_put(reasoning, h->p, h->n);
    else if (s->state == S_CONTENT) sb_put(content, h->p, h->n);
    else if (h->p && parse_block(s, h->p, h->n, "", calls)) {
        /* the block did not close (truncated) or is malformed: keep the complete calls only */
        s->scanned = 0;
        scan_tools(s, calls);
    }
    sb_reset(h);
    return rc;
}
