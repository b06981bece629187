"""add-output-copies: every output in a buffer of its own."""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, flatten, new_module, parameters, random_arguments

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.output_copies import AddOutputCopies

F32 = Shape("f32", (3,))


def _outputs_are_distinct_computed_values(module) -> None:
    root = module.entry.root
    assert root.opcode == "tuple"
    assert len({id(o) for o in root.operands}) == len(root.operands)
    assert all(o.opcode not in ("parameter", "constant") for o in root.operands)


def test_copies_parameters_constants_and_repeats() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F32, F32)
    add = comp.create("add", [x, y])
    one = comp.add_constant(np.ones(3, np.float32))
    comp.root = comp.create("tuple", [add, x, one, add])
    args = random_arguments(module)
    before = evaluate(module, *args)

    assert AddOutputCopies().run(module) is True
    verify(module)
    _outputs_are_distinct_computed_values(module)
    check_lines(module.to_text(), r"%copy = f32\[3\]\{0\} copy\(f32\[3\]\{0\} %param_0\)",
                r"%copy.1 = f32\[3\]\{0\} copy\(f32\[3\]\{0\} %constant\)",
                r"%copy.2 = f32\[3\]\{0\} copy\(f32\[3\]\{0\} %add\)",
                r"ROOT %tuple = .* tuple\(.* %add, .* %copy, .* %copy.1, .* %copy.2\)")
    for a, b in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        np.testing.assert_array_equal(a, b)


def test_wraps_a_non_tuple_root() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = x
    assert AddOutputCopies().run(module) is True
    verify(module)
    _outputs_are_distinct_computed_values(module)
    check_lines(module.to_text(), r"%copy = .* copy\(.* %param_0\)",
                r"ROOT %tuple = \(f32\[3\]\{0\}\) tuple\(f32\[3\]\{0\} %copy\)")
    (result,) = evaluate(module, np.arange(3))
    np.testing.assert_array_equal(result, np.arange(3, dtype=np.float32))


def test_already_fine_is_unchanged() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = comp.create("tuple", [comp.create("negate", [x]), comp.create("abs", [x])])
    assert AddOutputCopies().run(module) is False
