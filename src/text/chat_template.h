/* chat_template.h — chat templates recognised from a model's Jinja template text and rendered in C.
 *
 * A GGUF carries its chat template as Jinja source (tokenizer.chat_template). minke does not run
 * Jinja: mk_tmpl_detect recognises the template family from its marker strings, and mk_tmpl_render
 * writes what that family's templates render for plain text conversations (system, user and
 * assistant messages; no tools, no tool calls). A template we do not recognise is an error that
 * names the fix (--chat-template NAME) rather than a guessed prompt.
 *
 * Families (n = "\n"):
 *   MK_TMPL_CHATML  marker "<|im_start|>" ... "<|im_end|>" (SmolLM2, Qwen2/2.5, Hermes, ...)
 *                     per message:  <|im_start|>{role}n{content}<|im_end|>n
 *                     generation:   <|im_start|>assistantn
 *                   Several ChatML templates (SmolLM2, Qwen2.5) add a built-in system message
 *                   when the conversation does not start with one; mk_tmpl_default_system pulls
 *                   its text out of the template so that it can be passed to mk_tmpl_render.
 *   MK_TMPL_LLAMA3  marker "<|start_header_id|>" ... "<|eot_id|>" (Llama 3 Instruct)
 *                     first:        <|begin_of_text|>   (the template's bos_token, before the first
 *                                                        message; nothing for no messages)
 *                     per message:  <|start_header_id|>{role}<|end_header_id|>nn{content|trim}<|eot_id|>
 *                     generation:   <|start_header_id|>assistant<|end_header_id|>nn
 *                   `trim` is Jinja's (Python's str.strip()). The Llama 3.1+ templates also write a
 *                   "Cutting Knowledge Date / Today Date" system preamble that this renderer does
 *                   not reproduce; mk_tmpl_detect warns when it sees one.
 * The rendered text contains the template's special-token texts, including Llama 3's BOS: encode
 * it with the tokenizer's add_special = 0 (or drop the leading BOS) to avoid a double BOS.
 *
 * Message content: a string, null (""), or a list of {"type": "text", "text": s} parts joined with
 * "\n" (the templates themselves only accept strings; that join is our choice, shared with other
 * OpenAI-style servers). Other part types, other roles, tool_calls, and content holding a NUL
 * byte are MK_EINVAL naming the message index and field.
 *
 * All functions are reentrant; nothing here keeps state.
 */
#ifndef MK_TEXT_CHAT_TEMPLATE_H
#define MK_TEXT_CHAT_TEMPLATE_H

#include "base/status.h"

#include <jansson.h>

typedef enum { MK_TMPL_NONE, MK_TMPL_CHATML, MK_TMPL_LLAMA3 } mk_tmpl;

/* Recognise the family of a Jinja chat template. Anything else (including NULL or empty text) is
 * MK_ENOTSUP "unknown chat template; pass --chat-template chatml|llama3". */
int mk_tmpl_detect(const char *jinja, mk_tmpl *out, mk_err *err);

/* "chatml" or "llama3" (the --chat-template names); anything else is MK_EINVAL listing them. */
int mk_tmpl_by_name(const char *name, mk_tmpl *out, mk_err *err);

/* "chatml", "llama3" or "none". */
const char *mk_tmpl_name(mk_tmpl t);

/* The built-in system message a ChatML template writes when the conversation does not start with a
 * system message: the text of a Jinja string literal '<|im_start|>system\n{TEXT}<|im_end|>\n' in
 * the template (Jinja escapes \n \t \r \\ \' \" decoded). *out is malloc'd, or NULL when the
 * template has none. MK_ENOMEM only. */
int mk_tmpl_default_system(const char *jinja, char **out, mk_err *err);

/* Render messages (a JSON array, see above) with family t. add_generation_prompt appends the
 * assistant header. default_system (may be NULL): when the conversation is non-empty and does not
 * start with a system message, a system message with this text is rendered first, as the
 * templates that have one do. *out is malloc'd and NUL-terminated. MK_EINVAL for bad messages or
 * t == MK_TMPL_NONE; MK_ENOMEM. */
int mk_tmpl_render(mk_tmpl t, const json_t *messages, int add_generation_prompt,
                   const char *default_system, char **out, mk_err *err);

#endif
