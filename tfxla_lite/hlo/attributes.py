"""Structured attribute values of HLO instructions: padding configs, windows and
scatter dimension numbers.

`pad` carries a `PaddingConfig` (XLA text `padding=1_0x0_2_1`), `reduce-window` and
`convolution` a `Window` (`window={size=1x6 stride=1x2 pad=0_0x5_0 lhs_dilate=1x2
rhs_dilate=1x1 rhs_reversal=0x1}`; reversal means something to convolutions only).
Both are frozen dataclasses whose `str()` is XLA's spelling, so the printer writes
them as any other attribute and `parse_padding` / `parse_window` read them back
(`parser.py`). A scatter's dimension numbers stay plain attributes in the IR;
`ScatterDimensions` resolves them against its shapes for the evaluator and the
backends. Meanings follow `xla/xla_data.proto` (PaddingConfig, Window,
ScatterDimensionNumbers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PaddingDimension:
    low: int  # may be negative: removes elements at the start
    high: int  # may be negative: removes elements at the end
    interior: int = 0  # >= 0: pad elements inserted between neighbours


@dataclass(frozen=True)
class PaddingConfig:
    dimensions: tuple[PaddingDimension, ...]

    @staticmethod
    def of(*dims: tuple[int, ...]) -> PaddingConfig:
        """From (low, high) or (low, high, interior) per dimension."""
        return PaddingConfig(tuple(PaddingDimension(*d) for d in dims))

    def __str__(self) -> str:
        parts = []
        for d in self.dimensions:
            text = f"{d.low}_{d.high}"
            if d.interior:
                text += f"_{d.interior}"
            parts.append(text)
        return "x".join(parts)


def parse_padding(text: str) -> PaddingConfig:
    """`1_0x0_2_1` → PaddingConfig; raises ValueError on anything else."""
    if not text.strip():
        return PaddingConfig(())
    dims = []
    for part in text.strip().split("x"):
        if not re.fullmatch(r"-?\d+_-?\d+(_\d+)?", part):
            raise ValueError(f"bad padding {text!r}: expected low_high[_interior] per dimension")
        dims.append(PaddingDimension(*(int(v) for v in part.split("_"))))
    return PaddingConfig(tuple(dims))


@dataclass(frozen=True)
class WindowDimension:
    size: int
    stride: int = 1
    padding_low: int = 0
    padding_high: int = 0
    window_dilation: int = 1  # XLA text `rhs_dilate`
    base_dilation: int = 1  # XLA text `lhs_dilate`
    window_reversal: bool = False  # XLA text `rhs_reversal`: a convolution's kernel flipped

    def output_size(self, input_size: int) -> int:
        """XLA's `window_util::StridedBound` over the padded, dilated input."""
        base = (input_size - 1) * self.base_dilation + 1 if input_size else 0
        padded = base + self.padding_low + self.padding_high
        window = (self.size - 1) * self.window_dilation + 1
        if padded < window or self.size == 0:
            return 0
        return (padded - window) // self.stride + 1


@dataclass(frozen=True)
class Window:
    dimensions: tuple[WindowDimension, ...]

    @staticmethod
    def of(sizes: tuple[int, ...], strides: tuple[int, ...] | None = None,
           padding: tuple[tuple[int, int], ...] | None = None) -> Window:
        rank = len(sizes)
        strides = strides or (1,) * rank
        padding = padding or ((0, 0),) * rank
        return Window(tuple(WindowDimension(s, t, lo, hi)
                            for s, t, (lo, hi) in zip(sizes, strides, padding, strict=True)))

    def __str__(self) -> str:
        dims = self.dimensions
        if not dims:
            return "{}"
        parts = ["size=" + "x".join(str(d.size) for d in dims)]
        if any(d.stride != 1 for d in dims):
            parts.append("stride=" + "x".join(str(d.stride) for d in dims))
        if any(d.padding_low or d.padding_high for d in dims):
            parts.append("pad=" + "x".join(f"{d.padding_low}_{d.padding_high}" for d in dims))
        if any(d.base_dilation != 1 for d in dims):
            parts.append("lhs_dilate=" + "x".join(str(d.base_dilation) for d in dims))
        if any(d.window_dilation != 1 for d in dims):
            parts.append("rhs_dilate=" + "x".join(str(d.window_dilation) for d in dims))
        if any(d.window_reversal for d in dims):
            parts.append("rhs_reversal=" + "x".join(str(int(d.window_reversal)) for d in dims))
        return "{" + " ".join(parts) + "}"


def parse_window(text: str) -> Window:
    """`{size=1x6 pad=0_0x5_0}` → Window; raises ValueError on anything else."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError(f"bad window {text!r}: expected {{size=... ...}}")
    fields: dict[str, list[str]] = {}
    for item in body[1:-1].split():
        key, _, value = item.partition("=")
        if key not in ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal") \
                or not value or key in fields:
            raise ValueError(f"bad window field {item!r} in {text!r}")
        fields[key] = value.split("x")
    if not fields:
        return Window(())
    if "size" not in fields:
        raise ValueError(f"window {text!r} has no size")
    rank = len(fields["size"])

    def ints(key: str, default: int) -> list[int]:
        values = fields.get(key, [str(default)] * rank)
        if len(values) != rank or not all(re.fullmatch(r"-?\d+", v) for v in values):
            raise ValueError(f"window {key} of {text!r} does not give {rank} integers")
        return [int(v) for v in values]

    pads = fields.get("pad", ["0_0"] * rank)
    if len(pads) != rank or not all(re.fullmatch(r"-?\d+_-?\d+", p) for p in pads):
        raise ValueError(f"window pad of {text!r} does not give {rank} low_high pairs")
    lows_highs = [tuple(int(v) for v in p.split("_")) for p in pads]
    reversal = ints("rhs_reversal", 0)
    if any(r not in (0, 1) for r in reversal):
        raise ValueError(f"window rhs_reversal of {text!r} takes 0 or 1 per dimension")
    return Window(tuple(
        WindowDimension(size, stride, lo, hi, rhs, lhs, bool(rev))
        for size, stride, (lo, hi), rhs, lhs, rev in zip(
            ints("size", 1), ints("stride", 1), lows_highs, ints("rhs_dilate", 1),
            ints("lhs_dilate", 1), reversal, strict=True)))


@dataclass(frozen=True)
class ScatterDimensions:
    """A scatter's dimension numbers (`xla_data.proto` ScatterDimensionNumbers, without
    batching dims) resolved against its operand's rank and its updates' dimensions: what
    the evaluator and every backend's scatter need to map an update element to the
    operand element it combines into."""

    index_vector_dim: int
    to_operand: tuple[int, ...]  # scatter_dims_to_operand_dims: one per index-vector entry
    window_dims: tuple[int, ...]  # update_window_dims: the updates' dims inside one window
    scatter_dims: tuple[int, ...]  # the updates' other dims: which window (which indices)
    window_operand_dims: tuple[int, ...]  # the operand dims `window_dims` walk, in order
    window_sizes: tuple[int, ...]  # per operand dim, the window's extent (1 where inserted)

    @staticmethod
    def of(attributes: Mapping[str, Any], operand_rank: int,
           update_dims: tuple[int, ...]) -> ScatterDimensions:
        window_dims = tuple(attributes["update_window_dims"])
        inserted = set(attributes["inserted_window_dims"])
        window_operand_dims = tuple(d for d in range(operand_rank) if d not in inserted)
        window_sizes = [1] * operand_rank
        for d, u in zip(window_operand_dims, window_dims, strict=True):
            window_sizes[d] = update_dims[u]
        return ScatterDimensions(
            index_vector_dim=int(attributes["index_vector_dim"]),
            to_operand=tuple(attributes["scatter_dims_to_operand_dims"]),
            window_dims=window_dims,
            scatter_dims=tuple(d for d in range(len(update_dims)) if d not in window_dims),
            window_operand_dims=window_operand_dims,
            window_sizes=tuple(window_sizes))
