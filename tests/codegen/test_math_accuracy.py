"""Accuracy of the inline float32 transcendentals (`tfxla_lite.codegen.cpu.math`).

Each function runs, compiled, over a sweep of its domain: every 2048th float32 bit
pattern (all magnitudes and both signs, denormals included), a dense uniform grid
over the region where the function varies, and the edge values. The results are
compared with NumPy's float64 result rounded to float32, in units in the last place;
the bounds asserted here are the ones `docs/accuracy.md` states. NaN positions,
infinities and signed zeros must match exactly. The optimized IR must keep the
loop vectorized and free of calls.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest
from codegen_helpers import build, compile_unfused
from tolerances import ulp_distance

from tfxla_lite.codegen import Executable
from tfxla_lite.hlo.shape import Shape

_erf = np.frompyfunc(math.erf, 1, 1)


def _logistic(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# opcode: (float64 reference, dense region, max ulp asserted)
CASES: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float], int]] = {
    "exponential": (np.exp, (-104.0, 89.0), 1),
    "log": (np.log, (0.0, 4.0), 1),
    "exponential-minus-one": (np.expm1, (-18.0, 89.0), 1),
    "log-plus-one": (np.log1p, (-1.0, 4.0), 2),
    "tanh": (np.tanh, (-10.0, 10.0), 6),  # TF's own tanh, bit for bit: 6 ulp at x = ±6.22
    "logistic": (_logistic, (-104.0, 20.0), 2),
    "erf": (lambda x: _erf(x).astype(np.float64), (-4.5, 4.5), 3),
}

EDGES = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38,
                  1.1754944e-38, -1.0, 1.0, 88.72283, 88.72284, -87.33655, -103.97208,
                  -103.97209, 3.4028235e38, -3.4028235e38, 0.5493061, 0.921875, 0.9218749,
                  3.92, 4.0, 4.5, -4.5, 4.5000005, 9.0, 44.5, 5.9604645e-08, -5.9604645e-08,
                  0.5, 0.49999997, -0.5, 9.5, 9.500001, -9.5, 9.01, 7.9073896, 7.90739,
                  -7.9073896, 7.9073887, 0.0004, -0.0004],
                 dtype=np.float32)


def sweep(region: tuple[float, float], dense_points: int = 1 << 20) -> np.ndarray:
    """Every 2048th bit pattern, a dense grid over `region`, and the edge values."""
    patterns = np.arange(0, 1 << 32, 1 << 11, dtype=np.uint64).astype(np.uint32)
    low, high = region
    dense = np.linspace(low, high, dense_points, dtype=np.float64).astype(np.float32)
    return np.concatenate([patterns.view(np.float32), dense, EDGES])


def _compile(opcode: str, shape: Shape) -> Executable:
    module = build(opcode, [shape], lambda c, ps: [c.create(opcode, ps)])
    return compile_unfused(module)


def max_ulp_error(opcode: str, x: np.ndarray) -> tuple[int, float]:
    """(max ulp error, where) of the compiled `opcode` over float32 inputs `x`."""
    reference = CASES[opcode][0]
    actual = _compile(opcode, Shape("f32", x.shape))(x)[0]
    with np.errstate(all="ignore"):
        expected = np.asarray(reference(x.astype(np.float64)), np.float64).astype(np.float32)
    nan = np.isnan(expected)
    assert (np.isnan(actual) == nan).all(), x[np.isnan(actual) != nan][:5]
    actual, expected, inputs = actual[~nan], expected[~nan], x[~nan]
    infinite = np.isinf(expected) | np.isinf(actual)
    assert (actual[infinite] == expected[infinite]).all(), inputs[infinite][
        actual[infinite] != expected[infinite]][:5]
    zero = (actual == 0) & (expected == 0)
    assert (np.signbit(actual[zero]) == np.signbit(expected[zero])).all(), "signed zeros"
    distance = ulp_distance(actual, expected)
    worst = int(np.argmax(distance))
    return int(distance[worst]), float(inputs[worst])


@pytest.mark.parametrize("opcode", sorted(CASES))
def test_max_ulp_error(opcode: str) -> None:
    _, region, bound = CASES[opcode]
    error, where = max_ulp_error(opcode, sweep(region))
    assert error <= bound, f"{opcode}: {error} ulp at x={where!r} (bound {bound})"


@pytest.mark.parametrize("opcode", sorted(CASES))
def test_special_values(opcode: str) -> None:
    """The C99 special cases, exactly (sign of zero and of infinity included)."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    actual = _compile(opcode, Shape("f32", x.shape))(x)[0]
    expected = {
        "exponential": [np.nan, np.inf, 0.0, 1.0, 1.0],
        "log": [np.nan, np.inf, np.nan, -np.inf, -np.inf],
        "exponential-minus-one": [np.nan, np.inf, -1.0, 0.0, -0.0],
        "log-plus-one": [np.nan, np.inf, np.nan, 0.0, -0.0],
        "tanh": [np.nan, 1.0, -1.0, 0.0, -0.0],
        "logistic": [np.nan, 1.0, 0.0, 0.5, 0.5],
        "erf": [np.nan, 1.0, -1.0, 0.0, -0.0],
    }[opcode]
    expected_array = np.array(expected, np.float32)
    np.testing.assert_array_equal(actual, expected_array)
    numbers = ~np.isnan(expected_array)  # a NaN's sign is not specified
    assert (np.signbit(actual[numbers]) == np.signbit(expected_array[numbers])).all()


def test_f16_goes_through_f32() -> None:
    x = np.linspace(-6, 6, 4001).astype(np.float16)
    for opcode in ("exponential", "tanh", "erf", "logistic"):
        actual = _compile(opcode, Shape("f16", x.shape))(x)[0]
        with np.errstate(all="ignore"):
            expected = np.asarray(CASES[opcode][0](x.astype(np.float64)),
                                  np.float64).astype(np.float16)
        finite = np.isfinite(expected)
        assert (ulp_distance(actual[finite], expected[finite]) <= 2 ** 13 + 1).all()


@pytest.mark.parametrize("opcode", sorted(CASES))
def test_loop_is_vectorized_without_calls(opcode: str) -> None:
    """The whole loop runs in vector registers: vector ops, and no call but intrinsics
    that lower to instructions (the kernel is inlined into `entry`)."""
    optimized = _compile(opcode, Shape("f32", (4096,))).llvm_ir_optimized
    assert re.search(r"<(8|16) x float>", optimized), optimized
    calls = re.findall(r"\bcall [^@\n]*@([\w.\"]+)", optimized)
    assert calls and all(c.startswith("llvm.") for c in calls), calls
    assert not [c for c in calls if re.match(r"llvm\.(exp|log|tanh|erf|pow)\.", c)], calls
    # Every float operation in the kernel is on vectors (the tail is masked or scalar
    # only where the trip count is not a multiple of the width; 4096 is).
    assert not re.search(r"call float @llvm\.", optimized), optimized


@pytest.mark.parametrize("opcode", ["exponential", "exponential-minus-one"])
def test_exp_takes_n_without_a_conversion_and_nan_without_a_mask(opcode: str) -> None:
    """exp and expm1 get n = round(x/ln2) as a float and as integer bits from one FMA
    with 1.5*2^23 (no `fptosi`), and a NaN flows through their arithmetic to the result
    (no NaN compare and select): fewer vector instructions per vector than before, the
    results within the same bounds (`test_max_ulp_error`, `test_special_values`)."""
    optimized = _compile(opcode, Shape("f32", (4096,))).llvm_ir_optimized
    assert "fptosi" not in optimized, optimized
    assert "fcmp uno" not in optimized, optimized


def test_exp_without_avx512_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hosts without AVX-512 scale by two exponent-field factors instead of `llvm.ldexp`:
    the same bound, and no call left in the loop."""
    from tfxla_lite.codegen.cpu import math as vector_math

    monkeypatch.setattr(vector_math, "_has_scalef", lambda: False)
    monkeypatch.setenv("TFXLA_LITE_CACHE", "0")  # the kernel cache would hand back ldexp
    error, where = max_ulp_error("exponential", sweep(CASES["exponential"][1]))
    assert error <= CASES["exponential"][2], f"{error} ulp at x={where!r}"
    optimized = _compile("exponential", Shape("f32", (4096,))).llvm_ir_optimized
    assert "ldexp" not in optimized


# GELU as TF spells it (`tf.nn.gelu(approximate=False)`, `tfxla_lite.examples.gelu`), one
# kLoop fusion: 0.5*x * (1 + erf(x / sqrt 2)).
_GELU_HLO = """HloModule gelu
ENTRY %main (x: f32[{n}]) -> f32[{n}] {{
  %x = f32[{n}]{{0}} parameter(0)
  %c_half = f32[] constant(0.5)
  %half = f32[{n}]{{0}} broadcast(f32[] %c_half), dimensions={{}}
  %half_x = f32[{n}]{{0}} multiply(f32[{n}]{{0}} %half, f32[{n}]{{0}} %x)
  %c_sqrt2 = f32[] constant(1.41421354)
  %sqrt2 = f32[{n}]{{0}} broadcast(f32[] %c_sqrt2), dimensions={{}}
  %scaled = f32[{n}]{{0}} divide(f32[{n}]{{0}} %x, f32[{n}]{{0}} %sqrt2)
  %erf = f32[{n}]{{0}} erf(f32[{n}]{{0}} %scaled)
  %c_one = f32[] constant(1)
  %one = f32[{n}]{{0}} broadcast(f32[] %c_one), dimensions={{}}
  %sum = f32[{n}]{{0}} add(f32[{n}]{{0}} %one, f32[{n}]{{0}} %erf)
  ROOT %gelu = f32[{n}]{{0}} multiply(f32[{n}]{{0}} %half_x, f32[{n}]{{0}} %sum)
}}
"""
# |GELU(x) - exact| <= _GELU_BOUND * |x| * 2^-24 (measured 2.47; TF's own kernels 2.14
# for tf.nn.gelu and 4.1 for the spelled-out form, XLA 3.5). Where 1 + erf cancels
# (x < -1) no relative bound holds for any float32 erf: erf is quantized in steps of
# 2^-24 near -1, so the result's error is a multiple of |x| * 2^-24, not of its ulp.
_GELU_BOUND = 3.0


def _gelu_sweep() -> np.ndarray:
    """A dense grid over [-16, 16] and every 4096th bit pattern; no denormal inputs
    (TF flushes them to zero)."""
    patterns = np.arange(0, 1 << 32, 1 << 12, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([np.linspace(-16, 16, 1 << 21, dtype=np.float64).astype(np.float32),
                        patterns.view(np.float32)])
    return x[np.isfinite(x) & (np.abs(x) < 1e30) & ((np.abs(x) >= 1.2e-38) | (x == 0))]


def test_gelu_error_scales_with_x() -> None:
    """The fused GELU kernel against float64 (0.5*x*erfc(-x/sqrt 2), no cancellation) and
    against TensorFlow's own `tf.nn.gelu`, over its whole float32 domain."""
    from tfxla_lite.codegen import compile_module
    from tfxla_lite.hlo.parser import parse_module

    x = _gelu_sweep()
    actual = compile_module(parse_module(_GELU_HLO.format(n=x.size)), cache=False)(x)[0]
    wide = x.astype(np.float64)
    exact = 0.5 * wide * np.frompyfunc(math.erfc, 1, 1)(-wide / math.sqrt(2)).astype(np.float64)
    scale = np.abs(wide) * 2.0 ** -24
    error = np.abs(actual - exact)
    worst = int(np.argmax(error - _GELU_BOUND * scale))
    assert (error <= _GELU_BOUND * scale).all(), (
        f"{error[worst] / scale[worst]:.2f} * |x| * 2^-24 at x={x[worst]!r}")
    # Where 1 + erf does not cancel (x >= -1/2), a few ulp of the result.
    no_cancellation = x >= -0.5
    assert ulp_distance(actual[no_cancellation],
                        exact[no_cancellation].astype(np.float32)).max() <= 3
    tf = pytest.importorskip("tensorflow")
    theirs = tf.nn.gelu(tf.constant(x), approximate=False).numpy().astype(np.float64)
    # Both within their bounds of exact: within the sum of each other (TF's: 2.14), where
    # the result is a normal float (TF flushes denormal results to zero).
    normal = np.abs(exact) >= np.finfo(np.float32).tiny
    assert (np.abs(actual - theirs) <= (_GELU_BOUND + 2.5) * scale)[normal].all()


def _tf_tanh_inputs() -> np.ndarray:
    """The regular sweep and every 61st float of [-8, 8], without what TF flushes (its
    kernels treat denormal inputs as zero)."""
    top = int(np.array(8.0, np.float32).view(np.uint32))
    dense = np.arange(0, top + 1, 61, dtype=np.uint32).view(np.float32)
    x = np.concatenate([sweep(CASES["tanh"][1]), dense, -dense])
    return x[(np.abs(x) >= np.finfo(np.float32).tiny) | (x == 0) | np.isnan(x)]


def test_tanh_is_tensorflows() -> None:
    """TF's tanh (Eigen's `ptanh_float`, built without FMA) is what the kernel computes:
    the same bits for every input TF does not flush, ±inf, NaN and signed zeros included.
    TF's tanh is 6 ulp from exact at most over the regular sweep (at x = ±6.22), within
    `test_max_ulp_error`'s bound and the `Tanh` entry of tests/tolerances.py."""
    tf = pytest.importorskip("tensorflow")
    x = _tf_tanh_inputs()
    theirs = tf.tanh(tf.constant(x)).numpy()
    ours = _compile("tanh", Shape("f32", x.shape))(x)[0]
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    differ &= ~(np.isnan(ours) & np.isnan(theirs))  # a NaN's payload is not specified
    assert not differ.any(), (x[differ][:5], ours[differ][:5], theirs[differ][:5])
    finite = np.isfinite(x)
    exact = np.tanh(x[finite].astype(np.float64)).astype(np.float32)
    tf_error = int(ulp_distance(theirs[finite], exact).max())
    assert tf_error <= CASES["tanh"][2], f"TF's tanh is now {tf_error} ulp off"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_float_tanh_is_tensorflows(dtype: str) -> None:
    """f16 and bf16 tanh (computed in f32, rounded once) give TF's bits for all 65,536
    inputs but the bf16 denormals, which TF flushes to zero."""
    tf = pytest.importorskip("tensorflow")
    import ml_dtypes

    numpy_type = np.float16 if dtype == "f16" else ml_dtypes.bfloat16
    x = np.arange(1 << 16, dtype=np.uint16).view(numpy_type)
    ours = _compile("tanh", Shape(dtype, x.shape))(x)[0]
    theirs = tf.tanh(tf.constant(x)).numpy()
    wide = x.astype(np.float32)
    kept = ~np.isnan(wide) & ((np.abs(wide) >= np.finfo(np.float32).tiny) | (wide == 0))
    differ = (ours.view(np.uint16) != theirs.view(np.uint16)) & kept
    assert not differ.any(), (x[differ][:5], ours[differ][:5], theirs[differ][:5])
    assert np.isnan(ours.astype(np.float32)[np.isnan(wide)]).all()


def test_tanh_saturates_without_overshoot() -> None:
    """From the clamp on the result is exactly ±1, never beyond (a rational evaluated past
    its fitted range could pass 1); below it, under 1 (not monotonic there: TF's values
    step back by an ulp here and there, and these are TF's); tiny and
    denormal x come back as x (tanh(x) rounds to x there), NaN as NaN."""
    clamp = np.float32(7.90738964080810547)
    beyond = np.array([clamp, np.nextafter(clamp, np.float32(np.inf)), 9.0, 20.0, 1e30,
                       np.inf], np.float32)
    x = np.concatenate([beyond, -beyond])
    actual = _compile("tanh", Shape("f32", x.shape))(x)[0]
    np.testing.assert_array_equal(actual, np.sign(x))
    below = np.arange(int(np.array(5.0, np.float32).view(np.uint32)),
                      int(clamp.view(np.uint32)), dtype=np.uint32).view(np.float32)
    rising = _compile("tanh", Shape("f32", below.shape))(below)[0]
    assert (rising < 1).all() and (rising > 0.9999).all()
    tiny = np.array([1e-45, -1e-45, 1e-38, -3e-39, 1e-20, -1e-10, 2e-4, np.nan],
                    np.float32)
    small = _compile("tanh", Shape("f32", tiny.shape))(tiny)[0]
    np.testing.assert_array_equal(small[:-2], tiny[:-2])
    assert np.isnan(small[-1])


def test_tanh_takes_one_division_and_no_square_root() -> None:
    optimized = _compile("tanh", Shape("f32", (4096,))).llvm_ir_optimized
    assert "sqrt" not in optimized, optimized
    assert len(re.findall(r"= fdiv <", optimized)) == 1, optimized


@pytest.mark.slow
@pytest.mark.parametrize("opcode, clamp", [("erf", 4.5), ("tanh", 9.5)])
def test_bound_holds_on_a_denser_sweep(opcode: str, clamp: float) -> None:
    """Every 97th float32 of [-clamp, clamp] (22 and 23 million points, both signs; the
    results are ±1 beyond), where the polynomials and their rounding act: the same bound
    as the regular sweep."""
    top = int(np.array(clamp, np.float32).view(np.uint32))
    patterns = np.arange(0, top + 1, 97, dtype=np.uint32).view(np.float32)
    error, where = max_ulp_error(opcode, np.concatenate([patterns, -patterns]))
    assert error <= CASES[opcode][2], f"{opcode}: {error} ulp at x={where!r}"
