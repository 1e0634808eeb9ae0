"""DeepSeek-V4 on a golden checkpoint (tests/data/dsv4/v4-tiny-fp8, random weights, 512-token
tokenizer), through the official `openai` SDK: reasoning (thinking mode, reasoning_effort), tools
and tool history rendered exactly as DeepSeek's reference encoder renders them, tool_choice
validation.

What random weights cannot show end to end: the model never writes a DSML tool-call block or a
meaningful `</think>` by itself, so parsing of *generated* tool calls into `message.tool_calls` (and
their streaming as `tool_calls` deltas) is not exercised here unless the server can force a call
(see test_named_tool_choice_forces_a_call). DSML parsing itself is covered byte-exactly by the C
unit tests against DeepSeek's parse vectors (tests/data/encoding-dsv4/vectors.json "parse"). What is
tested here: the request side (tools, tool calls and tool results in history, reasoning in history,
thinking mode, reasoning_effort) renders to exactly the reference prompt, and generated text lands in
`reasoning_content` in thinking mode and in `content` otherwise, streamed and not.
"""
import json

import openai
import pytest

from conftest import DSV4_NAME as MODEL
from srvutil import DSV4_TOKENIZER, hf_tokenizer, load_vectors, names_field, openai_error_body, vector_request

MSGS = [{"role": "user", "content": "What is 2+2?"}]
THINK = {"chat_template_kwargs": {"thinking": True}}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get weather for a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["location"]}}}


def reasoning_of(msg):
    extra = msg.model_extra or {}
    return extra.get("reasoning_content", getattr(msg, "reasoning_content", None))


def test_model_listed(oai4):
    assert [m.id for m in oai4.models.list()] == [MODEL]


def test_chat_mode_content(dsv4, oai4):
    r = oai4.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
    m = r.choices[0].message
    assert not reasoning_of(m), "chat mode must not produce reasoning_content: %r" % reasoning_of(m)
    ids = dsv4.tokenize(messages=MSGS)
    assert r.usage.prompt_tokens == len(ids)
    # the rendered chat-mode prompt ends with <｜Assistant｜></think> (ids 4, 6 in tok512)
    assert ids[0] == 0 and ids[-2:] == [4, 6], ids
    # the same ids through /v1/completions give the same text (skip_special_tokens on both)
    c = oai4.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert c.choices[0].text == (m.content or "")
    assert c.usage.completion_tokens == r.usage.completion_tokens


@pytest.mark.parametrize("how", ["chat_template_kwargs", "reasoning_effort"])
def test_thinking_goes_to_reasoning_content(dsv4, oai4, how):
    kw = {"extra_body": THINK} if how == "chat_template_kwargs" else {"reasoning_effort": "high"}
    r = oai4.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, temperature=0, **kw)
    m = r.choices[0].message
    reasoning = reasoning_of(m)
    assert isinstance(reasoning, str) and reasoning, "thinking mode: no reasoning_content in %r" % m
    ids = dsv4.tokenize(messages=MSGS, **({"chat_template_kwargs": {"thinking": True}} if how == "chat_template_kwargs"
                                           else {"reasoning_effort": "high"}))
    assert r.usage.prompt_tokens == len(ids)
    assert ids[-2:] == [4, 5], "thinking prompt must end with <｜Assistant｜><think>: %s" % ids[-4:]
    # the raw continuation of the same prompt is reasoning (+ content after </think>, if any)
    c = oai4.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0)
    t = c.choices[0].text
    if "</think>" in t:
        assert (reasoning, m.content or "") == tuple(t.split("</think>", 1))
    else:
        assert reasoning + (m.content or "") == t
    # streamed: reasoning_content deltas concatenate to the same
    rs, cs, usage = "", "", None
    for ch in oai4.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, **kw):
        usage = ch.usage or usage
        for choice in ch.choices:
            d = choice.delta
            rs += (d.model_extra or {}).get("reasoning_content") or ""
            cs += d.content or ""
    assert rs == reasoning and cs == (m.content or "")
    assert usage.completion_tokens == r.usage.completion_tokens


def test_reasoning_effort_max_prefix(dsv4, oai4):
    """reasoning_effort "max" prepends DeepSeek's effort prefix; "high" does not (reference encoder)."""
    base = dsv4.tokenize(messages=MSGS, chat_template_kwargs={"thinking": True})
    high = dsv4.tokenize(messages=MSGS, reasoning_effort="high")
    mx = dsv4.tokenize(messages=MSGS, reasoning_effort="max")
    assert high == base
    assert len(mx) > len(base) + 20
    r = oai4.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, reasoning_effort="max")
    assert r.usage.prompt_tokens == len(mx)


def _ref_ids(dsv4, prompt):
    tok = hf_tokenizer(DSV4_TOKENIZER)
    if tok is not None:
        return tok.encode(prompt, add_special_tokens=False).ids
    return dsv4.tokenize(prompt=prompt, add_special_tokens=False)


# the cases that end where a request ends (a user or tool message) and whose rendering does not depend
# on drop_thinking, which the API has no field for (chat mode has no reasoning to drop; with tools the
# reference never drops it)
_VECTORS = [c for c in load_vectors()["encode"] if c["messages"][-1]["role"] in ("user", "tool")
            and (c["options"]["thinking_mode"] == "chat" or any("tools" in m for m in c["messages"]))]


@pytest.mark.parametrize("case", _VECTORS, ids=[c["name"] for c in _VECTORS])
def test_rendering_matches_reference_encoder(dsv4, oai4, case):
    """tools, tool calls, tool results and reasoning in history: the prompt the server builds is the
    one DeepSeek's encoder builds (tests/data/encoding-dsv4/vectors.json), token for token."""
    msgs, kw, extra = vector_request(case)
    ref = _ref_ids(dsv4, case["prompt"])
    body = dict(messages=msgs, **kw)
    body.update(extra)
    assert dsv4.tokenize(**body) == ref, "/tokenize of %s differs from the reference prompt" % case["name"]
    r = oai4.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, temperature=0, extra_body=extra, **kw)
    assert r.usage.prompt_tokens == len(ref)


def test_tool_request_stream(oai4):
    msgs = [{"role": "system", "content": "You can call tools."}, {"role": "user", "content": "Weather in Paris?"}]
    for tc in ("auto", "none", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = oai4.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], tool_choice=tc,
                                         max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), (tc, r)
    # no DSML markup leaks into streamed text
    text = ""
    for ch in oai4.chat.completions.create(model=MODEL, messages=msgs, tools=[WEATHER], max_tokens=24,
                                           temperature=0, stream=True):
        for c in ch.choices:
            text += c.delta.content or ""
    assert "\uff5cDSML\uff5c" not in text


def test_tools_rendered_with_and_without_tool_choice(dsv4):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    a = dsv4.tokenize(messages=msgs, tools=[WEATHER])
    b = dsv4.tokenize(messages=msgs, tools=[WEATHER], tool_choice="auto")
    assert a == b
    assert len(a) > len(dsv4.tokenize(messages=msgs)) + 100, "tools are not rendered into the prompt"


def test_tools_without_system_message_are_rendered(dsv4, oai4):
    r = oai4.chat.completions.create(model=MODEL, messages=MSGS, tools=[WEATHER], max_tokens=2)
    plain = oai4.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    assert r.usage.prompt_tokens > plain.usage.prompt_tokens + 100


def _bad(oai4, field, **kw):
    kw.setdefault("messages", MSGS)
    with pytest.raises(openai.BadRequestError) as ei:
        oai4.chat.completions.create(model=MODEL, max_tokens=2, **kw)
    e = openai_error_body(ei.value.response)
    assert names_field(e, field), "400 does not name %r: %r" % (field, e)
    return e


def test_tool_choice_validation(oai4):
    _bad(oai4, "tool_choice", tools=[WEATHER], tool_choice="sometimes")
    _bad(oai4, "tool_choice", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
    _bad(oai4, "tool_choice", tool_choice="required")  # no tools
    _bad(oai4, "tool_choice", tool_choice={"type": "function", "function": {"name": "get_weather"}})  # no tools


def test_tools_validation(oai4):
    _bad(oai4, "tools", tools=[{"type": "function"}])
    _bad(oai4, "tools", tools=[{"type": "retrieval", "function": {"name": "x"}}])
    _bad(oai4, "tools", tools=[{"type": "function", "function": {"description": "no name"}}])
    _bad(oai4, "tools", tools="get_weather")


def test_tool_history_validation(oai4):
    # a tool message must answer a tool call of the preceding assistant message
    _bad(oai4, "messages", messages=[{"role": "user", "content": "u"},
                                     {"role": "tool", "tool_call_id": "call_x", "content": "r"}])
    # tool_calls need a function name and JSON arguments
    bad_args = [{"role": "user", "content": "u"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    _bad(oai4, "messages", messages=bad_args, tools=[WEATHER])


@pytest.mark.parametrize("tc", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_forced_tool_choice_never_leaks_markup(oai4, tc):
    """tool_choice required / named: in chat mode minke opens the DSML tool-call block at the end of
    the prompt, so the model can only continue a call (vLLM forces the same with a grammar). A real
    model completes the call; random weights write noise inside the block, which is never a valid
    call. What must hold either way: none of it is shown as content (streamed or not), and whatever
    is returned as a tool call is well-formed and names a given tool (the named one when named).
    A complete generated call -> tool_calls cannot be produced by random weights; DSML parsing is
    covered by the C tests on DeepSeek's parse vectors."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "Weather in Paris?"}]
    kw = dict(model=MODEL, messages=msgs, tools=[WEATHER], tool_choice=tc, max_tokens=40, temperature=0)
    r = oai4.chat.completions.create(**kw)
    m = r.choices[0].message
    assert not m.content, "text inside the forced tool-call block shown as content: %r" % m.content
    for call in m.tool_calls or []:
        assert call.type == "function" and call.function.name == "get_weather" and call.id
        assert isinstance(json.loads(call.function.arguments), dict)
    assert (r.choices[0].finish_reason == "tool_calls") == bool(m.tool_calls), r.choices[0]
    streamed = ""
    for ch in oai4.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            streamed += c.delta.content or ""
            assert "\uff5cDSML\uff5c" not in streamed
    assert streamed == (m.content or "")


def test_stream_equals_non_stream_on_noisy_bytes(oai4):
    """Random weights write arbitrary byte tokens (broken UTF-8, CJK split across tokens): the
    streaming detokenizer must emit only complete characters and end with exactly the non-streamed
    text; stop strings still cut at the first match."""
    kw = dict(model=MODEL, messages=MSGS, max_tokens=64, temperature=0, extra_body={"ignore_eos": True})
    full = oai4.chat.completions.create(**kw)
    text = full.choices[0].message.content
    assert full.usage.completion_tokens == 64 and text
    pieces = []
    for ch in oai4.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
    assert "".join(pieces) == text
    # a stop string from the middle of the noisy text
    p = next(i for i in range(len(text) // 3, len(text) - 2) if text.find(text[i:i + 2]) == i and text[i:i + 2].strip())
    s = text[p:p + 2]
    r = oai4.chat.completions.create(stop=[s], **kw)
    assert r.choices[0].message.content == text[:p] and r.choices[0].finish_reason == "stop"
    streamed = ""
    for ch in oai4.chat.completions.create(stop=[s], stream=True, **kw):
        for c in ch.choices:
            streamed += c.delta.content or ""
    assert streamed == text[:p]
