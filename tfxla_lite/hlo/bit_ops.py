"""HLO opcodes that work on bits or pass values through: shape rules and NumPy references.

- `bitcast-convert(x)`: the bits of `x` read as another element type. Same width:
  element for element. Different widths follow XLA's rule: to a narrower type the
  result gains a minor dimension of `in_bits / out_bits` (the pieces of one element,
  in memory order, little-endian as on XLA's CPU backend); from a narrower type the
  operand's minor dimension must be `out_bits / in_bits` and goes away. `pred` is
  refused, as in XLA.
- `reduce-precision(x), exponent_bits=e, mantissa_bits=m`: `x` rounded to the floats of
  `e` exponent and `m` mantissa bits, kept in its own type (XLA's
  `EmitReducePrecisionIR`): the mantissa rounds to nearest, ties to even; magnitudes
  above that format's largest overflow to inf, and below its smallest normal (it has no
  subnormals) flush to a zero of the same sign; NaN stays the same NaN when `m > 0`
  and becomes +inf when `m = 0`. Bits the type does not have (e or m at least its own)
  leave `x` as is in that respect.
- `get-dimension-size(x), dimensions={d}`: `x`'s dimension d as an s32 scalar: its
  size at run time where d is dynamic, else a constant.
- `set-dimension-size(x, n), dimensions={d}`: `x` with dimension d dynamic, bounded by
  its size in `x`, and `n` elements valid (XLA's `f32[<=4]`). The evaluator's value is
  the first `n` (an `n` outside [0, size] is refused: XLA leaves it undefined);
  compiled code keeps `x`'s buffer and `n` as a value (`dynamic_padder.py`). A result
  printed static (XLA's builder does so for the static size) is `x`, `n` unread.
- `opt-barrier(x)`: XLA's optimization barrier, which only orders scheduling; the value
  is `x` (an array or a tuple).

Used by `opcodes.py`, `evaluator.py`, cost analysis and `codegen/cpu/bit_ops.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.hlo.shape import FLOAT_TYPES, INTEGER_TYPES, Shape

if TYPE_CHECKING:  # ir imports opcodes, which imports this module
    from tfxla_lite.hlo.ir import Instruction

BITS = {"s8": 8, "u8": 8, "s16": 16, "u16": 16, "f16": 16, "bf16": 16, "s32": 32, "u32": 32,
        "f32": 32, "s64": 64, "u64": 64, "f64": 64}
# (exponent bits, mantissa bits) of the float types.
FLOAT_FORMATS = {"f16": (5, 10), "bf16": (8, 7), "f32": (8, 23), "f64": (11, 52)}


class BitOpShapeError(ValueError):
    """Operands or attributes these opcodes do not take."""


def _one_array(shapes: list[Shape], opcode: str) -> Shape:
    if len(shapes) != 1 or shapes[0].is_tuple:
        raise BitOpShapeError(f"{opcode} takes one array, got {shapes}")
    return shapes[0]


def bitcast_convert_dims(operand: Shape, element_type: str) -> tuple[int, ...]:
    """The result dims of bitcasting `operand` to `element_type` (XLA's rule)."""
    for t in (operand.element_type, element_type):
        if t not in BITS:
            raise BitOpShapeError(f"bitcast-convert takes numeric types of 8 to 64 bits, "
                                  f"got {t}")
    source, target = BITS[operand.element_type], BITS[element_type]
    if source == target:
        return operand.dims
    if source > target:
        return operand.dims + (source // target,)
    if not operand.dims or operand.dims[-1] != target // source:
        raise BitOpShapeError(f"bitcast-convert from {operand} to {element_type} needs a "
                              f"minor dimension of {target // source}")
    return operand.dims[:-1]


def bitcast_convert_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    # As convert, the target type is the instruction's own: builders pass 'element_type'.
    operand = _one_array(shapes, "bitcast-convert")
    if "element_type" not in attributes:
        raise BitOpShapeError("bitcast-convert needs an element_type")
    element_type = attributes["element_type"]
    return Shape(element_type, bitcast_convert_dims(operand, element_type))


def bitcast_convert_reference(x: np.ndarray, shape: Shape) -> np.ndarray:
    contiguous = np.ascontiguousarray(x)
    little = contiguous.astype(contiguous.dtype.newbyteorder("<"), copy=False)
    return little.view(shape.numpy_dtype.newbyteorder("<")).reshape(shape.dims).astype(
        shape.numpy_dtype)


def reduce_precision_bits(attributes: Mapping[str, Any]) -> tuple[int, int]:
    exponent, mantissa = attributes.get("exponent_bits"), attributes.get("mantissa_bits")
    if not isinstance(exponent, int) or not isinstance(mantissa, int) or exponent < 1 \
            or mantissa < 0:
        raise BitOpShapeError(f"reduce-precision needs exponent_bits >= 1 and "
                              f"mantissa_bits >= 0, got {exponent} and {mantissa}")
    return exponent, mantissa


def reduce_precision_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    operand = _one_array(shapes, "reduce-precision")
    if operand.element_type not in FLOAT_TYPES:
        raise BitOpShapeError(f"reduce-precision takes floats, got {operand}")
    reduce_precision_bits(attributes)
    return operand


def reduce_precision_reference(x: np.ndarray, exponent_bits: int, mantissa_bits: int
                               ) -> np.ndarray:
    x = np.asarray(x)
    source_exponent, source_mantissa = FLOAT_FORMATS[_element_type(x.dtype)]
    width = x.dtype.itemsize * 8
    utype = np.dtype(f"u{x.dtype.itemsize}")
    bits = x.view(utype).astype(np.uint64)
    mask = (1 << width) - 1
    if mantissa_bits < source_mantissa:
        shift = source_mantissa - mantissa_bits
        last_bit = 1 << shift
        bias = (bits & last_bit) >> shift
        bits = ((bits + bias + ((last_bit >> 1) - 1)) & mask) & (~np.uint64(last_bit - 1))
    if exponent_bits < source_exponent:
        sign = np.uint64(1 << (width - 1))
        exponent_mask = np.uint64(((1 << source_exponent) - 1) << source_mantissa)
        bias_source = (1 << (source_exponent - 1)) - 1
        bias_reduced = (1 << (exponent_bits - 1)) - 1
        exponent = bits & exponent_mask
        overflows = exponent > np.uint64((bias_source + bias_reduced) << source_mantissa)
        underflows = exponent <= np.uint64((bias_source - bias_reduced) << source_mantissa)
        signed_zero = bits & sign
        bits = np.where(overflows, signed_zero | exponent_mask,
                        np.where(underflows, signed_zero, bits))
    result = np.asarray(bits).astype(utype).view(x.dtype).reshape(x.shape)
    # A NaN's rounding can carry into its exponent, and the exponent step makes it inf.
    result = np.where(np.isnan(x), x if mantissa_bits > 0 else np.array(np.inf, x.dtype),
                      result)
    return np.asarray(result, dtype=x.dtype)


def _element_type(dtype: np.dtype) -> str:
    if dtype == np.float16:
        return "f16"
    if dtype == np.float32:
        return "f32"
    if dtype == np.float64:
        return "f64"
    return "bf16"


def dimension_of(operand: Shape, attributes: Mapping[str, Any], opcode: str) -> int:
    dims = tuple(attributes.get("dimensions", ()))
    if len(dims) != 1 or not 0 <= dims[0] < operand.rank:
        raise BitOpShapeError(f"{opcode} takes one dimension of {operand}, got "
                              f"dimensions={{{', '.join(map(str, dims))}}}")
    return int(dims[0])


def get_dimension_size_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    operand = _one_array(shapes, "get-dimension-size")
    dimension = dimension_of(operand, attributes, "get-dimension-size")
    if operand.dims[dimension] >= 2**31:
        raise BitOpShapeError(f"get-dimension-size of {operand}: dimension {dimension} does "
                              "not fit an s32")
    return Shape("s32", ())


def set_dimension_size_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    if len(shapes) != 2 or shapes[0].is_tuple or shapes[1].is_tuple or shapes[1].dims \
            or shapes[1].element_type not in INTEGER_TYPES:
        raise BitOpShapeError(f"set-dimension-size takes an array and an integer scalar, "
                              f"got {shapes}")
    return shapes[0].with_dynamic(dimension_of(shapes[0], attributes, "set-dimension-size"))


def optimization_barrier_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    if len(shapes) != 1:
        raise BitOpShapeError(f"opt-barrier takes one operand, got {len(shapes)}")
    return shapes[0]


def _bitcast_convert(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return bitcast_convert_reference(operands[0], inst.shape)


def _reduce_precision(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return reduce_precision_reference(operands[0], *reduce_precision_bits(inst.attributes))


def _get_dimension_size(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    dimension = dimension_of(inst.operand(0).shape, inst.attributes, "get-dimension-size")
    return np.array(np.shape(operands[0])[dimension], dtype=np.int32)  # a dynamic size


def _set_dimension_size(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, size = np.asarray(operands[0]), int(operands[1])
    dimension = dimension_of(inst.operand(0).shape, inst.attributes, "set-dimension-size")
    if not inst.shape.is_dynamic_dimension(dimension):
        return x  # a static result (XLA's builder, for the static size): the size unread
    if not 0 <= size <= x.shape[dimension]:
        raise ValueError(f"set-dimension-size %{inst.name}: size {size} outside "
                         f"[0, {x.shape[dimension]}] of dimension {dimension}")
    return x[(slice(None),) * dimension + (slice(0, size),)]


def _first_operand(inst: Instruction, operands: Sequence[Any]) -> Any:
    return operands[0]


# The evaluator's references of these opcodes (`evaluator.REFERENCES`).
REFERENCES = {"bitcast-convert": _bitcast_convert, "reduce-precision": _reduce_precision,
              "get-dimension-size": _get_dimension_size,
              "set-dimension-size": _set_dimension_size, "opt-barrier": _first_operand}
