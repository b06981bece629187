"""Lowering rules of TF's element-wise ops: arithmetic, comparisons, casts, activations.

Registered into `registry.OP_RULES` on import. Every rule broadcasts its operands to
the op's static result shape first (TF broadcasts implicitly, HLO never does), then
emits one or a few element-wise HLO instructions with TF's semantics for NaN, inf
and -0.0 where HLO's opcode alone would differ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    ALL,
    BOOL,
    FLOAT,
    INTEGER,
    NUMERIC,
    LoweringContext,
    element_type,
    register,
)
from tfxla_lite.hlo import Instruction
from tfxla_lite.hlo.shape import FLOAT_TYPES

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _broadcast_all(ctx: LoweringContext, operands: Operands) -> list[Instruction]:
    dims = ctx.output_shape().dims
    return [ctx.broadcast_to(x, dims) for x in operands]


# -- pass-through ------------------------------------------------------------------------------
@register("Identity", "StopGradient", "Snapshot", "PreventGradient", dtypes=ALL)
def _lower_identity(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    return [operands[0]]


# -- binary arithmetic ------------------------------------------------------------------------
def _binary(opcode: str) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        a, b = _broadcast_all(ctx, operands)
        return [ctx.emit(opcode, [a, b])]

    lower.__doc__ = f"TF's broadcasting binary op as HLO `{opcode}`."
    return lower


register("AddV2", "Add", dtypes=NUMERIC)(_binary("add"))
register("Sub", dtypes=NUMERIC)(_binary("subtract"))
register("Mul", dtypes=NUMERIC)(_binary("multiply"))
register("RealDiv", dtypes=FLOAT)(_binary("divide"))
# Integer Div truncates toward zero, as HLO's divide; TF raises on a zero divisor there.
register("Div", dtypes=NUMERIC,
         note="an integer zero divisor gives HLO's value instead of TF's error")(_binary("divide"))
register("Maximum", dtypes=NUMERIC)(_binary("maximum"))
register("Minimum", dtypes=NUMERIC)(_binary("minimum"))
# Integers: HLO's power (exponentiation by squaring, wrapping). A negative exponent is an
# error in TF's kernel; XLA, and so compiled code, gives 0 there (1 or -1 for bases ±1).
register("Pow", dtypes=NUMERIC,
         note="an integer negative exponent gives XLA's value instead of TF's error"
         )(_binary("power"))
register("LogicalAnd", dtypes=BOOL)(_binary("and"))
register("LogicalOr", dtypes=BOOL)(_binary("or"))


@register("SquaredDifference", dtypes=NUMERIC)
def _lower_squared_difference(ctx: LoweringContext, op: tf.Operation, operands: Operands
                              ) -> list[Instruction]:
    a, b = _broadcast_all(ctx, operands)
    difference = ctx.emit("subtract", [a, b])
    return [ctx.emit("multiply", [difference, difference])]


@register("AddN", dtypes=NUMERIC, note="of TensorLists too, element by element")
def _lower_add_n(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    if operands[0].shape.is_tuple:  # TensorLists (clustering/rules_control_flow.py)
        from tfxla_lite.clustering.rules_control_flow import add_lists

        return [add_lists(ctx, operands)]
    total = operands[0]
    for x in operands[1:]:
        total = ctx.emit("add", [total, x])
    return [total]


# -- comparisons -------------------------------------------------------------------------------
def _compare(direction: str) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        a, b = _broadcast_all(ctx, operands)
        return [ctx.emit("compare", [a, b], direction=direction)]

    lower.__doc__ = f"TF's broadcasting comparison as HLO `compare` {direction}."
    return lower


for _op_type, _direction in (("Less", "LT"), ("LessEqual", "LE"), ("Greater", "GT"),
                             ("GreaterEqual", "GE"), ("Equal", "EQ"), ("NotEqual", "NE")):
    register(_op_type, dtypes=ALL)(_compare(_direction))


# -- unary -------------------------------------------------------------------------------------
def _unary(opcode: str) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        return [ctx.emit(opcode, [operands[0]])]

    lower.__doc__ = f"TF's unary op as HLO `{opcode}`."
    return lower


register("Neg", dtypes=NUMERIC)(_unary("negate"))
register("Abs", dtypes=NUMERIC)(_unary("abs"))
register("Sign", dtypes=NUMERIC)(_unary("sign"))
register("Exp", dtypes=FLOAT)(_unary("exponential"))
register("Expm1", dtypes=FLOAT)(_unary("exponential-minus-one"))
register("Log", dtypes=FLOAT)(_unary("log"))
register("Log1p", dtypes=FLOAT)(_unary("log-plus-one"))
register("Tanh", dtypes=FLOAT)(_unary("tanh"))
register("Sigmoid", dtypes=FLOAT)(_unary("logistic"))
register("Erf", dtypes=FLOAT)(_unary("erf"))
register("Sqrt", dtypes=FLOAT)(_unary("sqrt"))
register("Rsqrt", dtypes=FLOAT)(_unary("rsqrt"))
register("Floor", dtypes=FLOAT)(_unary("floor"))
register("Ceil", dtypes=FLOAT)(_unary("ceil"))
# TF's Round and Rint both round half to even.
register("Round", "Rint", dtypes=FLOAT)(_unary("round-nearest-even"))
register("Sin", dtypes=FLOAT)(_unary("sine"))
register("Cos", dtypes=FLOAT)(_unary("cosine"))
register("LogicalNot", dtypes=BOOL)(_unary("not"))
register("Tan", dtypes=FLOAT)(_unary("tan"))
register("Atan2", dtypes=FLOAT)(_binary("atan2"))


@register("Atan", dtypes=FLOAT)
def _lower_atan(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # XLA's Atan: atan2(x, 1).
    x = operands[0]
    return [ctx.emit("atan2", [x, ctx.full(1, x.shape)])]


def _zero_where_x_is_zero(opcode: str) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        # x == 0 gives x itself, the sign of zero of TF's vectorized kernel (its scalar
        # path gives +0: the tolerance table lets the sign go).
        x, y = _broadcast_all(ctx, operands)
        value = ctx.emit("multiply", [x, ctx.emit(opcode, [y])]) if opcode != "divide" else \
            ctx.emit("divide", [x, y])
        is_zero = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="EQ")
        return [ctx.emit("select", [is_zero, x, value])]

    lower.__doc__ = f"TF's x == 0 ? 0 : x·{opcode}(y) (whatever y is, NaN included)."
    return lower


register("Xlogy", dtypes=FLOAT)(_zero_where_x_is_zero("log"))
register("Xlog1py", dtypes=FLOAT)(_zero_where_x_is_zero("log-plus-one"))
register("Xdivy", dtypes=FLOAT)(_zero_where_x_is_zero("divide"))


@register("Square", dtypes=NUMERIC)
def _lower_square(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    x = operands[0]
    return [ctx.emit("multiply", [x, x])]


@register("Reciprocal", "Inv", dtypes=FLOAT)
def _lower_reciprocal(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    x = operands[0]
    return [ctx.emit("divide", [ctx.full(1, x.shape), x])]


# -- activations -------------------------------------------------------------------------------
@register("Relu", dtypes=NUMERIC)
def _lower_relu(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # maximum propagates NaN, as TF's Relu does.
    x = operands[0]
    return [ctx.emit("maximum", [x, ctx.full(0, x.shape)])]


@register("Relu6", dtypes=NUMERIC)
def _lower_relu6(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    x = operands[0]
    low = ctx.emit("maximum", [x, ctx.full(0, x.shape)])
    return [ctx.emit("minimum", [low, ctx.full(6, x.shape)])]


@register("LeakyRelu", dtypes=FLOAT)
def _lower_leaky_relu(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    x = operands[0]
    alpha = float(op.get_attr("alpha"))
    positive = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="GT")
    scaled = ctx.emit("multiply", [x, ctx.full(alpha, x.shape)])
    return [ctx.emit("select", [positive, x, scaled])]


@register("Elu", dtypes=FLOAT)
def _lower_elu(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
    x = operands[0]
    positive = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="GT")
    return [ctx.emit("select", [positive, x, ctx.emit("exponential-minus-one", [x])])]


@register("Softsign", dtypes=FLOAT)
def _lower_softsign(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    # TF: x / (|x| + 1).
    x = operands[0]
    return [ctx.emit("divide", [x, ctx.emit("add", [ctx.emit("abs", [x]),
                                                    ctx.full(1, x.shape)])])]


@register("Softplus", dtypes=FLOAT)
def _lower_softplus(ctx: LoweringContext, op: tf.Operation, operands: Operands
                    ) -> list[Instruction]:
    # max(x, 0) + log1p(exp(-|x|)): no overflow for large |x|, exact limits at ±inf.
    x = operands[0]
    positive_part = ctx.emit("maximum", [x, ctx.full(0, x.shape)])
    negative_abs = ctx.emit("negate", [ctx.emit("abs", [x])])
    tail = ctx.emit("log-plus-one", [ctx.emit("exponential", [negative_abs])])
    return [ctx.emit("add", [positive_part, tail])]


# -- casts and selects -------------------------------------------------------------------------
@register("Cast", dtypes=ALL)
def _lower_cast(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    x = operands[0]
    target = element_type(op.outputs[0].dtype)
    if target == x.shape.element_type:
        return [x]
    if target == "pred":  # TF: x != 0 (so NaN casts to true)
        return [ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="NE")]
    return [ctx.convert(x, target)]


@register("SelectV2", dtypes=ALL)
def _lower_select_v2(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    condition, on_true, on_false = _broadcast_all(ctx, operands)
    return [ctx.emit("select", [condition, on_true, on_false])]


@register("Select", dtypes=ALL)
def _lower_select(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    # Select (v1) takes a condition of the branches' shape, a scalar, or a vector that
    # picks whole rows (dim 0).
    condition, on_true, on_false = operands
    dims = ctx.output_shape().dims
    if condition.shape.dims != dims and condition.shape.rank == 1 and len(dims) > 1:
        condition = ctx.emit("broadcast", [condition], shape=condition.shape.with_dims(dims),
                             dimensions=(0,))
    condition = ctx.broadcast_to(condition, dims)
    return [ctx.emit("select", [condition, on_true, on_false])]


# -- integer and floor division ----------------------------------------------------------------
# TF raises on an integer zero divisor; compiled code, as TF's XLA, gives HLO's value there
# (divide: -1, remainder: the dividend) instead of raising.
_ZERO_DIVISOR = "an integer zero divisor gives HLO's value instead of TF's error"

register("TruncateMod", dtypes=NUMERIC, note=_ZERO_DIVISOR)(_binary("remainder"))
register("BitwiseAnd", dtypes=INTEGER)(_binary("and"))
register("BitwiseOr", dtypes=INTEGER)(_binary("or"))
register("BitwiseXor", dtypes=INTEGER)(_binary("xor"))


def _steps_past_zero(ctx: LoweringContext, remainder: Instruction, divisor: Instruction
                     ) -> Instruction:
    """Where truncation and flooring differ: a nonzero remainder whose sign is not the
    divisor's."""
    zero = ctx.full(0, remainder.shape)
    nonzero = ctx.emit("compare", [remainder, zero], direction="NE")
    signs_differ = ctx.emit("compare", [
        ctx.emit("compare", [remainder, zero], direction="LT"),
        ctx.emit("compare", [divisor, zero], direction="LT")], direction="NE")
    return ctx.emit("and", [nonzero, signs_differ])


@register("FloorDiv", dtypes=NUMERIC, note=_ZERO_DIVISOR)
def _lower_floor_div(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # Floats: floor(x / y), as TF. Integers: the truncated quotient, one step toward -inf
    # where the remainder's sign is not the divisor's.
    a, b = _broadcast_all(ctx, operands)
    quotient = ctx.emit("divide", [a, b])
    # FLOAT_TYPES, not a leading "f": bf16 took the integer path (a quotient stepped
    # down by one where the remainder's sign differs, never floored).
    if a.shape.element_type in FLOAT_TYPES:
        return [ctx.emit("floor", [quotient])]
    adjust = _steps_past_zero(ctx, ctx.emit("remainder", [a, b]), b)
    stepped = ctx.emit("subtract", [quotient, ctx.full(1, quotient.shape)])
    return [ctx.emit("select", [adjust, stepped, quotient])]


@register("TruncateDiv", dtypes=NUMERIC, note=_ZERO_DIVISOR)
def _lower_truncate_div(ctx: LoweringContext, op: tf.Operation, operands: Operands
                        ) -> list[Instruction]:
    # Integers: HLO's divide truncates. Floats: the quotient rounded to the type, then
    # toward zero, as TF's kernel: ceil below zero, floor elsewhere, so that -0.0, NaN and
    # the infinities pass through.
    a, b = _broadcast_all(ctx, operands)
    quotient = ctx.emit("divide", [a, b])
    if a.shape.element_type not in FLOAT_TYPES:
        return [quotient]
    negative = ctx.emit("compare", [quotient, ctx.full(0, quotient.shape)], direction="LT")
    return [ctx.emit("select", [negative, ctx.emit("ceil", [quotient]),
                                ctx.emit("floor", [quotient])])]


@register("FloorMod", dtypes=NUMERIC, note=_ZERO_DIVISOR)
def _lower_floor_mod(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # The truncated remainder (fmod for floats), plus the divisor where its sign differs:
    # the result takes the divisor's sign, as Python's %.
    a, b = _broadcast_all(ctx, operands)
    remainder = ctx.emit("remainder", [a, b])
    adjust = _steps_past_zero(ctx, remainder, b)
    return [ctx.emit("select", [adjust, ctx.emit("add", [remainder, b]), remainder])]


@register("DivNoNan", dtypes=FLOAT)
def _lower_div_no_nan(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    a, b = _broadcast_all(ctx, operands)
    zero = ctx.full(0, a.shape)
    divisor_zero = ctx.emit("compare", [b, zero], direction="EQ")
    return [ctx.emit("select", [divisor_zero, zero, ctx.emit("divide", [a, b])])]


# -- float classification ---------------------------------------------------------------------
@register("IsFinite", dtypes=FLOAT | BOOL)
def _lower_is_finite(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    return [ctx.emit("is-finite", [operands[0]])]


@register("IsNan", dtypes=FLOAT | BOOL)
def _lower_is_nan(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    x = operands[0]
    return [ctx.emit("compare", [x, x], direction="NE")]


@register("IsInf", dtypes=FLOAT | BOOL)
def _lower_is_inf(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    x = operands[0]
    magnitude = ctx.emit("abs", [x])
    return [ctx.emit("compare", [magnitude, ctx.full(float("inf"), x.shape)], direction="EQ")]


@register("ClipByValue", dtypes=NUMERIC)
def _lower_clip_by_value(ctx: LoweringContext, op: tf.Operation, operands: Operands
                         ) -> list[Instruction]:
    # std::max(std::min(x, high), low) as TF's CPU kernel: a NaN bound is ignored, a NaN x
    # stays NaN.
    x, low, high = _broadcast_all(ctx, operands)
    below_high = ctx.emit("select", [ctx.emit("compare", [high, x], direction="LT"), high, x])
    return [ctx.emit("select", [ctx.emit("compare", [below_high, low], direction="LT"), low,
                                below_high])]


# -- more activations -------------------------------------------------------------------------
SELU_SCALE = 1.0507009873554804934193349852946
SELU_SCALE_ALPHA = 1.7580993408473768599402175208123  # TF's literal, not a product


@register("Selu", dtypes=FLOAT)
def _lower_selu(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    # TF: x < 0 ? scale * alpha * (exp(x) - 1) : scale * x.
    x = operands[0]
    negative = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="LT")
    below = ctx.emit("multiply", [ctx.full(SELU_SCALE_ALPHA, x.shape),
                                  ctx.emit("exponential-minus-one", [x])])
    above = ctx.emit("multiply", [ctx.full(SELU_SCALE, x.shape), x])
    return [ctx.emit("select", [negative, below, above])]


# -- erfc --------------------------------------------------------------------------------------
# Cephes' erfcf polynomials in y = 1/x² for erfc(x)·|x|·exp(x²), highest degree first, as
# XLA's ErfcImpl32 evaluates them: P below |x| = 2, R above (a leading 0 pads R to P's
# length, so one Horner chain selects each coefficient).
_ERFC_P = (2.326819970068386e-2, -1.387039388740657e-1, 3.687424674597105e-1,
           -5.824733027278666e-1, 6.210004621745983e-1, -4.944515323274145e-1,
           3.404879937665872e-1, -2.741127028184656e-1, 5.638259427386472e-1)
_ERFC_R = (0.0, -1.047766399936249e+1, 1.297719955372516e+1, -7.495518717768503e+0,
           2.921019019210786e+0, -1.015265279202700e+0, 4.218463358204948e-1,
           -2.820767439740514e-1, 5.641895067754075e-1)
# erfc(x) = (1 - x) - x·E(x²) for |x| <= 1 with E(x²) = erf(x)/x - 1 (a least-squares fit
# weighted by 1/erfc): 1 - x is exact near x = 1, where 1 - erf(x) cancels 2 bits.
_ERFC_SMALL = (7.446003291988745e-05, -7.874470902606845e-04, 5.170855671167374e-03,
               -2.684292569756508e-02, 1.1283250898122787e-01, -3.761258125305176e-01,
               1.2837915122509003e-01)
# Above this x², exp(-x²) is below the smallest subnormal float (Cephes' MAXLOGF).
_ERFC_MAX_SQUARE = 88.72283905206835
# Veltkamp's splitter for 24-bit floats: x·4097 - (x·4097 - x) keeps x's top 12 bits, so
# the high part squares exactly.
_SPLITTER = 4097.0


def _horner(ctx: LoweringContext, y: Instruction, coefficients: tuple[float, ...]
            ) -> Instruction:
    result = ctx.full(coefficients[0], y.shape)
    for c in coefficients[1:]:
        result = ctx.emit("add", [ctx.emit("multiply", [result, y]), ctx.full(c, y.shape)])
    return result


def _horner_either(ctx: LoweringContext, y: Instruction, first: Instruction,
                   coefficients: tuple[tuple[float, ...], tuple[float, ...]]) -> Instruction:
    """Horner's scheme on the first polynomial where `first` holds, else the second (of
    equal length): a select per coefficient instead of evaluating both."""
    def coefficient(pair: tuple[float, float]) -> Instruction:
        return ctx.emit("select", [first, ctx.full(pair[0], y.shape),
                                   ctx.full(pair[1], y.shape)])

    pairs = list(zip(*coefficients, strict=True))
    result = coefficient(pairs[0])
    for pair in pairs[1:]:
        result = ctx.emit("add", [ctx.emit("multiply", [result, y]), coefficient(pair)])
    return result


# Cephes' erfc polynomials for float64 in |x| (ndtr.c, as XLA's ErfcImpl64), highest
# degree first: erfc(x) = exp(-x²)·P(|x|)/Q(|x|) below |x| = 8, R/S above.
_ERFC64_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
             4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
             9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_ERFC64_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1,
             3.54937778887819891062e2, 9.75708501743205489753e2, 1.82390916687909736289e3,
             2.24633760818710981792e3, 1.65666309194161350182e3, 5.57535340817727675546e2)
_ERFC64_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
             6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_ERFC64_S = (1.0, 2.26052863220117276590e0, 9.39603524938001434673e0,
             1.20489539808096656605e1, 1.70814450747565897222e1, 9.60896809063285878198e0,
             3.36907645100081516050e0)
_ERFC64_MAX_SQUARE = 7.09782712893383996843e2  # Cephes' MAXLOG for doubles
_SPLITTER64 = 134217729.0  # 2^27 + 1: Veltkamp's splitter for 53-bit doubles


def _exp_minus_square(ctx: LoweringContext, a: Instruction) -> Instruction:
    """float32 exp(-a²) without the error of rounding a² (40 ulp at a = 9): s = a² rounded,
    error e = a² - s exactly (Dekker's product of a's Veltkamp halves), then
    exp(-a²) = exp(-s)·exp(-e) = exp(-s)·(1 - e), as |e| is below half an ulp of s."""
    scaled = ctx.emit("multiply", [a, ctx.full(_SPLITTER, a.shape)])
    high = ctx.emit("subtract", [scaled, ctx.emit("subtract", [scaled, a])])
    low = ctx.emit("subtract", [a, high])
    square = ctx.emit("multiply", [a, a])
    error = ctx.emit("subtract", [ctx.emit("multiply", [high, high]), square])
    error = ctx.emit("add", [error, ctx.emit("multiply", [ctx.emit("add", [high, high]), low])])
    error = ctx.emit("add", [error, ctx.emit("multiply", [low, low])])
    rounded = ctx.emit("exponential", [ctx.emit("negate", [square])])
    return ctx.emit("subtract", [rounded, ctx.emit("multiply", [rounded, error])])


def _exp_minus_square_split(ctx: LoweringContext, a: Instruction) -> Instruction:
    """exp(-a²) for float64 as two exponentials of a's Veltkamp halves: exp(-high²), high²
    exact, times exp(-(2·high + low)·low) (the one-exponential form is 1 ulp worse there)."""
    scaled = ctx.emit("multiply", [a, ctx.full(_SPLITTER64, a.shape)])
    high = ctx.emit("subtract", [scaled, ctx.emit("subtract", [scaled, a])])
    low = ctx.emit("subtract", [a, high])
    high_square = ctx.emit("negate", [ctx.emit("multiply", [high, high])])
    cross = ctx.emit("multiply", [ctx.emit("add", [ctx.emit("add", [high, high]), low]), low])
    return ctx.emit("multiply", [ctx.emit("exponential", [high_square]),
                                 ctx.emit("exponential", [ctx.emit("negate", [cross])])])


def _erfc64(ctx: LoweringContext, x: Instruction) -> Instruction:
    """As XLA's ErfcImpl64 (Cephes' erfc): 1 - erf(x) for |x| < 1, else
    exp(-x²)·P(|x|)/Q(|x|) (R/S from |x| = 8), erfc(-x) = 2 - erfc(x), 0 once x² passes
    MAXLOG; exp(-x²) is taken without rounding x² first."""
    one = ctx.full(1, x.shape)
    near_zero = ctx.emit("subtract", [one, ctx.emit("erf", [x])])
    a = ctx.emit("abs", [x])
    below_eight = ctx.emit("compare", [a, ctx.full(8.0, x.shape)], direction="LT")
    numerator = ctx.emit("select", [below_eight, _horner(ctx, a, _ERFC64_P),
                                    _horner(ctx, a, _ERFC64_R)])
    denominator = ctx.emit("select", [below_eight, _horner(ctx, a, _ERFC64_Q),
                                      _horner(ctx, a, _ERFC64_S)])
    tail = ctx.emit("divide", [ctx.emit("multiply", [_exp_minus_square_split(ctx, a),
                                                     numerator]), denominator])
    underflow = ctx.emit("compare", [ctx.emit("multiply", [a, a]),
                                     ctx.full(_ERFC64_MAX_SQUARE, x.shape)], direction="GT")
    tail = ctx.emit("select", [underflow, ctx.full(0, x.shape), tail])
    negative = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="LT")
    tail = ctx.emit("select", [negative, ctx.emit("subtract", [ctx.full(2.0, x.shape), tail]),
                               tail])
    large = ctx.emit("compare", [a, one], direction="GE")
    return ctx.emit("select", [large, tail, near_zero])


@register("Erfc", dtypes=FLOAT,
          note="float32: Cephes' tails (XLA's ErfcImpl32) with one exp, a polynomial for "
               "x in [-1, 1]; float64: ErfcImpl64; 2-byte floats through float32")
def _lower_erfc(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    x = operands[0]
    etype = x.shape.element_type
    if etype == "f64":
        return [_erfc64(ctx, x)]
    if etype in ("f16", "bf16"):  # XLA upcasts: computed in f32, rounded once
        return [ctx.convert(_erfc32(ctx, ctx.convert(x, "f32")), etype)]
    return [_erfc32(ctx, x)]


def _erfc32(ctx: LoweringContext, x: Instruction) -> Instruction:
    """Cephes' tail as XLA: exp(-x²)/|x|·P(1/x²) for |x| > 1 (R from 2 on), erfc(-x) =
    2 - erfc(x), 0 once exp(-x²) underflows; (1 - x) - x·E(x²) for |x| <= 1."""
    one = ctx.full(1, x.shape)
    near_zero = ctx.emit("subtract", [ctx.emit("subtract", [one, x]), ctx.emit(
        "multiply", [x, _horner(ctx, ctx.emit("multiply", [x, x]), _ERFC_SMALL)])])
    a = ctx.emit("abs", [x])
    q = ctx.emit("divide", [one, a])
    y = ctx.emit("multiply", [q, q])
    below_two = ctx.emit("compare", [a, ctx.full(2.0, x.shape)], direction="LT")
    p = _horner_either(ctx, y, below_two, (_ERFC_P, _ERFC_R))
    tail = ctx.emit("multiply", [ctx.emit("multiply", [_exp_minus_square(ctx, a), q]), p])
    underflow = ctx.emit("compare", [ctx.emit("multiply", [a, a]),
                                     ctx.full(_ERFC_MAX_SQUARE, x.shape)], direction="GT")
    tail = ctx.emit("select", [underflow, ctx.full(0, x.shape), tail])
    negative = ctx.emit("compare", [x, ctx.full(0, x.shape)], direction="LT")
    tail = ctx.emit("select", [negative, ctx.emit("subtract", [ctx.full(2.0, x.shape), tail]),
                               tail])
    large = ctx.emit("compare", [a, one], direction="GT")
    return ctx.emit("select", [large, tail, near_zero])
