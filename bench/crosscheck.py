#!/usr/bin/env python3
"""crosscheck.py — measure one workload with `minke bench serve` and with NVIDIA's `aiperf` (PyPI)
against the same server, and compare TTFT p50, TPOT p50 and output tokens/s.

Same workload, literally: `minke bench serve --dry-run --dump-requests` writes the exact request
bodies it would send (token-id prompts, max_tokens, ignore_eos, stream with include_usage) for
another seed; they become an aiperf `mooncake_trace` file whose entries carry each body as a
verbatim `payload`, replayed at the same fixed concurrency. Same lengths and request shape, other
token ids: neither tool gets prefix-cache hits from the prompts the other sent. Both tools take output token counts from the server's usage
(`--use-server-token-count`), so aiperf's tokenizer only has to load: any local tokenizer.json
will do (default: tests/data/tok512, so nothing is downloaded).

Without --base-url the script starts `minke serve` itself (default model, --max-num-seqs 4,
prefix caching off so the replay by the second tool gets no cache hits the first did not get),
and stops it with SIGTERM. Rounds alternate minke / aiperf; the medians over rounds are compared.
Exit status 0 when every compared number agrees within --tolerance (default 10%).

  pip install aiperf        # benchmark-time tool, not needed by minke or its tests
  python3 bench/crosscheck.py --input-len 64 --output-len 32 --num-prompts 16 --concurrency 2
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_health(url, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


CLIENT_PIN = []


def run(cmd, log):
    cmd = CLIENT_PIN + cmd
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), open(log).read()[-3000:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minke", default=os.path.join(ROOT, "build/minke"))
    ap.add_argument("--aiperf", default=os.environ.get("AIPERF", shutil.which("aiperf") or "aiperf"))
    ap.add_argument("--base-url", help="an already running server (default: start minke serve)")
    ap.add_argument("--serve-args", default="--max-num-seqs 4 --no-enable-prefix-caching",
                    help="extra arguments for the minke serve this script starts")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/data/tok512/tokenizer.json"),
                    help="any local tokenizer.json for aiperf to load (counts come from usage)")
    ap.add_argument("--server-cpus", help="taskset CPU list for the minke serve this script starts, e.g. 0")
    ap.add_argument("--client-cpus", help="taskset CPU list for both load generators, e.g. 1 (keeps the "
                    "clients' own CPU use off the server's cores)")
    ap.add_argument("--out", help="write the numbers as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()

    if a.client_cpus:
        CLIENT_PIN[:] = ["taskset", "-c", a.client_cpus]
    work = tempfile.mkdtemp(prefix="minke-crosscheck-")
    tok = os.path.join(work, "tokenizer")
    os.makedirs(tok)
    shutil.copy(a.tokenizer, os.path.join(tok, "tokenizer.json"))
    with open(os.path.join(tok, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)

    server = None
    url = a.base_url
    if not url:
        port = free_port()
        url = "http://127.0.0.1:%d" % port
        log = open(os.path.join(work, "serve.log"), "w")
        pin = ["taskset", "-c", a.server_cpus] if a.server_cpus else []
        server = subprocess.Popen(pin + [a.minke, "serve", "--port", str(port)] + a.serve_args.split(),
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        if not wait_health(url, server):
            sys.exit("server at %s did not become healthy" % url)
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            model = json.load(r)["data"][0]["id"]
        common = ["--base-url", url, "--dataset", "random", "--random-input-len", str(a.input_len),
                  "--random-output-len", str(a.output_len), "--num-prompts", str(a.num_prompts),
                  "--max-concurrency", str(a.concurrency)]
        # warm the server up (page faults, first allocations) with two requests nobody measures
        run([a.minke, "bench", "serve", "--base-url", url, "--random-input-len", str(a.input_len),
             "--random-output-len", "4", "--num-prompts", "2", "--seed", "999", "--quiet"],
            os.path.join(work, "warmup.log"))
        mk, ai = [], []
        for rnd in range(a.rounds):
            # each tool gets prompts of its own (same lengths, other seeds), so neither replays
            # prompts the server has cached from the other
            res = os.path.join(work, "minke-%d.json" % rnd)
            reqs = os.path.join(work, "requests-%d.jsonl" % rnd)
            run([a.minke, "bench", "serve"] + common + ["--seed", str(a.seed + 2 * rnd), "--save-result", res],
                os.path.join(work, "minke-%d.log" % rnd))
            run([a.minke, "bench", "serve"] + common + ["--seed", str(a.seed + 2 * rnd + 1), "--dry-run",
                                                         "--dump-requests", reqs], os.path.join(work, "dump-%d.log" % rnd))
            s = json.load(open(res))["runs"][0]["summary"]
            assert s["failed"] == 0, s
            mk.append({"ttft_p50_ms": s["median_ttft_ms"], "tpot_p50_ms": s["median_tpot_ms"],
                       "output_tok_s": s["output_throughput"], "req_s": s["request_throughput"]})
            trace = os.path.join(work, "trace-%d.jsonl" % rnd)
            with open(trace, "w") as f:
                for line in open(reqs):
                    f.write(json.dumps({"payload": json.loads(line)}) + "\n")
            art = os.path.join(work, "aiperf-%d" % rnd)
            run([a.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", "completions",
                 "--streaming", "--input-file", trace, "--custom-dataset-type", "mooncake_trace",
                 "--concurrency", str(a.concurrency), "--request-count", str(a.num_prompts),
                 "--tokenizer", tok, "--use-server-token-count", "--ui-type", "none",
                 "--random-seed", str(a.seed), "--output-artifact-dir", art, "--no-server-metrics",
                 "--no-gpu-telemetry"], os.path.join(work, "aiperf-%d.log" % rnd))
            d = json.load(open(os.path.join(art, "profile_export_aiperf.json")))
            assert d["request_count"]["avg"] == a.num_prompts, d["request_count"]
            # aiperf's inter_token_latency is per request (E2E - TTFT) / (n - 1): vLLM's TPOT
            ai.append({"ttft_p50_ms": d["time_to_first_token"]["p50"], "tpot_p50_ms": d["inter_token_latency"]["p50"],
                       "output_tok_s": d["output_token_throughput"]["avg"], "req_s": d["request_throughput"]["avg"]})
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory:", work)

    print("workload: random, %d prompts x (%d in, %d out tokens), concurrency %d, %d round(s), server %s%s"
          % (a.num_prompts, a.input_len, a.output_len, a.concurrency, a.rounds, url,
             ", server on CPUs %s, clients on CPUs %s" % (a.server_cpus, a.client_cpus) if a.client_cpus else ""))
    print("%-16s %12s %12s %10s" % ("metric", "minke bench", "aiperf", "diff"))
    ok = True
    out = {"workload": vars(a), "minke": mk, "aiperf": ai, "compare": {}}
    for k in ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s", "req_s"):
        m = statistics.median(x[k] for x in mk)
        p = statistics.median(x[k] for x in ai)
        diff = (m - p) / p if p else float("inf")
        within = abs(diff) <= a.tolerance
        if k in ("ttft_p50_ms", "output_tok_s"):
            ok = ok and within
        out["compare"][k] = {"minke": m, "aiperf": p, "rel_diff": diff}
        print("%-16s %12.2f %12.2f %+9.1f%%%s" % (k, m, p, 100 * diff, "" if within else "  (outside tolerance)"))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    print("agree within %.0f%% (TTFT p50, output tok/s): %s" % (100 * a.tolerance, "yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
