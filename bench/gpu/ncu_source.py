#!/usr/bin/env python3
"""Summarises an `ncu --page source --print-source sass --csv` log (bench/gpu/run.sh's DSV4_NCU_SOURCE):
per profiled kernel, its SASS instructions by warp stall samples (the hottest first, with their
share), and the stall samples by opcode. The CSV's column names vary between ncu versions, so the
columns are found by name fragments. Usage: ncu_source.py ncu_source.csv [top]"""
import csv
import sys
from collections import defaultdict


def num(s):
    try:
        return float(s.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def col(header, *frags, avoid=()):
    for i, h in enumerate(header):
        low = h.lower()
        if all(f in low for f in frags) and not any(a in low for a in avoid):
            return i
    return None


def main():
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with open(sys.argv[1], newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # a kernel's table starts at a header row naming the source column; lines before it name the kernel
    blocks, cur, title = [], None, ""
    for row in csv.reader(lines):
        if not row:
            continue
        if any(c.strip().lower() in ("source", "# address", "address") for c in row) and \
                any("stall" in c.lower() or "instructions executed" in c.lower() for c in row):
            cur = {"title": title, "header": row, "rows": []}
            blocks.append(cur)
        elif cur is not None and len(row) == len(cur["header"]):
            cur["rows"].append(row)
        else:
            title = " ".join(row)[:160]
            cur = None
    if not blocks:
        print("no source table found (ncu's --page source output not recognised)")
        return
    for b in blocks:
        h = b["header"]
        src = col(h, "source")
        stall = col(h, "warp stall sampling (all", avoid=("not",))
        if stall is None:
            stall = col(h, "stall")
        execd = col(h, "instructions executed", avoid=("predicated",))
        rows = b["rows"]
        tot = sum(num(r[stall]) for r in rows) if stall is not None else 0.0
        ins = sum(num(r[execd]) for r in rows) if execd is not None else 0.0
        print(f"## {b['title'] or 'kernel'}\n")
        print(f"{len(rows)} SASS lines, {tot:.0f} stall samples, {ins:.0f} warp instructions executed\n")
        if stall is None or not tot:
            continue
        byop = defaultdict(float)
        for r in rows:
            text = r[src].strip() if src is not None else ""
            op = text.split()[0] if text else "?"
            if op.startswith("@"):
                op = text.split()[1] if len(text.split()) > 1 else op
            byop[op.split(".")[0]] += num(r[stall])
        print("| opcode | stall samples | % |\n| --- | --- | --- |")
        for op, v in sorted(byop.items(), key=lambda kv: -kv[1])[:15]:
            print(f"| {op} | {v:.0f} | {100 * v / tot:.1f} |")
        print(f"\n| line | SASS | stall samples | % | executed |\n| --- | --- | --- | --- | --- |")
        order = sorted(range(len(rows)), key=lambda i: -num(rows[i][stall]))[:top]
        for i in sorted(order):
            r = rows[i]
            text = (r[src].strip() if src is not None else "").replace("|", "/")
            e = num(r[execd]) if execd is not None else 0
            print(f"| {i} | `{text[:90]}` | {num(r[stall]):.0f} | {100 * num(r[stall]) / tot:.1f} | {e:.0f} |")
        print()


if __name__ == "__main__":
    main()
