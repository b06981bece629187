"""The HLO verifier: the structural invariants every pass must leave intact.

Runs after every pass in tests and with `optimize(..., verify=True)`. A failure
raises `VerificationError` whose message shows the failing instruction, the
lines of its operands and where it came from (TF op type and name, Python
source), so a broken pass points at the TF node that exposed it.

Checked: the entry exists and every computation has a root of its own; names are
unique; instructions are in topological order and read only instructions of
their computation; use lists match operand lists both ways; parameters are
numbered 0..n-1; called computations belong to the module; shapes are what the
opcode's shape rule infers (or, for ops whose shape is given, consistent with
their operands); reducers (of reduce and reduce-window), sort comparators, while
conditions and bodies, conditional branches and scatter combiners take and return
what their caller passes; fusions call a fusion computation of their own whose
parameters and root match them.
"""

from __future__ import annotations

from collections import Counter

from tfxla_lite.hlo import random_bits
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import OPCODES, ShapeError, infer_shape
from tfxla_lite.hlo.printer import instruction_to_text
from tfxla_lite.hlo.shape import Shape

FUSION_KINDS = ("kLoop", "kInput", "kOutput", "kCustom")  # kCustom: row fusions


class VerificationError(Exception):
    """IR that breaks an invariant; the message shows the instruction and its context."""


def _describe(inst: Instruction) -> str:
    lines = []
    where = inst.parent.name if inst.parent is not None else "<no computation>"
    lines.append(f"  in computation %{where}:")
    for operand in dict.fromkeys(inst.operands):  # distinct, in order
        lines.append(f"    {instruction_to_text(operand)}")
    lines.append(f"  > {instruction_to_text(inst)}")
    metadata = inst.metadata
    origin = []
    if metadata.get("op_type") or metadata.get("op_name"):
        origin.append(f"TF op {metadata.get('op_name', '?')} ({metadata.get('op_type', '?')})")
    if metadata.get("source_file"):
        origin.append(f"at {metadata['source_file']}:{metadata.get('source_line', '?')}")
    elif isinstance(metadata.get("stack_frame_id"), int):  # XLA's stack-frame tables
        module = inst.parent.module if inst.parent is not None else None
        tables = module.stack_frames if module is not None else None
        location = tables.location(metadata["stack_frame_id"]) if tables else None
        if location is not None:
            origin.append(f"at {location[0]}:{location[1]}")
    if origin:
        lines.append("  from " + " ".join(origin))
    return "\n".join(lines)


def _fail(inst: Instruction, reason: str) -> VerificationError:
    return VerificationError(f"%{inst.name}: {reason}\n{_describe(inst)}")


def verify(module: HloModule) -> None:
    """Raise `VerificationError` at the first broken invariant of `module`."""
    if module.entry is None:
        raise VerificationError(f"module {module.name} has no entry computation")
    in_module = {id(c) for c in module.computations}
    if id(module.entry) not in in_module:
        raise VerificationError(f"entry %{module.entry.name} is not in module {module.name}")
    computation_names = Counter(c.name for c in module.computations)
    for name, count in computation_names.items():
        if count > 1:
            raise VerificationError(f"computation name %{name} is used {count} times")
    instruction_names: dict[str, Instruction] = {}
    fusion_callers: dict[int, Instruction] = {}
    for computation in module.computations:
        if computation.module is not module:
            raise VerificationError(f"computation %{computation.name} does not point back "
                                    f"to module {module.name}")
        _verify_computation(computation, in_module)
        for inst in computation.instructions:
            if inst.name in instruction_names:
                raise _fail(inst, f"name %{inst.name} is used twice")
            instruction_names[inst.name] = inst
            for callee in inst.called_computations:
                if callee.is_fusion_computation:
                    if inst.opcode != "fusion":
                        raise _fail(inst, f"{inst.opcode} calls fusion computation "
                                          f"%{callee.name}")
                    if id(callee) in fusion_callers:
                        raise _fail(inst, f"fusion computation %{callee.name} is also called "
                                          f"by %{fusion_callers[id(callee)].name}")
                    fusion_callers[id(callee)] = inst


def _verify_computation(computation: Computation, in_module: set[int]) -> None:
    root = computation.root
    if root is None:
        raise VerificationError(f"computation %{computation.name} has no root")
    if root.parent is not computation:
        raise _fail(root, f"root of %{computation.name} belongs to another computation")
    position: dict[int, int] = {}
    for n, inst in enumerate(computation.instructions):
        if id(inst) in position:
            raise _fail(inst, "appears twice in its computation")
        position[id(inst)] = n
    numbers = []
    for n, inst in enumerate(computation.instructions):
        if inst.parent is not computation:
            raise _fail(inst, f"parent is not %{computation.name}")
        for operand in inst.operands:
            if operand.parent is not computation or id(operand) not in position:
                raise _fail(inst, f"operand %{operand.name} is not in %{computation.name}")
            if position[id(operand)] >= n:
                raise _fail(inst, f"operand %{operand.name} comes after its user "
                                  "(not in topological order)")
            if not any(user is inst for user in operand.users):
                raise _fail(inst, f"missing from the users of operand %{operand.name}")
        if len({id(u) for u in inst.users}) != len(inst.users):
            raise _fail(inst, "a user is listed twice")
        for user in inst.users:
            if not any(operand is inst for operand in user.operands):
                raise _fail(inst, f"lists %{user.name} as a user, which does not read it")
            if user.parent is not computation:
                raise _fail(inst, f"user %{user.name} is in another computation")
        for callee in inst.called_computations:
            if id(callee) not in in_module:
                raise _fail(inst, f"calls %{callee.name}, which is not in the module")
        if inst.opcode == "parameter":
            numbers.append(inst.parameter_number)
        _verify_shape(inst)
        if inst.opcode == "fusion":
            _verify_fusion(inst)
    if sorted(numbers) != list(range(len(numbers))):
        raise VerificationError(f"parameters of %{computation.name} are numbered "
                                f"{sorted(numbers)}, not 0..{len(numbers) - 1}")


def _verify_shape(inst: Instruction) -> None:
    if inst.opcode == "custom-call":
        target = inst.attributes.get("custom_call_target")
        raise _fail(inst, f"not supported: custom-call {str(target).strip(chr(34))} (a call "
                          "into code of XLA's runtime or a plugin, which this compiler lacks)")
    if inst.opcode not in OPCODES:
        raise _fail(inst, f"not supported: {inst.opcode} (unknown opcode {inst.opcode!r}: "
                          f"no shape rule, evaluator rule or kernel for it)")
    operand_shapes = [o.shape for o in inst.operands]
    if OPCODES[inst.opcode].shape_rule is None:  # carried by the instruction
        _check_given_shape(inst, operand_shapes)
        return
    attributes = dict(inst.attributes)
    if inst.opcode in ("convert", "bitcast-convert"):
        attributes["element_type"] = inst.shape.element_type
    try:
        expected = infer_shape(inst.opcode, operand_shapes, attributes)
    except (ShapeError, KeyError, IndexError, ValueError, TypeError) as error:
        raise _fail(inst, f"shape rule rejects it: {error}") from None
    # XLA's builder gives set-dimension-size a static result when the size is the static
    # one, and its verifier accepts that: the size is then ignored.
    static_size = inst.opcode == "set-dimension-size" and inst.shape == expected.with_dynamic(
        inst.dimensions[0], False)
    if expected != inst.shape and not static_size:
        raise _fail(inst, f"shape {inst.shape} differs from inferred {expected}")
    if inst.opcode in ("reduce", "reduce-window"):
        _verify_reducer(inst)
    elif inst.opcode == "scatter":
        _verify_scatter(inst)
    elif inst.opcode == "while":
        _verify_while(inst)
    elif inst.opcode == "sort":
        _verify_sort(inst)


def _check_given_shape(inst: Instruction, operand_shapes: list[Shape]) -> None:
    shape = inst.shape
    opcode = inst.opcode
    if opcode == "parameter":
        if operand_shapes:
            raise _fail(inst, "a parameter takes no operands")
        if "parameter_number" not in inst.attributes:
            raise _fail(inst, "a parameter needs parameter_number")
    elif opcode == "iota":
        if operand_shapes or not 0 <= int(inst.attributes.get("iota_dimension", -1)) < shape.rank:
            raise _fail(inst, "iota takes no operands and an iota_dimension within its rank")
    elif opcode == "broadcast":
        (operand,) = _array_operands(inst, operand_shapes, 1)
        mapping = inst.dimensions
        if (len(mapping) != operand.rank or len(set(mapping)) != len(mapping)
                or shape.element_type != operand.element_type
                or any(not 0 <= d < shape.rank or shape.dims[d] != size
                       for d, size in zip(mapping, operand.dims, strict=True))):
            raise _fail(inst, f"broadcast dimensions {mapping} do not map {operand} to {shape}")
        # Dynamic dimensions come from the operand's, as XLA's inference has them.
        mapped = dict(zip(mapping, range(operand.rank), strict=True))
        if any(shape.is_dynamic_dimension(d) != (d in mapped and operand.is_dynamic_dimension(
                mapped[d])) for d in range(shape.rank)):
            raise _fail(inst, f"broadcast of {operand} to {shape}: a dynamic dimension not "
                              "the operand's")
    elif opcode in ("reshape", "bitcast"):
        (operand,) = _array_operands(inst, operand_shapes, 1)
        if operand.num_elements != shape.num_elements or operand.element_type != \
                shape.element_type:
            raise _fail(inst, f"{opcode} of {operand} cannot give {shape}")
    elif opcode == "conditional":
        _verify_conditional(inst, operand_shapes)
    elif opcode == "rng-bit-generator":
        (state,) = _array_operands(inst, operand_shapes, 1)
        try:
            random_bits.check_shapes(state, shape, inst.attributes)
        except random_bits.RandomShapeError as error:
            raise _fail(inst, str(error)) from None
    else:  # fusion, call: the called computation's signature
        if len(inst.called_computations) != 1:
            raise _fail(inst, f"{opcode} calls exactly one computation")
        callee = inst.called_computations[0]
        params = callee.parameters
        if [p.shape for p in params] != operand_shapes:
            raise _fail(inst, f"operands do not match the parameters of %{callee.name}")
        if callee.root is None or callee.root.shape != shape:
            raise _fail(inst, f"shape differs from the root of %{callee.name}")


def _array_operands(inst: Instruction, shapes: list[Shape], count: int) -> list[Shape]:
    if len(shapes) != count or any(s.is_tuple for s in shapes):
        raise _fail(inst, f"{inst.opcode} takes {count} array operand(s)")
    return shapes


def _verify_reducer(inst: Instruction) -> None:
    if len(inst.called_computations) != 1:
        raise _fail(inst, f"{inst.opcode} calls exactly one to_apply computation")
    reducer = inst.called_computations[0]
    n = len(inst.operands) // 2
    scalars = [Shape(o.shape.element_type, ()) for o in inst.operands[n:]]
    if [p.shape for p in reducer.parameters] != scalars + scalars:
        raise _fail(inst, f"to_apply %{reducer.name} does not take (accumulators, elements) "
                          f"as {scalars + scalars}")


def _verify_scatter(inst: Instruction) -> None:
    if len(inst.called_computations) != 1:
        raise _fail(inst, "scatter calls exactly one to_apply computation")
    combiner = inst.called_computations[0]
    scalar = Shape(inst.shape.element_type, ())
    if [p.shape for p in combiner.parameters] != [scalar, scalar] or \
            combiner.root is None or combiner.root.shape != scalar:
        raise _fail(inst, f"to_apply %{combiner.name} does not map (operand element, update "
                          f"element) to {scalar}")


def _verify_sort(inst: Instruction) -> None:
    if len(inst.called_computations) != 1:
        raise _fail(inst, "sort calls exactly one to_apply comparator")
    comparator = inst.called_computations[0]
    scalars = [Shape(o.shape.element_type, ()) for o in inst.operands for _ in range(2)]
    if [p.shape for p in comparator.parameters] != scalars or comparator.root is None or \
            comparator.root.shape != Shape("pred", ()):
        raise _fail(inst, f"to_apply %{comparator.name} does not map (lhs, rhs) scalars of "
                          f"each operand, {scalars}, to pred[]")


def _verify_while(inst: Instruction) -> None:
    if len(inst.called_computations) != 2:
        raise _fail(inst, "while calls a condition and a body")
    condition, body = inst.called_computations
    state = inst.shape
    for callee in (condition, body):
        if [p.shape for p in callee.parameters] != [state]:
            raise _fail(inst, f"%{callee.name} does not take the loop state {state}")
    if condition.root is None or condition.root.shape != Shape("pred", ()):
        raise _fail(inst, f"condition %{condition.name} does not return pred[]")
    if body.root is None or body.root.shape != state:
        raise _fail(inst, f"body %{body.name} does not return the loop state {state}")


def _verify_conditional(inst: Instruction, operand_shapes: list[Shape]) -> None:
    branches = inst.called_computations
    if not operand_shapes or operand_shapes[0] not in (Shape("pred", ()), Shape("s32", ())):
        raise _fail(inst, "conditional's first operand is a pred[] or s32[] selector")
    if operand_shapes[0].element_type == "pred" and len(branches) != 2:
        raise _fail(inst, "a conditional on a pred has a true and a false computation")
    if not branches or len(operand_shapes) != 1 + len(branches):
        raise _fail(inst, f"conditional has {len(branches)} branches and "
                          f"{len(operand_shapes) - 1} branch operands")
    for callee, operand in zip(branches, operand_shapes[1:], strict=True):
        if [p.shape for p in callee.parameters] != [operand]:
            raise _fail(inst, f"branch %{callee.name} does not take {operand}")
        if callee.root is None or callee.root.shape != inst.shape:
            raise _fail(inst, f"branch %{callee.name} does not return {inst.shape}")


def _verify_fusion(inst: Instruction) -> None:
    kind = inst.attributes.get("kind")
    if kind not in FUSION_KINDS:
        raise _fail(inst, f"fusion kind {kind!r} is not one of {FUSION_KINDS}")
    fused = inst.called_computations[0]
    if not fused.is_fusion_computation:
        raise _fail(inst, f"calls %{fused.name}, which is not a fusion computation")
    # A multi-output fusion ends in a tuple; a kInput one has a reduce among its elements.
    roots = [] if fused.root is None else \
        list(fused.root.operands) if fused.root.opcode == "tuple" else [fused.root]
    if kind == "kInput" and not any(r.opcode == "reduce" for r in roots):
        raise _fail(inst, "a kInput fusion ends in a reduce")
    for nested in fused.instructions:
        # Tuples inside a kernel (a variadic reduce's result, its elements) are values
        # of the kernel; only calls of other computations are not.
        if nested.opcode in ("fusion", "call") and nested is not fused.root:
            raise _fail(nested, f"{nested.opcode} inside fusion computation %{fused.name}")
