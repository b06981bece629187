"""Input forwarding: which outputs an executable may write over which parameters' buffers.

TF forwards an input's buffer to an output when nothing else holds it; the launch op
does so for the pairs listed here. Output j may take parameter i's buffer when one
kernel computes it alone in its buffer, is parameter i's only reader and reads it only
at the output's index (elementwise, or through a row fusion's reduces), keeping dtype
and shape; that kernel is emitted without `noalias`. Each parameter and output is in
one pair at most. docs/architecture.md, the executable's ABI.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.passes.buffer_assignment import reads_only_elementwise

_NOT_KERNELS = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})


def output_donations(module: HloModule, assignment: Any, allowed: Collection[int]
                     ) -> tuple[tuple[int, int], ...]:
    """(output index, parameter number) pairs, in output order (module docstring), for
    the parameters in `allowed`."""
    entry = module.entry
    assert entry is not None and entry.root is not None
    root = entry.root
    outputs = list(root.operands) if root.opcode == "tuple" else [root]
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    for j, kernel in enumerate(outputs):
        if kernel.opcode in _NOT_KERNELS or kernel.shape.is_tuple:
            continue
        own = assignment.slice_of(kernel)
        if own.kind != "output" or own.index != j:
            continue
        if any(s.kind == "output" and s.index == j and name != kernel.name
               for name, s in assignment.slices.items()):
            continue
        for operand in kernel.operands:
            if operand.opcode != "parameter" or operand.parameter_number in taken \
                    or operand.parameter_number not in allowed:
                continue
            if operand.users != [kernel] or operand.shape != kernel.shape:
                continue
            if not all(reads_only_elementwise(kernel, m) for m, other
                       in enumerate(kernel.operands) if other is operand):
                continue
            pairs.append((j, operand.parameter_number))
            taken.add(operand.parameter_number)
            break
    return tuple(pairs)
