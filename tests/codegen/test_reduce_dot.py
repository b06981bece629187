"""`reduce` (row, column, full, middle, zero-size; every reducer kind) and `dot` (GEMM
layouts, batch dims, loops for integers and odd layouts) against the evaluator."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_helpers import as_args, build, check, naive_assignment
from tolerances import assert_close

from tfxla_lite.codegen import cpu
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import Shape

_INITS = {"add": 0, "multiply": 1, "maximum": -np.inf, "minimum": np.inf, "and": True,
          "or": False}


def _reduce(c: Computation, x: Instruction, dims: tuple[int, ...], kind: str) -> Instruction:
    element_type = x.shape.element_type
    init = _INITS[kind]
    if element_type in ("s32",) and kind in ("maximum", "minimum"):
        init = np.iinfo(np.int32).min if kind == "maximum" else np.iinfo(np.int32).max
    reducer = c.module.reduction_computation(kind, element_type)
    return c.create("reduce", [x, c.add_constant(init, element_type)], dimensions=dims,
                    called_computations=[reducer])


_DIMS = [(1,), (0,), (0, 1, 2), (1, 2), (0, 2), (), (2,)]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("kind", "element_type"), [
    ("add", "f32"), ("add", "f64"), ("add", "s32"), ("maximum", "f32"), ("minimum", "f64"),
    ("multiply", "f32"), ("maximum", "s32"), ("and", "pred"), ("or", "pred")])
def test_reduce(kind: str, element_type: str, fused: bool) -> None:
    x = Shape(element_type, (3, 5, 4))
    empty = Shape(element_type, (2, 0, 3))

    def body(c, ps):  # type: ignore[no-untyped-def]
        producer = ps[0]
        if element_type != "pred" and fused:  # fused producers compute inline
            producer = c.create("add", [ps[0], ps[0]])
        return [_reduce(c, producer, dims, kind) for dims in _DIMS] + [
            _reduce(c, ps[1], (1,), kind), _reduce(c, ps[1], (0, 2), kind)]

    low, high = (-2, 2) if kind == "multiply" else (-50, 50)
    args = as_args([x, empty], seed=7, low=low, high=high, edges=False)
    check(build("reduce", [x, empty], body), args, "reduce", fused)


def test_reduce_max_propagates_nan() -> None:
    x = Shape("f32", (3, 4))
    module = build("nanmax", [x], lambda c, ps: [_reduce(c, ps[0], (1,), "maximum"),
                                                 _reduce(c, ps[0], (0,), "minimum")])
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    values[1, 2] = np.nan
    row_max, col_min = check(module, [values], "reduce")(values)
    assert np.isnan(row_max[1]) and not np.isnan(row_max[[0, 2]]).any()
    assert np.isnan(col_min[2]) and not np.isnan(col_min[[0, 1, 3]]).any()


def test_reduce_general_computation() -> None:
    """A to_apply that is not one op: sum of squares-ish `x + y*y`."""
    x = Shape("f32", (4, 6))

    def body(c, ps):  # type: ignore[no-untyped-def]
        module = c.module
        comp = module.new_computation("sum_sq")
        a = comp.add_parameter(0, Shape("f32", ()), name="a")
        b = comp.add_parameter(1, Shape("f32", ()), name="b")
        comp.root = comp.create("add", [a, comp.create("multiply", [b, b])])
        init = c.add_constant(0.0, "f32")
        return [c.create("reduce", [ps[0], init], dimensions=(1,), called_computations=[comp]),
                c.create("reduce", [ps[0], init], dimensions=(0,), called_computations=[comp])]

    check(build("sumsq", [x], body), as_args([x], edges=False), "reduce")


def _dot(c: Computation, lhs: Instruction, rhs: Instruction, lb: tuple[int, ...] = (),
         rb: tuple[int, ...] = (), lc: tuple[int, ...] = (1,), rc: tuple[int, ...] = (0,)
         ) -> Instruction:
    return c.create("dot", [lhs, rhs], lhs_batch_dims=lb, rhs_batch_dims=rb,
                    lhs_contracting_dims=lc, rhs_contracting_dims=rc)


@pytest.mark.parametrize("strategy", ["library", "emitted"])
@pytest.mark.parametrize("element_type", ["f32", "f64", "s32", "f16"])
def test_dot_layouts(element_type: str, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each layout by both strategies of GEMM-shaped dots (dot.choose_strategy picks
    per shape; forced here), and by the element generator for s32 and f16."""
    monkeypatch.setattr(dot_codegen, "choose_strategy", lambda plan: strategy)
    a = Shape(element_type, (5, 7))
    b = Shape(element_type, (7, 3))
    at = Shape(element_type, (7, 5))
    bt = Shape(element_type, (3, 7))
    batched = Shape(element_type, (2, 5, 7))
    batched_rhs = Shape(element_type, (7, 2, 3))  # batch dim in the middle
    vector = Shape(element_type, (7,))
    empty = Shape(element_type, (0, 7))
    shapes = [a, b, at, bt, batched, batched_rhs, vector, empty]

    def body(c, ps):  # type: ignore[no-untyped-def]
        a_, b_, at_, bt_, batched_, batched_rhs_, vector_, empty_ = ps
        return [
            _dot(c, a_, b_),
            _dot(c, at_, b_, lc=(0,)),
            _dot(c, a_, bt_, rc=(1,)),
            _dot(c, at_, bt_, lc=(0,), rc=(1,)),
            _dot(c, batched_, batched_rhs_, lb=(0,), rb=(1,), lc=(2,), rc=(0,)),
            _dot(c, vector_, b_, lc=(0,)),
            _dot(c, a_, vector_, rc=(0,)),
            _dot(c, vector_, vector_, lc=(0,), rc=(0,)),
            _dot(c, empty_, b_),
            _dot(c, a_, empty_, rc=(1,), lc=(1,)),
        ]

    args = as_args(shapes, seed=11, low=-3, high=3, edges=False)
    module = build("dot", shapes, body)
    expected = evaluate(module, *args)
    # No compile cache: the HLO is the same for both strategies.
    executable = cpu.compile(module, naive_assignment(module), cache=False)
    for n, (actual, wanted) in enumerate(zip(executable(*args), expected, strict=True)):
        assert_close(actual, wanted, "dot", context=f"output {n}")
    library = element_type in ("f32", "f64") and strategy == "library"
    gemm = f"cblas_{'s' if element_type == 'f32' else 'd'}gemm"
    assert (gemm in executable.llvm_ir) == library


def test_dot_zero_contracting() -> None:
    a = Shape("f32", (3, 0))
    b = Shape("f32", (0, 4))
    module = build("k0", [a, b], lambda c, ps: [_dot(c, *ps)])
    (result,) = check(module, as_args([a, b]), "dot")(*as_args([a, b]))
    assert (result == 0).all() and result.shape == (3, 4)


def test_dot_strided_fallback() -> None:
    """A contracting group GEMM cannot flatten ((0, 2) around a free dim) uses loops."""
    lhs = Shape("f32", (3, 4, 5))
    rhs = Shape("f32", (3, 5, 2))
    module = build("odd", [lhs, rhs], lambda c, ps: [_dot(c, *ps, lc=(0, 2), rc=(0, 1))])
    executable = check(module, as_args([lhs, rhs], edges=False), "dot", fused=False)
    assert "gemm" not in executable.llvm_ir


def test_dot_then_elementwise_pipeline() -> None:
    """A dense layer through the pipeline: the dot and its bias-relu epilogue."""
    a = Shape("f32", (8, 16))
    b = Shape("f32", (16, 4))
    bias = Shape("f32", (4,))

    def body(c, ps):  # type: ignore[no-untyped-def]
        product = _dot(c, ps[0], ps[1])
        biased = c.create("add", [product, c.create("broadcast", [ps[2]], shape=product.shape,
                                                    dimensions=(1,))])
        zero = c.create("broadcast", [c.add_constant(0.0, "f32")], shape=product.shape,
                        dimensions=())
        return [c.create("maximum", [biased, zero])]

    executable = check(build("dense", [a, b, bias], body), as_args([a, b, bias], edges=False),
                       "dot")
    assert executable.kernel_count == 1  # the dot with its epilogue: one kOutput kernel
    assert "kind=kOutput" in executable.optimized_hlo_text


@pytest.mark.parametrize(("kind", "element_type"), [
    ("add", "f32"), ("add", "f64"), ("maximum", "f32"), ("minimum", "f64"), ("multiply", "f32"),
    ("add", "f16")])
def test_reduce_long_rows(kind: str, element_type: str) -> None:
    """Rows long enough for interleaved partial accumulators, with a tail; NaN lanes."""
    x = Shape(element_type, (3, 37))
    y = Shape(element_type, (2, 3, 40))

    def body(c, ps):  # type: ignore[no-untyped-def]
        return [_reduce(c, c.create("negate", [ps[0]]), (1,), kind),
                _reduce(c, ps[1], (1, 2), kind), _reduce(c, ps[1], (0, 1, 2), kind),
                _reduce(c, ps[0], (0, 1), kind)]

    low, high = (0.9, 1.1) if kind == "multiply" else (-10, 10)
    args = as_args([x, y], seed=12, low=low, high=high, edges=False)
    if kind != "multiply":
        args[0][1, 35] = np.nan  # in the tail
        args[1][1, 2, 7] = np.nan  # in a lane
    check(build("rows", [x, y], body), args, "reduce")
