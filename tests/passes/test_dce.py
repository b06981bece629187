"""Dead code elimination: golden text, changed flag, numerics, verifier."""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, new_module, parameters, random_arguments, reduce

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.dce import DeadCodeElimination

F32 = Shape("f32", (3,))


def test_removes_unreachable_instructions_and_computations() -> None:
    module, comp = new_module()
    x, y, unused = parameters(comp, F32, F32, F32)
    comp.create("exponential", [comp.create("multiply", [x, unused])])  # dead chain
    reduce(comp, x, (0,), "maximum")  # dead reduce: its maximum_f32 computation goes too
    comp.root = comp.create("add", [x, y])
    args = random_arguments(module)
    before = evaluate(module, *args)

    assert DeadCodeElimination().run(module) is True
    verify(module)
    text = module.to_text()
    # Parameters stay even when unused: they are the signature.
    check_lines(text, r"^ENTRY %main \(param_0: f32\[3\], param_1: f32\[3\], param_2: f32\[3\]\)",
                r"%param_0 = .* parameter\(0\)", r"%param_1 = .* parameter\(1\)",
                r"ROOT %add = f32\[3\]\{0\} add\(f32\[3\]\{0\} %param_0, f32\[3\]\{0\} %param_1\)")
    check_lines(text, r"%param_2 = .* parameter\(2\)")
    assert len(module.entry.instructions) == 4
    for gone in ("multiply", "exponential", "reduce", "maximum_f32", "constant"):
        assert gone not in text
    assert [c.name for c in module.computations] == ["main"]
    np.testing.assert_array_equal(evaluate(module, *args), before)


def test_no_change_reports_false() -> None:
    module, comp = new_module()
    x, y = parameters(comp, F32, F32)
    comp.root = reduce(comp, comp.create("add", [x, y]), (0,))
    text = module.to_text()
    assert DeadCodeElimination().run(module) is False
    assert module.to_text() == text


def test_keeps_computations_called_from_live_code() -> None:
    module, comp = new_module()
    (x,) = parameters(comp, F32)
    comp.root = reduce(comp, x, (0,))
    DeadCodeElimination().run(module)
    verify(module)
    assert {c.name for c in module.computations} == {"main", "add_f32"}
