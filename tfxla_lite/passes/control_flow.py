"""Passes for HLO control flow: the computations `while` and `conditional` call are
optimized as entries of their own, and loop-invariant code leaves loop bodies.

Every other pass treats a `while` or `conditional` as one opaque instruction of its
computation: fusion, CSE, simplification, scheduling and buffer assignment work on
the entry, and on a loop body or branch only when `optimize_called_computations` runs
the pipeline on it, as the entry of a scratch module that shares the module's names
(so kernels stay uniquely named). The CPU backend then compiles each called
computation as a function of its own (`codegen/cpu/control_flow.py`).

`WhileLoopInvariantCodeMotion` hoists what a loop body computes from loop-invariant
state and constants only out of the loop, as XLA's `WhileLoopInvariantCodeMotion`
does; its docstring gives the rule. `SliceAccumulation` turns a whole-array add of a
slice written into zeros (a TensorList's gradient) into an add of that slice alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction, user_edges
from tfxla_lite.hlo.opcodes import opcodes_in
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.buffer_assignment import EntryValues, leaves, updated_operand

CONTROL_FLOW = frozenset(opcodes_in("control-flow"))

# Never moved out of a loop: control flow, calls, and ops with effects or state.
NOT_HOISTED = frozenset({
    "parameter", "while", "conditional", "call", "custom-call", "rng", "rng-bit-generator",
    "rng-get-and-update-state", "infeed", "outfeed", "send", "send-done", "recv", "recv-done",
    "after-all", "all-reduce", "all-gather", "all-to-all", "collective-permute",
    "reduce-scatter", "partition-id", "replica-id", "tuple", "get-tuple-element"})
# Cheap, and often bigger than what they read: hoisted only as operands of an
# instruction that is worth hoisting (XLA's NotWorthHoistingIndividually), never as
# new loop state of their own.
_NOT_WORTH_ALONE = frozenset({
    "constant", "broadcast", "iota", "reshape", "bitcast", "transpose", "slice", "reverse",
    "copy", "convert", "pad", "concatenate", "dynamic-slice"})
# Readers that take their operands from buffers, never fusing a producer into themselves.
_UNFUSED_READERS = frozenset({"dot", "convolution"})


def control_flow_callees(computation: Computation) -> list[Computation]:
    """The computations the whiles and conditionals of `computation` call, each once."""
    found: list[Computation] = []
    for inst in computation.instructions:
        if inst.opcode in CONTROL_FLOW:
            found.extend(c for c in inst.called_computations if all(c is not f for f in found))
    return found


def optimize_called_computations(module: HloModule,
                                 optimize: Callable[[HloModule], object]) -> None:
    """Run `optimize` (the pipeline) on each computation the entry's control flow calls,
    as the entry of a scratch module; nested loops follow through `optimize` itself."""
    entry = module.entry
    if entry is None:
        return
    for callee in control_flow_callees(entry):
        # The module that holds it (for a nested loop, its caller's scratch module).
        owner = callee.module
        assert owner is not None, f"%{callee.name} belongs to no module"
        scratch = HloModule(f"{module.name}.{callee.name}")
        # Shared, so that names made in the scratch module are unique in the owner.
        scratch.names = owner.names
        scratch.suffix_hints = owner.suffix_hints
        scratch._computation_names = owner._computation_names
        scratch.stack_frames = owner.stack_frames
        # The callee and what it calls (fusions, reducers, nested loops' computations)
        # move to the scratch module while it is optimized, so that passes that drop or
        # add computations find them there; they all move back after.
        moved = _subtree(callee, owner)
        position = min(owner.computations.index(c) for c in moved)
        for comp in moved:
            owner.computations.remove(comp)
            comp.module = scratch
            scratch.computations.append(comp)
        scratch.entry = callee
        try:
            optimize(scratch)
            if any(i.opcode == "while" and i.called_computations[1] is callee
                   for i in entry.instructions):
                order_updates_after_reads(callee)
        finally:
            members = {id(c) for c in scratch.computations}
            for comp in scratch.called_computations_in_order():
                if id(comp) in members:
                    comp.module = owner
                    owner.computations.insert(position, comp)
                    position += 1


def order_updates_after_reads(body: Computation) -> bool:
    """Move each dynamic-update-slice of a loop-carried buffer (the body's root returns,
    at leaf n, a dynamic-update-slice of the parameter's leaf n) just after the last
    other instruction that reads that buffer's old value, when nothing between depends
    on the update but tuples naming its result (which move with it): the update can
    then run in place (`buffer_assignment.loop_in_place`), as XLA orders a TensorList's
    reads before its writes. True when anything moved."""
    root = body.root
    if root is None or len(body.parameters) != 1:
        return False
    (parameter,) = body.parameters
    facts = EntryValues(body)
    changed = False
    for index, _ in leaves(root.shape):
        value = facts.value_at[(id(root), index)]
        update = value.instruction
        target = updated_operand(update)
        if target is None or value.index:
            continue
        state = facts.value_at[(id(update.operand(target)), ())]
        if state.instruction is not parameter or state.index != index:
            continue
        order = body.instructions
        position = {id(inst): n for n, inst in enumerate(order)}
        readers = [i for i in order
                   if i is not update and any(r is state for r in facts.reads[id(i)])]
        if not readers:
            continue
        last = max(position[id(r)] for r in readers)
        if position[id(update)] > last:
            continue
        after = {id(user) for _, user in user_edges([update])}
        early = [i for i in order if id(i) in after and position[id(i)] <= last]
        if any(i.opcode not in ("tuple", "get-tuple-element") for i in early):
            continue  # something a reader needs depends on the update
        # The update and the tuples that only name its result move, in their order,
        # to just after the last reader.
        moving = [update, *early]
        for inst in moving:
            order.remove(inst)
        at = order.index(max(readers, key=lambda r: position[id(r)])) + 1
        order[at:at] = moving
        changed = True
    return changed


def _subtree(callee: Computation, owner: HloModule) -> list[Computation]:
    """`callee` and the computations of `owner` it calls, directly or not, in `owner`'s
    order."""
    reached: set[int] = set()
    stack = [callee]
    while stack:
        comp = stack.pop()
        if id(comp) not in reached:
            reached.add(id(comp))
            stack.extend(c for inst in comp.instructions for c in inst.called_computations)
    return [c for c in owner.computations if id(c) in reached]


class EntryLoopPass(Pass):
    """A pass that rewrites each `while` of the entry computation in turn: `rewrite_loop`
    gets the loop and how many instructions call each computation (counted again per
    loop, since a rewrite may add or drop callers)."""

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        if entry is None:
            return False
        changed = False
        for loop in [i for i in entry.instructions if i.opcode == "while"]:
            changed |= self.rewrite_loop(entry, loop, loop_callers(module))
        return changed

    def rewrite_loop(self, caller: Computation, loop: Instruction,
                     callers: dict[int, int]) -> bool:
        raise NotImplementedError


def loop_callers(module: HloModule) -> dict[int, int]:
    """How many instructions of the module call each computation, by id."""
    count: dict[int, int] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            for callee in inst.called_computations:
                count[id(callee)] = count.get(id(callee), 0) + 1
    return count


@dataclass(frozen=True)
class WhileLoopInvariantCodeMotion(EntryLoopPass):
    """Needs: a module that verifies. Guarantees: the same values; a while body computes
    nothing that depends only on loop-invariant state and constants when moving it is
    worth it.

    As XLA's `WhileLoopInvariantCodeMotion`: an effect-free instruction of the body whose
    operands are invariant state elements (returned unchanged by the root), constants or
    other invariant instructions is hoisted with them, unless it is a cheap shape op
    fusion would fold into its readers, or its result is bigger than its operands (it
    joins the loop state). Only loops no other instruction calls are changed
    (docs/architecture.md, `while-licm`).
    """

    name: ClassVar[str] = "while-licm"

    def rewrite_loop(self, caller: Computation, loop: Instruction,
                     callers: dict[int, int]) -> bool:
        return hoist_invariants(caller, loop, callers)


def invariant_elements(body: Computation) -> dict[int, tuple[int, ...]]:
    """id(get-tuple-element of the body's parameter) -> its element's tuple index, for
    the elements the root returns unchanged, and id(get-tuple-element of such a read)
    -> (element, leaf) for the leaves of a tuple element the root returns unchanged or
    rebuilds with that leaf unchanged (a TensorList's buffer, whose counter the body
    may change)."""
    root = body.root
    (parameter,) = body.parameters
    if root is None or root.opcode != "tuple" or not parameter.shape.is_tuple:
        return {}

    def read_of(value: Instruction, source: Instruction, n: int) -> bool:
        return value.opcode == "get-tuple-element" and value.operand(0) is source \
            and int(value.attributes["index"]) == n

    found: dict[int, tuple[int, ...]] = {}
    for user in parameter.users:
        if user.opcode != "get-tuple-element":
            continue
        n = int(user.attributes["index"])
        returned = root.operand(n)
        if read_of(returned, parameter, n):
            found[id(user)] = (n,)
            # The leaves of an unchanged tuple element (a TensorList the body only reads).
            for leaf in user.users:
                if leaf.opcode == "get-tuple-element" and not leaf.shape.is_tuple:
                    found[id(leaf)] = (n, int(leaf.attributes["index"]))
        elif returned.opcode == "tuple":
            for leaf in user.users:
                if leaf.opcode == "get-tuple-element":
                    m = int(leaf.attributes["index"])
                    inner = returned.operand(m)
                    if inner.opcode == "get-tuple-element" and inner.operand(0).opcode == \
                            "get-tuple-element" and read_of(inner.operand(0), parameter, n) \
                            and int(inner.attributes["index"]) == m:
                        found[id(leaf)] = (n, m)
    return found


def hoist_invariants(caller: Computation, loop: Instruction, callers: dict[int, int],
                     also: frozenset[int] = frozenset()) -> bool:
    """Move the worthwhile invariant code of `loop`'s body into `caller` (class
    docstring), and the invariant instructions whose ids `also` holds whatever their
    kind or size (a caller that has judged them worth it); True when anything moved."""
    condition, body = loop.called_computations
    if callers.get(id(body), 0) != 1 or callers.get(id(condition), 0) != 1 \
            or condition is body:
        return False
    elements = invariant_elements(body)
    if not elements:
        return False
    invariant: set[int] = set(elements)
    for inst in body.instructions:
        if inst.opcode == "constant" or (
                inst.opcode not in NOT_HOISTED and not inst.shape.is_tuple
                and inst.operands and all(id(o) in invariant for o in inst.operands)):
            invariant.add(id(inst))
    worth = [inst for inst in body.instructions if id(inst) in invariant
             and id(inst) not in elements and (id(inst) in also or (
                 _worth_hoisting(inst)
                 and inst.shape.byte_size <= sum(o.shape.byte_size for o in inst.operands)))
             and any(id(u) not in invariant or u is body.root for u in inst.users)]
    if not worth:
        return False
    # Clone what the worthwhile instructions read into the caller, operands first.
    init = loop.operand(0)
    clones: dict[int, Instruction] = {}

    def clone(inst: Instruction) -> Instruction:
        if id(inst) in clones:
            return clones[id(inst)]
        if id(inst) in elements:
            made = init
            for n in elements[id(inst)]:
                made = element_of(caller, made, n)
        else:
            operands = [clone(o) for o in inst.operands]
            made = caller.add(Instruction(inst.opcode, inst.shape, operands, inst.attributes,
                                          inst.called_computations, inst.name, inst.metadata))
        clones[id(inst)] = made
        return made

    hoisted = [clone(inst) for inst in worth]
    # The loop state grows by one invariant element per hoisted value.
    old_shapes = list(loop.shape.tuple_shapes or ())
    count = len(old_shapes)
    state = Shape.tuple_of([*old_shapes, *(h.shape for h in hoisted)])
    elements_init = [element_of(caller, init, n) for n in range(count)]
    new_init = caller.create("tuple", [*elements_init, *hoisted], shape=state)
    for comp in (condition, body):
        (parameter,) = comp.parameters
        parameter.shape = state
    (parameter,) = body.parameters
    reads = []
    for n, (inst, value) in enumerate(zip(worth, hoisted)):
        read = body.create("get-tuple-element", [parameter], shape=value.shape,
                           index=count + n)
        inst.replace_all_uses_with(read)
        reads.append(read)
    old_root = body.root
    assert old_root is not None
    body.root = body.create("tuple", [*old_root.operands, *reads], shape=state)
    if not old_root.users:
        body.remove(old_root)
    # The caller keeps seeing the old shape: a tuple of the old elements.
    users = list(loop.users)
    was_root = caller.root is loop
    loop.replace_operand(0, new_init)
    loop.shape = state
    if [u for u in users if u.opcode != "get-tuple-element"] or was_root:
        old = caller.create("tuple", [caller.create("get-tuple-element", [loop], index=n,
                                                    shape=old_shapes[n]) for n in range(count)])
        for user in users:
            if user.opcode != "get-tuple-element":
                for k, operand in enumerate(user.operands):
                    if operand is loop:
                        user.replace_operand(k, old)
        if was_root:
            caller.root = old
    if not init.users and init.opcode == "tuple" and init is not caller.root:
        caller.remove(init)
    caller.sort()
    body.sort()
    return True


def _worth_hoisting(inst: Instruction) -> bool:
    """Whether invariant `inst` is worth a loop-state element of its own: not a cheap
    shape op, unless a dot or convolution reads it (no fusion folds an operand into
    those: it would be a copy kernel every iteration, such as the reshape of a
    one-element TensorList that a gradient loop multiplies by)."""
    return inst.opcode not in _NOT_WORTH_ALONE or any(
        user.opcode in _UNFUSED_READERS for user in inst.users)


def element_of(caller: Computation, init: Instruction, n: int) -> Instruction:
    """Element `n` of tuple `init` (the loop's initial state, or an element of it) as an
    instruction of the caller."""
    if init.opcode == "tuple":
        return init.operand(n)
    assert init.shape.tuple_shapes is not None
    return caller.create("get-tuple-element", [init], index=n,
                         shape=init.shape.tuple_shapes[n])


class SliceAccumulation(Pass):
    """add(x, dynamic-update-slice(zeros, u, i...)) -> dynamic-update-slice(x,
    add(dynamic-slice(x, i...), u), i...), either operand order.

    TF's gradient of a TensorList read in a loop body writes the item's gradient into
    a list of zeros (TensorListReserve, TensorListSetItem) and adds that list to the
    accumulated one (AddN) every iteration: lowered as written, each iteration adds two
    whole lists. Rewritten, it reads and writes one item, and the update is in place
    (`loop_in_place`). Both forms clamp the start indices alike. Elements outside the
    slice keep x's bits where the zeros are +0.0 and x holds -0.0 (the add would give
    +0.0): as TF's AddN of TensorLists, which takes the other list's item where one
    list has none, and XLA's simplifier, which folds x + 0 to x. Only a
    dynamic-update-slice that nothing else reads is rewritten (its buffer of zeros then
    goes).
    """

    name: ClassVar[str] = "slice-accumulation"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        if entry is None:
            return False
        changed = False
        for inst in list(entry.instructions):
            if inst.parent is entry and inst.opcode == "add":
                changed |= _accumulate_slice(entry, inst)
        if changed:
            entry.sort()
        return changed


def _accumulate_slice(computation: Computation, add: Instruction) -> bool:
    from tfxla_lite.passes.simplify import splat_value

    for k in (0, 1):
        update_slice, other = add.operand(k), add.operand(1 - k)
        if update_slice.opcode != "dynamic-update-slice" or len(update_slice.users) != 1 \
                or update_slice.shape != other.shape:
            continue
        zeros = splat_value(update_slice.operand(0))
        if zeros is None or zeros != 0:
            continue
        update, *indices = update_slice.operands[1:]
        read = computation.create(
            "dynamic-slice", [other, *indices], shape=update.shape,
            dynamic_slice_sizes=list(update.shape.dims), metadata=add.metadata)
        operands = [read, update] if k == 1 else [update, read]
        total = computation.create("add", operands, shape=update.shape, metadata=add.metadata)
        result = computation.create("dynamic-update-slice", [other, total, *indices],
                                    shape=add.shape, metadata=add.metadata)
        add.replace_all_uses_with(result)
        computation.remove(add)
        computation.remove(update_slice)
        return True
    return False
