"""The algebraic simplifier: small local rewrites, driven by a worklist.

Runs first in the default pipeline, on what TF lowering produced: it removes the
identities lowering leaves behind (reshapes to the same shape, converts to the
same type, transposes that undo each other), folds arithmetic on broadcast
scalar constants, and turns reduces over size-1 dimensions into elementwise
ops that fusion can merge. Each rewrite is a small function of one instruction,
registered in `REWRITES` under its name and the opcodes it looks at (house
habit 4), in the spirit of XLA's `algebraic_simplifier.cc`.

Every rewrite is exact: the result is the same bits for every input, -0.0, ±inf
and NaN included (NaN payloads aside). So `x + 0.0 → x` is *not* here for
floats (`-0.0 + 0.0` is `+0.0`); `x + (-0.0) → x` and `x - 0.0 → x` are. `x * 0`,
`x - x` and `x == x` fold only for integers, and a dot with an identity matrix
only for integers (`inf * 0` and `-0.0 + 0.0` spoil it for floats).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tfxla_lite.hlo.evaluator import REFERENCES
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_elementwise
from tfxla_lite.hlo.shape import FLOAT_TYPES, INTEGER_TYPES
from tfxla_lite.passes.base import Pass

# A rewrite returns the instruction that replaces its argument (new or existing,
# of the same shape), or None when it does not apply.
Rewrite = Callable[[Instruction], "Instruction | None"]


@dataclass(frozen=True)
class RewriteRule:
    name: str
    opcodes: tuple[str, ...]
    fn: Rewrite


REWRITES: dict[str, RewriteRule] = {}


def _rewrite(*opcodes: str) -> Callable[[Rewrite], Rewrite]:
    def register(fn: Rewrite) -> Rewrite:
        name = fn.__name__.lstrip("_").replace("_", "-")
        REWRITES[name] = RewriteRule(name, opcodes, fn)
        return fn

    return register


# -- reading constants ------------------------------------------------------------------

def _bits(array: np.ndarray) -> np.ndarray:
    """The raw bits of each element, so that -0.0 != 0.0 and NaN == the same NaN."""
    array = np.ascontiguousarray(array)
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def splat_value(inst: Instruction) -> np.ndarray | None:
    """The one value every element of `inst` holds (a 0-d array), when that is known:
    a non-empty constant whose elements are bitwise equal, or a broadcast of one."""
    while inst.opcode == "broadcast":
        inst = inst.operand(0)
    if inst.opcode != "constant" or inst.literal.size == 0:
        return None
    flat = inst.literal.reshape(-1)
    bits = _bits(flat)
    if not np.all(bits == bits[0]):
        return None
    return flat[:1].reshape(())


def is_splat_of(inst: Instruction, value: object) -> bool:
    """Whether every element of `inst` has exactly the bits of `value` in its type."""
    splat = splat_value(inst)
    if splat is None:
        return False
    return bool(_bits(splat) == _bits(np.asarray(value).astype(splat.dtype)))


def _is_float(inst: Instruction) -> bool:
    return inst.shape.element_type in FLOAT_TYPES


def _is_integer(inst: Instruction) -> bool:
    return inst.shape.element_type in INTEGER_TYPES


def _create(like: Instruction, opcode: str, operands: list[Instruction], **attributes: object
            ) -> Instruction:
    """A new instruction next to `like`, carrying its metadata (where it came from)."""
    assert like.parent is not None
    return like.parent.create(opcode, operands, metadata=like.metadata, **attributes)


def _splat(like: Instruction, value: object) -> Instruction:
    """broadcast(constant(value)) of `like`'s shape."""
    assert like.parent is not None
    scalar = like.parent.add_constant(value, like.shape.element_type)
    scalar.metadata = dict(like.metadata)
    if not like.shape.dims:
        return scalar
    return _create(like, "broadcast", [scalar], shape=like.shape, dimensions=())


# -- arithmetic identities --------------------------------------------------------------

def _other_if_identity(inst: Instruction, identity: object) -> Instruction | None:
    """For a commutative `op(a, b)`: the other operand when one is a splat of `identity`."""
    lhs, rhs = inst.operands
    if is_splat_of(rhs, identity):
        return lhs
    if is_splat_of(lhs, identity):
        return rhs
    return None


@_rewrite("add")
def _add_zero(inst: Instruction) -> Instruction | None:
    """x + 0 → x. For floats only x + (-0.0): x + (+0.0) turns -0.0 into +0.0."""
    zero = -0.0 if _is_float(inst) else 0
    if not (_is_float(inst) or _is_integer(inst)):
        return None
    return _other_if_identity(inst, zero)


@_rewrite("subtract")
def _subtract_zero(inst: Instruction) -> Instruction | None:
    """x - 0 → x; for floats x - (+0.0), which keeps -0.0 (x - (-0.0) would not)."""
    if (_is_float(inst) or _is_integer(inst)) and is_splat_of(inst.operand(1), 0.0):
        return inst.operand(0)
    return None


@_rewrite("subtract")
def _subtract_self_integer(inst: Instruction) -> Instruction | None:
    """x - x → 0 for integers (for floats, inf - inf is NaN)."""
    if _is_integer(inst) and inst.operand(0) is inst.operand(1):
        return _splat(inst, 0)
    return None


@_rewrite("multiply")
def _multiply_one(inst: Instruction) -> Instruction | None:
    """x * 1 → x and 1 * x → x (exact for floats too: NaN, inf and -0.0 stay)."""
    if not (_is_float(inst) or _is_integer(inst)):
        return None
    return _other_if_identity(inst, 1)


@_rewrite("multiply")
def _multiply_zero_integer(inst: Instruction) -> Instruction | None:
    """x * 0 → 0 for integers only (inf * 0 is NaN and -1.0 * 0 is -0.0)."""
    if not _is_integer(inst):
        return None
    for operand in inst.operands:
        if is_splat_of(operand, 0):
            return operand
    return None


@_rewrite("divide")
def _divide_one(inst: Instruction) -> Instruction | None:
    """x / 1 → x."""
    if (_is_float(inst) or _is_integer(inst)) and is_splat_of(inst.operand(1), 1):
        return inst.operand(0)
    return None


@_rewrite("divide")
def _divide_by_power_of_two(inst: Instruction) -> Instruction | None:
    """x / 2^k → x * 2^-k for floats, when 2^-k is exact: both round the same real."""
    divisor = splat_value(inst.operand(1))
    if not _is_float(inst) or divisor is None:
        return None
    wide = float(divisor)
    if not np.isfinite(wide) or wide == 0 or abs(np.frexp(wide)[0]) != 0.5:
        return None
    with np.errstate(all="ignore"):
        reciprocal = np.asarray(1.0 / wide).astype(divisor.dtype)
    if float(reciprocal) != 1.0 / wide:  # 2^-k overflows or underflows in this type
        return None
    return _create(inst, "multiply", [inst.operand(0), _splat(inst, reciprocal)])


def _lowest(inst: Instruction) -> object:
    if _is_float(inst):
        return -np.inf
    return np.iinfo(inst.shape.numpy_dtype).min


def _highest(inst: Instruction) -> object:
    if _is_float(inst):
        return np.inf
    return np.iinfo(inst.shape.numpy_dtype).max


@_rewrite("maximum", "minimum", "and", "or")
def _idempotent_self(inst: Instruction) -> Instruction | None:
    """max(x, x), min(x, x), x & x, x | x → x."""
    lhs, rhs = inst.operands
    return lhs if lhs is rhs else None


@_rewrite("maximum", "minimum")
def _max_min_identity(inst: Instruction) -> Instruction | None:
    """max(x, -inf) → x, min(x, +inf) → x (the lowest/highest integer for integers).

    Exact under XLA's NaN-propagating maximum: max(NaN, -inf) is NaN, as x is.
    """
    if not (_is_float(inst) or _is_integer(inst)):
        return None
    identity = _lowest(inst) if inst.opcode == "maximum" else _highest(inst)
    return _other_if_identity(inst, identity)


def _ones(inst: Instruction) -> object:
    return True if inst.shape.element_type == "pred" else ~np.zeros((), inst.shape.numpy_dtype)


@_rewrite("and", "or", "xor")
def _bitwise_identity(inst: Instruction) -> Instruction | None:
    """x & ~0 → x, x | 0 → x, x ^ 0 → x (integers and pred)."""
    if not (_is_integer(inst) or inst.shape.element_type == "pred"):
        return None
    identity = _ones(inst) if inst.opcode == "and" else 0
    return _other_if_identity(inst, identity)


@_rewrite("and", "or")
def _bitwise_absorb(inst: Instruction) -> Instruction | None:
    """x & 0 → 0, x | ~0 → ~0 (integers and pred)."""
    if not (_is_integer(inst) or inst.shape.element_type == "pred"):
        return None
    absorbing = 0 if inst.opcode == "and" else _ones(inst)
    for operand in inst.operands:
        if is_splat_of(operand, absorbing):
            return operand
    return None


@_rewrite("negate", "not")
def _involution(inst: Instruction) -> Instruction | None:
    """-(-x) → x, !(!x) → x (two sign flips give the same bits, NaN included)."""
    operand = inst.operand(0)
    return operand.operand(0) if operand.opcode == inst.opcode else None


@_rewrite("compare")
def _compare_self_integer(inst: Instruction) -> Instruction | None:
    """x == x → true (and the like) for integers and pred; floats have NaN."""
    lhs, rhs = inst.operands
    if lhs is not rhs or lhs.shape.element_type in FLOAT_TYPES:
        return None
    return _splat(inst, inst.attributes["direction"] in ("EQ", "LE", "GE"))


@_rewrite("convert")
def _convert_same_type(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    return operand if operand.shape == inst.shape else None


@_rewrite(*sorted(op for op in REFERENCES if is_elementwise(op)))
def _fold_broadcast_scalars(inst: Instruction) -> Instruction | None:
    """op(broadcast(c1), broadcast(c2)) → broadcast(op(c1, c2)) for scalar constants c.

    The result stays a broadcast of a scalar: constant folding would make it a big
    literal, which codegen reads from memory instead of splatting a register.
    """
    if not inst.shape.dims or inst.shape.is_tuple:
        return None
    scalars = []
    for operand in inst.operands:
        if operand.opcode != "broadcast" or operand.operand(0).opcode != "constant" or \
                operand.operand(0).shape.dims:
            return None
        scalars.append(operand.operand(0).literal)
    scalar = Instruction(inst.opcode, inst.shape.with_dims(()), attributes=inst.attributes)
    try:
        with np.errstate(all="ignore"):
            value = REFERENCES[inst.opcode](scalar, scalars)
    except (TypeError, ValueError, ArithmeticError):
        return None
    return _splat(inst, value)


# -- data movement ----------------------------------------------------------------------

@_rewrite("opt-barrier", "set-dimension-size")
def _pass_through(inst: Instruction) -> Instruction | None:
    """opt-barrier(x) → x, set-dimension-size(x, n) → x: values unchanged (static shapes,
    once `dynamic_padder` has run; the barrier only orders XLA's scheduling, and this
    pipeline keeps data order)."""
    if inst.shape.is_dynamic:
        return None  # its size is the padder's to carry, not dropped here
    return inst.operand(0)


@_rewrite("get-dimension-size")
def _dimension_size(inst: Instruction) -> Instruction | None:
    """get-dimension-size(x) → the constant dimension (static shapes)."""
    (dimension,) = inst.attributes["dimensions"]
    if inst.operand(0).shape.is_dynamic_dimension(dimension):
        return None  # a size known at run time only
    return _splat(inst, inst.operand(0).shape.dims[dimension])


@_rewrite("get-tuple-element")
def _tuple_element_of_tuple(inst: Instruction) -> Instruction | None:
    """get-tuple-element(tuple(a, b, ...), i) → the i-th operand (TF's 'hlo' stage ends
    single-output modules this way; the CPU backend emits no tuples inside the entry)."""
    operand = inst.operand(0)
    if operand.opcode != "tuple":
        return None
    return operand.operand(int(inst.attributes["index"]))


@_rewrite("reshape", "bitcast")
def _reshape_same_shape(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    return operand if operand.shape == inst.shape else None


@_rewrite("reshape", "bitcast")
def _reshape_of_reshape(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    if operand.opcode not in ("reshape", "bitcast"):
        return None
    return _create(inst, inst.opcode, [operand.operand(0)], shape=inst.shape)


@_rewrite("reshape", "bitcast", "transpose", "slice", "broadcast")
def _move_scalar_broadcast(inst: Instruction) -> Instruction | None:
    """reshape/transpose/slice/broadcast of broadcast(scalar) → broadcast(scalar)."""
    operand = inst.operand(0)
    if operand.opcode != "broadcast" or operand.operand(0).shape.dims:
        return None
    return _create(inst, "broadcast", [operand.operand(0)], shape=inst.shape, dimensions=())


@_rewrite("transpose")
def _transpose_identity(inst: Instruction) -> Instruction | None:
    return inst.operand(0) if inst.dimensions == tuple(range(inst.shape.rank)) else None


@_rewrite("transpose")
def _transpose_of_transpose(inst: Instruction) -> Instruction | None:
    """Output dim i of the outer reads inner dim p2[i], which reads x's dim p1[p2[i]]."""
    operand = inst.operand(0)
    if operand.opcode != "transpose":
        return None
    inner = operand.dimensions
    composed = tuple(inner[d] for d in inst.dimensions)
    return _create(inst, "transpose", [operand.operand(0)], dimensions=composed)


@_rewrite("broadcast")
def _broadcast_identity(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    if operand.shape == inst.shape and inst.dimensions == tuple(range(inst.shape.rank)):
        return operand
    return None


@_rewrite("broadcast")
def _broadcast_of_broadcast(inst: Instruction) -> Instruction | None:
    """x's dim k lands in the inner's dim d1[k], which lands in the outer's d2[d1[k]]."""
    operand = inst.operand(0)
    if operand.opcode != "broadcast":
        return None
    composed = tuple(inst.dimensions[d] for d in operand.dimensions)
    return _create(inst, "broadcast", [operand.operand(0)], shape=inst.shape,
                   dimensions=composed)


@_rewrite("slice")
def _slice_whole(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    whole = all(start == 0 and limit == size and stride == 1 for (start, limit, stride), size
                in zip(inst.attributes["slice"], operand.shape.dims))
    return operand if whole and operand.shape == inst.shape else None


@_rewrite("dynamic-slice")
def _dynamic_slice_whole(inst: Instruction) -> Instruction | None:
    """dynamic-slice(x, i...) of all of x → x: every start clamps to 0 (the read of a
    one-element TensorList, a loop-invariant accumulator's)."""
    operand = inst.operand(0)
    return operand if operand.shape == inst.shape else None


@_rewrite("dynamic-update-slice")
def _dynamic_update_slice_whole(inst: Instruction) -> Instruction | None:
    """dynamic-update-slice(x, u, i...) with u as large as x → u: every start clamps to 0
    (the write of a one-element TensorList)."""
    update = inst.operand(1)
    return update if update.shape == inst.shape else None


@_rewrite("slice")
def _slice_of_slice(inst: Instruction) -> Instruction | None:
    operand = inst.operand(0)
    if operand.opcode != "slice" or inst.shape.num_elements == 0:
        return None
    spec = []
    for (s1, _, st1), (s2, _, st2), count in zip(operand.attributes["slice"],
                                                 inst.attributes["slice"], inst.shape.dims):
        start, stride = s1 + s2 * st1, st1 * st2
        spec.append((start, start + (count - 1) * stride + 1, stride))
    return _create(inst, "slice", [operand.operand(0)], slice=tuple(spec))


@_rewrite("slice")
def _slice_of_concatenate(inst: Instruction) -> Instruction | None:
    """A slice that reads only from one operand of a concatenate slices that operand."""
    operand = inst.operand(0)
    if operand.opcode != "concatenate" or inst.shape.num_elements == 0:
        return None
    (axis,) = operand.dimensions
    spec = list(inst.attributes["slice"])
    start, _, stride = spec[axis]
    last = start + (inst.shape.dims[axis] - 1) * stride
    offset = 0
    for part in operand.operands:
        size = part.shape.dims[axis]
        if offset <= start and last < offset + size:
            spec[axis] = (start - offset, last - offset + 1, stride)
            return _create(inst, "slice", [part], slice=tuple(spec))
        offset += size
    return None


@_rewrite("concatenate")
def _concatenate_single(inst: Instruction) -> Instruction | None:
    return inst.operand(0) if len(inst.operands) == 1 else None


@_rewrite("select")
def _select_constant_predicate(inst: Instruction) -> Instruction | None:
    predicate, on_true, on_false = inst.operands
    if is_splat_of(predicate, True):
        return on_true
    if is_splat_of(predicate, False):
        return on_false
    return None


@_rewrite("select")
def _select_same_branches(inst: Instruction) -> Instruction | None:
    _, on_true, on_false = inst.operands
    return on_true if on_true is on_false else None


# -- dot and reduce ---------------------------------------------------------------------

def _is_identity_matrix(inst: Instruction) -> bool:
    if inst.opcode != "constant" or inst.shape.rank != 2:
        return False
    rows, columns = inst.shape.dims
    if rows != columns:
        return False
    eye = np.eye(rows, dtype=inst.literal.dtype)
    return bool(np.array_equal(_bits(inst.literal), _bits(eye)))


@_rewrite("dot")
def _dot_identity_integer(inst: Instruction) -> Instruction | None:
    """x · I → x for integers, when the result keeps x's dimension order.

    Not for floats: an inf or NaN elsewhere in x's row gives NaN (inf * 0), and a
    -0.0 becomes +0.0 once the zero products are added.
    """
    if not _is_integer(inst):
        return None
    lhs, rhs = inst.operands
    attrs = inst.attributes
    if attrs.get("lhs_batch_dims") or attrs.get("rhs_batch_dims"):
        return None
    lhs_contracting = tuple(attrs.get("lhs_contracting_dims", ()))
    rhs_contracting = tuple(attrs.get("rhs_contracting_dims", ()))
    if len(lhs_contracting) != 1 or len(rhs_contracting) != 1:
        return None
    (lc,), (rc,) = lhs_contracting, rhs_contracting
    if _is_identity_matrix(rhs) and lc == lhs.shape.rank - 1 and lhs.shape == inst.shape:
        return lhs
    if _is_identity_matrix(lhs) and rc == 0 and rhs.shape == inst.shape:
        return rhs
    return None


@_rewrite("reduce")
def _reduce_trivial_dimensions(inst: Instruction) -> Instruction | None:
    """A reduce over dimensions of size 1 applies its op once: op(init, x), reshaped.

    Only for one-input reduces whose `to_apply` is one binary elementwise op of its
    parameters; the operands keep the computation's order, so the bits are those
    the reduce computes. Over an empty dimension the result is the init value.
    """
    if len(inst.operands) != 2 or inst.shape.is_tuple:
        return None
    x, init = inst.operands
    if x.shape.num_elements == 0:
        return _create(inst, "broadcast", [init], shape=inst.shape, dimensions=())
    if any(x.shape.dims[d] != 1 for d in inst.dimensions):
        return None
    reducer = inst.called_computations[0]
    root = reducer.root
    if root is None or len(reducer.instructions) != 3 or not is_elementwise(root.opcode) or \
            len(root.operands) != 2 or {o.opcode for o in root.operands} != {"parameter"} or \
            root.operand(0) is root.operand(1):
        return None
    values = _create(inst, "reshape", [x], shape=inst.shape)
    accumulators = _create(inst, "broadcast", [init], shape=inst.shape, dimensions=())
    by_number = {0: accumulators, 1: values}
    operands = [by_number[p.parameter_number] for p in root.operands]
    return _create(inst, root.opcode, operands, **root.attributes)


# -- driver -----------------------------------------------------------------------------

def remove_if_dead(computation: Computation, inst: Instruction) -> None:
    """Remove `inst` when nothing uses it, then its operands that became unused."""
    stack = [inst]
    while stack:
        node = stack.pop()
        if node.parent is computation and not node.users and node is not computation.root \
                and node.opcode != "parameter":
            operands = list(node.operands)
            computation.remove(node)
            stack.extend(operands)


def simplify_computation(computation: Computation, rules: list[RewriteRule]) -> bool:
    """Apply `rules` until none applies; True when anything changed."""
    by_opcode: dict[str, list[RewriteRule]] = {}
    for rule in rules:
        for opcode in rule.opcodes:
            by_opcode.setdefault(opcode, []).append(rule)
    worklist = deque(computation.instructions)
    changed = False
    while worklist:
        inst = worklist.popleft()
        if inst.parent is not computation:
            continue  # removed since it was queued
        for rule in by_opcode.get(inst.opcode, ()):
            new = rule.fn(inst)
            if new is None or new is inst:
                continue
            if new.shape != inst.shape:
                raise AssertionError(f"rewrite {rule.name} changed the shape of %{inst.name}")
            users = list(inst.users)
            inst.replace_all_uses_with(new)
            remove_if_dead(computation, inst)
            worklist.append(new)
            worklist.extend(users)
            changed = True
            break
    if changed:
        # New constants land at the end; put every operand before its users again.
        computation.sort()
    return changed


@dataclass(frozen=True)
class AlgebraicSimplifier(Pass):
    """Needs: a module that verifies, before fusion.

    Guarantees: every computation but fusion computations is rewritten until no
    rewrite of `REWRITES` (or of `rewrites`, when given) applies; each computes
    the same bits as before for every input. Instructions a rewrite left unused
    are removed; the module still verifies.
    """

    name: ClassVar[str] = "simplify"
    rewrites: tuple[str, ...] | None = None

    def run(self, module: HloModule) -> bool:
        names = self.rewrites if self.rewrites is not None else tuple(REWRITES)
        rules = [REWRITES[name] for name in names]
        changed = False
        for computation in list(module.computations):
            if not computation.is_fusion_computation:
                changed |= simplify_computation(computation, rules)
        return changed
