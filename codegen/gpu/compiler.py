"""The GPU backend's driver: an optimized, buffer-assigned HLO module → CUDA C → executable.

`emit_program` is pure Python (no CuPy, no GPU): it plans the kernels (`kernels.py`, then
`row_groups.py`), writes one CUDA translation unit (the prelude, the reducers and constant
arrays the kernels share, then every kernel) and the *thunk list* the executable runs: a
kernel launch, or a cuBLAS dot, per plan, in the entry computation's order. The device side
(NVRTC through `cupy.RawModule`, cached by a fingerprint of the source) is `executable.py`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tfxla_lite.codegen.gpu.columns import emit_column_reduction
from tfxla_lite.codegen.gpu.cuda_source import prelude
from tfxla_lite.codegen.gpu.elemental import ModuleTables
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.kernels import describe, plan_kernels, split_scratch
from tfxla_lite.codegen.gpu.linalg_template import emit_linalg
from tfxla_lite.codegen.gpu.multi_output import emit_multi_output
from tfxla_lite.codegen.gpu.random_template import emit_random
from tfxla_lite.codegen.gpu.row_groups import merge_row_groups
from tfxla_lite.codegen.gpu.sort import sort_scratch_bytes
from tfxla_lite.codegen.gpu.sort_template import emit_sort
from tfxla_lite.codegen.gpu.templates import TEMPLATES, KernelSource
from tfxla_lite.codegen.gpu.transpose import emit_transpose
from tfxla_lite.hlo.ir import HloModule

SCRATCH_ALIGNMENT = 256  # where the scratch area starts after the temp arena


@dataclass
class Thunk:
    """One step of the executable: launch `functions` (a kernel plan) or call a library."""

    plan: KernelPlan
    functions: list[str] = field(default_factory=list)  # empty for a dot


@dataclass
class GpuProgram:
    """Everything the device side needs, produced without a device."""

    module_name: str
    source: str
    thunks: list[Thunk]
    scratch_bytes: int  # after the temp arena; split reductions' partials, sort indices
    element_types: set[str]
    body: str = ""  # the source after the prelude: shared functions, constants, kernels

    @property
    def kernel_names(self) -> list[str]:
        return [name for thunk in self.thunks for name in thunk.functions]

    @property
    def kernel_count(self) -> int:
        """Kernels launched per run, library calls included (as the CPU backend counts)."""
        return sum(max(1, len(t.functions) - (1 if t.plan.vectorized else 0))
                   for t in self.thunks)

    def plan_text(self) -> str:
        return describe([t.plan for t in self.thunks])

    def fingerprint(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()


# The template of each plan kind (a `dot` has none: it is a library call).
KERNEL_TEMPLATES = {**TEMPLATES, "transpose": emit_transpose,
                    "column-reduction": emit_column_reduction,
                    "multi-output": emit_multi_output, "sort": emit_sort, "topk": emit_sort,
                    "linalg": emit_linalg, "random": emit_random}


def emit_plan(plan: KernelPlan, assignment: Any, tables: ModuleTables) -> KernelSource:
    """The CUDA text of one kernel plan (not a `dot`)."""
    return KERNEL_TEMPLATES[plan.kind](plan, assignment, tables)


def _element_types(module: HloModule) -> set[str]:
    types = set()
    for computation in module.computations:
        for inst in computation.instructions:
            shapes = inst.shape.tuple_shapes or (inst.shape,)
            types.update(s.element_type for s in shapes if not s.is_tuple)
    return types


def emit_program(module: HloModule, assignment: Any) -> GpuProgram:
    """The CUDA source and thunks of `module` (already optimized) under `assignment`."""
    entry = module.entry
    assert entry is not None and entry.root is not None
    for inst in entry.instructions:
        if inst.opcode in ("while", "conditional"):
            raise NotImplementedError(
                f"GPU backend: HLO {inst.opcode} (%{inst.name}) is not compiled for the GPU; "
                "the CPU backend compiles loops and conditionals")
    plans = merge_row_groups(plan_kernels(list(entry.instructions), assignment), assignment)
    tables = ModuleTables()
    kernels, thunks = [], []
    scratch = 0
    for plan in plans:
        if plan.kind == "dot":
            thunks.append(Thunk(plan))
            continue
        source = emit_plan(plan, assignment, tables)
        kernels.append(source.text)
        thunks.append(Thunk(plan, source.functions))
        if plan.kind == "split-reduction":
            scratch = max(scratch, split_scratch(plan)[1])
        scratch = max(scratch, sort_scratch_bytes(plan))
    types = _element_types(module)
    body = "\n".join([*tables.definitions, *kernels])
    return GpuProgram(module.name, prelude(types) + "\n" + body, thunks, scratch, types, body)
