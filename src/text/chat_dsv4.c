/* chat_dsv4.c — the DeepSeek-V4 chat encoding: render messages to a prompt, parse a completion.
 *
 * Rendering follows the official encoding_dsv4.py step for step, because byte-exact prompts are
 * the point (a stray "\n" shifts every token after it):
 *   1. validate the caller's messages (our addition: the reference asserts or crashes instead);
 *   2. merge: each tool message becomes a tool_result block of a user message; a tool or user
 *      message directly after a user message (that has no task) joins it, so "tool, tool, user"
 *      renders as one <｜User｜> turn whose blocks are joined with "\n\n";
 *   3. sort the tool_result blocks of each user turn into the call order of the latest assistant
 *      message with tool calls (matched by tool_call_id);
 *   4. drop_thinking is switched off if any message carries tools; in thinking mode with it on,
 *      assistant turns before the last user turn lose their reasoning and developer messages
 *      before it are dropped (the reference's _drop_thinking_messages);
 *   5. render each message, then the "generation" suffix: after a user/developer turn that is
 *      last or followed by an assistant/latest_reminder turn, "<｜Assistant｜>" plus "<think>"
 *      (thinking mode, at or after the last user turn, or drop_thinking off) or "</think>"; a
 *      message's `task` replaces that suffix by its quick-instruction token.
 * Internally messages are views (rmsg) pointing into the caller's JSON; nothing is deep-copied.
 *
 * JSON that appears in the prompt (tool schemas, non-string tool arguments, response_format) is
 * written as Python's json.dumps(ensure_ascii=False) writes it: ", " / ": " separators, only
 * '"', '\\' and control characters escaped (lowercase \u00XX), floats in repr form. pyjson_*
 * below implements exactly that; jansson's own dumper differs in all three respects.
 *
 * Parsing mirrors parse_message_from_completion_text(): reasoning up to "</think>" (thinking
 * mode), content up to EOS or "\n\n<｜DSML｜tool_calls", then the DSML block, read with the same
 * stop-string scanner (read_until) and the same shape rules as the reference's regexes.
 */
#include "text/chat_dsv4.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Growable byte buffer. Allocation failure sets `oom` and later appends become no-ops, so call
 * sites append freely and check once at the end. */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Takes the buffer's string (always allocated, "" when nothing was appended). NULL on OOM. */
static char *sb_take(sbuf *b, size_t *len) {
    if (!b->oom && !b->p) {
        b->p = calloc(1, 1); /* nothing was appended: still return an allocated "" */
        b->oom = !b->p;
    }
    if (b->oom) {
        free(b->p);
        b->p = NULL;
        return NULL;
    }
    char *p = b->p;
    if (len) *len = b->n;
    b->p = NULL;
    b->n = b->cap = 0;
    return p;
}

static char *xstrndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ------------------------------------------------------------------------------------------ */
/* Python-compatible JSON writer (json.dumps(v, ensure_ascii=False)). */

static void pyjson_str(sbuf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    sb_put(b, "\"", 1);
    size_t run = 0; /* start of the pending run of bytes that need no escaping */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b') esc = "\\b";
        else if (c == '\f') esc = "\\f";
        else if (c < 0x20) {
            memcpy(u, "\\u00", 4);
            u[4] = hex[c >> 4];
            u[5] = hex[c & 15];
            u[6] = 0;
            esc = u;
        }
        if (esc) {
            sb_put(b, s + run, i - run);
            sb_puts(b, esc);
            run = i + 1;
        }
    }
    sb_put(b, s + run, n - run);
    sb_put(b, "\"", 1);
}

/* Python's repr(float): the shortest digit string that reads back to the same double, written
 * positionally when the decimal exponent is in [-5, 16) and as d.ddde±XX otherwise, with ".0"
 * on integral positional values. Shortest = the first precision 1..17 whose correctly rounded
 * %e form round-trips through strtod (this matches repr except, possibly, in rare ties at
 * power-of-two boundaries). */
static void pyjson_real(sbuf *b, double d) {
    char out[64];
    if (isnan(d)) { sb_puts(b, "NaN"); return; }
    if (isinf(d)) { sb_puts(b, d < 0 ? "-Infinity" : "Infinity"); return; }
    if (d == 0) { sb_puts(b, signbit(d) ? "-0.0" : "0.0"); return; }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e = "[-]D[.DDD]e[+-]XX": collect the digits and the exponent. */
    char dig[24];
    int nd = 0, neg = 0;
    const char *q = e;
    if (*q == '-') neg = 1, q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--; /* %.*e may pad with zeros */
    char *o = out;
    if (neg) *o++ = '-';
    if (ex < -4 || ex >= 16) {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, dig + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        o += sprintf(o, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -ex - 1; i++) *o++ = '0';
        memcpy(o, dig, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i <= ex; i++) *o++ = i < nd ? dig[i] : '0';
        *o++ = '.';
        if (nd > ex + 1) {
            memcpy(o, dig + ex + 1, (size_t)(nd - ex - 1));
            o += nd - ex - 1;
        } else {
            *o++ = '0';
        }
    }
    *o = 0;
    sb_puts(b, out);
}

static void pyjson_value(sbuf *b, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        sb_put(b, "{", 1);
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_put(b, ", ", 2);
            first = 0;
            pyjson_str(b, k, strlen(k));
            sb_put(b, ": ", 2);
            pyjson_value(b, x);
        }
        sb_put(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_put(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_put(b, ", ", 2);
            pyjson_value(b, json_array_get(v, i));
        }
        sb_put(b, "]", 1);
        break;
    case JSON_STRING: pyjson_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        sb_puts(b, num);
        break;
    case JSON_REAL: pyjson_real(b, json_real_value(v)); break;
    case JSON_TRUE: sb_puts(b, "true"); break;
    case JSON_FALSE: sb_puts(b, "false"); break;
    default: sb_puts(b, "null"); break;
    }
}

char *mk_dsv4_pyjson(const json_t *v) {
    sbuf b = {0};
    if (v) pyjson_value(&b, v);
    return sb_take(&b, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Fixed texts of the encoding. */

#define DSML MK_DSV4_DSML
#define TOOL_CALLS_START "\n\n<" DSML "tool_calls"
#define TOOL_CALLS_END "</" DSML "tool_calls>"
#define INVOKE_OPEN "<" DSML "invoke"
#define INVOKE_CLOSE "</" DSML "invoke"
#define PARAM_OPEN "<" DSML "parameter"
#define PARAM_CLOSE "/" DSML "parameter" /* the reference's stop string: no '<' */

static const char EFFORT_MAX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

/* The tools block; the schemas (one pyjson line per function) go between HEAD and TAIL. */
static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    "by writing a \"<" DSML "tool_calls>\" block like the following:\n\n"
    "<" DSML "tool_calls>\n"
    "<" DSML "invoke name=\"$TOOL_NAME\">\n"
    "<" DSML "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" DSML
    "parameter>\n"
    "...\n"
    "</" DSML "invoke>\n"
    "<" DSML "invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</" DSML "invoke>\n"
    "</" DSML "tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
    "`string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
    "tool calls.\n";

static const char RESPONSE_FORMAT_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* Quick-instruction tasks and their tokens. */
static const char *const TASKS[][2] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"},   {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"},   {"read_url", "<｜read_url｜>"},
};

static const char *task_token(const char *task) {
    for (size_t i = 0; i < sizeof TASKS / sizeof TASKS[0]; i++)
        if (!strcmp(task, TASKS[i][0])) return TASKS[i][1];
    return NULL;
}

enum { R_SYSTEM, R_USER, R_ASSISTANT, R_TOOL, R_REMINDER, R_DEVELOPER, R_COUNT };
static const char *const ROLE_NAMES[R_COUNT] = {"system", "user",           "assistant",
                                                "tool",   "latest_reminder", "developer"};

/* ------------------------------------------------------------------------------------------ */
/* Validation of the caller's messages. Every message is checked before anything is rendered, so
 * errors name the caller's index even for messages the reference would later merge or drop. */

static const char *jtype(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static int is_nullish(const json_t *v) { return !v || json_is_null(v); }

/* Python truthiness of a JSON value (the reference tests `if tools:`, `if response_format:`). */
static int py_truthy(const json_t *v) {
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static int role_of(const json_t *m) {
    const char *r = json_string_value(json_object_get(m, "role"));
    if (!r) return -1;
    for (int i = 0; i < R_COUNT; i++)
        if (!strcmp(r, ROLE_NAMES[i])) return i;
    return -1;
}

/* content: absent/null, a string, or a list of parts {type:"text", text}. Non-text parts are
 * allowed only in tool results, where the reference writes "[Unsupported <type>]". */
static int check_content(const json_t *c, int i, int role, mk_err *err) {
    if (is_nullish(c) || json_is_string(c)) return MK_OK;
    if (!json_is_array(c))
        return mk_fail(err, MK_EINVAL,
                       "messages[%d].content: expected a string, null or a list of text parts, "
                       "got %s", i, jtype(c));
    for (size_t j = 0; j < json_array_size(c); j++) {
        const json_t *p = json_array_get(c, j);
        const char *t = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !t)
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].content[%zu]: expected an object with a string \"type\"",
                           i, j);
        if (!strcmp(t, "text")) {
            if (!json_is_string(json_object_get(p, "text")))
                return mk_fail(err, MK_EINVAL, "messages[%d].content[%zu].text: expected a string",
                               i, j);
        } else if (role != R_TOOL) {
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].content[%zu].type: unsupported content part \"%s\" (only "
                           "\"text\")", i, j, t);
        }
    }
    return MK_OK;
}

/* tools: absent/null or an array of {function: {...}}; `where` names it in messages. */
static int check_tools(const json_t *tools, const char *where, mk_err *err) {
    if (is_nullish(tools)) return MK_OK;
    if (!json_is_array(tools))
        return mk_fail(err, MK_EINVAL, "%s: expected an array of tools, got %s", where,
                       jtype(tools));
    for (size_t j = 0; j < json_array_size(tools); j++) {
        const json_t *f = json_object_get(json_array_get(tools, j), "function");
        if (!json_is_object(f))
            return mk_fail(err, MK_EINVAL, "%s[%zu].function: expected an object, got %s", where,
                           j, jtype(f));
    }
    return MK_OK;
}

/* The id a tool call is matched by: its "id", else function.id (as the reference). */
static const char *call_id(const json_t *tc) {
    const char *id = json_string_value(json_object_get(tc, "id"));
    if (!id || !*id) id = json_string_value(json_object_get(json_object_get(tc, "function"), "id"));
    return id && *id ? id : NULL;
}

static int check_tool_calls(const json_t *tcs, int i, mk_err *err) {
    if (is_nullish(tcs)) return MK_OK;
    if (!json_is_array(tcs))
        return mk_fail(err, MK_EINVAL, "messages[%d].tool_calls: expected an array, got %s", i,
                       jtype(tcs));
    for (size_t j = 0; j < json_array_size(tcs); j++) {
        const json_t *tc = json_array_get(tcs, j), *f = json_object_get(tc, "function");
        if (!json_is_object(tc))
            return mk_fail(err, MK_EINVAL, "messages[%d].tool_calls[%zu]: expected an object, got %s",
                           i, j, jtype(tc));
        const json_t *id = json_object_get(tc, "id");
        if (!is_nullish(id) && !json_is_string(id))
            return mk_fail(err, MK_EINVAL, "messages[%d].tool_calls[%zu].id: expected a string", i,
                           j);
        if (!json_is_object(f))
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].tool_calls[%zu].function: expected an object, got %s", i,
                           j, jtype(f));
        if (!json_is_string(json_object_get(f, "name")))
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].tool_calls[%zu].function.name: expected a string, got %s",
                           i, j, jtype(json_object_get(f, "name")));
        const json_t *a = json_object_get(f, "arguments");
        if (!is_nullish(a) && !json_is_string(a) && !json_is_object(a))
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].tool_calls[%zu].function.arguments: expected a JSON "
                           "string or an object, got %s", i, j, jtype(a));
    }
    return MK_OK;
}

static int check_message(const json_t *msgs, int i, mk_err *err) {
    const json_t *m = json_array_get(msgs, (size_t)i);
    if (!json_is_object(m))
        return mk_fail(err, MK_EINVAL, "messages[%d]: expected an object, got %s", i, jtype(m));
    const json_t *rv = json_object_get(m, "role");
    if (!json_is_string(rv))
        return mk_fail(err, MK_EINVAL, "messages[%d].role: expected a string, got %s", i, jtype(rv));
    int role = role_of(m);
    if (role < 0)
        return mk_fail(err, MK_EINVAL,
                       "messages[%d].role: unknown role \"%s\" (expected system, user, assistant, "
                       "tool, latest_reminder or developer)", i, json_string_value(rv));
    const json_t *content = json_object_get(m, "content");
    int rc = check_content(content, i, role, err);
    if (rc) return rc;
    if (role == R_DEVELOPER && !py_truthy(content))
        return mk_fail(err, MK_EINVAL, "messages[%d].content: a developer message needs content", i);
    const json_t *task = json_object_get(m, "task");
    if (!is_nullish(task) && (!json_is_string(task) || !task_token(json_string_value(task))))
        return mk_fail(err, MK_EINVAL,
                       "messages[%d].task: expected one of action, query, authority, domain, "
                       "title, read_url, got %s%s%s", i, json_is_string(task) ? "\"" : "",
                       json_is_string(task) ? json_string_value(task) : jtype(task),
                       json_is_string(task) ? "\"" : "");
    const json_t *wo = json_object_get(m, "wo_eos");
    if (!is_nullish(wo) && !json_is_boolean(wo))
        return mk_fail(err, MK_EINVAL, "messages[%d].wo_eos: expected a boolean, got %s", i,
                       jtype(wo));
    if (role == R_SYSTEM || role == R_DEVELOPER) {
        char where[48];
        snprintf(where, sizeof where, "messages[%d].tools", i);
        rc = check_tools(json_object_get(m, "tools"), where, err);
        if (rc) return rc;
    }
    if (role == R_ASSISTANT) {
        const json_t *r = json_object_get(m, "reasoning_content");
        if (!is_nullish(r) && !json_is_string(r))
            return mk_fail(err, MK_EINVAL,
                           "messages[%d].reasoning_content: expected a string, got %s", i, jtype(r));
        rc = check_tool_calls(json_object_get(m, "tool_calls"), i, err);
        if (rc) return rc;
    }
    if (role == R_TOOL) {
        const json_t *id = json_object_get(m, "tool_call_id");
        if (!is_nullish(id) && !json_is_string(id))
            return mk_fail(err, MK_EINVAL, "messages[%d].tool_call_id: expected a string, got %s",
                           i, jtype(id));
        /* The nearest earlier message that is not a tool result must be an assistant message
         * with tool calls; a given tool_call_id must name one of them when they carry ids. */
        int a = i - 1;
        while (a >= 0 && role_of(json_array_get(msgs, (size_t)a)) == R_TOOL) a--;
        const json_t *am = a >= 0 ? json_array_get(msgs, (size_t)a) : NULL;
        const json_t *tcs = am ? json_object_get(am, "tool_calls") : NULL;
        if (!am || role_of(am) != R_ASSISTANT || json_array_size(tcs) == 0)
            return mk_fail(err, MK_EINVAL,
                           "messages[%d]: a tool message must follow an assistant message with "
                           "tool_calls", i);
        const char *want = json_string_value(id);
        if (want && *want) {
            int any_id = 0, found = 0;
            for (size_t j = 0; j < json_array_size(tcs); j++) {
                const char *cid = call_id(json_array_get(tcs, j));
                any_id |= cid != NULL;
                found |= cid && !strcmp(cid, want);
            }
            if (any_id && !found)
                return mk_fail(err, MK_EINVAL,
                               "messages[%d].tool_call_id: \"%s\" names no tool call of "
                               "messages[%d]", i, want, a);
        }
    }
    return MK_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Merged message views (steps 2-4). A user view owns a contiguous range of blocks: blocks are
 * only ever appended to the newest view, so ranges never interleave. */

typedef struct {
    int is_tool;           /* 0: text block (a user message's content), 1: tool_result */
    const json_t *content; /* the message's "content" (may be NULL) */
    const char *id;        /* tool_result: the tool_call_id (NULL if none) */
} block;

typedef struct {
    int role;
    int src;             /* index of msg in the caller's array (-1: the synthetic system) */
    const json_t *msg;   /* the caller's message (for a user view: the one that opened it) */
    const json_t *tools; /* system/developer: the tools to render (caller's param or own) */
    const char *task;    /* NULL when none */
    int b0, nb;          /* user views: blocks[b0 .. b0+nb) */
    int drop_rc;         /* reasoning removed by drop_thinking */
} rmsg;

typedef struct {
    const mk_dsv4_opts *o;
    rmsg *v;      /* merged views, in order */
    int nv;
    rmsg **f;     /* views after the drop_thinking filter: what is rendered */
    int nf;
    block *blk;
    int nblk;
    int drop;     /* effective drop_thinking */
    int last_user;
    sbuf *sb;
    mk_err *err;
} rctx;

/* Text of a content value. Lists: text parts (and, in tool results, "[Unsupported <type>]" for
 * other parts) joined with "\n\n" — the reference's rule for tool-result lists, which we apply
 * to every role since the reference has no list support elsewhere. */
static void put_content(sbuf *b, const json_t *c) {
    if (json_is_string(c)) {
        sb_put(b, json_string_value(c), json_string_length(c));
        return;
    }
    for (size_t j = 0; json_is_array(c) && j < json_array_size(c); j++) {
        const json_t *p = json_array_get(c, j);
        const char *t = json_string_value(json_object_get(p, "type"));
        if (j) sb_put(b, "\n\n", 2);
        if (t && !strcmp(t, "text")) {
            const json_t *x = json_object_get(p, "text");
            sb_put(b, json_string_value(x), json_string_length(x));
        } else {
            sb_puts(b, "[Unsupported ");
            sb_puts(b, t ? t : "None");
            sb_puts(b, "]");
        }
    }
}

/* "## Tools" block: one Python-JSON line per tool's "function" object. */
static void put_tools(sbuf *b, const json_t *tools) {
    sb_puts(b, TOOLS_HEAD);
    for (size_t j = 0; j < json_array_size(tools); j++) {
        if (j) sb_put(b, "\n", 1);
        pyjson_value(b, json_object_get(json_array_get(tools, j), "function"));
    }
    sb_puts(b, TOOLS_TAIL);
}

static void put_param(sbuf *b, const char *key, const json_t *val) {
    sb_puts(b, "<" DSML "parameter name=\"");
    sb_puts(b, key);
    if (json_is_string(val)) {
        /* strings go in raw, unescaped — the model reads them as-is */
        sb_puts(b, "\" string=\"true\">");
        sb_put(b, json_string_value(val), json_string_length(val));
    } else {
        sb_puts(b, "\" string=\"false\">");
        pyjson_value(b, val);
    }
    sb_puts(b, "</" DSML "parameter>");
}

/* One <invoke>: the arguments string is parsed as JSON; each member becomes a parameter. Like
 * the reference, arguments that are not JSON at all become one string parameter "arguments";
 * JSON that is not an object is an error (the reference crashes). An object value (our API
 * allows it) is used as is; null/absent arguments mean no parameters. Known divergence: numbers
 * jansson cannot hold (integers beyond 64 bits, 1e400) take the not-JSON path. */
static int put_invoke(rctx *c, const json_t *tc, int mi, size_t j) {
    sbuf *b = c->sb;
    const json_t *f = json_object_get(tc, "function");
    const json_t *a = json_object_get(f, "arguments");
    json_t *parsed = NULL;
    sb_puts(b, "<" DSML "invoke name=\"");
    sb_puts(b, json_string_value(json_object_get(f, "name")));
    sb_puts(b, "\">\n");
    if (json_is_string(a)) {
        json_error_t je;
        parsed = json_loadb(json_string_value(a), json_string_length(a),
                            JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!parsed) {
            put_param(b, "arguments", a);
        } else if (!json_is_object(parsed)) {
            const char *ty = jtype(parsed); /* a static string: safe after the decref */
            json_decref(parsed);
            return mk_fail(c->err, MK_EINVAL,
                           "messages[%d].tool_calls[%zu].function.arguments: expected a JSON "
                           "object, got %s", mi, j, ty);
        }
        a = parsed;
    }
    if (json_is_object(a)) {
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)a, k, x) {
            if (!first) sb_put(b, "\n", 1);
            first = 0;
            put_param(b, k, x);
        }
    }
    json_decref(parsed);
    sb_puts(b, "\n</" DSML "invoke>");
    return MK_OK;
}

/* Renders view c->f[idx] and its suffix (see the file comment, step 5). */
static int render_one(rctx *c, int idx) {
    sbuf *b = c->sb;
    const rmsg *r = c->f[idx];
    const json_t *m = r->msg;
    int thinking = c->o->thinking != 0;

    if (idx == 0 && thinking && c->o->reasoning_effort && !strcmp(c->o->reasoning_effort, "max"))
        sb_puts(b, EFFORT_MAX);

    switch (r->role) {
    case R_SYSTEM:
    case R_DEVELOPER: {
        /* a developer message is a user turn with the system extras appended */
        if (r->role == R_DEVELOPER) sb_puts(b, MK_DSV4_USER);
        put_content(b, json_object_get(m, "content"));
        if (py_truthy(r->tools)) {
            sb_put(b, "\n\n", 2);
            put_tools(b, r->tools);
        }
        const json_t *rf = json_object_get(m, "response_format");
        if (py_truthy(rf)) {
            sb_put(b, "\n\n", 2);
            sb_puts(b, RESPONSE_FORMAT_HEAD);
            pyjson_value(b, rf);
        }
        break;
    }
    case R_USER:
        sb_puts(b, MK_DSV4_USER);
        for (int k = 0; k < r->nb; k++) {
            const block *bl = &c->blk[r->b0 + k];
            if (k) sb_put(b, "\n\n", 2);
            if (bl->is_tool) sb_puts(b, "<tool_result>");
            put_content(b, bl->content);
            if (bl->is_tool) sb_puts(b, "</tool_result>");
        }
        break;
    case R_REMINDER:
        sb_puts(b, MK_DSV4_LATEST_REMINDER);
        put_content(b, json_object_get(m, "content"));
        break;
    case R_ASSISTANT: {
        /* reasoning: only in thinking mode, not right after a task turn, and (with drop_thinking)
         * only after the last user turn; "<think>" itself was written by the user turn's suffix */
        int prev_task = idx > 0 && c->f[idx - 1]->task;
        if (thinking && !prev_task && (!c->drop || idx > c->last_user)) {
            const json_t *rc = r->drop_rc ? NULL : json_object_get(m, "reasoning_content");
            sb_put(b, json_string_value(rc), json_string_length(rc));
            sb_puts(b, MK_DSV4_THINK_END);
        }
        put_content(b, json_object_get(m, "content"));
        const json_t *tcs = json_object_get(m, "tool_calls");
        if (json_array_size(tcs) > 0) {
            int mi = r->src;
            sb_puts(b, "\n\n<" DSML "tool_calls>\n");
            for (size_t j = 0; j < json_array_size(tcs); j++) {
                if (j) sb_put(b, "\n", 1);
                int rc = put_invoke(c, json_array_get(tcs, j), mi, j);
                if (rc) return rc;
            }
            sb_puts(b, "\n</" DSML "tool_calls>");
        }
        if (!json_is_true(json_object_get(m, "wo_eos"))) sb_puts(b, MK_DSV4_EOS);
        break;
    }
    }

    /* Suffix: only when this is the last message or the next one is an assistant / reminder. */
    if (idx + 1 < c->nf && c->f[idx + 1]->role != R_ASSISTANT && c->f[idx + 1]->role != R_REMINDER)
        return MK_OK;
    if (idx + 1 == c->nf && !c->o->add_generation_prompt) return MK_OK;
    if (r->task) {
        if (strcmp(r->task, "action") != 0) {
            sb_puts(b, task_token(r->task));
        } else {
            sb_puts(b, MK_DSV4_ASSISTANT);
            sb_puts(b, thinking ? MK_DSV4_THINK_BEGIN : MK_DSV4_THINK_END);
            sb_puts(b, task_token(r->task));
        }
    } else if (r->role == R_USER || r->role == R_DEVELOPER) {
        sb_puts(b, MK_DSV4_ASSISTANT);
        int open = thinking && (!c->drop || idx >= c->last_user);
        sb_puts(b, open ? MK_DSV4_THINK_BEGIN : MK_DSV4_THINK_END);
    }
    return MK_OK;
}

/* Stable sort of one user view's tool_result blocks into the order of the latest tool calls
 * (`order` = those calls; a block whose id matches none sorts as position 0, as the reference).
 * Text blocks keep their places; the tool blocks are permuted among the tool-block slots. */
static int sort_tool_blocks(rctx *c, const rmsg *u, const json_t *order) {
    int *slot = malloc((size_t)u->nb * sizeof *slot), *key = malloc((size_t)u->nb * sizeof *key);
    block *tmp = malloc((size_t)u->nb * sizeof *tmp);
    if (!slot || !key || !tmp) {
        free(slot), free(key), free(tmp);
        return mk_fail(c->err, MK_ENOMEM, "mk_dsv4_render: out of memory");
    }
    int n = 0;
    for (int k = 0; k < u->nb; k++) {
        const block *bl = &c->blk[u->b0 + k];
        if (!bl->is_tool) continue;
        int p = 0; /* the reference's dict keeps the last index of a repeated id */
        for (size_t j = 0; bl->id && j < json_array_size(order); j++) {
            const char *cid = call_id(json_array_get(order, j));
            if (cid && !strcmp(cid, bl->id)) p = (int)j;
        }
        /* insertion into tmp/key, stable: equal keys keep arrival order */
        int j = n - 1;
        while (j >= 0 && key[j] > p) {
            key[j + 1] = key[j];
            tmp[j + 1] = tmp[j];
            j--;
        }
        key[j + 1] = p;
        tmp[j + 1] = *bl;
        slot[n++] = u->b0 + k;
    }
    for (int i = 0; i < n; i++) c->blk[slot[i]] = tmp[i];
    free(slot), free(key), free(tmp);
    return MK_OK;
}

void mk_dsv4_opts_default(mk_dsv4_opts *o) {
    o->thinking = 0;
    o->drop_thinking = 1;
    o->reasoning_effort = NULL;
    o->add_generation_prompt = 1;
}

int mk_dsv4_render_len(const json_t *messages, const json_t *tools, const mk_dsv4_opts *o,
                       char **out, size_t *out_len, mk_err *err) {
    mk_dsv4_opts def;
    if (!out) return mk_fail(err, MK_EINVAL, "mk_dsv4_render: out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!o) mk_dsv4_opts_default(&def), o = &def;
    if (!json_is_array(messages))
        return mk_fail(err, MK_EINVAL, "messages: expected an array, got %s", jtype(messages));
    const char *eff = o->reasoning_effort;
    if (eff && strcmp(eff, "high") != 0 && strcmp(eff, "max") != 0)
        return mk_fail(err, MK_EINVAL,
                       "reasoning_effort: \"%s\" is not one of \"high\", \"max\" (or none)", eff);
    int rc = check_tools(tools, "tools", err);
    if (rc) return rc;
    int n = (int)json_array_size(messages);
    for (int i = 0; i < n; i++)
        if ((rc = check_message(messages, i, err))) return rc;

    /* One view and one block per message at most, plus a synthetic system message for tools. */
    rctx c = {.o = o, .err = err};
    sbuf sb = {0};
    json_t *synthetic = NULL; /* the empty system message that carries top-level tools */
    int tools_on_first = 0;
    c.sb = &sb;
    c.v = calloc((size_t)n + 1, sizeof *c.v);
    c.f = calloc((size_t)n + 1, sizeof *c.f);
    c.blk = calloc((size_t)n + 1, sizeof *c.blk);
    if (!c.v || !c.f || !c.blk) {
        rc = mk_fail(err, MK_ENOMEM, "mk_dsv4_render: out of memory");
        goto done;
    }

    /* Top-level tools go on messages[0] when it is system/developer, else on an empty system
     * message in front (how the reference's tests feed top-level tools). */
    if (py_truthy(tools)) {
        int r0 = n > 0 ? role_of(json_array_get(messages, 0)) : -1;
        if (r0 == R_SYSTEM || r0 == R_DEVELOPER) {
            tools_on_first = 1;
        } else {
            synthetic = json_pack("{s:s, s:s}", "role", "system", "content", "");
            if (!synthetic) {
                rc = mk_fail(err, MK_ENOMEM, "mk_dsv4_render: out of memory");
                goto done;
            }
            c.v[c.nv++] = (rmsg){.role = R_SYSTEM, .src = -1, .msg = synthetic, .tools = tools};
        }
    }

    /* Step 2: merge tool results and consecutive user turns. */
    for (int i = 0; i < n; i++) {
        const json_t *m = json_array_get(messages, (size_t)i);
        int role = role_of(m);
        rmsg *last = c.nv ? &c.v[c.nv - 1] : NULL;
        const char *task = json_string_value(json_object_get(m, "task"));
        if (role == R_TOOL || role == R_USER) {
            block bl = {.is_tool = role == R_TOOL, .content = json_object_get(m, "content"),
                        .id = json_string_value(json_object_get(m, "tool_call_id"))};
            /* a tool result joins any preceding user turn; a user text joins one without task */
            int join = last && last->role == R_USER && (role == R_TOOL || !last->task);
            if (join) {
                c.blk[last->b0 + last->nb++] = bl;
                c.nblk++;
            } else {
                c.v[c.nv++] = (rmsg){.role = R_USER, .src = i, .msg = m,
                                     .task = role == R_USER ? task : NULL, .b0 = c.nblk, .nb = 1};
                c.blk[c.nblk++] = bl;
            }
        } else {
            const json_t *t = json_object_get(m, "tools");
            if (i == 0 && tools_on_first) t = tools;
            c.v[c.nv++] = (rmsg){.role = role, .src = i, .msg = m, .tools = t, .task = task};
        }
    }

    /* Step 3: order tool results by the latest assistant tool calls. */
    const json_t *order = NULL;
    for (int k = 0; k < c.nv; k++) {
        const json_t *tcs = json_object_get(c.v[k].msg, "tool_calls");
        if (c.v[k].role == R_ASSISTANT && json_array_size(tcs) > 0) {
            int any = 0;
            for (size_t j = 0; j < json_array_size(tcs); j++)
                any |= call_id(json_array_get(tcs, j)) != NULL;
            order = any ? tcs : NULL; /* an empty id map disables sorting */
        } else if (c.v[k].role == R_USER && order && c.v[k].nb > 1) {
            if ((rc = sort_tool_blocks(&c, &c.v[k], order))) goto done;
        }
    }

    /* Step 4: drop_thinking. Tools anywhere (user turns lost theirs in the merge) keep it off. */
    c.drop = o->drop_thinking != 0;
    for (int k = 0; k < c.nv; k++) {
        const rmsg *r = &c.v[k];
        const json_t *t = NULL;
        if (r->role == R_SYSTEM || r->role == R_DEVELOPER) t = r->tools;
        else if (r->role != R_USER) t = json_object_get(r->msg, "tools");
        if (py_truthy(t)) c.drop = 0;
    }
    int last_user = -1;
    for (int k = c.nv - 1; k >= 0; k--)
        if (c.v[k].role == R_USER || c.v[k].role == R_DEVELOPER) {
            last_user = k;
            break;
        }
    for (int k = 0; k < c.nv; k++) {
        rmsg *r = &c.v[k];
        if (o->thinking && c.drop && k < last_user) {
            if (r->role == R_ASSISTANT) r->drop_rc = 1;
            else if (r->role == R_DEVELOPER) continue; /* the reference drops it entirely */
        }
        c.f[c.nf++] = r;
    }
    c.last_user = -1;
    for (int k = c.nf - 1; k >= 0; k--)
        if (c.f[k]->role == R_USER || c.f[k]->role == R_DEVELOPER) {
            c.last_user = k;
            break;
        }

    /* Step 5: render. */
    sb_puts(&sb, MK_DSV4_BOS);
    for (int k = 0; k < c.nf; k++)
        if ((rc = render_one(&c, k))) goto done;
    *out = sb_take(&sb, out_len);
    rc = *out ? MK_OK : mk_fail(err, MK_ENOMEM, "mk_dsv4_render: out of memory");
done:
    free(sb.p);
    free(c.v);
    free(c.f);
    free(c.blk);
    json_decref(synthetic);
    return rc;
}

int mk_dsv4_render(const json_t *messages, const json_t *tools, const mk_dsv4_opts *o, char **out,
                   mk_err *err) {
    return mk_dsv4_render_len(messages, tools, o, out, NULL, err);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing. */

/* Copy of s with every byte that does not start a well-formed UTF-8 sequence replaced by U+FFFD
 * (no overlongs, surrogates or code points above U+10FFFF). */
static char *utf8_sanitize(const char *s, size_t n, size_t *out_n) {
    sbuf b = {0};
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] >> 6) == 2;
        if (ok && len > 1) {
            uint32_t cp = c & (0x7F >> len);
            for (size_t k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
            static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= min_cp[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok) {
            i += len;
            continue;
        }
        sb_put(&b, s + run, i - run);
        sb_puts(&b, "\xEF\xBF\xBD");
        i++;
        run = i;
    }
    sb_put(&b, s + run, n - run);
    return sb_take(&b, out_n);
}

/* The reference's _read_until_stop: from *pos, find the earliest of the stop strings. The text
 * before it is [*pos, *seg_end); *pos moves past the stop. Returns the stop's index, or -1 when
 * none occurs (then the segment is the rest and *pos = n). */
static int read_until(const char *t, size_t n, size_t *pos, const char *const *stops, int ns,
                      size_t *seg_start, size_t *seg_end) {
    size_t best = n;
    int which = -1;
    for (int k = 0; k < ns; k++) {
        const char *p = memmem(t + *pos, n - *pos, stops[k], strlen(stops[k]));
        if (p && (size_t)(p - t) < best) best = (size_t)(p - t), which = k;
    }
    *seg_start = *pos;
    *seg_end = best;
    *pos = which >= 0 ? best + strlen(stops[which]) : n;
    return which;
}

static int seg_is(const char *t, size_t a, size_t b, const char *lit) {
    return b - a == strlen(lit) && !memcmp(t + a, lit, b - a);
}

static int ends_with(const char *t, size_t a, size_t b, const char *lit) {
    size_t l = strlen(lit);
    return b - a >= l && !memcmp(t + b - l, lit, l);
}

/* Python's `$` matches at the end or before one final "\n"; the reference's regexes end in
 * `">\n$` and `<$`, so each accepts two endings. Returns the length of the matched tail, 0 if
 * neither fits. `lit` is the tail without that optional newline. */
static size_t dollar_tail(const char *t, size_t a, size_t b, const char *lit) {
    size_t l = strlen(lit);
    if (b > a && t[b - 1] == '\n' && ends_with(t, a, b - 1, lit)) return l + 1;
    if (ends_with(t, a, b, lit)) return l;
    return 0;
}

typedef struct {
    size_t name_a, name_b, val_a, val_b;
    int is_str;
} dsml_param;

/* `^ name="(.*?)" string="(true|false)">(.*?)<$`: the name ends at the first `" string="true">`
 * or `" string="false">` that leaves room for the value before the final '<'. */
static int match_param(const char *t, size_t a, size_t b, dsml_param *p) {
    static const char head[] = " name=\"";
    size_t tail = dollar_tail(t, a, b, "<");
    if (!tail || b - a < sizeof head - 1 || memcmp(t + a, head, sizeof head - 1)) return 0;
    size_t vend = b - tail;
    for (size_t q = a + sizeof head - 1; q < vend; q++) {
        static const char *const hs[2] = {"\" string=\"true\">", "\" string=\"false\">"};
        for (int k = 0; k < 2; k++) {
            size_t l = strlen(hs[k]);
            if (q + l <= vend && !memcmp(t + q, hs[k], l)) {
                *p = (dsml_param){a + sizeof head - 1, q, q + l, vend, k == 0};
                return 1;
            }
        }
    }
    return 0;
}

void mk_dsv4_msg_free(mk_dsv4_msg *m) {
    if (!m) return;
    free(m->reasoning);
    free(m->content);
    for (int i = 0; i < m->n_calls; i++) {
        free(m->calls[i].name);
        free(m->calls[i].arguments);
    }
    free(m->calls);
    memset(m, 0, sizeof *m);
}

/* parse_tool_calls(): from just after "\n\n<｜DSML｜tool_calls", read invokes until the closing
 * tag. Appends the calls to out; *pos ends after the block. */
static int parse_calls(const char *t, size_t n, size_t *pos, mk_dsv4_msg *out, mk_err *err) {
    static const char *const s_invoke[2] = {INVOKE_OPEN, TOOL_CALLS_END};
    static const char *const s_body[2] = {PARAM_OPEN, INVOKE_CLOSE};
    static const char *const s_pclose[1] = {PARAM_CLOSE};
    size_t a, b;
    dsml_param *ps = NULL;
    int nps = 0, cap = 0, rc = MK_OK;
    while (*pos < n) {
        int st = read_until(t, n, pos, s_invoke, 2, &a, &b);
        if (!seg_is(t, a, b, ">\n")) {
            rc = mk_fail(err, MK_EINVAL, "completion offset %zu: DSML: expected \">\\n\" before "
                         "an invoke or the end of the tool calls", a);
            break;
        }
        if (st == 1) break;
        if (st < 0) {
            rc = mk_fail(err, MK_EINVAL, "completion offset %zu: DSML: missing </%stool_calls>",
                         b, DSML);
            break;
        }
        /* `^\s*name="(.*?)">\n$` */
        st = read_until(t, n, pos, s_body, 2, &a, &b);
        size_t na = a, tl = dollar_tail(t, a, b, "\">\n");
        while (na < b && strchr(" \t\n\r\f\v", t[na])) na++;
        if (!tl || b - na < 6 + tl || memcmp(t + na, "name=\"", 6)) {
            rc = mk_fail(err, MK_EINVAL, "completion offset %zu: DSML: bad invoke header", a);
            break;
        }
        size_t name_a = na + 6, name_b = b - tl;
        nps = 0;
        while (st == 0) {
            dsml_param p;
            read_until(t, n, pos, s_pclose, 1, &a, &b);
            if (!match_param(t, a, b, &p)) {
                rc = mk_fail(err, MK_EINVAL, "completion offset %zu: DSML: bad parameter", a);
                goto out;
            }
            for (int k = 0; k < nps; k++)
                if (ps[k].name_b - ps[k].name_a == p.name_b - p.name_a &&
                    !memcmp(t + ps[k].name_a, t + p.name_a, p.name_b - p.name_a)) {
                    rc = mk_fail(err, MK_EINVAL,
                                 "completion offset %zu: DSML: duplicate parameter \"%.*s\"", a,
                                 (int)(p.name_b - p.name_a), t + p.name_a);
                    goto out;
                }
            if (nps == cap) {
                cap = cap ? cap * 2 : 8;
                dsml_param *np = realloc(ps, (size_t)cap * sizeof *ps);
                if (!np) {
                    rc = mk_fail(err, MK_ENOMEM, "mk_dsv4_parse: out of memory");
                    goto out;
                }
                ps = np;
            }
            ps[nps++] = p;
            st = read_until(t, n, pos, s_body, 2, &a, &b);
            if (!seg_is(t, a, b, ">\n")) {
                rc = mk_fail(err, MK_EINVAL,
                             "completion offset %zu: DSML: expected \">\\n\" after a parameter", a);
                goto out;
            }
        }
        /* arguments = "{" + ", ".join(json(key) + ": " + value) + "}", strings JSON-encoded,
         * string="false" values verbatim (the reference does not re-serialize them) */
        sbuf args = {0};
        sb_put(&args, "{", 1);
        for (int k = 0; k < nps; k++) {
            if (k) sb_put(&args, ", ", 2);
            pyjson_str(&args, t + ps[k].name_a, ps[k].name_b - ps[k].name_a);
            sb_put(&args, ": ", 2);
            if (ps[k].is_str) pyjson_str(&args, t + ps[k].val_a, ps[k].val_b - ps[k].val_a);
            else sb_put(&args, t + ps[k].val_a, ps[k].val_b - ps[k].val_a);
        }
        sb_put(&args, "}", 1);
        mk_dsv4_tool_call *nc = realloc(out->calls, (size_t)(out->n_calls + 1) * sizeof *nc);
        if (nc) out->calls = nc;
        char *name = xstrndup(t + name_a, name_b - name_a);
        char *as = sb_take(&args, NULL);
        if (!nc || !name || !as) {
            free(name);
            free(as);
            rc = mk_fail(err, MK_ENOMEM, "mk_dsv4_parse: out of memory");
            break;
        }
        out->calls[out->n_calls++] = (mk_dsv4_tool_call){name, as};
    }
out:
    free(ps);
    return rc;
}

/* Reasoning and content may not contain special tokens (the reference's final assertion). */
static int check_no_special(const char *t, size_t a, size_t b, const char *what, mk_err *err) {
    static const char *const sp[] = {MK_DSV4_BOS, MK_DSV4_EOS, MK_DSV4_THINK_BEGIN,
                                     MK_DSV4_THINK_END, DSML};
    for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++) {
        const char *p = memmem(t + a, b - a, sp[k], strlen(sp[k]));
        if (p)
            return mk_fail(err, MK_EINVAL, "completion offset %zu: unexpected \"%s\" in %s",
                           (size_t)(p - t), sp[k], what);
    }
    return MK_OK;
}

int mk_dsv4_parse(const char *text, size_t len, int thinking, mk_dsv4_msg *out, mk_err *err) {
    static const char *const s_think[2] = {MK_DSV4_THINK_END, TOOL_CALLS_START};
    static const char *const s_content[2] = {MK_DSV4_EOS, TOOL_CALLS_START};
    static const char *const s_eos[1] = {MK_DSV4_EOS};
    if (!out) return mk_fail(err, MK_EINVAL, "mk_dsv4_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!text && len) return mk_fail(err, MK_EINVAL, "mk_dsv4_parse: text is NULL");
    size_t n;
    char *t = utf8_sanitize(text ? text : "", len, &n);
    if (!t) return mk_fail(err, MK_ENOMEM, "mk_dsv4_parse: out of memory");
    size_t pos = 0, ra = 0, rb = 0, ca = 0, cb = 0, a, b;
    int rc = MK_OK, truncated = 0;
    if (thinking) {
        int st = read_until(t, n, &pos, s_think, 2, &ra, &rb);
        if (st == 1) {
            rc = mk_fail(err, MK_EINVAL, "completion offset %zu: tool calls before </think>", rb);
            goto fail;
        }
        if (st < 0) {
            /* no "</think>" (truncated, or EOS inside reasoning): all of it is reasoning */
            truncated = 1;
            pos = 0;
            read_until(t, n, &pos, s_eos, 1, &ra, &rb);
            ca = cb = n;
        }
    }
    if (!truncated) {
        /* content up to EOS or the tool-call block; a missing EOS is accepted (truncation) */
        int st = read_until(t, n, &pos, s_content, 2, &ca, &cb);
        if (st == 1) {
            if ((rc = parse_calls(t, n, &pos, out, err))) goto fail;
            read_until(t, n, &pos, s_eos, 1, &a, &b);
            if (a != b) {
                rc = mk_fail(err, MK_EINVAL, "completion offset %zu: text after the tool calls", a);
                goto fail;
            }
        }
    }
    if (pos != n) {
        rc = mk_fail(err, MK_EINVAL, "completion offset %zu: text after %s", pos, MK_DSV4_EOS);
        goto fail;
    }
    if ((rc = check_no_special(t, ra, rb, "reasoning", err)) ||
        (rc = check_no_special(t, ca, cb, "content", err)))
        goto fail;
    out->reasoning = xstrndup(t + ra, rb - ra);
    out->content = xstrndup(t + ca, cb - ca);
    if (!out->reasoning || !out->content) {
        rc = mk_fail(err, MK_ENOMEM, "mk_dsv4_parse: out of memory");
        goto fail;
    }
    free(t);
    return MK_OK;
fail:
    free(t);
    mk_dsv4_msg_free(out);
    return rc;
}

json_t *mk_dsv4_msg_to_json(const mk_dsv4_msg *m) {
    json_t *calls = json_array();
    for (int i = 0; calls && i < m->n_calls; i++) {
        json_t *c = json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name",
                              m->calls[i].name, "arguments", m->calls[i].arguments);
        if (!c || json_array_append_new(calls, c)) {
            json_decref(calls);
            return NULL;
        }
    }
    if (!calls) return NULL;
    return json_pack("{s:s, s:s, s:s, s:o}", "role", "assistant", "content",
                     m->content ? m->content : "", "reasoning_content",
                     m->reasoning ? m->reasoning : "", "tool_calls", calls);
}
