"""Multi-output fusion: kernels that read the same data, or a producer and the kernel
that reads it, become one kernel whose result is a tuple.

After `fuse` and `output-fusion`, as XLA's `multi_output_fusion.cc`: *siblings* sharing
a non-scalar operand, and a loop *producer* read elementwise by a reduction or loop
consumer, merge one pair at a time; former users read `get-tuple-element`s. In the
entry a merge is refused when it grows the temp arena (`_Scale`); legality as XLA's
(matching iteration spaces, no cycle, bounded size). docs/architecture.md,
`multi-output-fusion`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction, user_edges
from tfxla_lite.hlo.opcodes import is_elementwise
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.buffer_assignment import BufferAssignment, assign_buffers, leaf_name, leaves
from tfxla_lite.passes.cse import eliminate_common_subexpressions, value_key
from tfxla_lite.passes.fusion import can_be_fusion_root, fusion_targets
from tfxla_lite.passes.output_copies import AddOutputCopies
from tfxla_lite.passes.scheduler import schedule

# ('loop', dims) or ('reduce', input dims, reduced dims)
Space = tuple
# (first, second, producer_consumer): the arguments of `merge`
Pair = tuple[Instruction, Instruction, bool]


def _roots(kernel: Instruction) -> list[Instruction]:
    """The instructions whose values a kernel stores (the root tuple's elements)."""
    if kernel.opcode != "fusion":
        return [kernel]
    root = kernel.fused_computation.root
    assert root is not None
    return list(root.operands) if root.opcode == "tuple" else [root]


def _is_candidate(kernel: Instruction) -> bool:
    """A kernel this pass may merge: a kLoop or kInput fusion with array-shaped roots,
    or an unfused op that `fuse` would root a fusion at."""
    if kernel.opcode != "fusion":
        return can_be_fusion_root(kernel) and kernel.opcode != "constant" and \
            not kernel.shape.is_tuple
    if kernel.attributes.get("kind") not in ("kLoop", "kInput"):
        return False
    return all(not r.shape.is_tuple and can_be_fusion_root(r) for r in _roots(kernel))


def _space(kernel: Instruction) -> Space | None:
    """The iteration space of a candidate kernel, or None when its roots disagree."""
    roots = _roots(kernel)
    reduces = [r for r in roots if r.opcode == "reduce"]
    if not reduces:
        dims = {r.shape.dims for r in roots}
        return ("loop", roots[0].shape.dims) if len(dims) == 1 else None
    first = reduces[0]
    space = ("reduce", first.operand(0).shape.dims, frozenset(first.dimensions))
    for r in reduces[1:]:
        if ("reduce", r.operand(0).shape.dims, frozenset(r.dimensions)) != space:
            return None
    if any(r.opcode != "reduce" and r.shape.dims != space[1] for r in roots):
        return None
    return space


def _unreshaped_space(kernel: Instruction) -> Space | None:
    """A loop kernel whose roots are all row-major reshapes (or bitcasts) of values of
    one shape D, seen as a loop over D: a reduction over D can store those values as it
    goes (codegen stores them by linear index, where the reshapes put them)."""
    dims = set()
    for root in _roots(kernel):
        if root.opcode not in ("reshape", "bitcast"):
            return None
        dims.add(root.operand(0).shape.dims)
    return ("loop", dims.pop()) if len(dims) == 1 else None


def _merged_space(a: Space, b: Space, extra_outputs: bool) -> Space | None:
    """The space of a kernel holding both, or None when they cannot share one loop."""
    if a == b:
        return a
    loop, reduce = (a, b) if a[0] == "loop" else (b, a)
    if loop[0] != "loop" or reduce[0] != "reduce" or loop[1] != reduce[1]:
        return None
    keeps_a_dimension = len(reduce[2]) < len(reduce[1])
    return reduce if keeps_a_dimension or not extra_outputs else None


def _has_input_shaped_outputs(kernel: Instruction) -> bool:
    return any(r.opcode != "reduce" for r in _roots(kernel))


def _reaches(source: Instruction, target: Instruction, position: dict[int, int],
             skip_direct: bool = False) -> bool:
    """Whether a path of users leads from `source` to `target` (with `skip_direct`, a
    path through at least one other instruction than `source`'s get-tuple-elements)."""
    limit = position[id(target)]
    stack = [u for u in (_readers(source) if skip_direct else source.users)
             if not (skip_direct and u is target)]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node is target:
            return True
        if id(node) in seen or position.get(id(node), limit + 1) > limit:
            continue
        seen.add(id(node))
        stack.extend(node.users)
    return False


def _size(kernel: Instruction) -> int:
    if kernel.opcode != "fusion":
        return 1
    return sum(1 for i in kernel.fused_computation.instructions
               if i.opcode not in ("parameter", "tuple"))


def _distinct_size(*kernels: Instruction) -> int:
    """The instructions of `kernels` merged, equal values (`cse.value_key`, the kernels'
    parameters taken as the operands they read) counted once."""
    numbers: dict[tuple, int] = {}
    computed = 0
    for kernel in kernels:
        params, body, _ = _body(kernel)
        value: dict[int, int] = {}
        for param, operand in zip(params, kernel.operands):
            value[id(param)] = numbers.setdefault(("operand", id(operand)), len(numbers))
        for inst in body:
            operands = [value[id(o)] if id(o) in value else
                        numbers.setdefault(("operand", id(o)), len(numbers))
                        for o in inst.operands]
            key = value_key(inst, operands)
            if key not in numbers:
                numbers[key] = len(numbers)
                computed += 1
            value[id(inst)] = numbers[key]
    return computed


@dataclass(frozen=True)
class MultiOutputFusion(Pass):
    """Needs: a fused module (after `fuse`) that verifies.

    Guarantees: legal sibling and producer-consumer pairs (module docstring) are one
    `fusion` whose root is a `tuple` of array-shaped values (kind kInput when a reduce
    is among them, else kLoop); users read it through `get-tuple-element`. In the
    entry, no merge grows the temp arena that output copies, the scheduler and buffer
    assignment then give it (with `weigh_memory`). The module still verifies and
    computes the same values.
    """

    name: ClassVar[str] = "multi-output-fusion"
    max_instructions: int = 96
    max_outputs: int = 8
    max_operands: int = 16
    # Weigh each legal merge of the entry by the temp arena it leaves (`_Scale`); a
    # weighing plans the whole entry, so a run plans at most `weighing_budget` entry
    # instructions in all, and refuses the merges it has no budget left to weigh.
    weigh_memory: bool = True
    weighing_budget: int = 1 << 12
    # The arena may end up this share larger than before the run's first merge:
    # buffer assignment's packing moves by a few hundred KB from one merge to the next,
    # which refused merges that save megabytes of reads (two kernels recomputing one
    # chain from the same nine operands).
    arena_slack: float = 1 / 32

    def run(self, module: HloModule) -> bool:
        changed = False
        for computation in fusion_targets(module):
            weigh = self.weigh_memory and computation is module.entry
            scale = _Scale(computation, self.weighing_budget, self.arena_slack) \
                if weigh else None
            while self._fuse_one(computation, scale):
                changed = True
        return changed

    def _fuse_one(self, computation: Computation, scale: _Scale | None) -> bool:
        """Merge the first legal pair that does not grow the arena; False when none is
        left. First a producer that only its consumer reads (its buffer goes), then
        siblings, then a producer that others read too (it becomes an extra output):
        siblings that share producers merge before either takes those producers in
        as extra outputs, so that the producers are then read by one kernel alone."""
        position = {id(inst): n for n, inst in enumerate(computation.instructions)}
        pairs = itertools.chain(self._producer_consumer_pairs(computation, position, False),
                                self._sibling_pairs(computation, position),
                                self._producer_consumer_pairs(computation, position, True))
        for first, second, producer_consumer in pairs:
            if scale is None or scale.allows(first, second, producer_consumer):
                fusion = merge(computation, first, second, producer_consumer)
                if scale is not None:
                    scale.merged(fusion)
                return True
        return False

    def _producer_consumer_pairs(self, computation: Computation, position: dict[int, int],
                                 needed_outside: bool) -> Iterator[Pair]:
        # Consumers last to first (XLA's order, from the root).
        for consumer in reversed(computation.instructions):
            if not _is_candidate(consumer) or (space := _space(consumer)) is None:
                continue
            for producer in dict.fromkeys(_kernel_of(o) for o in consumer.operands):
                if _needed_outside(producer, consumer) == needed_outside and \
                        self._producer_fits(producer, consumer, space, position):
                    yield producer, consumer, True

    def _sibling_pairs(self, computation: Computation, position: dict[int, int]
                       ) -> Iterator[Pair]:
        for operand in computation.instructions:
            if operand.shape.is_tuple or operand.shape.num_elements <= 1:
                continue
            siblings = [u for u in dict.fromkeys(operand.users) if _is_candidate(u)]
            for n, first in enumerate(siblings):
                for second in siblings[n + 1:]:
                    if self._siblings_fit(first, second, position):
                        yield first, second, False

    def _within_bounds(self, a: Instruction, b: Instruction, outputs: int) -> bool:
        if outputs > self.max_outputs:
            return False
        operands = {id(o) for o in a.operands} | {id(o) for o in b.operands}
        if len(operands) > self.max_operands:
            return False
        # (The size last: it counts the kernels' instructions, for every pair tried.)
        size_a, size_b = _size(a), _size(b)
        if size_a + size_b <= self.max_instructions:
            return True
        # `merge` keeps one of each value: siblings that compute one chain from the
        # same operands (a bias gradient's sum and its values for a dot) share it, and
        # a kernel that adds no more than the other's roots to it grows nothing.
        merged = _distinct_size(a, b)
        smaller = a if size_a < size_b else b
        return merged <= self.max_instructions or \
            merged <= max(size_a, size_b) + len(_roots(smaller))

    def _producer_fits(self, producer: Instruction, consumer: Instruction, space: Space,
                       position: dict[int, int]) -> bool:
        if producer.parent is not consumer.parent or not _is_candidate(producer):
            return False
        producer_space = _space(producer)
        if producer_space is None:
            return False
        needed_outside = _needed_outside(producer, consumer)
        extra = _has_input_shaped_outputs(consumer) or (
            needed_outside and _has_input_shaped_outputs(producer))
        if _merged_space(producer_space, space, extra) is None:
            return False
        # (A reduction kernel's results are never read elementwise at its input shape:
        # only its input-shaped values, when it has any, can be.)
        if not _reads_elementwise(consumer, producer, producer_space[1]):
            return False  # P's values would be computed at other indices, maybe twice
        outputs = len(_roots(consumer)) + (len(_roots(producer)) if needed_outside else 0)
        if not self._within_bounds(producer, consumer, outputs):
            return False
        # A cycle: C also reads, through another instruction, something P feeds.
        return not _reaches(producer, consumer, position, skip_direct=True)

    def _siblings_fit(self, a: Instruction, b: Instruction, position: dict[int, int]) -> bool:
        if len(_roots(a)) + len(_roots(b)) > self.max_outputs:
            return False  # the cheapest test first: big graphs have many full kernels
        space_a, space_b = _space(a), _space(b)
        if space_a is None or space_b is None:
            return False
        extra = _has_input_shaped_outputs(a) or _has_input_shaped_outputs(b) or \
            space_a[0] != space_b[0]
        if _merged_space(space_a, space_b, extra) is None:
            # A bias gradient (a reduce over [16,64,256]) and the same values reshaped
            # to [1024,256] for the weight gradient's dot: one loop over [16,64,256].
            if space_a[0] == "loop" and space_b[0] == "reduce":
                space_a = _unreshaped_space(a) or space_a
            elif space_b[0] == "loop" and space_a[0] == "reduce":
                space_b = _unreshaped_space(b) or space_b
            if _merged_space(space_a, space_b, extra) is None:
                return False
        if not self._within_bounds(a, b, len(_roots(a)) + len(_roots(b))):
            return False
        first, second = (a, b) if position[id(a)] < position[id(b)] else (b, a)
        return not _reaches(first, second, position)


class _Scale:
    """Weighs merges of an entry computation by the temp arena each leaves.

    A merge keeps values live at once that were not; as XLA refuses fusions that grow
    peak memory, one is allowed only when the arena after it (planned on a copy through
    the rest of the buffer work) is no larger than before, or within `slack` of the arena
    before the first merge. Weighing costs a whole plan, so unweighable siblings, pairs
    refused once and merges past `budget` planned instructions are refused, and a merge
    that goes ahead keeps its plan (docs/architecture.md, `multi-output-fusion`).
    """

    def __init__(self, computation: Computation, budget: int, slack: float = 0.0) -> None:
        self.slack = slack
        self.limit: int | None = None  # the first plan's arena and its slack
        self.computation = computation
        self.budget = budget  # entry instructions left to plan
        self.plan: _Plan | None = None  # the computation's plan as it stands now
        self.planned = False  # whether `plan` is up to date
        self.refused: list[tuple[Instruction, Instruction]] = []  # kept alive: ids stay
        self.allowed: _Plan | None = None  # the plan of the merge last allowed

    def allows(self, first: Instruction, second: Instruction, producer_consumer: bool) -> bool:
        if any(a is first and b is second for a, b in self.refused):
            return False
        if not self.planned:
            if not self._spend():
                return False
            self.plan, self.planned = plan_after(self.computation), True
            if self.limit is None and self.plan is not None:
                self.limit = int(self.plan.temp_bytes * (1 + self.slack))
        if self.plan is None:
            return True  # buffer assignment cannot plan it: nothing to weigh against
        apart = not producer_consumer and self.plan.apart(first, second)
        if apart or not self._spend():
            self.refused.append((first, second))
            return False
        after = plan_after(self.computation, (first, second, producer_consumer))
        if after is None or after.temp_bytes <= max(self.plan.temp_bytes, self.limit or 0):
            self.planned, self.allowed = False, after  # the merge goes ahead (`merged`)
            return True
        self.refused.append((first, second))
        return False

    def merged(self, fusion: Instruction) -> None:
        """The merge last allowed is done and made `fusion`: its weighing's plan becomes
        the entry's. That plan is charged to the budget now, as planning the entry
        again would be (the same instructions, the same length), so that the merges
        weighed, and those refused for want of budget, are the same as without reuse."""
        after, self.allowed = self.allowed, None
        if after is None or not self._spend():
            return  # planned again (and charged) when a merge is next weighed
        self.plan, self.planned = after.naming(fusion), True

    def _spend(self) -> bool:
        """Take one plan of the entry from the budget; False when too little is left."""
        cost = len(self.computation.instructions)
        if cost > self.budget:
            return False
        self.budget -= cost
        return True


@dataclass(frozen=True)
class _Plan:
    """A buffer assignment of a scratch copy of the entry and its length."""

    assignment: BufferAssignment
    length: int  # the number of instructions: outputs live to this position
    # The name the copy gave the fusion its merge made, if any (`plan_after`), and the
    # name of that fusion in the computation weighed, once merged there (`naming`):
    # the copy names its new instructions in a module of its own.
    merged_name: str | None = None
    real_name: str | None = None

    @property
    def temp_bytes(self) -> int:
        return self.assignment.temp_bytes

    def naming(self, fusion: Instruction) -> _Plan:
        """This plan, with the merged fusion read under `fusion`'s name (the fusion the
        same merge made in the computation weighed)."""
        return _Plan(self.assignment, self.length, self.merged_name, fusion.name)

    def span(self, kernel: Instruction) -> tuple[int, int] | None:
        """From the definition of `kernel`'s values to their last use, or None when one
        of them is an output (or has no plan)."""
        ranges = self.assignment.live_ranges
        # Every other instruction of the computation has a same-named clone in the copy,
        # and the copy's new names avoid those: only the merged fusion is renamed.
        name = self.merged_name if kernel.name == self.real_name else kernel.name
        spans = [ranges.get(leaf_name(name, index)) for index, _ in leaves(kernel.shape)]
        if any(s is None or s[1] >= self.length for s in spans):
            return None
        return min(s[0] for s in spans if s), max(s[1] for s in spans if s)

    def apart(self, a: Instruction, b: Instruction) -> bool:
        """Whether kernels `a` and `b` define temps only, never live at once here."""
        span_a, span_b = self.span(a), self.span(b)
        return span_a is not None and span_b is not None and (
            span_a[1] < span_b[0] or span_b[1] < span_a[0])


def plan_after(computation: Computation,
               merged: tuple[Instruction, Instruction, bool] | None = None) -> _Plan | None:
    """The buffer assignment of entry `computation` (after `merge(*merged)` when given)
    under output copies and the memory scheduler, made on a copy (instruction names
    kept); None when buffer assignment cannot plan it."""
    scratch, clones = _scratch_copy(computation)
    assert scratch.entry is not None
    merged_name = None
    if merged is not None:
        first, second, producer_consumer = merged
        merged_name = merge(scratch.entry, clones[id(first)], clones[id(second)],
                            producer_consumer).name
    try:
        AddOutputCopies().run(scratch)
        assignment = schedule(scratch)  # the scheduler's own plan of the order it keeps
        if assignment is None:
            assignment = assign_buffers(scratch)
        return _Plan(assignment, len(scratch.entry.instructions), merged_name)
    except (NotImplementedError, ValueError, KeyError):
        return None


def _scratch_copy(computation: Computation) -> tuple[HloModule, dict[int, Instruction]]:
    """A module whose entry copies `computation`'s instructions (same names, order and
    uses); the computations they call are shared, not copied (nothing here edits them).
    Also the clone of each instruction, by the original's id."""
    scratch = HloModule("scratch")
    entry = scratch.new_computation(computation.name, entry=True)
    clones: dict[int, Instruction] = {}
    for inst in computation.instructions:
        clone = Instruction(inst.opcode, inst.shape, [clones[id(o)] for o in inst.operands],
                            inst.attributes, inst.called_computations, inst.name,
                            inst.metadata)
        clone.parent = entry
        entry.instructions.append(clone)  # already topological: no search for a place
        scratch.names.add(clone.name)
        for operand in dict.fromkeys(clone.operands):
            operand.users.append(clone)
        clones[id(inst)] = clone
    assert computation.root is not None
    entry.root = clones[id(computation.root)]
    return scratch, clones


def _kernel_of(value: Instruction) -> Instruction:
    """The kernel that computes `value`: itself, or a multi-output kernel whose leaf a
    get-tuple-element names."""
    return value.operand(0) if value.opcode == "get-tuple-element" else value


def _readers(kernel: Instruction) -> list[Instruction]:
    """The instructions that read `kernel`'s values, through its get-tuple-elements."""
    found: list[Instruction] = []
    for user in kernel.users:
        found.extend(user.users if user.opcode == "get-tuple-element" else [user])
    return list(dict.fromkeys(found))


def _needed_outside(producer: Instruction, consumer: Instruction) -> bool:
    """Whether an instruction other than `consumer` reads `producer`'s values (or one
    of them is the root)."""
    root = producer.parent.root
    return any(r is not consumer for r in _readers(producer)) or producer is root or \
        any(u is root for u in producer.users)


def _reads_elementwise(consumer: Instruction, producer: Instruction,
                       dims: tuple[int, ...]) -> bool:
    """Whether `consumer` reads `producer`'s values (maybe through its
    get-tuple-elements) only at `dims`, the producer's iteration space, and through
    elementwise ops of those dimensions, ending at reduces or at the root (each
    element is read once, at the index where the fused producer computes it)."""
    if any(_kernel_of(o) is producer and (o.shape.is_tuple or o.shape.dims != dims)
           for o in consumer.operands):
        return False
    if consumer.opcode != "fusion":
        if consumer.opcode != "reduce":
            return is_elementwise(consumer.opcode) and consumer.shape.dims == dims
        return _kernel_of(consumer.operand(0)) is producer and \
            _kernel_of(consumer.operand(1)) is not producer
    fused = consumer.fused_computation

    def stop(node: Instruction, user: Instruction) -> bool:
        # The reduces that read it, and the root tuple that stores it, end a path.
        return ((user.opcode == "reduce" and user.operand(0) is node
                 and user.operand(1) is not node)
                or (user.opcode == "tuple" and user is fused.root))

    starts = [fused.parameter(n) for n, o in enumerate(consumer.operands)
              if _kernel_of(o) is producer]
    return all(is_elementwise(user.opcode) and user.shape.dims == dims
               for _, user in user_edges(starts, stop))


def _body(kernel: Instruction) -> tuple[list[Instruction], list[Instruction], list[Instruction]]:
    """(parameters, computed instructions, roots) of a kernel seen as a fusion; an
    unfused op is its own body, reading its operands."""
    if kernel.opcode == "fusion":
        fused = kernel.fused_computation
        body = [i for i in fused.instructions
                if i.opcode != "parameter" and not (i is fused.root and i.opcode == "tuple")]
        return fused.parameters, body, _roots(kernel)
    return [], [kernel], [kernel]


def merge(computation: Computation, first: Instruction, second: Instruction,
          producer_consumer: bool) -> Instruction:
    """Replace kernels `first` and `second` by one fusion returning the tuple of their
    roots (`second`'s first). With `producer_consumer`, `first` is an operand of
    `second` and is computed inside it; its roots are outputs only when some other
    instruction reads `first`."""
    module = computation.module
    assert module is not None
    keep_first = not producer_consumer or _needed_outside(first, second)
    fused = module.add_computation(Computation("fused_computation"))
    fused.is_fusion_computation = True

    inputs: list[Instruction] = []
    parameters: list[Instruction] = []

    def parameter_for(value: Instruction) -> Instruction:
        for existing, param in zip(inputs, parameters):
            if existing is value:
                return param
        inputs.append(value)
        parameters.append(fused.add_parameter(len(parameters), value.shape,
                                              name=f"param_{len(parameters)}"))
        return parameters[-1]

    clones: dict[int, Instruction] = {}

    def clone_kernel(kernel: Instruction) -> list[Instruction]:
        params, body, roots = _body(kernel)
        for param, operand in zip(params, kernel.operands):
            clones[id(param)] = clones.get(id(operand)) or parameter_for(operand)
        for inst in body:
            operands = []
            for o in inst.operands:
                if id(o) not in clones:  # an unfused op reads its operands directly
                    clones[id(o)] = parameter_for(o)
                operands.append(clones[id(o)])
            clone = Instruction(inst.opcode, inst.shape, operands, inst.attributes,
                                inst.called_computations, inst.name, inst.metadata)
            clones[id(inst)] = fused.add(clone)
        return [clones[id(r)] for r in roots]

    if producer_consumer:
        first_roots = clone_kernel(first)
        # The consumer reads the producer's values, directly or through its
        # get-tuple-elements.
        if first.shape.is_tuple:
            for element in first.users:
                if element.opcode == "get-tuple-element":
                    clones[id(element)] = first_roots[element.attributes["index"]]
        else:
            (clones[id(first)],) = first_roots
        second_roots = clone_kernel(second)
    else:
        first_roots = clone_kernel(first)
        second_roots = clone_kernel(second)
    roots = second_roots + (first_roots if keep_first else [])
    fused.root = fused.create("tuple", roots)
    eliminate_common_subexpressions(fused)  # what both kernels computed, once
    fused.sort()
    fused.instructions = parameters + [i for i in fused.instructions
                                       if i.opcode != "parameter"]

    kind = "kInput" if any(r.opcode == "reduce" for r in roots) else "kLoop"
    shape = Shape.tuple_of([r.shape for r in roots])
    name = "multi_output_" + (second.name if second.opcode == "fusion" else
                              second.opcode.replace("-", "_") + "_fusion")
    fusion = computation.add(Instruction("fusion", shape, inputs, {"kind": kind}, [fused],
                                         name, second.metadata))
    _redirect(computation, second, fusion, 0)
    if keep_first:
        _redirect(computation, first, fusion, len(second_roots))
    for old in (second, first, fusion):
        for element in list(old.users):
            if element.opcode == "get-tuple-element" and not element.users and \
                    element is not computation.root:
                computation.remove(element)  # read only by `second`, which is gone
        if old is not fusion and not old.users and old is not computation.root:
            computation.remove(old)
            # (A scratch copy's kernels call computations it shares, not owns.)
            if old.opcode == "fusion" and old.fused_computation.module is module:
                module.remove_computation(old.fused_computation)
    computation.sort()
    return fusion


def _redirect(computation: Computation, old: Instruction, fusion: Instruction,
              offset: int) -> None:
    """Point `old`'s users at its leaves of `fusion`, which start at `offset`."""
    if not old.shape.is_tuple:
        element = computation.create("get-tuple-element", [fusion], index=offset,
                                     name=old.name + ".out")
        old.replace_all_uses_with(element)
        return
    # A multi-output kernel: its get-tuple-elements move to the new indices.
    assert old.shape.tuple_shapes is not None
    elements = [computation.create("get-tuple-element", [fusion], index=offset + n)
                for n in range(len(old.shape.tuple_shapes))]
    for user in list(old.users):
        if user.opcode == "get-tuple-element":
            user.replace_all_uses_with(elements[user.attributes["index"]])
            computation.remove(user)
    if old.users or old is computation.root:
        old.replace_all_uses_with(computation.create("tuple", elements))
    for element in elements:
        if not element.users and element is not computation.root:
            computation.remove(element)
