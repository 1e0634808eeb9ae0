#!/usr/bin/env python3
"""Batch-1 greedy decode speed of Hugging Face transformers' DeepseekV4ForCausalLM on a minke
benchmark checkpoint (tools/gen_dsv4.py layout: reference tensor names, FP8 weights with e8m0
128x128 scales, FP4 experts), for the comparison in bench/gpu/run.sh.

transformers runs the model in bf16. Loading, in this order (the first whose model also runs a
3-token smoke test is used):
  1. `from_pretrained(DIR, quantization_config=FineGrainedFP8Config(dequantize=True))`:
     transformers reads the reference layout itself (its own conversion; 0 missing keys on the
     2026-12-03 run) and dequantizes FP8 / FP4 to bf16 at load. Plain `from_pretrained` keeps the
     FP8 modules, whose matmul needs the `kernels` package and a Hub download (not available on
     the GPU machine);
  2. the checkpoint converted in memory: every reference tensor dequantized to bf16 and mapped
     onto transformers' parameter names by (layer, shape, name-token overlap) — see convert();
     parameters it cannot map keep transformers' random init and are counted in the output.
Timing: CUDA-synchronized host clock around generate(); decode time = generate(P + N new) minus
generate(1 new) over N. Prints one JSON line starting with "HF_RESULT".
Usage: hf_decode.py DIR [prompt_len] [decode_steps]
"""
import json
import os
import re
import sys
import time
import traceback

import torch

DIR = sys.argv[1]
P = int(sys.argv[2]) if len(sys.argv) > 2 else 16
N = int(sys.argv[3]) if len(sys.argv) > 3 else 64
dev = "cuda"
res = {"dir": DIR, "prompt": P, "steps": N}


def log(*a):
    print(*a, flush=True)


import transformers  # noqa: E402
from transformers import AutoConfig  # noqa: E402

res["transformers"] = transformers.__version__
log("transformers", transformers.__version__, "torch", torch.__version__)
cls = getattr(transformers, "DeepseekV4ForCausalLM", None)
if cls is None:
    log("HF_RESULT " + json.dumps({**res, "error": "transformers has no DeepseekV4ForCausalLM"}))
    sys.exit(0)


def e8m0(t):
    return torch.exp2(t.view(torch.uint8).to(torch.float32) - 127.0)


E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)


def dequant(name, t, scales):
    """Reference tensor -> bf16 on the GPU."""
    s = scales.get(name[: -len(".weight")] + ".scale") if name.endswith(".weight") else None
    t = t.to(dev)
    if s is not None:
        s = s.to(dev)
        if t.dtype == torch.float8_e4m3fn:
            n, k = t.shape
            w = t.to(torch.float32)
            sc = e8m0(s).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            return (w * sc).to(torch.bfloat16)
        if t.dtype in (torch.int8, torch.uint8):
            b = t.view(torch.uint8)
            lo, hi = (b & 15).long(), (b >> 4).long()
            tab = E2M1.to(dev)
            w = torch.stack([tab[lo], tab[hi]], -1).reshape(b.shape[0], -1)
            sc = e8m0(s).repeat_interleave(32, 1)
            return (w * sc).to(torch.bfloat16)
    if t.dtype in (torch.int64, torch.int32):
        return t
    if t.dtype == torch.float32 and not name.endswith(".weight"):
        return t
    return t.to(torch.bfloat16) if t.is_floating_point() else t


def load_reference(dirn):
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(dirn) if f.endswith(".safetensors"))
    tens = {}
    for f in files:
        with safe_open(os.path.join(dirn, f), framework="pt") as fh:
            for k in fh.keys():
                tens[k] = fh.get_tensor(k)
    return tens


def tokens_of(name):
    return [p for p in re.split(r"[._]", name) if p]


def convert(model, ref):
    """Maps reference tensors onto the model's parameters: same layer index (or mtp), the same
    shape after dequantization, and the best token overlap of the names (a mapping table would
    be exact, but transformers' names were not known when this was written); reports what it
    could not map."""
    scales = {k: v for k, v in ref.items() if k.endswith(".scale")}
    cand = {}
    for k, v in ref.items():
        if k.endswith(".scale"):
            continue
        m = re.match(r"(layers|mtp)\.(\d+)\.", k)
        key = (m.group(1), int(m.group(2))) if m else ("top", 0)
        cand.setdefault(key, []).append(k)
    params = dict(model.named_parameters())
    bufs = dict(model.named_buffers())
    mapped, unmapped, used = 0, [], set()
    alias = {"self_attn": "attn", "mlp": "ffn", "embed_tokens": "embed", "lm_head": "head",
             "gate_proj": "w1", "down_proj": "w2", "up_proj": "w3", "experts": "experts"}
    for pn, p in list(params.items()) + list(bufs.items()):
        m = re.search(r"(layers|mtp)\.(\d+)\.", pn)
        key = (m.group(1), int(m.group(2))) if m else ("top", 0)
        if "mtp" in pn and m and m.group(1) == "layers":
            key = ("mtp", 0)
        toks = set(alias.get(t, t) for t in tokens_of(pn))
        best, bs = None, -1
        for k in cand.get(key, []):
            if k in used:
                continue
            shp = tuple(ref[k].shape)
            if ref[k].dtype in (torch.int8, torch.uint8) and k[: -len(".weight")] + ".scale" in scales:
                shp = (shp[0], shp[1] * 2)
            if shp != tuple(p.shape):
                continue
            sc = len(toks & set(tokens_of(k)))
            if sc > bs:
                best, bs = k, sc
        if best is None or bs < 1:
            unmapped.append(pn)
            continue
        with torch.no_grad():
            p.copy_(dequant(best, ref[best], scales).to(p.dtype))
        used.add(best)
        mapped += 1
    return mapped, unmapped, len([k for k in ref if not k.endswith(".scale")]) - len(used)


def dtype_gb(model):
    by = {}
    for p in model.parameters():
        by[str(p.dtype)] = by.get(str(p.dtype), 0) + p.numel() * p.element_size()
    return {k: round(v / 1e9, 2) for k, v in by.items()}


def load_dequantized():
    """from_pretrained with transformers' FP8 integration told to dequantize to bf16 at load (its
    FP8 matmul needs the `kernels` package and a Hub download, neither available there)."""
    from transformers import FineGrainedFP8Config

    model, info = cls.from_pretrained(DIR, dtype=torch.bfloat16, device_map=dev, output_loading_info=True,
                                      quantization_config=FineGrainedFP8Config(dequantize=True))
    miss = info.get("missing_keys", [])
    res["missing_keys"] = len(miss)
    log("from_pretrained(dequantize=True): missing", len(miss), list(miss)[:8], "unexpected",
        len(info.get("unexpected_keys", [])))
    return model


def load_converted():
    cfg = AutoConfig.from_pretrained(DIR)
    if hasattr(cfg, "quantization_config"):
        try:
            delattr(cfg, "quantization_config")
        except Exception:
            cfg.quantization_config = None
    with torch.device(dev):
        torch.set_default_dtype(torch.bfloat16)
        model = cls(cfg)
        torch.set_default_dtype(torch.float32)
    model = model.to(torch.bfloat16).eval()
    ref = load_reference(DIR)
    mapped, unmapped, left = convert(model, ref)
    del ref
    res["params_mapped"] = mapped
    res["params_unmapped"] = len(unmapped)
    res["reference_tensors_unused"] = left
    log("convert: mapped", mapped, "unmapped", len(unmapped), unmapped[:12], "reference tensors unused", left)
    return model


LOADERS = [("from_pretrained, FP8/FP4 dequantized to bf16 by transformers", load_dequantized),
           ("converted in memory by hf_decode.py", load_converted)]

cfg0 = None
model = None
for label, loader in LOADERS:
    t0 = time.time()
    try:
        model = loader().eval()
        res["load_s"] = round(time.time() - t0, 1)
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]], device=dev))  # smoke test
        res["load"] = label
        break
    except Exception as e:
        traceback.print_exc()
        log("loader failed:", label, repr(e)[:300])
        res.setdefault("loader_errors", []).append(label + ": " + repr(e)[:200])
        model = None
        torch.cuda.empty_cache()
if model is None:
    log("HF_RESULT " + json.dumps(res))
    sys.exit(0)
res["params_gb_by_dtype"] = dtype_gb(model)
log("model on the GPU:", res["params_gb_by_dtype"], "; cuda mem", round(torch.cuda.memory_allocated() / 1e9, 2), "GB")
cfg = model.config
vocab = cfg.vocab_size
r = 0x9E3779B97F4A7C15
ids = []
for i in range(P):
    r = (r * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
    ids.append((r >> 33) % vocab)
inp = torch.tensor([ids], device=dev)


def gen(n):
    torch.cuda.synchronize()
    a = time.time()
    with torch.no_grad():
        out = model.generate(inp, attention_mask=torch.ones_like(inp), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    torch.cuda.synchronize()
    return time.time() - a, out


try:
    gen(2)  # warm-up
    t1, _ = gen(1)
    tN, out = gen(N + 1)
    t1b, _ = gen(1)
    pre = min(t1, t1b)
    per = (tN - pre) / N
    res["prefill_plus_first_s"] = round(pre, 4)
    res["decode_ms_per_token"] = round(per * 1e3, 3)
    res["decode_tok_s"] = round(1.0 / per, 2)
    res["greedy_tokens"] = out[0, P:P + 16].tolist()
except Exception as e:
    traceback.print_exc()
    res["error"] = repr(e)[:300]
log("HF_RESULT " + json.dumps(res))
