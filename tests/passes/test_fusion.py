"""Fusion: kernel counts, golden text, numerics before and after, verifier."""

from __future__ import annotations

import numpy as np
from hlo_builders import (
    check_lines,
    count,
    flatten,
    new_module,
    parameters,
    random_arguments,
    reduce,
    reduce_sum_x_plus_y_times_z,
)

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.fusion import Fusion

F32 = Shape("f32", (4, 8))
MATRIX = Shape("f32", (8, 8))
TOP_LEVEL = {"parameter", "constant", "fusion", "dot", "tuple", "get-tuple-element"}


def _fuse_and_check(module: HloModule, changed: bool = True) -> None:
    """Run fusion; the result verifies and computes what the input did."""
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    assert Fusion().run(module) is changed
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)


def _opcodes_in_fusions(module: HloModule, opcode: str) -> int:
    return sum(count(c, opcode) for c in module.computations if c.is_fusion_computation)


def test_reduce_sum_of_x_plus_y_times_z_is_one_kernel() -> None:
    module = reduce_sum_x_plus_y_times_z()
    _fuse_and_check(module)
    entry = module.entry
    assert count(entry, "fusion") == 1
    assert {i.opcode for i in entry.instructions} == {"parameter", "fusion"}
    fusion = entry.root
    assert fusion.attributes["kind"] == "kInput"
    assert fusion.fused_computation.is_fusion_computation
    check_lines(module.to_text(),
                r"^%fused_computation \(param_0.1: f32\[4,8\], param_1.1: f32\[4,8\], "
                r"param_2.1: f32\[4,8\]\) -> f32\[\] \{",
                r"%multiply.1 = f32\[4,8\]\{1,0\} multiply\(.* %param_1.1, .* %param_2.1\)",
                r"%add.2 = f32\[4,8\]\{1,0\} add\(.* %param_0.1, .* %multiply.1\)",
                r"%constant.1 = f32\[\] constant\(0\)",
                r"ROOT %reduce.1 = f32\[\] reduce\(.* %add.2, .* %constant.1\), "
                r"dimensions=\{0,1\}, to_apply=%add_f32",
                r"^ENTRY %main",
                r"ROOT %add_reduce_fusion = f32\[\] fusion\(f32\[4,8\]\{1,0\} %param_0, "
                r"f32\[4,8\]\{1,0\} %param_1, f32\[4,8\]\{1,0\} %param_2\), kind=kInput, "
                r"calls=%fused_computation$")
    assert Fusion().run(module) is False  # nothing left to fuse


def test_elementwise_chain_with_broadcast_scalar_is_one_loop_fusion() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F32, Shape("f32", (8,)))
    half = comp.create("broadcast", [comp.add_constant(0.5, "f32")], shape=F32, dimensions=())
    row = comp.create("broadcast", [y], shape=F32, dimensions=(1,))
    scaled = comp.create("multiply", [comp.create("tanh", [x]), half])
    shifted = comp.create("add", [scaled, row])
    comp.root = comp.create("convert", [comp.create("transpose", [shifted], dimensions=(1, 0))],
                            element_type="f64")
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert module.entry.root.attributes["kind"] == "kLoop"
    assert module.entry.root.name == "transpose_convert_fusion"
    assert count(module.entry, "constant") == 0  # the scalar went into the kernel


def test_dot_is_not_fused_and_splits_kernels() -> None:
    module, comp = new_module()
    x, y, w = parameters(comp, MATRIX, MATRIX, MATRIX)
    product = comp.create("dot", [comp.create("subtract", [comp.create("add", [x, y]), w]), w],
                          lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("exponential", [comp.create("negate", [product])])
    _fuse_and_check(module)
    entry = module.entry
    assert count(entry, "dot") == 1
    assert count(entry, "fusion") == 2  # subtract(add) before the dot, exp(negate) after
    assert {i.opcode for i in entry.instructions} <= TOP_LEVEL


def test_expensive_producer_is_not_duplicated() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    e = comp.create("exponential", [x])
    left = comp.create("dot", [comp.create("add", [e, comp.create("negate", [x])]), w],
                       lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    right = comp.create("dot", [comp.create("multiply", [e, comp.create("abs", [x])]), w],
                        lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [left, right])
    _fuse_and_check(module)
    total = _opcodes_in_fusions(module, "exponential") + count(module.entry, "exponential")
    assert total == 1


def test_expensive_producer_used_only_inside_one_fusion_is_fused() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    e = comp.create("exponential", [x])
    comp.root = comp.create("add", [comp.create("negate", [e]), e])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 1
    assert _opcodes_in_fusions(module, "exponential") == 1


def test_expensive_producer_behind_a_duplicated_member_stays_single() -> None:
    # negate is cheap and also read by a dot, so it is duplicated into the add's fusion;
    # exp below it would then run twice, so it must not follow negate in.
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    n = comp.create("negate", [comp.create("exponential", [x])])
    product = comp.create("dot", [n, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("add", [n, product])
    _fuse_and_check(module)
    total = _opcodes_in_fusions(module, "exponential") + count(module.entry, "exponential")
    assert total == 1
    # negate is cheap: duplicated into the add's kernel, and computed alone for the dot.
    assert _opcodes_in_fusions(module, "negate") == 1
    assert count(module.entry, "negate") == 1


def test_cheap_producer_is_duplicated_into_each_consumer() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    n = comp.create("negate", [x])
    a = comp.create("dot", [comp.create("add", [n, w]), w],
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    b = comp.create("dot", [comp.create("multiply", [n, w]), w],
                    lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    comp.root = comp.create("tuple", [a, b])
    _fuse_and_check(module)
    assert count(module.entry, "fusion") == 2
    assert count(module.entry, "negate") == 0
    assert _opcodes_in_fusions(module, "negate") == 2


def test_reduce_is_a_fusion_root_never_a_fused_producer() -> None:
    # softmax-like: exp(x - max(x)) / sum(...): reductions end kernels.
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    peak = reduce(comp, x, (1,), "maximum", -np.inf)
    shifted = comp.create("subtract", [x, comp.create("broadcast", [peak], shape=F32,
                                                      dimensions=(0,))])
    e = comp.create("exponential", [shifted])
    total = reduce(comp, e, (1,))
    comp.root = comp.create("divide", [e, comp.create("broadcast", [total], shape=F32,
                                                      dimensions=(0,))])
    _fuse_and_check(module)
    entry = module.entry
    kinds = sorted(i.attributes["kind"] for i in entry.instructions if i.opcode == "fusion")
    # max-reduce, subtract+exp, sum-reduce, divide: the reductions end kernels, and exp,
    # read by two kernels, ends one too.
    assert kinds == ["kInput", "kInput", "kLoop", "kLoop"]
    assert {i.opcode for i in entry.instructions} <= TOP_LEVEL
    assert [c.name for c in module.computations if c.is_fusion_computation] == [
        "fused_computation", "fused_computation.1", "fused_computation.2",
        "fused_computation.3"]
    # exp is expensive and read by both kernels: computed once, in the entry or a fusion.
    total_exp = _opcodes_in_fusions(module, "exponential") + count(entry, "exponential")
    assert total_exp == 1


def test_fusion_without_inputs_keeps_topological_order() -> None:
    module, comp = new_module()
    (w,) = parameters(comp, MATRIX)
    ones = comp.create("broadcast", [comp.add_constant(1.0, "f32")], shape=MATRIX, dimensions=())
    comp.root = comp.create("dot", [comp.create("negate", [ones]), w],
                            lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    _fuse_and_check(module)
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert fusion.operands == ()


def test_metadata_of_the_root_is_kept() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("negate", [comp.create("abs", [x])],
                            metadata={"op_type": "Neg", "op_name": "model/neg"})
    _fuse_and_check(module)
    assert module.entry.root.metadata == {"op_type": "Neg", "op_name": "model/neg"}
    assert 'metadata={op_type="Neg" op_name="model/neg"}' in module.to_text()


def test_nothing_to_fuse() -> None:
    module, comp = new_module()
    x, w = parameters(comp, MATRIX, MATRIX)
    comp.root = comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
    _fuse_and_check(module, changed=False)
