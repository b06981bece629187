"""Input forwarding: which outputs an executable may write over which parameters' buffers.

TF forwards an input tensor's buffer to an output (`forward_input_or_allocate_output`)
when nothing else holds the input; the launch op (`runtime/launch_op.cc`) does so for
the pairs listed here, saving an allocation and the writes to fresh memory. A pair
(output j, parameter i) is listed when writing output j over parameter i cannot change
what the executable computes:

- output j is computed by one array-shaped kernel K, and nothing else lives in output
  j's buffer (buffer assignment may host a temp there, which would overwrite the
  parameter before K reads it);
- K is parameter i's only reader and reads it through elementwise ops at the output
  index only (or through a row fusion's reduces, which finish a row before it is
  stored: `buffer_assignment.reads_only_elementwise`), and keeps its dtype and shape.

Codegen emits such a K without `noalias` on its output, so that LLVM keeps every read
of an element before the write to it. Each parameter and each output is in one pair
at most.
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
