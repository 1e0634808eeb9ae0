/* status.h — the one error convention of minke.
 *
 * Functions return MK_OK (0) or a negative mk_status (include/minke.h). When a caller passes an
 * mk_err, the failing function writes a message naming what was wrong (file, tensor, field,
 * expected vs found). mk_fail() formats that message and returns the status, so a failure site
 * reads `return mk_fail(err, MK_EFORMAT, "%s: tensor %s: expected dtype %s", ...)`.
 * MK_ASSERT is for programmer invariants only; nothing reachable from input may trigger it.
 */
#ifndef MK_BASE_STATUS_H
#define MK_BASE_STATUS_H

#include "minke.h"
#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define MK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MK_PRINTF(a, b)
#endif

/* Writes the message into err (if non-NULL) and returns status (negative). */
int mk_fail(mk_err *err, int status, const char *fmt, ...) MK_PRINTF(3, 4);
/* Prefixes context to an existing message: "ctx: old message". Returns err->status. */
int mk_err_prefix(mk_err *err, const char *fmt, ...) MK_PRINTF(2, 3);

#define MK_ASSERT(c)                                                                 \
    do {                                                                             \
        if (!(c)) {                                                                  \
            fprintf(stderr, "minke: internal error: %s:%d: %s\n", __FILE__, __LINE__, \
                    #c);                                                             \
            abort();                                                                 \
        }                                                                            \
    } while (0)

/* Logging: one global logger (the only global mutable state). Level from MINKE_LOG (error, warn,
 * info, debug); default warn. */
enum { MK_LOG_ERROR = 0, MK_LOG_WARN = 1, MK_LOG_INFO = 2, MK_LOG_DEBUG = 3 };
void mk_log(int level, const char *fmt, ...) MK_PRINTF(2, 3);
void mk_log_set_level(int level);

#endif
