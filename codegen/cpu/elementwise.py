"""CPU element generators of the elementwise HLO opcodes.

Semantics follow XLA's CPU backend and `tfxla_lite.hlo.evaluator`: floats compute in
their own type with no fast-math flags (no `contract` either, so no FMA fusion);
`maximum`/`minimum` propagate NaN (`llvm.maximum`); comparisons are ordered except
NE; integer division never traps (x/0 = -1, x%0 = x, INT_MIN/-1 = INT_MIN); shifts
by out-of-range amounts give 0 or the sign fill; float to integer conversion
truncates and saturates, NaN giving 0 (`llvm.fpto*i.sat`). The f32 and f16
transcendentals exp, expm1, log, log1p, tanh, logistic and erf are emitted inline
by `math.py` (vectorizable); other transcendentals, and all of f64, use an LLVM
intrinsic where there is one and libm (`tanh`, `erf`, ...) otherwise. An f16 division
by a constant multiplies by an f32 reciprocal where `constant_division.py` proved the
result bit for bit the same for every f16 input.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tfxla_lite.codegen.cpu import constant_division, engine, math
from tfxla_lite.codegen.cpu.emitter import (
    I1,
    Index,
    KernelContext,
    int_bits,
    is_float,
    is_signed,
    register,
    value_type,
)
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.opcodes import is_identity_on_integers, opcodes_in

# Unary float ops that map to one `llvm.<name>` intrinsic.
_FLOAT_INTRINSICS = {
    "exponential": "exp", "log": "log", "sqrt": "sqrt", "floor": "floor", "ceil": "ceil",
    "round-nearest-afz": "round", "round-nearest-even": "roundeven", "sine": "sin",
    "cosine": "cos",
}
# Unary float ops computed by a libm function (the float version gets an `f` suffix).
_FLOAT_LIBM = {"exponential-minus-one": "expm1", "log-plus-one": "log1p", "tanh": "tanh",
               "cbrt": "cbrt", "erf": "erf", "tan": "tan"}


def _type_of(inst: Instruction) -> str:
    return inst.operand(0).shape.element_type


def _unsupported(inst: Instruction, element_type: str) -> NotImplementedError:
    return NotImplementedError(f"CPU backend: {inst.opcode} of {element_type} (%{inst.name})")


# -- unary ---------------------------------------------------------------------------------

@register(*opcodes_in("unary"))
def emit_unary(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    x = ctx.value(inst.operand(0), index)
    element_type = _type_of(inst)
    if inst.opcode == "copy":
        return x
    if is_float(element_type):
        return _float_unary(ctx, inst, x)
    return _integer_unary(ctx, inst, x, element_type)


def _float_unary(ctx: KernelContext, inst: Instruction, x: ir.Value) -> ir.Value:
    b = ctx.builder
    opcode = inst.opcode
    one = ir.Constant(x.type, 1.0)
    if (inline := math.float_function(ctx, opcode, x)) is not None:
        return inline
    if opcode in _FLOAT_INTRINSICS:
        return ctx.call_intrinsic(_FLOAT_INTRINSICS[opcode], [x])
    if opcode in _FLOAT_LIBM:
        return ctx.call_libm(_FLOAT_LIBM[opcode], [x])
    if opcode == "abs":
        return ctx.call_intrinsic("fabs", [x])
    if opcode == "negate":
        return b.fneg(x)
    if opcode == "logistic":
        return b.fdiv(one, b.fadd(one, ctx.call_intrinsic("exp", [b.fneg(x)])))
    if opcode == "rsqrt":
        return b.fdiv(one, ctx.call_intrinsic("sqrt", [x]))
    if opcode == "sign":
        # XLA: copysign(x != 0, x), NaN stays NaN; so sign(-0.0) is -0.0.
        nonzero = b.uitofp(b.fcmp_ordered("!=", x, ir.Constant(x.type, 0.0)), x.type)
        signed = ctx.call_intrinsic("copysign", [nonzero, x])
        return b.select(b.fcmp_unordered("uno", x, x), x, signed)
    if opcode == "is-finite":
        return b.fcmp_ordered("!=", ctx.call_intrinsic("fabs", [x]),
                              ir.Constant(x.type, float("inf")))
    raise _unsupported(inst, _type_of(inst))


def _integer_unary(ctx: KernelContext, inst: Instruction, x: ir.Value,
                   element_type: str) -> ir.Value:
    b = ctx.builder
    opcode = inst.opcode
    zero = ir.Constant(x.type, 0)
    if opcode == "not":
        return b.not_(x)
    if opcode == "is-finite":
        raise _unsupported(inst, element_type)
    if element_type == "pred":
        raise _unsupported(inst, element_type)
    if is_identity_on_integers(opcode):
        return x
    if opcode == "negate":
        return b.sub(zero, x)
    if opcode == "abs":
        if not is_signed(element_type):
            return x
        return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)
    if opcode == "sign":
        positive = b.zext(b.icmp_signed(">", x, zero) if is_signed(element_type)
                          else b.icmp_unsigned("!=", x, zero), x.type)
        if not is_signed(element_type):
            return positive
        return b.sub(positive, b.zext(b.icmp_signed("<", x, zero), x.type))
    raise _unsupported(inst, element_type)


# -- binary --------------------------------------------------------------------------------

@register(*opcodes_in("binary"))
def emit_binary(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    x = ctx.value(inst.operand(0), index)
    if (reciprocal := constant_division.divisor_reciprocal(inst)) is not None:
        return constant_division.multiply(ctx.builder, x, reciprocal)  # proven exact
    y = ctx.value(inst.operand(1), index)
    return binary_op(ctx, inst.opcode, _type_of(inst), x, y, inst)


def binary_op(ctx: KernelContext, opcode: str, element_type: str, x: ir.Value, y: ir.Value,
              inst: Instruction | None = None) -> ir.Value:
    """`opcode(x, y)` on two scalars of `element_type` (shared with the dot emitter)."""
    b = ctx.builder
    if is_float(element_type):
        simple: dict[str, Callable[[ir.Value, ir.Value], ir.Value]] = {
            "add": b.fadd, "subtract": b.fsub, "multiply": b.fmul, "divide": b.fdiv,
            "remainder": b.frem}
        if opcode in simple:
            return simple[opcode](x, y)
        if opcode in ("maximum", "minimum", "power"):
            return ctx.call_intrinsic({"power": "pow"}.get(opcode, opcode), [x, y])
        if opcode == "atan2":
            return ctx.call_libm("atan2", [x, y])
    else:
        logical = {"and": b.and_, "or": b.or_, "xor": b.xor}
        if opcode in logical:
            return logical[opcode](x, y)
        if element_type != "pred":
            signed = is_signed(element_type)
            wrapping = {"add": b.add, "subtract": b.sub, "multiply": b.mul}
            if opcode in wrapping:
                return wrapping[opcode](x, y)
            if opcode in ("maximum", "minimum"):
                prefix = "s" if signed else "u"
                return ctx.call_intrinsic(prefix + opcode[:3], [x, y])
            if opcode in ("divide", "remainder"):
                return _integer_division(ctx, opcode, signed, x, y)
            if opcode.startswith("shift"):
                return _shift(ctx, opcode, int_bits(element_type), x, y)
            if opcode == "power":
                return _integer_power(ctx, signed, int_bits(element_type), x, y)
        elif opcode in ("maximum", "minimum"):
            return b.or_(x, y) if opcode == "maximum" else b.and_(x, y)
    raise NotImplementedError(f"CPU backend: {opcode} of {element_type}"
                              + (f" (%{inst.name})" if inst is not None else ""))


def _integer_division(ctx: KernelContext, opcode: str, signed: bool, x: ir.Value,
                      y: ir.Value) -> ir.Value:
    b = ctx.builder
    typ = x.type
    zero, one, minus_one = ir.Constant(typ, 0), ir.Constant(typ, 1), ir.Constant(typ, -1)
    by_zero = b.icmp_unsigned("==", y, zero)
    if signed:
        int_min = ir.Constant(typ, 1 << (typ.width - 1))
        overflow = b.and_(b.icmp_unsigned("==", x, int_min), b.icmp_unsigned("==", y, minus_one))
        safe = b.select(b.or_(by_zero, overflow), one, y)
        if opcode == "divide":
            return b.select(by_zero, minus_one, b.select(overflow, int_min, b.sdiv(x, safe)))
        return b.select(by_zero, x, b.select(overflow, zero, b.srem(x, safe)))
    safe = b.select(by_zero, one, y)
    if opcode == "divide":
        return b.select(by_zero, minus_one, b.udiv(x, safe))
    return b.select(by_zero, x, b.urem(x, safe))


def _shift(ctx: KernelContext, opcode: str, bits: int, x: ir.Value, y: ir.Value) -> ir.Value:
    b = ctx.builder
    typ = x.type
    # Negative amounts are huge unsigned ones: out of range too.
    in_range = b.icmp_unsigned("<", y, ir.Constant(typ, bits))
    amount = b.select(in_range, y, ir.Constant(typ, 0))
    if opcode == "shift-left":
        return b.select(in_range, b.shl(x, amount), ir.Constant(typ, 0))
    if opcode == "shift-right-logical":
        return b.select(in_range, b.lshr(x, amount), ir.Constant(typ, 0))
    fill = b.ashr(x, ir.Constant(typ, bits - 1))
    return b.select(in_range, b.ashr(x, amount), fill)


def _integer_power(ctx: KernelContext, signed: bool, bits: int, x: ir.Value,
                   y: ir.Value) -> ir.Value:
    """Exponentiation by squaring, unrolled over the exponent's bits (branch-free)."""
    b = ctx.builder
    typ = x.type
    zero, one = ir.Constant(typ, 0), ir.Constant(typ, 1)
    result: ir.Value = one
    base, exponent = x, y
    for step in range(bits):
        odd = b.trunc(exponent, I1)
        result = b.select(odd, b.mul(result, base), result)
        if step + 1 < bits:
            base = b.mul(base, base)
            exponent = b.lshr(exponent, one)
    if not signed:
        return result
    # A negative exponent gives 0, except for bases 1 and -1.
    minus_one = ir.Constant(typ, -1)
    odd = b.trunc(y, I1)
    special = b.select(b.icmp_signed("==", x, one), one,
                       b.select(b.icmp_signed("==", x, minus_one),
                                b.select(odd, minus_one, one), zero))
    return b.select(b.icmp_signed("<", y, zero), special, result)


# -- compare, select, clamp, convert -------------------------------------------------------

_ORDERED = {"EQ": "==", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
_INTEGER_DIRECTIONS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


@register("compare")
def emit_compare(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    x = ctx.value(inst.operand(0), index)
    y = ctx.value(inst.operand(1), index)
    direction = inst.attributes["direction"]
    element_type = _type_of(inst)
    b = ctx.builder
    if is_float(element_type) and inst.attributes.get("type") == "TOTALORDER":
        x, y = _total_order_key(b, x), _total_order_key(b, y)
        return b.icmp_signed(_INTEGER_DIRECTIONS[direction], x, y)
    if is_float(element_type):
        if direction == "NE":  # true for NaN, as XLA and IEEE's !=
            return b.fcmp_unordered("!=", x, y)
        return b.fcmp_ordered(_ORDERED[direction], x, y)
    op = _INTEGER_DIRECTIONS[direction]
    if is_signed(element_type):
        return b.icmp_signed(op, x, y)
    return b.icmp_unsigned(op, x, y)


def _total_order_key(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """A signed integer ordered as XLA's TOTALORDER orders the float `x` (-NaN < -inf <
    ... < -0.0 < +0.0 < ... < +NaN): its bits, negatives with all but the sign flipped."""
    width = {"half": 16, "float": 32, "double": 64}[str(x.type)]
    integer = ir.IntType(width)
    bits = b.bitcast(x, integer)
    flipped = b.xor(bits, ir.Constant(integer, (1 << (width - 1)) - 1))
    return b.select(b.icmp_signed("<", bits, ir.Constant(integer, 0)), flipped, bits)


@register("select")
def emit_select(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    predicate = ctx.value(inst.operand(0), index)
    on_true = ctx.value(inst.operand(1), index)
    on_false = ctx.value(inst.operand(2), index)
    return ctx.builder.select(predicate, on_true, on_false)


@register("clamp")
def emit_clamp(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    low_inst, x_inst, high_inst = inst.operands
    x = ctx.value(x_inst, index)
    low = ctx.value(low_inst, index if low_inst.shape.dims else Index.scalar())
    high = ctx.value(high_inst, index if high_inst.shape.dims else Index.scalar())
    element_type = x_inst.shape.element_type
    # XLA: min(max(x, low), high), with NaN-propagating max and min.
    return binary_op(ctx, "minimum", element_type, binary_op(ctx, "maximum", element_type,
                                                             x, low, inst), high, inst)


@register("convert")
def emit_convert(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    x = ctx.value(inst.operand(0), index)
    return convert(ctx, x, _type_of(inst), inst.shape.element_type)


def convert(ctx: KernelContext, x: ir.Value, source: str, target: str) -> ir.Value:
    b = ctx.builder
    # bf16 values are f32s in registers; `KernelContext.value` rounds a bf16 result (an
    # f64 source thus rounds twice, through f32).
    source = "f32" if source == "bf16" else source
    target = "f32" if target == "bf16" else target
    typ = value_type(target)
    if source == target:
        return x
    if target == "pred":
        if is_float(source):
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0))  # NaN is true
        return b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
    if is_float(source):
        if is_float(target):
            if _float_width(target) > _float_width(source):
                return b.fpext(x, typ)
            if target == "f16" and source == "f64" and not engine.half_runtime():
                # No __truncdfhf2 to call: round through f32 (may double-round, rarely).
                x = b.fptrunc(x, ir.FloatType())
            return b.fptrunc(x, typ)
        name = "fptosi.sat" if is_signed(target) else "fptoui.sat"
        return ctx.call_intrinsic(name, [x], types=[typ, x.type])
    # integer or pred source
    source_signed = is_signed(source)
    if is_float(target):
        return b.sitofp(x, typ) if source_signed else b.uitofp(x, typ)
    source_bits = 1 if source == "pred" else int_bits(source)
    if int_bits(target) > source_bits:
        return b.sext(x, typ) if source_signed else b.zext(x, typ)
    if int_bits(target) < source_bits:
        return b.trunc(x, typ)
    return x


def _float_width(element_type: str) -> int:
    return {"f16": 16, "f32": 32, "f64": 64}[element_type]
