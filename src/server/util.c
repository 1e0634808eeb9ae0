/* util.c — byte buffer, HTTP errors, ids, body parsing and field tables (util.h). */
#include "server/util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---- byte buffer ---------------------------------------------------------------------------- */

static int sb_grow(srv_buf *b, size_t extra) {
    if (b->oom) return -1;
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void sb_put(srv_buf *b, const void *s, size_t n) {
    if (sb_grow(b, n)) return;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_puts(srv_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

void sb_printf(srv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        sb_put(b, tmp, (size_t)k);
        return;
    }
    if (sb_grow(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

void sb_reset(srv_buf *b) {
    b->n = 0;
    b->oom = 0;
    if (b->p) b->p[0] = 0;
}

void sb_free(srv_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

void sb_sse(srv_buf *b, const char *event, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT);
    if (!s) {
        b->oom = 1;
        return;
    }
    if (event) sb_printf(b, "event: %s\n", event);
    sb_puts(b, "data: ");
    sb_puts(b, s);
    sb_puts(b, "\n\n");
    free(s);
}

/* ---- errors --------------------------------------------------------------------------------- */

static const char *type_of(int status) {
    switch (status) {
    case 400: case 405: case 413: case 422: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "internal_error" : "invalid_request_error";
    }
}

int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    e->status = status;
    e->type = type_of(status);
    e->code = NULL;
    e->retry_after = 0;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

json_t *srv_err_openai(const srv_err *e) {
    json_t *err = json_object();
    json_object_set_new(err, "message", json_string(e->msg));
    json_object_set_new(err, "type", json_string(e->type ? e->type : type_of(e->status)));
    json_object_set_new(err, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", err);
    return o;
}

json_t *srv_err_anthropic(const srv_err *e) {
    const char *t;
    switch (e->status) {
    case 401: t = "authentication_error"; break;
    case 403: t = "permission_error"; break;
    case 404: t = "not_found_error"; break;
    case 413: t = "request_too_large"; break;
    case 429: t = "rate_limit_error"; break;
    case 503: case 529: t = "overloaded_error"; break;
    default: t = e->status >= 500 ? "api_error" : "invalid_request_error";
    }
    return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message", e->msg);
}

/* ---- misc ------------------------------------------------------------------------------------ */

void srv_rand_id(const char *prefix, char *buf, size_t cap) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        /* no entropy yet: the clock and a counter still make ids unique within the process */
        static unsigned long ctr;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long x = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 20) ^
                               (__atomic_add_fetch(&ctr, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull);
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(x >> (8 * (i % 8))) ^ (unsigned char)i;
    }
    size_t k = (size_t)snprintf(buf, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof r && k + 2 < cap; i++, k += 2) snprintf(buf + k, cap - k, "%02x", r[i]);
}

double srv_finite(double v) {
    if (isnan(v)) return -9999.0;
    if (isinf(v)) return v < 0 ? -9999.0 : 9999.0;
    return v;
}

/* ---- bodies ------------------------------------------------------------------------------------ */

/* Nesting depth of JSON text, outside strings; stops counting past max. jansson's own limit is a
 * compile-time 2048; ours is tighter and gives a clear message. */
static int too_deep(const char *s, size_t n, int max, size_t *at) {
    int depth = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
            continue;
        }
        if (c == '"') in_str = 1;
        else if (c == '[' || c == '{') {
            if (++depth > max) {
                *at = i;
                return 1;
            }
        } else if (c == ']' || c == '}') depth--;
    }
    return 0;
}

int srv_parse_body(const char *body, size_t len, int max_depth, json_t **out, srv_err *e) {
    *out = NULL;
    size_t at;
    if (!body || !len) return srv_fail(e, 400, NULL, "the request body is empty: expected a JSON object");
    if (too_deep(body, len, max_depth, &at))
        return srv_fail(e, 400, NULL, "the request body nests deeper than %d levels (at byte %zu)", max_depth, at);
    json_error_t je;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return srv_fail(e, 400, NULL, "invalid JSON in the request body at line %d column %d (byte %d): %s",
                        je.line, je.column, je.position, je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return srv_fail(e, 400, NULL, "the request body must be a JSON object");
    }
    *out = j;
    return 0;
}

int srv_json_int(const json_t *v, long long *out) {
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && d >= -9.2e18 && d <= 9.2e18) {
            *out = (long long)d;
            return 1;
        }
    }
    return 0;
}

static int type_ok(const json_t *v, unsigned t) {
    long long ll;
    switch (json_typeof(v)) {
    case JSON_NULL: return (t & SRV_T_NULL) != 0;
    case JSON_STRING: return (t & SRV_T_STR) != 0;
    case JSON_INTEGER: return (t & (SRV_T_INT | SRV_T_NUM)) != 0;
    case JSON_REAL: return (t & SRV_T_NUM) || ((t & SRV_T_INT) && srv_json_int(v, &ll));
    case JSON_TRUE: case JSON_FALSE: return (t & SRV_T_BOOL) != 0;
    case JSON_ARRAY: return (t & SRV_T_ARR) != 0;
    case JSON_OBJECT: return (t & SRV_T_OBJ) != 0;
    }
    return 0;
}

static void types_str(unsigned t, char *buf, size_t cap) {
    static const char *const names[] = {"null", "a string", "an integer", "a number", "a boolean", "an array", "an object"};
    buf[0] = 0;
    size_t k = 0;
    int first = 1;
    for (int i = 1; i < 7; i++) /* null last: "a string or null" */
        if (t & (1u << i)) {
            if (i == 3 && (t & SRV_T_INT)) continue;
            k += (size_t)snprintf(buf + k, cap > k ? cap - k : 0, "%s%s", first ? "" : " or ", names[i]);
            first = 0;
        }
    if (t & SRV_T_NULL) snprintf(buf + k, cap > k ? cap - k : 0, "%snull", first ? "" : " or ");
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return "null";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "?";
}

int srv_check_fields(const json_t *obj, const srv_field *f, int n, const char *where, srv_err *e) {
    const char *key;
    json_t *v;
    const char *w = where ? where : "";
    char pname[96];
    json_object_foreach((json_t *)obj, key, v) {
        int k = 0;
        while (k < n && strcmp(f[k].name, key)) k++;
        snprintf(pname, sizeof pname, "%s%s", w, key);
        if (k == n) return srv_fail(e, 400, pname, "unknown field '%s%s'", w, key);
        if (json_is_null(v) && !(f[k].flags & SRV_F_REQUIRED)) continue;
        if (f[k].flags & SRV_F_UNSUPPORTED)
            return srv_fail(e, 400, pname, "'%s%s' is not supported by minke", w, key);
        if (!type_ok(v, f[k].types)) {
            char ts[128];
            types_str(f[k].types, ts, sizeof ts);
            return srv_fail(e, 400, pname, "'%s%s' must be %s, got %s", w, key, ts, json_type_name(v));
        }
        if ((f[k].flags & SRV_F_RANGE) && json_is_number(v)) {
            double d = json_number_value(v);
            int lo_bad = (f[k].flags & SRV_F_LO_EXCL) ? !(d > f[k].lo) : !(d >= f[k].lo);
            if (lo_bad || !(d <= f[k].hi))
                return srv_fail(e, 400, pname, "'%s%s' must be in %s%.17g, %.17g], got %.17g", w, key,
                                (f[k].flags & SRV_F_LO_EXCL) ? "(" : "[", f[k].lo, f[k].hi, d);
        }
    }
    for (int k = 0; k < n; k++)
        if (f[k].flags & SRV_F_REQUIRED) {
            v = json_object_get(obj, f[k].name);
            snprintf(pname, sizeof pname, "%s%s", w, f[k].name);
            if (!v) return srv_fail(e, 400, pname, "'%s%s' is required", w, f[k].name);
            if (json_is_null(v)) return srv_fail(e, 400, pname, "'%s%s' must not be null", w, f[k].name);
        }
    return 0;
}

/* schema text with "VOCAB_MAX" replaced by the largest token id */
static json_t *load_schema(const char *txt, int vocab) {
    srv_buf b = {0};
    const char *p = txt, *q;
    char num[32];
    snprintf(num, sizeof num, "%d", vocab - 1);
    while ((q = strstr(p, "\"VOCAB_MAX\""))) {
        sb_put(&b, p, (size_t)(q - p));
        sb_puts(&b, num);
        p = q + strlen("\"VOCAB_MAX\"");
    }
    sb_puts(&b, p);
    json_t *j = b.oom ? NULL : json_loads(b.p, 0, NULL);
    sb_free(&b);
    return j;
}

json_t *srv_fields_schema(const srv_field *f, int n, const char *model_name, int vocab) {
    json_t *props = json_object(), *req = json_array();
    for (int k = 0; k < n; k++) {
        if (f[k].flags & SRV_F_UNSUPPORTED) continue;
        json_t *s = NULL;
        if (f[k].schema) s = load_schema(f[k].schema, vocab);
        if (model_name && !strcmp(f[k].name, "model"))
            s = json_pack("{s:[s,s], s:[s,n]}", "type", "string", "null", "enum", model_name);
        if (!s) {
            json_t *types = json_array();
            unsigned t = f[k].types;
            if (t & SRV_T_STR) json_array_append_new(types, json_string("string"));
            if (t & SRV_T_INT && !(t & SRV_T_NUM)) json_array_append_new(types, json_string("integer"));
            if (t & SRV_T_NUM) json_array_append_new(types, json_string("number"));
            if (t & SRV_T_BOOL) json_array_append_new(types, json_string("boolean"));
            if (t & SRV_T_ARR) json_array_append_new(types, json_string("array"));
            if (t & SRV_T_OBJ) json_array_append_new(types, json_string("object"));
            if ((t & SRV_T_NULL) && !(f[k].flags & SRV_F_REQUIRED)) json_array_append_new(types, json_string("null"));
            s = json_object();
            json_object_set_new(s, "type", json_array_size(types) == 1 ? json_incref(json_array_get(types, 0)) : json_incref(types));
            json_decref(types);
            if (f[k].flags & SRV_F_RANGE) {
                json_object_set_new(s, (f[k].flags & SRV_F_LO_EXCL) ? "exclusiveMinimum" : "minimum",
                                    f[k].lo == floor(f[k].lo) && fabs(f[k].lo) < 9e15 ? json_integer((json_int_t)f[k].lo) : json_real(f[k].lo));
                json_object_set_new(s, "maximum", f[k].hi == floor(f[k].hi) && fabs(f[k].hi) < 9e15 ? json_integer((json_int_t)f[k].hi) : json_real(f[k].hi));
            }
        }
        if (f[k].desc && !json_object_get(s, "description")) json_object_set_new(s, "description", json_string(f[k].desc));
        json_object_set_new(props, f[k].name, s);
        if (f[k].flags & SRV_F_REQUIRED) json_array_append_new(req, json_string(f[k].name));
    }
    json_t *o = json_pack("{s:s, s:o, s:b}", "type", "object", "properties", props, "additionalProperties", 0);
    if (json_array_size(req)) json_object_set_new(o, "required", req);
    else json_decref(req);
    return o;
}

int srv_get_bool(const json_t *o, const char *k, int *out) {
    json_t *v = json_object_get(o, k);
    if (!v || !json_is_boolean(v)) return 0;
    *out = json_is_true(v);
    return 1;
}

int srv_get_int(const json_t *o, const char *k, long long *out) {
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) && srv_json_int(v, out);
}

int srv_get_num(const json_t *o, const char *k, double *out) {
    json_t *v = json_object_get(o, k);
    if (!v || !json_is_number(v)) return 0;
    *out = json_number_value(v);
    return 1;
}

const char *srv_get_str(const json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}
