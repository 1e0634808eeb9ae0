/* stop.c — streaming stop-string matcher (see stop.h).
 *
 * State: buf holds, from offset `start`, the `held` bytes kept back by the previous call (a proper
 * prefix of some stop string). Emitted text is returned as a pointer into buf, so the held bytes are
 * moved to the front only at the start of the next call, after the caller is done with it.
 *
 * Why holding the longest prefix-suffix is enough: a stop string that would start before the held
 * region and end in a later piece would, at the previous call, have left a longer suffix that is a
 * prefix of that stop string, and the longest such suffix is what was held.
 */
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

struct mk_stop {
    int n;              /* number of stop strings */
    char **s;           /* [n] NUL-terminated copies */
    size_t *len;        /* [n] byte lengths, all >= 1 */
    size_t max_len;     /* longest stop string */
    int include;        /* emit the stop string itself */
    int matched;        /* index of the matched stop string, or -1 */
    int done;           /* matched or flushed: emit nothing more */
    char *buf;          /* [cap] held text + current piece */
    size_t cap, start, held;
};

int mk_stop_create(const char *const *stops, int n, int include_stop_str, mk_stop **out,
                   mk_err *err) {
    *out = NULL;
    if (n < 0 || (n > 0 && !stops)) return mk_fail(err, MK_EINVAL, "stop: %d stop strings", n);
    mk_stop *m = calloc(1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "stop: out of memory");
    m->n = n;
    m->include = include_stop_str != 0;
    m->matched = -1;
    if (n > 0) {
        m->s = calloc((size_t)n, sizeof *m->s);
        m->len = calloc((size_t)n, sizeof *m->len);
        if (!m->s || !m->len) goto nomem;
    }
    for (int i = 0; i < n; i++) {
        if (!stops[i] || !stops[i][0]) {
            mk_stop_free(m);
            return mk_fail(err, MK_EINVAL, "stop: stop string %d is empty", i);
        }
        m->len[i] = strlen(stops[i]);
        m->s[i] = malloc(m->len[i] + 1);
        if (!m->s[i]) goto nomem;
        memcpy(m->s[i], stops[i], m->len[i] + 1);
        if (m->len[i] > m->max_len) m->max_len = m->len[i];
    }
    m->cap = m->max_len + 256;
    m->buf = malloc(m->cap);
    if (!m->buf) goto nomem;
    *out = m;
    return MK_OK;
nomem:
    mk_stop_free(m);
    return mk_fail(err, MK_ENOMEM, "stop: out of memory");
}

void mk_stop_free(mk_stop *m) {
    if (!m) return;
    for (int i = 0; i < m->n && m->s; i++) free(m->s[i]);
    free(m->s);
    free(m->len);
    free(m->buf);
    free(m);
}

int mk_stop_matched(const mk_stop *m) { return m->matched; }

/* Earliest position p in b[0, n) where some stop string starts and fits; *which gets its index
 * (first in list order at that position). Returns -1 when none. */
static long find_earliest(const mk_stop *m, const char *b, size_t n, int *which) {
    for (size_t p = 0; p < n; p++)
        for (int i = 0; i < m->n; i++)
            if (m->len[i] <= n - p && b[p] == m->s[i][0] && !memcmp(b + p, m->s[i], m->len[i])) {
                *which = i;
                return (long)p;
            }
    return -1;
}

/* Length of the longest suffix of b[0, n) that is a proper prefix of some stop string. */
static size_t held_suffix(const mk_stop *m, const char *b, size_t n) {
    size_t h = m->max_len ? m->max_len - 1 : 0;
    if (h > n) h = n;
    for (; h > 0; h--)
        for (int i = 0; i < m->n; i++)
            if (m->len[i] > h && !memcmp(b + n - h, m->s[i], h)) return h;
    return 0;
}

int mk_stop_feed(mk_stop *m, const char *text, size_t len, const char **emit, size_t *emit_len) {
    *emit = m->buf;
    *emit_len = 0;
    if (m->done) return m->matched >= 0;
    /* the previous call's emitted bytes are consumed now: move the held suffix to the front */
    if (m->start) memmove(m->buf, m->buf + m->start, m->held);
    m->start = 0;
    if (m->held + len > m->cap) {
        size_t cap = m->cap * 2;
        while (cap < m->held + len) cap *= 2;
        char *nb = realloc(m->buf, cap);
        if (!nb) return MK_ENOMEM;
        m->buf = nb;
        m->cap = cap;
        *emit = m->buf;
    }
    if (len) memcpy(m->buf + m->held, text, len);
    size_t n = m->held + len;
    int which = -1;
    long p = m->n ? find_earliest(m, m->buf, n, &which) : -1;
    if (p >= 0) {
        m->matched = which;
        m->done = 1;
        m->held = 0;
        *emit_len = (size_t)p + (m->include ? m->len[which] : 0);
        return 1;
    }
    size_t h = held_suffix(m, m->buf, n);
    *emit_len = n - h;
    m->start = n - h;
    m->held = h;
    return 0;
}

int mk_stop_flush(mk_stop *m, const char **emit, size_t *emit_len) {
    *emit = m->buf + m->start;
    *emit_len = m->done ? 0 : m->held;
    m->done = 1;
    m->held = 0;
    return 0;
}
