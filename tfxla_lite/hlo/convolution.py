"""HLO `convolution`: its dimension numbers, shape rule, NumPy reference and flop count.

A convolution carries a `Window` (`attributes.py`: size, stride, padding, `lhs_dilate`
(base dilation), `rhs_dilate` (window dilation), `rhs_reversal`), its dimension numbers
as `dim_labels` (a `ConvolutionDimensions`, XLA text `b01f_01io->b01f`: per operand, the
letter or spatial digit each dimension holds), and `feature_group_count` /
`batch_group_count` (absent means 1). `precision_config` stays the parser's raw text.
Everything here follows XLA: `ShapeInference::InferConvolveShape` for the shape rule, the
operation semantics (and `HloEvaluator`) for the reference, `HloCostAnalysis::
GetConvolutionFlops` for the flop count. The opcode registers these in `opcodes.py`,
`evaluator.py` and `cost_analysis.py`; the backends read `ConvolutionDimensions` too.

Semantics, for output element (b, o, spatial p):
  out = sum over window positions k and input features i of its group of
        lhs[batch, i, p·stride + k·rhs_dilate - pad_low (in the lhs-dilated input)] ·
        rhs[o, i, k (or size-1-k where reversed)]
where a position in a base-dilation hole or in the padding contributes nothing. With
feature_group_count G, output feature o reads input features [g·C/G, (g+1)·C/G) for
g = o // (O/G); with batch_group_count G, output batch b of output feature group
g = o // (O/G) reads input batch g·(N/G) + b.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfxla_lite.hlo.attributes import Window, WindowDimension
from tfxla_lite.hlo.shape import Shape


class ConvolutionShapeError(ValueError):
    """Operands or attributes a convolution's shape rule rejects (`opcodes.ShapeError`
    derives the registry's error from it)."""


@dataclass(frozen=True)
class ConvolutionDimensions:
    """XLA's ConvolutionDimensionNumbers: which dimension of each operand is what."""

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]

    @property
    def spatial_rank(self) -> int:
        return len(self.input_spatial)

    @staticmethod
    def channels_last(spatial_rank: int) -> ConvolutionDimensions:
        """`b01f_01io->b01f` (TF's NHWC input and HWIO filter) for `spatial_rank` dims."""
        spatial = tuple(range(1, spatial_rank + 1))
        return ConvolutionDimensions(0, spatial_rank + 1, spatial, spatial_rank,
                                     spatial_rank + 1, tuple(range(spatial_rank)),
                                     0, spatial_rank + 1, spatial)

    @staticmethod
    def filter_gradient(spatial_rank: int) -> ConvolutionDimensions:
        """`f01b_i01o->01bf` (XLA's filter gradient): the input (NHWC) with its batch as
        the contracted feature and its channels as the batch, the output gradient (NHWC)
        as the kernel, the result a filter (HWIO)."""
        spatial = tuple(range(1, spatial_rank + 1))
        return ConvolutionDimensions(spatial_rank + 1, 0, spatial, 0, spatial_rank + 1,
                                     spatial, spatial_rank, spatial_rank + 1,
                                     tuple(range(spatial_rank)))

    def __str__(self) -> str:
        def labels(first: int, first_char: str, second: int, second_char: str,
                   spatial: tuple[int, ...]) -> str:
            chars = [""] * (2 + len(spatial))
            chars[first], chars[second] = first_char, second_char
            for digit, d in enumerate(spatial):
                chars[d] = str(digit)
            return "".join(chars)

        return (labels(self.input_batch, "b", self.input_feature, "f", self.input_spatial)
                + "_" + labels(self.kernel_input_feature, "i", self.kernel_output_feature, "o",
                               self.kernel_spatial)
                + "->" + labels(self.output_batch, "b", self.output_feature, "f",
                                self.output_spatial))


def parse_dim_labels(text: str) -> ConvolutionDimensions:
    """`b01f_01io->b01f` → ConvolutionDimensions; raises ValueError on anything else."""
    match = re.fullmatch(r"([bf0-9]+)_([io0-9]+)->([bf0-9]+)", text.strip())
    if match is None:
        raise ValueError(f"bad dim_labels {text!r}: expected e.g. b01f_01io->b01f")

    def read(labels: str, first: str, second: str) -> tuple[int, int, tuple[int, ...]]:
        spatial_rank = len(labels) - 2
        expected = sorted([first, second] + [str(d) for d in range(spatial_rank)])
        if spatial_rank > 10 or sorted(labels) != expected:
            raise ValueError(f"dim_labels {text!r}: {labels!r} must hold {first}, {second} "
                             f"and the digits 0..{spatial_rank - 1} once each")
        return (labels.index(first), labels.index(second),
                tuple(labels.index(str(d)) for d in range(spatial_rank)))

    lhs, rhs, out = match.groups()
    if not len(lhs) == len(rhs) == len(out):
        raise ValueError(f"dim_labels {text!r}: the three parts differ in rank")
    batch, feature, spatial = read(lhs, "b", "f")
    kernel_in, kernel_out, kernel_spatial = read(rhs, "i", "o")
    out_batch, out_feature, out_spatial = read(out, "b", "f")
    return ConvolutionDimensions(batch, feature, spatial, kernel_in, kernel_out, kernel_spatial,
                                 out_batch, out_feature, out_spatial)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConvolutionShapeError(message)


def group_counts(attributes: Mapping[str, Any]) -> tuple[int, int]:
    """(feature_group_count, batch_group_count); 1 where absent."""
    return (int(attributes.get("feature_group_count", 1)),
            int(attributes.get("batch_group_count", 1)))


def output_size(d: WindowDimension, input_size: int) -> int:
    """XLA's InferWindowOutputShape for one dimension: the strided bound of the window over
    the base-dilated, padded input."""
    dilated = (input_size - 1) * d.base_dilation + 1 if input_size else 0
    padded = dilated + d.padding_low + d.padding_high
    _require(padded >= 0, f"window {d} leaves a negative padded size of input {input_size}")
    window = (d.size - 1) * d.window_dilation + 1 if d.size else 0
    if window > padded:
        return 0
    return (padded - window) // d.stride + 1


def convolution_shape(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    """XLA's ShapeInference::InferConvolveShape (the result in the operands' type)."""
    _require(len(shapes) == 2, "convolution takes lhs and rhs")
    lhs, rhs = shapes
    _require(not lhs.is_tuple and not rhs.is_tuple, f"convolution takes arrays, got {shapes}")
    _require(lhs.element_type == rhs.element_type and lhs.element_type != "pred",
             f"convolution operands must share a numeric type: {shapes}")
    dnums, window = attributes["dim_labels"], attributes["window"]
    _require(isinstance(dnums, ConvolutionDimensions), f"dim_labels {dnums!r}")
    _require(isinstance(window, Window), f"window {window!r}")
    n = dnums.spatial_rank
    _require(lhs.rank == rhs.rank == n + 2,
             f"convolution operands {lhs} and {rhs} need rank {n + 2} for {dnums}")
    for dims in ((dnums.input_batch, dnums.input_feature, *dnums.input_spatial),
                 (dnums.kernel_input_feature, dnums.kernel_output_feature, *dnums.kernel_spatial),
                 (dnums.output_batch, dnums.output_feature, *dnums.output_spatial)):
        _require(sorted(dims) == list(range(n + 2)), f"dim_labels {dnums} are not a permutation")
    _require(len(window.dimensions) == n, f"window {window} does not have {n} dimensions")
    feature_groups, batch_groups = group_counts(attributes)
    _require(feature_groups >= 1 and batch_groups >= 1, "group counts must be positive")
    _require(feature_groups == 1 or batch_groups == 1,
             "feature_group_count and batch_group_count cannot both exceed 1")
    input_batch = lhs.dims[dnums.input_batch]
    input_features = lhs.dims[dnums.input_feature]
    kernel_input = rhs.dims[dnums.kernel_input_feature]
    kernel_output = rhs.dims[dnums.kernel_output_feature]
    _require(input_features % feature_groups == 0 and
             input_features // feature_groups == kernel_input,
             f"input features {input_features} / feature_group_count {feature_groups} differ "
             f"from the kernel's input features {kernel_input}")
    _require(kernel_output % feature_groups == 0 and kernel_output % batch_groups == 0,
             f"kernel output features {kernel_output} are not divisible by the group count")
    _require(input_batch % batch_groups == 0,
             f"input batch {input_batch} is not divisible by batch_group_count {batch_groups}")
    dims = [0] * (n + 2)
    dims[dnums.output_batch] = input_batch // batch_groups
    dims[dnums.output_feature] = kernel_output
    for i, d in enumerate(window.dimensions):
        _require(d.size == rhs.dims[dnums.kernel_spatial[i]],
                 f"window size {d.size} differs from kernel spatial dim {i} of {rhs}")
        _require(d.stride >= 1 and d.window_dilation >= 1 and d.base_dilation >= 1,
                 f"window {window} needs strides and dilations of at least 1")
        dims[dnums.output_spatial[i]] = output_size(d, lhs.dims[dnums.input_spatial[i]])
    return Shape(lhs.element_type, tuple(dims))


# -- NumPy reference --------------------------------------------------------------------

def _dilate_and_pad(x: np.ndarray, axis: int, d: WindowDimension) -> np.ndarray:
    """`x` along `axis` with d.base_dilation - 1 zeros between neighbours and XLA's edge
    padding (negative padding removes elements)."""
    size = x.shape[axis]
    if d.base_dilation > 1 and size > 1:
        shape = list(x.shape)
        shape[axis] = (size - 1) * d.base_dilation + 1
        dilated = np.zeros(shape, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(None, None, d.base_dilation)
        dilated[tuple(index)] = x
        x = dilated
    widths = [(0, 0)] * x.ndim
    widths[axis] = (max(d.padding_low, 0), max(d.padding_high, 0))
    x = np.pad(x, widths)
    index = [slice(None)] * x.ndim
    index[axis] = slice(max(-d.padding_low, 0), x.shape[axis] - max(-d.padding_high, 0))
    return x[tuple(index)]


def reference(lhs: np.ndarray, rhs: np.ndarray, window: Window, dnums: ConvolutionDimensions,
              feature_groups: int = 1, batch_groups: int = 1,
              compute_dtype: np.dtype | None = None) -> np.ndarray:
    """The convolution of `lhs` by `rhs`, summed in `compute_dtype` (default: theirs), in
    the output layout of `dnums`: per window position (row-major, ascending), a contraction
    over the input features of each group."""
    dtype = np.dtype(compute_dtype or lhs.dtype)
    n = dnums.spatial_rank
    x = np.transpose(lhs, (dnums.input_batch, dnums.input_feature, *dnums.input_spatial))
    w = np.transpose(rhs, (dnums.kernel_output_feature, dnums.kernel_input_feature,
                           *dnums.kernel_spatial)).astype(dtype)
    x = x.astype(dtype)
    for i, d in enumerate(window.dimensions):
        x = _dilate_and_pad(x, 2 + i, d)
        if d.window_reversal:
            w = np.flip(w, axis=2 + i)
    batch, features = x.shape[:2]
    outputs = w.shape[0]
    out_spatial = tuple(output_size(d, lhs.shape[dnums.input_spatial[i]])
                        for i, d in enumerate(window.dimensions))
    result = np.zeros((batch // batch_groups, outputs, *out_spatial), dtype)
    if result.size and features:
        for position in itertools.product(*(range(d.size) for d in window.dimensions)):
            index = tuple(slice(k * d.window_dilation,
                                k * d.window_dilation + (size - 1) * d.stride + 1, d.stride)
                          for k, d, size in zip(position, window.dimensions, out_spatial))
            patch = x[(slice(None), slice(None), *index)]  # [batch, features, out...]
            kernel = w[(slice(None), slice(None), *position)]  # [outputs, kernel inputs]
            if batch_groups > 1:
                patch = patch.reshape(batch_groups, batch // batch_groups, features,
                                      *out_spatial)
                kernel = kernel.reshape(batch_groups, outputs // batch_groups, features)
                part = np.einsum("gbc...,goc->bgo...", patch, kernel, optimize=True)
            else:
                patch = patch.reshape(batch, feature_groups, features // feature_groups,
                                      *out_spatial)
                kernel = kernel.reshape(feature_groups, outputs // feature_groups,
                                        features // feature_groups)
                part = np.einsum("bgc...,goc->bgo...", patch, kernel, optimize=True)
            result += part.reshape(result.shape).astype(dtype, copy=False)
    order = [0] * (n + 2)
    for source, target in enumerate((dnums.output_batch, dnums.output_feature,
                                     *dnums.output_spatial)):
        order[target] = source
    return np.transpose(result, order)


# -- cost ---------------------------------------------------------------------------------

def flops(lhs: Shape, rhs: Shape, result: Shape, attributes: Mapping[str, Any]) -> int:
    """XLA's HloCostAnalysis::GetConvolutionFlops: 2 per multiply-add with a real input
    element (positions in padding or base-dilation holes do not count)."""
    dnums: ConvolutionDimensions = attributes["dim_labels"]
    window: Window = attributes["window"]
    feature_groups, batch_groups = group_counts(attributes)
    valid_positions = []
    for i, d in enumerate(window.dimensions):
        kernel = rhs.dims[dnums.kernel_spatial[i]]
        out = result.dims[dnums.output_spatial[i]]
        size = lhs.dims[dnums.input_spatial[i]]
        count = 0
        for k in range(kernel):
            for o in range(out):
                undilated = o * d.stride - d.padding_low + k * d.window_dilation
                if undilated % d.base_dilation:
                    continue
                if 0 <= undilated // d.base_dilation < size:
                    count += 1
        valid_positions.append(count)
    fmas = (lhs.dims[dnums.input_feature] // feature_groups
            * result.dims[dnums.output_feature]
            * (lhs.dims[dnums.input_batch] // batch_groups)
            * math.prod(valid_positions))
    return 2 * fmas
