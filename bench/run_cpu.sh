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
"$BUILD/bench/bench_gemm" ${QUICK[@]+"${QUICK[@]}"}

# ---- full-model decode benchmark (build/bench/bench_decode) ---------------------------------
# A DeepSeek-V4-Flash-shaped checkpoint with the full widths (hidden 4096, 64 heads x 512,
# q_lora 1024, 8 x 1024 output groups, experts of 2048, vocab 129280, FP8 + FP4) and 4 layers
# (SWA, SWA, CSA, HCA + the MTP layer), made once by tools/gen_dsv4.py into bench/out/. Only 32 of
# the 256 routed experts are generated to keep it at 5 GB on disk: a decode step reads the 6 it
# routes to either way, so the bytes read per token are those of the full-width model.
CKPT="${BENCH_CKPT:-bench/out/v4flash-l4-e32}"
if [[ ! -f "$CKPT/model.safetensors.index.json" ]]; then
  echo "== generating $CKPT (once)"
  python3 tools/gen_dsv4.py --out "$CKPT" --preset flash --layers 4 --experts 32
fi
STEPS=16
[[ "${BENCH_QUICK:-0}" == 1 ]] && STEPS=4
for t in 1 2; do
  echo "== bench_decode, $t thread(s)"
  "$BUILD/bench/bench_decode" "$CKPT" $t $STEPS
done
# ---- end of decode benchmark ------------------------------------------------------------------

# ---- tokenizer encode throughput vs HF tokenizers (build/bench/bench_tokenizer) ------------------
# A few MB of mixed text (prose, code, multilingual) encoded one document per call on one thread
# with the DeepSeek-V3 tokenizer, by minke and by HF `tokenizers` (RAYON_NUM_THREADS=1) in the same
# run; prints both MB/s and the ratio, and fails if the ids differ.
echo "== bench_tokenizer"
TOK_MB=4
[[ "${BENCH_QUICK:-0}" == 1 ]] && TOK_MB=0.5
python3 bench/bench_tokenizer.py "$BUILD" --mb "$TOK_MB"

# ---- the host sampler's cost per step at vocab 129280 (build/bench/bench_sampler) ----------------
echo "== bench_sampler"
"$BUILD/bench/bench_sampler" ${QUICK[@]+"${QUICK[@]}"}

# ---- the default model vs llama.cpp (build/bench/bench_llama + bench/bench_vs_llamacpp.py) -------
# SmolLM2-135M-Instruct Q4_1: prompt and generation tokens/s at 1 and 2 threads, minke and
# llama.cpp (llama-cpp-python, flash attention off and on) interleaved in this run, with ratios.
echo "== bench_vs_llamacpp (default model)"
GEN=128
[[ "${BENCH_QUICK:-0}" == 1 ]] && GEN=8
python3 bench/bench_vs_llamacpp.py "$BUILD" --gen "$GEN" $([[ "${BENCH_QUICK:-0}" == 1 ]] && echo "--reps 1")
