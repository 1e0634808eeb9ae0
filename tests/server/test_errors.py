"""Error cases: 401 with and without a key on every inference route, 400 naming the offending field,
404 for an unknown model or route, 413 for an oversized body, malformed and hostile JSON. Through
the `openai` SDK where it can express the request; raw `requests` for the rest."""
import socket

import openai
import pytest
import requests

from conftest import DEFAULT_NAME as MODEL
from srvutil import SLOW, names_field, openai_error_body

MAX_BODY = 65536
MAX_LEN = 512
SERVER_ARGS = ["--max-body-bytes", str(MAX_BODY), "--max-model-len", str(MAX_LEN)]
MSGS = [{"role": "user", "content": "Hi"}]

INFERENCE_ROUTES = [
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 2}),
    ("POST", "/v1/messages", {"model": MODEL, "messages": MSGS, "max_tokens": 2}),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, "messages": MSGS}),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"model": MODEL, "prompt": "Hi"}),
    ("POST", "/detokenize", {"model": MODEL, "tokens": [1, 2]}),
]


# --- 401 ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,body", INFERENCE_ROUTES, ids=[p for _, p, _ in INFERENCE_ROUTES])
def test_401_without_and_with_wrong_key(server, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong-key"}, {"Authorization": server.api_key},
                    {"Authorization": "Bearer " + server.api_key + "x"}):
        r = requests.request(method, server.url + path, json=body, headers=headers, timeout=60 * SLOW)
        assert r.status_code == 401, "%s %s with %s -> %d %s" % (method, path, headers, r.status_code, r.text[:200])
        if path.startswith("/v1/messages"):
            continue  # Anthropic's error shape: test_anthropic.py
        e = openai_error_body(r)
        assert e["type"] in ("authentication_error", "invalid_request_error", "AuthenticationError"), e
    # and the right key passes
    r = requests.request(method, server.url + path, json=body, headers=server.headers(), timeout=60 * SLOW)
    assert r.status_code == 200, "%s %s with the key -> %d %s" % (method, path, r.status_code, r.text[:300])


def test_401_through_sdk(server):
    c = server.openai(api_key="not-the-key")
    with pytest.raises(openai.AuthenticationError) as ei:
        c.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    assert ei.value.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        c.models.list()
    c.close()


def test_health_and_metrics_without_key(server):
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    # /metrics carries no user data; Prometheus scrapes it without the API key (as in vLLM)
    assert requests.get(server.url + "/metrics", timeout=30).status_code == 200


# --- 400 naming the field -------------------------------------------------------------------------

def bad_chat(oai, field, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", MSGS)
    kw.setdefault("max_tokens", 2)
    with pytest.raises(openai.BadRequestError) as ei:
        oai.chat.completions.create(**kw)
    e = openai_error_body(ei.value.response)
    assert e["type"] in ("invalid_request_error", "BadRequestError"), e
    assert names_field(e, field), "400 does not name %r: %r" % (field, e)
    return e


def bad_comp(oai, field, **kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("prompt", "Hi")
    kw.setdefault("max_tokens", 2)
    with pytest.raises(openai.BadRequestError) as ei:
        oai.completions.create(**kw)
    e = openai_error_body(ei.value.response)
    assert names_field(e, field), "400 does not name %r: %r" % (field, e)
    return e


def test_400_unknown_field(oai):
    e = bad_chat(oai, "bogus_field", extra_body={"bogus_field": 1})
    assert e["param"] == "bogus_field" or "bogus_field" in e["message"]
    bad_comp(oai, "another_unknown", extra_body={"another_unknown": {"x": 1}})


@pytest.mark.parametrize("field,kw", [
    ("temperature", {"temperature": -0.5}),
    ("temperature", {"temperature": "hot"}),
    ("top_p", {"top_p": 1.5}),
    ("top_p", {"top_p": 0}),
    ("max_tokens", {"max_tokens": 0}),
    ("max_tokens", {"max_tokens": -3}),
    ("max_completion_tokens", {"max_tokens": None, "max_completion_tokens": 0}),
    ("n", {"n": 0}),
    ("presence_penalty", {"presence_penalty": 3}),
    ("frequency_penalty", {"frequency_penalty": -2.5}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": -1}),
    ("logit_bias", {"logit_bias": {"not-a-token": 5}}),
    ("logit_bias", {"logit_bias": {"10": 500}}),
    ("seed", {"seed": "abc"}),
    ("stop", {"stop": 42}),
    ("stream_options", {"stream_options": {"include_usage": True}}),  # without stream
    ("messages", {"messages": []}),
    ("messages", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("messages", {"messages": [{"content": "no role"}]}),
    ("messages", {"messages": [{"role": "user", "content": 5}]}),
    ("messages", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    ("messages", {"messages": "Hi"}),
    ("response_format", {"response_format": {"type": "yaml"}}),
    ("reasoning_effort", {"reasoning_effort": "extreme"}),
])
def test_400_bad_chat_fields(oai, field, kw):
    bad_chat(oai, field, **kw)


@pytest.mark.parametrize("field,kw", [
    ("prompt", {"prompt": ""}),
    ("prompt", {"prompt": [10 ** 9]}),  # token id outside the vocabulary
    ("prompt", {"prompt": {"text": "x"}}),
    ("logprobs", {"logprobs": 50}),
    ("max_tokens", {"max_tokens": "many"}),
    ("echo", {"echo": "yes"}),
])
def test_400_bad_completion_fields(oai, field, kw):
    bad_comp(oai, field, **kw)


def test_400_missing_required(server):
    r = server.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 2})
    assert r.status_code == 400 and names_field(openai_error_body(r), "messages"), r.text
    r = server.post("/v1/completions", {"model": MODEL, "max_tokens": 2})
    assert r.status_code == 400 and names_field(openai_error_body(r), "prompt"), r.text


def test_400_too_long_for_the_context(oai, server):
    e = bad_chat(oai, "max_tokens", max_tokens=MAX_LEN + 1)
    assert str(MAX_LEN) in e["message"], e
    # a prompt longer than the context (within the body limit): 400, not 413 or 5xx
    with pytest.raises(openai.BadRequestError) as ei:
        oai.completions.create(model=MODEL, prompt="hello " * (MAX_LEN + 10), max_tokens=1)
    assert str(MAX_LEN) in openai_error_body(ei.value.response)["message"]


# --- 404 --------------------------------------------------------------------------------------------

def test_404_unknown_model(oai, server):
    with pytest.raises(openai.NotFoundError) as ei:
        oai.chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=2)
    e = openai_error_body(ei.value.response)
    assert "no-such-model" in e["message"]
    assert e["param"] in (None, "model")
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4o", prompt="Hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_404_unknown_route_and_405(server):
    r = server.get("/v1/no-such-route")
    assert r.status_code == 404
    openai_error_body(r)
    r = server.get("/v1/chat/completions")
    assert r.status_code in (404, 405), r.status_code
    assert r.status_code < 500


# --- 413 and hostile bodies ------------------------------------------------------------------------

def test_413_oversized_body(server, oai):
    big = "x" * (MAX_BODY + 1024)
    r = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": big}]})
    assert r.status_code == 413, (r.status_code, r.text[:200])
    openai_error_body(r)
    with pytest.raises(openai.APIStatusError) as ei:
        oai.completions.create(model=MODEL, prompt=big, max_tokens=1)
    assert ei.value.status_code == 413
    # declared too large by Content-Length alone: answered without waiting for the body
    with socket.create_connection(("127.0.0.1", server.port), timeout=30 * SLOW) as sk:
        sk.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                    "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n{" % server.api_key).encode())
        head = sk.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 413"), head[:200]
    # chunked transfer encoding of an oversized body
    def gen():
        yield b'{"model": "%s", "prompt": "' % MODEL.encode()
        for _ in range(MAX_BODY // 1024 + 2):
            yield b"y" * 1024
        yield b'"}'
    r = requests.post(server.url + "/v1/completions", data=gen(), timeout=30 * SLOW,
                      headers=dict(server.headers(), **{"Content-Type": "application/json"}))
    assert r.status_code == 413, (r.status_code, r.text[:200])
    # the server is fine afterwards
    assert oai.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices[0].text is not None


@pytest.mark.parametrize("body", [
    b"", b"{", b"[]", b"null", b'"text"', b"{\"model\": }", b'{"model": "x", "messages": [}',
    b'{"model": "smollm2-test", "prompt": "\xff\xfe invalid utf-8", "max_tokens": 2}',
    b'{"model": "smollm2-test", "prompt": "\\ud800", "max_tokens": 2}',
])
def test_400_malformed_json(server, body):
    r = requests.post(server.url + "/v1/completions", data=body, timeout=30 * SLOW,
                      headers=dict(server.headers(), **{"Content-Type": "application/json"}))
    assert r.status_code == 400, (body, r.status_code, r.text[:200])
    openai_error_body(r)


def test_400_deep_nesting(server):
    deep = "[" * 20000 + "]" * 20000
    body = '{"model": "%s", "messages": [{"role": "user", "content": "x"}], "metadata": %s}' % (MODEL, deep)
    r = requests.post(server.url + "/v1/chat/completions", data=body, timeout=30 * SLOW,
                      headers=dict(server.headers(), **{"Content-Type": "application/json"}))
    assert r.status_code == 400, (r.status_code, r.text[:200])
    openai_error_body(r)
    assert server.get("/health").status_code == 200


def test_errors_leave_no_state(server):
    from srvutil import wait_idle
    wait_idle(server, timeout=5)
