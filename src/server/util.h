/* util.h — small pieces every server file uses: a growable byte buffer, the HTTP error value that
 * carries status, OpenAI error type, offending parameter and message from wherever a request fails
 * to the code that writes the response, random ids, and the declared field tables that validate
 * request bodies and also produce the OpenAPI schemas (so the two cannot disagree).
 *
 * Field tables: each endpoint lists the fields it accepts (name, allowed JSON types, range,
 * required / known-but-unsupported, description, optional explicit schema). srv_check_fields
 * rejects, with a 400 naming the field: a field not in the table ("unknown field"), a field marked
 * unsupported with a non-null value ("not supported"), a wrong JSON type, a number out of range and
 * a missing required field. Endpoint code then reads the values knowing their types are right.
 * Integers: JSON integers, or reals with no fractional part (JSON Schema's "integer").
 */
#ifndef MK_SERVER_UTIL_H
#define MK_SERVER_UTIL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* ---- byte buffer ---------------------------------------------------------------------------- */
typedef struct {
    char *p;    /* NUL-terminated when non-NULL */
    size_t n, cap;
    int oom;    /* an append failed: contents are truncated */
} srv_buf;

void sb_put(srv_buf *b, const void *s, size_t n);
void sb_puts(srv_buf *b, const char *s);
void sb_printf(srv_buf *b, const char *fmt, ...) MK_PRINTF(2, 3);
void sb_reset(srv_buf *b); /* length 0, keeps the allocation */
void sb_free(srv_buf *b);
/* Appends "data: <json>\n\n" (the value is not consumed). */
void sb_sse(srv_buf *b, const char *event, const json_t *v);

/* ---- errors --------------------------------------------------------------------------------- */
typedef struct {
    int status;       /* HTTP status */
    const char *type; /* OpenAI error type: invalid_request_error, authentication_error, ... */
    const char *code; /* a short code or NULL */
    char param[96];   /* the offending field ("" when none) */
    int retry_after;  /* seconds for the Retry-After header; 0 = none */
    char msg[1024];
} srv_err;

/* Fills e (type from the status unless set later) and returns -1. param may be NULL. */
int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...) MK_PRINTF(4, 5);
/* {"error": {"message", "type", "param", "code"}} */
json_t *srv_err_openai(const srv_err *e);
/* {"type": "error", "error": {"type", "message"}} with Anthropic's type names */
json_t *srv_err_anthropic(const srv_err *e);

/* ---- misc ------------------------------------------------------------------------------------ */
/* prefix + 24 random hex digits ("chatcmpl-3f2a..."), into buf. */
void srv_rand_id(const char *prefix, char *buf, size_t cap);
/* JSON numbers: logprobs of -inf become -9999.0 (JSON has no infinity; vLLM does the same). */
double srv_finite(double v);

/* ---- request bodies --------------------------------------------------------------------------- */
/* Parses a request body: nesting deeper than max_depth, invalid JSON or UTF-8, duplicate keys and
 * NUL characters in strings are 400s whose message says where. The top level must be an object. */
int srv_parse_body(const char *body, size_t len, int max_depth, json_t **out, srv_err *e);

enum { /* JSON types a field accepts (bit mask) */
    SRV_T_NULL = 1, SRV_T_STR = 2, SRV_T_INT = 4, SRV_T_NUM = 8, SRV_T_BOOL = 16, SRV_T_ARR = 32,
    SRV_T_OBJ = 64,
};
enum { /* field flags */
    SRV_F_REQUIRED = 1,    /* must be present and not null */
    SRV_F_UNSUPPORTED = 2, /* known (OpenAI / vLLM / Anthropic) but not implemented: any non-null
                            * value is a 400 saying so */
    SRV_F_RANGE = 4,       /* numbers must lie in [lo, hi] */
    SRV_F_LO_EXCL = 8,     /* ... with lo excluded */
};

typedef struct {
    const char *name;
    unsigned types;     /* SRV_T_* */
    unsigned flags;     /* SRV_F_* */
    double lo, hi;
    const char *desc;   /* for the OpenAPI document */
    const char *schema; /* explicit OpenAPI schema (JSON text); NULL: derived from types/range */
} srv_field;

/* Checks obj against the table; where prefixes field names in messages ("stream_options."). */
int srv_check_fields(const json_t *obj, const srv_field *f, int n, const char *where, srv_err *e);
/* The OpenAPI schema {"type": "object", "properties": ..., "required": [...],
 * "additionalProperties": false} of a table (unsupported fields are left out). model_name: when
 * not NULL, a field "model" is described as that name (or null), the only value accepted. In
 * explicit schemas the text "VOCAB_MAX" (quotes included) becomes vocab - 1, the largest token id. */
json_t *srv_fields_schema(const srv_field *f, int n, const char *model_name, int vocab);

/* Typed getters for fields srv_check_fields has accepted: absent or null leaves *out unchanged and
 * returns 0; present returns 1. */
int srv_get_bool(const json_t *o, const char *k, int *out);
int srv_get_int(const json_t *o, const char *k, long long *out);
int srv_get_num(const json_t *o, const char *k, double *out);
const char *srv_get_str(const json_t *o, const char *k); /* NULL if absent or null */
/* 1 when v is a JSON integer or an integral real that fits in long long. */
int srv_json_int(const json_t *v, long long *out);

#endif
