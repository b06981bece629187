"""Instruction fusion (the `fuse` pass): producers join their consumers' kernels.

As XLA's `instruction_fusion.cc`: kLoop fusions rooted at an elementwise or
data-movement op, kInput fusions rooted at a reduce (a variadic one too), producers
fused in by the cost model `should_fuse` (XLA's rules against duplicating dots,
reductions and expensive ops first, then bytes saved against arithmetic repeated).
Dots, dynamic-update-slices, tuples and reduce-windows stay top-level. Producers are
cloned, so fusion never makes a cycle. The rules in full: docs/architecture.md, `fuse`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_elementwise, is_expensive
from tfxla_lite.passes.base import Pass

# Ops that compute each output element from a few operand elements at indices known
# from the output index (and, for dynamic-slice and gather, from index operands), or
# from the index alone (iota); XLA's kLoop list (`cpu_instruction_fusion.cc`).
# reduce-window loops over a window per element and stays a kernel of its own;
# dynamic-update-slice reads its whole operand and stays top-level too.
LOOP_FUSIBLE = frozenset({"broadcast", "reshape", "bitcast", "transpose", "reverse", "pad",
                          "slice", "concatenate", "iota", "dynamic-slice", "gather"})


def _is_loop_fusible(inst: Instruction) -> bool:
    if inst.shape.is_tuple:
        return False
    return is_elementwise(inst.opcode) or inst.opcode in LOOP_FUSIBLE


def can_be_fusion_root(inst: Instruction) -> bool:
    """Whether a fusion may end in `inst` (its result is the fusion's result)."""
    if inst.opcode == "reduce":
        return True  # single-input, or variadic (its fusion's result is the tuple)
    return _is_loop_fusible(inst)


def can_fuse_producer(producer: Instruction) -> bool:
    """Whether `producer` may be cloned into the fusion of one of its consumers."""
    if producer.opcode == "constant":
        return producer.shape.dims == ()
    return _is_loop_fusible(producer)


# The cost model's units: arithmetic per element and bytes, weighed by the machine's
# balance (a core does several vector flops in the time DRAM delivers a byte), and
# the fixed cost of a kernel of its own (a call, a loop, maybe a parallel region).
FLOPS_PER_BYTE = 4.0
KERNEL_FLOPS = 1 << 14
EXPENSIVE_FLOPS = 20.0  # a transcendental or a division, per element


def element_reuse(consumer: Instruction, operand_number: int) -> float:
    """How many times computing `consumer` once reads each element of that operand.

    1 for elementwise ops and permutations; the expansion of a broadcast or a gather
    (output elements per operand element); for a reduce-window, the windows that
    overlap each element (window size over stride, per dimension).
    """
    operand = consumer.operand(operand_number)
    expansion = consumer.shape.num_elements / max(1, operand.shape.num_elements) \
        if not consumer.shape.is_tuple else 1.0
    if consumer.opcode == "reduce-window" and operand_number == 0:
        reuse = 1.0
        for dim in consumer.attributes["window"].dimensions:
            reuse *= max(1.0, dim.size / max(1, dim.stride))
        return reuse
    if consumer.opcode in ("broadcast", "gather") or is_elementwise(consumer.opcode):
        return max(1.0, expansion)  # elementwise: clamp's scalar bounds
    return 1.0


def _flops_per_element(inst: Instruction) -> float:
    if is_expensive(inst.opcode):
        return EXPENSIVE_FLOPS
    if inst.opcode == "concatenate":
        # Each element picks its operand by a compare per piece before it, a branch in
        # the loop that keeps it from vectorizing; a copy of it reads as many bytes as
        # its buffer holds, so only this cost tells a duplicate from reading the buffer.
        return float(len(inst.operands) - 1)
    return 1.0 if is_elementwise(inst.opcode) else 0.0  # data movement: index arithmetic


def _fan_in_bytes(producer: Instruction) -> float:
    """Bytes one evaluation of `producer` over all its elements reads from its operands:
    a broadcast operand reads what it expands, an operand it reads twice (x * x) once, a
    scalar constant or an iota nothing."""
    total = 0.0
    for operand in dict.fromkeys(producer.operands):  # x * x reads x once
        source = operand
        while source.opcode in ("broadcast", "reshape", "bitcast") and source.operands:
            if source.opcode == "broadcast":
                source = source.operand(0)
                break
            source = source.operand(0)
        if source.opcode in ("constant", "iota") and source.shape.num_elements <= 1:
            continue
        if source.opcode == "iota" or source.shape.is_tuple:
            continue
        itemsize = source.shape.byte_size / max(1, source.shape.num_elements)
        total += min(source.shape.byte_size, producer.shape.num_elements * itemsize)
    return total


def should_fuse(producer: Instruction, evaluations: float, exclusive: bool,
                buffer_written: bool = True) -> bool:
    """Whether to clone `producer` into a fusion that evaluates each of its elements
    `evaluations` times. `exclusive`: no user outside the fusion reads it (otherwise it
    is duplicated); `buffer_written`: a duplicated producer's buffer is written anyway."""
    if is_expensive(producer.opcode):
        return exclusive and evaluations <= 1  # XLA: never duplicate expensive work
    if producer.shape.num_elements <= 1:
        return True  # loop-invariant: LLVM hoists it out of the kernel's loops
    elements = producer.shape.num_elements
    flops = _flops_per_element(producer)
    own_bytes = producer.shape.byte_size * FLOPS_PER_BYTE
    if exclusive:
        recomputed = (evaluations - 1) * elements * flops
        return recomputed <= 2 * own_bytes + KERNEL_FLOPS
    if producer.opcode == "gather":
        return False  # its table reads are scattered: one kernel, read by each consumer
    copy = evaluations * elements * flops + _fan_in_bytes(producer) * FLOPS_PER_BYTE
    if buffer_written:
        return copy <= own_bytes
    # Every consumer takes a copy, or one kernel computes it once and each reads it.
    consumers = max(1, len(producer.users))
    materialized = copy + own_bytes + KERNEL_FLOPS + consumers * own_bytes
    return consumers * copy <= materialized


def buffer_written(producer: Instruction, needed: set[int]) -> bool:
    """Whether `producer`'s buffer is written whatever this fusion does: a kernel formed
    earlier reads it (`needed`), or a user no fusion can take it into (a dot, a tuple)."""
    return id(producer) in needed or any(
        not can_be_fusion_root(user) and not can_fuse_producer(user)
        for user in producer.users)


def _grow_group(root: Instruction, needed: set[int]) -> list[Instruction]:
    """`root` and the producers fused into it, consumers before producers.

    `needed` holds the instructions some kernel formed earlier reads from outside.
    Each member's evaluations per element are its consumer's times the consumer's
    `element_reuse`, taken along the path that reached it first; reads of one value at
    one index by several members are computed once (codegen memoizes them).
    """
    members = [root]
    member_ids = {id(root)}
    evaluations = {id(root): 1.0}
    for member in members:  # grows while iterating: a worklist
        for number, producer in enumerate(member.operands):
            if id(producer) in member_ids or not can_fuse_producer(producer):
                continue
            times = evaluations[id(member)] * element_reuse(member, number)
            exclusive = id(producer) not in needed and all(
                _is_exclusive(user, root, member_ids) for user in producer.users)
            # (Whether its buffer is written anyway matters only to a duplicate.)
            written = not exclusive and buffer_written(producer, needed)
            if not should_fuse(producer, times, exclusive, written):
                continue  # maybe a later member makes it exclusive
            members.append(producer)
            member_ids.add(id(producer))
            evaluations[id(producer)] = times
    return members


def _is_exclusive(inst: Instruction, root: Instruction, member_ids: set[int]) -> bool:
    """Whether `inst` is computed only inside the fusion: no user outside reads it.

    A member that some outside user reads is duplicated; an expensive producer it
    reads would then be computed twice, once here and once for that duplicate.
    """
    stack, seen = [inst], set()
    while stack:
        node = stack.pop()
        if node is root or id(node) in seen:
            continue
        if id(node) not in member_ids:
            return False
        seen.add(id(node))
        stack.extend(node.users)
    return True


def _fusion_name(root: Instruction, member_ids: set[int]) -> str:
    """XLA-style: the root's opcode, after its first fused producer's (`add_reduce_fusion`)."""
    parts = [root.opcode]
    for operand in root.operands:
        if id(operand) in member_ids and operand.opcode != "constant":
            parts.insert(0, operand.opcode)
            break
    return "_".join(parts).replace("-", "_") + "_fusion"


def _materialize(computation: Computation, members: list[Instruction],
                 position: dict[int, int]) -> Instruction:
    """Replace the group's root by a fusion instruction calling clones of `members`.
    `position`: the computation's order before any group was materialized (members and
    their inputs are instructions of that order, which fusions added since keep)."""
    module = computation.module
    assert module is not None
    ordered = sorted(members, key=lambda inst: position[id(inst)])
    member_ids = {id(inst) for inst in members}
    inputs: list[Instruction] = []
    for inst in ordered:
        for operand in inst.operands:
            if id(operand) not in member_ids and all(operand is not i for i in inputs):
                inputs.append(operand)
    inputs.sort(key=lambda inst: position[id(inst)])  # parameters follow the entry's order

    root = members[0]
    fused = module.add_computation(Computation("fused_computation"))
    fused.is_fusion_computation = True
    clones: dict[int, Instruction] = {}
    params = []
    for number, value in enumerate(inputs):
        params.append(fused.add_parameter(number, value.shape, name=f"param_{number}"))
        clones[id(value)] = params[-1]
    body = []
    for inst in ordered:
        clone = Instruction(inst.opcode, inst.shape, [clones[id(o)] for o in inst.operands],
                            inst.attributes, inst.called_computations, inst.name, inst.metadata)
        clones[id(inst)] = fused.add(clone)
        body.append(clone)
    fused.instructions = params + body  # XLA's printing order; already topological
    fused.root = clones[id(root)]

    kind = "kInput" if root.opcode == "reduce" else "kLoop"
    fusion = computation.add(Instruction(
        "fusion", root.shape, inputs, {"kind": kind}, [fused],
        _fusion_name(root, member_ids), root.metadata))
    root.replace_all_uses_with(fusion)
    return fusion


def fuse_computation(computation: Computation) -> int:
    """Fuse `computation` in place; the number of fusion instructions created."""
    return fuse_groups(computation, lambda inst, needed: _grow_group(inst, needed)
                       if can_be_fusion_root(inst) else None)


def fuse_groups(computation: Computation,
                grow: Callable[[Instruction, set[int]], list[Instruction] | None],
                kind: str | None = None) -> int:
    """Form fusions in `computation` in place; the number created.

    Consumers first: when an instruction is reached, every user has decided whether it
    still reads the instruction from outside a fusion (`needed`, ids). `grow(root,
    needed)` gives the group rooted at `root` (root first) or None; each group of more
    than one instruction becomes a fusion (of `kind`, when given, else kLoop/kInput by
    its root), and the originals no top-level instruction reads any more are dropped.
    """
    needed: set[int] = {id(computation.root)}
    groups: list[list[Instruction]] = []
    for inst in reversed(computation.instructions):
        if inst.users and id(inst) not in needed:
            continue  # every user fused a clone of it
        members = grow(inst, needed) or [inst]
        member_ids = {id(m) for m in members}
        for member in members:
            needed.update(id(o) for o in member.operands if id(o) not in member_ids)
        if len(members) > 1:
            groups.append(members)

    touched: set[int] = set()
    # (One index for every group: indexing the growing computation per group was
    # quadratic in the Transformer step's hundreds of instructions.)
    position = {id(inst): n for n, inst in enumerate(computation.instructions)}
    for members in groups:
        fusion = _materialize(computation, members, position)
        if kind is not None:
            fusion.attributes["kind"] = kind
        touched.update(id(m) for m in members)
    # Drop the originals no top-level instruction reads any more, users first.
    for inst in reversed(computation.instructions):
        if id(inst) in touched and not inst.users and inst is not computation.root:
            computation.remove(inst)
    # A fusion is added just after its last input; one with no inputs (a broadcast
    # constant) lands at the end, after its users, until the order is restored.
    computation.sort()
    return len(groups)


@dataclass(frozen=True)
class Fusion(Pass):
    """Needs: a module that verifies.

    Guarantees: in the entry (and computations it `call`s) every fusible group
    is one `fusion` instruction with `kind` kLoop or kInput calling its own
    computation (`is_fusion_computation`); the rest is unchanged.
    """

    name: ClassVar[str] = "fuse"

    def run(self, module: HloModule) -> bool:
        fused = 0
        for computation in _fusion_targets(module):
            fused += fuse_computation(computation)
        return fused > 0


def _fusion_targets(module: HloModule) -> list[Computation]:
    """The entry and the computations `call`ed from it (not reducers, not fusions)."""
    if module.entry is None:
        return []
    targets, stack = [], [module.entry]
    while stack:
        comp = stack.pop()
        if all(comp is not t for t in targets):
            targets.append(comp)
            stack.extend(c for inst in comp.instructions if inst.opcode == "call"
                         for c in inst.called_computations)
    return targets


# The public name (output fusion and row fusion walk the same computations).
fusion_targets = _fusion_targets
