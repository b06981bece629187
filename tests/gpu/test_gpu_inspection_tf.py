"""GPU clusters as inspectable as CPU ones, through `tfxla_lite.function` with TF on the
emulated GPU (`EmulatedGpuBackend`, `fake_cupy`; see `test_gpu_launch_tf.py`):

- dumps (`--dump_to`): a GPU cluster writes the CPU's HLO and buffer-assignment files
  and, instead of LLVM IR, its CUDA C (`.cu`) and kernel plan (`.kernel-plan.txt`);
  the report shows both; the dumped CUDA compiles with the nvcc command the plan gives;
- `experimental_get_compiler_ir`: stages 'cuda' and 'kernel_plan', the same texts as the
  dump; 'llvm' on a GPU-only function raises naming the stages there are; a function
  with a CPU and a GPU cluster gives each stage's text where it applies and a comment
  line where it does not;
- the dumped optimized HLO evaluated by the NumPy evaluator, and the mixed function run
  on the emulator, match TF's own results.

Only the mixed run launches kernels (on the emulator, 4x8 elements); the other tests
compile with `fake_cupy` and never run a kernel.
"""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from tolerances import assert_close

tf = pytest.importorskip("tensorflow", reason="no TensorFlow: the TF entry is not tested")

from emulated_backend import EmulatedGpuBackend  # noqa: E402

import tfxla_lite as tl  # noqa: E402
from tfxla_lite import flags  # noqa: E402
from tfxla_lite.codegen.gpu import executable as executable_module  # noqa: E402
from tfxla_lite.codegen.gpu.inspection import STAGES  # noqa: E402
from tfxla_lite.codegen.gpu.nvcc import find_nvcc  # noqa: E402
from tfxla_lite.hlo import parse_module  # noqa: E402
from tfxla_lite.hlo.evaluator import evaluate  # noqa: E402
from tfxla_lite.runtime import gpu_launch  # noqa: E402

GPU_SUFFIXES = {"before_optimizations.txt", "after_optimizations.txt",
                "buffer-assignment.txt", "cu", "kernel-plan.txt"}
CPU_SUFFIXES = {"before_optimizations.txt", "after_optimizations.txt",
                "buffer-assignment.txt", "ir-no-opt.ll", "ir-with-opt.ll"}
MODULE_FILE = re.compile(r"^(module_\d{4}\..+?)\.(before_optimizations\.txt|"
                         r"after_optimizations\.txt|buffer-assignment\.txt|cu|"
                         r"kernel-plan\.txt|ir-no-opt\.ll|ir-with-opt\.ll)$")
KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(')


def _install(monkeypatch: pytest.MonkeyPatch, emulate: bool) -> None:
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("TF has a real GPU, whose tensors the emulator cannot read")
    monkeypatch.delenv(flags.ENVIRONMENT_VARIABLE, raising=False)
    flags.PROCESS_OPTIONS.reset()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy.module(emulate=emulate))
    monkeypatch.setattr(executable_module, "_modules", {})
    monkeypatch.setattr(fake_cupy, "RECORDER", fake_cupy.Recorder())


@pytest.fixture
def compile_only(monkeypatch: pytest.MonkeyPatch) -> object:
    """TF 'has' GPU:0; CuPy is the stand-in that checks launches but runs no kernel
    (these tests only compile)."""
    _install(monkeypatch, emulate=False)
    with gpu_launch.use_backend(EmulatedGpuBackend()):
        yield
    flags.PROCESS_OPTIONS.reset()


def on_gpu(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    with tf.device("/GPU:0"):
        return tf.nn.softmax(x * 2.0 + y, axis=-1)


def mixed(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """One cluster on the CPU, one on the GPU (clusters never mix devices)."""
    with tf.device("/CPU:0"):
        a = tf.tanh(x) * y + 1.0
    with tf.device("/GPU:0"):
        return tf.nn.softmax(a * 2.0, axis=-1) - y


def _arguments() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(3)
    return (tf.constant(rng.standard_normal((4, 8)).astype(np.float32)),
            tf.constant(rng.standard_normal(8).astype(np.float32)))


def _modules(directory: Path) -> dict[str, dict[str, str]]:
    """{module prefix: {suffix: text}} of every module_NNNN.* file."""
    modules: dict[str, dict[str, str]] = {}
    for path in sorted(directory.iterdir()):
        match = MODULE_FILE.match(path.name)
        if match:
            modules.setdefault(match[1], {})[match[2]] = path.read_text()
    return modules


def _dumped(directory: Path, function: object) -> tl.Function:
    compiled = tl.function(function, jit_compile=True,
                           options=tl.Options(dump_to=str(directory)))
    compiled.get_concrete_function(*_arguments())  # traces and compiles; runs nothing
    return compiled


def test_gpu_cluster_dumps_hlo_buffers_cuda_and_kernel_plan(compile_only: object,
                                                            tmp_path: Path) -> None:
    _dumped(tmp_path, on_gpu)
    modules = _modules(tmp_path)
    assert len(modules) == 1
    (prefix, files), = modules.items()
    assert set(files) == GPU_SUFFIXES  # no LLVM IR: the kernels are CUDA C
    assert "__inference_on_gpu_" in prefix and prefix.endswith("_cluster_0")
    before = parse_module(files["before_optimizations.txt"])
    after = parse_module(files["after_optimizations.txt"])
    assert not any(i.opcode == "fusion" for i in before.entry.instructions)
    assert any(i.opcode == "fusion" for i in after.entry.instructions)
    assert files["buffer-assignment.txt"].startswith("BufferAssignment:")

    cuda, plan = files["cu"], files["kernel-plan.txt"]
    kernels = KERNEL.findall(cuda)
    assert kernels
    listed = [name for line in plan.splitlines() if "CUDA functions: " in line
              for name in line.split("CUDA functions: ")[1].split(", ")]
    assert sorted(listed) == sorted(kernels)
    assert plan.startswith(f"Kernel plan of {after.name} for GPU:0:")
    assert f"nvcc -ptx -arch=sm_80 --std=c++17 {prefix}.cu" in plan  # why no PTX, and how

    # The dumped optimized HLO is what the cluster computes: TF's softmax.
    x, y = _arguments()
    parameters = {p.shape.dims: n for n, p in enumerate(after.entry.parameters)}
    args = [None] * len(parameters)
    for value in (x.numpy(), y.numpy()):
        args[parameters[value.shape]] = value
    result = evaluate(after, *args)
    result = result[0] if isinstance(result, (list, tuple)) else result
    assert_close(np.asarray(result), on_gpu(x, y).numpy(), "Softmax")

    page = (tmp_path / "report.html").read_text()
    assert "cluster_0 on GPU:0" in page and "GPU kernels" in page
    assert html.escape(cuda) in page and html.escape(plan) in page
    assert f'href="{prefix}.cu">cu</a>' in page
    assert f'href="{prefix}.kernel-plan.txt">kernel-plan</a>' in page


@pytest.mark.skipif(find_nvcc() is None, reason="no nvcc")
def test_dumped_cuda_compiles_with_the_plans_nvcc_command(compile_only: object,
                                                          tmp_path: Path) -> None:
    _dumped(tmp_path, on_gpu)
    (prefix, files), = _modules(tmp_path).items()
    line = next(line for line in files["kernel-plan.txt"].splitlines() if "nvcc -ptx" in line)
    command = line[line.index("nvcc -ptx"):].split()
    command[0] = find_nvcc() or "nvcc"
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    ptx = (tmp_path / f"{prefix}.ptx").read_text()
    for kernel in KERNEL.findall(files["cu"]):
        assert f".entry {kernel}(" in ptx


def test_compiler_ir_stages_of_a_gpu_cluster(compile_only: object, tmp_path: Path) -> None:
    function = _dumped(tmp_path, on_gpu)
    (prefix, files), = _modules(tmp_path).items()
    ir = function.experimental_get_compiler_ir(*_arguments())
    assert ir(stage="hlo") == files["before_optimizations.txt"]
    assert ir(stage="optimized_hlo") == files["after_optimizations.txt"]
    assert ir(stage="buffer_assignment") == files["buffer-assignment.txt"]
    assert ir(stage="cuda") == files["cu"]
    assert ir(stage="kernel_plan") == files["kernel-plan.txt"].replace(
        f"{prefix}.cu", "<module>.cu")
    for stage in ("llvm", "llvm_unoptimized"):
        with pytest.raises(ValueError) as raised:
            ir(stage=stage)
        message = str(raised.value)
        assert f"stage {stage!r} does not apply" in message
        assert f"cluster_0 on GPU:0 (stages {', '.join(STAGES)})" in message
    with pytest.raises(ValueError, match="unknown stage 'ptx'; stages are hlo, .*llvm.*, "
                                         "cuda, kernel_plan"):
        ir(stage="ptx")


def test_compiler_ir_and_dumps_of_a_function_with_cpu_and_gpu_clusters(
        compile_only: object, tmp_path: Path) -> None:
    function = _dumped(tmp_path, mixed)
    modules = _modules(tmp_path)
    kinds = sorted(frozenset(files) for files in modules.values())
    assert kinds == sorted([frozenset(CPU_SUFFIXES), frozenset(GPU_SUFFIXES)])
    cpu = next(f for f in modules.values() if "ir-no-opt.ll" in f)
    gpu = next(f for f in modules.values() if "cu" in f)

    report = function.explain(*_arguments())
    names = [c.name for c in report.clusters]
    assert len(names) == 2 and all(c.compiled for c in report.clusters)
    ir = function.experimental_get_compiler_ir(*_arguments())
    hlo = ir(stage="hlo")
    assert cpu["before_optimizations.txt"] in hlo and gpu["before_optimizations.txt"] in hlo
    llvm = ir(stage="llvm")
    assert cpu["ir-with-opt.ll"] in llvm
    notes = [line for line in llvm.splitlines() if line.startswith("; cluster_")]
    assert len(notes) == 1 and "runs on GPU:0: no llvm stage; its code is stage 'cuda'" \
        in notes[0]
    cuda = ir(stage="cuda")
    assert gpu["cu"] in cuda and "ir-no-opt" not in cuda
    notes = [line for line in cuda.splitlines() if line.startswith("// cluster_")]
    assert len(notes) == 1 and "runs on CPU: no cuda stage; its code is stage 'llvm'" \
        in notes[0]
    plan = ir(stage="kernel_plan")
    assert plan.count("Kernel plan of ") == 1 and "# cluster_" in plan

    page = (tmp_path / "report.html").read_text()
    assert page.count("GPU kernels") == 1 and "on GPU:0" in page


@pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")
def test_a_function_with_cpu_and_gpu_clusters_runs_as_tf(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    _install(monkeypatch, emulate=True)
    with gpu_launch.use_backend(EmulatedGpuBackend()):
        function = tl.function(mixed, jit_compile=True)
        args = _arguments()
        got = function(*args)
        types = [op.type for op in function.get_concrete_function(*args).graph
                 .get_operations()]
    assert types.count("TfxlaLiteLaunch") == 1 and types.count("EagerPyFunc") == 1
    assert fake_cupy.RECORDER.launches  # the GPU cluster ran on the emulator
    assert_close(got.numpy(), mixed(*args).numpy(), "Softmax")

