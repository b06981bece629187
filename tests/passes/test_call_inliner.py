"""call-inliner: no call left, the same values, the verifier after the pass."""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, count, flatten, new_module, parameters, random_arguments

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.call_inliner import CallInliner
from tfxla_lite.passes.dce import DeadCodeElimination

F32 = Shape("f32", (3, 4))


def test_nested_and_repeated_calls_are_inlined() -> None:
    module, comp = new_module("calls")
    inner = module.new_computation("inner")
    a, b = (inner.add_parameter(n, F32) for n in range(2))
    inner.root = inner.create("add", [inner.create("multiply", [a, b]), a])
    outer = module.new_computation("outer")
    p = outer.add_parameter(0, F32)
    once = outer.create("call", [p, p], shape=F32, called_computations=[inner])
    outer.root = outer.create("tuple", [once, outer.create("negate", [once])])
    x, y = parameters(comp, F32, F32)
    first = comp.create("call", [x, y], shape=F32, called_computations=[inner])
    second = comp.create("call", [y, x], shape=F32, called_computations=[inner])
    pair = comp.create("call", [comp.create("subtract", [first, second])],
                       shape=Shape.tuple_of([F32, F32]), called_computations=[outer])
    comp.root = comp.create("tuple", [comp.create("get-tuple-element", [pair], index=1),
                                      first])
    verify(module)
    args = random_arguments(module)
    before = flatten(evaluate(module, *args))

    assert CallInliner().run(module) is True
    verify(module)
    assert count(comp, "call") == 0
    assert count(comp, "multiply") == 3  # inner, three times (once through outer)
    for after, expected in zip(flatten(evaluate(module, *args)), before, strict=True):
        np.testing.assert_array_equal(after, expected)
    check_lines(module.to_text(), r"^ENTRY %main \((?P<x>\S+): f32\[3,4\], (\S+): ",
                r"multiply\(.* %param_0.2, .* %param_1.1\)",
                r"multiply\(.* %param_1.1, .* %param_0.2\)",
                r"%subtract = .* subtract\(.* %add.2, .* %add.1\)",
                r"multiply\(.* %subtract, .* %subtract\)",
                r"negate\(",
                r"tuple\(.* %add.3, .* %negate.1\)",
                r"get-tuple-element\(.* %tuple.2\), index=1")
    assert CallInliner().run(module) is False
    DeadCodeElimination().run(module)
    assert [c.name for c in module.computations] == ["main"]
