"""Constant folding: golden text, size caps, what is never folded, changed flag,
bit-exact numerics through the evaluator, verifier."""

from __future__ import annotations

import numpy as np
from hlo_builders import (
    assert_same_bits,
    check_lines,
    count,
    edge_arguments,
    new_module,
    parameters,
    reduce,
)

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.constant_folding import ConstantFolding

F3 = Shape("f32", (3,))


def _fold_and_check(module: HloModule, changed: bool = True,
                    folding: ConstantFolding | None = None) -> None:
    verify(module)
    args = edge_arguments(module)
    before = evaluate(module, *args)
    assert (folding or ConstantFolding()).run(module) is changed
    verify(module)
    assert_same_bits(evaluate(module, *args), before)


def test_folds_a_chain_of_constant_arithmetic() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F3)
    a = comp.add_constant(np.array([1, 2, 3], np.float32))
    b = comp.add_constant(np.array([4, 5, 6], np.float32))
    folded = comp.create("negate", [comp.create("add", [a, b])])
    comp.root = comp.create("multiply", [x, folded])
    _fold_and_check(module)
    check_lines(module.to_text(), r"^ENTRY %main",
                r"%param_0 = f32\[3\]\{0\} parameter\(0\)",
                r"%constant.* = f32\[3\]\{0\} constant\(\{ -5, -7, -9 \}\)",
                r"ROOT %multiply = .* multiply\(.* %param_0, f32\[3\]\{0\} %constant")
    assert count(comp, "constant") == 1 and count(comp, "add") == 0
    assert ConstantFolding().run(module) is False


def test_keeps_signed_zeros_and_nan() -> None:
    module, comp = new_module()
    c = comp.add_constant(np.array([0.0, -0.0, np.nan, np.inf], np.float32))
    comp.root = comp.create("negate", [c])
    _fold_and_check(module)
    value = comp.root.literal
    assert list(np.signbit(value)) == [True, False, True, True]
    assert np.isnan(value[2]) and value[3] == -np.inf


def test_folds_reduce_compare_convert_and_small_iota() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, Shape("s32", (4,)))
    iota = comp.create("iota", shape=Shape("s32", (4,)), iota_dimension=0)
    total = reduce(comp, comp.create("convert", [iota], element_type="f32"), (0,))
    six = comp.create("convert", [total], element_type="s32")
    big = comp.create("compare", [six, comp.add_constant(5, "s32")], direction="GT")
    wide = comp.create("broadcast", [comp.create("convert", [big], element_type="s32")],
                       shape=Shape("s32", (4,)), dimensions=())
    comp.root = comp.create("add", [comp.create("add", [x, iota]), wide])
    _fold_and_check(module)
    text = module.to_text()
    check_lines(text, r"%constant.* = s32\[4\]\{0\} constant\(\{ 0, 1, 2, 3 \}\)",
                r"%constant.* = s32\[\] constant\(1\)",
                r"%broadcast = s32\[4\]\{0\} broadcast\(s32\[\] %constant")
    for gone in ("iota", "reduce", "compare", "convert"):
        assert f" {gone}(" not in text


def test_scalar_broadcasts_big_results_and_big_iotas_stay() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, Shape("f32", (2048,)))
    splat = comp.create("broadcast", [comp.add_constant(2.0, "f32")], shape=x.shape,
                        dimensions=())
    big = comp.add_constant(np.arange(2048, dtype=np.float32))
    doubled = comp.create("add", [big, big])  # 2048 elements: over the cap
    iota = comp.create("iota", shape=Shape("f32", (2048,)), iota_dimension=0)
    comp.root = comp.create("add", [comp.create("multiply", [x, splat]),
                                    comp.create("add", [doubled, iota])])
    text = module.to_text()
    _fold_and_check(module, changed=False)
    assert module.to_text() == text
    _fold_and_check(module, folding=ConstantFolding(max_elements=4096, max_bytes=1 << 20))
    assert count(comp, "broadcast") == 1 and count(comp, "iota") == 0


def test_parameters_and_fusion_computations_are_left_alone() -> None:
    from tfxla_lite.passes.fusion import Fusion

    module, comp = new_module()
    (x,) = parameters(comp, F3)
    two = comp.add_constant(2.0, "f32")
    scalar_sum = comp.create("add", [two, two])
    splat = comp.create("broadcast", [scalar_sum], shape=F3, dimensions=())
    comp.root = comp.create("exponential", [comp.create("add", [x, splat])])
    Fusion().run(module)
    fused = next(c for c in module.computations if c.is_fusion_computation)
    assert count(fused, "add") == 2
    _fold_and_check(module, changed=False)
    assert count(fused, "add") == 2
