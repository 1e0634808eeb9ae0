/* split.h — DeepSeek-V4 output, as it streams, split into reasoning, content and tool calls.
 *
 * A DeepSeek-V4 completion is `{reasoning}</think>{content}` in thinking mode (the prompt ends
 * with "<think>") and `{content}` in chat mode, where content may end with a DSML tool-call block
 * "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=...>...</｜DSML｜invoke>\n...</｜DSML｜tool_calls>".
 * The splitter takes the text as the server emits it (after detokenization and stop strings) and
 * hands back what can be shown now:
 *   - reasoning until "</think>" (the marker itself is never shown); a suffix that could be the
 *     start of "</think>" is held until the next piece decides;
 *   - content after it, holding back a suffix that could begin the tool-call marker (only when
 *     tool parsing is on), so DSML markup never leaks into streamed text;
 *   - once the marker is seen, nothing more as text: each time an invoke closes, the block so far
 *     is parsed with mk_dsv4_parse and every call not yet returned is appended (name, arguments
 *     as a JSON object text, a fresh "call_..." id).
 * srv_split_finish ends the stream: held text is flushed to its kind; in the tool block the whole
 * block is parsed once more, and a malformed or truncated remainder (e.g. max_tokens hit inside a
 * call) is dropped rather than shown, after the calls that were complete. Without tool parsing the
 * DSML text is ordinary content.
 */
#ifndef MK_SERVER_SPLIT_H
#define MK_SERVER_SPLIT_H

#include "server/util.h"

typedef struct {
    char id[48];
    char *name;
    char *args; /* JSON object text */
} srv_call;

typedef struct {
    srv_call *v;
    int n, cap;
} srv_calls;

void srv_calls_free(srv_calls *c);

typedef struct srv_split srv_split;

/* thinking: the text starts inside the reasoning; tools: parse DSML tool calls. */
int srv_split_create(int thinking, int tools, srv_split **out);
void srv_split_free(srv_split *s);
/* Feeds text; appends what is safe to show to reasoning / content and completed calls to calls.
 * Returns 0, or MK_ENOMEM. */
int srv_split_feed(srv_split *s, const char *t, size_t n, srv_buf *reasoning, srv_buf *content,
                   srv_calls *calls);
int srv_split_finish(srv_split *s, srv_buf *reasoning, srv_buf *content, srv_calls *calls);
/* 1 while inside the DSML tool-call block; 1 while still in the reasoning. */
int srv_split_in_tools(const srv_split *s);
int srv_split_in_reasoning(const srv_split *s);

#endif
