"""The pass pipeline: which passes run, in which order, and why, in one place.

`optimize(module)` is what codegen calls between TF lowering and buffer
assignment. The same list is spelled as text (`"simplify,constant-folding,cse,..."`)
for the CLI (`tfxla-lite opt -p`), the flags and the tests; `PASSES` maps each
name to its class.
"""

from __future__ import annotations

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.verifier import VerificationError, verify
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.constant_folding import ConstantFolding
from tfxla_lite.passes.cse import CommonSubexpressionElimination
from tfxla_lite.passes.dce import DeadCodeElimination
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.output_copies import AddOutputCopies
from tfxla_lite.passes.simplify import AlgebraicSimplifier

# simplify: drop the identities lowering leaves (same-shape reshapes, x * 1, transposes
#      that undo each other), fold arithmetic on broadcast scalar constants.
# constant-folding: evaluate what depends on constants only (small results).
# cse: lowering repeats work (each TF op lowers on its own) and folding makes equal
#      constants; one instruction per value.
# simplify: CSE makes operands identical (x - x, select(p, a, a)); clean those up.
# dce: what the rewrites left unused; dropping it first keeps fusion from building
#      kernels nobody reads.
# fuse: one kernel per fusible group (kLoop, kInput around reductions).
# dce: fusion leaves the computations of cloned producers' old users behind.
# add-output-copies: last, so every output has its own buffer for buffer assignment.
DEFAULT_PIPELINE = "simplify,constant-folding,cse,simplify,dce,fuse,dce,add-output-copies"

PASSES: dict[str, type[Pass]] = {
    cls.name: cls for cls in (AlgebraicSimplifier, ConstantFolding,
                              CommonSubexpressionElimination, DeadCodeElimination, Fusion,
                              AddOutputCopies)
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
    """Run `pipeline` on `module` in place and return it; with `verify`, check after each pass."""
    if verify:
        _verify(module, "before the pipeline")
    for hlo_pass in parse_pipeline(pipeline):
        hlo_pass.run(module)
        if verify:
            _verify(module, f"after pass {hlo_pass.name}")
    return module


def _verify(module: HloModule, when: str) -> None:
    try:
        verify(module)
    except VerificationError as error:
        raise VerificationError(f"{when}: {error}") from None
