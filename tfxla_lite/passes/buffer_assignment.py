"""Buffer assignment: which memory every value of the entry computation lives in.

The last step of `tfxla_lite.passes`, the plan codegen and the runtime execute:
parameters in the caller's input buffers, the root's leaves in the output buffers,
constants in the executable, every other value in one temp arena. Values (one per array
or tuple leaf) whose live ranges do not overlap share space; a temp may reuse a dying
operand's buffer in place; temps that fit live in output buffers, the rest are packed
by `heap_simulator.py`. Control flow's called computations are planned on their own
and share one region (`ControlFlowPlan`). Run `add-output-copies` first. Each rule step
by step: docs/buffers.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction, user_edges
from tfxla_lite.hlo.opcodes import is_elementwise
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes.heap_simulator import (
    BufferInterval,
    FixedBuffer,
    global_decreasing_size_best_fit,
    host_in_fixed_buffers,
)
from tfxla_lite.passes.row_fusion import plan_row_fusion

ALIGNMENT = 64


@dataclass(frozen=True)
class BufferSlice:
    kind: str  # 'parameter' | 'output' | 'temp' | 'constant'
    index: int  # parameter number or output index; 0 for temp/constant
    offset: int  # byte offset in the temp arena (temp only), else 0
    size: int  # bytes

    def may_overlap(self, other: BufferSlice) -> bool:
        """Whether the two slices may share bytes: temps whose byte ranges intersect (an
        empty one shares none), the same parameter or output, or two constants (which
        the slice does not tell apart)."""
        if self.kind != other.kind:
            return False
        if self.kind == "temp":
            return self.size > 0 and other.size > 0 and \
                self.offset < other.offset + other.size and other.offset < self.offset + self.size
        if self.kind in ("parameter", "output"):
            return self.index == other.index
        return True


@dataclass
class ControlFlowPlan:
    """The memory of one `while` or `conditional`, offsets into its caller's temp arena.

    `computations`: the plan of each called computation (condition and body, or the
    branches) by name, whose temp arenas all start at `callee_temp`. A while's
    `scratch` gives, per flat leaf of its state that the body changes, the offset of
    the leaf's second buffer (the body writes the next state there while it reads the
    current one); leaves the body passes through unchanged (`passthrough`) have one
    buffer, and so do leaves it updates in place (`in_place`: a dynamic-update-slice of
    the leaf that nothing else reads, whose kernel then writes only the update,
    `loop_in_place`). `flag` is the offset of the condition's pred.
    """

    computations: dict[str, BufferAssignment]
    callee_temp: int
    scratch: dict[int, int] = field(default_factory=dict)
    passthrough: frozenset[int] = frozenset()
    flag: int | None = None  # None for a conditional
    in_place: frozenset[int] = frozenset()


@dataclass
class BufferAssignment:
    slices: dict[str, BufferSlice]  # keyed by entry instruction name
    temp_bytes: int  # arena size: the end of its last buffer (offsets are 64-aligned)
    temp_bytes_without_reuse: int  # what each temp in its own buffer would take
    # For dumps: each value's [definition, last use] positions in the entry order
    # and its shape, in that order.
    live_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    # In-place reuse: value name -> the name of the operand value whose buffer it writes.
    in_place: dict[str, str] = field(default_factory=dict)
    # Names that define no value of their own (get-tuple-element, a tuple other than
    # the root, leaf by leaf) -> the value they forward, e.g. `gte` -> `fusion{1}`.
    aliases: dict[str, str] = field(default_factory=dict)
    # By control-flow instruction name: the memory of its loop or branches.
    control_flow: dict[str, ControlFlowPlan] = field(default_factory=dict)

    def slice_of(self, instruction: Instruction | str, index: tuple[int, ...] = ()
                 ) -> BufferSlice:
        """The slice of an array-shaped instruction, or of leaf `index` of a tuple-shaped
        one (a multi-output fusion's `(1,)`); forwarding names resolve to their value."""
        name = instruction if isinstance(instruction, str) else instruction.name
        name = leaf_name(name, index)
        name = self.aliases.get(name, name)
        try:
            return self.slices[name]
        except KeyError:
            raise KeyError(f"no buffer assigned to %{name} (a tuple has one per leaf; "
                           "pass its shape index)") from None

    def to_text(self) -> str:
        """A readable dump in the spirit of XLA's `*-buffer-assignment.txt`."""
        lines = ["BufferAssignment:"]
        groups: dict[tuple[str, int], list[str]] = {}
        for name, buffer in self.slices.items():
            key = (buffer.kind, buffer.index if buffer.kind in ("parameter", "output") else 0)
            if buffer.kind == "constant":
                key = ("constant", len(groups))
            groups.setdefault(key, []).append(name)
        kind_order = {"parameter": 0, "output": 1, "constant": 2, "temp": 3}
        for n, key in enumerate(sorted(groups, key=lambda k: (kind_order[k[0]], k[1]))):
            kind, index = key
            names = groups[key]
            if kind == "temp":
                lines.append(f"allocation {n}: temp arena, size {self.temp_bytes} "
                             f"({self.temp_bytes_without_reuse} without reuse)")
                names = sorted(names, key=lambda m: (self.slices[m].offset, self.live_ranges[m]))
            else:
                label = f"{kind} {index}" if kind in ("parameter", "output") else kind
                size = max(self.slices[m].size for m in names)
                lines.append(f"allocation {n}: {label}, size {size}")
            for m in names:
                buffer = self.slices[m]
                start, end = self.live_ranges.get(m, (0, 0))
                shape = self.shapes.get(m)
                reuse = f" in place of %{self.in_place[m]}" if m in self.in_place else ""
                lines.append(f"  %{m} {shape} offset {buffer.offset} size {buffer.size} "
                             f"live [{start}, {end}]{reuse}")
        for name, plan in self.control_flow.items():
            extra = "".join(f" scratch {{{leaf}}} offset {offset}"
                            for leaf, offset in plan.scratch.items())
            extra += "".join(f" in place {{{leaf}}}" for leaf in sorted(plan.in_place))
            lines.append(f"control flow %{name}: callee arenas at offset {plan.callee_temp}"
                         f"{extra}" + ("" if plan.flag is None else f" flag offset {plan.flag}"))
            for callee, nested in plan.computations.items():
                lines.append(f"  computation %{callee}:")
                lines.extend("    " + line for line in nested.to_text().splitlines())
        lines.append(f"total temp bytes: {self.temp_bytes_without_reuse} before reuse, "
                     f"{self.temp_bytes} after reuse")
        return "\n".join(lines) + "\n"


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass(frozen=True, eq=False)
class Value:
    """One array an entry instruction defines: the whole result of an array-shaped
    instruction, or one leaf (at `index`, XLA's ShapeIndex) of a tuple-shaped one, such
    as a multi-output fusion or a variadic reduce. Tuples and get-tuple-elements define
    no value: they name values defined elsewhere."""

    instruction: Instruction
    index: tuple[int, ...]
    shape: Shape
    # Looked up for every value several times per plan (a scheduler plans each
    # candidate order): spelled once.
    name: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", leaf_name(self.instruction.name, self.index))


def leaf_name(name: str, index: tuple[int, ...]) -> str:
    """XLA's spelling of the leaf of `%name` at `index`: `name` or `name{1}`, `name{0,2}`."""
    return name if not index else name + "{" + ",".join(map(str, index)) + "}"


def leaves(shape: Shape, prefix: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Shape]]:
    """The array leaves of `shape` with their shape indices, in flat (depth-first) order."""
    if not shape.is_tuple:
        return [(prefix, shape)]
    assert shape.tuple_shapes is not None
    return [leaf for n, element in enumerate(shape.tuple_shapes)
            for leaf in leaves(element, (*prefix, n))]


def entry_values(computation: Computation) -> dict[tuple[int, tuple[int, ...]], Value]:
    """The value at each (id(instruction), shape index) leaf of `computation`.

    `tuple` and `get-tuple-element` forward their operands' values (no copy), and so
    does a `while` for the state leaves its body passes through unchanged
    (`loop_passthrough`): the loop reads them in its initial state's own buffers, which
    then live as long as the loop's result is read; every other instruction defines
    one value per leaf.
    """
    value_at: dict[tuple[int, tuple[int, ...]], Value] = {}
    for inst in computation.instructions:
        passed = loop_passthrough(inst.called_computations[1]) \
            if inst.opcode == "while" else frozenset()
        for number, (index, shape) in enumerate(leaves(inst.shape)):
            if inst.opcode == "tuple":
                value = value_at[(id(inst.operand(index[0])), index[1:])]
            elif inst.opcode == "get-tuple-element":
                value = value_at[(id(inst.operand(0)), (inst.attributes["index"], *index))]
            elif number in passed:
                value = value_at[(id(inst.operand(0)), index)]
            else:
                value = Value(inst, index, shape)
            value_at[(id(inst), index)] = value
    return value_at


def reads_only_elementwise(inst: Instruction, operand_number: int,
                           index: tuple[int, ...] = ()) -> bool:
    """Whether `inst` reads operand `operand_number` only at the output index of its
    leaf `index` (every other leaf of a loop fusion shares that index space), through
    elementwise ops, so that leaf may overwrite that operand in place."""
    operand = inst.operand(operand_number)
    leaf = dict(leaves(inst.shape)).get(index)
    # The same dimensions and element width (a compare or a convert may change the
    # type): each element's bytes are read, then written, by the same iteration.
    if operand.shape.is_tuple or leaf is None or leaf.dims != operand.shape.dims \
            or leaf.byte_size != operand.shape.byte_size:
        return False
    if inst.opcode != "fusion":
        return not index and is_elementwise(inst.opcode)
    # A row fusion (`row_fusion.py`) runs every reduce of a row before it stores that
    # row, one row per thread: a reduce of the operand ends the walk, as the root does.
    row_plan = plan_row_fusion(inst)
    if inst.attributes.get("kind") != "kLoop" and row_plan is None:
        return False
    fused = inst.fused_computation
    root = fused.root

    def ends_walk(_: Instruction, user: Instruction) -> bool:
        if user is root and user.opcode == "tuple":
            return True  # a multi-output fusion's leaves: each stored at the same index
        return row_plan is not None and any(user is r for r in row_plan.reduces)

    return all(is_elementwise(user.opcode) and user.shape.dims == operand.shape.dims
               for _, user in user_edges([fused.parameter(operand_number)], ends_walk))


def parameter_slots(computation: Computation) -> dict[tuple[int, tuple[int, ...]], int]:
    """The ABI parameter number of each (parameter number, shape index) leaf: the flat
    leaves of the parameters, in parameter order (an array parameter's own number when
    every parameter is an array)."""
    slots: dict[tuple[int, tuple[int, ...]], int] = {}
    for parameter in computation.parameters:
        for index, _ in leaves(parameter.shape):
            slots[(parameter.parameter_number, index)] = len(slots)
    return slots


class EntryValues:
    """What buffer assignment derives from the entry's instructions whatever their order:
    the value at each leaf, the values each instruction defines and reads, the outputs,
    and (memoized as asked) which operands an instruction may overwrite in place.

    The scheduler plans several orders of one entry; they share one `EntryValues`
    (`assign_buffers(..., values=...)`), which stays valid while the instructions, their
    operands and the root stay as they are (only their order may change).
    """

    def __init__(self, computation: Computation) -> None:
        root = computation.root
        if root is None:
            raise ValueError(f"computation {computation.name} has no root")
        self.computation = computation
        self.value_at = entry_values(computation)
        for inst in computation.instructions:
            if inst.opcode == "constant" and inst.shape.is_tuple:
                raise NotImplementedError(f"tuple-shaped constant %{inst.name}")
        # A tuple-shaped parameter (a loop body's state) is one ABI parameter per leaf.
        self.parameter_slots = parameter_slots(computation)
        # The root's leaves, in flat order, are the outputs; a value that appears twice
        # is the output of its first position (codegen copies it to the others).
        self.outputs: dict[int, int] = {}
        for number, (index, _) in enumerate(leaves(root.shape)):
            self.outputs.setdefault(id(self.value_at[(id(root), index)]), number)
        # By id(instruction): the values it defines, and those it reads (through any
        # name; forwarders read none: their readers read the values).
        self.defines: dict[int, list[Value]] = {}
        self.reads: dict[int, list[Value]] = {}
        for inst in computation.instructions:
            found = (self.value_at[(id(inst), index)] for index, _ in leaves(inst.shape))
            self.defines[id(inst)] = [v for v in found if v.instruction is inst]
            self.reads[id(inst)] = [] if inst.opcode in ("tuple", "get-tuple-element") else [
                self.value_at[(id(operand), index)]
                for operand in inst.operands for index, _ in leaves(operand.shape)]
        # By id(instruction): (operand number, value) of its array-shaped operands, the
        # buffers it might overwrite in place.
        self.array_operands: dict[int, list[tuple[int, Value]]] = {
            id(inst): [(n, self.value_at[(id(operand), ())])
                       for n, operand in enumerate(inst.operands) if not operand.shape.is_tuple]
            for inst in computation.instructions}
        self._elementwise: dict[tuple[int, int, tuple[int, ...]], bool] = {}

    def reads_only_elementwise(self, inst: Instruction, operand_number: int,
                               index: tuple[int, ...]) -> bool:
        key = (id(inst), operand_number, index)
        if key not in self._elementwise:
            self._elementwise[key] = reads_only_elementwise(inst, operand_number, index)
        return self._elementwise[key]


def _in_place_donor(value: Value, temps: set[int], last_use: dict[int, int],
                    facts: EntryValues, position: dict[int, int],
                    taken: set[int]) -> Value | None:
    """The operand value whose buffer temp `value` may take over (module docstring)."""
    inst = value.instruction
    for n, donor in facts.array_operands[id(inst)]:
        if id(donor) in temps and id(donor) not in taken \
                and last_use[id(donor)] == position[id(inst)] \
                and facts.reads_only_elementwise(inst, n, value.index):
            return donor
    return None


def assign_buffers(module: HloModule, in_place: bool = True,
                   values: EntryValues | None = None) -> BufferAssignment:
    """Assign a slice to every value of the entry (one per leaf of a tuple-shaped
    instruction); `in_place` allows elementwise kernels to write into a dying operand's
    buffer. `values`: the entry's `EntryValues` when the caller has them (plans of
    several orders of one entry share them)."""
    entry = module.entry
    if entry is None or entry.root is None:
        raise ValueError(f"module {module.name} has no entry root")
    return assign_computation(entry, in_place, values)


def assign_computation(entry: Computation, in_place: bool = True,
                       values: EntryValues | None = None,
                       unshared: frozenset[int] = frozenset()) -> BufferAssignment:
    """`assign_buffers` of one computation as an entry: the entry itself, or a
    computation a `while` or `conditional` calls (module docstring). No temp is hosted
    in the outputs numbered in `unshared` (a loop body's buffer updated in place, which
    holds the state until the update)."""
    if entry.root is None:
        raise ValueError(f"computation {entry.name} has no root")
    root = entry.root
    facts = values if values is not None else EntryValues(entry)
    assert facts.computation is entry and len(facts.defines) == len(entry.instructions)
    outputs = facts.outputs
    order = entry.instructions
    position = {id(inst): n for n, inst in enumerate(order)}

    # A value's last use: the last instruction that reads it, through any name (the walk
    # goes forward, so the latest reader is the last one met).
    last_use: dict[int, int] = {}
    defined: list[Value] = []
    for n, inst in enumerate(order):
        for value in facts.defines[id(inst)]:
            defined.append(value)
            last_use[id(value)] = n
        for read in facts.reads[id(inst)]:
            last_use[id(read)] = n

    slices: dict[str, BufferSlice] = {}
    live_ranges: dict[str, tuple[int, int]] = {}
    shapes: dict[str, Shape] = {}
    temps: list[Value] = []
    for value in defined:
        inst = value.instruction
        size = value.shape.byte_size
        start = position[id(inst)]
        # Outputs, parameters and constants outlive the computation.
        end = len(order) if (id(value) in outputs or inst.opcode in (
            "parameter", "constant")) else last_use[id(value)]
        live_ranges[value.name] = (start, end)
        shapes[value.name] = value.shape
        if inst.opcode == "parameter":
            slot = facts.parameter_slots[(inst.parameter_number, value.index)]
            slices[value.name] = BufferSlice("parameter", slot, 0, size)
        elif inst.opcode == "constant":
            slices[value.name] = BufferSlice("constant", 0, 0, size)
        elif id(value) in outputs:
            slices[value.name] = BufferSlice("output", outputs[id(value)], 0, size)
        else:
            temps.append(value)

    # In-place groups: each temp joins the group of the operand it overwrites; an
    # output may overwrite a dying temp too, and its group then lives in that output.
    group_of: dict[int, list[Value]] = {}
    reused: dict[str, str] = {}
    temp_ids = {id(t) for t in temps}
    taken: set[int] = set()
    for value in defined:
        if id(value) not in temp_ids and slices[value.name].kind != "output":
            continue  # parameters and constants (outputs too, without output copies)
        donor = _in_place_donor(value, temp_ids, last_use, facts, position, taken) \
            if in_place and value.shape.byte_size else None
        if donor is not None:
            taken.add(id(donor))
            group_of[id(value)] = group_of[id(donor)]
            group_of[id(value)].append(value)
            reused[value.name] = donor.name
        else:
            group_of[id(value)] = [value]
    groups = list({id(g[0]): g for g in group_of.values()}.values())
    temp_bytes_without_reuse = sum(_align(t.shape.byte_size) for t in temps)
    temp_bytes = _place_groups(groups, outputs, live_ranges, slices, unshared)

    # Names that forward a value (get-tuple-element, tuples other than the root, a
    # loop's unchanged leaves) share its slice.
    aliases: dict[str, str] = {}
    value_at = facts.value_at
    for inst in order:
        if (inst.opcode in ("tuple", "get-tuple-element") and inst is not root) \
                or inst.opcode == "while":
            for index, _ in leaves(inst.shape):
                value = value_at[(id(inst), index)]
                if value.instruction is not inst:
                    aliases[leaf_name(inst.name, index)] = value.name
    ordered = {v.name: slices[v.name] for v in defined}
    control_flow: dict[str, ControlFlowPlan] = {}
    region = _align(temp_bytes)
    for inst in order:
        if inst.opcode in ("while", "conditional"):
            control_flow[inst.name], size = _control_flow_plan(inst, region, in_place)
            temp_bytes = max(temp_bytes, region + size)
    return BufferAssignment(ordered, temp_bytes, temp_bytes_without_reuse,
                            live_ranges, shapes, reused, aliases, control_flow)


def loop_passthrough(body: Computation) -> frozenset[int]:
    """The flat leaves of a loop body's state that its root returns unchanged (the
    parameter's own leaf at the same position): the loop reads them where its initial
    state lives, a buffer that serves every iteration (`entry_values`)."""
    assert body.root is not None
    value_at = entry_values(body)
    (parameter,) = body.parameters
    return frozenset(
        number for number, (index, _) in enumerate(leaves(body.root.shape))
        if value_at[(id(body.root), index)].instruction is parameter
        and value_at[(id(body.root), index)].index == index)


def updated_operand(inst: Instruction) -> int | None:
    """The operand whose buffer a dynamic-update-slice kernel may update in place: a
    dynamic-update-slice's operand 0, or a fusion's, when its root is a
    dynamic-update-slice of a fused parameter that nothing else in it reads (XLA's
    `dynamic-update-slice_fusion`); None for any other instruction."""
    if inst.opcode == "dynamic-update-slice":
        return 0
    if inst.opcode != "fusion" or inst.shape.is_tuple:
        return None
    root = inst.fused_computation.root
    if root is None or root.opcode != "dynamic-update-slice":
        return None
    target = root.operand(0)
    if target.opcode != "parameter" or target.users != [root] \
            or target in root.operands[1:]:
        return None
    return target.parameter_number


def loop_in_place(body: Computation) -> frozenset[int]:
    """The flat state leaves that `body` may update in place (XLA's in-place
    dynamic-update-slice of a loop-carried buffer): the root's leaf n is a top-level
    dynamic-update-slice (or its fusion, `updated_operand`) of the parameter's leaf n,
    everything else that reads that
    parameter leaf runs before it, and the root does not return that leaf elsewhere.
    The caller then passes one buffer as both parameter n and output n, the body's plan
    hosts no temp in output n (`unshared`), and the kernel stores only the update (its
    copy of the operand is skipped at run time)."""
    root = body.root
    assert root is not None
    facts = EntryValues(body)
    (parameter,) = body.parameters
    returned = {id(facts.value_at[(id(root), index)]) for index, _ in leaves(root.shape)}
    found = []
    for number, (index, _) in enumerate(leaves(root.shape)):
        value = facts.value_at[(id(root), index)]
        update = value.instruction
        target = updated_operand(update)
        if target is None or value.index:
            continue
        state = facts.value_at[(id(update.operand(target)), ())]
        if state.instruction is not parameter or state.index != index or id(state) in returned:
            continue
        # Readers of the old state run before the update overwrites it: kernels run one
        # after another in the body's order (a TensorList's gradient reads an item,
        # then zeroes it).
        readers = [i for i in body.instructions if any(r is state for r in facts.reads[id(i)])]
        once = sum(read is state for read in facts.reads[id(update)]) == 1
        if readers and readers[-1] is update and once:
            found.append(number)
    return frozenset(found)


def _control_flow_plan(inst: Instruction, region: int, in_place: bool
                       ) -> tuple[ControlFlowPlan, int]:
    """The plan of a while or conditional whose region starts at `region`, and the
    region's size: a while's scratch state and flag, then the callees' arenas."""
    offset = region
    scratch: dict[int, int] = {}
    passthrough: frozenset[int] = frozenset()
    updated: frozenset[int] = frozenset()
    flag = None
    plans: dict[str, BufferAssignment] = {}
    for callee in inst.called_computations:
        if callee.name not in plans:
            plans[callee.name] = assign_computation(callee, in_place)
    if inst.opcode == "while":
        body = inst.called_computations[1]
        passthrough = loop_passthrough(body)
        wanted = loop_in_place(body)
        if wanted:  # plan the body again with nothing else in those outputs
            plans[body.name] = assign_computation(body, in_place, unshared=wanted)
        alone = {n: {name for name, s in plans[body.name].slices.items()
                     if s.kind == "output" and s.index == n} for n in wanted}
        updated = frozenset(n for n in wanted if len(alone[n]) == 1)
        for number, (_, shape) in enumerate(leaves(inst.shape)):
            if number not in passthrough | updated:
                scratch[number] = offset
                offset += _align(shape.byte_size)
        flag, offset = offset, offset + ALIGNMENT
    arena = max(plan.temp_bytes for plan in plans.values())
    plan = ControlFlowPlan(plans, offset, scratch, passthrough, flag, updated)
    return plan, offset + arena - region


def _place_groups(groups: list[list[Value]], outputs: dict[int, int],
                  live_ranges: dict[str, tuple[int, int]],
                  slices: dict[str, BufferSlice], unshared: frozenset[int] = frozenset()
                  ) -> int:
    """Give every member of `groups` its slice (`heap_simulator.py`); return the arena size.

    A group with an output in it lives in that output's buffer. Other groups move into
    an output buffer they fit in and whose contents they never overlap in time (XLA
    reuses live-out allocations so); the rest are packed into the temp arena by XLA's
    global decreasing-size best-fit heap.
    """
    fixed: dict[int, FixedBuffer] = {}
    for group in groups:
        for member in group:
            if id(member) in outputs:
                number = outputs[id(member)]
                start = min(live_ranges[m.name][0] for m in group)
                fixed[number] = FixedBuffer(str(number), member.shape.byte_size,
                                            [(start, live_ranges[member.name][1])])
                for other in group:
                    slices[other.name] = BufferSlice("output", number, 0,
                                                     other.shape.byte_size)
    intervals: dict[str, list[Value]] = {}
    for group in groups:
        if not any(id(m) in outputs for m in group):
            intervals[group[0].name] = group
    spans = [BufferInterval(name, group[0].shape.byte_size,
                            min(live_ranges[m.name][0] for m in group),
                            max(live_ranges[m.name][1] for m in group))
             for name, group in intervals.items()]
    hosted = host_in_fixed_buffers(spans, [fixed[n] for n in sorted(fixed) if n not in unshared])
    for name, number in hosted.items():
        for member in intervals[name]:
            slices[member.name] = BufferSlice("output", int(number), 0,
                                              member.shape.byte_size)
    heap = global_decreasing_size_best_fit([s for s in spans if s.name not in hosted],
                                           ALIGNMENT)
    for name, chunk in heap.chunks.items():
        for member in intervals[name]:
            slices[member.name] = BufferSlice("temp", 0, chunk.offset, chunk.size)
    return heap.heap_size
