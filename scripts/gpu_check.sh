#!/usr/bin/env bash
# The GPU backend's checks on a machine with a CUDA GPU, in one batch that fits one
# device call (10 minutes; each step has its own time bound, below):
#   1. environment.txt: where it ran (GPU, driver, nvcc, Python and package versions);
#   2. pytest-device.*: the tests that need the GPU: every hand-written module, the stored
#      TF-printed corpus and the benchmark workloads' clusters (training steps included)
#      through CuPy against the NumPy evaluator, determinism, float4 alignment, the module
#      cache, NVRTC; DLPack and tfxla_lite.function on GPU tensors where TF sees the GPU;
#   3. dlpack.*: the TF-free DLPack round trip (CuPy, and JAX where it sees the GPU) and
#      the host cost of a launch (benchmarks/gpu.py --dlpack);
#   4. cublaslt_ab.*: dot epilogues fused by cuBLASLt against cuBLAS + a loop kernel
#      (benchmarks/gpu.py --cublaslt-ab, interleaved);
#   5. benchmark.*: benchmarks/gpu.py (fused kernels against unfused CuPy, JAX's XLA:GPU
#      where JAX sees the GPU, TF's tf.function / XLA where TF does);
#   6. pytest-offline.*: the tests that need no GPU (emitter, nvcc PTX, wiring, the CPU
#      emulator), last, in whatever time is left.
# Usage: scripts/gpu_check.sh [RESULTS_DIR]   (default: $OUT if set, else
#        benchmarks/results/gpu). Everything lands there: environment.txt, pytest-device.txt
#        and .xml, dlpack.txt and .json, cublaslt_ab.txt and .json, benchmark.txt, .md and .json, pytest-offline.txt and
#        .xml, summary.txt (each step's exit status; 124: it hit its time bound, and pytest
#        still wrote what had run).
# PYTHON picks the interpreter (default: .venv/bin/python when it has CuPy, else python3);
# REPEAT the benchmark's repeats (30); DEVICE_TESTS_S, DLPACK_S, LT_AB_S, BENCH_S,
# OFFLINE_S the steps' bounds in seconds (240, 45, 45, 150, 85).
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

# A step past its bound gets SIGINT first (pytest then stops and still writes its
# report), SIGKILL 15 s later.
bounded() { local seconds=$1; shift; timeout --signal=INT --kill-after=15 "$seconds" "$@"; }
# -rs lists every skip with its reason: what did not run here is part of the result.
DEVICE_TESTS=(tests/gpu/test_gpu_executable.py tests/gpu/test_gpu_launch_tf.py
              tests/gpu/test_gpu_nvrtc.py)
bounded "${DEVICE_TESTS_S:-240}" "$PYTHON" $NO_CWD -c \
    'import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))' "${DEVICE_TESTS[@]}" -v -rs \
    -p no:cacheprovider --junitxml "$RESULTS/pytest-device.xml" 2>&1 \
    | tee "$RESULTS/pytest-device.txt"
device_tests=${PIPESTATUS[0]}

bounded "${DLPACK_S:-45}" "$PYTHON" $NO_CWD benchmarks/gpu.py --repeat 200 \
    --dlpack "$RESULTS/dlpack.json" 2>&1 | tee "$RESULTS/dlpack.txt"
dlpack=${PIPESTATUS[0]}

bounded "${LT_AB_S:-45}" "$PYTHON" $NO_CWD benchmarks/gpu.py --repeat "${REPEAT:-30}" \
    --cublaslt-ab "$RESULTS/cublaslt_ab.json" 2>&1 | tee "$RESULTS/cublaslt_ab.txt"
lt_ab=${PIPESTATUS[0]}

bounded "${BENCH_S:-150}" "$PYTHON" $NO_CWD benchmarks/gpu.py --repeat "${REPEAT:-30}" \
    --json "$RESULTS/benchmark.json" --markdown "$RESULTS/benchmark.md" 2>&1 \
    | tee "$RESULTS/benchmark.txt"
bench=${PIPESTATUS[0]}

OFFLINE=()
for file in tests/gpu/test_gpu_*.py; do
    case " ${DEVICE_TESTS[*]} " in *" $file "*) ;; *) OFFLINE+=("$file") ;; esac
done
bounded "${OFFLINE_S:-85}" "$PYTHON" $NO_CWD -c \
    'import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))' "${OFFLINE[@]}" -rs -q \
    -p no:cacheprovider --junitxml "$RESULTS/pytest-offline.xml" 2>&1 \
    | tee "$RESULTS/pytest-offline.txt"
offline=${PIPESTATUS[0]}

{
    echo "device tests exit $device_tests"
    echo "dlpack round trip exit $dlpack"
    echo "cuBLASLt epilogue A/B exit $lt_ab"
    echo "benchmark exit $bench"
    echo "offline tests exit $offline"
} | tee "$RESULTS/summary.txt"
echo "results in $RESULTS"
[ "$device_tests" -eq 0 ] && [ "$dlpack" -eq 0 ] && [ "$lt_ab" -eq 0 ] && [ "$bench" -eq 0 ] \
    && [ "$offline" -eq 0 ]
