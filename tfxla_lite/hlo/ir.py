"""The HLO IR: `HloModule` → `Computation` → `Instruction`, in SSA form.

Every stage below clustering speaks this IR: the TF lowering builds it, passes
rewrite it, codegen emits kernels from it. The IR keeps its own use lists:
creating an instruction registers it as a user of its operands, and
`replace_all_uses_with` / `replace_operand` / `Computation.remove` keep them
exact, so no pass edits `users` by hand (docs/conventions.md, habit 1). Instructions of a
computation stay in a topological order (operands before users).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from tfxla_lite.hlo.opcodes import infer_shape
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.shape import Shape, element_type_of
from tfxla_lite.hlo.stack_frames import StackFrameIndex


class Instruction:
    """One SSA value: `opcode` applied to `operands`, with XLA-named `attributes`.

    `called_computations` holds the computations an instruction calls
    (`to_apply` of a reduce, `calls` of a fusion). `metadata` keeps where the
    instruction came from: `op_type`, `op_name`, `source_file`, `source_line`, and
    from parsed text XLA's other keys (`stack_frame_id`, ...), as the parser read them.
    """

    __slots__ = ("opcode", "shape", "_operands", "users", "attributes", "called_computations",
                 "name", "metadata", "parent")

    def __init__(
        self,
        opcode: str,
        shape: Shape,
        operands: Iterable[Instruction] = (),
        attributes: Mapping[str, Any] | None = None,
        called_computations: Iterable[Computation] = (),
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.opcode = opcode
        self.shape = shape
        self._operands: list[Instruction] = list(operands)
        self.users: list[Instruction] = []
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.called_computations: list[Computation] = list(called_computations)
        self.name = name or opcode
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.parent: Computation | None = None

    # -- operands and uses -------------------------------------------------------------
    @property
    def operands(self) -> tuple[Instruction, ...]:
        return tuple(self._operands)

    def operand(self, index: int) -> Instruction:
        return self._operands[index]

    def replace_operand(self, index: int, new: Instruction) -> None:
        old = self._operands[index]
        self._operands[index] = new
        if old not in self._operands:
            old.users.remove(self)
        if self not in new.users:
            new.users.append(self)

    def replace_all_uses_with(self, new: Instruction) -> None:
        """Make every user of `self` (and its computation's root) use `new` instead."""
        if new is self:
            return
        for user in list(self.users):
            for i, operand in enumerate(user._operands):
                if operand is self:
                    user.replace_operand(i, new)
        if self.parent is not None and self.parent.root is self:
            self.parent.root = new

    # -- attributes ----------------------------------------------------------------------
    @property
    def literal(self) -> np.ndarray:
        return self.attributes["literal"]

    @property
    def dimensions(self) -> tuple[int, ...]:
        return tuple(self.attributes.get("dimensions", ()))

    @property
    def parameter_number(self) -> int:
        return int(self.attributes["parameter_number"])

    @property
    def fused_computation(self) -> Computation:
        assert self.opcode == "fusion"
        return self.called_computations[0]

    def __repr__(self) -> str:
        return f"<{self.name} = {self.shape} {self.opcode}>"


class Computation:
    """A named list of instructions in topological order, with parameters and a root."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.instructions: list[Instruction] = []
        self.root: Instruction | None = None
        self.module: HloModule | None = None
        self.is_fusion_computation = False
        # Attributes XLA prints after the closing brace (`execution_thread="x"`), verbatim.
        self.attributes: dict[str, str] = {}

    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self.instructions if i.opcode == "parameter"]
        return sorted(params, key=lambda p: p.parameter_number)

    def parameter(self, number: int) -> Instruction:
        for p in self.instructions:
            if p.opcode == "parameter" and p.parameter_number == number:
                return p
        raise KeyError(f"{self.name} has no parameter {number}")

    # -- building ------------------------------------------------------------------------
    def add(self, instruction: Instruction) -> Instruction:
        """Insert `instruction` just after its last operand, keeping topological order."""
        if instruction.parent is not None:
            raise ValueError(f"{instruction.name} already belongs to {instruction.parent.name}")
        for operand in instruction._operands:
            if operand.parent is not self:
                raise ValueError(f"operand {operand.name} of {instruction.name} is not in "
                                 f"computation {self.name}")
        # Just after the last operand: the first one met walking back from the end, which
        # is near the end when a computation is built in order (a full index per insert
        # made building quadratic).
        position = len(self.instructions)
        if instruction._operands:
            operands = {id(o) for o in instruction._operands}
            while position and id(self.instructions[position - 1]) not in operands:
                position -= 1
            if not position:
                raise KeyError(f"no operand of {instruction.name} in {self.name}")
        instruction.name = self._unique_name(instruction.name)
        instruction.parent = self
        self.instructions.insert(position, instruction)
        for operand in instruction._operands:
            if instruction not in operand.users:
                operand.users.append(instruction)
        return instruction

    def create(
        self,
        opcode: str,
        operands: Iterable[Instruction] = (),
        shape: Shape | None = None,
        called_computations: Iterable[Computation] = (),
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        **attributes: Any,
    ) -> Instruction:
        """Build and add an instruction; its shape is inferred when not given."""
        operands = list(operands)
        if shape is None:
            shape = infer_shape(opcode, [o.shape for o in operands], attributes)
        if opcode in ("convert", "bitcast-convert"):
            attributes.pop("element_type", None)  # the shape says it
        return self.add(Instruction(opcode, shape, operands, attributes, called_computations,
                                    name, metadata))

    def add_parameter(self, number: int, shape: Shape, name: str | None = None) -> Instruction:
        return self.create("parameter", shape=shape, name=name or f"param_{number}",
                           parameter_number=number)

    def add_constant(self, value: Any, element_type: str | None = None,
                     name: str | None = None) -> Instruction:
        array = np.asarray(value)
        if element_type is not None:
            from tfxla_lite.hlo.shape import numpy_dtype

            array = array.astype(numpy_dtype(element_type))
        element_type_of(array.dtype)  # rejects dtypes XLA has no name for
        array = np.array(array, copy=True)
        array.setflags(write=False)
        return self.create("constant", name=name or "constant", literal=array)

    def remove(self, instruction: Instruction) -> None:
        """Remove an instruction that nothing uses any more."""
        if instruction.users:
            raise ValueError(f"{instruction.name} still has users {instruction.users}")
        if instruction is self.root:
            raise ValueError(f"{instruction.name} is the root of {self.name}")
        self.instructions.remove(instruction)
        for operand in set(instruction._operands):
            operand.users.remove(instruction)
        instruction.parent = None

    def sort(self) -> None:
        """Restore topological order after edits that moved uses (stable for untouched parts)."""
        placed: set[int] = set()
        order: list[Instruction] = []

        def visit(inst: Instruction) -> None:
            stack = [(inst, iter(inst._operands))]
            while stack:
                node, it = stack[-1]
                for operand in it:
                    if id(operand) not in placed:
                        stack.append((operand, iter(operand._operands)))
                        break
                else:
                    stack.pop()
                    if id(node) not in placed:
                        placed.add(id(node))
                        order.append(node)

        for inst in self.instructions:
            visit(inst)
        self.instructions = order

    def _unique_name(self, base: str) -> str:
        taken = self.module.names if self.module is not None else self._local_names()
        if base not in taken:
            taken.add(base)
            return base
        stem = base.rsplit(".", 1)[0] if base.rsplit(".", 1)[-1].isdigit() else base
        # A module's names are never released, so every `stem.k` below the last one
        # handed out is still taken: search on from there (from 1 each time was
        # quadratic in the number of instructions of one opcode).
        hints = self.module.suffix_hints if self.module is not None else {}
        for n in itertools.count(hints.get(stem, 1)):
            candidate = f"{stem}.{n}"
            if candidate not in taken:
                taken.add(candidate)
                hints[stem] = n + 1
                return candidate
        raise AssertionError("unreachable")

    def _local_names(self) -> set[str]:
        return {i.name for i in self.instructions}

    def __iter__(self) -> Iterator[Instruction]:
        return iter(list(self.instructions))

    def __len__(self) -> int:
        return len(self.instructions)

    def __repr__(self) -> str:
        return f"<Computation {self.name}: {len(self.instructions)} instructions>"


class HloModule:
    """Computations, callees before callers, with one entry computation."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.computations: list[Computation] = []
        self.entry: Computation | None = None
        # Instruction names are unique module-wide, as XLA's printer expects.
        self.names: set[str] = set()
        # stem -> the first `stem.k` suffix that may be free (Computation._unique_name)
        self.suffix_hints: dict[str, int] = {}
        self._computation_names: set[str] = set()
        # The header's attributes as XLA printed them (`is_scheduled`, `frontend_attributes`,
        # ...), values verbatim; the printer recomputes `entry_computation_layout`.
        self.attributes: dict[str, str] = {}
        # XLA's stack-frame tables, which `metadata={stack_frame_id=N}` points into.
        self.stack_frames: StackFrameIndex | None = None

    def add_computation(self, computation: Computation, entry: bool = False) -> Computation:
        if computation.module is not None:
            raise ValueError(f"{computation.name} already belongs to a module")
        base = computation.name
        n = 0
        while computation.name in self._computation_names:
            n += 1
            computation.name = f"{base}.{n}"
        self._computation_names.add(computation.name)
        computation.module = self
        for inst in computation.instructions:
            inst.name = computation._unique_name(inst.name)
        self.computations.append(computation)
        if entry:
            self.entry = computation
        return computation

    def new_computation(self, name: str, entry: bool = False) -> Computation:
        return self.add_computation(Computation(name), entry=entry)

    def remove_computation(self, computation: Computation) -> None:
        self.computations.remove(computation)
        self._computation_names.discard(computation.name)
        computation.module = None

    def shared_computation(self, name: str, build: Callable[[Computation], None]
                           ) -> Computation:
        """The module's computation `name` (a reducer, a comparator), which `build` fills
        the first time it is asked for; every caller of the module shares it. It is
        placed before the computations that exist, so that it precedes its callers."""
        for comp in self.computations:
            if comp.name == name:
                return comp
        comp = Computation(name)
        self.computations.insert(0, comp)
        self._computation_names.add(name)
        comp.module = self
        build(comp)
        return comp

    def reduction_computation(self, kind: str, element_type: str) -> Computation:
        """The scalar computation `kind(x, y)` (add, maximum, minimum, multiply, and, or),
        shared by every reduce of the module that needs it."""
        def build(comp: Computation) -> None:
            scalar = Shape(element_type, ())
            x = comp.add_parameter(0, scalar, name="x")
            y = comp.add_parameter(1, scalar, name="y")
            comp.root = comp.create(kind, [x, y])

        return self.shared_computation(f"{kind}_{element_type}", build)

    def called_computations_in_order(self) -> list[Computation]:
        """All computations, every callee before its callers, entry last."""
        order: list[Computation] = []
        seen: set[int] = set()

        def visit(comp: Computation) -> None:
            if id(comp) in seen:
                return
            seen.add(id(comp))
            for inst in comp.instructions:
                for callee in inst.called_computations:
                    visit(callee)
            order.append(comp)

        for comp in self.computations:
            if comp is not self.entry:
                visit(comp)
        if self.entry is not None:
            visit(self.entry)
        return order

    def to_text(self) -> str:
        return module_to_text(self)

    def __str__(self) -> str:
        return self.to_text()


def user_edges(starts: Iterable[Instruction],
               stop: Callable[[Instruction, Instruction], bool] | None = None
               ) -> Iterator[tuple[Instruction, Instruction]]:
    """Every `(node, user)` edge reachable from `starts` through users, each node's
    users visited once; an edge for which `stop(node, user)` holds is neither yielded
    nor followed. Checks of how a fused value is read (only elementwise, only at its own
    index, up to the reduces or the root) are `all(...)` over these edges."""
    stack = list(starts)
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for user in node.users:
            if stop is not None and stop(node, user):
                continue
            yield node, user
            stack.append(user)


def widened_reduce_op(inst: Instruction) -> str | None:
    """"add" or "multiply" when `inst` is a one-input f16/bf16 reduce whose reducer is
    that op of its two parameters, else None. Such a sum or product accumulates in f32
    and rounds once at the end, in both backends and the evaluator (XLA's excess
    precision): folded in f16 with a rounding per step, 4096 ones sum to 2048 in order,
    and a tree still loses about one bit per doubling of the row."""
    if inst.opcode != "reduce" or inst.shape.is_tuple or len(inst.operands) != 2 or \
            inst.shape.element_type not in ("f16", "bf16"):
        return None
    reducer = inst.called_computations[0]
    root = reducer.root
    if root is None or root.opcode not in ("add", "multiply") or \
            len(reducer.instructions) != 3:
        return None
    if any(o.opcode != "parameter" for o in root.operands) or root.operand(0) is root.operand(1):
        return None
    return root.opcode
