#!/usr/bin/env bash
# Smoke test for tools/gen_dsv4.py: generate small random DeepSeek-V4 checkpoints into a temp dir
# and check them against the golden examples in tests/data/dsv4 (same header: tensor names,
# order, dtypes, shapes, offsets; same config.json) and for sane values (no FP8 NaN codes, no
# E8M0 NaN scales, dequantized weight std ~ 1/sqrt(fan_in), distinct tid2eid experts), plus:
# the bf16 variant, multi-shard output, fast expert init, and thread-count independence.
# Usage: bash tests/tools/test_gen_dsv4.sh    (needs python3 with numpy; safetensors optional)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
GEN="$ROOT/tools/gen_dsv4.py"
GOLD="$ROOT/tests/data/dsv4"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/gen_dsv4_test.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

run() { echo "+ gen_dsv4 $*"; python3 "$GEN" "$@" >"$TMP/log" 2>&1 || { cat "$TMP/log"; exit 1; }; tail -n1 "$TMP/log"; }

run --out "$TMP/fp8" --preset tiny --seed 7
run --out "$TMP/fp8_t1" --preset tiny --seed 7 --threads 1
run --out "$TMP/fp8_sh" --preset tiny --seed 7 --shard-size-mb 2
run --out "$TMP/fp8_fast" --preset tiny --seed 7 --expert-init fast
run --out "$TMP/bf16" --preset tiny --dtype bf16 --head-dim 128 --q-lora 64 --o-lora 64 \
    --moe-inter 128 --topk 2 --index-heads 8 --index-topk 4 --window 8 --swiglu-limit 10.0 \
    --compress-ratios 0,0,4,16,0
run --out "$TMP/bf16_fast" --preset tiny --dtype bf16 --expert-init fast --layers 2

python3 - "$TMP" "$GOLD" <<'EOF'
import json, os, struct, sys
import numpy as np
tmp, gold = sys.argv[1], sys.argv[2]
fails = []
def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)

def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(n)
    check(n % 8 == 0, f"{path}: header length {n} not a multiple of 8")
    return raw, json.loads(raw), 8 + n

def load_dir(d):
    """{name: (info, ndarray of raw bytes/values)} over all shards, plus the index."""
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out, total = {}, 0
    for shard in dict.fromkeys(idx["weight_map"].values()):
        p = os.path.join(d, shard)
        raw, h, base = read_header(p)
        data = np.fromfile(p, np.uint8)
        end = 0
        for k, v in h.items():
            if k == "__metadata__":
                check(v == {"format": "pt"}, f"{p}: metadata {v}")
                continue
            a, b = v["data_offsets"]
            check(a == end, f"{k}: offsets not contiguous")
            end = b
            check(idx["weight_map"].get(k) == shard, f"{k}: index says {idx['weight_map'].get(k)}")
            out[k] = (v, data[base + a: base + b])
        check(base + end == data.size, f"{p}: size {data.size} != header end {base + end}")
        total += end
    check(idx["metadata"]["total_size"] == total, f"{d}: total_size {idx['metadata']['total_size']} != {total}")
    check(len(out) == len(idx["weight_map"]), f"{d}: index/header tensor count differ")
    return idx, out

def golden_header(name):
    return read_header(os.path.join(gold, name, "model.safetensors"))

def compare_structure(d, gname, exact_header=False):
    graw, gh, _ = golden_header(gname)
    idx, ts = load_dir(d)
    gl = [(k, v["dtype"], v["shape"]) for k, v in gh.items() if k != "__metadata__"]
    ml = [(k, v["dtype"], v["shape"]) for k, (v, _) in ts.items()]
    check(gl == ml, f"{d}: tensor list differs from golden {gname} "
          f"(first diff: {next((x for x in zip(gl, ml) if x[0] != x[1]), None)}, {len(gl)} vs {len(ml)})")
    if exact_header:
        raw, _, _ = read_header(os.path.join(d, "model.safetensors"))
        check(raw == graw, f"{d}: header bytes differ from golden {gname}")
    gc = json.load(open(os.path.join(gold, gname, "config.json")))
    mc = json.load(open(os.path.join(d, "config.json")))
    check(gc == mc and list(gc) == list(mc), f"{d}: config.json differs from golden {gname}: "
          f"{ {k: (gc.get(k), mc.get(k)) for k in set(gc) | set(mc) if gc.get(k) != mc.get(k)} }")
    g = json.load(open(os.path.join(d, "generation_config.json")))
    check(g.get("bos_token_id") == 0 and g.get("eos_token_id") == 1, "generation_config bos/eos")
    return ts

E4M3 = np.zeros(256, np.float32)
for c in range(256):
    e, m = (c >> 3) & 15, c & 7
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    E4M3[c] = -v if c & 128 else v
FP4 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6], np.float32)

def values(d, ts):
    def val(k):
        v, b = ts[k]
        dt, sh = v["dtype"], v["shape"]
        if dt == "F32": return b.view(np.float32).reshape(sh)
        if dt == "I64": return b.view(np.int64).reshape(sh)
        if dt == "BF16": return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(sh)
        return b.reshape(sh)
    cfg = json.load(open(os.path.join(d, "config.json")))
    for k, (v, b) in ts.items():
        dt, sh = v["dtype"], v["shape"]
        if dt == "F8_E4M3":
            check(not np.any((b & 0x7F) == 0x7F), f"{k}: FP8 NaN code")
            s = val(k[:-len("weight")] + "scale")
            check(not np.any(s == 255), f"{k}: E8M0 NaN scale")
            w = E4M3[val(k)] * np.repeat(np.repeat(np.exp2(s.astype(np.float32) - 127), 128, 0), 128, 1)[:sh[0], :sh[1]]
            std, want = w.std(), 1 / np.sqrt(sh[1])
            check(abs(std / want - 1) < 0.1, f"{k}: dequantized std {std:.4g}, want {want:.4g}")
        elif dt == "I8":
            s = val(k[:-len("weight")] + "scale")
            check(not np.any(s == 255), f"{k}: E8M0 NaN scale")
            q = val(k)
            codes = np.stack([q & 15, q >> 4], -1).reshape(sh[0], sh[1] * 2)
            w = FP4[codes] * np.repeat(np.exp2(s.astype(np.float32) - 127), 32, 1)
            std, want = w.std(), 1 / np.sqrt(sh[1] * 2)
            check(abs(std / want - 1) < 0.15, f"{k}: dequantized FP4 std {std:.4g}, want {want:.4g}")
        elif dt in ("F32", "BF16"):
            x = val(k)
            check(np.all(np.isfinite(x)), f"{k}: non-finite values")
            if k.endswith("norm.weight"):
                check(abs(x.mean() - 1) < 0.1 and x.std() < 0.3, f"{k}: norm weight mean {x.mean()}")
            elif k.endswith("_scale"):
                check(x.min() >= 0.5 and x.max() <= 1.5, f"{k}: hc scale out of [0.5, 1.5]")
            elif k == "embed.weight":
                check(abs(x.std() - 1) < 0.1, f"{k}: std {x.std()}")
            elif dt == "BF16" and len(sh) == 2 and k != "head.weight":
                check(abs(x.std() * np.sqrt(sh[1]) - 1) < 0.15, f"{k}: std {x.std()} vs 1/sqrt({sh[1]})")
        elif dt == "I64":
            x = val(k)
            check(x.min() >= 0 and x.max() < cfg["n_routed_experts"], f"{k}: expert id out of range")
            s = np.sort(x, 1)
            check(not np.any(s[:, 1:] == s[:, :-1]), f"{k}: repeated expert in a row")
            check(x.shape == (cfg["vocab_size"], cfg["num_experts_per_tok"]), f"{k}: shape {x.shape}")

ts = compare_structure(f"{tmp}/fp8", "v4-tiny-fp8", exact_header=True)
values(f"{tmp}/fp8", ts)
ts1 = load_dir(f"{tmp}/fp8_t1")[1]
check(all(np.array_equal(ts[k][1], ts1[k][1]) for k in ts), "output depends on --threads")
tss = compare_structure(f"{tmp}/fp8_sh", "v4-tiny-fp8")
nsh = len(set(json.load(open(f"{tmp}/fp8_sh/model.safetensors.index.json"))["weight_map"].values()))
check(nsh > 1, "--shard-size-mb 2 gave a single shard")
check(all(np.array_equal(ts[k][1], tss[k][1]) for k in ts), "output depends on --shard-size-mb")
tsf = compare_structure(f"{tmp}/fp8_fast", "v4-tiny-fp8")
values(f"{tmp}/fp8_fast", tsf)
tsb = compare_structure(f"{tmp}/bf16", "v4-tiny-bf16", exact_header=True)
values(f"{tmp}/bf16", tsb)
_, tsbf = load_dir(f"{tmp}/bf16_fast")
values(f"{tmp}/bf16_fast", tsbf)
try:
    from safetensors import safe_open
    for d in ("fp8", "bf16"):
        with safe_open(f"{tmp}/{d}/model.safetensors", "numpy") as f:
            check(len(list(f.keys())) == len(json.load(open(f"{tmp}/{d}/model.safetensors.index.json"))["weight_map"]),
                  f"{d}: safetensors key count")
            check(f.get_tensor("hc_head_fn").shape == (4, 1024), "safetensors read of hc_head_fn")
except ImportError:
    print("(safetensors not installed: skipped the official-parser check)")
print(f"{len(ts)} fp8 / {len(tsb)} bf16 tensors checked ({nsh} shards in the sharded run)")
sys.exit(1 if fails else 0)
EOF
echo "test_gen_dsv4: OK"
