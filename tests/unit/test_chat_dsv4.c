/* test_chat_dsv4.c — unit tests of src/text/chat_dsv4.{h,c}, the DeepSeek-V4 chat encoding.
 *
 * Golden data lives in tests/data/encoding-dsv4 (a copy of the shared golden folder):
 *   - test_input_N.json -> test_output_N.txt: the four official cases of encoding_dsv4.py. Their
 *     options are read off the outputs (FORMAT.md does not list them): 1-3 are thinking mode
 *     ("<think>" after the last user turn), 4 is chat mode ("</think><｜action｜>"); all use the
 *     defaults drop_thinking=True, reasoning_effort=None. Case 1 is an object {tools, messages}
 *     whose top-level tools the reference's test script puts on messages[0] — our `tools` arg.
 *   - vectors.json: 14 "encode" cases (messages, options, prompt) compared byte for byte and 10
 *     "parse" cases (completion, thinking_mode, parsed) compared as JSON values; the vectors store
 *     tool-call arguments as strings, so those compare as exact strings.
 * Then hand-written cases for the rules the vectors do not reach (merging, sorting, tasks,
 * list content, Python-style JSON), input errors (MK_EINVAL naming the field) and malformed
 * completions (MK_EINVAL, never a crash; every prefix of a valid completion is tried).
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "text/chat_dsv4.h"

/* ---------------------------------------------------------------- helpers */

static char *slurp(const char *name, size_t *len) {
    char path[512];
    snprintf(path, sizeof path, "%s/encoding-dsv4/%s", mk_test_data_dir(), name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    cr_assert(p && fread(p, 1, (size_t)n, f) == (size_t)n);
    p[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return p;
}

static json_t *load_json(const char *name) {
    char path[512];
    json_error_t je;
    snprintf(path, sizeof path, "%s/encoding-dsv4/%s", mk_test_data_dir(), name);
    json_t *j = json_load_file(path, 0, &je);
    cr_assert(j, "%s: %s (line %d)", path, je.text, je.line);
    return j;
}

static json_t *js(const char *text) {
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    cr_assert(j, "bad test JSON: %s: %s", je.text, text);
    return j;
}

/* Byte-compares two prompts; on mismatch reports the first differing offset with context. */
static void expect_same(const char *what, const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    if (got[i] == want[i]) return;
    size_t from = i > 40 ? i - 40 : 0;
    cr_assert_fail("%s: differs at byte %zu (got %zu bytes, want %zu)\n  got:  ...%.80s\n  want: ...%.80s",
                   what, i, strlen(got), strlen(want), got + from, want + from);
}

static char *render(const json_t *msgs, const json_t *tools, const mk_dsv4_opts *o) {
    char *out = NULL;
    mk_err err = {0};
    int rc = mk_dsv4_render(msgs, tools, o, &out, &err);
    cr_assert_eq(rc, MK_OK, "render failed: %s", err.msg);
    return out;
}

static mk_dsv4_opts opts(int thinking) {
    mk_dsv4_opts o;
    mk_dsv4_opts_default(&o);
    o.thinking = thinking;
    return o;
}

/* Renders `msgs_json` and expects MK_EINVAL with `needle` in the message. */
static void expect_einval(const char *msgs_json, const char *needle) {
    json_t *m = js(msgs_json);
    char *out = (char *)0x1;
    mk_err err = {0};
    mk_dsv4_opts o = opts(1);
    int rc = mk_dsv4_render(m, NULL, &o, &out, &err);
    cr_expect_eq(rc, MK_EINVAL, "%s: rc %d", msgs_json, rc);
    cr_expect_null(out, "out must be NULL on error");
    cr_expect(strstr(err.msg, needle), "error \"%s\" does not name \"%s\"", err.msg, needle);
    json_decref(m);
}

/* ---------------------------------------------------------------- official cases */

static void official(int n, int thinking) {
    char in[32], outn[32];
    snprintf(in, sizeof in, "test_input_%d.json", n);
    snprintf(outn, sizeof outn, "test_output_%d.txt", n);
    json_t *root = load_json(in);
    const json_t *msgs = json_is_array(root) ? root : json_object_get(root, "messages");
    const json_t *tools = json_is_array(root) ? NULL : json_object_get(root, "tools");
    char *want = slurp(outn, NULL);
    mk_dsv4_opts o = opts(thinking);
    char *got = render(msgs, tools, &o);
    expect_same(in, got, want);
    free(got);
    free(want);
    json_decref(root);
}

Test(chat_dsv4, official_1_tools_thinking) { official(1, 1); }
Test(chat_dsv4, official_2_drop_thinking) { official(2, 1); }
Test(chat_dsv4, official_3_developer_reminder) { official(3, 1); }
Test(chat_dsv4, official_4_action_task_chat) { official(4, 0); }

/* ---------------------------------------------------------------- vectors.json */

Test(chat_dsv4, encode_vectors) {
    json_t *v = load_json("vectors.json");
    const json_t *enc = json_object_get(v, "encode");
    cr_assert_eq(json_array_size(enc), 14);
    size_t i;
    const json_t *c;
    int exact = 0;
    json_array_foreach(enc, i, c) {
        const json_t *op = json_object_get(c, "options");
        mk_dsv4_opts o;
        mk_dsv4_opts_default(&o);
        o.thinking = !strcmp(json_string_value(json_object_get(op, "thinking_mode")), "thinking");
        o.drop_thinking = json_is_true(json_object_get(op, "drop_thinking"));
        o.reasoning_effort = json_string_value(json_object_get(op, "reasoning_effort"));
        char *got = render(json_object_get(c, "messages"), NULL, &o);
        expect_same(json_string_value(json_object_get(c, "name")), got,
                    json_string_value(json_object_get(c, "prompt")));
        exact++;
        free(got);
    }
    cr_assert_eq(exact, 14);
    json_decref(v);
}

Test(chat_dsv4, parse_vectors) {
    json_t *v = load_json("vectors.json");
    const json_t *par = json_object_get(v, "parse");
    cr_assert_eq(json_array_size(par), 10);
    size_t i;
    const json_t *c;
    json_array_foreach(par, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *comp = json_object_get(c, "completion");
        int thinking = !strcmp(json_string_value(json_object_get(c, "thinking_mode")), "thinking");
        mk_dsv4_msg m;
        mk_err err = {0};
        int rc = mk_dsv4_parse(json_string_value(comp), json_string_length(comp), thinking, &m, &err);
        cr_assert_eq(rc, MK_OK, "%s: %s", name, err.msg);
        json_t *got = mk_dsv4_msg_to_json(&m);
        const json_t *want = json_object_get(c, "parsed");
        char *gs = json_dumps(got, JSON_SORT_KEYS), *ws = json_dumps(want, JSON_SORT_KEYS);
        cr_assert(json_equal(got, want), "%s:\n  got  %s\n  want %s", name, gs, ws);
        free(gs);
        free(ws);
        json_decref(got);
        mk_dsv4_msg_free(&m);
    }
    json_decref(v);
}

/* Render -> parse round trip: the assistant turn as rendered (everything after its "<think>")
 * parses back to the same reasoning, content and calls, with floats in Python repr form. */
Test(chat_dsv4, render_parse_round_trip) {
    const char *msgs =
        "[{\"role\":\"user\",\"content\":\"q\"},"
        " {\"role\":\"assistant\",\"reasoning_content\":\"r\",\"content\":\"c\",\"tool_calls\":["
        "  {\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "   \"{\\\"s\\\": \\\"a\\\\\\\"b\\\\n\\\", \\\"n\\\": [1, 2.5, 1e-07, 1e+16], \\\"o\\\": {}}\"}},"
        "  {\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]}]";
    json_t *m = js(msgs);
    mk_dsv4_opts o = opts(1);
    char *p = render(m, NULL, &o);
    const char *start = strstr(p, MK_DSV4_ASSISTANT "<think>");
    cr_assert(start);
    start += strlen(MK_DSV4_ASSISTANT "<think>");
    mk_dsv4_msg out;
    mk_err err = {0};
    cr_assert_eq(mk_dsv4_parse(start, strlen(start), 1, &out, &err), MK_OK, "%s", err.msg);
    cr_expect_str_eq(out.reasoning, "r");
    cr_expect_str_eq(out.content, "c");
    cr_assert_eq(out.n_calls, 2);
    cr_expect_str_eq(out.calls[0].name, "f");
    cr_expect_str_eq(out.calls[0].arguments,
                     "{\"s\": \"a\\\"b\\n\", \"n\": [1, 2.5, 1e-07, 1e+16], \"o\": {}}");
    cr_expect_str_eq(out.calls[1].name, "g");
    cr_expect_str_eq(out.calls[1].arguments, "{}");
    mk_dsv4_msg_free(&out);
    free(p);
    json_decref(m);
}

/* ---------------------------------------------------------------- rules beyond the vectors */

Test(chat_dsv4, pyjson_matches_python) {
    /* expected strings are what Python's json.dumps(..., ensure_ascii=False) prints */
    static const char *const cases[][2] = {
        {"[0.1, 1e-05, 0.0001, 1e16, 1e15, 100.0, -0.0, 5e-324, 1.7976931348623157e308]",
         "[0.1, 1e-05, 0.0001, 1e+16, 1000000000000000.0, 100.0, -0.0, 5e-324, "
         "1.7976931348623157e+308]"},
        {"[1.5e300, 123456789.125, 2.5e-300, 0.30000000000000004, -12]",
         "[1.5e+300, 123456789.125, 2.5e-300, 0.30000000000000004, -12]"},
        {"{\"b\":\"caf\\u00e9 \\u6771 \\ud83d\\ude42\",\"a\":\"\\u001f\\u007f\\t\\\"\\\\/\"}",
         "{\"b\": \"café 東 🙂\", \"a\": \"\\u001f\x7f\\t\\\"\\\\/\"}"},
        {"{\"e\":{},\"l\":[],\"t\":true,\"f\":false,\"n\":null}",
         "{\"e\": {}, \"l\": [], \"t\": true, \"f\": false, \"n\": null}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = js(cases[i][0]);
        char *s = mk_dsv4_pyjson(j);
        cr_expect_str_eq(s, cases[i][1]);
        free(s);
        json_decref(j);
    }
}

Test(chat_dsv4, tool_results_merge_and_sort) {
    /* results given in reverse call order come out in call order, in one user turn, joined
     * with "\n\n"; a following user message joins the same turn */
    json_t *m = js("[{\"role\":\"user\",\"content\":\"u\"},"
                   " {\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
                   "  {\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}},"
                   "  {\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{\"y\":\"s\"}}}]},"
                   " {\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"B\"},"
                   " {\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":[{\"type\":\"text\",\"text\":\"A1\"},{\"type\":\"image\"}]},"
                   " {\"role\":\"user\",\"content\":\"more\"}]");
    mk_dsv4_opts o = opts(0);
    char *p = render(m, NULL, &o);
    expect_same("merge", p,
                MK_DSV4_BOS MK_DSV4_USER "u" MK_DSV4_ASSISTANT "</think>\n\n<｜DSML｜tool_calls>\n"
                "<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"y\" string=\"true\">s</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
                "</｜DSML｜tool_calls>" MK_DSV4_EOS MK_DSV4_USER
                "<tool_result>A1\n\n[Unsupported image]</tool_result>\n\n<tool_result>B</tool_result>\n\nmore"
                MK_DSV4_ASSISTANT "</think>");
    free(p);
    json_decref(m);
}

Test(chat_dsv4, tasks_generation_prompt_and_list_content) {
    json_t *m = js("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}],"
                   "  \"task\":\"query\"}]");
    mk_dsv4_opts o = opts(1);
    char *p = render(m, NULL, &o);
    expect_same("query task", p, MK_DSV4_BOS MK_DSV4_USER "a\n\nb<｜query｜>");
    free(p);
    json_decref(m);

    m = js("[{\"role\":\"user\",\"content\":\"hi\",\"task\":\"action\"}]");
    p = render(m, NULL, &o);
    expect_same("action task", p, MK_DSV4_BOS MK_DSV4_USER "hi" MK_DSV4_ASSISTANT "<think><｜action｜>");
    free(p);

    o.add_generation_prompt = 0;
    p = render(m, NULL, &o);
    expect_same("no generation prompt", p, MK_DSV4_BOS MK_DSV4_USER "hi");
    free(p);
    json_decref(m);

    /* reasoning_effort "max" goes right after BOS, only in thinking mode; wo_eos drops EOS */
    m = js("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\",\"wo_eos\":true}]");
    o = opts(1);
    o.reasoning_effort = "max";
    p = render(m, NULL, &o);
    cr_expect(!strncmp(p, MK_DSV4_BOS "Reasoning Effort: Absolute maximum", strlen(MK_DSV4_BOS) + 34));
    cr_expect(!strcmp(p + strlen(p) - strlen(MK_DSV4_USER "x" MK_DSV4_ASSISTANT "<think></think>y"),
                      MK_DSV4_USER "x" MK_DSV4_ASSISTANT "<think></think>y"), "%s", p);
    free(p);
    o = opts(0);
    o.reasoning_effort = "max";
    p = render(m, NULL, &o);
    expect_same("max in chat", p, MK_DSV4_BOS MK_DSV4_USER "x" MK_DSV4_ASSISTANT "</think>y");
    free(p);
    json_decref(m);
}

Test(chat_dsv4, top_level_tools_without_system) {
    json_t *m = js("[{\"role\":\"user\",\"content\":\"x\"}]");
    json_t *t = js("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]");
    mk_dsv4_opts o = opts(0);
    char *p = render(m, t, &o);
    cr_expect(!strncmp(p, MK_DSV4_BOS "\n\n## Tools\n\n", strlen(MK_DSV4_BOS) + 12), "%s", p);
    cr_expect(strstr(p, "### Available Tool Schemas\n\n{\"name\": \"f\", \"parameters\": {}}\n\nYou MUST"));
    free(p);
    json_decref(m);
    json_decref(t);
}

Test(chat_dsv4, drop_thinking_drops_early_developer) {
    /* the reference's _drop_thinking_messages removes developer turns before the last user turn
     * (thinking mode, drop_thinking, no tools); kept with drop_thinking off */
    json_t *m = js("[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"assistant\",\"content\":\"a\","
                   "\"reasoning_content\":\"r\"},{\"role\":\"user\",\"content\":\"u\"}]");
    mk_dsv4_opts o = opts(1);
    char *p = render(m, NULL, &o);
    expect_same("dropped", p, MK_DSV4_BOS "a" MK_DSV4_EOS MK_DSV4_USER "u" MK_DSV4_ASSISTANT "<think>");
    free(p);
    o.drop_thinking = 0;
    p = render(m, NULL, &o);
    expect_same("kept", p,
                MK_DSV4_BOS MK_DSV4_USER "d" MK_DSV4_ASSISTANT "<think>r</think>a" MK_DSV4_EOS
                MK_DSV4_USER "u" MK_DSV4_ASSISTANT "<think>");
    free(p);
    json_decref(m);
}

Test(chat_dsv4, unparsable_arguments_become_one_string) {
    json_t *m = js("[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"tool_calls\":["
                   "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"not json\"}}]}]");
    mk_dsv4_opts o = opts(0);
    char *p = render(m, NULL, &o);
    cr_expect(strstr(p, "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>"), "%s", p);
    free(p);
    json_decref(m);
}

/* ---------------------------------------------------------------- input errors */

Test(chat_dsv4, errors_name_the_field) {
    expect_einval("[{\"role\":\"robot\",\"content\":\"x\"}]", "messages[0].role");
    expect_einval("[{\"content\":\"x\"}]", "messages[0].role");
    expect_einval("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":5}]",
                  "messages[1].content");
    expect_einval("[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]", "messages[0].content[0].type");
    expect_einval("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]", "messages[0].content[0].text");
    expect_einval("[\"hello\"]", "messages[0]");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":{}}]", "messages[0].tool_calls");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":[5]}]", "messages[0].tool_calls[0]");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]}]",
                  "messages[0].tool_calls[0].function");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":3}}]}]",
                  "messages[0].tool_calls[0].function.name");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":[1]}}]}]",
                  "messages[0].tool_calls[0].function.arguments");
    expect_einval("[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"tool_calls\":"
                  "[{\"function\":{\"name\":\"f\",\"arguments\":\"[1, 2]\"}}]}]",
                  "messages[1].tool_calls[0].function.arguments");
    expect_einval("[{\"role\":\"assistant\",\"reasoning_content\":7}]", "messages[0].reasoning_content");
    expect_einval("[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"r\"}]",
                  "messages[1]: a tool message must follow");
    expect_einval("[{\"role\":\"tool\",\"content\":\"r\"}]", "messages[0]: a tool message must follow");
    expect_einval("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":{\"name\":\"f\"}}]},"
                  "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r\"}]",
                  "messages[1].tool_call_id");
    expect_einval("[{\"role\":\"user\",\"content\":\"x\",\"task\":\"dance\"}]", "messages[0].task");
    expect_einval("[{\"role\":\"developer\",\"content\":\"\"}]", "messages[0].content");
    expect_einval("[{\"role\":\"system\",\"content\":\"s\",\"tools\":[{\"name\":\"f\"}]}]",
                  "messages[0].tools[0].function");
    expect_einval("{\"role\":\"user\"}", "messages");

    json_t *m = js("[{\"role\":\"user\",\"content\":\"x\"}]");
    mk_dsv4_opts o = opts(1);
    o.reasoning_effort = "medium";
    char *out = NULL;
    mk_err err = {0};
    cr_expect_eq(mk_dsv4_render(m, NULL, &o, &out, &err), MK_EINVAL);
    cr_expect(strstr(err.msg, "reasoning_effort"), "%s", err.msg);
    json_decref(m);
}

/* ---------------------------------------------------------------- malformed completions */

static int parse_rc(const char *s, int thinking, mk_dsv4_msg *m, mk_err *err) {
    return mk_dsv4_parse(s, strlen(s), thinking, m, err);
}

Test(chat_dsv4, parse_malformed_is_einval) {
    /* strict: structural DSML errors, text after EOS / after the tool calls, special tokens */
    static const char *const bad[] = {
        "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"maybe\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke nom=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "c\n\n<｜DSML｜tool_calls>X<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\" string=\"true\">1</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"x\" string=\"true\">2</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>junk<｜end▁of▁sentence｜>",
        "c\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n",
        "done<｜end▁of▁sentence｜>more",
        "a <think> b<｜end▁of▁sentence｜>",
        "uses ｜DSML｜ inline<｜end▁of▁sentence｜>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mk_dsv4_msg m;
        mk_err err = {0};
        cr_expect_eq(parse_rc(bad[i], 0, &m, &err), MK_EINVAL, "case %zu accepted", i);
        cr_expect(strstr(err.msg, "completion offset"), "case %zu: %s", i, err.msg);
        cr_expect(m.n_calls == 0 && !m.content && !m.reasoning);
        mk_dsv4_msg_free(&m);
    }
    mk_dsv4_msg m;
    mk_err err = {0};
    /* thinking mode: a tool block before </think> */
    cr_expect_eq(parse_rc("r\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", 1, &m, &err), MK_EINVAL);
    mk_dsv4_msg_free(&m);
}

Test(chat_dsv4, parse_truncation_is_best_effort) {
    mk_dsv4_msg m;
    mk_err err = {0};
    /* no EOS: accepted */
    cr_assert_eq(parse_rc("partial answ", 0, &m, &err), MK_OK, "%s", err.msg);
    cr_expect_str_eq(m.content, "partial answ");
    cr_expect_str_eq(m.reasoning, "");
    mk_dsv4_msg_free(&m);
    /* thinking without </think>: all reasoning */
    cr_assert_eq(parse_rc("still thinking", 1, &m, &err), MK_OK, "%s", err.msg);
    cr_expect_str_eq(m.reasoning, "still thinking");
    cr_expect_str_eq(m.content, "");
    mk_dsv4_msg_free(&m);
    /* invalid UTF-8 (a cut multi-byte sequence) becomes U+FFFD */
    cr_assert_eq(parse_rc("ok \xe6\x9d", 0, &m, &err), MK_OK, "%s", err.msg);
    cr_expect_str_eq(m.content, "ok \xEF\xBF\xBD\xEF\xBF\xBD");
    mk_dsv4_msg_free(&m);
    /* an invoke without parameters */
    cr_assert_eq(parse_rc("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
                          MK_DSV4_EOS, 0, &m, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(m.n_calls, 1);
    cr_expect_str_eq(m.calls[0].arguments, "{}");
    mk_dsv4_msg_free(&m);
}

/* Every prefix of every parse vector's completion parses to MK_OK or MK_EINVAL (no crash, no
 * leak under ASan) — the shape of a stream cut at any byte. */
Test(chat_dsv4, parse_every_prefix) {
    json_t *v = load_json("vectors.json");
    size_t i;
    const json_t *c;
    int ok = 0, einval = 0;
    json_array_foreach(json_object_get(v, "parse"), i, c) {
        const json_t *comp = json_object_get(c, "completion");
        int thinking = !strcmp(json_string_value(json_object_get(c, "thinking_mode")), "thinking");
        for (size_t n = 0; n <= json_string_length(comp); n++) {
            mk_dsv4_msg m;
            mk_err err = {0};
            int rc = mk_dsv4_parse(json_string_value(comp), n, thinking, &m, &err);
            cr_assert(rc == MK_OK || rc == MK_EINVAL, "rc %d", rc);
            rc == MK_OK ? ok++ : einval++;
            mk_dsv4_msg_free(&m);
        }
    }
    cr_expect(ok > 0 && einval > 0);
    json_decref(v);
}
