#!/usr/bin/env bash
# bench/gpu/run.sh — everything the GPU machine should do for the CUDA backend, in one call:
# build (make cuda), run the op tests against the CPU twins, benchmark (HBM bandwidth, the linear
# kernels at V4-Flash decode shapes, FP8 GEMM vs cuBLAS bf16), then re-run the tests on small
# shapes under compute-sanitizer (memcheck); then the DeepSeek-V4 model on the GPU: the golden cases
# (build-cuda/test_dsv4_cuda, forced + natural), a full-width checkpoint generated here
# (tools/gen_dsv4.py, DSV4_LAYERS layers, never committed) decoded by minke (bench_dsv4_cuda) and by
# transformers' DeepseekV4ForCausalLM (bench/gpu/hf_decode.py). Results land in $OUT (default bench/gpu/out):
#   results.md  the summary (machine, test table, benchmark tables, sanitizer verdict)
#   log.txt     the whole console output;  test.txt, bench.md, sanitizer.txt, dsv4.txt  the parts
# Usage (repository root or anywhere): bash bench/gpu/run.sh
# Environment: CUDA_GENCODE (default sm_90a only, to build fast there), SKIP_SANITIZER=1,
# SKIP_OPS=1 (no op tests / op benchmark), SKIP_OPBENCH=1 (the op tests without the op benchmark), BENCH_GPU_ONLY="experts,pattern" (the op benchmark's sections after the bandwidth: decode, experts, pattern, gemm, sample; all without it), SKIP_DSV4=1, DSV4_LAYERS (4), DSV4_VOCAB (129280),
# DSV4_STEPS (64), DSV4_LONG_VARIANTS="VAR=value ..." (batch-1 decode after a DSV4_LONG_PROMPT-token prompt, 4096,
# under each -> variants.txt), OPS_TIMEOUT (400 s for test_ops_cuda), SKIP_HF=1, DSV4_SANITIZER=1 (memcheck of the golden test's fp8 case even with
# SKIP_SANITIZER=1), DSV4_NCU=1 (ncu kernel durations of one decode step -> ncu.md; with DSV4_NCU_VARIANTS="A=1 B=1,C=1"
# the same under each setting too, side by side -> ncu_variants.md), DSV4_PROFILE=1 (phase profile of
# batch 1, a 1024-token prefill and batch 64 / 256 -> profile.txt), DSV4_VARIANTS="VAR=value ..."
# (batch-1 decode again under each tuning variable -> variants.txt), DSV4_RAW_VARIANTS="VAR=value ..." (batch-1 decode of
# DSV4_RAW_STEPS (8) steps under each, the whole output kept -> raw_N.txt, and probe_summary.py's table of a probe's
# prints -> raw_N.md), DSV4_VARIANTS_FULL="VAR=value ..." (the
# same with batch 64 / 256 and the 2048-token prefill), DSV4_TRACE=1 (one decode step with
# an event after every launch: trace.txt in launch order, trace.md by launch name; the same for a 2048-token
# prefill: trace_prefill.txt / .md), DSV4_TEST_VARIANTS="VAR=value ..." (the golden, paged and engine model
# tests again under each tuning variable: a path that is off by default checked end to end -> dsv4_variants.txt),
# DSV4_KTRACE=1 (CUPTI kernel timestamps inside the replayed decode graphs: bench/gpu/ktrace.c, summarised by
# ktrace_summary.py -> ktrace_default.md, each kernel's share of the step inside the graph; DSV4_KTRACE_VARIANTS
# "A=1,B=0 ..." the same under settings -> ktrace_<setting>.md; DSV4_KTRACE_PROMPT: the prompt before the
# traced decode steps, 16 unless set),
# DSV4_NCU_SAMPLING (ncu's --warp-sampling-interval for DSV4_NCU_SOURCE: 0 = every 32 cycles, for short kernels),
# DSV4_NCU_DETAIL="kernel-name regex" (ncu's speed-of-light, occupancy, warp-stall and memory sections for the
# first 4 decode launches of the matching kernels -> ncu_detail.txt: why a kernel is where it is; DSV4_NCU_ENV="VAR=value,..."
# sets tuning variables for that run and DSV4_NCU_SOURCE's; DSV4_NCU_SKIP: matching launches skipped first, 8 unless
# set: the sampled steps' draw launches only 4 times, so k_sample_rows needs 0-2; the prompt's forward launches
# k_hc_pre_fin and k_hc_post_part 15 times in all, so their decode launches need 15-16), DSV4_NCU_SOURCE="kernel-name regex" (stall samples per SASS
# instruction of two launches of the matching kernels -> ncu_source.csv, summarised in ncu_source.md), DSV4_SASS="function-name regex" (cuobjdump's SASS of the matching kernels
# -> sass.txt), DSV4_NCU_PROMPT: the prompt before the 4 profiled steps of every ncu run, 4 unless set (4096:
# the indexer at ~1024 entries; the prefill's launches are then profiled too). A variant of DSV4_VARIANTS / _FULL / DSV4_LONG_VARIANTS / DSV4_TEST_VARIANTS may set several
# variables: "A=1,B=0". Each variant run is bounded by a timeout; its exit status is logged as "rc N".
# Without libjansson-dev there, a static copy carried in .kit/
# (include/, lib/libjansson.a) is used.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-bench/gpu/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
JOBS=$(nproc 2>/dev/null || echo 4)
GENCODE=${CUDA_GENCODE:--gencode arch=compute_90a,code=sm_90a}
CUDA=${CUDA:-/usr/local/cuda}
export PATH="$CUDA/bin:$PATH"
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit --format=csv 2>&1
nvcc --version 2>&1 | tail -2
echo "cores: $JOBS; kernel: $(uname -r)"

stamp "build (make cuda, $GENCODE)"
# Host warnings are not errors here: this machine's compilers may be newer than CI's.
CKPT=${DSV4_CKPT:-/tmp/dsv4-flash}
if [ "${SKIP_DSV4:-0}" != 1 ] && [ ! -e "$CKPT/config.json" ]; then
    # the benchmark checkpoint is generated while the build and the tests run
    ( python3 tools/gen_dsv4.py --out "$CKPT" --preset flash --layers "${DSV4_LAYERS:-4}" \
          --vocab "${DSV4_VOCAB:-129280}" --threads "$JOBS" > "$OUT/gen.txt" 2>&1; echo "gen rc $?" >> "$OUT/gen.txt" ) &
    GEN_PID=$!
fi
JANSSON=()
if [ ! -e /usr/include/jansson.h ] && [ -e .kit/lib/libjansson.a ]; then
    JANSSON=(JANSSON_INC="-I$PWD/.kit/include" JANSSON_LIB="$PWD/.kit/lib/libjansson.a")
fi
BUILD_VARS=(CUDA="$CUDA" CUDA_GENCODE="$GENCODE" "${JANSSON[@]}"
            WARN="-Wall -Wextra -Wno-unused-parameter -Wno-format-truncation"
            NVCC_WARN="-Xcompiler -Wall,-Wextra,-Wno-unused-parameter")
if command -v make >/dev/null 2>&1; then
    # the targets that need only CUDA + jansson (the image has no libmicrohttpd / utf8proc headers:
    # build-cuda/minke and build-cuda/test_dsv4_engine_cuda are built elsewhere and carried)
    make -j"$JOBS" "${BUILD_VARS[@]}" build-cuda/test_ops_cuda build-cuda/bench_gpu build-cuda/test_dsv4_cuda \
        build-cuda/test_dsv4_paged_cuda build-cuda/bench_dsv4_cuda
    BUILD_RC=$?
else
    echo "no make here: building with the same commands by hand"
    CUBLAS=0; [ -e "$CUDA/lib64/libcublas.so" ] && CUBLAS=1
    B=build-cuda/nomake; mkdir -p $B
    CF="-std=c11 -D_GNU_SOURCE -O2 -march=x86-64-v2 -mtune=native -Iinclude -Isrc -fno-math-errno"
    JL=-ljansson
    [ -e .kit/lib/libjansson.a ] && CF="$CF -I$PWD/.kit/include" && JL="$PWD/.kit/lib/libjansson.a"
    NF="-O3 -std=c++17 -lineinfo $GENCODE -Iinclude -Isrc -DMK_HAVE_CUBLAS=$CUBLAS"
    for f in src/ops/cuda/*.cu; do nvcc $NF -c "$f" -o $B/$(basename "$f").o & done
    for f in src/ops/cpu/*.c src/num/formats.c src/base/status.c src/base/threads.c src/engine/sampler.c \
             src/engine/philox.c tests/ops/test_ops_cuda.c; do
        cc $CF -c "$f" -o $B/$(basename "$f").o &
    done
    wait
    LIBS="-L$CUDA/lib64 -Xlinker -rpath -Xlinker $CUDA/lib64 $JL -lpthread -lm" # jansson: the sampler
    [ $CUBLAS = 1 ] && LIBS="$LIBS -lcublas"
    OBJS=$(ls $B/*.o | grep -v test_ops_cuda)
    nvcc $GENCODE -o build-cuda/test_ops_cuda $B/test_ops_cuda.c.o $OBJS $LIBS &&
        nvcc $NF -o build-cuda/bench_gpu bench/gpu/bench_gpu.cu $OBJS $LIBS
    BUILD_RC=$?
fi
stamp "build rc $BUILD_RC"

TEST_RC=-1
BENCH_RC=-1
SAN_RC=-1
if [ "$BUILD_RC" = 0 ] && [ "${SKIP_OPS:-0}" != 1 ]; then
    stamp "op tests (CUDA vs CPU)"
    timeout -k 10 "${OPS_TIMEOUT:-400}" ./build-cuda/test_ops_cuda > "$OUT/test.txt" 2>&1
    TEST_RC=$?
    cat "$OUT/test.txt"
    stamp "tests rc $TEST_RC"

    if [ "${SKIP_OPBENCH:-0}" != 1 ]; then
        stamp "benchmark"
        ./build-cuda/bench_gpu "$OUT/bench.md"
        BENCH_RC=$?
        stamp "bench rc $BENCH_RC"
    fi

    if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
        SAN=$(command -v compute-sanitizer || ls "$CUDA"/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
        if [ -n "$SAN" ]; then
            stamp "compute-sanitizer memcheck (tests --quick)"
            timeout 200 "$SAN" --tool memcheck --error-exitcode 3 ./build-cuda/test_ops_cuda --quick > "$OUT/sanitizer.txt" 2>&1
            SAN_RC=$?
            tail -5 "$OUT/sanitizer.txt"
            stamp "sanitizer rc $SAN_RC"
        else
            echo "compute-sanitizer not found" | tee "$OUT/sanitizer.txt"
        fi
    fi
fi

DSV4_RC=-1
DBENCH_RC=-1
if [ "$BUILD_RC" = 0 ] && [ "${SKIP_DSV4:-0}" != 1 ]; then
    stamp "dsv4 golden cases on the GPU (forced + natural)"
    ./build-cuda/test_dsv4_cuda > "$OUT/dsv4.txt" 2>&1
    DSV4_RC=$?
    cat "$OUT/dsv4.txt"
    stamp "dsv4 golden rc $DSV4_RC"
    stamp "dsv4 paged / batched / chunked on the GPU (bit-exact self-consistency)"
    ./build-cuda/test_dsv4_paged_cuda > "$OUT/dsv4_paged.txt" 2>&1
    PAGED_RC=$?
    cat "$OUT/dsv4_paged.txt"
    if [ -x ./build-cuda/test_dsv4_engine_cuda ]; then
        stamp "the engine on the GPU (batch invariance, prefix cache, preemption, GPU vs CPU)"
        ./build-cuda/test_dsv4_engine_cuda > "$OUT/dsv4_engine.txt" 2>&1
        ENGINE_RC=$?
        cat "$OUT/dsv4_engine.txt"
    fi
    stamp "paged rc ${PAGED_RC:-?} engine rc ${ENGINE_RC:-?}"
    for v in ${DSV4_TEST_VARIANTS:-}; do # the model tests under tuning variables, e.g. MINKE_CUDA_HC_FIN_SPLIT=1 or A=1,B=1
        stamp "dsv4 golden, paged and engine tests with $v"
        env ${v//,/ } timeout -k 10 200 ./build-cuda/test_dsv4_cuda > "$OUT/dsv4_v.txt" 2>&1
        G_RC=$?
        env ${v//,/ } timeout -k 10 200 ./build-cuda/test_dsv4_paged_cuda >> "$OUT/dsv4_v.txt" 2>&1
        P_RC=$?
        E_RC=absent
        if [ -x ./build-cuda/test_dsv4_engine_cuda ]; then
            env ${v//,/ } timeout -k 10 200 ./build-cuda/test_dsv4_engine_cuda >> "$OUT/dsv4_v.txt" 2>&1
            E_RC=$?
        fi
        echo "$v: golden rc $G_RC, paged rc $P_RC, engine rc $E_RC" | tee -a "$OUT/dsv4_variants.txt"
        grep -iE "fail" "$OUT/dsv4_v.txt" | head -5 | tee -a "$OUT/dsv4_variants.txt"
    done
    SAN=${SAN:-$(command -v compute-sanitizer || ls "$CUDA"/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)}
    if { [ "${DSV4_SANITIZER:-0}" = 1 ] || [ "${SKIP_SANITIZER:-0}" != 1 ]; } && [ -n "${SAN:-}" ]; then
        stamp "compute-sanitizer memcheck: test_dsv4_cuda v4-tiny-fp8"
        timeout 120 "$SAN" --tool memcheck --error-exitcode 3 ./build-cuda/test_dsv4_cuda v4-tiny-fp8 > "$OUT/dsv4_sanitizer.txt" 2>&1
        echo "dsv4 sanitizer rc $?"; grep -E "ERROR SUMMARY|Invalid|FAIL" "$OUT/dsv4_sanitizer.txt" | head -5
    fi
    if [ -n "${GEN_PID:-}" ]; then stamp "waiting for the checkpoint"; wait "$GEN_PID"; fi
    tail -3 "$OUT/gen.txt" 2>/dev/null
    du -sh "$CKPT" 2>/dev/null
    stamp "minke decode benchmark ($CKPT)"
    ./build-cuda/bench_dsv4_cuda "$CKPT" 16 "${DSV4_STEPS:-64}" "$OUT/dsv4_bench.md" > "$OUT/dsv4_bench.txt" 2>&1
    DBENCH_RC=$?
    cat "$OUT/dsv4_bench.txt"
    stamp "minke decode rc $DBENCH_RC"
    if [ -x ./build-cuda/test_dsv4_engine_cuda ] && [ "${SKIP_ENGINE_BENCH:-0}" != 1 ]; then
        stamp "the engine on $CKPT: one plain greedy request, async scheduling on / off"
        timeout -k 10 200 ./build-cuda/test_dsv4_engine_cuda --bench "$CKPT" 16 "${DSV4_STEPS:-64}" \
            > "$OUT/engine_bench.txt" 2>&1
        echo "engine bench rc $?"
        cat "$OUT/engine_bench.txt"
        for v in ${ENGINE_BENCH_VARIANTS:-}; do # the same under a tuning variable
            stamp "the engine bench with $v"
            env ${v//,/ } timeout -k 10 200 ./build-cuda/test_dsv4_engine_cuda --bench "$CKPT" 16 "${DSV4_STEPS:-64}" 2>&1 |
                grep -E "^run " | sed "s/^/$v: /" | tee -a "$OUT/variants.txt"
        done
    fi
    for v in ${DSV4_VARIANTS:-}; do # batch-1 decode under a tuning variable, e.g. MINKE_CUDA_MOE_SLABS=2
        stamp "batch-1 decode with $v"
        env ${v//,/ } timeout -k 10 150 ./build-cuda/bench_dsv4_cuda "$CKPT" 16 "${DSV4_STEPS:-64}" /dev/null none 2>&1 |
            grep -E "decode step|achieved /|sampled step|penalties|greedy tokens|cuda: graph of" | sed "s/^/$v: /" | tee -a "$OUT/variants.txt"
        echo "$v: rc ${PIPESTATUS[0]}" | tee -a "$OUT/variants.txt"
    done
    RI=0
    for v in ${DSV4_RAW_VARIANTS:-}; do # batch-1 decode under a tuning variable, the whole output kept (probes' prints)
        RI=$((RI + 1))
        stamp "batch-1 decode with $v, raw output -> raw_$RI.txt"
        echo "$v" > "$OUT/raw_$RI.txt"
        env ${v//,/ } timeout -k 10 150 ./build-cuda/bench_dsv4_cuda "$CKPT" 16 "${DSV4_RAW_STEPS:-8}" /dev/null none \
            >> "$OUT/raw_$RI.txt" 2>&1
        echo "$v: rc $?"
        [ -x bench/gpu/probe_summary.py ] && python3 bench/gpu/probe_summary.py "$OUT/raw_$RI.txt" | tee "$OUT/raw_$RI.md"
    done
    for v in ${DSV4_LONG_VARIANTS:-}; do # batch-1 decode after a long prompt (DSV4_LONG_PROMPT tokens, 24 steps)
        stamp "batch-1 decode after a ${DSV4_LONG_PROMPT:-4096}-token prompt with $v"
        env ${v//,/ } timeout -k 10 150 ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_LONG_PROMPT:-4096}" 24 /dev/null none 2>&1 |
            grep -E "decode step|achieved /|greedy tokens" | sed "s/^/long $v: /" | tee -a "$OUT/variants.txt"
        echo "long $v: rc ${PIPESTATUS[0]}" | tee -a "$OUT/variants.txt"
    done
    for v in ${DSV4_VARIANTS_FULL:-}; do # batch 1, batch 64 / 256 and prefill 2048 under a tuning variable
        stamp "batch 1, 64, 256 and prefill with $v"
        env ${v//,/ } timeout -k 10 300 ./build-cuda/bench_dsv4_cuda "$CKPT" 16 "${DSV4_STEPS:-64}" /dev/null 2>&1 |
            grep -E "decode step|achieved /|decode, batch|prefill, 1 prompt" | sed "s/^/$v: /" | tee -a "$OUT/variants.txt"
        echo "$v: rc ${PIPESTATUS[0]}" | tee -a "$OUT/variants.txt"
    done
    if [ "${DSV4_KTRACE:-0}" = 1 ]; then # kernel timestamps inside the replayed decode graphs (bench/gpu/ktrace.c)
        stamp "kernel timestamps in graph replays (CUPTI, bench/gpu/ktrace.c)"
        CUPTI_SO=$(ls "$CUDA"/extras/CUPTI/lib64/libcupti.so* "$CUDA"/lib64/libcupti.so* "$CUDA"/lib/libcupti.so* \
            /usr/local/cuda*/targets/*/lib/libcupti.so* 2>/dev/null | head -1)
        [ -n "$CUPTI_SO" ] || CUPTI_SO=$(find / -xdev -name 'libcupti.so*' 2>/dev/null | head -1)
        CUPTI_H=$(ls "$CUDA"/extras/CUPTI/include/cupti.h "$CUDA"/include/cupti.h /usr/local/cuda*/targets/*/include/cupti.h \
            2>/dev/null | head -1)
        [ -n "$CUPTI_H" ] || CUPTI_H=$(find / -xdev -name cupti.h 2>/dev/null | head -1)
        if [ -n "$CUPTI_SO" ] && [ -n "$CUPTI_H" ] && gcc -O2 -shared -fPIC -I"$(dirname "$CUPTI_H")" -I"$CUDA/include" \
            bench/gpu/ktrace.c "$CUPTI_SO" -Wl,-rpath,"$(dirname "$CUPTI_SO")" -o build-cuda/libktrace.so \
            > "$OUT/ktrace_build.txt" 2>&1; then
            for v in default ${DSV4_KTRACE_VARIANTS:-}; do
                KV=""; [ "$v" != default ] && KV="${v//,/ }"
                env $KV KTRACE_OUT=/tmp/ktrace.csv LD_PRELOAD="$PWD/build-cuda/libktrace.so" timeout -k 10 150 \
                    ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_KTRACE_PROMPT:-16}" "${DSV4_STEPS:-64}" /dev/null none 2>&1 |
                    grep -E "decode step|ktrace" | sed "s/^/ktrace $v: /" | tee -a "$OUT/ktrace.md"
                python3 bench/gpu/ktrace_summary.py /tmp/ktrace.csv > "$OUT/ktrace_$v.md" 2>&1
                head -3 "$OUT/ktrace_$v.md"; sed -n '/by kernel/,$p' "$OUT/ktrace_$v.md" | head -30
                gzip -c /tmp/ktrace.csv > "$OUT/ktrace_$v.csv.gz"
            done
        else
            echo "ktrace: build failed (cupti '${CUPTI_SO:-none}', header '${CUPTI_H:-none}')"; cat "$OUT/ktrace_build.txt"
        fi
    fi
    if [ "${DSV4_PROFILE:-0}" = 1 ]; then
        stamp "phase profile (MINKE_CUDA_PROFILE=1): batch 1, prefill 1024, batch 64 and 256"
        MINKE_CUDA_PROFILE=1 timeout 200 ./build-cuda/bench_dsv4_cuda "$CKPT" 16 16 /dev/null 64,256 1024 > "$OUT/profile.txt" 2>&1
        echo "profile rc $?"
    fi
    if [ "${DSV4_TRACE:-0}" = 1 ]; then
        stamp "kernel trace of one decode step (MINKE_CUDA_TRACE)"
        MINKE_CUDA_TRACE="$OUT/trace.txt" ./build-cuda/bench_dsv4_cuda "$CKPT" 16 "${DSV4_STEPS:-64}" /dev/null none 2>&1 |
            sed -n '/one traced decode step/,$p' > "$OUT/trace.md"
        head -40 "$OUT/trace.md"
        stamp "kernel trace of one 2048-token prefill (MINKE_CUDA_TRACE_PREFILL)"
        MINKE_CUDA_TRACE_PREFILL="$OUT/trace_prefill.txt" ./build-cuda/bench_dsv4_cuda "$CKPT" 16 8 /dev/null 0 2048 2>&1 |
            sed -n '/one traced prefill/,$p' > "$OUT/trace_prefill.md"
        head -40 "$OUT/trace_prefill.md"
    fi
    if [ "${DSV4_NCU:-0}" = 1 ]; then
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "$CUDA"/bin/ncu 2>/dev/null | head -1)
        stamp "ncu: kernel durations of one decode step ($NCU)"
        timeout 240 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
            ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_NCU_PROMPT:-4}" 4 /dev/null none > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
        echo "ncu rc $?"; tail -2 "$OUT/ncu.err"
        python3 bench/gpu/ncu_summary.py "$OUT/ncu.csv" > "$OUT/ncu.md" 2>&1; head -45 "$OUT/ncu.md"
        if [ -n "${DSV4_NCU_VARIANTS:-}" ]; then # the same step's kernel durations under each setting
            NV=("defaults=$OUT/ncu.csv"); i=0
            for v in $DSV4_NCU_VARIANTS; do
                i=$((i + 1))
                stamp "ncu: kernel durations of one decode step under $v"
                timeout 240 env ${v//,/ } "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
                    ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_NCU_PROMPT:-4}" 4 /dev/null none > "$OUT/ncu_v$i.csv" 2> "$OUT/ncu_v$i.err"
                echo "ncu ($v) rc $?"; NV+=("$v=$OUT/ncu_v$i.csv")
            done
            python3 bench/gpu/ncu_summary.py "${NV[@]}" > "$OUT/ncu_variants.md" 2>&1; head -60 "$OUT/ncu_variants.md"
        fi
    fi
    if [ -n "${DSV4_NCU_DETAIL:-}" ]; then
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "$CUDA"/bin/ncu 2>/dev/null | head -1)
        stamp "ncu detail: kernels matching ${DSV4_NCU_DETAIL}"
        NCU_ENV=(${DSV4_NCU_ENV:+${DSV4_NCU_ENV//,/ }}) # e.g. DSV4_NCU_ENV=MINKE_CUDA_MOE_WSLAB=1 (a path that is off by default)
        ncu_detail() {
            timeout 300 env "${NCU_ENV[@]}" "$NCU" --clock-control none --kernel-name "regex:${DSV4_NCU_DETAIL}" \
                --launch-skip "${DSV4_NCU_SKIP:-8}" --launch-count 4 "$@" \
                --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
                ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_NCU_PROMPT:-4}" 4 /dev/null none > "$OUT/ncu_detail.txt" 2> "$OUT/ncu_detail.err"
        }
        # the sections' bodies in full (the warp stall reasons, the top stall locations); without, if refused
        ncu_detail --print-details all || ncu_detail
        echo "ncu detail rc $?"; tail -2 "$OUT/ncu_detail.err"; grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|No Eligible|Stall" "$OUT/ncu_detail.txt" | head -40
    fi
    if [ -n "${DSV4_NCU_SOURCE:-}" ]; then # per-SASS-instruction stall samples of one launch of each matching kernel
        NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "$CUDA"/bin/ncu 2>/dev/null | head -1)
        stamp "ncu source: kernels matching ${DSV4_NCU_SOURCE}"
        NCU_ENV=(${DSV4_NCU_ENV:+${DSV4_NCU_ENV//,/ }})
        timeout 300 env "${NCU_ENV[@]}" "$NCU" --clock-control none --kernel-name "regex:${DSV4_NCU_SOURCE}" \
            --launch-skip "${DSV4_NCU_SKIP:-8}" --launch-count 2 --section SourceCounters --section WarpStateStats \
            ${DSV4_NCU_SAMPLING:+--warp-sampling-interval "$DSV4_NCU_SAMPLING"} \
            --page source --print-source sass --csv \
            ./build-cuda/bench_dsv4_cuda "$CKPT" "${DSV4_NCU_PROMPT:-4}" 4 /dev/null none > "$OUT/ncu_source.csv" 2> "$OUT/ncu_source.err"
        echo "ncu source rc $?"; tail -2 "$OUT/ncu_source.err"
        python3 bench/gpu/ncu_source.py "$OUT/ncu_source.csv" 40 > "$OUT/ncu_source.md" 2>&1; head -60 "$OUT/ncu_source.md"
    fi
    if [ -n "${DSV4_SASS:-}" ]; then # the SASS of the CUDA objects' functions whose names match -> sass.txt
        CUOBJDUMP=$(command -v cuobjdump || echo "$CUDA/bin/cuobjdump")
        for o in build-cuda/src/ops/cuda/*.o; do "$CUOBJDUMP" -sass "$o" 2>/dev/null; done |
            awk -v re="${DSV4_SASS}" '/Function : /{on = ($0 ~ re)} on' > "$OUT/sass.txt"
        stamp "sass of functions matching ${DSV4_SASS}: $(grep -c 'Function : ' "$OUT/sass.txt") function(s), $(wc -l < "$OUT/sass.txt") lines"
    fi
    if [ "${SKIP_HF:-0}" != 1 ]; then
        stamp "transformers decode benchmark"
        PYTHONUNBUFFERED=1 timeout "${HF_TIMEOUT:-240}" python3 bench/gpu/hf_decode.py "$CKPT" 16 "${DSV4_STEPS:-64}" > "$OUT/hf.txt" 2>&1
        echo "hf rc $?"; grep -v "^\s*$" "$OUT/hf.txt" | tail -25
    fi
fi

{
    echo "# minke CUDA backend on the GPU machine ($(date -u +%Y-%m-%d))"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
    nvcc --version 2>&1 | tail -1
    echo '```'
    echo
    echo "build rc $BUILD_RC, op tests rc $TEST_RC, benchmark rc $BENCH_RC, compute-sanitizer rc $SAN_RC (0 = clean; -1 = not run), total $(( $(date +%s) - T0 )) s"
    echo
    echo "## Op tests: CUDA vs the CPU ops (ops.h), random inputs"
    echo
    [ -f "$OUT/test.txt" ] && cat "$OUT/test.txt"
    echo
    [ -f "$OUT/bench.md" ] && sed 's/^# minke GPU benchmark//' "$OUT/bench.md"
    echo
    echo "## compute-sanitizer (memcheck, tests --quick)"
    echo
    echo '```'
    [ -f "$OUT/sanitizer.txt" ] && grep -E "ERROR SUMMARY|checks,|Invalid|out of bounds|FAIL" "$OUT/sanitizer.txt" | head -20
    echo '```'
    echo
    echo "## DeepSeek-V4 on the GPU: golden cases (rc $DSV4_RC), decode benchmark (rc $DBENCH_RC)"
    echo
    [ -f "$OUT/dsv4.txt" ] && cat "$OUT/dsv4.txt"
    echo
    echo "## paged / batched / chunked (rc ${PAGED_RC:-?}) and the engine on the GPU (rc ${ENGINE_RC:-?})"
    echo
    echo '```'
    [ -f "$OUT/dsv4_paged.txt" ] && cat "$OUT/dsv4_paged.txt"
    [ -f "$OUT/dsv4_engine.txt" ] && cat "$OUT/dsv4_engine.txt"
    echo '```'
    echo
    [ -f "$OUT/dsv4_bench.md" ] && cat "$OUT/dsv4_bench.md"
    [ -f "$OUT/variants.txt" ] && { echo; echo "batch-1 decode under tuning variables:"; echo; cat "$OUT/variants.txt"; }
    [ -f "$OUT/hf.txt" ] && grep HF_RESULT "$OUT/hf.txt"
} > "$OUT/results.md"
stamp "done: $OUT/results.md"
