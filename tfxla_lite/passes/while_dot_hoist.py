"""A loop body's dot of one item of a loop-invariant list by a loop-invariant matrix, as
one dot of the whole list before the loop (`WhileDotHoisting`).

An RNN's loop (Keras's LSTM and GRU, `tf.scan`) reads item t of its input sequence (a
TensorList's buffer the loop never writes) and multiplies it by an input kernel every
iteration: T small dots of B rows. The same products are the rows of one dot of all
T x B rows, which the GEMM runs at a larger block and, on several cores, in parallel;
the body then reads its item of that product with a dynamic-slice, which fusion folds
into the kernel that adds it. XLA keeps the per-iteration dot; cuDNN's RNNs compute the
input projection for all time steps at once the same way. It runs on the entry, after
`while-licm` (`passes/control_flow.py`, whose hoisting moves the new dot out of the body)
and before the body is optimized as an entry of its own.

Not in the default pipeline (name it in a `pipeline` option after `while-licm`): the
per-iteration dots of B rows already run at the GEMM's single-thread rate, so the one
big dot gains only where it runs on several free cores, and it streams its T x B x N
product through memory where the loop's dots stay in the cache; on this project's two
shared cores the Keras LSTM's steps ran slower with it (docs/benchmarks.md, Model zoo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.control_flow import (
    NOT_HOISTED,
    EntryLoopPass,
    element_of,
    hoist_invariants,
    invariant_elements,
)


@dataclass(frozen=True)
class WhileDotHoisting(EntryLoopPass):
    """Needs: a module that verifies. Guarantees: the same values (each output row is
    the same dot product of the same row and matrix); a while body no longer computes
    dot(item, W), where item is reshape(dynamic-slice(X, i, ...)) of one whole item of a
    loop-invariant array X[T, B, F] (or the [1, F] item of X[T, F]), and W a
    loop-invariant matrix, contracted over F with no batch dimensions: the caller
    computes P = dot(X as [T*B, F], W) once and the body reads rows
    [clamp(i, 0, T-1) * B, + B) of P with a dynamic-slice (clamped as the dynamic-slice
    of X was).

    Only where the loop runs at least T times (its condition is a conjunction of
    `counter < bound` with counters that start at a constant and add 1 each iteration
    and constant or invariant bounds), so that the dot of all T items costs no more
    than the loop's own dots: a loop that may stop early keeps its dot. Only loops whose
    body and condition no other instruction calls are changed.
    """

    name: ClassVar[str] = "while-dot-hoist"

    def rewrite_loop(self, caller: Computation, loop: Instruction,
                     callers: dict[int, int]) -> bool:
        return hoist_item_dots(caller, loop, callers)


def hoist_item_dots(caller: Computation, loop: Instruction, callers: dict[int, int]) -> bool:
    """Rewrite every dot of `loop`'s body that the class docstring describes, and move
    the whole-list products into `caller`; True when anything changed."""
    condition, body = loop.called_computations
    if callers.get(id(body), 0) != 1 or callers.get(id(condition), 0) != 1 \
            or condition is body or len(body.parameters) != 1:
        return False
    trips = minimum_trip_count(loop)
    if trips is None:
        return False
    elements = invariant_elements(body)
    products: set[int] = set()
    read: list[int] = []
    for dot in [i for i in body.instructions if i.opcode == "dot"]:
        match = _item_dot(dot, elements)
        if match is None:
            continue
        items, weights, index = match
        if trips < items.shape.dims[0]:
            continue
        products.add(id(_rewrite(body, dot, items, weights, index)))
        read += [elements[id(items)][0], elements[id(weights)][0]]
    if not products:
        return False
    hoist_invariants(caller, loop, callers, also=frozenset(products))
    # The lists the products replaced are often read by nothing else any more.
    for n in sorted(set(read), reverse=True):
        drop_unused_element(caller, loop, n)
    return True


def _item_dot(dot: Instruction, elements: dict[int, tuple[int, ...]]
              ) -> tuple[Instruction, Instruction, Instruction] | None:
    """(X, W, i) when `dot` is dot(item i of invariant X, invariant W) as the class
    docstring says, else None."""
    attributes = dot.attributes
    if attributes.get("lhs_batch_dims") or attributes.get("rhs_batch_dims") \
            or list(attributes.get("lhs_contracting_dims", ())) != [1]:
        return None
    item, weights = dot.operands
    if id(weights) not in elements or weights.shape.rank != 2 or item.shape.rank != 2:
        return None
    sliced = item.operand(0) if item.opcode == "reshape" else item
    if sliced.opcode != "dynamic-slice":
        return None
    items = sliced.operand(0)
    dims = items.shape.dims
    if id(items) not in elements or len(dims) < 2 or dims[0] == 0 \
            or tuple(sliced.attributes["dynamic_slice_sizes"]) != (1, *dims[1:]):
        return None
    # The item as the dot reads it: [B, F] of X[T, B, F], or [1, F] of X[T, F].
    if item.shape.dims != ((1, *dims[1:]) if len(dims) == 2 else dims[1:]) \
            or len(dims) > 3:
        return None
    return items, weights, sliced.operand(1)


def _rewrite(body: Computation, dot: Instruction, items: Instruction, weights: Instruction,
             index: Instruction) -> Instruction:
    """Replace `dot` by rows [clamp(index, 0, T-1) * B, + B) of P = dot(all of `items` as
    [T*B, F], `weights`); return P (loop-invariant: it reads invariant elements only).
    The clamp is the dynamic-slice of `items`' own, so that no start index overflows."""
    dims = items.shape.dims
    steps, features = dims[0], dims[-1]
    rows = math.prod(dims[1:-1])  # B (1 for X[T, F])
    columns = dot.shape.dims[1]
    metadata = dot.metadata
    flat = body.create("reshape", [items], shape=items.shape.with_dims((steps * rows, features)),
                       metadata=metadata)
    product = body.create("dot", [flat, weights], metadata=metadata,
                          shape=Shape.array(dot.shape.element_type, (steps * rows, columns)),
                          **dot.attributes)
    kind = index.shape.element_type
    first = body.create("clamp", [body.add_constant(0, kind), index,
                                  body.add_constant(steps - 1, kind)], metadata=metadata)
    start = body.create("multiply", [first, body.add_constant(rows, kind)], metadata=metadata)
    result = body.create("dynamic-slice", [product, start, body.add_constant(0, kind)],
                         shape=dot.shape, dynamic_slice_sizes=[rows, columns],
                         metadata=metadata)
    item = dot.operand(0)
    dot.replace_all_uses_with(result)
    body.remove(dot)
    _remove_if_unused(body, item)
    body.sort()
    return product


def _remove_if_unused(computation: Computation, inst: Instruction) -> None:
    """Remove `inst` and then its operands while nothing reads them (never a parameter
    or the root)."""
    if inst.users or inst is computation.root or inst.opcode == "parameter" \
            or inst.parent is not computation:
        return
    operands = set(inst.operands)
    computation.remove(inst)
    for operand in operands:
        _remove_if_unused(computation, operand)


def _prune_reads(computation: Computation, value: Instruction) -> None:
    """Remove the get-tuple-elements of `value` (and of those) that nothing reads."""
    for user in list(value.users):
        if user.opcode == "get-tuple-element":
            _prune_reads(computation, user)
            _remove_if_unused(computation, user)


def drop_unused_element(caller: Computation, loop: Instruction, n: int) -> bool:
    """Remove element `n` from `loop`'s state when nothing uses it: the body returns it
    unchanged and reads it for nothing else, the condition does not read it, and the
    caller reads only other elements of the loop's result (through get-tuple-elements).
    True when removed."""
    condition, body = loop.called_computations
    init, root = loop.operand(0), body.root
    if root is None or root.opcode != "tuple" or caller.root is loop:
        return False
    (parameter,) = body.parameters
    (cond_parameter,) = condition.parameters
    for inst in reversed(list(body.instructions)):
        if inst.opcode not in NOT_HOISTED:  # pure: what hoisting left behind
            _remove_if_unused(body, inst)
    for comp, state_value in ((caller, loop), (body, parameter), (condition, cond_parameter)):
        _prune_reads(comp, state_value)
    passed = root.operand(n)
    if passed.opcode != "get-tuple-element" or passed.operand(0) is not parameter \
            or int(passed.attributes["index"]) != n or passed.users != [root] \
            or root.operands.count(passed) != 1:
        return False
    for comp, state_value in ((body, parameter), (condition, cond_parameter), (caller, loop)):
        for user in state_value.users:
            if user.opcode != "get-tuple-element":
                return False
            if int(user.attributes["index"]) == n and user is not passed \
                    and (user.users or user is comp.root):
                return False
    assert loop.shape.tuple_shapes is not None
    shapes = list(loop.shape.tuple_shapes)
    del shapes[n]
    state = Shape.tuple_of(shapes)
    kept = [k for k in range(len(shapes) + 1) if k != n]
    new_init = caller.create("tuple", [element_of(caller, init, k) for k in kept], shape=state,
                             metadata=init.metadata)
    loop.replace_operand(0, new_init)
    _remove_if_unused(caller, init)
    new_root = body.create("tuple", [root.operand(k) for k in kept], shape=state,
                           metadata=root.metadata)
    body.root = new_root
    body.remove(root)
    _remove_if_unused(body, passed)
    for comp, state_parameter in ((caller, loop), (body, parameter),
                                  (condition, cond_parameter)):
        for user in list(state_parameter.users):
            index = int(user.attributes["index"])
            if index == n:
                _remove_if_unused(comp, user)  # unused, checked above
            elif index > n:
                user.attributes["index"] = index - 1
        if state_parameter is not loop:
            state_parameter.shape = state
    loop.shape = state
    for comp in (caller, body, condition):
        comp.sort()
    return True


def minimum_trip_count(loop: Instruction) -> int | None:
    """How many times `loop` runs at least, when its condition is a conjunction (`and`)
    of `counter < bound` (or `<=`) where each counter is a state element that starts at
    a constant of the loop's initial tuple and that the body returns plus a constant 1,
    and each bound a constant or a loop-invariant element that starts at a constant;
    else None. (Exactly how many times, as each conjunct counts down alone.)"""
    condition, body = loop.called_computations
    init = loop.operand(0)
    root, body_root = condition.root, body.root
    if init.opcode != "tuple" or root is None or body_root is None \
            or body_root.opcode != "tuple" or len(condition.parameters) != 1:
        return None
    (parameter,) = condition.parameters
    (body_parameter,) = body.parameters

    def element(value: Instruction, state: Instruction) -> int | None:
        if value.opcode == "get-tuple-element" and value.operand(0) is state:
            return int(value.attributes["index"])
        return None

    def start(n: int) -> int | None:
        value = init.operand(n)
        if value.opcode == "constant" and value.shape.rank == 0 \
                and value.shape.element_type.startswith(("s", "u")):
            return int(value.literal)
        return None

    def counter(n: int) -> bool:
        returned = body_root.operand(n)
        if returned.opcode != "add":
            return False
        for k in (0, 1):
            read, step = returned.operand(k), returned.operand(1 - k)
            if element(read, body_parameter) == n and step.opcode == "constant" \
                    and step.shape.rank == 0 and int(step.literal) == 1:
                return True
        return False

    def bound(value: Instruction) -> int | None:
        if value.opcode == "constant" and value.shape.rank == 0:
            return int(value.literal)
        n = element(value, parameter)
        if n is None or element(body_root.operand(n), body_parameter) != n:
            return None
        return start(n)

    def trips(test: Instruction) -> int | None:
        if test.opcode == "and":
            counts = [trips(o) for o in test.operands]
            return None if None in counts else min(c for c in counts if c is not None)
        direction = test.attributes.get("direction") if test.opcode == "compare" else None
        if direction not in ("LT", "LE"):
            return None
        n = element(test.operand(0), parameter)
        if n is None or not counter(n):
            return None
        first, last = start(n), bound(test.operand(1))
        if first is None or last is None:
            return None
        return max(0, last - first + (direction == "LE"))

    if not root.shape.dims == () or root.shape.element_type != "pred":
        return None
    return trips(root)
