#!/usr/bin/env python3
"""Summarises an `ncu --csv --metrics gpu__time_duration.sum` log of bench_dsv4_cuda: the kernels
of the last forward call (from the last embedding kernel on: one decode step), their count, their
summed GPU time by kernel name, and the sum. Usage: ncu_summary.py ncu.csv"""
import csv
import sys

rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "nsecond")
    us = v / 1000.0 if unit.startswith("n") else v if unit.startswith("u") else v * 1000.0
    name = r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
    rows.append((name, us))
last = max((i for i, (n, _) in enumerate(rows) if "embed_hc" in n), default=0)
step = rows[last:]
agg = {}
for n, us in step:
    c, t = agg.get(n, (0, 0.0))
    agg[n] = (c + 1, t + us)
tot = sum(us for _, us in step)
print(f"last decode step: {len(step)} kernels, {tot:.1f} us of GPU time (sum of kernel durations)")
print("| kernel | launches | us | % |\n| --- | --- | --- | --- |")
for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"| {n} | {c} | {t:.1f} | {100 * t / tot:.1f} |")
