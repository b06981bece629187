"""The GPU backend: CUDA C per fused kernel, cuBLAS dots through CuPy.

Takes the same optimized, fused, buffer-assigned HLO module as the CPU backend
(`tfxla_lite.codegen.cpu`). Layout: `cuda_source.py` (types, literals, the prelude),
`elemental.py`, `data_movement.py` and `bit_ops.py` (element generators, one per opcode:
`EMITTERS`), `kernel_plan.py` (the plan of one kernel), `kernels.py` (which template
each kernel uses, launch geometry; `sort.py` for sort and topk, `linalg.py` for cholesky
and triangular-solve, `random_bits.py` for rng-bit-generator), `row_groups.py`
(consecutive kernels over the same rows merged into one), `templates.py` and the modules
beside it (`transpose.py`, `columns.py`, `multi_output.py`, `sort_template.py`,
`linalg_template.py`, `random_template.py`: the `__global__` functions), `compiler.py`
(the template of each plan kind, the module's source and thunk list), `executable.py`
(`GpuExecutable`: the buffer plan on one device arena, NVRTC through `cupy.RawModule`,
launches), `gemm.py` (dots as cuBLAS strided-batched GEMMs), `lt_epilogue.py` and
`cublaslt.py` (dot epilogues cuBLASLt fuses, and its ctypes binding), `nvcc.py` (offline
PTX checks with nvcc).

Everything up to the CUDA text is plain Python: it imports neither CuPy nor TensorFlow,
so it is tested (and its output compiled by nvcc) on machines without a GPU. CuPy is
imported only when an executable is built or run (`pip install tfxla-lite[gpu]`).
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.compiler import GpuProgram, emit_program
from tfxla_lite.codegen.gpu.elemental import EMITTERS
from tfxla_lite.hlo.ir import HloModule


def is_available() -> bool:
    """Whether CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
    except Exception:  # noqa: BLE001 - any import failure means no GPU backend
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001 - no driver, no device
        return False


def compile_module(module: HloModule, pipeline: str | None = None, verify: bool = False,
                   cache: bool | None = None) -> Any:
    """Optimize `module` in place, assign its buffers and compile it for the GPU: the GPU
    twin of `tfxla_lite.codegen.compile_module` (returns a `GpuExecutable`)."""
    program, assignment, texts = emit_module(module, pipeline, verify)
    from tfxla_lite.codegen.gpu.executable import GpuExecutable

    return GpuExecutable.build(module, assignment, program, hlo_text=texts[0],
                               optimized_hlo_text=texts[1], cache=cache)


def emit_module(module: HloModule, pipeline: str | None = None, verify: bool = False
                ) -> tuple[GpuProgram, Any, tuple[str, str]]:
    """Optimize and assign `module` as `compile_module` does and emit its CUDA, with no
    device: (program, buffer assignment, (HLO text before, after the passes))."""
    from tfxla_lite.hlo.verifier import verify as verify_module
    from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize

    hlo_text = module.to_text()
    if verify:
        verify_module(module)
    optimize(module, DEFAULT_PIPELINE if pipeline is None else pipeline, verify=verify)
    optimized = module.to_text()
    assignment = assign_buffers(module)
    return emit_program(module, assignment), assignment, (hlo_text, optimized)


__all__ = ["EMITTERS", "GpuProgram", "compile_module", "emit_module", "emit_program",
           "is_available"]
