"""CPU kernels of cholesky, triangular-solve, rng-bit-generator, bitcast-convert,
reduce-precision and the pass-through opcodes, against the NumPy evaluator: shapes with
0- and 1-sized dimensions, f32 and f64 (and the 2-byte floats for the bit operations),
edge values, and modules compiled as written as well as through the pipeline."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from codegen_helpers import check

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu.linalg import (
    BLOCK,
    BLOCKED_FROM,
    SOLVE_BLOCKED_COLUMNS,
    blocked,
    solve_blocked,
)
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module


def _module(parameters: list[str], body: str, root: str) -> Any:
    params = "\n".join(f"  %p{n} = {shape} parameter({n})" for n, shape in enumerate(parameters))
    return parse_module(f"HloModule m\n\nENTRY %e {{\n{params}\n{body}\n  ROOT {root}\n}}\n")


def _spd(dims: tuple[int, ...], dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = dims[-1]
    x = rng.standard_normal(dims)
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)


def _text(element_type: str, dims: tuple[int, ...]) -> str:
    return f"{element_type}[{','.join(map(str, dims))}]"


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("element_type", ["f32", "f64"])
# (8, 40, 40) and (6, 48, 48) are work enough to split the matrices across threads.
@pytest.mark.parametrize("dims", [(0, 0), (1, 1), (4, 4), (3, 5, 5), (2, 0, 3, 3), (17, 17),
                                  (8, 40, 40)])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky(fused: bool, element_type: str, dims: tuple[int, ...], lower: bool) -> None:
    shape = _text(element_type, dims)
    module = _module([shape], "", f"%c = {shape} cholesky({shape} %p0), "
                                  f"lower={str(lower).lower()}")
    a = _spd(dims, np.dtype(element_type.replace("f", "float")).type)
    if a.size:  # junk in the triangle it does not read
        a = a + (np.triu(np.full(dims[-2:], 7.0), 1) if lower
                 else np.tril(np.full(dims[-2:], 7.0), -1)).astype(a.dtype)
    check(module, [a], "cholesky", fused=fused)


def test_cholesky_not_positive_definite_is_nan_per_matrix() -> None:
    module = _module(["f32[3,4,4]"], "", "%c = f32[3,4,4] cholesky(f32[3,4,4] %p0), lower=true")
    a = _spd((3, 4, 4), np.float32)
    a[1, 3, 3] = -1.0
    a[2, 1, 0] = np.nan
    (result,) = check(module, [a], "cholesky")(a)
    assert not np.isnan(result[0]).any() and np.isnan(result[1]).all()
    assert np.isnan(result[2]).any()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("unit_diagonal", [True, False])
@pytest.mark.parametrize("transpose_a", ["NO_TRANSPOSE", "TRANSPOSE"])
def test_triangular_solve(fused: bool, left_side: bool, lower: bool, unit_diagonal: bool,
                          transpose_a: str) -> None:
    a_shape, b_dims = (2, 5, 5), (2, 5, 3) if left_side else (2, 3, 5)
    if fused and lower == unit_diagonal:  # big enough a batch for several threads
        a_shape, b_dims = (6, 48, 48), (6, 48, 40) if left_side else (6, 40, 48)
    attributes = ", ".join(f"{k}={str(v).lower()}" for k, v in (
        ("left_side", left_side), ("lower", lower), ("unit_diagonal", unit_diagonal)))
    a_text = _text("f32", a_shape)
    module = _module([a_text, _text("f32", b_dims)], "",
                     f"%x = {_text('f32', b_dims)} triangular-solve({a_text} %p0, "
                     f"{_text('f32', b_dims)} %p1), {attributes}, transpose_a={transpose_a}")
    a = _spd(a_shape, np.float32)
    b = np.random.default_rng(3).standard_normal(b_dims).astype(np.float32)
    check(module, [a, b], "triangular-solve", fused=fused)


# Unblocked, row updates of every length from n - 1 down to 1: vectorized bodies and
# their remainders.
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_long_row_updates(element_type: str, lower: bool) -> None:
    n = BLOCKED_FROM - 1
    assert not blocked(element_type, n)
    shape = _text(element_type, (2, n, n))
    module = _module([shape], "", f"%c = {shape} cholesky({shape} %p0), "
                                  f"lower={str(lower).lower()}")
    a = _spd((2, n, n), np.dtype(element_type.replace("f", "float")).type)
    (result,) = check(module, [a], "cholesky")(a)
    other = np.triu(result[0], 1) if lower else np.tril(result[0], -1)
    assert not other.any()  # the triangle it does not return is zero


# Blocked (from linalg.BLOCKED_FROM): four blocks of pivot rows and a partial one, each
# followed by a GEMM update of the rest; a NaN pivot in a later block.
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_blocked(element_type: str, lower: bool) -> None:
    n = 4 * BLOCK + 2
    assert n >= BLOCKED_FROM and blocked(element_type, n)
    shape = _text(element_type, (3, n, n))
    module = _module([shape], "", f"%c = {shape} cholesky({shape} %p0), "
                                  f"lower={str(lower).lower()}")
    a = _spd((3, n, n), np.dtype(element_type.replace("f", "float")).type)
    a[2, n - 3, n - 3] = -1e4  # not positive definite, in the last full block
    (result,) = check(module, [a], "cholesky")(a)
    assert np.isnan(result[2]).all() and not np.isnan(result[:2]).any()
    other = np.triu(result[0], 1) if lower else np.tril(result[0], -1)
    assert not other.any()


# Both substitution orders on both sides, rows of unknowns and of right-hand sides longer
# than a vector and not a multiple of one.
@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose_a", ["NO_TRANSPOSE", "ADJOINT"])
def test_triangular_solve_long_rows_f64(left_side: bool, lower: bool, transpose_a: str
                                        ) -> None:
    a_dims, b_dims = (3, 37, 37), (3, 37, 19) if left_side else (3, 19, 37)
    a_text, b_text = _text("f64", a_dims), _text("f64", b_dims)
    module = _module([a_text, b_text], "",
                     f"%x = {b_text} triangular-solve({a_text} %p0, {b_text} %p1), "
                     f"left_side={str(left_side).lower()}, lower={str(lower).lower()}, "
                     f"unit_diagonal=false, transpose_a={transpose_a}")
    a = _spd(a_dims, np.float64)
    b = np.random.default_rng(5).standard_normal(b_dims)
    check(module, [a, b], "triangular-solve")


# Blocked on the left side: four blocks of unknowns and a partial one, each taken from the
# later unknowns by a GEMM, in both orders of solving, op(a) read either way.
@pytest.mark.parametrize("element_type", ["f32", "f64"])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("transpose_a", ["NO_TRANSPOSE", "TRANSPOSE"])
@pytest.mark.parametrize("unit_diagonal", [True, False])
def test_triangular_solve_blocked(element_type: str, lower: bool, transpose_a: str,
                                  unit_diagonal: bool) -> None:
    n, columns = 4 * BLOCK + 2, SOLVE_BLOCKED_COLUMNS + 3
    assert solve_blocked(element_type, n, columns)
    a_text, b_text = _text(element_type, (2, n, n)), _text(element_type, (2, n, columns))
    module = _module([a_text, b_text], "",
                     f"%x = {b_text} triangular-solve({a_text} %p0, {b_text} %p1), "
                     f"left_side=true, lower={str(lower).lower()}, "
                     f"unit_diagonal={str(unit_diagonal).lower()}, transpose_a={transpose_a}")
    dtype = np.dtype(element_type.replace("f", "float")).type
    a = _spd((2, n, n), dtype)
    if unit_diagonal:  # keep the unit-diagonal solve well conditioned
        a = (a / np.diagonal(a, axis1=1, axis2=2)[:, :, None]).astype(dtype)
    b = np.random.default_rng(7).standard_normal((2, n, columns)).astype(dtype)
    check(module, [a, b], "triangular-solve")


def test_triangular_solve_rows_too_long_for_the_stack() -> None:
    """More right-hand sides than sort.STACK_ELEMENTS: the updates read the output."""
    module = _module(["f32[3,3]", "f32[3,16400]"], "",
                     "%x = f32[3,16400] triangular-solve(f32[3,3] %p0, f32[3,16400] %p1), "
                     "left_side=true, lower=true, unit_diagonal=false, transpose_a=TRANSPOSE")
    a = _spd((3, 3), np.float32)
    b = np.random.default_rng(6).standard_normal((3, 16400)).astype(np.float32)
    check(module, [a, b], "triangular-solve")


@pytest.mark.parametrize("a_dims, b_dims", [((0, 0), (0, 4)), ((1, 1), (1, 1)),
                                            ((3, 3), (3, 0)), ((0, 2, 2), (0, 2, 3))])
def test_triangular_solve_small_shapes_f64(a_dims: tuple[int, ...],
                                           b_dims: tuple[int, ...]) -> None:
    a_text, b_text = _text("f64", a_dims), _text("f64", b_dims)
    module = _module([a_text, b_text], "",
                     f"%x = {b_text} triangular-solve({a_text} %p0, {b_text} %p1), "
                     "left_side=true, lower=false, unit_diagonal=false, transpose_a=ADJOINT")
    a = _spd(a_dims, np.float64) if a_dims[-1] else np.zeros(a_dims)
    b = np.random.default_rng(4).standard_normal(b_dims)
    check(module, [a, b], "triangular-solve")


def test_triangular_solve_singular_divides_by_zero() -> None:
    module = _module(["f32[2,2]", "f32[2,1]"], "",
                     "%x = f32[2,1] triangular-solve(f32[2,2] %p0, f32[2,1] %p1), "
                     "left_side=true, lower=true, unit_diagonal=false, transpose_a=NO_TRANSPOSE")
    a = np.array([[0.0, 0.0], [1.0, 2.0]], np.float32)
    (x,) = check(module, [a, np.ones((2, 1), np.float32)], "triangular-solve")(
        a, np.ones((2, 1), np.float32))
    assert np.isinf(x[0, 0])


@pytest.mark.parametrize("algorithm, state", [
    ("rng_philox", [7, 2**64 - 3, 1]), ("rng_default", [0x123456789, 2**64 - 1]),
    ("rng_three_fry", [42, 2**64 - 2])])
@pytest.mark.parametrize("bits", ["u32[7,3]", "u64[5]", "u16[3,3]", "s8[9]", "u32[]",
                                  "u32[0,4]", "s64[2,1]", "u32[3,5]"])
def test_rng_bit_generator(algorithm: str, state: list[int], bits: str) -> None:
    state_text = f"u64[{len(state)}]"
    module = _module([state_text], f"  %r = ({state_text}, {bits}) rng-bit-generator("
                                   f"{state_text} %p0), algorithm={algorithm}\n"
                                   f"  %s = {state_text} get-tuple-element(%r), index=0\n"
                                   f"  %b = {bits} get-tuple-element(%r), index=1",
                     f"%t = ({state_text}, {bits}) tuple(%s, %b)")
    check(module, [np.array(state, np.uint64)], "rng-bit-generator")


@pytest.mark.parametrize("source, target", [
    ("f32[3,4]", "s32[3,4]"), ("f32[3,4]", "u8[3,4,4]"), ("u16[3,4,2]", "f32[3,4]"),
    ("f64[5]", "f32[5,2]"), ("f32[5,2]", "u64[5]"), ("bf16[6]", "u16[6]"),
    ("u16[6]", "f16[6]"), ("s8[2,0,8]", "f64[2,0]"), ("f16[4]", "bf16[4]")])
def test_bitcast_convert(source: str, target: str) -> None:
    module = _module([source], "", f"%y = {target} bitcast-convert({source} %p0)")
    rng = np.random.default_rng(5)
    parameter = module.entry.parameters[0].shape
    raw = rng.integers(0, 256, parameter.byte_size, dtype=np.uint8)
    x = raw.view(parameter.numpy_dtype).reshape(parameter.dims)
    if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16:  # no NaN payload games
        x = np.where(np.isnan(x), np.zeros((), x.dtype), x)
    expected = evaluate(module, x)
    for fused in (True, False):
        (actual,) = (compile_module(module) if fused else _unfused(module))(x)
        np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8))


def _unfused(module: Any) -> Any:
    from codegen_helpers import compile_unfused

    return compile_unfused(parse_module(module.to_text()))


@pytest.mark.parametrize("element_type", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("exponent_bits, mantissa_bits", [(8, 7), (5, 10), (5, 2), (4, 0),
                                                          (11, 52), (3, 1)])
def test_reduce_precision(element_type: str, exponent_bits: int, mantissa_bits: int) -> None:
    module = _module([f"{element_type}[4000]"], "",
                     f"%y = {element_type}[4000] reduce-precision({element_type}[4000] %p0), "
                     f"exponent_bits={exponent_bits}, mantissa_bits={mantissa_bits}")
    rng = np.random.default_rng(6)
    values = rng.standard_normal(4000) * np.exp(rng.uniform(-40, 40, 4000))
    values[:8] = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, 2.5]
    with np.errstate(over="ignore"):
        x = values.astype(module.entry.parameters[0].shape.numpy_dtype)
    expected = evaluate(module, x)
    for executable in (compile_module(module), _unfused(module)):
        (actual,) = executable(x)
        nan = np.isnan(expected.astype(np.float64))
        assert (np.isnan(actual.astype(np.float64)) == nan).all()
        np.testing.assert_array_equal(actual[~nan].view(np.uint8) if actual.dtype.itemsize == 1
                                      else actual[~nan], expected[~nan])
        np.testing.assert_array_equal(np.signbit(actual[~nan].astype(np.float64)),
                                      np.signbit(expected[~nan].astype(np.float64)))


def test_dimension_sizes_and_barrier_compile() -> None:
    module = _module(["f32[3,0,5]", "f32[2,3]"], """\
  %n = s32[] get-dimension-size(f32[3,0,5] %p0), dimensions={2}
  %same = f32[2,3] set-dimension-size(f32[2,3] %p1, s32[] %n), dimensions={1}
  %pair = (f32[2,3], s32[]) tuple(%same, %n)
  %barrier = (f32[2,3], s32[]) opt-barrier(%pair)
  %x = f32[2,3] get-tuple-element(%barrier), index=0
  %k = s32[] get-tuple-element(%barrier), index=1
  %lone = f32[2,3] opt-barrier(%x)""", "%t = (f32[2,3], s32[]) tuple(%lone, %k)")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    args = [np.zeros((3, 0, 5), np.float32), x]
    actual = compile_module(module)(*args)
    np.testing.assert_array_equal(actual[0], x)
    assert int(actual[1]) == 5
    check(module, args, "copy")
