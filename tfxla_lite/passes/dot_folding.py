"""Dot folding (`dot-folding`): the data movement TF lowering puts around dots, folded
into the dots' dimension numbers.

As XLA's TransposeFolding and DotDecomposer: a broadcast weight operand, a batch summed
by the dot's only reader, a batch dimension merged by reshapes, and a transposed operand
GEMM can read in place each become part of the dot (docs/architecture.md,
`dot-folding`). Only the summed batch reassociates a float sum (within the dot
tolerance), which is why this is not part of the bit-exact `simplify`. Needs a module
that verifies, before fusion; the module still verifies after.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import infer_shape
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.simplify import remove_if_dead

_GEMM_TYPES = ("f32", "f64")
_KEYS = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")


def _dims(inst: Instruction, key: str) -> tuple[int, ...]:
    return tuple(inst.attributes.get(key, ()))


def _new_dot(like: Instruction, shape: Shape, operands: list[Instruction],
             lhs_batch: tuple[int, ...], rhs_batch: tuple[int, ...],
             lhs_contracting: tuple[int, ...], rhs_contracting: tuple[int, ...]
             ) -> Instruction | None:
    """A dot next to `like` (carrying its metadata), if its shape is `shape`."""
    values = (lhs_batch, rhs_batch, lhs_contracting, rhs_contracting)
    attributes = {key: value for key, value in zip(_KEYS, values) if value}
    if infer_shape("dot", [o.shape for o in operands], attributes) != shape:
        return None
    assert like.parent is not None
    return like.parent.create("dot", operands, metadata=like.metadata, **attributes)


def fold_broadcast_operand(dot: Instruction) -> Instruction | None:
    """`dot(x, broadcast(w))` over the broadcast's batch copies → `dot(x, w)`, or None."""
    lhs, rhs = dot.operands
    if rhs.opcode != "broadcast" or dot.shape.element_type not in _GEMM_TYPES:
        return None
    lhs_batch, rhs_batch = _dims(dot, "lhs_batch_dims"), _dims(dot, "rhs_batch_dims")
    if not rhs_batch:
        return None
    mapped = tuple(rhs.dimensions)  # weight dim i is rhs dim mapped[i]
    if list(mapped) != sorted(set(mapped)):
        return None  # the broadcast also transposes
    if set(mapped) | set(rhs_batch) != set(range(rhs.shape.rank)) or set(mapped) & set(rhs_batch):
        return None  # some non-batch dimension is broadcast too, or a batch one is not
    lhs_contracting = _dims(dot, "lhs_contracting_dims")
    lhs_free = [d for d in range(lhs.shape.rank) if d not in lhs_batch and d not in lhs_contracting]
    if list(lhs_batch) + lhs_free != sorted(list(lhs_batch) + lhs_free):
        return None  # the plain dot would order x's dimensions differently
    weight_dim = {r: w for w, r in enumerate(mapped)}
    rhs_contracting = tuple(weight_dim[d] for d in _dims(dot, "rhs_contracting_dims"))
    return _new_dot(dot, dot.shape, [lhs, rhs.operand(0)], (), (), lhs_contracting,
                    rhs_contracting)


def _is_add_of_zero(reduce: Instruction) -> bool:
    """A reduce that sums with init 0: its computation adds its two parameters."""
    if len(reduce.operands) != 2 or reduce.shape.is_tuple:
        return False
    init = reduce.operand(1)
    if init.opcode != "constant" or init.literal.shape != () or float(init.literal) != 0.0:
        return False
    root = reduce.called_computations[0].root
    return (root is not None and root.opcode == "add" and len(root.operands) == 2
            and {o.opcode for o in root.operands} == {"parameter"}
            and root.operand(0) is not root.operand(1))


def fold_reduced_batch(reduce: Instruction) -> Instruction | None:
    """`reduce(dot(a, c), batch dimensions, add, 0)` → one dot contracting them too."""
    dot = reduce.operand(0)
    if dot.opcode != "dot" or len(dot.users) != 1 or not _is_add_of_zero(reduce):
        return None
    if dot.shape.element_type not in _GEMM_TYPES or reduce.shape.element_type != \
            dot.shape.element_type:
        return None
    lhs_batch, rhs_batch = _dims(dot, "lhs_batch_dims"), _dims(dot, "rhs_batch_dims")
    if not lhs_batch or sorted(reduce.dimensions) != list(range(len(lhs_batch))):
        return None  # the dot's batch dimensions lead its result; all of them, only them
    return _new_dot(dot, reduce.shape, list(dot.operands), (), (),
                    lhs_batch + _dims(dot, "lhs_contracting_dims"),
                    rhs_batch + _dims(dot, "rhs_contracting_dims"))


def _leading_merge(reshape: Instruction) -> tuple[int, ...] | None:
    """The leading dimensions of the reshape's operand that it merges into its dimension
    0 (at least two), keeping every other dimension as it is; None otherwise."""
    source, target = reshape.operand(0).shape.dims, reshape.shape.dims
    count = len(source) - len(target) + 1
    if count < 2 or source[count:] != target[1:] or math.prod(source[:count]) != target[0]:
        return None
    return source[:count]


def split_merged_batch(dot: Instruction) -> Instruction | None:
    """`dot(reshape(x), reshape(y))` over a merged batch → `reshape(dot(x, y))`, or None."""
    lhs, rhs = dot.operands
    if _dims(dot, "lhs_batch_dims") != (0,) or _dims(dot, "rhs_batch_dims") != (0,):
        return None
    if lhs.opcode != "reshape" or rhs.opcode != "reshape" or \
            dot.shape.element_type not in _GEMM_TYPES:
        return None
    if not dot.users or any(user.opcode != "reshape" for user in dot.users):
        return None  # a new reshape of the result would be a copy of its own
    merged = _leading_merge(lhs)
    if merged is None or _leading_merge(rhs) != merged:
        return None
    extra = len(merged) - 1
    batch = tuple(range(len(merged)))
    split_shape = dot.shape.with_dims(merged + dot.shape.dims[1:])
    split = _new_dot(dot, split_shape, [lhs.operand(0), rhs.operand(0)],
                     batch, batch,
                     tuple(d + extra for d in _dims(dot, "lhs_contracting_dims")),
                     tuple(d + extra for d in _dims(dot, "rhs_contracting_dims")))
    if split is None:
        return None
    assert split.parent is not None
    return split.parent.create("reshape", [split], shape=dot.shape, metadata=dot.metadata)


def gemm_layout(dims: tuple[int, ...], rows: tuple[int, ...], cols: tuple[int, ...]) -> bool:
    """Whether a row-major array of `dims` is a matrix (rows × cols) GEMM reads with a
    transpose flag and a leading dimension: each group flattens to one stride, and one
    of them is contiguous (the rule of `codegen/cpu/dot.py`'s `_matrix`)."""
    strides = [math.prod(dims[d + 1:]) for d in range(len(dims))]

    def stride(group: tuple[int, ...]) -> int | None:
        nontrivial = [d for d in group if dims[d] != 1]
        if not nontrivial:
            return 1
        for outer, inner in itertools.pairwise(nontrivial):
            if strides[outer] != strides[inner] * dims[inner]:
                return None
        return strides[nontrivial[-1]]

    row_stride, col_stride = stride(rows), stride(cols)
    n_rows, n_cols = math.prod(dims[d] for d in rows), math.prod(dims[d] for d in cols)
    if row_stride is None or col_stride is None:
        return False
    return (col_stride == 1 and row_stride >= n_cols) or (row_stride == 1 and col_stride >= n_rows)


def fold_transposed_operand(dot: Instruction) -> Instruction | None:
    """`dot(transpose(x), y)` or `dot(x, transpose(y))` → a dot of the untransposed
    operand with mapped dimension numbers, or None."""
    if dot.shape.element_type not in _GEMM_TYPES:
        return None
    numbers = [_dims(dot, key) for key in _KEYS]  # lhs batch, rhs batch, lhs c., rhs c.
    for side in (0, 1):
        operand = dot.operand(side)
        if operand.opcode != "transpose":
            continue
        permutation = operand.dimensions  # operand dim d is source dim permutation[d]
        batch, contracting = numbers[side], numbers[2 + side]
        free = [d for d in range(operand.shape.rank) if d not in batch and d not in contracting]
        new_free = tuple(permutation[d] for d in free)
        if list(new_free) != sorted(new_free):
            continue  # the result would order the free dimensions differently
        new_contracting = tuple(permutation[d] for d in contracting)
        source = operand.operand(0)
        rows, cols = (new_free, new_contracting) if side == 0 else (new_contracting, new_free)
        if not gemm_layout(source.shape.dims, rows, cols):
            continue  # the transposed copy is what makes it one GEMM per batch element
        new = list(numbers)
        new[side] = tuple(permutation[d] for d in batch)
        new[2 + side] = new_contracting
        operands = list(dot.operands)
        operands[side] = source
        return _new_dot(dot, dot.shape, operands, *new)
    return None


_DOT_REWRITES = (fold_broadcast_operand, split_merged_batch, fold_transposed_operand)


def fold_computation(computation: Computation) -> bool:
    """Apply the rewrites until none applies; True when anything changed."""
    changed = False
    worklist = list(computation.instructions)
    while worklist:
        inst = worklist.pop(0)
        if inst.parent is not computation:
            continue  # removed by an earlier rewrite
        rewrites = _DOT_REWRITES if inst.opcode == "dot" else \
            (fold_reduced_batch,) if inst.opcode == "reduce" else ()
        for rewrite in rewrites:
            new = rewrite(inst)
            if new is None:
                continue
            inst.replace_all_uses_with(new)
            remove_if_dead(computation, inst)
            # The new dot may fold further (a split batch exposes transposes).
            worklist.extend(i for i in (new, *new.operands) if i.opcode == "dot")
            changed = True
            break
    if changed:
        computation.sort()
    return changed


@dataclass(frozen=True)
class DotFolding(Pass):
    """Needs: a module that verifies, before fusion. Guarantees: see the module doc."""

    name: ClassVar[str] = "dot-folding"

    def run(self, module: HloModule) -> bool:
        changed = False
        for computation in list(module.computations):
            if not computation.is_fusion_computation:
                changed |= fold_computation(computation)
        return changed
