"""Half-precision division by a constant as one multiplication, where proven exact.

An f16 `x / c` computes in f32 and rounds once to f16, the correctly rounded quotient.
`reciprocal` looks for an f32 `r` for which round_f16(round_f32(x · r)) has the same bits
for every one of the 65,536 f16 values x, checked exhaustively in NumPy (memoized, about
a millisecond per constant), and `elementwise.emit_binary` then multiplies instead of
dividing. f32, f64 and bf16 keep their division: docs/accuracy.md, "Division by a
constant".
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir

from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.passes.simplify import splat_value

# Element types whose division by a constant may become a multiplication.
_TYPES = {"f16": np.float16}


@functools.cache
def _values(element_type: str) -> np.ndarray:
    """Every value of `element_type` (all bit patterns), widened exactly to f32."""
    dtype = np.dtype(_TYPES[element_type])
    bits = np.arange(1 << (8 * dtype.itemsize), dtype=np.uint64).astype(f"u{dtype.itemsize}")
    values = bits.view(dtype).astype(np.float32)
    values.setflags(write=False)  # shared by every check
    return values


def _rounded_bits(values: np.ndarray, element_type: str) -> np.ndarray:
    """The bits of f32 `values` rounded to `element_type`, every NaN as one pattern."""
    dtype = np.dtype(_TYPES[element_type])
    bits = values.astype(dtype).view(f"u{dtype.itemsize}").copy()
    bits[np.isnan(values)] = 0x7E00
    return bits


def mismatches(element_type: str, divisor: float, reciprocal: float) -> np.ndarray:
    """The inputs x of `element_type` for which multiplying by the f32 `reciprocal` does
    not give the bits of `x / divisor` (both computed in f32, rounded to the type)."""
    x = _values(element_type)
    c = np.float32(np.asarray(divisor, dtype=_TYPES[element_type]))
    with np.errstate(all="ignore"):
        quotient = _rounded_bits(x / c, element_type)
        product = _rounded_bits(x * np.float32(reciprocal), element_type)
    return x[quotient != product]


@functools.cache
def _reciprocal(element_type: str, divisor_bits: int) -> float | None:
    dtype = np.dtype(_TYPES[element_type])
    divisor = np.asarray(divisor_bits, dtype=f"u{dtype.itemsize}").view(dtype)
    c = np.float32(divisor)
    if not np.isfinite(c) or c == 0:
        return None
    nearest = np.float32(1) / c
    if not np.isfinite(nearest):
        return None
    # Not only the nearest f32: a neighbour may be right where the nearest is not.
    for candidate in (nearest, np.nextafter(nearest, np.float32(np.inf)),
                      np.nextafter(nearest, np.float32(-np.inf))):
        if np.isfinite(candidate) and candidate != 0 and \
                mismatches(element_type, float(divisor), float(candidate)).size == 0:
            return float(candidate)
    return None


def reciprocal(element_type: str, divisor: float) -> float | None:
    """An f32 r with round(x · r) == round(x / divisor) for every x of `element_type`
    (rounded to that type, as its arithmetic does), proven by trying them all; None
    when no r near 1/divisor is, or when the type is not one this is done for."""
    if element_type not in _TYPES:
        return None
    dtype = np.dtype(_TYPES[element_type])
    bits = int(np.asarray(divisor, dtype=dtype).view(f"u{dtype.itemsize}"))
    return _reciprocal(element_type, bits)


def divisor_reciprocal(inst: Instruction) -> float | None:
    """For a `divide` whose divisor is a constant (or a broadcast of one) with a proven
    reciprocal: that reciprocal; else None."""
    element_type = inst.shape.element_type
    if inst.opcode != "divide" or element_type not in _TYPES:
        return None
    divisor = splat_value(inst.operand(1))
    if divisor is None:
        return None
    return reciprocal(element_type, float(divisor))


def multiply(builder: ir.IRBuilder, x: ir.Value, factor: float) -> ir.Value:
    """round(x · factor) in x's type, the product taken in f32."""
    product = builder.fmul(builder.fpext(x, ir.FloatType()), ir.Constant(ir.FloatType(), factor))
    return builder.fptrunc(product, x.type)
