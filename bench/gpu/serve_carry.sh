#!/usr/bin/env bash
# bench/gpu/serve_carry.sh — makes the working tree fit a device call that runs bench/gpu/serve_suite.sh
# (the server suite's wheels, 22 MiB, and the tracked tree, ~57 MiB, exceed the 64 MiB a call carries),
# and puts it back afterwards. Run here, in the repository root:
#     bash bench/gpu/serve_carry.sh out    before the call: moves the two tiny checkpoints the server suite
#                                          does not read (tests/data/dsv4/v4-tiny-bf16, v4-tiny-wide; it
#                                          serves v4-tiny-fp8) to $HOLD, copies the shared libraries the GPU
#                                          image lacks into .kit/lib, packs build-cuda/minke (built here with
#                                          `make cuda build-cuda/minke`) as build-cuda/minke.xz, and prints
#                                          what the call will carry
#     bash bench/gpu/serve_carry.sh back   after the call: moves the checkpoints back (git status is clean
#                                          again), removes the copied libraries
# The call then carries [".kit", ".whl", "build-cuda/minke.xz"] and starts with
#     xz -dc build-cuda/minke.xz > build-cuda/minke_s && chmod +x build-cuda/minke_s
# and runs MINKE=build-cuda/minke_s bash bench/gpu/serve_suite.sh. Never commit while the checkpoints are out.
# Environment: HOLD [/tmp/minke-carry-hold], LIB [/lib/x86_64-linux-gnu].
set -euo pipefail
cd "$(dirname "$0")/../.."
HOLD=${HOLD:-/tmp/minke-carry-hold}
LIB=${LIB:-/lib/x86_64-linux-gnu}
CKPTS="v4-tiny-bf16 v4-tiny-wide"
SOS="libmicrohttpd.so.12 libutf8proc.so.2 libjansson.so.4"
case "${1:-}" in
out)
    mkdir -p "$HOLD" .kit/lib
    for c in $CKPTS; do
        if [ -d "tests/data/dsv4/$c" ]; then mv "tests/data/dsv4/$c" "$HOLD/"; fi
    done
    for so in $SOS; do
        [ -e "$LIB/$so" ] || { echo "serve_carry: $LIB/$so is missing (apt-get install the runtime package)" >&2; exit 1; }
        cp -L "$LIB/$so" .kit/lib/
    done
    [ -x build-cuda/minke ] || { echo "serve_carry: build-cuda/minke is missing: make cuda build-cuda/minke" >&2; exit 1; }
    cp build-cuda/minke /tmp/minke_s.$$ && strip /tmp/minke_s.$$ && xz -9 -T2 -c /tmp/minke_s.$$ > build-cuda/minke.xz
    rm -f /tmp/minke_s.$$
    [ -d .whl ] || echo "serve_carry: no .whl/ (bash bench/gpu/make_wheels.sh)" >&2
    tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
    untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
    carried=$(du -sb .kit .whl build-cuda/minke.xz 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
    awk -v t="$tracked" -v u="$untracked" -v c="$carried" 'BEGIN {
        printf "serve_carry: tracked files present %.1f MiB + untracked %.1f MiB + carried %.1f MiB = %.1f MiB (limit 64)\n",
               t / 1048576, u / 1048576, c / 1048576, (t + u + c) / 1048576; exit (t + u + c > 64 * 1048576) }'
    ;;
back)
    for c in $CKPTS; do
        if [ -d "$HOLD/$c" ] && [ ! -e "tests/data/dsv4/$c" ]; then mv "$HOLD/$c" tests/data/dsv4/; fi
    done
    for so in $SOS; do rm -f ".kit/lib/$so"; done
    git status --short tests/data
    ;;
*)
    echo "usage: bash bench/gpu/serve_carry.sh out|back" >&2
    exit 2
    ;;
esac
