/* status.c — error messages and the logger (see status.h). */
#include "base/status.h"

#include <stdarg.h>
#include <string.h>

const char *mk_status_str(int status) {
    switch (status) {
    case MK_OK: return "ok";
    case MK_EINVAL: return "invalid argument";
    case MK_EIO: return "i/o error";
    case MK_ENOMEM: return "out of memory";
    case MK_EFORMAT: return "format error";
    case MK_ENOTSUP: return "not supported";
    case MK_ERANGE: return "out of range";
    case MK_EINTERNAL: return "internal error";
    case MK_EBUSY: return "busy";
    default: return "unknown error";
    }
}

int mk_fail(mk_err *err, int status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

int mk_err_prefix(mk_err *err, const char *fmt, ...) {
    if (!err) return MK_EINTERNAL;
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    size_t used = (size_t)n < sizeof err->msg ? (size_t)n : sizeof err->msg - 1;
    size_t room = sizeof err->msg - used;
    if (room > 2) {
        memcpy(err->msg + used, ": ", 2);
        used += 2;
        room -= 2;
        size_t ol = strnlen(old, sizeof old);
        if (ol >= room) ol = room - 1;
        memcpy(err->msg + used, old, ol);
        err->msg[used + ol] = 0;
    }
    return err->status;
}

static int g_log_level = -1;

void mk_log_set_level(int level) { g_log_level = level; }

void mk_log(int level, const char *fmt, ...) {
    if (g_log_level < 0) {
        const char *e = getenv("MINKE_LOG");
        g_log_level = MK_LOG_WARN;
        if (e) {
            if (!strcmp(e, "error")) g_log_level = MK_LOG_ERROR;
            else if (!strcmp(e, "info")) g_log_level = MK_LOG_INFO;
            else if (!strcmp(e, "debug")) g_log_level = MK_LOG_DEBUG;
        }
    }
    if (level > g_log_level) return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "minke: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
