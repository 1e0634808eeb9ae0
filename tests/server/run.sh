#!/usr/bin/env bash
# run.sh — the `minke serve` test suites (pytest, official openai + anthropic SDKs, schemathesis)
# against a given binary. Each test module starts its own server(s) on free ports and stops them with
# SIGTERM (exit code 0 required).
# Usage: bash tests/server/run.sh [build/minke | build-asan/minke] [extra pytest args, e.g. -k stop]
# Sanitizer builds are detected and get longer timeouts (MINKE_TEST_SLOW) and leak checking.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/minke}
shift || true
[ -x "$BIN" ] || { echo "run.sh: $BIN is not an executable (build it first)"; exit 1; }
export MINKE_BIN=$(readlink -f "$BIN")
PY=${PYTHON:-python3}
$PY -c "import openai, anthropic, pytest, requests, schemathesis" 2>/dev/null \
  || { echo "run.sh: needs the PyPI packages openai anthropic pytest requests schemathesis (scripts/setup.sh)"; exit 1; }

if nm -an "$MINKE_BIN" 2>/dev/null | grep -q __asan_init || ldd "$MINKE_BIN" 2>/dev/null | grep -q libasan; then
  export MINKE_TEST_SLOW=${MINKE_TEST_SLOW:-4}
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23:detect_stack_use_after_return=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  BUDGET=${MINKE_TEST_BUDGET:-1500}
  echo "run.sh: sanitizer build, timeouts x$MINKE_TEST_SLOW"
else
  BUDGET=${MINKE_TEST_BUDGET:-600}
fi
export PYTHONDONTWRITEBYTECODE=1
# the whole suite has a wall-clock budget (under 5 minutes on 2 cores for the normal build)
# with no test path among the arguments, run every suite in tests/server
WHERE=tests/server
for a in "$@"; do case "$a" in tests/*) WHERE=;; esac; done
timeout --signal=TERM --kill-after=30 "$BUDGET" \
  $PY -m pytest $WHERE -p no:cacheprovider -q -rfEs --durations=10 "$@"
