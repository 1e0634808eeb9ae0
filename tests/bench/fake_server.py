#!/usr/bin/env python3
"""fake_server.py — a tiny OpenAI-compatible server with fixed, known timings, for testing
`minke bench` without a model (standard library only).

It imitates what `minke bench` relies on from a real server (minke, vLLM):
  POST /v1/completions, /v1/chat/completions   SSE streaming (HTTP/1.1 chunked, keep-alive), one
                                               token per event (--chunk-tokens to group), usage in
                                               a last chunk with stream_options.include_usage,
                                               ignore_eos honoured (without it, generation stops
                                               early with --eos-every)
  POST /tokenize, /detokenize                   vLLM's shapes, incl. {"messages": [...]}
  GET  /v1/models, /version, /health, /metrics  metrics with vLLM names (prefix cache, tokens)
The tokenizer is word-level: token id i is the word "t<i>"; any other word maps to a hash id, so
ids -> text -> ids round-trips exactly and text of n words is n tokens. add_special_tokens puts
BOS (id 1) first; the chat template adds <|im_start|> role ... <|im_end|> around each message and
"<|im_start|> assistant" at the end. A prefix cache of 4-token blocks counts hits like vLLM's
(full blocks from the start that an earlier prompt already had).

Timing model per request: TTFT = --ttft-ms + --prefill-ms-per-token x uncached prompt tokens, then
one token every --tpot-ms x (1 + --batch-penalty x (requests in flight - 1)). The chat endpoint
sends its role chunk at once (a TTFT measured from it would be wrong: `minke bench` must skip it).

  python3 tests/bench/fake_server.py --port 8123 --ttft-ms 50 --tpot-ms 10
"""
import argparse
import hashlib
import json
import signal
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VOCAB = 50000
BOS, IM_START, IM_END = 1, 2, 3
BLOCK = 4

state_lock = threading.Lock()
state = {"running": 0, "prompt_tokens": 0, "generation_tokens": 0, "queries": 0, "hits": 0, "requests": 0,
         "blocks": set()}


def word_id(w):
    if len(w) > 1 and w[0] == "t" and w[1:].isdigit() and int(w[1:]) < VOCAB:
        return int(w[1:])
    return 10 + zlib.crc32(w.encode()) % (VOCAB - 10)


def tok_text(k):
    """The text of generated token k: " t<k>", and a U+0000 in some of them (real servers stream
    whatever bytes the model writes; JSON carries it as \u0000)."""
    return " t%d" % k + ("\x00" if k % 5 == 0 else "")


def tokenize(text, add_special):
    ids = [word_id(w) for w in text.split()]
    return ([BOS] if add_special else []) + ids


def detokenize(ids):
    return " ".join("t%d" % i for i in ids)


def chat_ids(messages, add_generation_prompt=True):
    ids = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        ids += [IM_START, word_id(m.get("role", "user"))] + tokenize(content, False) + [IM_END]
    if add_generation_prompt:
        ids += [IM_START, word_id("assistant")]
    return ids


def cache_lookup(ids):
    """Cached tokens of ids (full blocks from the start seen before); records its blocks."""
    h = b""
    hit = 0
    miss = False
    with state_lock:
        for b in range(len(ids) // BLOCK):
            h = hashlib.sha1(h + json.dumps(ids[b * BLOCK:(b + 1) * BLOCK]).encode()).digest()
            if not miss and h in state["blocks"]:
                hit += BLOCK
            else:
                miss = True
                state["blocks"].add(h)
        state["queries"] += len(ids)
        state["hits"] += hit
    return hit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-openai/0.1"

    def setup(self):
        super().setup()
        # no Nagle: headers and body go out as separate small writes, which Nagle would hold back
        # for the client's delayed ACK (40 ms)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        if self.server.opts.verbose:
            sys.stderr.write("fake_server: " + fmt % args + "\n")

    # --- helpers -----------------------------------------------------------------------------
    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def error(self, code, msg):
        self.send_json(code, {"error": {"message": msg, "type": "invalid_request_error", "param": None,
                                        "code": code}})

    def authorized(self):
        key = self.server.opts.api_key
        if key and self.headers.get("Authorization") != "Bearer " + key:
            self.error(401, "invalid API key")
            return False
        return True

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            self.error(400, "malformed JSON")
            return None

    def chunk(self, data):
        payload = ("data: %s\n\n" % data).encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    # --- routes ------------------------------------------------------------------------------
    def do_GET(self):
        if self.path == "/health":
            return self.send_json(200, {})
        if self.path == "/version":
            return self.send_json(200, {"version": "fake-0.1", "commit": "fake"})
        if self.path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        if self.path == "/metrics":
            with state_lock:
                s = dict(state)
            text = "".join([
                "# TYPE vllm:num_requests_running gauge\n",
                'vllm:num_requests_running{model_name="fake-model"} %d\n' % s["running"],
                "# TYPE vllm:prefix_cache_queries counter\n",
                'vllm:prefix_cache_queries_total{model_name="fake-model"} %d\n' % s["queries"],
                "# TYPE vllm:prefix_cache_hits counter\n",
                'vllm:prefix_cache_hits_total{model_name="fake-model"} %d\n' % s["hits"],
                "# TYPE vllm:prompt_tokens counter\n",
                'vllm:prompt_tokens_total{model_name="fake-model"} %d\n' % s["prompt_tokens"],
                "# TYPE vllm:generation_tokens counter\n",
                'vllm:generation_tokens_total{model_name="fake-model"} %d\n' % s["generation_tokens"],
            ]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
            return
        self.error(404, "no route " + self.path)

    def do_POST(self):
        if not self.authorized():
            return
        body = self.read_body()
        if body is None:
            return
        if self.path == "/tokenize":
            if "messages" in body:
                ids = chat_ids(body["messages"], body.get("add_generation_prompt", True))
            else:
                ids = tokenize(body.get("prompt", ""), body.get("add_special_tokens", True))
            return self.send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": 1 << 20})
        if self.path == "/detokenize":
            return self.send_json(200, {"prompt": detokenize(body.get("tokens", []))})
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            return self.generate(body, chat=self.path.endswith("chat/completions"))
        self.error(404, "no route " + self.path)

    def generate(self, body, chat):
        o = self.server.opts
        with state_lock:
            state["requests"] += 1
            nreq = state["requests"]
        if o.fail_every and nreq % o.fail_every == 0:
            return self.error(500, "injected failure")
        if chat:
            if not isinstance(body.get("messages"), list):
                return self.error(400, "messages must be a list")
            ids = chat_ids(body["messages"])
        else:
            p = body.get("prompt")
            if isinstance(p, list) and all(isinstance(x, int) for x in p):
                ids = list(p)
            elif isinstance(p, str):
                ids = tokenize(p, True)
            else:
                return self.error(400, "prompt must be a string or a list of token ids")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        n_out = max_tokens
        if not body.get("ignore_eos") and o.eos_every:
            n_out = min(max_tokens, 1 + (len(ids) % o.eos_every))
        stream = bool(body.get("stream"))
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage")) and not o.no_usage
        cached = cache_lookup(ids)
        with state_lock:
            state["running"] += 1
        try:
            start = time.monotonic()
            created = int(time.time())
            kind = "chat.completion.chunk" if chat else "text_completion"
            rid = "fake-%d" % nreq

            def event(choice):
                return json.dumps({"id": rid, "object": kind, "created": created, "model": "fake-model",
                                   "choices": [choice]})

            if not stream:
                time.sleep((o.ttft_ms + o.prefill_ms_per_token * (len(ids) - cached) + o.tpot_ms * n_out) / 1e3)
                text = "".join(tok_text((nreq * 7 + i) % VOCAB) for i in range(n_out))
                usage = {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}
                ch = {"index": 0, "finish_reason": "length" if n_out == max_tokens else "stop"}
                ch.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
                return self.send_json(200, {"id": rid, "object": kind, "choices": [ch], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if chat:  # the role chunk goes out before any token, as several servers do
                self.chunk(event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
            t = start + (o.ttft_ms + o.prefill_ms_per_token * (len(ids) - cached)) / 1e3
            i = 0
            while i < n_out:
                k = min(o.chunk_tokens, n_out - i)
                if i > 0:
                    with state_lock:
                        running = state["running"]
                    t += k * o.tpot_ms * (1 + o.batch_penalty * (running - 1)) / 1e3
                d = t - time.monotonic()
                if d > 0:
                    time.sleep(d)
                text = "".join(tok_text((nreq * 7 + i + j) % VOCAB) for j in range(k))
                i += k
                fin = None if i < n_out else ("length" if n_out == max_tokens else "stop")
                if chat:
                    self.chunk(event({"index": 0, "delta": {"content": text}, "finish_reason": fin}))
                else:
                    self.chunk(event({"index": 0, "text": text, "logprobs": None, "finish_reason": fin}))
            if usage_wanted:
                self.chunk(json.dumps({"id": rid, "object": kind, "created": created, "model": "fake-model",
                                       "choices": [],
                                       "usage": {"prompt_tokens": len(ids), "completion_tokens": n_out,
                                                 "total_tokens": len(ids) + n_out,
                                                 "prompt_tokens_details": {"cached_tokens": cached}}}))
            self.chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        finally:
            with state_lock:
                state["running"] -= 1
                state["prompt_tokens"] += len(ids)
                state["generation_tokens"] += n_out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--ttft-ms", type=float, default=50)
    ap.add_argument("--prefill-ms-per-token", type=float, default=0)
    ap.add_argument("--tpot-ms", type=float, default=10)
    ap.add_argument("--batch-penalty", type=float, default=0)
    ap.add_argument("--chunk-tokens", type=int, default=1)
    ap.add_argument("--eos-every", type=int, default=0, help="without ignore_eos, stop after 1 + len(prompt) %% N tokens")
    ap.add_argument("--fail-every", type=int, default=0, help="answer 500 to every N-th generation request")
    ap.add_argument("--no-usage", action="store_true", help="never send usage")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--verbose", action="store_true")
    o = ap.parse_args()
    srv = ThreadingHTTPServer((o.host, o.port), Handler)
    srv.daemon_threads = True
    srv.opts = o

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("fake_server: listening on http://%s:%d" % (o.host, srv.server_address[1]), flush=True)
    srv.serve_forever()
    srv.server_close()


if __name__ == "__main__":
    main()
