"""Backends of tfxla-lite: HLO module → `Executable` (CPU through LLVM via llvmlite).

The third stage of the compiler core, after `tfxla_lite.hlo` and `tfxla_lite.passes`:
`compile_module` runs the pass pipeline and buffer assignment, then hands the module
to the CPU backend (`tfxla_lite.codegen.cpu`). Imports no TensorFlow.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.ir import HloModule


def compile_module(module: HloModule, pipeline: Any = None) -> Executable:
    """Optimize `module` in place, assign its buffers and compile it for this CPU.

    `pipeline` is handed to `tfxla_lite.passes.optimize` (None: its default pipeline).
    """
    # Imported here so that codegen loads (and its tests run) without the passes.
    from tfxla_lite.codegen import cpu
    from tfxla_lite.passes import assign_buffers, optimize

    hlo_text = module.to_text()
    if pipeline is None:
        optimize(module)
    else:
        optimize(module, pipeline)
    optimized_hlo_text = module.to_text()
    assignment = assign_buffers(module)
    return cpu.compile(module, assignment, hlo_text=hlo_text,
                       optimized_hlo_text=optimized_hlo_text)


__all__ = ["Executable", "compile_module"]
