#!/usr/bin/env python3
"""sass_blocks.py — instruction counts per basic block of one kernel's SASS, without a GPU: how many
instructions a kernel's hot path spends per MMA (the e4m3 emulation, widening, address arithmetic).

Get the SASS here (no GPU, no cuobjdump in the toolkit image): compile to a cubin, disassemble with
nvdisasm from PyPI (nvidia-cuda-nvdisasm), e.g.
    pip install --target /tmp/nvd nvidia-cuda-nvdisasm
    nvcc -O3 -std=c++17 -cubin -gencode arch=compute_90a,code=sm_90a -Iinclude -Isrc src/ops/cuda/gemv.cu -o /tmp/g.cubin
    /tmp/nvd/nvidia/cu13/bin/nvdisasm -c /tmp/g.cubin > /tmp/g.sass
    python3 bench/gpu/sass_blocks.py /tmp/g.sass k_moe_fp4_wg [first last]
Prints each basic block (label, its first instruction's index, its size, the tensor-core
instructions in it: HMMA / QGMMA / HGMMA, the most frequent opcodes, its last instruction) of the
first function whose mangled name contains the given text, optionally only blocks within
instruction indices [first, last]. Blocks that contain e8m0's NaN constant are marked SLOW (the
scale's rare path). Follow the branches by hand to sum one path's blocks."""
import collections
import re
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, want = sys.argv[1], sys.argv[2]
    lo = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    hi = int(sys.argv[4]) if len(sys.argv) > 4 else 1 << 30
    lines, cur = [], None
    for line in open(path):
        m = re.match(r"\.text\.(\w+):", line)
        if m:
            if cur is not None and lines:
                break
            cur = m.group(1) if want in m.group(1) else None
            continue
        if cur is not None:
            lines.append(line)
    if not lines:
        sys.exit(f"sass_blocks: no function matching {want!r} in {path}")
    blocks, label, body = [], "entry", []
    for line in lines:
        lm = re.match(r"^(\.L_x_\d+):", line.strip())
        if lm:
            blocks.append((label, body))
            label, body = lm.group(1), []
            continue
        im = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if im:
            body.append(im.group(1).strip())
    blocks.append((label, body))
    n = 0
    for label, body in blocks:
        start, n = n, n + len(body)
        if n < lo or start > hi or not body:
            continue
        ops = collections.Counter(re.sub(r"^@!?U?P[T0-9]+\s+", "", s).split()[0].split(".")[0] for s in body)
        tensor = sum(ops.get(k, 0) for k in ("HMMA", "QGMMA", "HGMMA"))
        slow = "SLOW" if any("0x7fc00000" in s for s in body) else "    "
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(6))
        print(f"{label:>10} [{start:5d}] {len(body):4d} {slow} mma {tensor:2d} | {top} | {body[-1][:60]}")


if __name__ == "__main__":
    main()
