#!/usr/bin/env python3
"""Summarises `ncu --csv --metrics gpu__time_duration.sum` logs of bench_dsv4_cuda: the kernels of the
last forward call (from the last embedding kernel on: one decode step), their count, their summed GPU
time by kernel name, and the sum. Usage: ncu_summary.py [label=]ncu.csv [[label=]variant.csv ...]: with
several logs (run.sh's DSV4_NCU_VARIANTS: the same step under other settings), one table with a column
per log (headed by its label), kernels by the first log's time, and the totals."""
import csv
import sys


def step_of(path):
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:  # a row cut short (ncu stopped by a timeout) is skipped
            v = float((r.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        unit = r.get("Metric Unit", "nsecond")
        us = v / 1000.0 if unit.startswith("n") else v if unit.startswith("u") else v * 1000.0
        name = (r.get("Kernel Name") or "?").split("(")[0].split("<")[0].replace("void ", "")
        rows.append((name, us))
    last = max((i for i, (n, _) in enumerate(rows) if "embed_hc" in n), default=0)
    step = rows[last:]
    agg = {}
    for n, us in step:
        c, t = agg.get(n, (0, 0.0))
        agg[n] = (c + 1, t + us)
    return step, agg


# an argument may be label=path (run.sh passes the setting as the label; split at the last '=')
args = [tuple(a.rsplit("=", 1)) if "=" in a else (a, a) for a in sys.argv[1:]]
logs = [step_of(p) for _, p in args]
if len(logs) == 1:
    step, agg = logs[0]
    tot = sum(us for _, us in step)
    print(f"last decode step: {len(step)} kernels, {tot:.1f} us of GPU time (sum of kernel durations)")
    print("| kernel | launches | us | % |\n| --- | --- | --- | --- |")
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"| {n} | {c} | {t:.1f} | {100 * t / tot:.1f} |")
else:
    names = sorted({n for _, agg in logs for n in agg}, key=lambda n: (-logs[0][1].get(n, (0, 0.0))[1], n))
    print("one decode step, us of GPU time by kernel (launches), a column per log: " +
          ", ".join(f"{l} ({p})" for l, p in args))
    print("| kernel | " + " | ".join(l for l, _ in args) + " |")
    print("| --- |" + " ---: |" * len(logs))
    for n in names:
        cells = []
        for _, agg in logs:
            c, t = agg.get(n, (0, 0.0))
            cells.append(f"{t:.1f} ({c})" if c else "-")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("| **total** | " + " | ".join(f"**{sum(us for _, us in step):.1f}** ({len(step)})" for step, _ in logs) + " |")
