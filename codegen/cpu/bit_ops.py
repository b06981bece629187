"""CPU element generators of `bitcast-convert`, `reduce-precision` and the pass-through ops.

The semantics are `tfxla_lite/hlo/bit_ops.py`'s. Values sit in registers as
`emitter.value_type` has them (bf16 as the f32 of the same value), so both bit
operations first take the bits of the element's storage type (`_bits_of`) and give
back a register value (`_value_of`). `get-dimension-size` is a constant: the dynamic
padder (`tfxla_lite/hlo/dynamic_padder.py`) has replaced every dynamic one before
codegen; `set-dimension-size` (static by then) and an array `opt-barrier` read their
first operand at the same index.
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import I32, Index, KernelContext, bf16_value, register
from tfxla_lite.hlo.bit_ops import BITS, FLOAT_FORMATS, reduce_precision_bits
from tfxla_lite.hlo.ir import Instruction

_FLOAT_IR = {"f16": ir.HalfType(), "f32": ir.FloatType(), "f64": ir.DoubleType()}


def _bits_of(b: ir.IRBuilder, x: ir.Value, element_type: str) -> ir.Value:
    """The storage bits (an iN) of register value `x` of `element_type`."""
    if element_type == "bf16":  # an f32 holding a bf16 value: its high half
        return b.trunc(b.lshr(b.bitcast(x, I32), ir.Constant(I32, 16)), ir.IntType(16))
    if element_type in _FLOAT_IR:
        return b.bitcast(x, ir.IntType(BITS[element_type]))
    return x


def _value_of(b: ir.IRBuilder, bits: ir.Value, element_type: str) -> ir.Value:
    if element_type == "bf16":
        return bf16_value(b, bits)
    if element_type in _FLOAT_IR:
        return b.bitcast(bits, _FLOAT_IR[element_type])
    return bits


@register("bitcast-convert")
def emit_bitcast_convert(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    b = ctx.builder
    operand = inst.operand(0)
    source, target = operand.shape.element_type, inst.shape.element_type
    source_bits, target_bits = BITS[source], BITS[target]
    if source_bits == target_bits:
        return _value_of(b, _bits_of(b, ctx.value(operand, index), source), target)
    multi = index.get_multi(b)
    if source_bits > target_bits:
        # Piece k of the wider element, little-endian: its bits k*w .. (k+1)*w - 1.
        wide = _bits_of(b, ctx.value(operand, Index(operand.shape.dims, multi[:-1])), source)
        shift = b.mul(b.trunc(multi[-1], wide.type) if source_bits < 64 else multi[-1],
                      ir.Constant(wide.type, target_bits))
        piece = b.trunc(b.lshr(wide, shift), ir.IntType(target_bits))
        return _value_of(b, piece, target)
    wide_type = ir.IntType(target_bits)
    bits: ir.Value = ir.Constant(wide_type, 0)
    for k in range(target_bits // source_bits):
        part = ctx.value(operand, Index(operand.shape.dims, [*multi, ir.Constant(ir.IntType(64),
                                                                               k)]))
        piece = b.zext(_bits_of(b, part, source), wide_type)
        bits = b.or_(bits, b.shl(piece, ir.Constant(wide_type, k * source_bits)))
    return _value_of(b, bits, target)


@register("reduce-precision")
def emit_reduce_precision(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    """XLA's EmitReducePrecisionIR on the storage bits (quiet_nans off)."""
    b = ctx.builder
    element_type = inst.shape.element_type
    x = ctx.value(inst.operand(0), index)
    exponent_bits, mantissa_bits = reduce_precision_bits(inst.attributes)
    source_exponent, source_mantissa = FLOAT_FORMATS[element_type]
    width = BITS[element_type]
    typ = ir.IntType(width)

    def const(value: int) -> ir.Constant:
        return ir.Constant(typ, value & ((1 << width) - 1))

    bits = _bits_of(b, x, element_type)
    if mantissa_bits < source_mantissa:
        shift = source_mantissa - mantissa_bits
        last_bit = 1 << shift
        bias = b.add(b.lshr(b.and_(bits, const(last_bit)), const(shift)),
                     const((last_bit >> 1) - 1))
        bits = b.and_(b.add(bits, bias), const(~(last_bit - 1)))
    if exponent_bits < source_exponent:
        sign = const(1 << (width - 1))
        exponent_mask = ((1 << source_exponent) - 1) << source_mantissa
        bias_source = (1 << (source_exponent - 1)) - 1
        bias_reduced = (1 << (exponent_bits - 1)) - 1
        exponent = b.and_(bits, const(exponent_mask))
        overflows = b.icmp_unsigned(">", exponent,
                                    const((bias_source + bias_reduced) << source_mantissa))
        underflows = b.icmp_unsigned("<=", exponent,
                                     const((bias_source - bias_reduced) << source_mantissa))
        signed_zero = b.and_(bits, sign)
        bits = b.select(overflows, b.or_(signed_zero, const(exponent_mask)), bits)
        bits = b.select(underflows, signed_zero, bits)
    result = _value_of(b, bits, element_type)
    is_nan = b.fcmp_unordered("uno", x, x)
    kept = x if mantissa_bits > 0 else ir.Constant(x.type, float("inf"))
    return b.select(is_nan, kept, result)


@register("get-dimension-size")
def emit_get_dimension_size(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    (dimension,) = inst.attributes["dimensions"]
    if inst.operand(0).shape.is_dynamic_dimension(dimension):  # the bound is no answer
        raise NotImplementedError(f"CPU backend: %{inst.name} reads a dynamic size; "
                                  "tfxla_lite.hlo.dynamic_padder.pad_dynamic replaces it")
    return ir.Constant(I32, inst.operand(0).shape.dims[dimension])


@register("set-dimension-size", "opt-barrier")
def emit_first_operand(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    if inst.shape.is_tuple or inst.shape.is_dynamic:
        raise NotImplementedError(f"CPU backend: a tuple-shaped or dynamic {inst.opcode} "
                                  f"(%{inst.name}); the simplify pass and the dynamic padder "
                                  "replace it by its operand")
    return ctx.value(inst.operand(0), index)
