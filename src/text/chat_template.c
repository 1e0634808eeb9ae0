/* chat_template.c — recognising ChatML / Llama-3 Jinja chat templates and rendering their plain-text
 * conversations (see chat_template.h for the formats).
 *
 * Detection looks only for marker strings, as llama.cpp's built-in template detection does: the
 * special-token texts a family's template must write. Rendering validates every message first, so
 * a bad request fails before any output is built, then writes the family's format into one
 * growable buffer. Byte-exactness matters (a stray "\n" changes every token after it), so each
 * format is spelled out once, in the render functions, and tests compare it with jinja2 rendering
 * the model's own template (tests/tokenizer/gguf_vs_llamacpp.py).
 */
#include "text/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable buffer (oom is sticky: append freely, check once) -------------------------------- */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} tbuf;

static void tb_put(tbuf *b, const char *s, size_t n) {
    if (b->oom) return;
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
static void tb_puts(tbuf *b, const char *s) { tb_put(b, s, strlen(s)); }

/* ---- detection ------------------------------------------------------------------------------------ */

int mk_tmpl_detect(const char *jinja, mk_tmpl *out, mk_err *err) {
    *out = MK_TMPL_NONE;
    int chatml = jinja && strstr(jinja, "<|im_start|>") && strstr(jinja, "<|im_end|>");
    int llama3 = jinja && strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>");
    if (chatml == llama3) /* neither, or a template mixing both that we would have to guess at */
        return mk_fail(err, MK_ENOTSUP, "unknown chat template; pass --chat-template chatml|llama3");
    *out = chatml ? MK_TMPL_CHATML : MK_TMPL_LLAMA3;
    if (llama3 && strstr(jinja, "Cutting Knowledge Date"))
        mk_log(MK_LOG_WARN, "chat template: Llama-3.1-style template; its \"Cutting Knowledge Date / Today Date\" "
                            "system preamble is not rendered (Llama-3 format used)");
    return 0;
}

int mk_tmpl_by_name(const char *name, mk_tmpl *out, mk_err *err) {
    *out = MK_TMPL_NONE;
    if (name && !strcmp(name, "chatml")) *out = MK_TMPL_CHATML;
    else if (name && !strcmp(name, "llama3")) *out = MK_TMPL_LLAMA3;
    else return mk_fail(err, MK_EINVAL, "unknown chat template name \"%s\" (known: chatml, llama3)", name ? name : "(null)");
    return 0;
}

const char *mk_tmpl_name(mk_tmpl t) {
    return t == MK_TMPL_CHATML ? "chatml" : t == MK_TMPL_LLAMA3 ? "llama3" : "none";
}

/* Decodes the Jinja string literal that starts at the quote *q; returns the position after the
 * closing quote (NULL if unterminated), the decoded text in *b. */
static const char *jinja_literal(const char *q, tbuf *b) {
    char quote = *q;
    const char *p = q + 1;
    for (; *p && *p != quote; p++) {
        if (*p != '\\' || !p[1]) {
            tb_put(b, p, 1);
            continue;
        }
        char c = *++p, d = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        if (c == 'n' || c == 't' || c == 'r' || c == '\\' || c == '\'' || c == '"') {
            tb_put(b, &d, 1);
        } else { /* any other escape is kept as written */
            tb_put(b, p - 1, 2);
        }
    }
    return *p ? p + 1 : NULL;
}

/* Finds a string literal (quoted '...' or "...") that starts with "<|im_start|>system" and decodes to
 * "<|im_start|>system\n{TEXT}<|im_end|>" plus an optional "\n". Literals that stop earlier (the
 * '<|im_start|>system\n' + messages[0]['content'] of a template without a default) do not match. */
int mk_tmpl_default_system(const char *jinja, char **out, mk_err *err) {
    static const char head[] = "<|im_start|>system\n", tail[] = "<|im_end|>";
    *out = NULL;
    if (!jinja) return 0;
    for (const char *m = jinja; (m = strstr(m, "<|im_start|>system")); m++) {
        if (m == jinja || (m[-1] != '\'' && m[-1] != '"')) continue;
        tbuf b = {0};
        const char *end = jinja_literal(m - 1, &b);
        if (b.oom) {
            free(b.p);
            return mk_fail(err, MK_ENOMEM, "chat template: out of memory");
        }
        size_t hl = sizeof head - 1, tl = sizeof tail - 1, n = b.n;
        if (end && n && b.p[n - 1] == '\n') n--;
        if (end && n >= hl + tl && !memcmp(b.p, head, hl) && !memcmp(b.p + n - tl, tail, tl) &&
            !memmem(b.p + hl, n - hl - tl, tail, tl)) {
            memmove(b.p, b.p + hl, n - hl - tl);
            b.p[n - hl - tl] = 0;
            *out = b.p;
            return 0;
        }
        free(b.p);
    }
    return 0;
}

/* ---- rendering -------------------------------------------------------------------------------------- */

/* One validated message: role and content pieces (the content string, or the text parts). */
typedef struct {
    const char *role;
    const json_t *content; /* string, array of text parts, or NULL/null */
} tmsg;

/* Appends the message's content: a string, "" for null, text parts joined with "\n". */
static void put_content(tbuf *b, const json_t *c) {
    if (json_is_string(c)) {
        tb_put(b, json_string_value(c), json_string_length(c));
    } else if (json_is_array(c)) {
        for (size_t j = 0; j < json_array_size(c); j++) {
            const json_t *t = json_object_get(json_array_get(c, j), "text");
            if (j) tb_put(b, "\n", 1);
            tb_put(b, json_string_value(t), json_string_length(t));
        }
    }
}

/* A text without embedded NUL (the output is a C string). */
static int check_text(const json_t *s, size_t i, const char *field, mk_err *err) {
    if (memchr(json_string_value(s), 0, json_string_length(s)))
        return mk_fail(err, MK_EINVAL, "messages[%zu].%s: contains a NUL character", i, field);
    return 0;
}

static int check_messages(const json_t *messages, tmsg **out, size_t *n, mk_err *err) {
    *out = NULL;
    *n = 0;
    if (!json_is_array(messages)) return mk_fail(err, MK_EINVAL, "messages: expected an array");
    size_t k = json_array_size(messages);
    tmsg *m = calloc(k ? k : 1, sizeof *m);
    if (!m) return mk_fail(err, MK_ENOMEM, "chat template: out of memory");
    int rc = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        const json_t *o = json_array_get(messages, i), *r = json_object_get(o, "role"), *c, *tc;
        if (!json_is_object(o)) {
            rc = mk_fail(err, MK_EINVAL, "messages[%zu]: expected an object", i);
            break;
        }
        const char *role = json_string_value(r);
        if (!role) {
            rc = mk_fail(err, MK_EINVAL, "messages[%zu].role: expected a string", i);
            break;
        }
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant")) {
            rc = mk_fail(err, MK_EINVAL, "messages[%zu].role: \"%s\" is not supported (system, user, assistant)", i, role);
            break;
        }
        tc = json_object_get(o, "tool_calls");
        if (tc && !json_is_null(tc) && !(json_is_array(tc) && json_array_size(tc) == 0)) {
            rc = mk_fail(err, MK_EINVAL, "messages[%zu].tool_calls: tool calls are not supported by this chat template renderer", i);
            break;
        }
        c = json_object_get(o, "content");
        if (json_is_string(c)) {
            rc = check_text(c, i, "content", err);
        } else if (json_is_array(c)) {
            for (size_t j = 0; j < json_array_size(c) && !rc; j++) {
                const json_t *p = json_array_get(c, j), *t = json_object_get(p, "text");
                const char *ty = json_string_value(json_object_get(p, "type"));
                if (!json_is_object(p) || !ty || strcmp(ty, "text") || !json_is_string(t)) {
                    rc = mk_fail(err, MK_EINVAL, "messages[%zu].content[%zu]: expected {\"type\": \"text\", \"text\": string}", i, j);
                } else if (memchr(json_string_value(t), 0, json_string_length(t))) {
                    rc = mk_fail(err, MK_EINVAL, "messages[%zu].content[%zu].text: contains a NUL character", i, j);
                }
            }
        } else if (c && !json_is_null(c)) {
            rc = mk_fail(err, MK_EINVAL, "messages[%zu].content: expected a string, null or a list of text parts", i);
        }
        m[i] = (tmsg){role, c};
    }
    if (rc) {
        free(m);
        return rc;
    }
    *out = m;
    *n = k;
    return 0;
}

/* Python's str.isspace() characters, which Jinja's trim (str.strip()) removes. */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code point at s (of n bytes) and its length; 0 when s does not start with valid UTF-8 of a
 * code point we care about (then it is not whitespace either). */
static int cp_at(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n >= 1 && s[0] < 0x80) return *cp = s[0], 1;
    if (n >= 2 && (s[0] & 0xE0) == 0xC0 && (s[1] & 0xC0) == 0x80) return *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F), 2;
    if (n >= 3 && (s[0] & 0xF0) == 0xE0 && (s[1] & 0xC0) == 0x80 && (s[2] & 0xC0) == 0x80)
        return *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F), 3;
    return 0;
}

/* Appends s without the leading and trailing Python whitespace. */
static void put_trimmed(tbuf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, e = n;
    uint32_t cp;
    int l;
    while (a < e && (l = cp_at(u + a, e - a, &cp)) && py_space(cp)) a += (size_t)l;
    while (e > a) { /* step back over one code point: continuation bytes, then its lead byte */
        size_t k = e - 1;
        while (k > a && (u[k] & 0xC0) == 0x80 && e - k < 4) k--;
        if (!((l = cp_at(u + k, e - k, &cp)) && (size_t)l == e - k && py_space(cp))) break;
        e = k;
    }
    tb_put(b, s + a, e - a);
}

static void render_chatml(tbuf *b, const tmsg *m, size_t n, int gen, const char *dflt) {
    if (dflt && n && strcmp(m[0].role, "system")) {
        tb_puts(b, "<|im_start|>system\n");
        tb_puts(b, dflt);
        tb_puts(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        tb_puts(b, "<|im_start|>");
        tb_puts(b, m[i].role);
        tb_puts(b, "\n");
        put_content(b, m[i].content);
        tb_puts(b, "<|im_end|>\n");
    }
    if (gen) tb_puts(b, "<|im_start|>assistant\n");
}

static void llama3_msg(tbuf *b, const char *role, const char *text, size_t len) {
    tb_puts(b, "<|start_header_id|>");
    tb_puts(b, role);
    tb_puts(b, "<|end_header_id|>\n\n");
    put_trimmed(b, text, len);
    tb_puts(b, "<|eot_id|>");
}

static void render_llama3(tbuf *b, const tmsg *m, size_t n, int gen, const char *dflt) {
    if (n) tb_puts(b, "<|begin_of_text|>");
    if (dflt && n && strcmp(m[0].role, "system")) llama3_msg(b, "system", dflt, strlen(dflt));
    tbuf c = {0};
    for (size_t i = 0; i < n; i++) {
        c.n = 0;
        put_content(&c, m[i].content);
        if (c.oom) b->oom = 1;
        llama3_msg(b, m[i].role, c.p ? c.p : "", c.n);
    }
    free(c.p);
    if (gen) tb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

int mk_tmpl_render(mk_tmpl t, const json_t *messages, int add_generation_prompt, const char *default_system,
                   char **out, mk_err *err) {
    *out = NULL;
    if (t != MK_TMPL_CHATML && t != MK_TMPL_LLAMA3)
        return mk_fail(err, MK_EINVAL, "chat template: none selected; pass --chat-template chatml|llama3");
    tmsg *m;
    size_t n;
    int rc = check_messages(messages, &m, &n, err);
    if (rc) return rc;
    tbuf b = {0};
    tb_put(&b, "", 0); /* an empty rendering is still a string */
    if (t == MK_TMPL_CHATML) render_chatml(&b, m, n, add_generation_prompt, default_system);
    else render_llama3(&b, m, n, add_generation_prompt, default_system);
    free(m);
    if (b.oom) {
        free(b.p);
        return mk_fail(err, MK_ENOMEM, "chat template: out of memory");
    }
    *out = b.p;
    return 0;
}
