"""The NumPy reference evaluator against hand-written NumPy, opcode by opcode."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hlo_builders import new_module, parameters, reduce

from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.opcodes import COMPARISON_DIRECTIONS, opcodes_in
from tfxla_lite.hlo.shape import Shape

SHAPES = [(), (0,), (5,), (2, 3), (2, 0, 3)]
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 1.5, -2.5, 3.0], np.float32)


def _values(dims: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(dims, dtype=np.int64))
    if dtype == "pred":
        return (rng.integers(0, 2, n) == 1).reshape(dims)
    if dtype.startswith("f"):
        values = rng.normal(size=n).astype(np.float32) * 3
        values[: min(n, len(SPECIAL))] = SPECIAL[: min(n, len(SPECIAL))]
        return values.reshape(dims).astype({"f32": np.float32, "f64": np.float64,
                                            "f16": np.float16}[dtype])
    return rng.integers(-20, 20, n).astype({"s32": np.int32, "s64": np.int64,
                                            "u8": np.uint8}[dtype]).reshape(dims)


def _single_op(opcode: str, shapes: list[Shape], **attributes) -> HloModule:
    module, comp = new_module(opcode)
    params = parameters(comp, *shapes)
    comp.root = comp.create(opcode, params, **attributes)
    return module


def _assert_same(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-6) -> None:
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape
    if actual.dtype.kind == "f":
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=1e-6, equal_nan=True)
    else:
        np.testing.assert_array_equal(actual, expected)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64).ravel()],
                    np.float64).reshape(x.shape).astype(x.dtype)


FLOAT_UNARY = {
    "abs": np.abs, "negate": np.negative, "exponential": np.exp, "exponential-minus-one": np.expm1,
    "log": np.log, "log-plus-one": np.log1p, "tanh": np.tanh,
    "logistic": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype), "sqrt": np.sqrt,
    "rsqrt": lambda x: (1 / np.sqrt(x)).astype(x.dtype), "cbrt": np.cbrt, "erf": _erf,
    "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
    "round-nearest-afz": lambda x: (np.sign(x) * np.floor(np.abs(x) + 0.5)).astype(x.dtype),
    "round-nearest-even": np.rint, "sine": np.sin, "cosine": np.cos, "tan": np.tan,
    "copy": np.copy, "is-finite": np.isfinite,
}


@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("opcode", sorted(FLOAT_UNARY))
def test_float_unary(opcode: str, dims: tuple[int, ...]) -> None:
    x = _values(dims, "f32")
    with np.errstate(all="ignore"):
        expected = FLOAT_UNARY[opcode](x)
    _assert_same(evaluate(_single_op(opcode, [Shape("f32", dims)]), x), expected)


def test_unary_on_f64_stays_f64() -> None:
    x = _values((4,), "f64")
    result = evaluate(_single_op("tanh", [Shape("f64", (4,))]), x)
    assert result.dtype == np.float64


@pytest.mark.parametrize("opcode,expected", [
    ("abs", [3, 0, 7]), ("negate", [3, 0, -7]), ("sign", [-1, 0, 1]), ("not", [2, -1, -8]),
    ("copy", [-3, 0, 7])])
def test_integer_unary(opcode: str, expected: list[int]) -> None:
    x = np.array([-3, 0, 7], np.int32)
    _assert_same(evaluate(_single_op(opcode, [Shape("s32", (3,))]), x),
                 np.array(expected, np.int32))


def test_not_on_pred() -> None:
    x = np.array([True, False])
    _assert_same(evaluate(_single_op("not", [Shape("pred", (2,))]), x), np.array([False, True]))


FLOAT_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "power": np.power, "remainder": np.fmod,
    "atan2": np.arctan2,
}


@pytest.mark.parametrize("dims", SHAPES)
@pytest.mark.parametrize("opcode", sorted(FLOAT_BINARY))
def test_float_binary(opcode: str, dims: tuple[int, ...]) -> None:
    x, y = _values(dims, "f32", 1), np.roll(_values(dims, "f32", 2), 3)  # pair up specials
    s = Shape("f32", dims)
    with np.errstate(all="ignore"):
        expected = FLOAT_BINARY[opcode](x, y)
    _assert_same(evaluate(_single_op(opcode, [s, s]), x, y), expected)


def test_maximum_minimum_propagate_nan() -> None:
    s = Shape("f32", (2,))
    x, y = np.array([np.nan, 1], np.float32), np.array([1, np.nan], np.float32)
    assert np.isnan(evaluate(_single_op("maximum", [s, s]), x, y)).all()
    assert np.isnan(evaluate(_single_op("minimum", [s, s]), x, y)).all()


def test_integer_divide_and_remainder_follow_xla() -> None:
    s = Shape("s32", (6,))
    x = np.array([7, -7, 7, -7, 5, np.iinfo(np.int32).min], np.int32)
    y = np.array([2, 2, -2, -2, 0, -1], np.int32)
    _assert_same(evaluate(_single_op("divide", [s, s]), x, y),
                 np.array([3, -3, -3, 3, -1, np.iinfo(np.int32).min], np.int32))
    _assert_same(evaluate(_single_op("remainder", [s, s]), x, y),
                 np.array([1, -1, 1, -1, 5, 0], np.int32))


def test_unsigned_divide_by_zero_is_all_ones() -> None:
    s = Shape("u8", (2,))
    x, y = np.array([7, 9], np.uint8), np.array([2, 0], np.uint8)
    _assert_same(evaluate(_single_op("divide", [s, s]), x, y), np.array([3, 255], np.uint8))


def test_integer_power() -> None:
    s = Shape("s32", (5,))
    x = np.array([2, 3, 1, -1, 2], np.int32)
    y = np.array([3, 0, -2, -3, -1], np.int32)
    _assert_same(evaluate(_single_op("power", [s, s]), x, y),
                 np.array([8, 1, 1, -1, 0], np.int32))


@pytest.mark.parametrize("opcode,expected", [
    ("and", [0b1000, 0]), ("or", [0b1110, -1]), ("xor", [0b0110, -1])])
def test_integer_bitwise(opcode: str, expected: list[int]) -> None:
    s = Shape("s32", (2,))
    x, y = np.array([0b1100, -1], np.int32), np.array([0b1010, 0], np.int32)
    _assert_same(evaluate(_single_op(opcode, [s, s]), x, y), np.array(expected, np.int32))


@pytest.mark.parametrize("opcode,expected", [
    ("shift-left", [12 << 10, 0, 0, 0]), ("shift-right-arithmetic", [0, -1, 0, -1]),
    ("shift-right-logical", [0, 0, 0, 0])])
def test_shifts_out_of_range(opcode: str, expected: list[int]) -> None:
    # Shifting by the bit width or more, or by a negative amount, gives 0 or the sign fill.
    s = Shape("s32", (4,))
    x, y = np.array([12, -1, 12, -5], np.int32), np.array([10, 40, -1, 32], np.int32)
    _assert_same(evaluate(_single_op(opcode, [s, s]), x, y), np.array(expected, np.int32))


def test_shift_right_logical_of_negative() -> None:
    s = Shape("s32", (1,))
    result = evaluate(_single_op("shift-right-logical", [s, s]), np.array([-1], np.int32),
                      np.array([28], np.int32))
    _assert_same(result, np.array([15], np.int32))


def test_every_binary_opcode_is_tested() -> None:
    tested = set(FLOAT_BINARY) | {"and", "or", "xor", "shift-left", "shift-right-arithmetic",
                                  "shift-right-logical"}
    assert set(opcodes_in("binary")) == tested


@pytest.mark.parametrize("direction", COMPARISON_DIRECTIONS)
def test_compare(direction: str) -> None:
    s = Shape("f32", (10,))
    x, y = SPECIAL, SPECIAL[::-1].copy()
    expected = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}[direction](x, y)
    _assert_same(evaluate(_single_op("compare", [s, s], direction=direction), x, y), expected)


def test_select_and_clamp() -> None:
    s = Shape("f32", (4,))
    p = np.array([True, False, True, False])
    x, y = np.arange(4, dtype=np.float32), -np.arange(4, dtype=np.float32)
    _assert_same(evaluate(_single_op("select", [Shape("pred", (4,)), s, s]), p, x, y),
                 np.where(p, x, y))
    lo, hi = np.float32(0.5), np.float32(2.5)
    module = _single_op("clamp", [Shape("f32", ()), s, Shape("f32", ())])
    _assert_same(evaluate(module, lo, x, hi), np.clip(x, lo, hi))


@pytest.mark.parametrize("source,target,values,expected", [
    ("f32", "s32", [1.9, -1.9, np.nan, 1e10, -1e10], [1, -1, 0, 2**31 - 1, -2**31]),
    ("f32", "u8", [3.7, -5.0, 300.0, np.inf, -np.inf], [3, 0, 255, 255, 0]),
    ("f64", "s64", [1e30, -1e30, 2.0**63, -(2.0**63), 5.5],
     [2**63 - 1, -(2**63), 2**63 - 1, -(2**63), 5]),
    ("f32", "pred", [0.0, -0.0, 2.0, np.nan, 0.1], [False, False, True, True, True]),
    ("s32", "f32", [1, -2, 3, 4, 5], [1.0, -2.0, 3.0, 4.0, 5.0]),
    ("s32", "u8", [256, 257, -1, 0, 5], [0, 1, 255, 0, 5]),
    ("pred", "f32", [True, False, True, True, False], [1.0, 0.0, 1.0, 1.0, 0.0]),
])
def test_convert(source: str, target: str, values: list, expected: list) -> None:
    from tfxla_lite.hlo.shape import numpy_dtype

    x = np.array(values, numpy_dtype(source))
    module = _single_op("convert", [Shape(source, (5,))], element_type=target)
    _assert_same(evaluate(module, x), np.array(expected, numpy_dtype(target)))


def test_convert_to_bf16_and_back() -> None:
    x = np.array([1.0, 1.00390625, 3.14159], np.float32)
    module, comp = new_module()
    (p,) = parameters(comp, Shape("f32", (3,)))
    narrowed = comp.create("convert", [p], element_type="bf16")
    comp.root = comp.create("convert", [comp.create("add", [narrowed, narrowed])],
                            element_type="f32")
    np.testing.assert_allclose(evaluate(module, x), 2 * x, rtol=1e-2)


def test_constant_and_iota() -> None:
    module, comp = new_module()
    comp.root = comp.add_constant(np.arange(6, dtype=np.int32).reshape(2, 3))
    _assert_same(evaluate(module), np.arange(6, dtype=np.int32).reshape(2, 3))
    module, comp = new_module()
    comp.root = comp.create("iota", shape=Shape("f32", (2, 3)), iota_dimension=1)
    _assert_same(evaluate(module), np.tile(np.arange(3, dtype=np.float32), (2, 1)))


@pytest.mark.parametrize("operand,dims,out", [
    ((), (), (2, 3)), ((3,), (1,), (2, 3)), ((2,), (0,), (2, 3)), ((2, 3), (1, 0), (3, 2)),
    ((0,), (1,), (2, 0))])
def test_broadcast_maps_operand_dim_i_to_dimensions_i(operand, dims, out) -> None:
    x = np.arange(int(np.prod(operand)), dtype=np.float32).reshape(operand)
    module, comp = new_module()
    (p,) = parameters(comp, Shape("f32", operand))
    comp.root = comp.create("broadcast", [p], shape=Shape("f32", out), dimensions=dims)
    result = evaluate(module, x)
    for index in np.ndindex(*out):
        assert result[index] == x[tuple(index[d] for d in dims)]
    assert result.shape == out


def test_reshape_bitcast_transpose_slice_concatenate() -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    s = Shape("f32", (2, 3, 4))
    for opcode in ("reshape", "bitcast"):
        module, comp = new_module()
        (p,) = parameters(comp, s)
        comp.root = comp.create(opcode, [p], shape=Shape("f32", (6, 4)))
        _assert_same(evaluate(module, x), x.reshape(6, 4))
    _assert_same(evaluate(_single_op("transpose", [s], dimensions=(2, 0, 1)), x),
                 x.transpose(2, 0, 1))
    _assert_same(evaluate(_single_op("slice", [s], slice=((0, 2, 1), (1, 3, 1), (0, 4, 3))), x),
                 x[0:2, 1:3, 0:4:3])
    module = _single_op("concatenate", [s, s], dimensions=(1,))
    _assert_same(evaluate(module, x, x + 1), np.concatenate([x, x + 1], axis=1))


@pytest.mark.parametrize("kind,init,expected", [
    ("add", 0.0, np.sum), ("multiply", 1.0, np.prod), ("maximum", -np.inf, np.max),
    ("minimum", np.inf, np.min)])
@pytest.mark.parametrize("dims", [(1,), (0, 1), (0,)])
def test_reduce_fast_paths(kind: str, init: float, expected, dims: tuple[int, ...]) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    module, comp = new_module()
    (p,) = parameters(comp, Shape("f32", (3, 4)))
    comp.root = reduce(comp, p, dims, kind, init)
    _assert_same(evaluate(module, x), expected(x, axis=dims).astype(np.float32))


def test_reduce_includes_init_and_handles_empty_and_nan() -> None:
    module, comp = new_module()
    (p,) = parameters(comp, Shape("f32", (0, 3)))
    comp.root = reduce(comp, p, (0,), "add", 5.0)
    _assert_same(evaluate(module, np.zeros((0, 3), np.float32)), np.full(3, 5, np.float32))
    module, comp = new_module()
    (p,) = parameters(comp, Shape("f32", (3,)))
    comp.root = reduce(comp, p, (0,), "maximum", -np.inf)
    assert np.isnan(evaluate(module, np.array([1, np.nan, 2], np.float32)))


@pytest.mark.parametrize("kind,expected", [("and", [True, False]), ("or", [True, True])])
def test_reduce_pred(kind: str, expected: list[bool]) -> None:
    module, comp = new_module()
    (p,) = parameters(comp, Shape("pred", (2, 2)))
    comp.root = reduce(comp, p, (1,), kind, kind == "and")
    x = np.array([[True, True], [False, True]])
    _assert_same(evaluate(module, x), np.array(expected))


def test_reduce_runs_a_general_to_apply_computation() -> None:
    # to_apply(a, b) = a + 2*b is no fast path: the evaluator runs it element by element.
    module, comp = new_module()
    reducer = module.new_computation("weird")
    a, b = parameters(reducer, Shape("f32", ()), Shape("f32", ()))
    two = reducer.add_constant(2.0, "f32")
    reducer.root = reducer.create("add", [a, reducer.create("multiply", [two, b])])
    (p,) = parameters(comp, Shape("f32", (2, 3)))
    init = comp.add_constant(1.0, "f32")
    comp.root = comp.create("reduce", [p, init], called_computations=[reducer], dimensions=(1,))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _assert_same(evaluate(module, x), 1 + 2 * x.sum(axis=1))


@pytest.mark.parametrize("lhs,rhs,attrs,einsum", [
    ((3, 4), (4, 5), dict(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), "mk,kn->mn"),
    ((4, 3), (5, 4), dict(lhs_contracting_dims=(0,), rhs_contracting_dims=(1,)), "km,nk->mn"),
    ((2, 3, 4), (2, 4, 5), dict(lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                                lhs_contracting_dims=(2,), rhs_contracting_dims=(1,)),
     "bmk,bkn->bmn"),
    ((3, 0), (0, 5), dict(lhs_contracting_dims=(1,), rhs_contracting_dims=(0,)), "mk,kn->mn"),
    ((4,), (4,), dict(lhs_contracting_dims=(0,), rhs_contracting_dims=(0,)), "k,k->"),
])
def test_dot(lhs, rhs, attrs, einsum: str) -> None:
    x = _values(lhs, "f32", 3)
    y = _values(rhs, "f32", 4)
    x, y = np.nan_to_num(x, posinf=1, neginf=-1), np.nan_to_num(y, posinf=1, neginf=-1)
    result = evaluate(_single_op("dot", [Shape("f32", lhs), Shape("f32", rhs)], **attrs), x, y)
    _assert_same(result, np.einsum(einsum, x, y).astype(np.float32), rtol=1e-5)


def test_tuple_get_tuple_element_and_call() -> None:
    module, comp = new_module()
    callee = module.new_computation("callee")
    a, b = parameters(callee, Shape("f32", (2,)), Shape("f32", (2,)))
    callee.root = callee.create("tuple", [callee.create("subtract", [a, b]), a])
    x, y = parameters(comp, Shape("f32", (2,)), Shape("f32", (2,)))
    call = comp.create("call", [x, y], shape=callee.root.shape, called_computations=[callee])
    comp.root = comp.create("get-tuple-element", [call], index=0)
    _assert_same(evaluate(module, np.ones(2), np.arange(2)), np.array([1, 0], np.float32))


def test_argument_shape_mismatch_is_reported() -> None:
    with pytest.raises(ValueError, match="shape"):
        evaluate(_single_op("negate", [Shape("f32", (2,))]), np.ones(3))
