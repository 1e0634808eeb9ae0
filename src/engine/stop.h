/* stop.h — stop-string matching over a streamed, detokenized output.
 *
 * The server detokenizes a request's output incrementally and feeds each new piece of text here.
 * The matcher answers with the text that is safe to show the client now and whether a stop string
 * has matched. Text that might be the beginning of a stop string is held back until the next piece
 * decides it: with stop "###", the pieces "a#", "#", "b" emit "a", "", "##b". Only the longest
 * suffix that is a proper prefix of some stop string is held, so text that cannot start a stop
 * string is never delayed.
 *
 * Semantics (OpenAI / vLLM): the stop string itself is not emitted unless include_stop_str is set,
 * and nothing after it is. When several stop strings match, the one that starts earliest in the
 * stream wins (ties: the first in the list). Note vLLM picks the first string in list order that
 * occurs in the new text; the two differ only when two stop strings complete in the same piece.
 * Matching is on bytes; stop strings that are valid UTF-8 can only match at character boundaries
 * of valid UTF-8 text, so held-back and emitted text never splits a character that the feed did not
 * split. vLLM ignores stop strings until min_tokens tokens are generated: the engine should not
 * feed text produced before that (emit it directly).
 *
 * Memory: one buffer of max_stop_len + 256 bytes allocated at create; a piece longer than the room
 * left grows it (geometrically, so a stream of ordinary tokens never allocates).
 */
#ifndef MK_ENGINE_STOP_H
#define MK_ENGINE_STOP_H

#include <stddef.h>

#include "base/status.h"

typedef struct mk_stop mk_stop;

/* stops: n non-empty strings (copied). n may be 0 (then every piece passes straight through). */
int mk_stop_create(const char *const *stops, int n, int include_stop_str, mk_stop **out,
                   mk_err *err);
void mk_stop_free(mk_stop *m);

/* Feed the next piece of output text (len bytes, need not be NUL-terminated). On return *emit
 * points to *emit_len bytes to show now (valid until the next call on m). Returns 1 once a stop
 * string has matched (the emitted text then ends the output; later calls emit nothing and return
 * 1), 0 otherwise, or MK_ENOMEM. */
int mk_stop_feed(mk_stop *m, const char *text, size_t len, const char **emit, size_t *emit_len);

/* The output ended for another reason (EOS, length): emit whatever is held back. Returns 0. */
int mk_stop_flush(mk_stop *m, const char **emit, size_t *emit_len);

/* Index of the stop string that matched, or -1. */
int mk_stop_matched(const mk_stop *m);

#endif
