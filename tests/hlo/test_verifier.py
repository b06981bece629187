"""The verifier catches each kind of broken IR, and says where it came from."""

from __future__ import annotations

import pytest
from hlo_builders import new_module, parameters, reduce, reduce_sum_x_plus_y_times_z

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError, verify
from tfxla_lite.passes.fusion import Fusion

F32 = Shape("f32", (4,))


def _chain() -> tuple[HloModule, Computation, list[Instruction]]:
    module, comp = new_module()
    x, y = parameters(comp, F32, F32)
    add = comp.create("add", [x, y], metadata={"op_type": "AddV2", "op_name": "model/add",
                                               "source_file": "model.py", "source_line": 12})
    neg = comp.create("negate", [add])
    comp.root = neg
    return module, comp, [x, y, add, neg]


def _fused() -> HloModule:
    module = reduce_sum_x_plus_y_times_z()
    Fusion().run(module)
    return module


def test_well_formed_modules_pass() -> None:
    verify(_chain()[0])
    verify(reduce_sum_x_plus_y_times_z())
    verify(_fused())


def test_message_shows_instruction_operands_and_origin() -> None:
    module, comp, (x, y, add, neg) = _chain()
    add.shape = Shape("f32", (5,))
    with pytest.raises(VerificationError) as error:
        verify(module)
    message = str(error.value)
    assert "%add: shape f32[5]{0} differs from inferred f32[4]{0}" in message
    assert "%param_0 = f32[4]{0} parameter(0)" in message
    assert "%param_1 = f32[4]{0} parameter(1)" in message
    assert "> %add = f32[5]{0} add(" in message
    assert "from TF op model/add (AddV2) at model.py:12" in message


def test_no_entry() -> None:
    with pytest.raises(VerificationError, match="no entry"):
        verify(HloModule("empty"))


def test_no_root() -> None:
    module, comp, _ = _chain()
    comp.root = None
    with pytest.raises(VerificationError, match="has no root"):
        verify(module)


def test_topological_order() -> None:
    module, comp, (x, y, add, neg) = _chain()
    comp.instructions[2], comp.instructions[3] = neg, add
    with pytest.raises(VerificationError, match="topological order"):
        verify(module)


def test_operand_from_another_computation() -> None:
    module, comp, (x, y, add, neg) = _chain()
    other = module.new_computation("other")
    (z,) = parameters(other, F32)
    other.root = z
    neg._operands[0] = z  # bypass the IR's checks, as a buggy pass would
    add.users.remove(neg)
    z.users.append(neg)
    with pytest.raises(VerificationError, match="not in %main"):
        verify(module)


def test_use_lists_both_ways() -> None:
    module, comp, (x, y, add, neg) = _chain()
    add.users.remove(neg)
    with pytest.raises(VerificationError, match="missing from the users of operand %add"):
        verify(module)
    module, comp, (x, y, add, neg) = _chain()
    x.users.append(neg)
    with pytest.raises(VerificationError, match="lists %negate as a user"):
        verify(module)


def test_shape_of_given_shape_ops() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("broadcast", [x], shape=Shape("f32", (3, 5)), dimensions=(1,))
    with pytest.raises(VerificationError, match="broadcast dimensions"):
        verify(module)
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("reshape", [x], shape=Shape("f32", (3,)))
    with pytest.raises(VerificationError, match="reshape of"):
        verify(module)


def test_parameter_numbers() -> None:
    module, comp, (x, y, add, neg) = _chain()
    y.attributes["parameter_number"] = 2
    with pytest.raises(VerificationError, match=r"numbered \[0, 2\]"):
        verify(module)


def test_called_computation_outside_module() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = reduce(comp, x, (0,))
    stray = Computation("stray")
    a, b = parameters(stray, Shape("f32", ()), Shape("f32", ()))
    stray.root = stray.create("add", [a, b])
    comp.root.called_computations[0] = stray
    with pytest.raises(VerificationError, match="not in the module"):
        verify(module)


def test_reducer_signature() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = reduce(comp, x, (0,))
    comp.root.called_computations[0] = module.reduction_computation("add", "s32")
    with pytest.raises(VerificationError, match="to_apply"):
        verify(module)


def test_unique_names() -> None:
    module, comp, (x, y, add, neg) = _chain()
    neg.name = "add"
    with pytest.raises(VerificationError, match="used twice"):
        verify(module)


def test_fusion_kind_and_computation() -> None:
    module = _fused()
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    fusion.attributes["kind"] = "kLoop"  # but its root is a reduce: still legal
    verify(module)
    fusion.attributes["kind"] = "kMystery"
    with pytest.raises(VerificationError, match="fusion kind"):
        verify(module)
    fusion.attributes["kind"] = "kInput"
    fusion.fused_computation.is_fusion_computation = False
    with pytest.raises(VerificationError, match="not a fusion computation"):
        verify(module)


def test_fusion_computation_called_twice() -> None:
    module = _fused()
    entry = module.entry
    fusion = next(i for i in entry.instructions if i.opcode == "fusion")
    entry.create("fusion", fusion.operands, shape=fusion.shape,
                 called_computations=[fusion.fused_computation], kind="kInput")
    with pytest.raises(VerificationError, match="also called"):
        verify(module)


def test_fusion_operands_match_parameters() -> None:
    module = _fused()
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    fusion.fused_computation.parameter(0).shape = Shape("f32", (1,))
    with pytest.raises(VerificationError, match="do not match the parameters"):
        verify(module)


def test_kinput_needs_a_reduce_root() -> None:
    module, comp, (x, y, add, neg) = _chain()
    Fusion().run(module)
    fusion = comp.root
    assert fusion.opcode == "fusion" and fusion.attributes["kind"] == "kLoop"
    fusion.attributes["kind"] = "kInput"
    with pytest.raises(VerificationError, match="kInput fusion ends in a reduce"):
        verify(module)
