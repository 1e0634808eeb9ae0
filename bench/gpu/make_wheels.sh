#!/usr/bin/env bash
# bench/gpu/make_wheels.sh — builds .whl/, the Python wheels bench/gpu/serve_suite.sh installs on the
# GPU machine, where nothing can be downloaded. Run here (PyPI reachable), in the repository root:
#     bash bench/gpu/make_wheels.sh            then carry ".whl" in the device call
# What it does:
#   1. pins openai, anthropic and schemathesis to the versions installed here (the ones the server
#      suite passes with in CI; scripts/setup.sh installs them), or to PINS' versions where absent;
#   2. lets pip resolve their whole dependency closure for the GPU image's Python (CPython 3.12,
#      manylinux x86-64, binary wheels only) and downloads it into a scratch folder;
#   3. splits it: a package the image already has (IMAGE_PKGS, from the device notes' package list)
#      goes to .whl/fallback/ — serve_suite.sh installs one of those only where the image's version
#      fails a requirement — and every other one to .whl/;
#   4. prints the sizes (a device call carries 64 MiB of working tree in all) and fails over LIMIT_MB.
# Environment: PYTHON [python3], PYVER [3.12], LIMIT_MB [40], PINS (extra "name==version" words).
# .whl/ is git-ignored through .git/info/exclude (added here when missing): wheels are never committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PYVER=${PYVER:-3.12}
LIMIT_MB=${LIMIT_MB:-40}

# the image's packages (device notes, KINDS.md, read 2026-11-17), normalized names
IMAGE_PKGS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"

# 1. the pins
REQS=()
for name in openai anthropic schemathesis; do
    v=$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null || true)
    if [ -n "$v" ]; then REQS+=("$name==$v"); else REQS+=("$name"); fi
done
# shellcheck disable=SC2206
REQS+=(${PINS:-})
echo "make_wheels: resolving ${REQS[*]} for CPython $PYVER, manylinux x86-64"

# 2. the closure, binary wheels for the image's Python
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
PLATS=()
for n in 17 24 27 28 31 34 35 39; do PLATS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
$PY -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version "$PYVER" \
    --implementation cp "${PLATS[@]}" -d "$SCRATCH" "${REQS[@]}"

# 3. the split
rm -rf .whl
mkdir -p .whl/fallback
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
for w in "$SCRATCH"/*.whl; do
    base=$(basename "$w")
    name=$(norm "${base%%-*}")
    if echo " $IMAGE_PKGS " | tr '\n' ' ' | grep -q " $name "; then
        mv "$w" .whl/fallback/
    else
        mv "$w" .whl/
    fi
done
if ls "$SCRATCH"/* > /dev/null 2>&1; then
    echo "make_wheels: pip left files that are not wheels (sdists cannot be installed there):" >&2
    ls "$SCRATCH" >&2
    exit 1
fi

# 4. the sizes
echo "make_wheels: .whl/ (installed there):"
ls .whl/*.whl | xargs -n1 basename | sed 's/^/  /'
echo "make_wheels: .whl/fallback/ (installed only where the image's version fails a requirement):"
ls .whl/fallback/*.whl 2>/dev/null | xargs -r -n1 basename | sed 's/^/  /'
kb=$(du -sk .whl | cut -f1)
echo "make_wheels: $(( kb / 1024 )) MiB in all (limit $LIMIT_MB MiB)"
if [ "$kb" -gt $(( LIMIT_MB * 1024 )) ]; then
    echo "make_wheels: .whl is over $LIMIT_MB MiB: a device call carries 64 MiB of working tree" >&2
    exit 1
fi
