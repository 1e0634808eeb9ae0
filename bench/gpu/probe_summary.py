#!/usr/bin/env python3
"""Summarize the prints of MINKE_CUDA_HC_PROBE=1 (k_hc_pre_fin's phase clocks) kept by run.sh's
DSV4_RAW_VARIANTS: the median of each phase, in SM clocks, over the one-token launches, by block
(y0: pre / post and the collapse, y1: the Sinkhorn's comb) and by the launch's place in a step
(the k-th one-token launch of y0, modulo the launches a step, given as the second argument: 8)."""
import re
import statistics
import sys

PH = ["wait", "stage", "sums", "sink", "bar", "coll", "rms", "norm", "quant"]


def main():
    path = sys.argv[1]
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    rows = {}
    k = {0: 0, 1: 0}
    for line in open(path, errors="replace"):
        m = re.search(r"hcfin y(\d) sm\d+ ns(\d+) g0 (\d+) g1 (\d+) (.*)", line)
        if not m or m.group(2) != "1":
            continue
        y = int(m.group(1))
        vals = dict(re.findall(r"(\w+) (-?\d+)", m.group(5)))
        key = (y, k[y] % per)
        k[y] += 1
        r = rows.setdefault(key, {p: [] for p in PH + ["span_ns"]})
        for p in PH:
            r[p].append(int(vals.get(p, 0)))
        r["span_ns"].append(int(m.group(4)) - int(m.group(3)))
    if not rows:
        print("no hcfin lines with ns1 in", path)
        return
    print("| block | launch | n | " + " | ".join(PH) + " | sum (clk) | entry to end (ns) |")
    print("| --- | --- | --- | " + " | ".join("---:" for _ in PH) + " | ---: | ---: |")
    for key in sorted(rows):
        r = rows[key]
        med = [statistics.median(r[p]) for p in PH]
        print("| y%d | %d | %d | " % (key[0], key[1], len(r["wait"])) + " | ".join("%.0f" % v for v in med) +
              " | %.0f | %.0f |" % (sum(med), statistics.median(r["span_ns"])))


if __name__ == "__main__":
    main()
