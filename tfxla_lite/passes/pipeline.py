"""The pass pipeline: which passes run, in which order, and why, in one place.

`optimize(module)` is what codegen calls between TF lowering and buffer
assignment. The same list is spelled as text (`"simplify,constant-folding,cse,..."`)
for the CLI (`tfxla-lite opt -p`), the flags and the tests; `PASSES` maps each
name to its class.
"""

from __future__ import annotations

from tfxla_lite.hlo.dynamic_padder import pad_dynamic
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.verifier import VerificationError, verify
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.call_inliner import CallInliner
from tfxla_lite.passes.constant_folding import ConstantFolding
from tfxla_lite.passes.control_flow import (
    SliceAccumulation,
    WhileLoopInvariantCodeMotion,
    optimize_called_computations,
)
from tfxla_lite.passes.cse import CommonSubexpressionElimination
from tfxla_lite.passes.dce import DeadCodeElimination
from tfxla_lite.passes.dot_folding import DotFolding
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.multi_output_fusion import MultiOutputFusion
from tfxla_lite.passes.output_copies import AddOutputCopies
from tfxla_lite.passes.output_fusion import OutputFusion
from tfxla_lite.passes.row_fusion import RowFusion
from tfxla_lite.passes.scheduler import MemoryScheduler
from tfxla_lite.passes.simplify import AlgebraicSimplifier
from tfxla_lite.passes.while_dot_hoist import WhileDotHoisting

# call-inliner: every pass below, and codegen, works on one straight-line computation.
# simplify: drop the identities lowering leaves (same-shape reshapes, x * 1, transposes
#      that undo each other), fold arithmetic on broadcast scalar constants.
# constant-folding: evaluate what depends on constants only (small results).
# cse: lowering repeats work (each TF op lowers on its own) and folding makes equal
#      constants; one instruction per value.
# while-licm: loop-invariant work leaves loop bodies (control_flow.py); after cse, so
#      that equal invariant values are hoisted once.
# slice-accumulation: a list of zeros with one item set, added to a list (a TensorList
#      gradient in a loop), adds that item alone (control_flow.py); before fusion, which
#      would fuse the whole-list add.
# dot-folding: the broadcasts, batch sums, reshapes and transposes TF puts around
#      dots read as the dots' own dimension numbers (one GEMM instead of a batch of
#      small ones, no copy kernel), before fusion gathers them into kernels; after
#      cse, which merges the broadcasts of one weight.
# simplify: CSE makes operands identical (x - x, select(p, a, a)); clean those up,
#      and the reshape pairs dot-folding leaves.
# dce: what the rewrites left unused; dropping it first keeps fusion from building
#      kernels nobody reads.
# fuse-rows: row reductions (softmax, layer norm) with the work between and after them
#      as one kernel that runs every stage on a row while it is in the cache; before
#      fuse, which would cut the chain at every reduce.
# fuse: one kernel per fusible group (kLoop, kInput around reductions).
# output-fusion: a dot and its elementwise epilogue (bias, scale, activation) as one
#      kOutput kernel; after fuse, which gathered each epilogue into a kLoop fusion.
# multi-output-fusion: kernels that read the same array (sibling reductions, loops),
#      or a producer and the reduction that reads it, as one kernel with a tuple result;
#      after the fusions that decide each kernel's root.
# dce: fusion leaves the computations of cloned producers' old users behind.
# add-output-copies: so every output has its own buffer for buffer assignment.
# schedule: last, the instruction order (live ranges, kernel order) with the smallest
#      temp arena, as XLA schedules just before buffer assignment.
DEFAULT_PIPELINE = (
    "call-inliner,simplify,constant-folding,cse,while-licm,slice-accumulation,dot-folding,"
    "simplify,dce,fuse-rows,fuse,"
    "output-fusion,multi-output-fusion,dce,"
    "add-output-copies,schedule")
# Not in the default pipeline: `while-dot-hoist` (while_dot_hoist.py; its docstring says
# why), which a `pipeline` option names after while-licm.

PASSES: dict[str, type[Pass]] = {
    cls.name: cls for cls in (AlgebraicSimplifier, ConstantFolding,
                              CommonSubexpressionElimination, DeadCodeElimination, Fusion,
                              OutputFusion, AddOutputCopies, RowFusion, MemoryScheduler,
                              MultiOutputFusion, CallInliner, DotFolding,
                              WhileLoopInvariantCodeMotion, WhileDotHoisting,
                              SliceAccumulation)
}


def parse_pipeline(text: str) -> list[Pass]:
    """Passes from their comma-separated names, e.g. `"dce,fuse"`; blanks are ignored."""
    passes = []
    for name in (part.strip() for part in text.split(",")):
        if not name:
            continue
        if name not in PASSES:
            raise ValueError(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}")
        passes.append(PASSES[name]())
    return passes


def optimize(module: HloModule, pipeline: str = DEFAULT_PIPELINE,
             verify: bool = False) -> HloModule:
    """Run `pipeline` on `module` in place and return it; with `verify`, check after each pass.

    The entry is optimized first; then each computation its whiles and conditionals
    call, as an entry of its own (`control_flow.optimize_called_computations`), by the
    same pipeline less `add-output-copies`: a called computation's results go where its
    caller's loop or branch says (`codegen/cpu/control_flow.py`)."""
    if verify:
        _verify(module, "before the pipeline")
    # Dynamic dimensions become buffers at their bound and sizes as values, first: the
    # passes and backends know static shapes only (a dynamic result is refused here).
    pad_dynamic(module)
    for hlo_pass in parse_pipeline(pipeline):
        hlo_pass.run(module)
        if verify:
            _verify(module, f"after pass {hlo_pass.name}")
    called = ",".join(name for name in (part.strip() for part in pipeline.split(","))
                      if name != AddOutputCopies.name)
    optimize_called_computations(module, lambda scratch: optimize(scratch, called))
    if verify:
        _verify(module, "after optimizing called computations")
    return module


def _verify(module: HloModule, when: str) -> None:
    try:
        verify(module)
    except VerificationError as error:
        raise VerificationError(f"{when}: {error}") from None
