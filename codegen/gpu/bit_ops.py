"""GPU element generators of `bitcast-convert`, `reduce-precision` and the pass-through ops.

The semantics are `tfxla_lite/hlo/bit_ops.py`'s, written as the CPU backend's
`codegen/cpu/bit_ops.py` writes them: values sit in their compute type (f16/bf16 as the
float of the same value, exact), so both bit operations take the storage bits of the
element's type first (`_bits_of`, an unsigned integer of its width) and give back a
compute-type value (`_value_of`). `get-dimension-size` is a constant: the dynamic
padder (`tfxla_lite/hlo/dynamic_padder.py`) has replaced every dynamic one before
codegen; `set-dimension-size` (static by then) and an array `opt-barrier` read their
first operand at the same index.
"""

from __future__ import annotations

from tfxla_lite.codegen.gpu.cuda_source import literal, storage_type
from tfxla_lite.codegen.gpu.elemental import Index, KernelContext, register
from tfxla_lite.hlo.bit_ops import BITS, FLOAT_FORMATS, reduce_precision_bits
from tfxla_lite.hlo.ir import Instruction

_UNSIGNED = {8: "unsigned char", 16: "unsigned short", 32: "unsigned int",
             64: "unsigned long long"}


def _bits_of(x: str, element_type: str) -> str:
    """The storage bits of compute-type value `x`, as the unsigned type of its width."""
    if element_type == "f16":  # exact: the float holds an f16 value
        return f"__half_as_ushort(__float2half_rn({x}))"
    if element_type == "bf16":
        return f"__bfloat16_as_ushort(__float2bfloat16_rn({x}))"
    if element_type == "f32":
        return f"__float_as_uint({x})"
    if element_type == "f64":
        return f"((unsigned long long)__double_as_longlong({x}))"
    return f"(({_UNSIGNED[BITS[element_type]]})({x}))"


def _value_of(bits: str, element_type: str) -> str:
    """The compute-type value of storage bits `bits` (an unsigned integer)."""
    if element_type == "f16":
        return f"__half2float(__ushort_as_half((unsigned short)({bits})))"
    if element_type == "bf16":
        return f"__bfloat162float(__ushort_as_bfloat16((unsigned short)({bits})))"
    if element_type == "f32":
        return f"__uint_as_float((unsigned int)({bits}))"
    if element_type == "f64":
        return f"__longlong_as_double((long long)({bits}))"
    return f"(({storage_type(element_type)})({bits}))"


@register("bitcast-convert")
def emit_bitcast_convert(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    operand = inst.operand(0)
    source, target = operand.shape.element_type, inst.shape.element_type
    source_bits, target_bits = BITS[source], BITS[target]
    if source_bits == target_bits:
        return _value_of(_bits_of(ctx.value(operand, index), source), target)
    multi = index.get_multi(ctx)
    if source_bits > target_bits:
        # Piece k of the wider element, little-endian: its bits k*w .. (k+1)*w - 1.
        wide = ctx.bind(_bits_of(ctx.value(operand, Index(operand.shape.dims, multi[:-1])),
                                 source), _UNSIGNED[source_bits], "wide")
        piece = f"(({_UNSIGNED[target_bits]})({wide} >> ({multi[-1]} * {target_bits})))"
        return _value_of(piece, target)
    wide_type = _UNSIGNED[target_bits]
    pieces = []
    for k in range(target_bits // source_bits):
        part = ctx.value(operand, Index(operand.shape.dims, [*multi, str(k)]))
        pieces.append(f"((({wide_type}){_bits_of(part, source)}) << {k * source_bits})")
    return _value_of(f"({' | '.join(pieces)})", target)


@register("reduce-precision")
def emit_reduce_precision(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    """XLA's EmitReducePrecisionIR on the storage bits (quiet_nans off)."""
    element_type = inst.shape.element_type
    x = ctx.value(inst.operand(0), index)
    exponent_bits, mantissa_bits = reduce_precision_bits(inst.attributes)
    source_exponent, source_mantissa = FLOAT_FORMATS[element_type]
    width = BITS[element_type]
    unsigned = _UNSIGNED[width]

    def const(value: int) -> str:
        return f"(({unsigned}){value & ((1 << width) - 1)}ULL)"

    bits = ctx.bind(_bits_of(x, element_type), unsigned, "bits")
    if mantissa_bits < source_mantissa:
        shift = source_mantissa - mantissa_bits
        last_bit = 1 << shift
        bias = f"((({bits} & {const(last_bit)}) >> {shift}) + {const((last_bit >> 1) - 1)})"
        bits = ctx.bind(f"(({unsigned})(({unsigned})({bits} + {bias}) & "
                        f"{const(~(last_bit - 1))}))", unsigned, "bits")
    if exponent_bits < source_exponent:
        exponent_mask = ((1 << source_exponent) - 1) << source_mantissa
        bias_source = (1 << (source_exponent - 1)) - 1
        bias_reduced = (1 << (exponent_bits - 1)) - 1
        exponent = f"({bits} & {const(exponent_mask)})"
        signed_zero = ctx.bind(f"(({unsigned})({bits} & {const(1 << (width - 1))}))", unsigned,
                               "sign")
        overflows = f"({exponent} > {const((bias_source + bias_reduced) << source_mantissa)})"
        underflows = f"({exponent} <= {const((bias_source - bias_reduced) << source_mantissa)})"
        bits = ctx.bind(f"({underflows} ? {signed_zero} : {overflows} ? "
                        f"(({unsigned})({signed_zero} | {const(exponent_mask)})) : {bits})",
                        unsigned, "bits")
    kept = x if mantissa_bits > 0 else literal(element_type, float("inf"))
    return f"(({x}) != ({x}) ? {kept} : {_value_of(bits, element_type)})"


@register("get-dimension-size")
def emit_get_dimension_size(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    (dimension,) = inst.dimensions
    if inst.operand(0).shape.is_dynamic_dimension(dimension):
        raise NotImplementedError(f"GPU backend: %{inst.name} reads a dynamic size; "
                                  "tfxla_lite.hlo.dynamic_padder.pad_dynamic replaces it")
    return literal("s32", inst.operand(0).shape.dims[dimension])


@register("set-dimension-size", "opt-barrier")
def emit_first_operand(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    if inst.shape.is_tuple or inst.shape.is_dynamic:
        raise NotImplementedError(f"GPU backend: a tuple-shaped or dynamic {inst.opcode} "
                                  f"(%{inst.name}); the simplify pass and the dynamic padder "
                                  "replace it by its operand")
    return ctx.value(inst.operand(0), index)
