"""Vectorizable float32 transcendentals, emitted inline as LLVM IR.

Element generators in `elementwise.py` call these instead of libm, whose scalar calls
keep LLVM's loop vectorizer from widening a loop: every function is straight-line
arithmetic, bit manipulation, `select` and vectorizable intrinsics, as XLA's CPU backend
does (`llvm_ir_runtime.cc`). Special values are exact (NaN, ±inf, ±0 as C99 says); each
function's method and measured maximum error are in docs/accuracy.md, and
`tests/codegen/test_math_accuracy.py` bounds them, with or without FMA. f16 computes in
f32 (`float_function`); f64 keeps the LLVM intrinsics and libm.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import I32, KernelContext

F32 = ir.FloatType()

# Emits `f(x)` for one float32 value at the builder's position.
FloatFunction = Callable[[KernelContext, ir.Value], ir.Value]


def _c(value: float) -> ir.Constant:
    """A float32 constant, rounded to float32 first (llvmlite prints doubles)."""
    return ir.Constant(F32, float(np.float32(value)))


def _i(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def _fma(ctx: KernelContext, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    return ctx.call_intrinsic("fmuladd", [a, b, c])


def _horner(ctx: KernelContext, x: ir.Value, coefficients: Sequence[float]) -> ir.Value:
    """c[0] + c[1]*x + ... + c[-1]*x^(n-1), by Horner's rule."""
    result: ir.Value = _c(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result = _fma(ctx, result, x, _c(coefficient))
    return result


def _clamp_keeping_nan(ctx: KernelContext, x: ir.Value, low: float, high: float) -> ir.Value:
    """x clamped to [low, high], NaN passed through: compares that are false for NaN
    (one `vmaxps` and one `vminps`, whose operand order lets the NaN through)."""
    b = ctx.builder
    clamped = b.select(b.fcmp_ordered("<", x, _c(low)), _c(low), x)
    return b.select(b.fcmp_ordered(">", clamped, _c(high)), _c(high), clamped)


def _bits(value: float) -> int:
    """The bits of float32 `value` as a signed 32-bit integer."""
    return int(np.array(value, np.float32).view(np.int32))


def _pow2(ctx: KernelContext, n: ir.Value) -> ir.Value:
    """2^n for an i32 n in [-126, 127], built in the exponent field."""
    b = ctx.builder
    return b.bitcast(b.shl(b.add(n, _i(127)), _i(23)), F32)


# -- exp and expm1 -------------------------------------------------------------------------

_LOG2E = 1.44269504088896341
# ln2 in two parts (Cody-Waite): the first has few bits, so n * _LN2_HI is exact.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
# Cephes expf: e^r ~ 1 + r + r^2 * P(r) for |r| <= ln2/2.
_EXP_P = (5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3,
          1.3981999507e-3, 1.9875691500e-4)
# exp(x) is inf above 88.7228 and rounds to 0 below -103.98; clamping keeps n in range.
_EXP_HIGH, _EXP_LOW = 89.0, -104.0
# 1.5 * 2^23: a float below 2^22 in magnitude, added to this, is rounded to an integer (to
# even), and the sum lands in [2^23, 2^24), where its low significand bits hold that integer.
_ROUNDING_SHIFT = 12582912.0


def exp(ctx: KernelContext, x: ir.Value, nonpositive: bool = False) -> ir.Value:
    """e^x; with `nonpositive`, for an x its caller has proven never above 0 (NaN and
    -inf allowed: softmax's x - max(x)), without the upper clamp. The clamp passes every
    x <= 89 and NaN through unchanged, so the result is the same bits as the general
    exp's for all such x (tested over every float32 <= 0 and NaN)."""
    b = ctx.builder
    if nonpositive:
        v = b.select(b.fcmp_ordered("<", x, _c(_EXP_LOW)), _c(_EXP_LOW), x)
    else:
        v = _clamp_keeping_nan(ctx, x, _EXP_LOW, _EXP_HIGH)
    # n = round(v/ln2) as a float (the sum minus the shift, exact) and as an integer (the
    # difference of the bits), where roundeven and fptosi took a `vrndscaleps` and a
    # `vcvttps2dq`. A NaN stays NaN through r and p, and `ldexp` (or the two factors) of
    # a NaN is NaN whatever integer its bits gave: no NaN mask (two instructions fewer).
    shifted = _fma(ctx, v, _c(_LOG2E), _c(_ROUNDING_SHIFT))
    n = b.fsub(shifted, _c(_ROUNDING_SHIFT))
    r = _fma(ctx, n, _c(-_LN2_HI), v)
    r = _fma(ctx, n, _c(-_LN2_LO), r)
    p = _fma(ctx, _horner(ctx, r, _EXP_P), b.fmul(r, r), r)
    n_int = b.sub(b.bitcast(shifted, I32), _i(_bits(_ROUNDING_SHIFT)))
    return _scale(ctx, b.fadd(p, _c(1.0)), n_int)


@functools.cache
def _has_scalef() -> bool:
    """Whether the host has AVX-512F, where LLVM lowers `llvm.ldexp` on vectors to one
    `vscalefps` (elsewhere it calls libm's ldexpf per element)."""
    return "+avx512f" in llvm.get_host_cpu_features().flatten().split(",")


def _scale(ctx: KernelContext, y: ir.Value, n: ir.Value) -> ir.Value:
    """y * 2^n rounded once (into the denormals, or to inf), for an i32 n in [-150, 129]
    and y in [1/2, 2]."""
    b = ctx.builder
    if _has_scalef():
        return ctx.call_intrinsic("ldexp", [y, n], [y.type, n.type])
    # 2^n as two factors, each a normal float: the first product is exact, the second
    # rounds once.
    half = b.ashr(n, _i(1))
    return b.fmul(b.fmul(y, _pow2(ctx, half)), _pow2(ctx, b.sub(n, half)))


# e^r - 1 = r + r^2 * (1/2! + r/3! + ... + r^7/9!), Taylor, for |r| <= ln2 (0.1 ulp).
_EXPM1_P = tuple(1.0 / float(np.prod(np.arange(1, k + 1), dtype=np.float64))
                 for k in range(2, 10))
# expm1 is -1 (rounded) below -17.33; -26 keeps 2^n normal. Above 88.7228 it is inf,
# and n is capped at 127 so that 2^n stays finite (r then reaches ln2).
_EXPM1_LOW, _EXPM1_HIGH = -26.0, 89.0


def expm1(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    v = _clamp_keeping_nan(ctx, x, _EXPM1_LOW, _EXPM1_HIGH)
    # n = round(v/ln2), capped at 127, from the shifted sum as in exp (the cap's compare
    # is false for NaN, which flows on to the result).
    shifted = _fma(ctx, v, _c(_LOG2E), _c(_ROUNDING_SHIFT))
    cap = _c(_ROUNDING_SHIFT + 127.0)
    shifted = b.select(b.fcmp_ordered(">", shifted, cap), cap, shifted)
    n = b.fsub(shifted, _c(_ROUNDING_SHIFT))
    r = _fma(ctx, n, _c(-_LN2_HI), v)
    r = _fma(ctx, n, _c(-_LN2_LO), r)
    p = _fma(ctx, _horner(ctx, r, _EXPM1_P), b.fmul(r, r), r)
    # 2^n: n + 127 in the exponent field, n taken from the shifted sum's bits.
    exponent_bias = 127 - _bits(_ROUNDING_SHIFT)
    scale = b.bitcast(b.shl(b.add(b.bitcast(shifted, I32), _i(exponent_bias)), _i(23)), F32)
    # 2^n * (e^r - 1) + (2^n - 1): 2^n - 1 is exact for |n| <= 24, and beyond it the
    # other term dominates; one rounding with FMA.
    y = _fma(ctx, scale, p, b.fsub(scale, _c(1.0)))
    # Zeros keep their sign (a NaN is NaN already).
    return b.select(b.fcmp_ordered("==", x, _c(0.0)), x, y)


# -- log and log1p -------------------------------------------------------------------------

# Cephes logf: log(1+m) ~ m - m^2/2 + m^3 * P(m) for m in [sqrt(1/2) - 1, sqrt(2) - 1).
_LOG_P = (3.3333331174e-1, -2.4999993993e-1, 2.0000714765e-1, -1.6668057665e-1,
          1.4249322787e-1, -1.2420140846e-1, 1.1676998740e-1, -1.1514610310e-1,
          7.0376836292e-2)
_FLT_MIN = 1.17549435e-38
_SQRT_HALF = 0.707106781186547524


def log(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    denormal = b.fcmp_ordered("<", x, _c(_FLT_MIN))
    scaled = b.select(denormal, b.fmul(x, _c(2.0 ** 23)), x)
    bits = b.bitcast(scaled, I32)
    exponent = b.sub(b.lshr(bits, _i(23)), _i(126))  # the mantissa below is in [0.5, 1)
    exponent = b.sub(exponent, b.select(denormal, _i(23), _i(0)))
    m = b.bitcast(b.or_(b.and_(bits, _i(0x007FFFFF)), _i(0x3F000000)), F32)
    small = b.fcmp_ordered("<", m, _c(_SQRT_HALF))
    e = b.sitofp(b.sub(exponent, b.zext(small, I32)), F32)
    m = b.fsub(b.select(small, b.fadd(m, m), m), _c(1.0))  # exact: m in [0.5, 2)
    z = b.fmul(m, m)
    y = b.fmul(b.fmul(_horner(ctx, m, _LOG_P), m), z)
    y = _fma(ctx, e, _c(_LN2_LO), y)
    y = _fma(ctx, z, _c(-0.5), y)
    y = b.fadd(m, y)
    y = _fma(ctx, e, _c(_LN2_HI), y)
    # log(+inf) = +inf, log(0) = -inf, log(x < 0) = NaN, log(NaN) = NaN.
    y = b.select(b.fcmp_ordered("==", x, _c(float("inf"))), x, y)
    y = b.select(b.fcmp_ordered("==", x, _c(0.0)), _c(float("-inf")), y)
    return b.select(b.fcmp_unordered("<", x, _c(0.0)), _c(float("nan")), y)


def log1p(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    u = b.fadd(x, _c(1.0))
    d = b.fsub(u, _c(1.0))
    # u - 1 is exact, so x/d corrects the rounding of 1 + x (Goldberg).
    y = b.fmul(log(ctx, u), b.fdiv(x, d))
    y = b.select(b.fcmp_ordered("==", d, _c(0.0)), x, y)  # tiny x and ±0
    y = b.select(b.fcmp_ordered("==", x, _c(float("inf"))), x, y)
    return b.select(b.fcmp_ordered("==", x, _c(-1.0)), _c(float("-inf")), y)


# -- tanh, logistic, erf -------------------------------------------------------------------

# tanh as TensorFlow's CPU kernels compute it (Eigen's `ptanh_float`, the same form for
# its vector and scalar paths): x*P(x^2)/Q(x^2), a [9,8] rational fitted by rminimax, x
# clamped to the smallest float where it gives exactly ±1. TF's wheels are built without
# FMA, so every multiply-add is a multiplication and an addition, each rounded: the
# results are TF's bit for bit (6 ulp from exact at most, docs/accuracy.md). One
# division, no square root, no exp, no branches.
_TANH_P = (1.340216100e-1, 3.520756727e-3, 2.102733560e-5, 1.394553628e-8)
_TANH_Q = (1.0, 4.673548340e-1, 2.597254514e-2, 3.326951409e-4, 8.015776984e-7)
# Eigen's clamp without FMA: tanh rounds to ±1 from 9.01 on, the rational from here on.
_TANH_CLAMP = 7.90738964080810547


def _horner_unfused(ctx: KernelContext, x: ir.Value, coefficients: Sequence[float]
                    ) -> ir.Value:
    """`_horner` with a rounded multiplication and a rounded addition per step (no FMA),
    as code compiled without FMA evaluates it."""
    b = ctx.builder
    result: ir.Value = _c(coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result = b.fadd(b.fmul(result, x), _c(coefficient))
    return result


def tanh(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    v = _clamp_keeping_nan(ctx, x, -_TANH_CLAMP, _TANH_CLAMP)  # ±inf give ±1
    t = b.fmul(v, v)
    # x + x^3 * P(t) (P's constant term makes the numerator's x^3 coefficient): ±0 and
    # tiny x come back as x, NaN as NaN.
    p = b.fadd(b.fmul(b.fmul(t, v), _horner_unfused(ctx, t, _TANH_P)), v)
    return b.fdiv(p, _horner_unfused(ctx, t, _TANH_Q))


def logistic(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    # -|x| is never above 0 (or NaN): exp without its upper clamp, the same bits.
    e = exp(ctx, b.fneg(ctx.call_intrinsic("fabs", [x])), nonpositive=True)
    negative = b.fcmp_ordered("<", x, _c(0.0))
    return b.fdiv(b.select(negative, e, _c(1.0)), b.fadd(e, _c(1.0)))


# erf(x) = h/sqrt(1 + h^2) with h = erf/sqrt(1 - erf^2), odd and smooth (h/x is analytic
# in x^2; h grows like 1/sqrt(2 erfc) and is 29,000 at the clamp): h/x = 1 + _ERF_H(x^2)
# on [0, 4.5], fitted for this project (Lawson-weighted least squares in float64 on the
# error of erf in float32 ulps: 0.65 ulp). A relative error e in h moves erf by
# e * (1 - erf^2) relatively, so the rounding of the polynomial fades as erf nears ±1,
# where x * P(x^2)/Q(x^2) (XLA's form) loses 5-7 ulp; what is left is the rounding of
# the last few operations, 3 ulp at most (docs/accuracy.md).
_ERF_H = (0.1283792108297348, 0.34221935272216797, 0.0804835855960846,
          0.012582195922732353, 0.0014675267739221454, 8.988326590042561e-05,
          2.5953677322831936e-05, -1.6892371377252857e-06, 2.23052310843741e-07)
# At 4.5, h^2 = 8.4e8 > 2^25: sqrt(1 + h^2) rounds to |h| and erf to ±1 exactly (erf
# rounds to ±1 from 3.92 on).
_ERF_CLAMP = 4.5


def erf(ctx: KernelContext, x: ir.Value) -> ir.Value:
    b = ctx.builder
    v = _clamp_keeping_nan(ctx, x, -_ERF_CLAMP, _ERF_CLAMP)
    # h = v + v*P(v^2) with one rounding (tiny and denormal x round once), keeps -0.0.
    h = _fma(ctx, v, _horner(ctx, b.fmul(v, v), _ERF_H), v)
    # Two operations of the divider (sqrt and divide), no exp, no branches; ±inf give ±1.
    return b.fdiv(h, ctx.call_intrinsic("sqrt", [_fma(ctx, h, h, _c(1.0))]))


# HLO opcode → its float32 emitter.
F32_FUNCTIONS: dict[str, FloatFunction] = {
    "exponential": exp, "exponential-minus-one": expm1, "log": log, "log-plus-one": log1p,
    "tanh": tanh, "logistic": logistic, "erf": erf,
}


def float_function(ctx: KernelContext, opcode: str, x: ir.Value) -> ir.Value | None:
    """`opcode(x)` through this module for f32 and f16 values; None for other types."""
    function = F32_FUNCTIONS.get(opcode)
    if function is None:
        return None
    return _in_f32(ctx, function, x)


def exp_of_nonpositive(ctx: KernelContext, x: ir.Value) -> ir.Value | None:
    """`exp(x, nonpositive=True)` for f32 and f16 values (as `float_function`); None for
    other types (f64 keeps `llvm.exp`)."""
    return _in_f32(ctx, functools.partial(exp, nonpositive=True), x)


def _in_f32(ctx: KernelContext, function: FloatFunction, x: ir.Value) -> ir.Value | None:
    if x.type == F32:
        return function(ctx, x)
    if x.type == ir.HalfType():  # computed in f32, rounded once to f16
        return ctx.builder.fptrunc(function(ctx, ctx.builder.fpext(x, F32)), x.type)
    return None
