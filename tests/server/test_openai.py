"""OpenAI API through the official `openai` SDK, on the default model (SmolLM2-135M-Instruct):
completions, chat, streaming with usage, stop sequences, seeds, logprobs, n > 1, and /metrics
counters against the usage the responses report."""
import math
import subprocess

import pytest

from conftest import DEFAULT_NAME as MODEL
from srvutil import SLOW, minke_bin

QUESTION = "Which city is the capital of France? Answer with the city name."
PROMPT_CHAT = [{"role": "user", "content": QUESTION}]
PROMPT_TEXT = "The three primary colors are"


def chat(oai, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", PROMPT_CHAT)
    kw.setdefault("max_tokens", 16)
    return oai.chat.completions.create(**kw)


def comp(oai, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("prompt", PROMPT_TEXT)
    kw.setdefault("max_tokens", 16)
    return oai.completions.create(**kw)


def collect_chat_stream(stream):
    """-> (texts by choice index, finish reasons by index, usage or None, chunks)"""
    texts, finish, usage, chunks = {}, {}, None, []
    for ch in stream:
        chunks.append(ch)
        assert ch.object == "chat.completion.chunk"
        if ch.usage is not None:
            assert usage is None, "usage reported twice"
            usage = ch.usage
        for c in ch.choices:
            texts.setdefault(c.index, "")
            if c.delta.content:
                texts[c.index] += c.delta.content
            if c.finish_reason is not None:
                assert c.index not in finish, "finish_reason sent twice for choice %d" % c.index
                finish[c.index] = c.finish_reason
    return texts, finish, usage, chunks


def collect_comp_stream(stream):
    texts, finish, usage, chunks = {}, {}, None, []
    for ch in stream:
        chunks.append(ch)
        if ch.usage is not None:
            assert usage is None, "usage reported twice"
            usage = ch.usage
        for c in ch.choices:
            texts.setdefault(c.index, "")
            texts[c.index] += c.text or ""
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    return texts, finish, usage, chunks


def check_usage(u, max_tokens=None, finish=None):
    assert u.prompt_tokens > 0
    assert u.completion_tokens >= 1
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    if max_tokens is not None:
        assert u.completion_tokens <= max_tokens
        if finish == "length":
            assert u.completion_tokens == max_tokens


# --- models ----------------------------------------------------------------------------------------

def test_models_list_and_retrieve(oai):
    ids = [m.id for m in oai.models.list()]
    assert ids == [MODEL]
    m = oai.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model"


# --- completions -----------------------------------------------------------------------------------

def test_completion_greedy(server, oai):
    r = comp(oai, temperature=0, max_tokens=12)
    assert r.object == "text_completion" and r.id and r.model == MODEL and r.created > 0
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and isinstance(c.text, str) and c.text.strip()
    assert c.finish_reason in ("length", "stop")
    check_usage(r.usage, 12, c.finish_reason)
    # the prompt is counted as /tokenize counts it
    assert r.usage.prompt_tokens == len(server.tokenize(prompt=PROMPT_TEXT))
    # greedy is deterministic
    r2 = comp(oai, temperature=0, max_tokens=12)
    assert r2.choices[0].text == c.text and r2.usage == r.usage


def test_completion_prompt_as_token_ids(server, oai):
    ids = server.tokenize(prompt=PROMPT_TEXT)
    a = comp(oai, temperature=0, max_tokens=8)
    b = comp(oai, prompt=ids, temperature=0, max_tokens=8)
    assert b.choices[0].text == a.choices[0].text
    assert b.usage.prompt_tokens == len(ids)


def test_completion_stream_with_usage(oai):
    ref = comp(oai, temperature=0, max_tokens=12)
    texts, finish, usage, chunks = collect_comp_stream(
        comp(oai, temperature=0, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert texts == {0: ref.choices[0].text}
    assert finish == {0: ref.choices[0].finish_reason}
    assert usage is not None, "stream_options.include_usage: no usage chunk"
    assert chunks[-1].usage is not None and chunks[-1].choices == [], "usage must come in the last chunk, with no choices"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (ref.usage.prompt_tokens, ref.usage.completion_tokens, ref.usage.total_tokens)
    # every chunk before the usage chunk carries no usage (continuous_usage_stats not asked)
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completion_stream_without_usage(oai):
    texts, finish, usage, chunks = collect_comp_stream(comp(oai, temperature=0, max_tokens=6, stream=True))
    assert usage is None
    assert texts[0] and finish[0] in ("length", "stop")


def test_completion_logprobs(oai):
    r = comp(oai, temperature=0, max_tokens=8, logprobs=3)
    c = r.choices[0]
    lp = c.logprobs
    assert lp is not None
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset is not None and len(lp.text_offset) == n
    # offsets are where each token's text starts in the returned text
    assert lp.text_offset == sorted(lp.text_offset)
    off = lp.text_offset[0]
    for tok, o in zip(lp.tokens, lp.text_offset):
        assert o == off, "text_offset %s" % lp.text_offset
        off += len(tok)
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tlp <= 0.0 and math.isfinite(tlp)
        assert 3 <= len(top) <= 4, top  # the top 3 (plus the sampled token when outside them)
        best = max(top.values())
        # greedy: the chosen token is the most likely one
        assert abs(tlp - best) < 1e-4, (tok, tlp, top)
        assert tok in top


# --- chat --------------------------------------------------------------------------------------------

def test_chat_greedy_answers(server, oai):
    r = chat(oai, temperature=0, max_tokens=16)
    assert r.object == "chat.completion" and r.id and r.model == MODEL and r.created > 0
    c = r.choices[0]
    assert c.index == 0 and c.message.role == "assistant"
    assert "Paris" in c.message.content, c.message.content
    # the same answer as `minke generate --chat` (the CLI's path through the same model and template)
    cli = subprocess.run([minke_bin(), "generate", "--chat", "--prompt", QUESTION, "--temperature", "0",
                          "--max-tokens", "16", "--threads", "1"], capture_output=True, text=True, timeout=120 * SLOW)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert cli.stdout.strip() == c.message.content.strip()
    assert not c.message.tool_calls
    check_usage(r.usage, 16, c.finish_reason)
    toks = server.tokenize(messages=PROMPT_CHAT, add_generation_prompt=True)
    assert r.usage.prompt_tokens == len(toks)


def test_chat_system_and_multiturn(server, oai):
    msgs = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "Apple."},
            {"role": "user", "content": [{"type": "text", "text": "Name another "}, {"type": "text", "text": "one."}]}]
    r = chat(oai, messages=msgs, temperature=0, max_tokens=8)
    assert r.choices[0].message.content
    assert r.usage.prompt_tokens == len(server.tokenize(messages=msgs))
    # text content parts are joined with a newline (vLLM's convention for string templates)
    msgs2 = msgs[:3] + [{"role": "user", "content": "Name another \none."}]
    r2 = chat(oai, messages=msgs2, temperature=0, max_tokens=8)
    assert r2.usage.prompt_tokens == r.usage.prompt_tokens
    assert r2.choices[0].message.content == r.choices[0].message.content


def test_chat_max_completion_tokens(oai):
    r = chat(oai, temperature=0, max_tokens=None, max_completion_tokens=5,
             messages=[{"role": "user", "content": "Write a long story about a dragon."}])
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"


def test_chat_finishes_with_stop_on_eos(oai):
    r = chat(oai, temperature=0, max_tokens=64,
             messages=[{"role": "user", "content": "Reply with just the word yes."}])
    assert r.choices[0].finish_reason == "stop", r
    assert r.usage.completion_tokens < 64
    assert "<|im_end|>" not in r.choices[0].message.content


def test_chat_stream_with_usage(oai):
    ref = chat(oai, temperature=0, max_tokens=16)
    stream = chat(oai, temperature=0, max_tokens=16, stream=True, stream_options={"include_usage": True})
    texts, finish, usage, chunks = collect_chat_stream(stream)
    assert texts == {0: ref.choices[0].message.content}
    assert finish == {0: ref.choices[0].finish_reason}
    first = [c for c in chunks if c.choices][0]
    assert first.choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1, "chunks of one stream must share the id"
    assert usage is not None and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (ref.usage.prompt_tokens, ref.usage.completion_tokens, ref.usage.total_tokens)


def test_chat_stream_continuous_usage(oai):
    stream = chat(oai, temperature=0, max_tokens=6, stream=True,
                  stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) >= 2, "continuous_usage_stats: every chunk should carry usage"
    comp_tokens = [c.usage.completion_tokens for c in with_usage]
    assert comp_tokens == sorted(comp_tokens) and comp_tokens[-1] == 6


# --- stop sequences ----------------------------------------------------------------------------------

def _stop_from(text, min_pos=6, length=4):
    """A substring of text (not at the start) whose first occurrence is at its position."""
    for p in range(min_pos, len(text) - length):
        s = text[p:p + length]
        if s.strip() and text.find(s) == p:
            return p, s
    pytest.fail("no usable stop string in %r" % text)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_stop_sequences(oai, api):
    if api == "chat":
        msgs = [{"role": "user", "content": "Describe the sea in two sentences."}]
        call = lambda **kw: chat(oai, messages=msgs, temperature=0, max_tokens=24, **kw)  # noqa: E731
        text_of = lambda r: r.choices[0].message.content  # noqa: E731
        collect = collect_chat_stream
    else:
        call = lambda **kw: comp(oai, temperature=0, max_tokens=24, **kw)  # noqa: E731
        text_of = lambda r: r.choices[0].text  # noqa: E731
        collect = collect_comp_stream
    full = call()
    g = text_of(full)
    p, s = _stop_from(g)
    r = call(stop=[s, "\u2603never\u2603"])
    assert text_of(r) == g[:p], "stop %r: expected %r, got %r" % (s, g[:p], text_of(r))
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens <= full.usage.completion_tokens
    # a single string works too
    assert text_of(call(stop=s)) == g[:p]
    # streaming: the held-back text never leaks the stop string
    texts, finish, usage, _ = collect(call(stop=[s], stream=True, stream_options={"include_usage": True}))
    assert texts[0] == g[:p], "streamed with stop %r: %r" % (s, texts[0])
    assert finish[0] == "stop"
    assert usage.completion_tokens == r.usage.completion_tokens


def test_stop_at_first_token_gives_empty_text(oai):
    g = chat(oai, temperature=0, max_tokens=8).choices[0].message.content
    r = chat(oai, temperature=0, max_tokens=8, stop=[g[:2]])
    assert r.choices[0].message.content == "" and r.choices[0].finish_reason == "stop"


# --- seeds ---------------------------------------------------------------------------------------------

def test_seed_reproducible(oai):
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=16,
              messages=[{"role": "user", "content": "Tell me something about cats."}])
    a = chat(oai, seed=1234, **kw)
    b = chat(oai, seed=1234, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage == b.usage
    others = {chat(oai, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    others.add(a.choices[0].message.content)
    assert len(others) >= 2, "four seeds gave the same sampled text: the seed is ignored"
    # streamed with the same seed: the same text
    texts, _, _, _ = collect_chat_stream(chat(oai, seed=1234, stream=True, **kw))
    assert texts[0] == a.choices[0].message.content


def test_seed_reproducible_completions(oai):
    a = comp(oai, temperature=0.8, seed=7, max_tokens=12)
    b = comp(oai, temperature=0.8, seed=7, max_tokens=12)
    assert a.choices[0].text == b.choices[0].text


# --- logprobs ------------------------------------------------------------------------------------------

def test_chat_logprobs(oai):
    r = chat(oai, temperature=0, max_tokens=10, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    toks = [t.token for t in content]
    if c.finish_reason == "stop" and "".join(toks) != c.message.content:
        # ended by the end-of-turn token: it is counted and has a logprob (as in vLLM), not shown as text
        assert toks[-1] == "<|im_end|>" and "".join(toks[:-1]) == c.message.content, (toks, c.message.content)
    else:
        assert "".join(toks) == c.message.content
    for t in content:
        assert t.logprob <= 0.0 and math.isfinite(t.logprob)
        assert len(t.top_logprobs) == 3
        tl = [x.logprob for x in t.top_logprobs]
        assert tl == sorted(tl, reverse=True)
        # greedy: the chosen token is the first alternative
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5
        if t.bytes is not None:
            assert bytes(t.bytes).decode("utf-8") == t.token
    # logprobs without top_logprobs
    r2 = chat(oai, temperature=0, max_tokens=4, logprobs=True)
    assert len(r2.choices[0].logprobs.content) == r2.usage.completion_tokens
    assert all(not t.top_logprobs for t in r2.choices[0].logprobs.content)
    # no logprobs unless asked
    assert chat(oai, temperature=0, max_tokens=4).choices[0].logprobs is None


def test_chat_logprobs_sampled_stream(oai):
    kw = dict(temperature=0.9, seed=99, max_tokens=8, logprobs=True, top_logprobs=2)
    ref = chat(oai, **kw)
    lps = []
    for ch in chat(oai, stream=True, **kw):
        for c in ch.choices:
            if c.logprobs and c.logprobs.content:
                lps.extend(c.logprobs.content)
    assert [t.token for t in lps] == [t.token for t in ref.choices[0].logprobs.content]
    for a, b in zip(lps, ref.choices[0].logprobs.content):
        assert abs(a.logprob - b.logprob) < 1e-5


# --- n > 1 ---------------------------------------------------------------------------------------------

def test_chat_n(oai):
    kw = dict(n=3, temperature=1.0, seed=5, max_tokens=10, logprobs=True,
              messages=[{"role": "user", "content": "Give me a name for a dog."}])
    r = chat(oai, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    total = sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.completion_tokens == total
    assert len({c.message.content for c in r.choices}) >= 2, "n=3 sampled choices are all identical"
    # the same request again gives the same choices
    r2 = chat(oai, **kw)
    assert [c.message.content for c in r2.choices] == [c.message.content for c in r.choices]
    # streamed: every choice's text equals the non-streamed one
    texts, finish, usage, _ = collect_chat_stream(chat(oai, stream=True, stream_options={"include_usage": True}, **kw))
    assert texts == {c.index: c.message.content for c in r.choices}
    assert finish == {c.index: c.finish_reason for c in r.choices}
    assert usage.completion_tokens == r.usage.completion_tokens and usage.prompt_tokens == r.usage.prompt_tokens


def test_completion_n_greedy(oai):
    r = comp(oai, n=2, temperature=0, max_tokens=8)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == r.choices[1].text
    one = comp(oai, temperature=0, max_tokens=8)
    assert r.choices[0].text == one.choices[0].text
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == 2 * one.usage.completion_tokens


# --- metrics -------------------------------------------------------------------------------------------

def test_metrics_count_what_usage_reports(server, oai):
    before = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "minke:live_requests",
                 "minke:slots_in_use", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count"):
        assert before.has(name), "/metrics lacks %s" % name
    usages = []
    for i in range(3):
        r = comp(oai, prompt="Counting: %d," % i, temperature=0, max_tokens=4 + i)
        assert r.choices[0].finish_reason == "length"
        usages.append(r.usage)
    r = chat(oai, temperature=0, max_tokens=5, stream=True, stream_options={"include_usage": True})
    _, finish, u, _ = collect_chat_stream(r)
    usages.append(u)
    after = server.metrics()

    def delta(name, **labels):
        return (after.get(name, **labels) or 0) - (before.get(name, **labels) or 0)
    assert delta("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    n_length = 3 + (finish[0] == "length")
    assert delta("vllm:request_success_total", finished_reason="length") == n_length
    assert delta("vllm:request_success_total") == 4
    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 4
    # histogram buckets are cumulative and +Inf equals the count
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert after.types.get(h) == "histogram", (h, after.types.get(h))
        buckets = sorted(((float(l["le"]), v) for l, v in after.series(h + "_bucket")), key=lambda x: x[0])
        assert buckets and buckets[-1][0] == math.inf
        vals = [v for _, v in buckets]
        assert vals == sorted(vals), "%s buckets not cumulative" % h
        assert buckets[-1][1] == after.get(h + "_count")
        assert after.get(h + "_sum") > 0
    assert after.get("vllm:num_requests_running") == 0
    assert after.get("minke:live_requests") == 0


# --- vLLM extras and OpenAI fields with an exact expected effect -----------------------------------

def test_logit_bias_forces_a_token(server, oai):
    tid = server.tokenize(prompt=" banana", add_special_tokens=False)[-1]
    r = comp(oai, temperature=0, max_tokens=4, logit_bias={str(tid): 100}, logprobs=1)
    toks = r.choices[0].logprobs.tokens
    assert len(toks) == 4 and len(set(toks)) == 1, toks
    d = server.post("/detokenize", {"model": MODEL, "tokens": [tid] * 4})
    assert d.status_code == 200 and d.json()["prompt"] == r.choices[0].text
    # and -100 bans it
    r = comp(oai, prompt="Yellow fruit: a", temperature=0, max_tokens=6, logit_bias={str(tid): -100}, logprobs=1)
    assert toks[0] not in r.choices[0].logprobs.tokens


def test_include_stop_str_and_echo(oai):
    g = comp(oai, temperature=0, max_tokens=16).choices[0].text
    p, s = _stop_from(g)
    r = comp(oai, temperature=0, max_tokens=16, stop=[s], extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text == g[:p] + s
    r = comp(oai, temperature=0, max_tokens=6, echo=True)
    assert r.choices[0].text == PROMPT_TEXT + g[:len(r.choices[0].text) - len(PROMPT_TEXT)]
    assert r.choices[0].text.startswith(PROMPT_TEXT) and len(r.choices[0].text) > len(PROMPT_TEXT)


def test_min_tokens_ignore_eos_stop_token_ids(server, oai):
    msgs = [{"role": "user", "content": "Reply with just the word yes."}]
    short = chat(oai, messages=msgs, temperature=0, max_tokens=64)
    assert short.choices[0].finish_reason == "stop"
    n = short.usage.completion_tokens
    r = chat(oai, messages=msgs, temperature=0, max_tokens=n + 6, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == n + 6 and r.choices[0].finish_reason == "length"
    r = chat(oai, messages=msgs, temperature=0, max_tokens=64, extra_body={"min_tokens": n + 3})
    assert r.usage.completion_tokens >= n + 3
    # stop_token_ids: the first generated token ends the request
    first = chat(oai, messages=msgs, temperature=0, max_tokens=1, logprobs=True).choices[0].logprobs.content[0].token
    ids = server.tokenize(prompt=first, add_special_tokens=False)
    assert len(ids) == 1, (first, ids)
    r = chat(oai, messages=msgs, temperature=0, max_tokens=8, extra_body={"stop_token_ids": ids})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    assert r.choices[0].message.content == ""
