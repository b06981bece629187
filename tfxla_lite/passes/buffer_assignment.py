"""Buffer assignment: which memory every value of the entry computation lives in.

The last step of `tfxla_lite.passes` and the plan codegen and the runtime execute:
parameters live in the caller's input buffers, the entry root's elements in the
output buffers, constants in the executable, and every other value in one temp
arena whose size the runtime allocates per call. Temps whose live ranges do not
overlap share space, placed as XLA's heap simulator does (`heap_simulator.h`,
GlobalDecreasingSizeBestFitHeap): biggest buffers first, each into the smallest
free gap that fits, offsets aligned to 64 bytes.

A live range runs over the positions of the entry's instruction order, from the
defining instruction through its last use, inclusive at both ends. Two temps may
share bytes only when one's range ends strictly before the other's begins, with
one exception, in-place reuse (XLA's `CanShareOperandBufferWithUser` for
elementwise users): a temp may take the buffer of an operand when

- both are temps (never a parameter, a constant or an output),
- the operand has the same shape and element type and dies at this instruction
  (this is its last use), and
- the instruction reads the operand only elementwise at its own output index: it
  is an elementwise op, or a kLoop fusion in which every path from that parameter
  to the root goes through elementwise ops of the root's dimensions (no broadcast,
  transpose, reverse, slice, pad or gather of it).

Each element is then read before it is overwritten, by the same loop iteration,
so the kernel is correct with its output aliasing that input; codegen sees the
overlap and emits that kernel without `noalias`. The two values form one buffer
whose live range is the union of theirs; chains (a → b → c) form one buffer too.

Run `add-output-copies` first to give every output a buffer of its own: without
it, an output that is a parameter or a constant keeps that kind here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_elementwise
from tfxla_lite.hlo.shape import Shape

ALIGNMENT = 64


@dataclass(frozen=True)
class BufferSlice:
    kind: str  # 'parameter' | 'output' | 'temp' | 'constant'
    index: int  # parameter number or output index; 0 for temp/constant
    offset: int  # byte offset in the temp arena (temp only), else 0
    size: int  # bytes


@dataclass
class BufferAssignment:
    slices: dict[str, BufferSlice]  # keyed by entry instruction name
    temp_bytes: int  # arena size (multiple of 64)
    temp_bytes_without_reuse: int  # what each temp in its own buffer would take
    # For dumps: each value's [definition, last use] positions in the entry order
    # and its shape, in that order.
    live_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    shapes: dict[str, Shape] = field(default_factory=dict)
    # In-place reuse: instruction name -> the name of the operand whose buffer it writes.
    in_place: dict[str, str] = field(default_factory=dict)

    def slice_of(self, instruction: Instruction | str) -> BufferSlice:
        name = instruction if isinstance(instruction, str) else instruction.name
        try:
            return self.slices[name]
        except KeyError:
            raise KeyError(f"no buffer assigned to %{name} (tuples have none)") from None

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
        lines.append(f"total temp bytes: {self.temp_bytes_without_reuse} before reuse, "
                     f"{self.temp_bytes} after reuse")
        return "\n".join(lines) + "\n"


def _align(size: int) -> int:
    return (size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _last_use(inst: Instruction, position: dict[int, int]) -> int:
    """The last position that reads `inst`, following tuples that merely forward it."""
    last = position[id(inst)]
    for user in inst.users:
        if user.opcode in ("tuple", "get-tuple-element"):
            last = max(last, _last_use(user, position))
        else:
            last = max(last, position[id(user)])
    return last


def _best_fit(size: int, busy: list[tuple[int, int]]) -> int:
    """The lowest-waste aligned offset where `size` bytes avoid every busy [begin, end)."""
    best_offset, best_waste = None, None
    cursor = 0
    for begin, end in sorted(busy):
        if begin - cursor >= size:
            waste = begin - cursor - size
            if best_waste is None or waste < best_waste:
                best_offset, best_waste = cursor, waste
        cursor = max(cursor, _align(end))
    return cursor if best_offset is None else best_offset


def reads_only_elementwise(inst: Instruction, operand_number: int) -> bool:
    """Whether `inst` reads operand `operand_number` only at its own output index,
    through elementwise ops (so its output may overwrite that operand in place)."""
    operand = inst.operand(operand_number)
    if operand.shape != inst.shape:
        return False
    if inst.opcode != "fusion":
        return is_elementwise(inst.opcode)
    if inst.attributes.get("kind") != "kLoop":
        return False
    fused = inst.fused_computation
    stack, seen = [fused.parameter(operand_number)], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for user in node.users:
            if not is_elementwise(user.opcode) or user.shape.dims != inst.shape.dims:
                return False
            stack.append(user)
    return True


def _in_place_operand(inst: Instruction, temps: set[int], position: dict[int, int]
                      ) -> Instruction | None:
    """The operand whose buffer temp `inst` may take over (module docstring), if any."""
    for n, operand in enumerate(inst.operands):
        if id(operand) in temps and _last_use(operand, position) == position[id(inst)] \
                and reads_only_elementwise(inst, n):
            return operand
    return None


def assign_buffers(module: HloModule, in_place: bool = True) -> BufferAssignment:
    """Assign a slice to every entry instruction except tuples; `in_place` allows
    elementwise kernels to write into a dying operand's buffer."""
    entry = module.entry
    if entry is None or entry.root is None:
        raise ValueError(f"module {module.name} has no entry root")
    root = entry.root
    position = {id(inst): n for n, inst in enumerate(entry.instructions)}
    outputs: dict[int, int] = {}
    for index, inst in enumerate(root.operands if root.opcode == "tuple" else (root,)):
        outputs.setdefault(id(inst), index)

    slices: dict[str, BufferSlice] = {}
    live_ranges: dict[str, tuple[int, int]] = {}
    shapes: dict[str, Shape] = {}
    temps: list[Instruction] = []
    for inst in entry.instructions:
        if inst.opcode == "tuple":
            continue
        size = inst.shape.byte_size
        start = position[id(inst)]
        # Outputs, parameters and constants outlive the computation.
        end = len(entry.instructions) if (id(inst) in outputs or inst.opcode in (
            "parameter", "constant")) else _last_use(inst, position)
        live_ranges[inst.name] = (start, end)
        shapes[inst.name] = inst.shape
        if inst.opcode == "parameter":
            slices[inst.name] = BufferSlice("parameter", inst.parameter_number, 0, size)
        elif inst.opcode == "constant":
            slices[inst.name] = BufferSlice("constant", 0, 0, size)
        elif id(inst) in outputs:
            slices[inst.name] = BufferSlice("output", outputs[id(inst)], 0, size)
        else:
            temps.append(inst)

    # In-place groups: each temp joins the group of the operand it overwrites.
    group_of: dict[int, list[Instruction]] = {}
    reused: dict[str, str] = {}
    temp_ids = {id(t) for t in temps}
    for inst in temps:
        donor = _in_place_operand(inst, temp_ids, position) if in_place else None
        if donor is not None and inst.shape.byte_size:
            group_of[id(inst)] = group_of[id(donor)]
            group_of[id(inst)].append(inst)
            reused[inst.name] = donor.name
        else:
            group_of[id(inst)] = [inst]
    groups = list({id(g[0]): g for g in group_of.values()}.values())

    # Global decreasing-size best-fit over the groups; ties go to the earlier
    # definition so that the plan is deterministic.
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, aligned size)
    temp_bytes_without_reuse = sum(_align(t.shape.byte_size) for t in temps)
    for group in sorted(groups, key=lambda g: (-g[0].shape.byte_size, position[id(g[0])])):
        size = group[0].shape.byte_size
        start = min(live_ranges[m.name][0] for m in group)
        end = max(live_ranges[m.name][1] for m in group)
        if size == 0:
            for member in group:
                slices[member.name] = BufferSlice("temp", 0, 0, 0)
            continue
        aligned = _align(size)
        busy = [(offset, offset + length) for s, e, offset, length in placed
                if not (e < start or end < s)]
        offset = _best_fit(aligned, busy)
        placed.append((start, end, offset, aligned))
        for member in group:
            slices[member.name] = BufferSlice("temp", 0, offset, size)
    temp_bytes = max((offset + length for _, _, offset, length in placed), default=0)
    ordered = {inst.name: slices[inst.name] for inst in entry.instructions if inst.name in slices}
    return BufferAssignment(ordered, _align(temp_bytes), temp_bytes_without_reuse,
                            live_ranges, shapes, reused)
