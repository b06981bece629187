"""cholesky, triangular-solve, rng-bit-generator, bitcast-convert, reduce-precision, the
dimension-size ops and opt-barrier in the HLO layer: XLA-printed text parses and prints
back, the verifier's shape rules, and the NumPy references against NumPy's own linear
algebra and ml_dtypes' roundings. No TensorFlow (the rng references are checked bit for
bit against TF's XLA in tests/clustering/test_rules_linalg.py)."""
# ruff: noqa: E501  (XLA prints each instruction on one line, however long)

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from tfxla_lite.hlo import cost_analysis
from tfxla_lite.hlo.bit_ops import bitcast_convert_reference, reduce_precision_reference
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.linalg import cholesky_reference, triangular_solve_reference
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.random_bits import philox4x32, threefry_half_dims
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError, verify

# As XLA prints them (layouts, metadata, the attributes' spelling and order).
XLA_TEXT = """\
HloModule linalg_bits, entry_computation_layout={(f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}, u64[3]{0})->(f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}, u32[5]{0}, s32[])}

ENTRY %main.1 (a: f32[2,3,3], b: f32[2,3,4], s: u64[3]) -> (f32[2,3,3], f32[2,3,4], u32[5], s32[]) {
  %a = f32[2,3,3]{2,1,0} parameter(0)
  %b = f32[2,3,4]{2,1,0} parameter(1)
  %s = u64[3]{0} parameter(2)
  %chol = f32[2,3,3]{2,1,0} cholesky(f32[2,3,3]{2,1,0} %a), lower=true, metadata={op_type="Cholesky" op_name="Cholesky"}
  %solve = f32[2,3,4]{2,1,0} triangular-solve(f32[2,3,3]{2,1,0} %chol, f32[2,3,4]{2,1,0} %b), left_side=true, lower=true, unit_diagonal=false, transpose_a=ADJOINT
  %round = f32[2,3,4]{2,1,0} reduce-precision(f32[2,3,4]{2,1,0} %solve), exponent_bits=8, mantissa_bits=7
  %bits = u32[2,3,4]{2,1,0} bitcast-convert(f32[2,3,4]{2,1,0} %round)
  %halves = u16[2,3,4,2]{3,2,1,0} bitcast-convert(u32[2,3,4]{2,1,0} %bits)
  %back = f32[2,3,4]{2,1,0} bitcast-convert(u16[2,3,4,2]{3,2,1,0} %halves)
  %rng = (u64[3]{0}, u32[5]{0}) rng-bit-generator(u64[3]{0} %s), algorithm=rng_default
  %random = u32[5]{0} get-tuple-element((u64[3]{0}, u32[5]{0}) %rng), index=1
  %size = s32[] get-dimension-size(f32[2,3,4]{2,1,0} %back), dimensions={2}
  %same = f32[2,3,4]{2,1,0} set-dimension-size(f32[2,3,4]{2,1,0} %back, s32[] %size), dimensions={2}
  %pair = (f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}) tuple(f32[2,3,3]{2,1,0} %chol, f32[2,3,4]{2,1,0} %same)
  %barrier = (f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}) opt-barrier((f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}) %pair)
  %first = f32[2,3,3]{2,1,0} get-tuple-element((f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}) %barrier), index=0
  %second = f32[2,3,4]{2,1,0} get-tuple-element((f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}) %barrier), index=1
  ROOT %out = (f32[2,3,3]{2,1,0}, f32[2,3,4]{2,1,0}, u32[5]{0}, s32[]) tuple(f32[2,3,3]{2,1,0} %first, f32[2,3,4]{2,1,0} %second, u32[5]{0} %random, s32[] %size)
}
"""


def _spd(batch: tuple[int, ...], n: int, dtype: type, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(batch + (n, n))
    return (x @ np.swapaxes(x, -1, -2) + n * np.eye(n)).astype(dtype)


def test_xla_text_round_trips_verifies_and_evaluates() -> None:
    module = parse_module(XLA_TEXT)
    printed = module_to_text(module)
    assert module_to_text(parse_module(printed)) == printed
    for line in ("lower=true", "left_side=true, lower=true, unit_diagonal=false, "
                 "transpose_a=ADJOINT", "exponent_bits=8, mantissa_bits=7",
                 "algorithm=rng_default", "u16[2,3,4,2]{3,2,1,0} bitcast-convert"):
        assert line in printed
    verify(module)
    a = _spd((2,), 3, np.float32)
    b = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    state = np.array([7, 2**64 - 1, 3], np.uint64)
    chol, solved, random, size = evaluate(module, a, b, state)
    np.testing.assert_allclose(chol, np.linalg.cholesky(a), rtol=1e-5, atol=1e-6)
    exact = np.linalg.solve(np.swapaxes(chol, -1, -2), b)
    rounded = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(solved, rounded, rtol=2**-7)
    assert solved.dtype == np.float32 and int(size) == 4
    assert random.dtype == np.uint32 and len(set(random.tolist())) == 5


@pytest.mark.parametrize("text, message", [
    ("f32[3,4]{1,0} cholesky(f32[3,4]{1,0} %x), lower=true", "square matrices"),
    ("s32[3,3]{1,0} cholesky(s32[3,3]{1,0} %x), lower=true", "not supported: cholesky of s32"),
    ("f32[3]{0} reduce-precision(f32[3]{0} %x), exponent_bits=0, mantissa_bits=2",
     "exponent_bits >= 1"),
    ("u16[3]{0} bitcast-convert(u32[3]{0} %x)", "differs from inferred u16[3,2]"),
    ("pred[3]{0} bitcast-convert(u8[3]{0} %x)", "numeric types"),
    ("(u64[4]{0}, u32[2]{0}) rng-bit-generator(u64[4]{0} %x), algorithm=rng_philox",
     "u64 state of 2 or 3 words"),
    ("(u64[3]{0}, u32[2]{0}) rng-bit-generator(u64[3]{0} %x), algorithm=rng_three_fry",
     "u64 state of 2 words"),
    ("s32[] get-dimension-size(f32[3]{0} %x), dimensions={1}", "one dimension"),
    ("f32[3]{0} custom-call(f32[3]{0} %x), custom_call_target=\"lapack_spotrf\"",
     "not supported: custom-call lapack_spotrf"),
])
def test_verifier_rejects(text: str, message: str) -> None:
    operand = text[text.index("(", text.index(" ") + 1) + 1:text.index(" %x")]
    if operand.startswith("("):
        operand = text.split("(")[2].split(" %x")[0]
    module = parse_module(f"HloModule m\n\nENTRY %e {{\n  %x = {operand} parameter(0)\n"
                          f"  ROOT %y = {text}\n}}\n")
    with pytest.raises(VerificationError, match=re.escape(message)):
        verify(module)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch, n", [((), 0), ((), 1), ((3,), 4), ((2, 2), 5), ((0,), 3)])
def test_cholesky_reference(dtype: type, batch: tuple[int, ...], n: int) -> None:
    a = _spd(batch, n, dtype)
    lower = cholesky_reference(a, True)
    upper = cholesky_reference(a, False)
    np.testing.assert_allclose(lower, np.linalg.cholesky(a), rtol=1e-5)
    np.testing.assert_array_equal(upper, np.swapaxes(lower, -1, -2))
    assert lower.dtype == dtype
    # Only the read triangle matters.
    junk = a + np.triu(np.full((n, n), 1e3, dtype), 1)
    np.testing.assert_array_equal(cholesky_reference(junk, True), lower)


def test_cholesky_not_positive_definite_is_nan_per_matrix() -> None:
    a = _spd((3,), 4, np.float32)
    a[1, 2, 2] = -50.0
    a[2, 0, 0] = np.nan
    result = cholesky_reference(a, True)
    assert not np.isnan(result[0]).any()
    assert np.isnan(result[1]).all() and np.isnan(result[2]).all()
    # Positive semidefinite: the last pivot is zero, not NaN, and nothing divides by it.
    singular = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(cholesky_reference(singular, True), [[1, 0], [1, 0]])
    # A zero pivot with elements below divides 0 by 0: NaN, and the next pivot with it.
    assert np.isnan(cholesky_reference(np.zeros((2, 2), np.float32), True)).all()


@pytest.mark.parametrize("left_side", [True, False])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("unit_diagonal", [True, False])
@pytest.mark.parametrize("transpose_a", ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"])
def test_triangular_solve_reference(left_side: bool, lower: bool, unit_diagonal: bool,
                                    transpose_a: str) -> None:
    a = _spd((2,), 4, np.float64)
    b = np.random.default_rng(2).standard_normal((2, 4, 3) if left_side else (2, 3, 4))
    x = triangular_solve_reference(a, b, left_side, lower, unit_diagonal, transpose_a)
    t = np.tril(a) if lower else np.triu(a)
    if unit_diagonal:
        t = np.where(np.eye(4, dtype=bool), 1.0, t)
    if transpose_a != "NO_TRANSPOSE":
        t = np.swapaxes(t, -1, -2)
    np.testing.assert_allclose(t @ x if left_side else x @ t, b, atol=1e-10)


def test_triangular_solve_zero_pivot_gives_inf() -> None:
    a = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
    x = triangular_solve_reference(a, np.ones((2, 1), np.float32), True, True, False,
                                   "NO_TRANSPOSE")
    assert np.isinf(x[0, 0]) and not np.isfinite(x[1, 0])


def test_reduce_precision_matches_bf16_and_f16_rounding() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-20, 20, 20000))).astype(np.float32)
    x = np.concatenate([x, np.array([np.inf, -np.inf, 0.0, -0.0, 65519, 65520], np.float32)])
    bf16 = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(reduce_precision_reference(x, 8, 7), bf16)
    with np.errstate(over="ignore"):
        f16 = x.astype(np.float16).astype(np.float32)
    got = reduce_precision_reference(x, 5, 10)
    normal = np.abs(f16) >= 2.0**-14
    np.testing.assert_array_equal(got[normal], f16[normal])
    # f16's subnormals have no place in a format without them: they flush to signed zero.
    tiny = ~normal
    assert (got[tiny] == 0).all()
    np.testing.assert_array_equal(np.signbit(got[tiny]), np.signbit(x[tiny]))


def test_reduce_precision_nan_and_own_bits() -> None:
    nan = np.array([np.nan, -np.nan, 1.5, 2.5], np.float32)
    kept = reduce_precision_reference(nan, 5, 2)
    assert np.isnan(kept[:2]).all()
    # No mantissa bits: NaN is +inf, halves round to even.
    np.testing.assert_array_equal(reduce_precision_reference(nan, 5, 0),
                                  np.array([np.inf, np.inf, 2.0, 2.0], np.float32))
    # At least the type's own bits: nothing changes, bf16 and f16 included.
    for dtype, bits in ((ml_dtypes.bfloat16, (8, 7)), (np.float16, (5, 10)),
                        (np.float64, (11, 52))):
        values = np.array([1.1, -3e-5, 7.0], dtype)
        np.testing.assert_array_equal(reduce_precision_reference(values, *bits), values)
    half = np.array([1.0 + 2**-9], np.float16)  # f16 rounds on its own bits
    assert reduce_precision_reference(half, 5, 8)[0] == np.float16(1.0)


def test_bitcast_convert_widths() -> None:
    x = np.array([[1.0, -2.0]], np.float32)
    pieces = bitcast_convert_reference(x, Shape("u8", (1, 2, 4)))
    np.testing.assert_array_equal(pieces[0, 0], [0, 0, 128, 63])  # little-endian
    np.testing.assert_array_equal(bitcast_convert_reference(pieces, Shape("f32", (1, 2))), x)
    np.testing.assert_array_equal(bitcast_convert_reference(x, Shape("s32", (1, 2))),
                                  x.view(np.int32))
    wide = bitcast_convert_reference(x, Shape("f64", (1,)))
    assert wide.view(np.uint64)[0] == x.view(np.uint64)[0, 0]
    halves = np.array([0x3F80, 0xFFC0], np.uint16)
    bf16 = bitcast_convert_reference(halves, Shape("bf16", (2,)))
    assert float(bf16[0]) == 1.0 and np.isnan(float(bf16[1]))


def test_philox_known_answer_and_threefry_split() -> None:
    # Random123's known-answer test for Philox4x32-10 (counter and key all ones).
    ones = np.uint64(0xFFFFFFFF)
    lanes = philox4x32([np.array([ones])] * 4, (ones, ones))
    assert [int(x[0]) for x in lanes] == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert threefry_half_dims(()) == (0, (1,))
    assert threefry_half_dims((3, 5)) == (1, (3, 3))
    assert threefry_half_dims((3, 4, 6)) == (1, (3, 2, 6))


def test_cost_analysis() -> None:
    module = parse_module(XLA_TEXT)
    entry = module.entry
    assert entry is not None
    costs = {inst.name: cost_analysis.instruction_cost(inst) for inst in entry.instructions}
    assert costs["chol"].flops == 2 * 2 * 3**3 // 3 and costs["chol"].transcendentals == 2 * 3
    assert costs["solve"].flops == 2 * 2 * 3 * 4 * 3 // 2
    assert costs["round"].flops == 24 and costs["bits"].flops == 0
    assert costs["size"].bytes_accessed == 0 and costs["barrier"].bytes_accessed == 0
