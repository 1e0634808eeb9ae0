#!/usr/bin/env bash
# test_cli.sh — drives `minke` the way a user does: `info`, `logits` with --out/--dump and
# --force-decisions on a golden case, and the CLI's error messages for bad input.
# Usage: tests/cli/test_cli.sh build/minke
set -euo pipefail
MINKE=${1:-build/minke}
D=tests/data/dsv4/v4-tiny-wide
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# read p2's fed tokens from the golden with the Python standard library only
TOKS=$(python3 - "$D/golden.safetensors" <<'PY'
import array, json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
e = h['p2.tokens']; f.seek(8 + n + e['data_offsets'][0]); a = array.array('q')
a.frombytes(f.read(e['data_offsets'][1] - e['data_offsets'][0])); print(','.join(map(str, a)))
PY
)
S=3   # p2's prompt length (README of the case)

"$MINKE" info --model "$D" > "$TMP/info.txt"
grep -q "deepseek_v4" "$TMP/info.txt" || fail "info does not name the architecture"
grep -q "parameters by dtype" "$TMP/info.txt" || fail "info has no parameter counts"

"$MINKE" logits --model "$D" --tokens "$TOKS" --prefill $S --out "$TMP/l.safetensors" --dump "$TMP/dump" \
  --force-decisions "$D/golden.safetensors" --threads 2 > "$TMP/logits.txt"
# teacher forcing: the argmax of call c is the token fed at position S+c, and the written logits
# match the golden's within the case's forced tolerance (0.056 rel L2)
python3 - "$TMP/l.safetensors" "$D/golden.safetensors" "$TOKS" $S <<'PY'
import array, json, math, struct, sys
def load(path, name):
    f = open(path, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); e = h[name]
    f.seek(8 + n + e['data_offsets'][0]); a = array.array('f' if e['dtype'] == 'F32' else 'q')
    a.frombytes(f.read(e['data_offsets'][1] - e['data_offsets'][0])); return a, e['shape']
mine, sh = load(sys.argv[1], 'logits'); ref, rsh = load(sys.argv[2], 'p2.logits')
toks = [int(t) for t in sys.argv[3].split(',')]; S = int(sys.argv[4])
assert sh == rsh, (sh, rsh)
calls, V = sh
for c in range(calls):
    m = mine[c*V:(c+1)*V]; r = ref[c*V:(c+1)*V]
    l2 = math.sqrt(sum((a-b)**2 for a, b in zip(m, r)) / sum(b*b for b in r))
    assert l2 < 0.056, f"call {c}: rel L2 {l2}"
    if c < calls - 1:
        am = max(range(V), key=lambda i: m[i])
        assert am == toks[S + c], f"call {c}: argmax {am}, fed {toks[S + c]}"
print(f"cli: logits of {calls} calls match the golden")
PY
[ "$(ls "$TMP/dump" | wc -l)" -eq 13 ] || fail "expected one dump file per call (13)"
python3 - "$TMP/dump/call000.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
for k in ['L0.attn.q', 'L1.attn.kv', 'L2.moe.out', 'L3.h', 'out.logits', 'L1.idx.q']:
    assert k in h, f"dump lacks {k}: {sorted(h)[:20]}"
PY

# bad input: clear messages, no crash
expect_err() { # expected-exit-code expected-substring command...
  local code=$1 pat=$2; shift 2
  set +e; "$@" > "$TMP/out" 2> "$TMP/err"; local rc=$?; set -e
  [ $rc -eq "$code" ] || fail "$*: exit $rc, expected $code ($(cat "$TMP/err"))"
  grep -q -- "$pat" "$TMP/err" || fail "$*: stderr lacks '$pat': $(cat "$TMP/err")"
}
expect_err 2 "required" "$MINKE" logits --model "$D"
expect_err 2 "unknown option '--bogus'" "$MINKE" logits --model "$D" --tokens 1 --bogus
expect_err 2 "not a comma-separated" "$MINKE" logits --model "$D" --tokens 1,x
expect_err 2 "--prefill expects" "$MINKE" logits --model "$D" --tokens 1,2 --prefill 5
expect_err 1 "outside the vocabulary" "$MINKE" logits --model "$D" --tokens 1,99999
expect_err 1 "config.json" "$MINKE" info --model "$TMP/nonexistent"
expect_err 2 "unknown command" "$MINKE" frobnicate
# render: DeepSeek's official case 2 (thinking mode), byte-exact
E=tests/data/encoding-dsv4
"$MINKE" render --messages "$E/test_input_2.json" --thinking > "$TMP/r2.txt"
cmp -s "$TMP/r2.txt" "$E/test_output_2.txt" || fail "render differs from test_output_2.txt"
"$MINKE" render --messages "$E/test_input_4.json" > "$TMP/r4.txt"
cmp -s "$TMP/r4.txt" "$E/test_output_4.txt" || fail "render differs from test_output_4.txt"
expect_err 1 "reasoning_effort" "$MINKE" render --messages "$E/test_input_4.json" --reasoning-effort bogus

# tokenize: round trip through the CLI with the tiny tokenizer
TOK=tests/data/tok512/tokenizer.json
printf 'hello world, what is 2+2?' | "$MINKE" tokenize --tokenizer "$TOK" > "$TMP/ids.json"
"$MINKE" tokenize --tokenizer "$TOK" --decode < "$TMP/ids.json" > "$TMP/back.txt"
[ "$(cat "$TMP/back.txt")" = "hello world, what is 2+2?" ] || fail "tokenize round trip: $(cat "$TMP/back.txt")"

# generate: a seeded request reproduces exactly (also with another thread count); greedy
# generation's first token is the argmax of the prompt's logits
G=(generate --model tests/data/dsv4/v4-tiny-fp8 --tokenizer "$TOK" --prompt "what is two plus two?" --chat --max-tokens 24)
"$MINKE" "${G[@]}" --seed 42 --temperature 0.9 --top-p 0.95 > "$TMP/g1.txt" 2> "$TMP/g1.err"
"$MINKE" "${G[@]}" --seed 42 --temperature 0.9 --top-p 0.95 --threads 1 > "$TMP/g2.txt" 2>/dev/null
cmp -s "$TMP/g1.txt" "$TMP/g2.txt" || fail "seeded generation is not reproducible"
grep -q "generation: 24 tokens" "$TMP/g1.err" || fail "generate prints no token rate: $(cat "$TMP/g1.err")"
"$MINKE" "${G[@]}" --temperature 0 --max-tokens 1 --logprobs 1 > /dev/null 2> "$TMP/greedy.err"
FIRST=$(grep -o '^\[token [0-9]*' "$TMP/greedy.err" | head -1 | awk '{print $2}')
printf '<｜begin▁of▁sentence｜><｜User｜>what is two plus two?<｜Assistant｜></think>' | "$MINKE" tokenize --tokenizer "$TOK" | tr -d '[] ' > "$TMP/pids"
ARGMAX=$("$MINKE" logits --model tests/data/dsv4/v4-tiny-fp8 --tokens "$(cat "$TMP/pids")" --top 1 | awk '{print $NF}' | cut -d: -f1)
[ "$FIRST" = "$ARGMAX" ] || fail "greedy first token $FIRST != argmax $ARGMAX"
expect_err 2 "--temperature expects" "$MINKE" "${G[@]}" --temperature -1
expect_err 2 "vocabulary" "$MINKE" generate --model tests/data/dsv4/v4-tiny-fp8 --tokenizer "$TOK" --prompt x --logit-bias 9999:1
# --device: cpu is the default (same tokens); another value is refused before anything loads (also
# from MINKE_DEVICE); this CPU build refuses cuda naming the CUDA backend, without crashing
"$MINKE" "${G[@]}" --seed 42 --temperature 0.9 --top-p 0.95 --device cpu > "$TMP/g3.txt" 2>/dev/null
cmp -s "$TMP/g1.txt" "$TMP/g3.txt" || fail "--device cpu changes the output"
"$MINKE" serve --help | grep -q -- "--device cpu|cuda" || fail "serve --help does not document --device"
expect_err 2 "minke serve: --device expects cpu or cuda, got 'tpu'" "$MINKE" serve --device tpu
expect_err 2 "minke generate: --device expects cpu or cuda, got 'gpu'" env MINKE_DEVICE=gpu "$MINKE" "${G[@]}"
expect_err 1 "built without the CUDA backend (build build-cuda/minke with \`make cuda\`)" "$MINKE" "${G[@]}" --device cuda
expect_err 1 "built without the CUDA backend" env MINKE_DEVICE=cuda "$MINKE" logits --model tests/data/dsv4/v4-tiny-fp8 --tokens 1,2
# chat: two turns with history, then Ctrl-C (SIGINT) stops a long answer but not the program
printf 'hello\nwhat next?\n/exit\n' | "$MINKE" chat --model tests/data/dsv4/v4-tiny-fp8 --tokenizer "$TOK" --max-tokens 8 --seed 3 > "$TMP/chat.out" 2>&1
[ "$(grep -c '^> ' "$TMP/chat.out")" -ge 2 ] || fail "chat did not answer two turns: $(cat "$TMP/chat.out")"
mkfifo "$TMP/fifo"
"$MINKE" chat --model tests/data/dsv4/v4-tiny-fp8 --tokenizer "$TOK" --max-tokens 3000 --ignore-eos < "$TMP/fifo" > "$TMP/chat2.out" 2>&1 &
CPID=$!
exec 3> "$TMP/fifo"
echo "tell me a long story" >&3
sleep 1
kill -INT $CPID
sleep 0.5
echo "/exit" >&3
exec 3>&-
wait $CPID || fail "chat exited with an error after Ctrl-C"
grep -q "\[stopped\]" "$TMP/chat2.out" || fail "Ctrl-C did not stop the answer: $(tail -c 300 "$TMP/chat2.out")"
echo "cli tests passed"
