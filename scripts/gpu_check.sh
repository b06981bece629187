#!/usr/bin/env bash
# The GPU backend's checks on a machine with a CUDA GPU, in one batch:
#   1. where it ran: GPU, driver, nvcc, Python and package versions;
#   2. pytest tests/gpu (numerics through CuPy against the NumPy evaluator, the stored
#      TF-printed corpus, determinism, DLPack and tfxla_lite.function on GPU tensors where
#      TensorFlow sees the GPU; nvcc/NVRTC checks; the emulator tests);
#   3. benchmarks/gpu.py (fused kernels against unfused CuPy, JAX's XLA:GPU where JAX sees
#      the GPU, and TF's tf.function / XLA where TF does).
# Usage: scripts/gpu_check.sh [RESULTS_DIR]   (default: $OUT if set, else
#        benchmarks/results/gpu). At most six files land there, for docs/gpu.md to cite:
#        environment.txt, pytest.txt, pytest.xml, benchmark.txt, benchmark.md, benchmark.json.
# PYTHON picks the interpreter (default: .venv/bin/python when it has CuPy, else python3).
# The package is not installed: its folders are mirrored into a temporary package tree
# as setup.py's package_dir maps them, so a machine with CuPy but without TensorFlow
# (the lent GPU machines) runs everything that does not need TF.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${1:-${OUT:-benchmarks/results/gpu}}"
mkdir -p "$RESULTS"
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c "import cupy" 2>/dev/null; then
        PYTHON=.venv/bin/python
    fi
fi
PACKAGE="$(mktemp -d)"
trap 'rm -rf "$PACKAGE"' EXIT
cp -r tfxla_lite "$PACKAGE/tfxla_lite"
cp -r codegen "$PACKAGE/tfxla_lite/codegen"
cp -r clustering "$PACKAGE/tfxla_lite/clustering"
export PYTHONPATH="$PACKAGE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# -P (Python 3.11+): the checkout's own tfxla_lite/ (without codegen/) must not shadow
# the mirror through the current directory.
NO_CWD=$("$PYTHON" -P -c pass 2>/dev/null && echo -P)

{
    echo "date: $(date -u +%FT%TZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 \
        | sed 's/^/gpu: /'
    nvcc --version 2>&1 | tail -1 | sed 's/^/nvcc: /'
    "$PYTHON" $NO_CWD - <<'PY'
import importlib, platform
import tfxla_lite.codegen.gpu as backend
print("python:", platform.python_version())
print("tfxla_lite.codegen.gpu from:", backend.__file__)
for name in ("numpy", "llvmlite", "cupy", "jax", "tensorflow"):
    try:
        module = importlib.import_module(name)
        print(f"{name}: {getattr(module, '__version__', '?')}")
    except Exception as error:  # noqa: BLE001
        print(f"{name}: absent ({type(error).__name__})")
try:
    import cupy
    print("cupy devices:", cupy.cuda.runtime.getDeviceCount())
    print("cuda runtime:", cupy.cuda.runtime.runtimeGetVersion())
except Exception as error:  # noqa: BLE001
    print("cupy devices: none:", error)
try:
    import jax
    print("jax devices:", jax.devices())
except Exception as error:  # noqa: BLE001
    print("jax devices: none:", error)
PY
} > "$RESULTS/environment.txt" 2>&1
cat "$RESULTS/environment.txt"

# -rs lists every skip with its reason: what did not run here is part of the result.
"$PYTHON" $NO_CWD -c 'import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))' tests/gpu -v -rs \
    -p no:cacheprovider --junitxml "$RESULTS/pytest.xml" 2>&1 | tee "$RESULTS/pytest.txt"
tests=${PIPESTATUS[0]}

"$PYTHON" $NO_CWD benchmarks/gpu.py --repeat "${REPEAT:-50}" --json "$RESULTS/benchmark.json" \
    --markdown "$RESULTS/benchmark.md" 2>&1 | tee "$RESULTS/benchmark.txt"
bench=${PIPESTATUS[0]}

echo "pytest exit $tests, benchmark exit $bench; results in $RESULTS"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
