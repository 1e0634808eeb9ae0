#!/usr/bin/env python3
"""Random-checkpoint generator for DeepSeek-V4-Flash-shaped models (minke benchmark/test tool).

This tool writes a checkpoint directory that looks exactly like the released Hugging Face
DeepSeek-V4-Flash checkpoint (config.json, generation_config.json, sharded `*.safetensors` and
`model.safetensors.index.json`): the same tensor names (reference scheme, no `model.` prefix,
`.scale` tensors, `mtp.0.*`, `hc_head_*`), the same dtypes (F8_E4M3 weights with F8_E8M0
128x128 block scales, routed experts as I8-packed FP4 E2M1 with F8_E8M0 per-32 scales, BF16
norms/embed/head/gate/compressor/indexer projections, F32 hc_*/attn_sink/ape/gate.bias, I64
gate.tid2eid on the hash layers) and the same tensor order as the golden example in
tests/data/dsv4/v4-tiny-fp8 (see docs/model-dsv4.md sections 2.1, 3 and 6). The weights are random
but well-scaled, so minke can load and run a model of any size -- from the tiny golden shapes up to
full V4-Flash widths with a chosen number of layers -- for CPU/GPU benchmarks without the real
160 GB download. `--dtype bf16` writes the unquantized variant (no quantization_config, every
linear weight BF16, no `.scale` tensors), like tests/data/dsv4/v4-tiny-bf16.

It needs only numpy: the safetensors files are written directly (8-byte little-endian header
length, compact JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {"format": "pt"}}
padded with spaces to a multiple of 8, then the raw tensor bytes). Headers are computed up front
from the shapes, then every tensor is generated in chunks of about half a million elements by a
thread pool and streamed to the shard file, so memory use stays small for checkpoints of any size.
Each chunk has its own RNG seeded from (seed, crc32(tensor name), chunk index): the output does not
depend on the thread count or shard size, and a tensor's values do not depend on the number of
layers (layers.0 of a 2-layer and a 4-layer checkpoint are identical).

Value distributions (variance notation N(mean, var), matching the golden checkpoints):
  * linear weights [out, in]: N(0, 1/in). FP8: per 128x128 block scale 2^ceil(log2(amax/448))
    (E8M0 byte = exponent + 127), q = e4m3(w / scale), round-to-nearest-even, saturating at 448.
  * routed experts, FP4 (`--expert-init exact`): N(0, 1/in), per 32 values along K a scale
    2^ceil(log2(amax/6)), q = nearest E2M1 value (ties to even code), nibble = code | sign<<3,
    low nibble = even element.
    `--expert-init fast` (default for big checkpoints, see `auto`): Gaussian sampling and
    quantization of billions of expert weights is too slow for a quick benchmark, so the packed
    bytes are drawn i.i.d. from the code distribution that the exact path produces (each nibble
    from 8 random bits: 7 through a 128-entry inverse-CDF table of the magnitude, 1 for the sign;
    one 65536-entry table lookup per byte; the magnitude distribution is measured once by
    quantizing simulated Gaussian blocks whose std is spread over an octave), and each per-32
    scale is 2^a or 2^(a+1), mixed so that the dequantized variance is exactly 1/in.
    For `--dtype bf16` experts the fast path looks values up in a table of 65536 N(0, 1/in)
    samples instead of drawing fresh Gaussians.
  * embed N(0, 1) BF16; head N(0, 1.5^2/dim) BF16; RMSNorm weights 1 + N(0, 0.01) BF16;
    gate.weight, compressor wkv/wgate, indexer weights_proj N(0, 1/in) BF16;
    hc_*_fn N(0, 0.25/(hc*dim)), hc_*_base N(0, 0.25), hc_*_scale U(0.5, 1.5), attn_sink N(0, 0.25),
    ape N(0, 0.04), gate.bias N(0, 0.01), all F32; gate.tid2eid: distinct random experts per
    token (I64).
BF16 is the top half of float32 with round-to-nearest-even.

Usage:
  python3 tools/gen_dsv4.py --out DIR [--preset flash|tiny] [--layers N] [--hidden D] [--vocab V]
      [--experts E] [--topk K] [--moe-inter I] [--heads H] [--head-dim 512] [--q-lora R]
      [--o-lora R] [--o-groups G] [--index-heads IH] [--index-topk T] [--window W]
      [--hash-layers NH] [--compress-ratios 0,0,4,128,...,0] [--dtype fp8|bf16]
      [--shard-size-mb 2000] [--seed S] [--threads N] [--expert-init auto|exact|fast]
  `--preset flash` (default) has V4-Flash's full widths with 4 layers unless --layers is given
  (--layers 43 is the full model, ~160 GB). `--preset tiny` is the config of
  tests/data/dsv4/v4-tiny-fp8. compress_ratios has layers+1 entries, the last one (MTP) 0.
"""

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import struct
import sys
import time
import zlib

import numpy as np

# --------------------------------------------------------------------------------------------
# Presets and config.json
# --------------------------------------------------------------------------------------------

PRESETS = {
    # DeepSeek-V4-Flash (docs/model-dsv4.md 2.1); num_hidden_layers defaults to 4 here.
    "flash": dict(
        layers=4, hidden=4096, vocab=129280, experts=256, topk=6, moe_inter=2048, shared=1,
        heads=64, head_dim=512, rope_dim=64, q_lora=1024, o_lora=1024, o_groups=8,
        index_heads=64, index_head_dim=128, index_topk=512, window=128, hash_layers=3,
        swiglu_limit=10.0, max_pos=1048576, ratio_pattern=(0, 0), ratio_cycle=(4, 128),
    ),
    # tests/data/dsv4/v4-tiny-fp8/config.json
    "tiny": dict(
        layers=4, hidden=256, vocab=512, experts=8, topk=3, moe_inter=256, shared=1,
        heads=4, head_dim=256, rope_dim=64, q_lora=128, o_lora=128, o_groups=2,
        index_heads=16, index_head_dim=128, index_topk=8, window=16, hash_layers=1,
        swiglu_limit=1.0, max_pos=256, ratio_pattern=(0,), ratio_cycle=(4, 8),
    ),
}

HC_MULT = 4


def default_ratios(preset, layers):
    p = PRESETS[preset]
    r = list(p["ratio_pattern"][:layers])
    cyc = p["ratio_cycle"]
    while len(r) < layers:
        r.append(cyc[(len(r) - len(p["ratio_pattern"])) % len(cyc)])
    return r + [0]  # MTP layer


def make_config(c):
    """HF config.json, keys in the order of the golden / released config."""
    cfg = collections.OrderedDict()
    cfg["architectures"] = ["DeepseekV4ForCausalLM"]
    cfg["attention_bias"] = False
    cfg["attention_dropout"] = 0.0
    cfg["bos_token_id"] = 0
    cfg["eos_token_id"] = 1
    if c["dtype"] == "fp8":
        cfg["expert_dtype"] = "fp4"
    cfg["hc_eps"] = 1e-06
    cfg["hc_mult"] = HC_MULT
    cfg["hc_sinkhorn_iters"] = 20
    cfg["head_dim"] = c["head_dim"]
    cfg["hidden_act"] = "silu"
    cfg["hidden_size"] = c["hidden"]
    cfg["index_head_dim"] = c["index_head_dim"]
    cfg["index_n_heads"] = c["index_heads"]
    cfg["index_topk"] = c["index_topk"]
    cfg["initializer_range"] = 0.02
    cfg["max_position_embeddings"] = c["max_pos"]
    cfg["model_type"] = "deepseek_v4"
    cfg["moe_intermediate_size"] = c["moe_inter"]
    cfg["n_routed_experts"] = c["experts"]
    cfg["n_shared_experts"] = c["shared"]
    cfg["norm_topk_prob"] = True
    cfg["num_attention_heads"] = c["heads"]
    cfg["num_experts_per_tok"] = c["topk"]
    cfg["num_hidden_layers"] = c["layers"]
    cfg["num_hash_layers"] = c["hash_layers"]
    cfg["num_key_value_heads"] = 1
    cfg["num_nextn_predict_layers"] = 1
    cfg["o_groups"] = c["o_groups"]
    cfg["o_lora_rank"] = c["o_lora"]
    cfg["q_lora_rank"] = c["q_lora"]
    cfg["qk_rope_head_dim"] = c["rope_dim"]
    if c["dtype"] == "fp8":
        cfg["quantization_config"] = {
            "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    cfg["rms_norm_eps"] = 1e-06
    cfg["rope_scaling"] = {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                           "original_max_position_embeddings": 65536, "type": "yarn"}
    cfg["rope_theta"] = 10000
    cfg["routed_scaling_factor"] = 1.5
    cfg["scoring_func"] = "sqrtsoftplus"
    cfg["sliding_window"] = c["window"]
    cfg["swiglu_limit"] = c["swiglu_limit"]
    cfg["tie_word_embeddings"] = False
    cfg["topk_method"] = "noaux_tc"
    cfg["torch_dtype"] = "bfloat16"
    cfg["transformers_version"] = "4.57.1"
    cfg["use_cache"] = True
    cfg["vocab_size"] = c["vocab"]
    cfg["compress_rope_theta"] = 160000
    cfg["compress_ratios"] = list(c["ratios"])
    return cfg


GENERATION_CONFIG = collections.OrderedDict([
    ("_from_model_config", True), ("bos_token_id", 0), ("eos_token_id", 1), ("do_sample", True),
    ("temperature", 1.0), ("top_p", 1.0), ("transformers_version", "4.57.1")])

# --------------------------------------------------------------------------------------------
# Number formats (vectorized numpy)
# --------------------------------------------------------------------------------------------

DTYPE_SIZE = {"F32": 4, "BF16": 2, "I64": 8, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def f32_to_bf16(x):
    """float32 array -> uint16 bf16 bits, round-to-nearest-even (finite inputs)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    t = b >> np.uint32(16)
    t &= np.uint32(1)
    t += b
    t += np.uint32(0x7FFF)
    t >>= np.uint32(16)
    return t.astype(np.uint16)


def e4m3_encode(x):
    """float32 array -> FP8 E4M3FN bytes, round-to-nearest-even, saturating at +-448."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    sign = (u >> np.uint32(24)).astype(np.uint8)
    sign &= np.uint8(0x80)
    b = u & np.uint32(0x7FFFFFFF)                     # |x| as bits
    np.minimum(b, np.uint32(0x43E00000), out=b)       # clamp to 448.0
    # normal range: round the 23-bit mantissa to 3 bits (RNE), then rebias the exponent 127 -> 7
    # (the low byte of the uint32 result is the code; it wraps for the subnormal inputs fixed below)
    r = b >> np.uint32(20)
    r &= np.uint32(1)
    r += b
    r += np.uint32((0x7FFFF - (120 << 23)) & 0xFFFFFFFF)
    r >>= np.uint32(20)
    q = r.astype(np.uint8)
    # subnormal range (|x| < 2^-6): multiples of 2^-9, np.rint is ties-to-even; 8 is 2^-6 itself
    sub = b < np.uint32(0x3C800000)
    if sub.any():
        q[sub] = np.rint(b[sub].view(np.float32) * np.float32(512.0)).astype(np.uint8)
    q |= sign
    return q


def e4m3_decode_table():
    """256-entry float32 table of the E4M3FN values (NaN for 0x7F/0xFF)."""
    v = np.zeros(256, np.float32)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        if (c & 0x7F) == 0x7F:
            mag = float("nan")
        v[c] = -mag if c & 0x80 else mag
    return v


FP4_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def ceil_log2_pow2(t):
    """exact ceil(log2(t)) for positive float32 t (int32)."""
    m, k = np.frexp(t.astype(np.float32))
    k = k.astype(np.int32)
    k[m == 0.5] -= 1  # t is a power of two
    return k


def fp8_block_quant(w, block=128):
    """w [rows, cols] float32 -> (uint8 codes [rows, cols], e8m0 [ceil(rows/128), ceil(cols/128)])."""
    rows, cols = w.shape
    nrb, ncb = -(-rows // block), -(-cols // block)
    if rows % block or cols % block:
        pad = np.zeros((nrb * block, ncb * block), np.float32)
        pad[:rows, :cols] = w
    else:
        pad = w
    b4 = pad.reshape(nrb, block, ncb, block)
    amax = np.maximum(np.abs(b4).max(axis=(1, 3)), np.float32(1e-30))
    e = np.clip(ceil_log2_pow2(amax / np.float32(448.0)), -127, 127)
    inv = np.ldexp(np.float32(1.0), -e).astype(np.float32)  # exact powers of two
    q = e4m3_encode(b4 * inv[:, None, :, None]).reshape(nrb * block, ncb * block)
    if q.shape != (rows, cols):
        q = np.ascontiguousarray(q[:rows, :cols])
    return q, (e + 127).astype(np.uint8)


def fp4_codes(y):
    """y float32 (already divided by its scale, |y| <= 6) -> E2M1 nibble codes 0..15 (ties to even)."""
    a = np.abs(y)
    c = (a > 0.25).astype(np.uint8)
    c += a >= 0.75
    c += a > 1.25
    c += a >= 1.75
    c += a > 2.5
    c += a >= 3.5
    c += a > 5.0
    c |= (np.signbit(y).astype(np.uint8) << 3)
    return c


def fp4_block_quant(w, block=32):
    """w [rows, cols] float32 -> (packed uint8 [rows, cols/2], e8m0 [rows, cols/32])."""
    rows, cols = w.shape
    wb = w.reshape(rows, cols // block, block)
    amax = np.maximum(np.abs(wb).max(axis=2), np.float32(6 * 2.0 ** -126))
    e = np.clip(ceil_log2_pow2(amax / np.float32(6.0)), -127, 127)
    inv = np.ldexp(np.float32(1.0), -e).astype(np.float32)
    c = fp4_codes((wb * inv[:, :, None]).reshape(rows, cols))
    packed = c[:, 0::2] | (c[:, 1::2] << 4)
    return packed, (e + 127).astype(np.uint8)


# --------------------------------------------------------------------------------------------
# Fast-path tables (computed once, deterministic)
# --------------------------------------------------------------------------------------------

_FAST_CACHE = {}


def fp4_fast_tables():
    """(byte table [65536] uint8, E[code^2]) for the fast FP4 expert path."""
    if "fp4" in _FAST_CACHE:
        return _FAST_CACHE["fp4"]
    rng = np.random.Generator(np.random.PCG64DXSM(0x5EED4))
    nblk = 1 << 15
    z = rng.standard_normal((nblk, 32), dtype=np.float32)
    z *= np.exp2(rng.random((nblk, 1), dtype=np.float32))  # std spread over one octave
    packed, _ = fp4_block_quant(z)
    mags = np.concatenate([packed & 7, (packed >> 4) & 7]).ravel()
    p = np.bincount(mags, minlength=8).astype(np.float64)
    p /= p.sum()
    # 128-bucket inverse CDF of the magnitude (largest remainder rounding); the 8th bit is the sign
    cnt = np.floor(p * 128).astype(np.int64)
    rem = p * 128 - cnt
    for i in np.argsort(-rem, kind="stable")[: 128 - cnt.sum()]:
        cnt[i] += 1
    mag = np.repeat(np.arange(8, dtype=np.uint8), cnt)
    assert mag.size == 128
    nib = np.concatenate([mag, mag | 8])  # 256 entries: low 7 bits magnitude, bit 7 sign
    e2 = float((cnt * FP4_VALUES[:8].astype(np.float64) ** 2).sum() / 128)
    idx = np.arange(65536, dtype=np.uint32)
    table = (nib[idx & 255] | (nib[idx >> 8] << 4)).astype(np.uint8)
    _FAST_CACHE["fp4"] = (table, e2)
    return table, e2


def fp4_fast_scale_params(fan_in):
    """(a, p): scale = 2^(a+1) with probability p else 2^a, so that E[s^2] E[c^2] = 1/fan_in."""
    _, e2 = fp4_fast_tables()
    target = 1.0 / fan_in / e2
    a = int(np.floor(np.log2(target) / 2))
    lo, hi = 4.0 ** a, 4.0 ** (a + 1)
    return a, (target - lo) / (hi - lo)


def bf16_gauss_table(std):
    key = ("bf16", float(std))
    if key not in _FAST_CACHE:
        rng = np.random.Generator(np.random.PCG64DXSM(0x5EED5))
        z = rng.standard_normal(65536)
        z = (z - z.mean()) / z.std()
        _FAST_CACHE[key] = f32_to_bf16((z * std).astype(np.float32))
    return _FAST_CACHE[key]


# --------------------------------------------------------------------------------------------
# Tensor plan
# --------------------------------------------------------------------------------------------

CHUNK_ELEMS = 1 << 19


def rows_per_chunk(cols, align=1):
    r = max(1, CHUNK_ELEMS // max(cols, 1))
    r = max(align, (r // align) * align)
    return r


class Ctx:
    def __init__(self, seed, expert_fast):
        self.seed = seed
        self.expert_fast = expert_fast

    def rng(self, name, chunk):
        ss = np.random.SeedSequence([self.seed, zlib.crc32(name.encode()), chunk])
        return np.random.Generator(np.random.PCG64DXSM(ss))


class T:
    """One tensor: name, dtype, shape and a list of chunk jobs.
    jobs: list of (callable -> ndarray, deferred). Deferred jobs run on the writer thread after
    every earlier job has finished (used for scale tensors filled by their weight's jobs)."""

    def __init__(self, name, dtype, shape, jobs):
        self.name, self.dtype, self.shape, self.jobs = name, dtype, list(shape), jobs
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * DTYPE_SIZE[dtype]


def _rowwise(ctx, name, shape, fn):
    """Split a [rows, ...] tensor into row chunks; fn(rng, nrows) -> ndarray of those rows."""
    rows = shape[0] if shape else 1
    cols = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    rpc = rows_per_chunk(cols) if len(shape) > 1 else max(rows, 1)
    jobs = []
    for ci, r0 in enumerate(range(0, rows, rpc)):
        n = min(rpc, rows - r0)
        jobs.append((lambda ci=ci, n=n: fn(ctx.rng(name, ci), n), False))
    return jobs


def t_normal(ctx, name, shape, std, mean=0.0, dtype="F32"):
    def fn(rng, n):
        x = rng.standard_normal((n,) + tuple(shape[1:]), dtype=np.float32)
        x *= np.float32(std)
        if mean:
            x += np.float32(mean)
        return f32_to_bf16(x) if dtype == "BF16" else x
    return T(name, dtype, shape, _rowwise(ctx, name, shape, fn))


def t_uniform(ctx, name, shape, lo, hi):
    def fn(rng, n):
        x = rng.random((n,) + tuple(shape[1:]), dtype=np.float32)
        return x * np.float32(hi - lo) + np.float32(lo)
    return T(name, "F32", shape, _rowwise(ctx, name, shape, fn))


def t_tid2eid(ctx, name, vocab, experts, k):
    def fn(rng, n):
        if k * 4 > experts:
            a = np.argsort(rng.random((n, experts)), axis=1)[:, :k]
        else:
            a = rng.integers(0, experts, size=(n, k))
            while True:
                s = np.sort(a, axis=1)
                bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
                nb = int(bad.sum())
                if nb == 0:
                    break
                a[bad] = rng.integers(0, experts, size=(nb, k))
        return a.astype(np.int64)
    return T(name, "I64", [vocab, k], _rowwise(ctx, name, [vocab, k], fn))


def linear(ctx, prefix, out, inp, quant):
    """[out, in] linear weight (+ .scale): FP8 block-quantized or plain BF16."""
    std = 1.0 / np.sqrt(inp)
    if quant != "fp8":
        return [t_normal(ctx, prefix + ".weight", [out, inp], std, dtype="BF16")]
    name = prefix + ".weight"
    scale = np.zeros((-(-out // 128), -(-inp // 128)), np.uint8)
    rpc = rows_per_chunk(inp, 128)

    def fn(ci, r0, n):
        x = ctx.rng(name, ci).standard_normal((n, inp), dtype=np.float32)
        x *= np.float32(std)
        q, s = fp8_block_quant(x)
        scale[r0 // 128: r0 // 128 + s.shape[0]] = s
        return q

    jobs = [(lambda ci=ci, r0=r0: fn(ci, r0, min(rpc, out - r0)), False)
            for ci, r0 in enumerate(range(0, out, rpc))]
    return [T(name, "F8_E4M3", [out, inp], jobs),
            T(prefix + ".scale", "F8_E8M0", list(scale.shape), [(lambda: scale, True)])]


def expert(ctx, prefix, out, inp, quant):
    """Routed expert matrix [out, in]: FP4 packed I8 + per-32 E8M0 scale, or BF16."""
    name = prefix + ".weight"
    std = 1.0 / np.sqrt(inp)
    if quant != "fp8":
        if not ctx.expert_fast:
            return [t_normal(ctx, name, [out, inp], std, dtype="BF16")]
        table = bf16_gauss_table(std)

        def fnb(rng, n):
            u = rng.bit_generator.random_raw(-(-n * inp // 4)).view(np.uint16)[: n * inp]
            return np.take(table, u).reshape(n, inp)
        return [T(name, "BF16", [out, inp], _rowwise(ctx, name, [out, inp], fnb))]

    if inp % 32:
        raise SystemExit(f"{name}: in-features {inp} must be a multiple of 32 for FP4")
    if ctx.expert_fast:
        table, _ = fp4_fast_tables()
        a, p = fp4_fast_scale_params(inp)

        def fnw(rng, n):
            u = rng.bit_generator.random_raw(-(-n * inp // 8)).view(np.uint16)[: n * inp // 2]
            return np.take(table, u).reshape(n, inp // 2)

        def fns(rng, n):
            s = (rng.random((n, inp // 32), dtype=np.float32) < p).astype(np.uint8)
            s += np.uint8(a + 127)
            return s
        return [T(name, "I8", [out, inp // 2], _rowwise(ctx, name, [out, inp // 2], fnw)),
                T(prefix + ".scale", "F8_E8M0", [out, inp // 32],
                  _rowwise(ctx, prefix + ".scale", [out, inp // 32], fns))]

    scale = np.zeros((out, inp // 32), np.uint8)
    rpc = rows_per_chunk(inp)

    def fn(ci, r0, n):
        x = ctx.rng(name, ci).standard_normal((n, inp), dtype=np.float32)
        x *= np.float32(std)
        q, s = fp4_block_quant(x)
        scale[r0: r0 + n] = s
        return q

    jobs = [(lambda ci=ci, r0=r0: fn(ci, r0, min(rpc, out - r0)), False)
            for ci, r0 in enumerate(range(0, out, rpc))]
    return [T(name, "I8", [out, inp // 2], jobs),
            T(prefix + ".scale", "F8_E8M0", [out, inp // 32], [(lambda: scale, True)])]


def norm(ctx, name, dim):
    return t_normal(ctx, name, [dim], 0.1, mean=1.0, dtype="BF16")


def hc_tensors(ctx, p, dim, head):
    hc = HC_MULT
    mix = (2 + hc) * hc
    out = []
    for kind in ("attn", "ffn"):
        out.append(t_normal(ctx, f"{p}hc_{kind}_fn", [mix, hc * dim], 0.5 / np.sqrt(hc * dim)))
    for kind in ("attn", "ffn"):
        out.append(t_normal(ctx, f"{p}hc_{kind}_base", [mix], 0.5))
    for kind in ("attn", "ffn"):
        out.append(t_uniform(ctx, f"{p}hc_{kind}_scale", [3], 0.5, 1.5))
    if head:
        out += hc_head(ctx, p, dim)
    return out


def hc_head(ctx, p, dim):
    hc = HC_MULT
    return [t_normal(ctx, f"{p}hc_head_fn", [hc, hc * dim], 0.5 / np.sqrt(hc * dim)),
            t_normal(ctx, f"{p}hc_head_base", [hc], 0.5),
            t_uniform(ctx, f"{p}hc_head_scale", [1], 0.5, 1.5)]


def compressor(ctx, p, dim, ratio, d):
    coff = 2 if ratio == 4 else 1
    return [t_normal(ctx, p + "ape", [ratio, coff * d], 0.2),
            t_normal(ctx, p + "wkv.weight", [coff * d, dim], 1 / np.sqrt(dim), dtype="BF16"),
            t_normal(ctx, p + "wgate.weight", [coff * d, dim], 1 / np.sqrt(dim), dtype="BF16"),
            norm(ctx, p + "norm.weight", d)]


def block(ctx, c, p, layer_id, ratio, mtp):
    q = c["dtype"]
    dim, H, hd = c["hidden"], c["heads"], c["head_dim"]
    out = hc_tensors(ctx, p, dim, head=mtp)
    out.append(t_normal(ctx, p + "attn.attn_sink", [H], 0.5))
    out += linear(ctx, p + "attn.wq_a", c["q_lora"], dim, q)
    out.append(norm(ctx, p + "attn.q_norm.weight", c["q_lora"]))
    out += linear(ctx, p + "attn.wq_b", H * hd, c["q_lora"], q)
    out += linear(ctx, p + "attn.wkv", hd, dim, q)
    out.append(norm(ctx, p + "attn.kv_norm.weight", hd))
    out += linear(ctx, p + "attn.wo_a", c["o_groups"] * c["o_lora"], H * hd // c["o_groups"], q)
    out += linear(ctx, p + "attn.wo_b", dim, c["o_groups"] * c["o_lora"], q)
    if ratio:
        out += compressor(ctx, p + "attn.compressor.", dim, ratio, hd)
    if ratio == 4:
        ih, ihd = c["index_heads"], c["index_head_dim"]
        out += linear(ctx, p + "attn.indexer.wq_b", ih * ihd, c["q_lora"], q)
        out.append(t_normal(ctx, p + "attn.indexer.weights_proj.weight", [ih, dim],
                            1 / np.sqrt(dim), dtype="BF16"))
        out += compressor(ctx, p + "attn.indexer.compressor.", dim, 4, ihd)
    E, inter = c["experts"], c["moe_inter"]
    out.append(t_normal(ctx, p + "ffn.gate.weight", [E, dim], 1 / np.sqrt(dim), dtype="BF16"))
    if layer_id < c["hash_layers"]:
        out.append(t_tid2eid(ctx, p + "ffn.gate.tid2eid", c["vocab"], E, c["topk"]))
    else:
        out.append(t_normal(ctx, p + "ffn.gate.bias", [E], 0.1))
    for e in range(E):
        ep = f"{p}ffn.experts.{e}."
        out += expert(ctx, ep + "w1", inter, dim, q)
        out += expert(ctx, ep + "w2", dim, inter, q)
        out += expert(ctx, ep + "w3", inter, dim, q)
    si = c["shared"] * inter
    if si:
        out += linear(ctx, p + "ffn.shared_experts.w1", si, dim, q)
        out += linear(ctx, p + "ffn.shared_experts.w2", dim, si, q)
        out += linear(ctx, p + "ffn.shared_experts.w3", si, dim, q)
    out.append(norm(ctx, p + "attn_norm.weight", dim))
    out.append(norm(ctx, p + "ffn_norm.weight", dim))
    if mtp:
        out += linear(ctx, p + "e_proj", dim, dim, q)
        out += linear(ctx, p + "h_proj", dim, dim, q)
        out.append(norm(ctx, p + "enorm.weight", dim))
        out.append(norm(ctx, p + "hnorm.weight", dim))
        out.append(norm(ctx, p + "norm.weight", dim))
    return out


def plan(c, ctx):
    """All tensors in the order of the released checkpoint / golden example."""
    dim, V = c["hidden"], c["vocab"]
    ts = hc_head(ctx, "", dim)
    ts.append(t_normal(ctx, "embed.weight", [V, dim], 1.0, dtype="BF16"))
    for L in range(c["layers"]):
        ts += block(ctx, c, f"layers.{L}.", L, c["ratios"][L], mtp=False)
    ts.append(norm(ctx, "norm.weight", dim))
    ts.append(t_normal(ctx, "head.weight", [V, dim], 1.5 / np.sqrt(dim), dtype="BF16"))
    ts += block(ctx, c, "mtp.0.", c["layers"], c["ratios"][c["layers"]], mtp=True)
    return ts


# --------------------------------------------------------------------------------------------
# Sharding and writing
# --------------------------------------------------------------------------------------------

def assign_shards(tensors, limit):
    shards, cur, size = [], [], 0
    for t in tensors:
        if cur and size + t.nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += t.nbytes
    if cur:
        shards.append(cur)
    return shards


def header_bytes(tensors):
    h, off = {}, 0
    for t in tensors:
        h[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    h["__metadata__"] = {"format": "pt"}
    js = json.dumps(h, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


def write_all(out_dir, shards, names, threads):
    """Generate every chunk on a thread pool and stream them, in order, into the shard files."""
    order = [(si, t) for si, sh in enumerate(shards) for t in sh]
    state = {"si": -1, "f": None, "written": 0, "tensor": None, "tbytes": 0}

    def job_iter():
        for si, t in order:
            for ji, (fn, deferred) in enumerate(t.jobs):
                yield fn, deferred, (si, t, ji == len(t.jobs) - 1)

    def close_tensor():
        t = state["tensor"]
        if t is not None and state["tbytes"] != t.nbytes:
            raise RuntimeError(f"{t.name}: wrote {state['tbytes']} bytes, expected {t.nbytes}")

    def consume(tag, arr):
        si, t, last = tag
        if si != state["si"]:
            if state["f"]:
                state["f"].close()
            state["si"] = si
            state["f"] = open(os.path.join(out_dir, names[si]), "wb")
            state["f"].write(header_bytes(shards[si]))
        if state["tensor"] is not t:
            close_tensor()
            state["tensor"], state["tbytes"] = t, 0
        a = np.ascontiguousarray(arr)
        state["f"].write(memoryview(a).cast("B"))
        state["tbytes"] += a.nbytes
        state["written"] += a.nbytes

    window = 3 * threads + 2
    t0 = time.time()
    total = sum(t.nbytes for _, t in order)
    last_report = t0
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
        pending = collections.deque()
        it = job_iter()
        done = False

        def fill():
            nonlocal done
            while not done and len(pending) < window:
                try:
                    fn, deferred, tag = next(it)
                except StopIteration:
                    done = True
                    return
                pending.append((None if deferred else ex.submit(fn), fn, tag))

        fill()
        while pending:
            fut, fn, tag = pending.popleft()
            arr = fn() if fut is None else fut.result()
            consume(tag, arr)
            fill()
            now = time.time()
            if now - last_report > 10 and sys.stderr.isatty() or now - last_report > 30:
                last_report = now
                print(f"  ... {state['written'] / 1e9:.2f} / {total / 1e9:.2f} GB "
                      f"({now - t0:.0f} s)", file=sys.stderr, flush=True)
    close_tensor()
    if state["f"]:
        state["f"].close()
    return state["written"]


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Write a random DeepSeek-V4-Flash-shaped checkpoint (HF safetensors format).")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    ap.add_argument("--layers", type=int, help="num_hidden_layers (flash default 4, tiny 4)")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--moe-inter", type=int)
    ap.add_argument("--shared-experts", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--head-dim", type=int)
    ap.add_argument("--rope-dim", type=int)
    ap.add_argument("--q-lora", type=int)
    ap.add_argument("--o-lora", type=int)
    ap.add_argument("--o-groups", type=int)
    ap.add_argument("--index-heads", type=int)
    ap.add_argument("--index-head-dim", type=int)
    ap.add_argument("--index-topk", type=int)
    ap.add_argument("--window", type=int)
    ap.add_argument("--hash-layers", type=int)
    ap.add_argument("--swiglu-limit", type=float)
    ap.add_argument("--max-pos", type=int, help="max_position_embeddings")
    ap.add_argument("--compress-ratios",
                    help="comma-separated, layers+1 entries (last = MTP layer, must be 0)")
    ap.add_argument("--dtype", choices=["fp8", "bf16"], default="fp8")
    ap.add_argument("--shard-size-mb", type=float, default=2000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 16))
    ap.add_argument("--expert-init", choices=["auto", "exact", "fast"], default="auto",
                    help="routed experts: exact Gaussian+quantize, or fast i.i.d. codes "
                         "(auto: exact when all routed experts hold <= 64M weights)")
    ap.add_argument("--force", action="store_true",
                    help="write even if the directory is not empty or the disk looks too small")
    return ap.parse_args(argv)


def build_config(a):
    c = dict(PRESETS[a.preset])
    for k in ("layers", "hidden", "vocab", "experts", "topk", "moe_inter", "heads", "head_dim",
              "rope_dim", "q_lora", "o_lora", "o_groups", "index_heads", "index_head_dim",
              "index_topk", "window", "hash_layers", "swiglu_limit"):
        v = getattr(a, k)
        if v is not None:
            c[k] = v
    if a.shared_experts is not None:
        c["shared"] = a.shared_experts
    if a.max_pos is not None:
        c["max_pos"] = a.max_pos
    if a.compress_ratios:
        r = [int(x) for x in a.compress_ratios.replace(" ", "").split(",") if x != ""]
        if a.layers is None:
            c["layers"] = len(r) - 1
        if len(r) != c["layers"] + 1:
            raise SystemExit(f"--compress-ratios needs layers+1 = {c['layers'] + 1} entries "
                             f"(last one for the MTP layer), got {len(r)}")
        c["ratios"] = r
    else:
        c["ratios"] = default_ratios(a.preset, c["layers"])
    c["dtype"] = a.dtype
    err = []
    if c["layers"] < 1:
        err.append("--layers must be >= 1")
    if c["ratios"][-1] != 0:
        err.append("the last compress ratio (MTP layer) must be 0")
    if any(r < 0 or (0 < r < 4) for r in c["ratios"]):
        err.append("compress ratios must be 0, 4 (CSA) or > 4 (HCA)")
    if c["topk"] > c["experts"]:
        err.append("--topk must be <= --experts")
    if (c["heads"] * c["head_dim"]) % c["o_groups"]:
        err.append("heads*head_dim must be divisible by --o-groups")
    if c["rope_dim"] > c["head_dim"] or c["rope_dim"] > c["index_head_dim"]:
        err.append("rope dim must not exceed head_dim / index_head_dim")
    if a.dtype == "fp8" and (c["hidden"] % 32 or c["moe_inter"] % 32):
        err.append("FP4 experts need --hidden and --moe-inter divisible by 32")
    if err:
        raise SystemExit("gen_dsv4: " + "; ".join(err))
    return c


def tune_malloc():
    """Keep freed chunk buffers in the heap instead of mmap/munmap-ing them each time: the page
    faults otherwise dominate and serialize the worker threads (glibc only; harmless elsewhere)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1 << 31)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def main(argv=None):
    a = parse_args(argv)
    tune_malloc()
    c = build_config(a)
    n_blocks = c["layers"] + 1
    expert_elems = n_blocks * c["experts"] * 3 * c["moe_inter"] * c["hidden"]
    fast = a.expert_init == "fast" or (a.expert_init == "auto" and expert_elems > (64 << 20))
    ctx = Ctx(a.seed, fast)
    tensors = plan(c, ctx)
    total = sum(t.nbytes for t in tensors)
    names_seen = set()
    for t in tensors:
        assert t.name not in names_seen, t.name
        names_seen.add(t.name)

    limit = max(1, int(a.shard_size_mb * 1e6))
    shards = assign_shards(tensors, limit)
    n = len(shards)
    names = (["model.safetensors"] if n == 1 else
             [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])

    os.makedirs(a.out, exist_ok=True)
    existing = [f for f in os.listdir(a.out) if f.endswith(".safetensors")]
    if existing and not a.force:
        raise SystemExit(f"gen_dsv4: {a.out} already holds .safetensors files (use --force)")
    free = shutil.disk_usage(a.out).free
    if total > free and not a.force:
        raise SystemExit(f"gen_dsv4: need {total / 1e9:.1f} GB, only {free / 1e9:.1f} GB free "
                         "(use --force)")
    for f in existing:
        os.remove(os.path.join(a.out, f))

    print(f"gen_dsv4: preset {a.preset}, dtype {a.dtype}, {c['layers']} layers + MTP, "
          f"hidden {c['hidden']}, {c['experts']} experts x {c['moe_inter']}, vocab {c['vocab']}, "
          f"ratios {c['ratios']}, experts init {'fast' if fast else 'exact'}")
    print(f"gen_dsv4: {len(tensors)} tensors, {total / 1e9:.3f} GB in {n} shard(s) -> {a.out} "
          f"({a.threads} threads)", flush=True)

    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(make_config(c), f, indent=2)
        f.write("\n")
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
        f.write("\n")

    t0 = time.time()
    written = write_all(a.out, shards, names, max(1, a.threads))
    dt = time.time() - t0
    assert written == total, (written, total)

    index = {"metadata": {"total_size": total},
             "weight_map": {t.name: names[si] for si, sh in enumerate(shards) for t in sh}}
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")

    by = collections.Counter()
    cnt = collections.Counter()
    for t in tensors:
        by[t.dtype] += t.nbytes
        cnt[t.dtype] += 1
    print("gen_dsv4: by dtype: " + ", ".join(
        f"{k} {cnt[k]} tensors {by[k] / 1e6:.1f} MB" for k in sorted(by, key=lambda k: -by[k])))
    print(f"gen_dsv4: done: {len(tensors)} tensors, {total} bytes ({total / 1e9:.3f} GB), "
          f"{n} shard(s), {dt:.1f} s ({total / 1e6 / max(dt, 1e-9):.0f} MB/s)")


if __name__ == "__main__":
    main()
