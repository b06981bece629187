"""The CPU sort kernel (codegen/cpu/sort.py) against the evaluator and NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.shape import numpy_dtype


def _module(dims: tuple[int, ...], dimension: int, etype: str = "f32",
            direction: str = "GT", extra: str | None = None) -> str:
    """sort(x, iota[, extra]) along `dimension`, ordered by x alone under `direction`."""
    shape = f"[{','.join(map(str, dims))}]"
    types = [etype, "s32"] + ([extra] if extra else [])
    params = ", ".join(f"p.{n}.{side}: {t}[]" for n, t in enumerate(types)
                       for side in ("lhs", "rhs"))
    lines = [f"  %p.{n}.{side} = {t}[] parameter({2 * n + k})"
             for n, t in enumerate(types) for k, side in enumerate(("lhs", "rhs"))]
    results = ", ".join(f"{t}{shape}" for t in types)
    operands = ", ".join(["%x", "%iota"] + (["%y"] if extra else []))
    extra_parameter = f", y: {extra}{shape}" if extra else ""
    extra_line = f"\n  %y = {extra}{shape} parameter(1)" if extra else ""
    return f"""HloModule sort

%order ({params}) -> pred[] {{
{chr(10).join(lines)}
  ROOT %before = pred[] compare({etype}[] %p.0.lhs, {etype}[] %p.0.rhs), direction={direction}
}}

ENTRY %main (x: {etype}{shape}{extra_parameter}) -> ({results}) {{
  %x = {etype}{shape} parameter(0){extra_line}
  %iota = s32{shape} iota(), iota_dimension={dimension}
  ROOT %sort = ({results}) sort({operands}), dimensions={{{dimension}}}, is_stable=true,
    to_apply=%order
}}
"""


def _check(text: str, *args: np.ndarray, threads: int | None = None) -> list[np.ndarray]:
    got = compile_module(parse_module(text), threads=threads, cache=False)(*args)
    want = evaluate(parse_module(text), *args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint8),
                                      np.ascontiguousarray(w).view(np.uint8))
    return got


@pytest.mark.parametrize("dims,dimension", [((5,), 0), ((3, 7), 1), ((3, 7), 0),
                                            ((2, 5, 4), 1), ((1, 1), 1), ((0, 4), 1),
                                            ((4, 0), 1), ((2, 1, 3), 1)])
def test_against_the_evaluator(dims: tuple[int, ...], dimension: int) -> None:
    x = np.random.default_rng(1).integers(-3, 3, dims).astype(np.float32)
    _check(_module(dims, dimension), x)


@pytest.mark.parametrize("etype", ["f64", "f16", "bf16", "s32", "s64", "u8"])
def test_element_types(etype: str) -> None:
    x = np.random.default_rng(2).integers(0, 9, (3, 11)).astype(numpy_dtype(etype))
    _check(_module((3, 11), 1, etype, "LT"), x)


def test_three_operands_of_mixed_types_move_together() -> None:
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, (4, 9)).astype(np.float32)
    y = rng.integers(0, 2, (4, 9)).astype(np.bool_)
    _, indices, moved = _check(_module((4, 9), 1, extra="pred"), x, y)
    np.testing.assert_array_equal(moved, np.take_along_axis(y, indices, 1))


def test_a_comparator_that_is_no_order_gives_the_evaluators_permutation() -> None:
    # Plain GT leaves NaN unordered: both run the same merge, comparison for comparison.
    x = np.array([[1, np.nan, 3, -np.inf, np.nan, 0.0, -0.0, np.inf, 3, 2, np.nan]],
                 np.float32)
    _check(_module(x.shape, 1), x)


def test_long_rows_take_the_heap_path_and_any_thread_count_gives_the_same_bits() -> None:
    x = np.random.default_rng(4).integers(-50, 50, (3, 20000)).astype(np.float32)
    text = _module(x.shape, 1)
    one = compile_module(parse_module(text), threads=1, cache=False)(x)
    two = compile_module(parse_module(text), threads=2, cache=False)(x)
    order = np.argsort(-x, axis=1, kind="stable")
    np.testing.assert_array_equal(one[1], order)
    np.testing.assert_array_equal(one[0], np.take_along_axis(x, order, 1))
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def _topk_module(dims: tuple[int, ...], k: int, etype: str, largest: bool) -> str:
    shape, out = (f"[{','.join(map(str, d))}]" for d in (dims, dims[:-1] + (k,)))
    return f"""HloModule topk

ENTRY %main (x: {etype}{shape}) -> ({etype}{out}, s32{out}) {{
  %x = {etype}{shape} parameter(0)
  ROOT %topk = ({etype}{out}, s32{out}) topk(%x), k={k}, largest={str(largest).lower()}
}}
"""


@pytest.mark.parametrize("dims,k,etype,largest", [
    ((2, 6), 3, "f32", True), ((3, 50), 7, "f32", False), ((2, 3, 40), 40, "f64", True),
    ((4, 9), 0, "f32", True), ((0, 5), 2, "f32", True), ((5, 1), 1, "s32", True),
    ((3, 100), 10, "bf16", True), ((3, 100), 10, "f16", False), ((2, 64), 5, "u8", True),
    ((2, 64), 5, "s64", False)])
def test_topk_against_the_evaluator(dims: tuple[int, ...], k: int, etype: str,
                                    largest: bool) -> None:
    rng = np.random.default_rng(5)
    if etype.startswith("u"):
        x = rng.integers(0, 9, dims).astype(numpy_dtype(etype))
    elif etype.startswith("s"):
        x = rng.integers(-4, 4, dims).astype(numpy_dtype(etype))
    else:
        wide = rng.integers(-4, 4, dims).astype(np.float32)
        wide.flat[::7] = np.nan
        wide.flat[::11] = -0.0
        x = wide.astype(numpy_dtype(etype))
    _check(_topk_module(dims, k, etype, largest), x)


def test_topk_of_an_ascending_row_the_worst_case() -> None:
    x = np.arange(5000, dtype=np.float32).reshape(1, 5000)
    values, indices = _check(_topk_module(x.shape, 64, "f32", True), x)
    np.testing.assert_array_equal(indices[0], np.arange(4999, 4935, -1))
