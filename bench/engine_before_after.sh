#!/usr/bin/env bash
# engine_before_after.sh — issue 7's engine benchmark: the same `minke bench serve` workloads
# against two minke builds in one run (OLD = slot-mode engine, every sequence's decode run one
# after another; NEW = paged batched forward, weights read once per step, prefix caching), on the
# default model (SmolLM2-135M-Instruct Q4_1) on this machine.
#
#   bash bench/engine_before_after.sh OLD_MINKE NEW_MINKE [OUT_DIR]
#
# 1. random workload (128 prompt tokens, 64 output tokens, ignore_eos, greedy), concurrency
#    1, 4, 16, 64, each with 64 requests: output tokens/s, TTFT and TPOT p50/p99, per build.
# 2. prefix-repetition (4 prefixes of 384 tokens, 32-token unique suffixes, 16 output tokens,
#    48 requests, concurrency 4) on NEW with prefix caching on and off: hit rate from the server's
#    /metrics, TTFT reduction.
# Both servers: --max-num-seqs 64 --max-model-len 512 --threads 2 (THREADS=N to change).
set -euo pipefail
OLD=${1:?old minke binary}; NEW=${2:?new minke binary}; OUT=${3:-bench/results}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
TMP=$(mktemp -d); PID=
cleanup() { [[ -n "$PID" ]] && kill -TERM "$PID" 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # binary extra-args...
    local bin=$1; shift
    P=$(port)
    "$bin" serve --port "$P" --max-num-seqs 64 --max-model-len 512 --threads "$THREADS" "$@" > "$TMP/serve.log" 2>&1 &
    PID=$!
    for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$P/health" && return 0; sleep 0.1; done
    echo "server did not start:"; cat "$TMP/serve.log"; exit 1
}
stop() { kill -TERM "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

for which in old new; do
    bin=$OLD; [[ $which == new ]] && bin=$NEW
    start "$bin"
    echo "== $which ($bin): random 128/64, concurrency 1,4,16,64"
    "$NEW" bench serve --base-url "http://127.0.0.1:$P" --dataset random --random-input-len 128 \
        --random-output-len 64 --num-prompts 64 --sweep-concurrency 1,4,16,64 --seed 1 --num-warmups 1 \
        --label "minke $which" --quiet --save-result "$OUT/engine-$which-random.json"
    stop
done
for pc in on off; do
    extra=(); [[ $pc == off ]] && extra=(--no-enable-prefix-caching)
    start "$NEW" ${extra[@]+"${extra[@]}"}
    echo "== new, prefix caching $pc: prefix-repetition 4 x 384 + 32, 16 out, concurrency 4"
    "$NEW" bench serve --base-url "http://127.0.0.1:$P" --dataset prefix-repetition --prefix-num 4 \
        --prefix-len 384 --suffix-len 32 --random-output-len 16 --num-prompts 48 --max-concurrency 4 \
        --seed 1 --label "prefix caching $pc" --save-result "$OUT/engine-prefix-$pc.json" | grep -iE "ttft|prefix|throughput|hit" || true
    stop
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def runs(f): return json.load(open(os.path.join(out, f)))["runs"]
print("\n| build | concurrency | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms |")
print("| --- | --- | --- | --- | --- | --- | --- |")
base = {}
for which in ("old", "new"):
    for r in runs("engine-%s-random.json" % which):
        s, c = r["summary"], r["config"]
        conc = c.get("max_concurrency")
        tps = s["output_throughput"]
        if which == "old": base[conc] = tps
        ratio = "" if which == "old" else " (%.2fx)" % (tps / base[conc])
        print("| %s | %s | %.1f%s | %.0f | %.0f | %.1f | %.1f |" % (which, conc, tps, ratio, s["median_ttft_ms"], s["p99_ttft_ms"], s["median_tpot_ms"], s["p99_tpot_ms"]))
print()
ttft = {}
for pc in ("on", "off"):
    r = runs("engine-prefix-%s.json" % pc)[0]
    s, m = r["summary"], r.get("server_metrics") or {}
    ttft[pc] = s["median_ttft_ms"]
    q, h = m.get("prefix_cache_queries"), m.get("prefix_cache_hits")
    rate = "%.3f" % (h / q) if q else "n/a"
    print("prefix caching %s: TTFT p50 %.0f ms, mean %.0f ms, output %.1f tok/s, prefix hit rate %s (%s of %s tokens)" % (
        pc, s["median_ttft_ms"], s["mean_ttft_ms"], s["output_throughput"], rate, h, q))
print("TTFT p50 reduction with prefix caching: %.2fx" % (ttft["off"] / ttft["on"]))
PY
