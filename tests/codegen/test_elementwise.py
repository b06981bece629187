"""Every elementwise opcode, compiled for the CPU, against the NumPy evaluator.

Each test compiles one module per (op, dtype) holding the op over several shapes
(scalar, zero-size, odd and vector-friendly sizes), so that the suite stays fast;
float inputs include NaN, ±inf and ±0.
"""

from __future__ import annotations

import numpy as np
import pytest
from codegen_helpers import as_args, build, check

from tfxla_lite.hlo.opcodes import opcodes_in
from tfxla_lite.hlo.shape import Shape

SHAPES = [(), (0,), (7,), (3, 5), (2, 0, 3), (33,)]

_FLOAT_ONLY = {"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
               "logistic", "sqrt", "rsqrt", "cbrt", "erf", "sine", "cosine", "tan", "is-finite",
               "atan2"}
_INTEGER_ONLY = {"not", "and", "or", "xor", "shift-left", "shift-right-arithmetic",
                 "shift-right-logical"}


def _shapes(element_type: str) -> list[Shape]:
    return [Shape(element_type, dims) for dims in SHAPES]


def _unary_cases() -> list[tuple[str, str]]:
    cases = []
    for op in opcodes_in("unary"):
        types = ["f32", "f64"] if op in _FLOAT_ONLY else (
            ["s32", "u8", "pred"] if op in _INTEGER_ONLY else ["f32", "f64", "s32"])
        cases += [(op, t) for t in types]
    cases += [("negate", "s8"), ("abs", "s64"), ("sign", "u32"), ("exponential", "f16"),
              ("tanh", "f16"), ("copy", "pred")]
    return cases


@pytest.mark.parametrize(("opcode", "element_type"), _unary_cases())
def test_unary(opcode: str, element_type: str) -> None:
    shapes = _shapes(element_type)
    module = build(opcode, shapes, lambda c, ps: [c.create(opcode, [p]) for p in ps])
    args = as_args(shapes, seed=hash(opcode) % 1000, low=-40, high=40)
    executable = check(module, args, opcode)
    assert executable.kernel_count == len(shapes)


def _binary_cases() -> list[tuple[str, str]]:
    cases = []
    for op in opcodes_in("binary"):
        if op in _FLOAT_ONLY:
            types = ["f32", "f64"]
        elif op in _INTEGER_ONLY:
            types = ["s32", "u32", "s8", "s64"] + (["pred"] if op in ("and", "or", "xor") else [])
        else:
            types = ["f32", "f64", "s32", "u16"]
        # XLA shifts an unsigned value arithmetically on its bit pattern (the sign bit
        # fills); the evaluator and codegen both do.
        cases += [(op, t) for t in types]
    cases += [("add", "f16"), ("divide", "f16"), ("maximum", "pred"), ("multiply", "s64")]
    return cases


@pytest.mark.parametrize(("opcode", "element_type"), _binary_cases())
def test_binary(opcode: str, element_type: str) -> None:
    shapes = _shapes(element_type)
    module = build(opcode, shapes + shapes,
                   lambda c, ps: [c.create(opcode, [x, y]) for x, y in zip(ps[:6], ps[6:])])
    low, high = (-3, 40) if opcode.startswith("shift") else (-20, 20)
    args = as_args(shapes + shapes, seed=len(opcode), low=low, high=high)
    if opcode == "power" and element_type.startswith(("s", "u")):
        args = [a % 5 if n < 6 else a % 9 - 2 * (element_type[0] == "s")
                for n, a in enumerate(args)]
        args = [a.astype(shapes[0].numpy_dtype) for a in args]
    check(module, args, opcode)


def test_integer_division_edges() -> None:
    """x/0 = -1, x%0 = x, INT_MIN/-1 = INT_MIN, INT_MIN%-1 = 0, truncation toward zero."""
    int_min = np.iinfo(np.int32).min
    x = np.array([7, -7, 7, -7, 5, int_min, int_min, 0, -1], dtype=np.int32)
    y = np.array([2, 2, -2, -2, 0, -1, 0, 0, 3], dtype=np.int32)
    shape = Shape("s32", (9,))
    module = build("division", [shape, shape], lambda c, ps: [c.create("divide", ps),
                                                              c.create("remainder", ps)])
    executable = check(module, [x, y], "divide")
    quotient, remainder = executable(x, y)
    assert quotient.tolist() == [3, -3, -3, 3, -1, int_min, -1, -1, 0]
    assert remainder.tolist() == [1, -1, 1, -1, 5, 0, int_min, 0, -1]


@pytest.mark.parametrize("element_type", ["f32", "f64", "s32", "u8", "pred"])
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare(direction: str, element_type: str) -> None:
    shapes = _shapes(element_type)
    module = build("compare", shapes + shapes, lambda c, ps: [
        c.create("compare", [x, y], direction=direction) for x, y in zip(ps[:6], ps[6:])])
    args = as_args(shapes + shapes, seed=3, low=-3, high=3)
    if element_type in ("f32", "f64"):  # NaN against NaN and numbers, both orders
        args[3][...] = np.array([np.nan, 1.0, np.nan]).reshape(3, 1)
        args[9][...] = np.array([np.nan, np.nan, 2.0]).reshape(3, 1)
    check(module, args, "compare")


def test_compare_nan_semantics() -> None:
    shape = Shape("f32", (3,))
    directions = ["EQ", "NE", "LT", "LE", "GT", "GE"]
    module = build("nan", [shape, shape], lambda c, ps: [
        c.create("compare", ps, direction=d) for d in directions])
    x = np.array([np.nan, 1.0, np.nan], dtype=np.float32)
    y = np.array([np.nan, np.nan, 1.0], dtype=np.float32)
    results = check(module, [x, y], "compare")(x, y)
    for direction, result in zip(directions, results):
        assert result.tolist() == [direction == "NE"] * 3, direction


@pytest.mark.parametrize("element_type", ["f32", "s32", "pred", "f64"])
def test_select(element_type: str) -> None:
    shapes = _shapes(element_type)
    predicates = _shapes("pred")
    module = build("select", predicates + shapes + shapes, lambda c, ps: [
        c.create("select", [p, x, y]) for p, x, y in zip(ps[:6], ps[6:12], ps[12:])])
    check(module, as_args(predicates + shapes + shapes, seed=5), "select")


@pytest.mark.parametrize("element_type", ["f32", "s32", "f64"])
def test_clamp(element_type: str) -> None:
    x = Shape(element_type, (4, 9))
    scalar = Shape(element_type, ())
    module = build("clamp", [scalar, x, scalar, x, x], lambda c, ps: [
        c.create("clamp", [ps[0], ps[1], ps[2]]), c.create("clamp", [ps[3], ps[1], ps[4]])])
    args = as_args([scalar, x, scalar, x, x], seed=9, low=-10, high=10)
    args[0][...] = -2
    args[2][...] = 3
    check(module, args, "clamp")


_CONVERT_TYPES = ["pred", "s8", "u8", "s32", "u32", "s64", "f16", "f32", "f64"]


@pytest.mark.parametrize("source", _CONVERT_TYPES)
def test_convert(source: str) -> None:
    shape = Shape(source, (5, 7))
    module = build("convert", [shape], lambda c, ps: [
        c.create("convert", ps, element_type=t) for t in _CONVERT_TYPES if t != source])
    check(module, as_args([shape], seed=1, low=-300, high=300), "convert")


def test_convert_saturates() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.9, -2.9, 255.5, -1.0, -0.0],
                      dtype=np.float32)
    shape = Shape("f32", values.shape)
    module = build("saturate", [shape], lambda c, ps: [
        c.create("convert", ps, element_type=t) for t in ("s32", "u8", "s8", "u32", "pred")])
    s32, u8, s8, u32, pred = check(module, [values], "convert")(values)
    int_max, int_min = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    assert s32.tolist() == [0, int_max, int_min, int_max, int_min, 2, -2, 255, -1, 0]
    assert u8.tolist() == [0, 255, 0, 255, 0, 2, 0, 255, 0, 0]
    assert pred.tolist() == [True, True, True, True, True, True, True, True, True, False]
    del s8, u32


def test_unfused_elementwise_chain() -> None:
    """The same ops as unfused kernels (one per instruction, temps in between)."""
    shape = Shape("f32", (5, 6))

    def body(c, ps):  # type: ignore[no-untyped-def]
        total = c.create("add", ps)
        return [c.create("tanh", [c.create("multiply", [total, ps[0]])])]

    module = build("chain", [shape, shape], body)
    executable = check(module, as_args([shape, shape]), "tanh", fused=False)
    assert executable.kernel_count == 3
    assert executable.temp_bytes > 0
