#!/usr/bin/env python3
"""make_gguf.py — a tiny GGUF (v2/v3, little-endian) writer for tests and fuzz seeds.

No dependency beyond the standard library. Build a file with GGUF(), add metadata with kv()
(typed explicitly, or inferred for str/bool/int/float/list) and tensors with tensor() (raw bytes
of the ggml type's blocks), then to_bytes() or write(path). Tensor data is laid out in directory
order, each offset rounded up to the alignment (general.alignment when set, else 32).

    python3 tests/gguf/make_gguf.py --seeds fuzz/seeds/fuzz_gguf    # the fuzzer's seed corpus
    python3 tests/gguf/make_gguf.py --out /tmp/x.gguf                # one small llama-like file
"""
import argparse
import os
import struct

# metadata value types (GGUF spec numbering)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
        FLOAT32: "<f", BOOL: "<B", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# ggml tensor types: id -> (elements per block, bytes per block)
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20),
        "Q5_0": (6, 32, 22), "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q8_1": (9, 32, 36),
        "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110), "Q4_K": (12, 256, 144),
        "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292),
        "I8": (24, 1, 1), "I16": (25, 1, 2), "I32": (26, 1, 4), "I64": (27, 1, 8),
        "F64": (28, 1, 8), "BF16": (30, 1, 2)}


def _str(s):
    b = s.encode() if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _scalar(t, v):
    if t == STRING:
        return _str(v)
    return struct.pack(_FMT[t], int(v) if t not in (FLOAT32, FLOAT64) else v)


def _infer(v):
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return UINT32 if 0 <= v < 2**32 else INT64
    if isinstance(v, float):
        return FLOAT32
    if isinstance(v, (str, bytes)):
        return STRING
    raise TypeError(f"cannot infer a GGUF type for {v!r}")


class GGUF:
    def __init__(self, version=3, alignment=None):
        self.version = version
        self.kvs = []      # (key, type, elem_type, value)
        self.tensors = []  # (name, ggml_type_id, ne list, data bytes)
        self.alignment = 32
        if alignment is not None:
            self.alignment = alignment
            self.kv("general.alignment", alignment, UINT32)

    def kv(self, key, value, t=None, elem=None):
        """A scalar (t given or inferred) or, for a list, an array (elem given or inferred)."""
        if isinstance(value, list):
            if elem is None:
                elem = _infer(value[0]) if value else UINT32
            self.kvs.append((key, ARRAY, elem, value))
        else:
            self.kvs.append((key, t if t is not None else _infer(value), None, value))
        return self

    def tensor(self, name, gtype, ne, data=None):
        """ne innermost first (ne[0] = row length); data defaults to a byte pattern."""
        tid, blk, bb = GGML[gtype] if isinstance(gtype, str) else (gtype, 1, 1)
        n = 1
        for d in ne[1:]:
            n *= d
        size = ne[0] // blk * bb * n
        if data is None:
            data = bytes((i * 7 + len(self.tensors)) & 0xFF for i in range(size))
        self.tensors.append((name, tid, list(ne), bytes(data)))
        return self

    def to_bytes(self):
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.kvs)))
        for key, t, elem, v in self.kvs:
            out += _str(key) + struct.pack("<I", t)
            if t == ARRAY:
                out += struct.pack("<IQ", elem, len(v))
                for x in v:
                    out += _scalar(elem, x)
            else:
                out += _scalar(t, v)
        a = self.alignment
        offsets, off = [], 0
        for _, _, _, data in self.tensors:
            off = (off + a - 1) // a * a
            offsets.append(off)
            off += len(data)
        for (name, tid, ne, _), o in zip(self.tensors, offsets):
            out += _str(name) + struct.pack("<I", len(ne))
            out += b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", tid, o)
        if self.tensors:
            out += bytes(-len(out) % a)
            base = len(out)
            for (_, _, _, data), o in zip(self.tensors, offsets):
                out += bytes(base + o - len(out)) + data
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())


def tiny_llama(version=3, vocab=8):
    """A llama-shaped toy: the keys and tensor names a Llama GGUF carries, at toy sizes."""
    g = GGUF(version)
    g.kv("general.architecture", "llama").kv("general.name", "tiny")
    g.kv("llama.block_count", 1).kv("llama.context_length", 64).kv("llama.embedding_length", 32)
    g.kv("llama.feed_forward_length", 64).kv("llama.attention.head_count", 4)
    g.kv("llama.attention.head_count_kv", 2).kv("llama.rope.freq_base", 10000.0)
    g.kv("llama.attention.layer_norm_rms_epsilon", 1e-5)
    g.kv("tokenizer.ggml.model", "gpt2")
    toks = ["<s>", "</s>", "a", "b", "Ġa", "ab", "Ġ", "c"][:vocab]
    g.kv("tokenizer.ggml.tokens", toks)
    g.kv("tokenizer.ggml.scores", [float(-i) for i in range(len(toks))], elem=FLOAT32)
    g.kv("tokenizer.ggml.token_type", [3, 3] + [1] * (len(toks) - 2), elem=INT32)
    g.kv("tokenizer.ggml.merges", ["a b", "Ġ a"])
    g.kv("tokenizer.ggml.bos_token_id", 0).kv("tokenizer.ggml.eos_token_id", 1)
    g.kv("tokenizer.ggml.add_bos_token", False)
    g.tensor("token_embd.weight", "Q8_0", [32, len(toks)])
    g.tensor("blk.0.attn_norm.weight", "F32", [32])
    g.tensor("blk.0.attn_q.weight", "Q4_0", [32, 32])
    g.tensor("blk.0.ffn_down.weight", "Q4_K", [256, 2])
    g.tensor("output_norm.weight", "F32", [32])
    return g


def seeds(d):
    os.makedirs(d, exist_ok=True)
    files = {
        "empty_v3": GGUF(3),
        "empty_v2": GGUF(2),
        "tiny_llama_v3": tiny_llama(3),
        "tiny_llama_v2": tiny_llama(2),
    }
    g = GGUF(3)
    for i, t in enumerate([UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64]):
        g.kv(f"int.{i}", 5 + i, t)
    g.kv("f32", 1.5, FLOAT32).kv("f64", -2.25, FLOAT64).kv("bool", True).kv("str", "héllo")
    g.kv("arr.u8", [1, 2, 3], elem=UINT8).kv("arr.i16", [-1, 2], elem=INT16)
    g.kv("arr.f64", [0.5, 1.0], elem=FLOAT64).kv("arr.bool", [True, False], elem=BOOL)
    g.kv("arr.str", ["x", "", "yz"]).kv("arr.empty", [], elem=STRING)
    files["all_types"] = g
    g = GGUF(3, alignment=64)
    for gt in ["F32", "F16", "BF16", "Q4_1", "Q5_0", "Q5_1", "Q8_1", "I32"]:
        g.tensor(f"t.{gt}", gt, [32, 2])
    files["align64"] = g
    g = GGUF(3, alignment=1)
    g.tensor("a", "I8", [3]).tensor("b", "I8", [5, 1, 1, 2])
    files["align1"] = g
    g = GGUF(3)
    for gt in ["Q2_K", "Q3_K", "Q5_K", "Q6_K", "Q8_K"]:
        g.tensor(f"k.{gt}", gt, [256])
    g.tensor("empty", "F32", [0, 4])
    files["kquants"] = g
    for name, g in files.items():
        g.write(os.path.join(d, name))
    return sorted(files)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", help="write the fuzz seed corpus into this directory")
    ap.add_argument("--out", help="write one tiny llama-like GGUF to this path")
    ap.add_argument("--version", type=int, default=3)
    a = ap.parse_args()
    if a.seeds:
        print("wrote", ", ".join(seeds(a.seeds)))
    if a.out:
        tiny_llama(a.version).write(a.out)
    if not a.seeds and not a.out:
        ap.print_help()


if __name__ == "__main__":
    main()
