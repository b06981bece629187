"""The shared tolerance table: how close a compiled or evaluated result must be, per op and dtype.

Every numerics test (HLO evaluator against NumPy, TF graphs against TF itself,
codegen against the evaluator) compares through `assert_close`, so that one table
says what "close" means (docs/conventions.md, habit 6). Rules:

- shapes and dtypes must match exactly;
- NaN positions must match exactly; infinities must match exactly (value and sign);
- integers and bools must match exactly;
- finite floats pass when within `ulps` units in the last place, or within
  `atol + rtol * |expected|` (the absolute part covers results that cancel to near
  zero, where ulps mean nothing; the relative part covers long sums and dots);
- -0.0 against 0.0 fails unless the op's entry says `signed_zero=True`: for ops whose
  sign of zero depends on evaluation order or on how max/min pick among equal zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """How far a float result may stray; see the module docstring for how it is applied."""

    ulps: int = 1
    atol: float = 0.0
    rtol: float = 0.0
    signed_zero: bool = False


# Per op type, for float32; float64 entries are derived (same ulps, tighter atol/rtol)
# unless listed in _F64_OVERRIDES. Op types are TF's or HLO's opcode names.
_EXACTISH = Tolerance(ulps=1)
_TRANSCENDENTAL = Tolerance(ulps=4, atol=1e-7)
_ZERO_SIGN_FREE = Tolerance(ulps=1, signed_zero=True)
_ACCUMULATING = Tolerance(ulps=4, atol=1e-5, rtol=1e-5, signed_zero=True)

_LINALG = Tolerance(ulps=16, atol=1e-5, rtol=1e-4, signed_zero=True)
_LINALG_OPS = ("Cholesky", "MatrixTriangularSolve", "cholesky", "triangular-solve")

_CONVOLUTIONS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "convolution")
_POOLING_AND_NORMALIZATION = ("AvgPool", "AvgPool3D", "AvgPoolGrad", "AvgPool3DGrad",
                              "MaxPool3DGrad", "FusedBatchNormV3", "FusedBatchNormGradV3")
# Image resize gradients add each input pixel's terms in another order than TF's kernels.
_RESIZE_GRADIENTS = ("ResizeBilinearGrad", "ResizeNearestNeighborGrad", "ResizeBicubicGrad")

TOLERANCES: dict[str, Tolerance] = {
    # transcendental element-wise ops: TF (Eigen) and codegen use polynomial approximations
    **{op: _TRANSCENDENTAL for op in (
        "Exp", "Expm1", "Log", "Log1p", "Sigmoid", "Pow", "Sin", "Cos",
        "Elu", "Tan", "Atan", "Atan2", "exponential", "exponential-minus-one", "log",
        "log-plus-one", "logistic", "erf", "power", "sine", "cosine", "tan", "atan2",
        "cbrt")},
    "Softplus": Tolerance(ulps=4, atol=1e-6, signed_zero=True),
    # TF's kernel rounds x² before exp(-x²): 8 ulp off at |x| = 3, 65 at 8.8; ours is
    # within 8 ulp of exact (test_training_ops.test_erfc_f32_accuracy).
    "Erfc": Tolerance(ulps=16, atol=1e-7),
    # TF's erf (Eigen's rational) is up to 6 ulp from exact over test_math_accuracy's
    # sweep, ours up to 3: their sum (an `erf` op against the evaluator keeps 4).
    "Erf": Tolerance(ulps=9, atol=1e-7),
    # Our tanh is TF's (Eigen's rational, clamped) bit for bit, up to 6 ulp from exact
    # over test_math_accuracy's sweep (at x = ±6.22; 1.8% of it beyond 2 ulp): a `tanh`
    # op against the evaluator's exact one keeps 6; `Tanh` keeps 8 for TF's XLA, whose
    # tanh (its own rational) is up to 7 ulp from TF's kernel.
    "tanh": Tolerance(ulps=6, atol=1e-7),
    "Tanh": Tolerance(ulps=8, atol=1e-7),
    "Sqrt": Tolerance(ulps=2), "Rsqrt": Tolerance(ulps=2), "sqrt": Tolerance(ulps=2),
    "rsqrt": Tolerance(ulps=2), "Reciprocal": Tolerance(ulps=2), "RealDiv": Tolerance(ulps=2),
    "Div": Tolerance(ulps=2), "divide": Tolerance(ulps=2),
    # max/min of -0.0 and 0.0 may return either
    **{op: _ZERO_SIGN_FREE for op in (
        "Relu", "Relu6", "LeakyRelu", "Maximum", "Minimum", "Max", "Min", "Sign",
        "maximum", "minimum", "sign", "clamp")},
    # accumulations: order of summation differs between TF, NumPy and codegen
    **{op: _ACCUMULATING for op in (
        "Sum", "Mean", "Prod", "AddN", "MatMul", "BatchMatMulV2", "BatchMatMul", "reduce",
        "dot")},
    # gradient ops: the forward op's arithmetic, transcendental or dividing
    **{op: _TRANSCENDENTAL for op in ("SoftplusGrad", "Selu")},
    **{op: Tolerance(ulps=2) for op in ("SqrtGrad", "RsqrtGrad", "ReciprocalGrad", "InvGrad",
                                        "DivNoNan", "FloorDiv", "Softsign")},
    "SoftsignGrad": Tolerance(ulps=4),
    # TF's vectorized kernel keeps the sign of x == ±0, its scalar path gives +0
    **{op: Tolerance(ulps=4, atol=1e-7, signed_zero=True) for op in ("Xlogy", "Xlog1py")},
    "Xdivy": Tolerance(ulps=2, signed_zero=True),
    **{op: _ACCUMULATING for op in ("BiasAddGrad", "L2Loss", "Einsum", "BatchMatMulV3")},
    # convolutions: sums over windows and input features, in another order than TF's
    **{op: _ACCUMULATING for op in _CONVOLUTIONS},
    # pooling sums and batch norm's statistics, in another order than TF's
    **{op: _ACCUMULATING for op in _POOLING_AND_NORMALIZATION + _RESIZE_GRADIENTS},
    "SoftmaxCrossEntropyWithLogits": Tolerance(ulps=8, atol=1e-6, rtol=1e-6),
    "SparseSoftmaxCrossEntropyWithLogits": Tolerance(ulps=8, atol=1e-6, rtol=1e-6),
    # whole backward passes (GradientTape over a model): chains of accumulations and
    # transcendental ops, compared output by output
    "model gradient": Tolerance(ulps=16, atol=2e-5, rtol=2e-4, signed_zero=True),
    "Softmax": Tolerance(ulps=8, atol=1e-7),
    "LogSoftmax": Tolerance(ulps=8, atol=1e-6),
    # factorizations and substitutions: n-term sums in another order than LAPACK's or
    # XLA's blocked ones, each divided by a pivot (the test matrices are well conditioned)
    **{op: _LINALG for op in _LINALG_OPS},
}

_F64_OVERRIDES: dict[str, Tolerance] = {
    **{op: Tolerance(ulps=4, atol=1e-13, rtol=1e-12, signed_zero=True) for op in (
        "Sum", "Mean", "Prod", "AddN", "MatMul", "BatchMatMulV2", "BatchMatMul", "reduce",
        "dot", "BiasAddGrad", "L2Loss", "Einsum", "BatchMatMulV3", *_CONVOLUTIONS,
        *_POOLING_AND_NORMALIZATION, *_RESIZE_GRADIENTS)},
    **{op: Tolerance(ulps=16, atol=1e-12, rtol=1e-10, signed_zero=True) for op in _LINALG_OPS},
}


# bfloat16 keeps 8 significant bits. Where TF's kernels round intermediate results to it
# at other points than XLA does (a bias gradient or a reduction summed in bfloat16 where
# XLA sums in float32; log-softmax's shifted logits and the log of their sum each rounded
# before one is subtracted from the other), results differ by a few units of the
# intermediates' magnitude rather than of the result's: tfxla-lite's values are TF's
# XLA's there (tests/clustering/test_half_float_ops_tf.py).
_BF16_INTERMEDIATE_ROUNDING = frozenset({
    "Sum", "Mean", "Prod", "AddN", "MatMul", "BatchMatMulV2", "BatchMatMul", "reduce", "dot",
    "BiasAddGrad", "L2Loss", "Einsum", "BatchMatMulV3", "Softmax", "LogSoftmax",
    "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits", *_CONVOLUTIONS,
    *_POOLING_AND_NORMALIZATION, *_RESIZE_GRADIENTS})


def tolerance(op_type: str, dtype: np.dtype | type | str = np.float32) -> Tolerance:
    """The tolerance for results of `op_type` in `dtype` (float16/bfloat16 are looser)."""
    dtype = np.dtype(dtype)
    base = TOLERANCES.get(op_type, _EXACTISH)
    if dtype == np.float64:
        if op_type in _F64_OVERRIDES:
            return _F64_OVERRIDES[op_type]
        return Tolerance(base.ulps, base.atol * 1e-9, base.rtol * 1e-7, base.signed_zero)
    if dtype.name == "bfloat16" and op_type in _BF16_INTERMEDIATE_ROUNDING:
        return Tolerance(max(base.ulps, 2), max(base.atol, 2**-6), max(base.rtol, 2**-5),
                         base.signed_zero)
    if dtype.itemsize < 4 and dtype.kind == "f" or dtype.name == "bfloat16":
        return Tolerance(max(base.ulps, 2), max(base.atol, 1e-3), max(base.rtol, 1e-2),
                         base.signed_zero)
    return base


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Units in the last place between finite floats of equal dtype (0 for -0.0 vs 0.0)."""
    dtype = a.dtype
    if dtype == np.float64:
        int_type, sign = np.int64, np.int64(0x7FFFFFFFFFFFFFFF)
    elif dtype == np.float32:
        int_type, sign = np.int32, np.int32(0x7FFFFFFF)
    else:  # half precision and friends: measure in float32 ulps
        return ulp_distance(a.astype(np.float32), b.astype(np.float32))

    def ordered(x: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(x).view(int_type).astype(np.int64)
        # Map sign-magnitude to a monotonic integer line; both zeros map to 0.
        return np.where(bits < 0, -(bits & np.int64(sign)), bits)

    oa, ob = ordered(a), ordered(b)
    # |oa - ob| in uint64 arithmetic, so that opposite-sign float64 extremes cannot overflow.
    ma, mb = np.abs(oa).astype(np.uint64), np.abs(ob).astype(np.uint64)
    same_sign = (oa >= 0) == (ob >= 0)
    return np.where(same_sign, np.maximum(ma, mb) - np.minimum(ma, mb), ma + mb)


def assert_close(actual: np.ndarray, expected: np.ndarray, op_type: str,
                 context: str = "") -> None:
    """Fail with a readable message unless `actual` matches `expected` within the table."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    where = f" [{op_type}{': ' + context if context else ''}]"
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}{where}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}{where}"
    if actual.dtype.kind not in "fc" and actual.dtype.name != "bfloat16":
        mismatch = actual != expected
        assert not mismatch.any(), _report(actual, expected, mismatch, "values differ", where)
        return
    a = actual.astype(np.float64) if actual.dtype.name == "bfloat16" else actual
    e = expected.astype(np.float64) if expected.dtype.name == "bfloat16" else expected
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    assert (nan_a == nan_e).all(), _report(actual, expected, nan_a != nan_e,
                                           "NaN positions differ", where)
    inf_a, inf_e = np.isinf(a), np.isinf(e)
    inf_mismatch = (inf_a | inf_e) & ~(a == e)
    assert not inf_mismatch.any(), _report(actual, expected, inf_mismatch, "infinities differ",
                                           where)
    finite = np.isfinite(a) & np.isfinite(e)
    tol = tolerance(op_type, actual.dtype)
    if not tol.signed_zero:
        zeros = finite & (a == 0) & (e == 0)
        sign_mismatch = zeros & (np.signbit(a) != np.signbit(e))
        assert not sign_mismatch.any(), _report(actual, expected, sign_mismatch,
                                                "signs of zero differ", where)
    if not finite.any():
        return
    fa, fe = a[finite], e[finite]
    within_abs = np.abs(fa.astype(np.float64) - fe.astype(np.float64)) <= (
        tol.atol + tol.rtol * np.abs(fe.astype(np.float64)))
    within_ulps = ulp_distance(fa, fe) <= tol.ulps
    bad = ~(within_abs | within_ulps.astype(bool))
    if bad.any():
        mask = np.zeros(a.shape, dtype=bool)
        mask[finite] = bad
        raise AssertionError(_report(actual, expected, mask, f"values differ beyond {tol}",
                                     where))


def _report(actual: np.ndarray, expected: np.ndarray, mask: np.ndarray, what: str,
            where: str) -> str:
    positions = np.argwhere(mask)[:5]
    lines = [f"{what}{where}: {int(mask.sum())} of {mask.size} elements"]
    for position in positions:
        index = tuple(int(i) for i in position)
        lines.append(f"  at {index}: actual {actual[index]!r}, expected {expected[index]!r}")
    return "\n".join(lines)
