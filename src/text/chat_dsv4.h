/* chat_dsv4.h — the DeepSeek-V4 chat encoding ("dsv4"): OpenAI-style messages -> prompt text, and
 * a generated completion -> reasoning, content and DSML tool calls.
 *
 * DeepSeek-V4 ships no Jinja chat template; its official `encoding_dsv4.py` is the only definition
 * of the prompt format (tests/data/encoding-dsv4/FORMAT.md documents it). This module reproduces
 * that encoder byte for byte, including its quirks, and validates the input on the way so that a
 * malformed request becomes MK_EINVAL with a message naming the message index and field
 * ("messages[3].tool_calls[0].function.name: expected a string") instead of a crash or a silently
 * odd prompt. Checked against the four official cases and the vectors in tests/data/encoding-dsv4.
 *
 * Prompt shape (thinking mode, one tool round):
 *   <｜begin▁of▁sentence｜>{system}\n\n## Tools ... <｜User｜>{user}<｜Assistant｜><think>
 *   {reasoning}</think>\n\n<｜DSML｜tool_calls>...</｜DSML｜tool_calls><｜end▁of▁sentence｜>
 *   <｜User｜><tool_result>{result}</tool_result><｜Assistant｜><think>
 *
 * Roles: system, user, assistant, tool, latest_reminder, developer. Per-message extras the
 * reference honours are honoured too: `tools` and `response_format` on system/developer
 * messages, `task` (action, query, authority, domain, title, read_url quick-instruction tokens),
 * `wo_eos` on assistant messages. Everything else (`mask`, `id`, `name`, ...) is ignored.
 *
 * Where the reference has no behaviour (it would crash or print a Python repr), this module picks
 * one and documents it at the definition: list-valued `content` is the text parts joined with
 * "\n\n" (as the reference joins tool-result lists); JSON null content is "".
 *
 * All functions are reentrant; nothing here keeps state between calls.
 */
#ifndef MK_TEXT_CHAT_DSV4_H
#define MK_TEXT_CHAT_DSV4_H

#include "base/status.h"

#include <jansson.h>
#include <stddef.h>

/* Special-token texts of the encoding (UTF-8). The fullwidth bars are U+FF5C, the spaces U+2581. */
#define MK_DSV4_BOS "<｜begin▁of▁sentence｜>"
#define MK_DSV4_EOS "<｜end▁of▁sentence｜>"
#define MK_DSV4_USER "<｜User｜>"
#define MK_DSV4_ASSISTANT "<｜Assistant｜>"
#define MK_DSV4_LATEST_REMINDER "<｜latest_reminder｜>"
#define MK_DSV4_THINK_BEGIN "<think>"
#define MK_DSV4_THINK_END "</think>"
#define MK_DSV4_DSML "｜DSML｜"

typedef struct {
    int thinking;      /* 0 chat mode (assistant turns open with "</think>"), 1 thinking mode */
    int drop_thinking; /* default 1, as the reference: in thinking mode, strip the reasoning of
                        * assistant turns before the last user message. Forced off when any
                        * system/developer message carries tools. No effect in chat mode. */
    const char *reasoning_effort; /* NULL, "high" or "max" (the reference's accepted values);
                                   * "max" prepends the maximum-effort paragraph in thinking mode,
                                   * "high" and NULL add nothing. Anything else: MK_EINVAL. */
    int add_generation_prompt;    /* default 1: as the reference, a last user/developer/tool
                                   * message is followed by "<｜Assistant｜>" and "<think>" or
                                   * "</think>" (or its task token). 0 omits that suffix of the
                                   * last message. A last assistant message gets no suffix either
                                   * way. */
} mk_dsv4_opts;

/* Defaults as the reference's encode_messages(): chat mode, drop_thinking 1, no effort, prompt. */
void mk_dsv4_opts_default(mk_dsv4_opts *o);

/* Renders a conversation into the prompt text (BOS included).
 *   messages: a JSON array of OpenAI-style messages: role, content (string, null, or a list of
 *     {type:"text", text}), reasoning_content, tool_calls [{id?, type:"function", function:{name,
 *     arguments (JSON object text, or a JSON object)}}], tool_call_id, tools, response_format,
 *     task, wo_eos.
 *   tools: NULL or a JSON array of OpenAI tool objects ({type:"function", function:{...}}). They
 *     are attached to messages[0] when it is a system or developer message (replacing its own
 *     `tools`), otherwise to an empty system message put in front, which is how the reference's
 *     own tests pass top-level tools.
 * *out: malloc'd NUL-terminated UTF-8 (free()); *out_len (may be NULL) its length in bytes.
 * Errors: MK_EINVAL for bad input (unknown role, wrong types, a tool message that does not follow
 * an assistant message with tool calls, a tool_call_id no call has, tool-call arguments that are
 * JSON but not an object, an unknown task or reasoning_effort) with a message naming the message
 * index and field; MK_ENOMEM. */
int mk_dsv4_render(const json_t *messages, const json_t *tools, const mk_dsv4_opts *o, char **out,
                   mk_err *err);
int mk_dsv4_render_len(const json_t *messages, const json_t *tools, const mk_dsv4_opts *o,
                       char **out, size_t *out_len, mk_err *err);

typedef struct {
    char *name;      /* tool (function) name, as written in the DSML invoke */
    char *arguments; /* JSON object text, as OpenAI returns it: {"k": "v", "n": 5} — string
                      * parameters JSON-encoded, string="false" values copied verbatim */
} mk_dsv4_tool_call;

typedef struct {
    char *reasoning; /* never NULL; "" in chat mode or when empty */
    char *content;   /* never NULL; text before the tool-call block, "" when empty */
    mk_dsv4_tool_call *calls;
    int n_calls;
} mk_dsv4_msg;

/* Parses a completion (the text generated after the prompt; it may end with the EOS text) as the
 * reference's parse_message_from_completion_text() does. Strict about structure — a malformed
 * DSML block, text after the tool calls or after EOS, tool calls before "</think>", a duplicate
 * parameter, or a special token inside reasoning/content are MK_EINVAL naming the byte offset —
 * and lenient about truncation only: a missing EOS is accepted, and in thinking mode a text
 * without "</think>" is all reasoning (the reference asserts on both). Invalid UTF-8 bytes are
 * replaced by U+FFFD first so every output string is valid UTF-8. On error *out is left empty
 * (safe to mk_dsv4_msg_free). */
int mk_dsv4_parse(const char *text, size_t len, int thinking, mk_dsv4_msg *out, mk_err *err);
void mk_dsv4_msg_free(mk_dsv4_msg *m);

/* {role:"assistant", content, reasoning_content, tool_calls:[{type:"function", function:{name,
 * arguments}}]} shaped like the reference's parse output (arguments stay strings). NULL on
 * allocation failure. The caller owns the reference. */
json_t *mk_dsv4_msg_to_json(const mk_dsv4_msg *m);

/* Python json.dumps(v, ensure_ascii=False) of a jansson value: ", " and ": " separators, keys in
 * insertion order, floats as Python's repr (shortest round-trip). Appends to nothing: returns a
 * malloc'd string or NULL on allocation failure. Exposed because the DSML tool schemas and
 * non-string tool arguments are written this way. */
char *mk_dsv4_pyjson(const json_t *v);

#endif
