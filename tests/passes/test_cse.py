"""Common subexpression elimination: golden text, what must stay apart (operand
order, signed zeros, types), changed flag, bit-exact numerics, verifier."""

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
from tfxla_lite.passes.cse import CommonSubexpressionElimination

F3 = Shape("f32", (3,))


def _cse_and_check(module: HloModule, changed: bool = True) -> None:
    verify(module)
    args = edge_arguments(module)
    before = evaluate(module, *args)
    assert CommonSubexpressionElimination().run(module) is changed
    verify(module)
    assert_same_bits(evaluate(module, *args), before)


def test_merges_commutative_operands_and_whole_chains() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F3, F3)
    first = comp.create("exponential", [comp.create("add", [x, y], name="sum")])
    first.metadata = {"op_name": "first"}
    second = comp.create("exponential", [comp.create("add", [y, x])])
    second.metadata = {"op_name": "second"}
    comp.root = comp.create("multiply", [first, second])
    # `Computation.add` placed the second chain just after %param_1, so it comes first
    # in topological order: it is the one kept, with its metadata.
    _cse_and_check(module)
    check_lines(module.to_text(), r"^ENTRY %main",
                r"%add = f32\[3\]\{0\} add\(.* %param_1, .* %param_0\)",
                r"%exponential.1 = .* exponential\(f32\[3\]\{0\} %add\), "
                r'metadata=\{op_name="second"\}',
                r"ROOT %multiply = .* multiply\(.* %exponential.1, f32\[3\]\{0\} "
                r"%exponential.1\)")
    assert count(comp, "add") == 1 and count(comp, "exponential") == 1
    assert CommonSubexpressionElimination().run(module) is False


def test_keeps_apart_what_differs() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F3, F3)  # equal shapes, still two parameters
    values = [
        comp.create("subtract", [x, y]), comp.create("subtract", [y, x]),
        comp.create("compare", [x, y], direction="LT"),
        comp.create("compare", [y, x], direction="LT"),
        comp.add_constant(0.0, "f32"), comp.add_constant(-0.0, "f32"),
        comp.add_constant(1, "s32"), comp.add_constant(1, "s64"),
        comp.create("transpose", [comp.create("reshape", [x], shape=Shape("f32", (3, 1)))],
                    dimensions=(1, 0)),
        comp.create("reshape", [x], shape=Shape("f32", (1, 3))),
        reduce(comp, x, (0,), "add"), reduce(comp, x, (0,), "maximum"),
    ]
    comp.root = comp.create("tuple", values)
    # The reduces' 0.0 inits merge with the 0.0 constant; -0.0 stays apart.
    _cse_and_check(module)
    assert count(comp, "subtract") == 2 and count(comp, "compare") == 2
    assert count(comp, "parameter") == 2 and count(comp, "reduce") == 2
    zeros = [i.literal for i in comp.instructions
             if i.opcode == "constant" and i.shape == Shape("f32", ())]
    assert sorted(bool(np.signbit(z)) for z in zeros) == [False, True]


def test_merges_equal_constants_bytewise_nan_included() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F3)
    nans = [comp.add_constant(np.array([np.nan, 1, 2], np.float32)) for _ in range(2)]
    comp.root = comp.create("add", [comp.create("add", [x, nans[0]]),
                                    comp.create("add", [nans[1], x])])
    _cse_and_check(module)
    assert count(comp, "constant") == 1 and count(comp, "add") == 2
    check_lines(module.to_text(), r"%constant = f32\[3\]\{0\} constant\(\{ nan, 1, 2 \}\)",
                r"%add.* = .* add\(.* %param_0, .* %constant\)",
                r"ROOT %add.* = .* add\(.* %add.*, .* %add.*\)")


def test_equal_compare_eq_is_commutative() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F3, F3)
    comp.root = comp.create("and", [comp.create("compare", [x, y], direction="EQ"),
                                    comp.create("compare", [y, x], direction="EQ")])
    _cse_and_check(module)
    assert count(comp, "compare") == 1
