"""srvutil.py — helpers shared by the server test suites (tests/server/).

The server under test is `minke serve`, started by the fixtures in conftest.py. Clients are the
official `openai` and `anthropic` SDKs; `requests` is used only for routes the SDKs do not have
(/health, /metrics, /tokenize, /openapi.json) and for raw error cases the SDKs cannot express
(missing key, malformed JSON, oversized bodies).
"""
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import uuid

import anthropic
import openai
import requests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ASan/UBSan builds are several times slower: every timeout in the suites is multiplied by this.
SLOW = float(os.environ.get("MINKE_TEST_SLOW", "1"))
# Threads for the engine (the development VM has 2 cores shared with other work).
THREADS = os.environ.get("MINKE_SERVE_THREADS", "1")

DSV4_MODEL = os.path.join(ROOT, "tests/data/dsv4/v4-tiny-fp8")
DSV4_TOKENIZER = os.path.join(ROOT, "tests/data/tok512/tokenizer.json")
VECTORS = os.path.join(ROOT, "tests/data/encoding-dsv4/vectors.json")


def minke_bin():
    b = os.environ.get("MINKE_BIN", "build/minke")
    if not os.path.isabs(b):
        b = os.path.join(ROOT, b)
    return b


_help_cache = {}


def serve_help():
    """`minke serve --help` text (cached), used to adapt to options the server has."""
    b = minke_bin()
    if b not in _help_cache:
        try:
            p = subprocess.run([b, "serve", "--help"], capture_output=True, text=True, timeout=30 * SLOW)
            _help_cache[b] = p.stdout + p.stderr
        except (OSError, subprocess.TimeoutExpired) as e:
            _help_cache[b] = "<%s>" % e
    return _help_cache[b]


def has_option(opt):
    return re.search(r"(^|\s)%s(\s|=|,|$)" % re.escape(opt), serve_help(), re.M) is not None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ServerError(Exception):
    pass


class MinkeServer:
    """One `minke serve` process on a free port. stderr/stdout go to a log file that is shown when
    starting fails or the process does not shut down cleanly."""

    def __init__(self, name, args, log_dir, api_key=None, model_name=None):
        self.name = name
        self.args = list(args)
        self.api_key = api_key if api_key is not None else "sk-minke-test-" + uuid.uuid4().hex[:12]
        self.model_name = model_name
        self.log_path = os.path.join(str(log_dir), "%s.log" % name)
        self.proc = None
        self.port = None
        self.terminated = False

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def cmd(self):
        c = [minke_bin(), "serve", "--port", str(self.port)]
        if has_option("--host"):
            c += ["--host", "127.0.0.1"]
        if self.api_key:
            c += ["--api-key", self.api_key]
        if self.model_name:
            c += ["--served-model-name", self.model_name]
        if has_option("--threads") and "--threads" not in self.args:
            c += ["--threads", THREADS]
        return c + self.args

    def log_tail(self, n=60):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "<no log>"

    def start(self, timeout=None):
        timeout = timeout or 120 * SLOW
        b = minke_bin()
        if not os.path.exists(b):
            raise ServerError("%s does not exist (set MINKE_BIN or build it: make)" % b)
        last = None
        for _attempt in range(3):
            self.port = free_port()
            self.log = open(self.log_path, "w")
            self.log.write("$ %s\n" % " ".join(self.cmd()))
            self.log.flush()
            self.proc = subprocess.Popen(self.cmd(), stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
            t0 = time.time()
            while time.time() - t0 < timeout:
                if self.proc.poll() is not None:
                    break
                try:
                    with open(self.log_path, errors="replace") as f:
                        text = f.read()
                except OSError:
                    text = ""
                if "listening on" in text:
                    try:
                        r = requests.get(self.url + "/health", timeout=5 * SLOW)
                        if r.status_code == 200:
                            return self
                    except requests.RequestException:
                        pass
                time.sleep(0.1)
            rc = self.proc.poll()
            last = "server %s %s; log:\n%s" % (
                self.name, "exited with code %s while starting" % rc if rc is not None
                else "was not ready after %.0f s" % timeout, self.log_tail())
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if "in use" not in self.log_tail():
                break
        raise ServerError(last)

    def stop(self, timeout=None):
        """SIGTERM, then the exit code must be 0 (graceful shutdown) and the log free of sanitizer
        reports. Returns an error string, or None."""
        timeout = timeout or 60 * SLOW
        if self.proc is None:
            return None
        problems = []
        if self.proc.poll() is not None and self.terminated:
            if self.proc.returncode != 0:
                problems.append("server %s exited with code %s after SIGTERM (expected 0)" % (self.name, self.proc.returncode))
        elif self.proc.poll() is not None:
            problems.append("server %s died during the tests with exit code %s" % (self.name, self.proc.returncode))
        else:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=timeout)
                if rc != 0:
                    problems.append("server %s exited with code %s after SIGTERM (expected 0)" % (self.name, rc))
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                problems.append("server %s did not exit within %.0f s of SIGTERM" % (self.name, timeout))
        self.log.close()
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "WARNING: ThreadSanitizer"):
            if marker in text:
                problems.append("sanitizer report in the log of %s (%s)" % (self.name, marker))
        if problems:
            return "; ".join(problems) + "\nlog tail:\n" + self.log_tail(80)
        return None

    def terminate(self):
        """SIGTERM now (graceful shutdown); stop() then only checks the exit code and the log."""
        self.terminated = True
        self.proc.send_signal(signal.SIGTERM)

    # --- clients -------------------------------------------------------------------------------

    def openai(self, api_key=None, timeout=None, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or self.api_key, max_retries=0,
                             timeout=timeout or 120 * SLOW, **kw)

    def anthropic(self, api_key=None, timeout=None, **kw):
        return anthropic.Anthropic(base_url=self.url, api_key=api_key or self.api_key, max_retries=0,
                                   timeout=timeout or 120 * SLOW, **kw)

    def headers(self):
        return {"Authorization": "Bearer " + self.api_key} if self.api_key else {}

    # --- non-SDK routes ------------------------------------------------------------------------

    def get(self, path, **kw):
        kw.setdefault("headers", self.headers())
        kw.setdefault("timeout", 60 * SLOW)
        return requests.get(self.url + path, **kw)

    def post(self, path, body=None, **kw):
        kw.setdefault("headers", self.headers())
        kw.setdefault("timeout", 120 * SLOW)
        if body is not None:
            kw["json"] = body
        return requests.post(self.url + path, **kw)

    def tokenize(self, **body):
        """POST /tokenize (vLLM's shape: {"prompt"} or {"messages", "tools", ...}) -> token ids."""
        body.setdefault("model", self.model_name)
        r = self.post("/tokenize", body)
        assert r.status_code == 200, "/tokenize %s -> %d %s" % (json.dumps(body)[:300], r.status_code, r.text[:500])
        j = r.json()
        toks = j["tokens"]
        if "count" in j:
            assert j["count"] == len(toks), j
        return toks

    def metrics(self):
        r = self.get("/metrics")
        assert r.status_code == 200, (r.status_code, r.text[:300])
        return Metrics(r.text)


# --- Prometheus text -----------------------------------------------------------------------------

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Metrics:
    def __init__(self, text):
        self.text = text
        self.samples = []  # (name, {labels}, value)
        self.types = {}
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("# TYPE"):
                parts = line.split()
                if len(parts) >= 4:
                    self.types[parts[2]] = parts[3]
                continue
            if line.startswith("#"):
                continue
            m = _LINE.match(line)
            assert m, "malformed Prometheus line: %r" % line
            labels = dict(_LABEL.findall(m.group(3) or ""))
            v = m.group(4)
            value = float("inf") if v == "+Inf" else float("-inf") if v == "-Inf" else float(v)
            self.samples.append((m.group(1), labels, value))

    def has(self, name):
        return any(n == name for n, _, _ in self.samples)

    def get(self, name, **labels):
        """Sum of the samples of `name` whose labels include `labels`; None when there is none."""
        vals = [v for n, l, v in self.samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]
        return sum(vals) if vals else None

    def series(self, name):
        return [(l, v) for n, l, v in self.samples if n == name]


GAUGES_IDLE = ("vllm:num_requests_running", "vllm:num_requests_waiting", "minke:live_requests",
               "minke:slots_in_use")


def wait_idle(server, timeout=10.0):
    """Poll /metrics until every request/sequence gauge reads 0; returns the last Metrics. Fails
    (AssertionError naming the gauges) when they do not within `timeout` seconds (x SLOW)."""
    deadline = time.time() + timeout * SLOW
    while True:
        m = server.metrics()
        vals = {g: m.get(g) for g in GAUGES_IDLE}
        missing = [g for g, v in vals.items() if v is None]
        assert not missing, "gauges missing from /metrics: %s" % missing
        if all(v == 0 for v in vals.values()):
            return m
        if time.time() > deadline:
            raise AssertionError("request/sequence state left behind %.0f s after the clients finished: %s"
                                 % (timeout * SLOW, vals))
        time.sleep(0.2)


# --- errors --------------------------------------------------------------------------------------

def openai_error_body(resp):
    """Checks the OpenAI error shape of a requests/httpx response and returns the inner object."""
    j = resp.json()
    assert isinstance(j, dict) and isinstance(j.get("error"), dict), "not an OpenAI error body: %r" % j
    e = j["error"]
    for k in ("message", "type", "param", "code"):
        assert k in e, "error body lacks %r: %r" % (k, j)
    assert isinstance(e["message"], str) and e["message"], j
    return e


def anthropic_error_body(resp):
    j = resp.json()
    assert j.get("type") == "error" and isinstance(j.get("error"), dict), "not an Anthropic error body: %r" % j
    e = j["error"]
    assert isinstance(e.get("type"), str) and isinstance(e.get("message"), str) and e["message"], j
    return e


def names_field(err, field):
    """True when an OpenAI error object names `field` in param or in the message."""
    param = err.get("param") or ""
    if field == param or param.startswith(field + ".") or param.startswith(field + "[") or param.endswith("." + field):
        return True
    # named in the message as a word ("n must be >= 1", "unknown field 'bogus_field'")
    return re.search(r"(^|[^A-Za-z0-9_])%s([^A-Za-z0-9_]|$)" % re.escape(field), err.get("message", "")) is not None


# --- DeepSeek-V4 encoding vectors ----------------------------------------------------------------

def load_vectors():
    with open(VECTORS) as f:
        return json.load(f)


def vector_request(case):
    """An OpenAI chat request equivalent to an encode vector (tools moved from the system message to
    the request's `tools`), plus the reference prompt text."""
    msgs = json.loads(json.dumps(case["messages"]))
    tools = None
    for m in msgs:
        if m["role"] == "system" and "tools" in m:
            tools = m.pop("tools")
    o = case["options"]
    kw = {}
    extra = {}
    if o["thinking_mode"] == "thinking":
        extra["chat_template_kwargs"] = {"thinking": True}
    if o.get("reasoning_effort"):
        kw["reasoning_effort"] = o["reasoning_effort"]
    if tools:
        kw["tools"] = tools
    return msgs, kw, extra


def hf_tokenizer(path):
    """HF `tokenizers` (the oracle the tokenizer tests use) when installed, else None."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(path)


def run_threads(fn, args_list, timeout):
    """Runs fn(*args) in one thread each, started together; returns (results, errors) in order."""
    results = [None] * len(args_list)
    errors = [None] * len(args_list)
    barrier = threading.Barrier(len(args_list))

    def body(i, args):
        try:
            barrier.wait(timeout=30)
            results[i] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors[i] = e

    ts = [threading.Thread(target=body, args=(i, a), daemon=True) for i, a in enumerate(args_list)]
    for t in ts:
        t.start()
    deadline = time.time() + timeout
    for t in ts:
        t.join(max(0.1, deadline - time.time()))
    alive = sum(t.is_alive() for t in ts)
    assert alive == 0, "%d of %d client threads still running after %.0f s" % (alive, len(ts), timeout)
    return results, errors
