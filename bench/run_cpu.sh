#!/usr/bin/env bash
# run_cpu.sh — the CPU benchmarks behind `make bench` (called as `bash bench/run_cpu.sh BUILD`).
#
# 1. bench_gemm: this machine's memory bandwidth (memcpy and read-only) and mk_linear GEMV
#    throughput per weight kind at 1 and 2 threads, as a fraction of that bandwidth. Decode is
#    bandwidth-bound, so these ratios are the ceiling the whole-model decode can reach.
# 2. (below) the full-model decode benchmark.
#
# BENCH_QUICK=1 runs a shrunken smoke version.
set -euo pipefail
BUILD="${1:-build}"
QUICK=()
[[ "${BENCH_QUICK:-0}" == 1 ]] && QUICK=(--quick)

echo "== bench_gemm"
"$BUILD/bench/bench_gemm" "${QUICK[@]}"

# ---- full-model decode benchmark (build/bench/bench_decode) ---------------------------------
# Added by the decode benchmark's owner: generate the V4-shaped checkpoint and run
# "$BUILD/bench/bench_decode" here.
# ---- end of decode benchmark ------------------------------------------------------------------
