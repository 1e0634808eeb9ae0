"""Anthropic Messages API through the official `anthropic` SDK: messages on the default model
(cross-checked against the OpenAI chat route: same rendering, same greedy text), streaming events,
stop sequences, count_tokens; tool_use / tool_result and thinking on a DeepSeek-V4 golden model
(random weights: see test_dsv4.py for what that can and cannot show), checked against DeepSeek's
reference encoder. Errors in Anthropic's shape."""
import json

import anthropic
import pytest
import requests

from conftest import DEFAULT_NAME as MODEL, DSV4_NAME as MODEL4
from srvutil import DSV4_TOKENIZER, anthropic_error_body, hf_tokenizer, load_vectors

GREEDY = {"temperature": 0}  # the SDK has no temperature argument any more; it is a request field
MSGS = [{"role": "user", "content": "Which city is the capital of France? Answer with the city name."}]


def text_of(msg):
    return "".join(b.text for b in msg.content if b.type == "text")


def create(anth, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MSGS)
    kw.setdefault("max_tokens", 16)
    kw.setdefault("extra_body", GREEDY)
    return anth.messages.create(**kw)


def test_message_basic(anth, oai):
    m = create(anth)
    assert m.type == "message" and m.role == "assistant" and m.id and m.model == MODEL
    assert m.content and m.content[0].type == "text"
    assert "Paris" in text_of(m)
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    assert m.usage.input_tokens > 0 and 1 <= m.usage.output_tokens <= 16
    if m.stop_reason == "max_tokens":
        assert m.usage.output_tokens == 16
    # the same conversation through the OpenAI route: same prompt, same greedy text
    o = oai.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=16, temperature=0)
    assert o.usage.prompt_tokens == m.usage.input_tokens
    assert o.usage.completion_tokens == m.usage.output_tokens
    assert o.choices[0].message.content == text_of(m)
    assert {"length": "max_tokens", "stop": "end_turn"}[o.choices[0].finish_reason] == m.stop_reason


def test_system_and_content_blocks(anth, oai):
    sys_text = "You are a terse assistant."
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Apple."}]},
            {"role": "user", "content": "Name another one."}]
    a = create(anth, system=sys_text, messages=msgs, max_tokens=8)
    b = create(anth, system=[{"type": "text", "text": sys_text}], messages=msgs, max_tokens=8)
    assert text_of(a) == text_of(b) and a.usage.input_tokens == b.usage.input_tokens
    o = oai.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": sys_text}, {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."}, {"role": "user", "content": "Name another one."}])
    assert o.usage.prompt_tokens == a.usage.input_tokens
    assert o.choices[0].message.content == text_of(a)


def test_count_tokens(anth):
    m = create(anth, system="Be brief.")
    c = anth.messages.count_tokens(model=MODEL, messages=MSGS, system="Be brief.")
    assert c.input_tokens == m.usage.input_tokens


def test_stream_events(anth):
    ref = create(anth, max_tokens=12)
    events = list(create(anth, max_tokens=12, stream=True))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop", types
    assert types[1] == "content_block_start" and "message_delta" in types
    assert types.index("content_block_stop") < types.index("message_delta") < types.index("message_stop")
    start = events[0].message
    assert start.role == "assistant" and start.usage.input_tokens == ref.usage.input_tokens
    assert events[1].content_block.type == "text" and events[1].index == 0
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert text == text_of(ref)
    md = [e for e in events if e.type == "message_delta"]
    assert len(md) == 1
    assert md[0].delta.stop_reason == ref.stop_reason
    assert md[0].usage.output_tokens == ref.usage.output_tokens


def test_stream_helper(anth):
    ref = create(anth, max_tokens=12)
    with anth.messages.stream(model=MODEL, messages=MSGS, max_tokens=12, extra_body=GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == text_of(ref) == text_of(final)
    assert final.usage.output_tokens == ref.usage.output_tokens
    assert final.stop_reason == ref.stop_reason


def test_stop_sequences(anth):
    msgs = [{"role": "user", "content": "Describe the sea in two sentences."}]
    full = text_of(create(anth, messages=msgs, max_tokens=24))
    p = next(i for i in range(6, len(full) - 4) if full[i:i + 4].strip() and full.find(full[i:i + 4]) == i)
    s = full[p:p + 4]
    m = create(anth, messages=msgs, max_tokens=24, stop_sequences=[s, "\u2603never"])
    assert text_of(m) == full[:p]
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == s
    with anth.messages.stream(model=MODEL, messages=msgs, max_tokens=24, stop_sequences=[s], extra_body=GREEDY) as st:
        streamed = "".join(st.text_stream)
        final = st.get_final_message()
    assert streamed == full[:p]
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == s


def test_seeded_sampling_reproducible(anth):
    kw = dict(max_tokens=12, extra_body={"temperature": 1.0, "top_p": 0.9, "seed": 42},
              messages=[{"role": "user", "content": "Tell me about cats."}])
    assert text_of(create(anth, **kw)) == text_of(create(anth, **kw))


def test_errors_anthropic_shape(server, anth):
    bad = server.anthropic(api_key="wrong-key")
    with pytest.raises(anthropic.AuthenticationError) as ei:
        bad.messages.create(model=MODEL, messages=MSGS, max_tokens=4)
    assert anthropic_error_body(ei.value.response)["type"] == "authentication_error"
    bad.close()
    # the header Anthropic documents, x-api-key, is accepted too
    r = requests.post(server.url + "/v1/messages", timeout=60,
                      headers={"x-api-key": server.api_key, "anthropic-version": "2023-06-01"},
                      json={"model": MODEL, "max_tokens": 2, "messages": MSGS})
    assert r.status_code == 200, r.text
    r = requests.post(server.url + "/v1/messages", timeout=60, headers={"x-api-key": "nope"},
                      json={"model": MODEL, "max_tokens": 2, "messages": MSGS})
    assert r.status_code == 401
    assert anthropic_error_body(r)["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as ei:
        create(anth, model="no-such-model")
    assert anthropic_error_body(ei.value.response)["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as ei:
        create(anth, messages=[])
    e = anthropic_error_body(ei.value.response)
    assert e["type"] == "invalid_request_error" and "messages" in e["message"]
    with pytest.raises(anthropic.BadRequestError) as ei:
        create(anth, extra_body={"bogus_field": 1})
    assert "bogus_field" in anthropic_error_body(ei.value.response)["message"]
    # max_tokens is required in the Messages API (the SDK insists too, so send it raw)
    r = server.post("/v1/messages", {"model": MODEL, "messages": MSGS})
    assert r.status_code == 400 and "max_tokens" in anthropic_error_body(r)["message"]
    with pytest.raises(anthropic.BadRequestError) as ei:
        create(anth, messages=[{"role": "assistant", "content": "hi"}, {"role": "robot", "content": "x"}])
    assert anthropic_error_body(ei.value.response)["type"] == "invalid_request_error"


# --- DeepSeek-V4: tool_use, tool_result, thinking ---------------------------------------------------

def _case(name):
    return [c for c in load_vectors()["encode"] if c["name"] == name][0]


def _anthropic_from_openai(case):
    """DeepSeek's reference vector (OpenAI-shaped messages with tools on the system message) as an
    Anthropic request: system param, tools with input_schema, tool_use and tool_result blocks."""
    system, tools, msgs = None, None, []
    for m in case["messages"]:
        if m["role"] == "system":
            system = m["content"]
            tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                      "input_schema": t["function"]["parameters"]} for t in m.get("tools", [])]
        elif m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [{"type": "text", "text": m["content"]}] if m["content"] else []
            blocks += [{"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                        "input": json.loads(tc["function"]["arguments"])} for tc in m["tool_calls"]]
            msgs.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if msgs and msgs[-1]["role"] == "user" and isinstance(msgs[-1]["content"], list):
                msgs[-1]["content"].append(block)
            else:
                msgs.append({"role": "user", "content": [block]})
        else:
            msgs.append({"role": m["role"], "content": m["content"]})
    return system, tools, msgs


def _ref_len(dsv4, prompt):
    tok = hf_tokenizer(DSV4_TOKENIZER)
    if tok is not None:
        return len(tok.encode(prompt, add_special_tokens=False).ids)
    return len(dsv4.tokenize(prompt=prompt, add_special_tokens=False))


@pytest.mark.parametrize("name", ["enc_101_3", "enc_101_9"])
def test_tool_use_history_matches_reference(dsv4, anth4, oai4, name):
    """tools + tool_use + tool_result through /v1/messages render to DeepSeek's reference prompt
    (chat mode: the Messages API default without `thinking`)."""
    case = _case(name)
    assert case["options"]["thinking_mode"] == "chat"
    system, tools, msgs = _anthropic_from_openai(case)
    m = anth4.messages.create(model=MODEL4, system=system, tools=tools, messages=msgs, max_tokens=4,
                              extra_body=GREEDY)
    assert m.usage.input_tokens == _ref_len(dsv4, case["prompt"])
    c = anth4.messages.count_tokens(model=MODEL4, system=system, tools=tools, messages=msgs)
    assert c.input_tokens == m.usage.input_tokens
    assert m.stop_reason in ("max_tokens", "end_turn", "tool_use")
    # random weights write no tool call: the generated text is a text block, without DSML markup
    assert all("\uff5cDSML\uff5c" not in b.text for b in m.content if b.type == "text")


WEATHER = {"name": "get_weather", "description": "Get weather for a city",
           "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                            "required": ["location"]}}
SMALL_SYSTEM = "You can call tools."
SMALL_MSGS = [{"role": "user", "content": "Weather in Paris?"}]


def test_tool_choice_variants(anth4):
    for tc in ({"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool", "name": "get_weather"}):
        m = anth4.messages.create(model=MODEL4, system=SMALL_SYSTEM, tools=[WEATHER], messages=SMALL_MSGS,
                                  max_tokens=2, tool_choice=tc, extra_body=GREEDY)
        assert m.type == "message", tc
    for tc in ({"type": "tool", "name": "no_such_tool"}, {"type": "sometimes"}):
        with pytest.raises(anthropic.BadRequestError) as ei:
            anth4.messages.create(model=MODEL4, system=SMALL_SYSTEM, tools=[WEATHER], messages=SMALL_MSGS,
                                  max_tokens=2, tool_choice=tc)
        assert "tool_choice" in anthropic_error_body(ei.value.response)["message"]
    with pytest.raises(anthropic.BadRequestError) as ei:
        anth4.messages.create(model=MODEL4, messages=SMALL_MSGS, max_tokens=2, tools=[{"name": "x"}])  # no input_schema
    msg = anthropic_error_body(ei.value.response)["message"]
    assert "tools" in msg or "input_schema" in msg, msg
    # a tool_result must answer a tool_use of the previous assistant turn
    with pytest.raises(anthropic.BadRequestError):
        anth4.messages.create(model=MODEL4, max_tokens=2, tools=[WEATHER], messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])


def test_tool_use_history_stream(anth4, oai4):
    """A tool_use / tool_result round trip in history, streamed and not; it renders like the same
    conversation in OpenAI form (assistant tool_calls + tool message)."""
    msgs = SMALL_MSGS + [
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"location": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "18 C, sunny"}]}]}]
    ref = anth4.messages.create(model=MODEL4, system=SMALL_SYSTEM, tools=[WEATHER], messages=msgs, max_tokens=12,
                                extra_body=GREEDY)
    with anth4.messages.stream(model=MODEL4, system=SMALL_SYSTEM, tools=[WEATHER], messages=msgs, max_tokens=12,
                               extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == [b.type for b in ref.content]
    assert text_of(final) == text_of(ref)
    assert final.usage.output_tokens == ref.usage.output_tokens
    o = oai4.chat.completions.create(
        model=MODEL4, max_tokens=12, temperature=0,
        tools=[{"type": "function", "function": {"name": "get_weather", "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}],
        messages=[{"role": "system", "content": SMALL_SYSTEM}, {"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": "Let me check.", "tool_calls": [
                      {"id": "toolu_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
                  {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"}])
    assert o.usage.prompt_tokens == ref.usage.input_tokens
    assert (o.choices[0].message.content or "") == text_of(ref)


def test_thinking_block(anth4, oai4):
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    m = anth4.messages.create(model=MODEL4, messages=msgs, max_tokens=1100, extra_body=GREEDY,
                              thinking={"type": "enabled", "budget_tokens": 1024})
    assert m.content and m.content[0].type == "thinking", [b.type for b in m.content]
    thinking = m.content[0].thinking
    assert thinking
    o = oai4.chat.completions.create(model=MODEL4, messages=msgs, max_tokens=1100, temperature=0,
                                     extra_body={"chat_template_kwargs": {"thinking": True}})
    assert (o.choices[0].message.model_extra or {}).get("reasoning_content") == thinking
    assert m.usage.input_tokens == o.usage.prompt_tokens
    assert m.usage.output_tokens == o.usage.completion_tokens
    # streamed: thinking_delta events carry the same text
    with anth4.messages.stream(model=MODEL4, messages=msgs, max_tokens=1100, extra_body=GREEDY,
                               thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        deltas = "".join(e.delta.thinking for e in s if e.type == "content_block_delta"
                         and e.delta.type == "thinking_delta")
    assert deltas == thinking
