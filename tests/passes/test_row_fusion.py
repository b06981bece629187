"""Row fusion (`fuse-rows`): which groups form, golden text, numerics before and after."""

from __future__ import annotations

import numpy as np
from hlo_builders import check_lines, count, flatten, new_module, parameters, random_arguments

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import verify
from tfxla_lite.passes.fusion import Fusion
from tfxla_lite.passes.row_fusion import RowFusion, plan_row_fusion, row_spec

X = Shape("f32", (4, 8))


def _reduce(comp: Computation, x: Instruction, dims: tuple[int, ...], kind: str = "add",
            init: float = 0.0) -> Instruction:
    assert comp.module is not None
    reducer = comp.module.reduction_computation(kind, x.shape.element_type)
    return comp.create("reduce", [x, comp.add_constant(init, x.shape.element_type)],
                       called_computations=[reducer], dimensions=dims)


def _back(comp: Computation, value: Instruction, shape: Shape,
          dims: tuple[int, ...] = (0,)) -> Instruction:
    return comp.create("broadcast", [value], shape=shape, dimensions=dims)


def _softmax_module(shape: Shape = X) -> HloModule:
    module, comp = new_module("softmax")
    (x,) = parameters(comp, shape)
    peak = _reduce(comp, x, (1,), "maximum", float("-inf"))
    exponentials = comp.create("exponential", [comp.create("subtract",
                                                           [x, _back(comp, peak, shape)])])
    total = _reduce(comp, exponentials, (1,))
    comp.root = comp.create("divide", [exponentials, _back(comp, total, shape)])
    return module


def _run(module: HloModule, changed: bool = True, **options: int) -> None:
    """Row-fuse; the result verifies, computes what the input did and round-trips as text."""
    verify(module)
    args = random_arguments(module)
    before = evaluate(module, *args)
    assert RowFusion(**options).run(module) is changed
    verify(module)
    for after, expected in zip(flatten(evaluate(module, *args)), flatten(before), strict=True):
        np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-6)
    assert parse_module(module.to_text()).to_text() == module.to_text()


def _row_fusions(module: HloModule) -> list[Instruction]:
    assert module.entry is not None
    return [i for i in module.entry.instructions if plan_row_fusion(i) is not None]


def test_softmax_is_one_row_fusion() -> None:
    module = _softmax_module()
    _run(module)
    (fusion,) = _row_fusions(module)
    assert module.entry.root is fusion
    assert count(module.entry, "reduce") == 0 and count(module.entry, "exponential") == 0
    check_lines(module.to_text(),
                r"^%fused_computation \(param_0.1: f32\[4,8\]\) -> f32\[4,8\] \{",
                r"%reduce.2 = f32\[4\]\{0\} reduce\(.* %param_0.1, .*\), dimensions=\{1\}, "
                r"to_apply=%maximum_f32",
                r"%broadcast.2 = f32\[4,8\]\{1,0\} broadcast\(.* %reduce.2\), dimensions=\{0\}",
                r"%exponential.1 = f32\[4,8\]\{1,0\} exponential\(.* %subtract.1\)",
                r"%reduce.3 = f32\[4\]\{0\} reduce\(.* %exponential.1, .*\), dimensions=\{1\}, "
                r"to_apply=%add_f32",
                r"ROOT %divide.1 = f32\[4,8\]\{1,0\} divide\(.* %exponential.1, .* %broadcast.3\)",
                r"^ENTRY %main",
                r"ROOT %exponential_divide_fusion = f32\[4,8\]\{1,0\} fusion\(f32\[4,8\]\{1,0\} "
                r"%param_0\), kind=kCustom, calls=%fused_computation$")
    plan = plan_row_fusion(fusion)
    assert plan is not None and [r.name for r in plan.reduces] == ["reduce.2", "reduce.3"]
    assert plan.spec.rows == 4 and plan.spec.width == 8
    assert RowFusion().run(module) is False  # nothing left to fuse
    assert Fusion().run(module) is False  # and `fuse` leaves the row fusion alone


def test_layer_norm_takes_both_reductions_and_the_affine_epilogue() -> None:
    module, comp = new_module("layer_norm")
    x, gamma = parameters(comp, X, Shape("f32", (8,)))
    rows = Shape("f32", (4,))
    scale = _back(comp, comp.add_constant(0.125, "f32"), rows, ())
    mean = comp.create("multiply", [_reduce(comp, x, (1,)), scale])
    centered = comp.create("subtract", [x, _back(comp, mean, X)])
    variance = comp.create("multiply", [
        _reduce(comp, comp.create("multiply", [centered, centered]), (1,)), scale])
    column = Shape("f32", (4, 1))
    inverse = comp.create("rsqrt", [comp.create("reshape", [variance], shape=column)])
    normalized = comp.create("multiply", [
        centered, _back(comp, comp.create("reshape", [inverse], shape=rows), X)])
    comp.root = comp.create("multiply", [normalized, _back(comp, gamma, X, (1,))])
    _run(module)
    (fusion,) = _row_fusions(module)
    assert module.entry.root is fusion
    plan = plan_row_fusion(fusion)
    assert plan is not None and len(plan.reduces) == 2
    assert {i.opcode for i in module.entry.instructions} == {"parameter", "fusion"}


def test_reduce_read_outside_stays_outside() -> None:
    module = _softmax_module()
    entry = module.entry
    peak = next(i for i in entry.instructions if i.opcode == "reduce")
    entry.root = entry.create("tuple", [entry.root, peak])
    _run(module)
    (fusion,) = _row_fusions(module)
    plan = plan_row_fusion(fusion)
    assert plan is not None and len(plan.reduces) == 1  # only the sum joined
    assert peak in fusion.operands  # the max is computed once, outside


def test_column_reductions_and_lone_reduces_are_left_to_fuse() -> None:
    module, comp = new_module("columns")
    (x,) = parameters(comp, X)
    total = _reduce(comp, x, (0,))  # a column reduction: no rows
    comp.root = comp.create("divide", [x, _back(comp, total, X, (1,))])
    _run(module, changed=False)

    module, comp = new_module("lone")
    (x,) = parameters(comp, X)
    comp.root = _reduce(comp, comp.create("exponential", [x]), (1,))
    _run(module, changed=False)  # one reduce at the root: a kInput fusion's job


def test_row_value_broadcast_along_the_other_axis_is_rejected() -> None:
    square = Shape("f32", (8, 8))
    module, comp = new_module("transposed")
    (x,) = parameters(comp, square)
    total = _reduce(comp, x, (1,))
    # total[j] divides column j: row r would need every row's sum.
    comp.root = comp.create("divide", [x, _back(comp, total, square, (1,))])
    _run(module, changed=False)


def test_transposed_dependent_value_stays_outside() -> None:
    square = Shape("f32", (8, 8))
    module, comp = new_module("transpose")
    x, y = parameters(comp, square, square)
    centered = comp.create("subtract", [x, _back(comp, _reduce(comp, x, (1,)), square)])
    # Row r of the sum needs column r of `centered`: the transpose cannot join.
    comp.root = comp.create("add", [comp.create("transpose", [centered], dimensions=(1, 0)), y])
    _run(module)
    (fusion,) = _row_fusions(module)
    assert fusion.fused_computation.root.opcode == "subtract"
    assert count(module.entry, "transpose") == 1


def test_rows_wider_than_the_limit_are_left_to_fuse() -> None:
    _run(_softmax_module(Shape("f32", (2, 64))), changed=False, max_row_bytes=128)
    _run(_softmax_module(Shape("f32", (2, 64))), changed=True, max_row_bytes=256)


def test_row_spec_needs_trailing_dimensions() -> None:
    module, comp = new_module("spec")
    (x,) = parameters(comp, Shape("f32", (2, 3, 4)))
    assert row_spec(_reduce(comp, x, (1, 2))).rows == 2
    assert row_spec(_reduce(comp, x, (2,))).width == 4
    assert row_spec(_reduce(comp, x, (1,))) is None
    assert row_spec(_reduce(comp, x, (0, 2))) is None


def test_roots_with_no_row_reduce_upstream_are_not_grown(monkeypatch) -> None:  # noqa: ANN001
    """Growing every element-wise root's producers to find no reduce made the pass
    quadratic in long element-wise chains (a Philox draw); only roots below a row reduce
    are grown now, and the groups formed are the same."""
    from tfxla_lite.passes import row_fusion

    grown: list[str] = []
    original = row_fusion._grow_row_group

    def counting(root: Instruction, *args: object) -> list[Instruction] | None:
        grown.append(root.name)
        return original(root, *args)

    monkeypatch.setattr(row_fusion, "_grow_row_group", counting)
    module, comp = new_module("chain")
    (x,) = parameters(comp, X)
    value = x
    for _ in range(50):
        value = comp.create("multiply", [comp.create("add", [value, x]), x])
    comp.root = value
    assert RowFusion().run(module) is False
    assert grown == []
    module = _softmax_module()
    _run(module)
    assert grown and len(_row_fusions(module)) == 1
