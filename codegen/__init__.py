"""Backends of tfxla-lite: HLO module → `Executable` (CPU through LLVM via llvmlite).

The third stage of the compiler core, after `tfxla_lite.hlo` and `tfxla_lite.passes`:
`compile_module` runs the pass pipeline and buffer assignment, then hands the module
to the CPU backend (`tfxla_lite.codegen.cpu`). Imports no TensorFlow.
"""

from __future__ import annotations

from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.ir import HloModule


def compile_module(module: HloModule, pipeline: str | None = None,
                   verify: bool = False, threads: int | None = None,
                   cache: bool | None = None) -> Executable:
    """Optimize `module` in place, assign its buffers and compile it for this CPU.

    `pipeline` is handed to `tfxla_lite.passes.optimize` (None: its default
    pipeline); `verify` runs the HLO verifier on the input and after every pass;
    `threads` is how many threads big kernels use (None: every CPU; 1: serial);
    `cache` turns the compile caches on or off (None: as `TFXLA_LITE_CACHE` says,
    both by default; see `tfxla_lite.codegen.cache`): a module whose optimized HLO,
    buffer assignment and thread count were compiled before, in this process or in
    an earlier one, reuses that machine code without any LLVM work.
    """
    from tfxla_lite.codegen import cpu
    from tfxla_lite.hlo.verifier import verify as verify_module
    from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize

    hlo_text = module.to_text()
    if verify:
        verify_module(module)
    optimize(module, DEFAULT_PIPELINE if pipeline is None else pipeline, verify=verify)
    optimized_hlo_text = module.to_text()
    assignment = assign_buffers(module)
    return cpu.compile(module, assignment, hlo_text=hlo_text,
                       optimized_hlo_text=optimized_hlo_text, threads=threads,
                       cache=cache)


__all__ = ["Executable", "compile_module"]
