#!/usr/bin/env bash
# test_bench.sh — `minke bench` end to end.
#
# Part 1, against tests/bench/fake_server.py (known timings, so the numbers themselves are checked):
#   TTFT and TPOT near the server's fixed 50 ms / 10 ms; the chat role chunk, sent at once, is not
#   taken for the first token; injected HTTP 500s are counted as failures with their reason; a
#   stream without usage is flagged; --request-rate spreads the sends over n / rate seconds.
# Part 2, against a live `minke serve --max-num-seqs 4` on the default model (SmolLM2-135M): a short
#   run of each workload (random, prefix-repetition over chat, agentic, ShareGPT from
#   tests/data/bench/) completes with no failure and exact token counts — usage.prompt_tokens ==
#   the built prompt's length and usage.completion_tokens == max_tokens (ignore_eos) for every
#   request, and the server's /metrics counters agree with the client's totals — then a
#   concurrency sweep is saved and charted as SVG.
# Part 2 is skipped (with a message) when `minke serve` does not exist; MINKE_BENCH_FAKE_ONLY=1
# skips it too. Usage: tests/bench/test_bench.sh [build/minke]
set -euo pipefail
MINKE=${1:-build/minke}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_health() { # url pid
    for _ in $(seq 1200); do
        kill -0 "$2" 2>/dev/null || return 1
        curl -sf -o /dev/null "$1/health" && return 0
        sleep 0.1
    done
    return 1
}
passed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }

# check.py RESULT.json [key=value ...]: every run's requests are well-formed and the token counts
# exact; prints one line per run.
cat > "$TMP/check.py" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
opts = dict(a.split("=", 1) for a in sys.argv[2:])
assert res["tool"] == "minke bench" and res["runs"], "not a result file"
for run in res["runs"]:
    s, reqs, cfg = run["summary"], run["requests"], run["config"]
    for k in ("base_url", "model", "dataset", "seed", "endpoint"):
        assert k in cfg, "config lacks " + k
    assert run["server_version"] is not None, "no /version recorded"
    want_fail = int(opts.get("failed", 0))
    assert s["failed"] == want_fail, "failed %d, want %d: %s" % (s["failed"], want_fail, run["failures"])
    assert s["completed"] + s["failed"] == len(reqs)
    n_ok = 0
    for r in reqs:
        if not r["ok"]:
            continue
        n_ok += 1
        assert r["prompt_tokens"] == r["expected_prompt_tokens"], "request %d: usage.prompt_tokens %s, built %s" % (
            r["id"], r["prompt_tokens"], r["expected_prompt_tokens"])
        assert r["output_tokens"] == r["expected_output_tokens"], "request %d: %s output tokens, asked %s" % (
            r["id"], r["output_tokens"], r["expected_output_tokens"])
        assert r["ttft"] is not None and 0 < r["ttft"] <= r["e2el"], r
        assert len(r["itl"]) == r["chunks"] - 1
    assert s["total_output_tokens"] == sum(r["output_tokens"] for r in reqs if r["ok"])
    assert s["prompt_tokens_exact"] == s["prompt_tokens_checked"] == n_ok
    assert s["output_tokens_exact"] == s["output_tokens_checked"] == n_ok
    m = run["server_metrics"]
    if opts.get("server_counters") == "1":
        assert m["scraped"], "no /metrics"
        assert m["generation_tokens"] == s["total_output_tokens"], "server generated %s, client counted %s" % (
            m["generation_tokens"], s["total_output_tokens"])
        assert m["prompt_tokens"] == s["total_input_tokens"], "server prompt tokens %s, client %s" % (
            m["prompt_tokens"], s["total_input_tokens"])
    if "min_sessions" in opts:
        assert len({r["session"] for r in reqs}) >= int(opts["min_sessions"]), "too few sessions"
        assert any(r["subagent"] > 0 for r in reqs), "no sub-agent request"
        assert any(r["turn"] > 0 for r in reqs), "no second turn"
    for k, lo_hi in opts.items():
        if k.startswith("range:"):  # range:median_ttft_ms=LO:HI
            lo, hi = map(float, lo_hi.split(":"))
            v = s[k[6:]]
            assert lo <= v <= hi, "%s = %.3f, want in [%g, %g]" % (k[6:], v, lo, hi)
    print("  concurrency %s: %d ok, %d failed, TTFT p50 %.1f ms, TPOT p50 %.1f ms, %.1f out tok/s" % (
        run["concurrency"], s["completed"], s["failed"], s["median_ttft_ms"], s["median_tpot_ms"], s["output_throughput"]))
PY
check() { python3 "$TMP/check.py" "$@" || fail "result check failed for $1"; }

# ---- part 1: the fake server ------------------------------------------------------------------
start_fake() { # name args...
    local name=$1; shift
    local port; port=$(free_port)
    python3 "$HERE/fake_server.py" --port "$port" "$@" > "$TMP/$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    wait_health "http://127.0.0.1:$port" "$pid" || fail "fake server $name did not start: $(cat "$TMP/$name.log")"
    FAKE_URL="http://127.0.0.1:$port"
    FAKE_PID=$pid
}
stop_pid() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

start_fake timing --ttft-ms 50 --tpot-ms 10
"$MINKE" bench serve --base-url "$FAKE_URL" --random-input-len 24 --random-output-len 12 --num-prompts 8 \
    --max-concurrency 4 --slo ttft=500,tpot=50 --save-result "$TMP/f1.json" > "$TMP/f1.txt" 2>&1 || fail "fake random: $(cat "$TMP/f1.txt")"
check "$TMP/f1.json" "range:median_ttft_ms=45:150" "range:median_tpot_ms=9.5:20" "range:request_goodput=0.1:1000"
grep -q "Successful requests: *8" "$TMP/f1.txt" || fail "table: $(cat "$TMP/f1.txt")"
ok "fake server: random workload, TTFT/TPOT match the server's timing"
"$MINKE" bench serve --base-url "$FAKE_URL" --endpoint chat --random-input-len 24 --random-output-len 12 --num-prompts 4 \
    --save-result "$TMP/f2.json" > "$TMP/f2.txt" 2>&1 || fail "fake chat: $(cat "$TMP/f2.txt")"
check "$TMP/f2.json" "range:median_ttft_ms=45:150"
ok "fake server: chat role chunk is not the first token"
"$MINKE" bench serve --base-url "$FAKE_URL" --random-input-len 8 --random-output-len 2 --num-prompts 10 \
    --request-rate 20 --seed 5 --save-result "$TMP/f3.json" > "$TMP/f3.txt" 2>&1 || fail "fake rate: $(cat "$TMP/f3.txt")"
python3 - "$TMP/f3.json" <<'PY' || fail "request rate"
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]["requests"]
last = max(q["start"] for q in r)
assert 0.45 <= last <= 0.65, "10 requests at 20/s: last sent at %.3f s, want ~0.5" % last
PY
ok "fake server: --request-rate spreads 10 requests over 0.5 s"
stop_pid "$FAKE_PID"

start_fake failing --ttft-ms 5 --tpot-ms 1 --fail-every 3
"$MINKE" bench serve --base-url "$FAKE_URL" --random-input-len 8 --random-output-len 4 --num-prompts 9 \
    --max-concurrency 1 --save-result "$TMP/f4.json" > "$TMP/f4.txt" 2>&1 || fail "fake failures: $(cat "$TMP/f4.txt")"
check "$TMP/f4.json" failed=3
grep -q "failed x3: HTTP 500: injected failure" "$TMP/f4.txt" || fail "failure reasons not shown: $(cat "$TMP/f4.txt")"
ok "fake server: failures counted with their reason"
stop_pid "$FAKE_PID"

start_fake nousage --ttft-ms 5 --tpot-ms 1 --no-usage
"$MINKE" bench serve --base-url "$FAKE_URL" --random-input-len 8 --random-output-len 4 --num-prompts 2 \
    > "$TMP/f5.txt" 2>&1 || fail "fake no usage: $(cat "$TMP/f5.txt")"
grep -q "WARNING: 2 streams had no usage" "$TMP/f5.txt" || fail "missing usage not flagged: $(cat "$TMP/f5.txt")"
ok "fake server: a stream without usage is flagged"
stop_pid "$FAKE_PID"

# ---- part 2: a live minke server --------------------------------------------------------------
if [ "${MINKE_BENCH_FAKE_ONLY:-0}" = 1 ] || ! "$MINKE" serve --help > /dev/null 2>&1; then
    echo "skip: live minke server part (minke serve not available or MINKE_BENCH_FAKE_ONLY=1)"
    echo "bench: $passed passed, 0 failed"
    exit 0
fi
PORT=$(free_port)
URL="http://127.0.0.1:$PORT"
"$MINKE" serve --port "$PORT" --max-num-seqs 4 --threads "${MINKE_SERVE_THREADS:-1}" > "$TMP/serve.log" 2>&1 &
SERVE_PID=$!
PIDS+=("$SERVE_PID")
wait_health "$URL" "$SERVE_PID" || fail "minke serve did not start: $(tail -20 "$TMP/serve.log")"
run() { # name args...
    local name=$1; shift
    "$MINKE" bench serve --base-url "$URL" --save-result "$TMP/$name.json" "$@" > "$TMP/$name.txt" 2>&1 ||
        fail "bench $name: $(cat "$TMP/$name.txt")"
}
run random --dataset random --random-input-len 16 --random-output-len 8 --num-prompts 6 --max-concurrency 4
check "$TMP/random.json" server_counters=1
ok "live: random (token-id prompts, ignore_eos), exact token counts"
run prefix --endpoint chat --dataset prefix-repetition --prefix-num 2 --prefix-len 24 --suffix-len 6 \
    --random-output-len 6 --num-prompts 4 --max-concurrency 4
check "$TMP/prefix.json" server_counters=1
ok "live: prefix-repetition over /v1/chat/completions, exact token counts"
run agentic --dataset agentic --agentic-lanes 2 --agentic-sessions 2 --agentic-turns 3 --agentic-think-ms 50 \
    --agentic-subagent-prob 1 --agentic-subagents 1 --agentic-subagent-turns 1 --agentic-system-len 32 \
    --agentic-first-len 8 --agentic-tool-len 8 --agentic-output-len 6
check "$TMP/agentic.json" server_counters=1 min_sessions=2
ok "live: agentic sessions with growing history and a sub-agent, exact token counts"
run sharegpt --dataset sharegpt --dataset-path tests/data/bench/sharegpt_tiny.json --sharegpt-output-len 6 \
    --num-prompts 4 --max-concurrency 4
check "$TMP/sharegpt.json" server_counters=1
ok "live: ShareGPT file, exact token counts"
run sweep --dataset random --random-input-len 8 --random-output-len 6 --num-prompts 4 --sweep-concurrency 1,2 --quiet
check "$TMP/sweep.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"]; assert [x["concurrency"] for x in r]==[1,2], r' \
    "$TMP/sweep.json" || fail "sweep runs"
"$MINKE" bench plot "$TMP/sweep.json" "$TMP/random.json" --out "$TMP/chart.svg" --title "test" || fail "plot"
python3 - "$TMP/chart.svg" <<'PY' || fail "chart is not a valid SVG with curves"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag.endswith("svg"), root.tag
ns = "{http://www.w3.org/2000/svg}"
assert len(root.findall(".//" + ns + "polyline")) >= 10 and len(root.findall(".//" + ns + "circle")) >= 4
PY
ok "live: concurrency sweep saved and charted (SVG)"
kill -TERM "$SERVE_PID"
rc=0
wait "$SERVE_PID" || rc=$?
[ "$rc" = 0 ] || fail "minke serve exited with $rc after SIGTERM: $(tail -20 "$TMP/serve.log")"
echo "bench: $passed passed, 0 failed"
