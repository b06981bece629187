"""Output fusion: a dot and its elementwise epilogue become one kOutput fusion.

Golden text, counters, the cases that must stay apart (no cycle, no second reader of
the product, epilogues that are not elementwise), and numerics before and after
against the evaluator, with the verifier after every step.
"""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, count, flatten, new_module, parameters, random_arguments

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.output_fusion import OutputFusion
from tfxla_lite.passes.pipeline import optimize

X = Shape("f32", (4, 6))
W = Shape("f32", (6, 8))
OUT = Shape("f32", (4, 8))
BIAS = Shape("f32", (8,))


def _dot(comp: Computation, x: Instruction, w: Instruction) -> Instruction:
    return comp.create("dot", [x, w], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))


def _relu_dense(comp: Computation, x: Instruction, w: Instruction, b: Instruction
                ) -> Instruction:
    product = _dot(comp, x, w)
    biased = comp.create("add", [product, comp.create("broadcast", [b], shape=product.shape,
                                                      dimensions=(1,))])
    zero = comp.create("broadcast", [comp.add_constant(0.0, "f32")], shape=product.shape,
                       dimensions=())
    return comp.create("maximum", [biased, zero])


def _fuse(module: HloModule, merged: bool = True) -> None:
    """fuse then output-fusion; verified, and computing what the input computed."""
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    Fusion().run(module)
    verify(module)
    assert OutputFusion().run(module) is merged
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        # The same NumPy dot on both sides; the epilogue is the same elementwise code.
        np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-6)


def _kinds(module: HloModule) -> list[str]:
    assert module.entry is not None
    return sorted(i.attributes["kind"] for i in module.entry.instructions
                  if i.opcode == "fusion")


def test_dense_relu_is_one_output_fusion() -> None:
    module, comp = new_module()
    x, w, b = parameters(comp, X, W, BIAS)
    comp.root = _relu_dense(comp, x, w, b)
    _fuse(module)
    entry = module.entry
    assert {i.opcode for i in entry.instructions} == {"parameter", "fusion"}
    assert _kinds(module) == ["kOutput"]
    fused = entry.root.fused_computation
    assert count(fused, "dot") == 1 and count(fused, "maximum") == 1
    assert len(module.computations) == 2  # the kLoop fusion's computation is gone
    check_lines(module.to_text(),
                r"^%fused_computation.1 \(param_0.\d+: f32\[4,6\], param_1.\d+: f32\[6,8\], "
                r"param_2.\d+: f32\[8\]\) -> f32\[4,8\] \{",
                r"%dot.\d+ = f32\[4,8\]\{1,0\} dot\(.* %param_0.\d+, .* %param_1.\d+\), "
                r"lhs_contracting_dims=\{1\}, rhs_contracting_dims=\{0\}",
                r"broadcast\(.* %param_2.\d+\), dimensions=\{1\}",
                r"add\(.* %dot.\d+, ",
                r"ROOT %maximum.\d+ = f32\[4,8\]\{1,0\} maximum\(",
                r"^ENTRY %main",
                r"ROOT %dot_maximum_fusion = f32\[4,8\]\{1,0\} fusion\(f32\[4,6\]\{1,0\} "
                r"%param_0, f32\[6,8\]\{1,0\} %param_1, f32\[8\]\{0\} %param_2\), "
                r"kind=kOutput, calls=%fused_computation.1$")
    assert OutputFusion().run(module) is False  # nothing left to merge


def test_lone_elementwise_consumer_is_merged() -> None:
    module, comp = new_module()
    x, w, residual = parameters(comp, X, W, OUT)
    comp.root = comp.create("add", [_dot(comp, x, w), residual])
    _fuse(module)
    assert _kinds(module) == ["kOutput"]
    assert module.entry.root.name == "dot_add_fusion"
    assert [o.name for o in module.entry.root.operands] == ["param_0", "param_1", "param_2"]


def test_transcendental_epilogue_reading_the_product_twice() -> None:
    # tanh-gelu pieces: x * (1 + tanh(x)) reads the product twice at one index.
    module, comp = new_module()
    x, w = parameters(comp, X, W)
    product = _dot(comp, x, w)
    one = comp.create("broadcast", [comp.add_constant(1.0, "f32")], shape=OUT, dimensions=())
    comp.root = comp.create("multiply", [product, comp.create(
        "add", [one, comp.create("tanh", [product])])])
    _fuse(module)
    assert _kinds(module) == ["kOutput"]
    assert count(module.entry.root.fused_computation, "tanh") == 1


def test_second_reader_of_the_product_keeps_it_apart() -> None:
    module, comp = new_module()
    x, w, b = parameters(comp, X, W, BIAS)
    product = _dot(comp, x, w)
    activated = comp.create("tanh", [product])
    comp.root = comp.create("tuple", [activated, product])  # the product is an output too
    _fuse(module, merged=False)
    assert count(module.entry, "dot") == 1


def test_epilogue_operand_depending_on_the_product_is_never_fused() -> None:
    # y = dot(x, w); out = y + dot(y, w2): the second dot reads y, so merging y's
    # consumer into y's kernel would need the fusion before itself (a cycle).
    module, comp = new_module()
    square = Shape("f32", (8, 8))
    x, w, w2 = parameters(comp, square, square, square)
    y = _dot(comp, x, w)
    comp.root = comp.create("add", [y, _dot(comp, y, w2)])
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    Fusion().run(module)
    OutputFusion().run(module)
    verify(module)
    entry = module.entry
    # The inner dot y @ w2 has one reader (the add) and merges; y itself stays a dot.
    assert count(entry, "dot") == 1
    assert _kinds(module) == ["kOutput"]
    fusion = entry.root
    assert any(o.opcode == "dot" for o in fusion.operands)
    np.testing.assert_allclose(evaluate(module, *args), before, rtol=1e-5, atol=1e-5)


def test_reduction_consumer_is_not_an_epilogue() -> None:
    module, comp = new_module()
    x, w = parameters(comp, X, W)
    product = _dot(comp, x, w)
    reducer = module.reduction_computation("add", "f32")
    comp.root = comp.create("reduce", [comp.create("exponential", [product]),
                                       comp.add_constant(0.0, "f32")],
                            called_computations=[reducer], dimensions=(1,))
    _fuse(module, merged=False)
    assert _kinds(module) == ["kInput"]


def test_shape_changing_consumer_is_not_an_epilogue() -> None:
    module, comp = new_module()
    x, w = parameters(comp, X, W)
    product = _dot(comp, x, w)
    comp.root = comp.create("negate", [comp.create("transpose", [product],
                                                   dimensions=(1, 0))])
    _fuse(module, merged=False)
    assert count(module.entry, "dot") == 1


def test_converting_epilogue_is_not_merged() -> None:
    # The product is stored in the fusion's output buffer first: same element type only.
    module, comp = new_module()
    x, w = parameters(comp, X, W)
    comp.root = comp.create("convert", [comp.create("negate", [_dot(comp, x, w)])],
                            element_type="f64")
    _fuse(module, merged=False)


def test_two_dense_layers_in_the_default_pipeline() -> None:
    module, comp = new_module()
    x, w1, b1, w2, b2 = parameters(comp, X, W, BIAS, Shape("f32", (8, 3)), Shape("f32", (3,)))
    hidden = _relu_dense(comp, x, w1, b1)
    product = _dot(comp, hidden, w2)
    comp.root = comp.create("add", [product, comp.create("broadcast", [b2], shape=product.shape,
                                                         dimensions=(1,))])
    args = random_arguments(module)
    before = evaluate(module, *args)
    optimize(module, verify=True)
    assert _kinds(module) == ["kOutput", "kOutput"]
    assert count(module.entry, "dot") == 0
    after = flatten(evaluate(module, *args))[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-5)


def test_sum_of_two_dots_merges_one_and_reads_the_other() -> None:
    # x@W + h@U (an LSTM's gates): the add takes the first dot in; the second dot's
    # only user is then that kOutput fusion, not a kLoop, so it stays a kernel.
    module, comp = new_module()
    x, w, h, u = parameters(comp, X, W, Shape("f32", (4, 5)), Shape("f32", (5, 8)))
    comp.root = comp.create("logistic", [comp.create("add", [_dot(comp, x, w),
                                                              _dot(comp, h, u)])])
    _fuse(module)
    assert _kinds(module) == ["kOutput"]
    assert count(module.entry, "dot") == 1
    assert count(module.entry.root.fused_computation, "dot") == 1
