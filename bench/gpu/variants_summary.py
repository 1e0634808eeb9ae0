#!/usr/bin/env python3
"""variants_summary.py — the greedy step of each tuning variant of a bench/gpu/run.sh call.

Reads the call's variants.txt (DSV4_VARIANTS' runs, in the order run) and prints, per variant, every
"token picked on the GPU" step median it logged, their median, and whether every run's greedy tokens
were the same (the switches must keep the bits). Usage: variants_summary.py OUT/variants.txt
"""
import collections
import re
import statistics
import sys


def main(path):
    steps = collections.OrderedDict()
    tokens = set()
    with open(path) as f:
        for line in f:
            m = re.match(r'^(\S+): \| decode step median, token picked on the GPU.*\| ([0-9.]+) \|', line)
            if m:
                steps.setdefault(m.group(1), []).append(float(m.group(2)))
            m = re.match(r'^(\S+): greedy tokens: (.*)', line)
            if m:
                tokens.add(m.group(2).strip())
    print("| variant | greedy step, ms (in the order run) | median |")
    print("| --- | --- | --- |")
    for v, xs in steps.items():
        print(f"| `{v}` | {', '.join('%.3f' % x for x in xs)} | {statistics.median(xs):.3f} |")
    print(f"\ngreedy token lists: {len(tokens)} distinct" + (" (all runs agree)" if len(tokens) == 1 else ""))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: variants_summary.py variants.txt")
    main(sys.argv[1])
