"""The CPU depthwise kernels (`codegen/cpu/convolution_depthwise.py`: direct loops over
the channels) against the NumPy evaluator: forward depthwise convolutions (multipliers,
strides, dilations, base dilation, padding, reversed kernels, 1-D/3-D, vector blocks of
channels or a loop over the row) and their filter gradients
(`f01b_i01o->01bf`, batch groups = channels), edge values, and what they decline."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import check, random_array
from test_convolution_filter_cpu import filter_gradient_module

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hlo"))
from convolution_cases import convolution_module  # noqa: E402

from tfxla_lite.codegen import compile_module  # noqa: E402
from tfxla_lite.codegen.cpu import convolution_depthwise  # noqa: E402
from tfxla_lite.hlo.attributes import parse_window  # noqa: E402
from tfxla_lite.hlo.convolution import ConvolutionDimensions  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402

FORWARD_CASES = [
    # (input NHWC, taps, multiplier, window text, element type)
    ((2, 9, 8, 6), (3, 3), 1, "{size=3x3 pad=1_1x1_1}", "f32"),
    ((2, 9, 8, 6), (3, 3), 2, "{size=3x3 stride=2x2 pad=0_1x1_1}", "f32"),  # multiplier
    ((1, 11, 10, 5), (3, 2), 1, "{size=3x2 pad=2_2x1_0 rhs_dilate=2x3}", "f64"),
    ((2, 5, 5, 4), (3, 3), 1, "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}", "f32"),  # flipped
    ((2, 5, 5, 4), (3, 3), 1, "{size=3x3 pad=-1_2x0_1}", "f32"),  # negative padding
    ((3, 20, 17, 40), (3, 3), 1, "{size=3x3 pad=1_1x1_1}", "f32"),  # many units
    ((2, 13, 6), (4,), 1, "{size=4 stride=3 pad=2_1}", "f32"),  # 1-D
    ((1, 4, 5, 6, 3), (2, 3, 2), 1, "{size=2x3x2 pad=1_0x1_1x0_1}", "f32"),  # 3-D
    ((2, 7, 6, 64), (3, 3), 1, "{size=3x3 stride=2x2 pad=1_1x1_1}", "f32"),  # 2 blocks of 32
    ((1, 6, 5, 48), (3, 3), 1, "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}", "f64"),  # of 16
    # A strided backprop-input's form: the gradient dilated, the filter flipped.
    ((2, 5, 5, 4), (3, 3), 1, "{size=3x3 pad=2_2x2_2 lhs_dilate=2x2}", "f32"),
    ((2, 6, 5, 32), (3, 3), 1, "{size=3x3 pad=1_2x2_1 lhs_dilate=2x3 rhs_reversal=1x1}",
     "f32"),
    ((1, 7, 9, 48), (2, 3), 2, "{size=2x3 pad=1_1x0_2 lhs_dilate=3x2 rhs_dilate=1x2}", "f64"),
]


def _forward_module(x_dims: tuple[int, ...], taps: tuple[int, ...], multiplier: int,
                    window: str, element_type: str) -> tuple:
    channels = x_dims[-1]
    lhs = Shape(element_type, x_dims)
    rhs = Shape(element_type, (*taps, 1, channels * multiplier))
    module = convolution_module(lhs, rhs, parse_window(window),
                                ConvolutionDimensions.channels_last(len(taps)), channels)
    return module, lhs, rhs


@pytest.mark.parametrize("case", range(len(FORWARD_CASES)))
def test_depthwise_forward_matches_the_evaluator(case: int) -> None:
    module, lhs, rhs = _forward_module(*FORWARD_CASES[case])
    conv = convolution_depthwise.plan(module.entry.root)
    assert conv is not None and not conv.filter_gradient
    channels, multiplier = FORWARD_CASES[case][0][-1], FORWARD_CASES[case][2]
    assert conv.lanes == (0 if multiplier > 1 else next(
        (n for n in convolution_depthwise.LANES if channels % n == 0), 0))
    rng = np.random.default_rng(case)
    check(module, [rng.standard_normal(s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)],
          "convolution")


FILTER_CASES = [
    # (x NHWC, taps, multiplier, strides, dilations, pads, element type)
    ((2, 9, 8, 6), (3, 3), 1, (1, 1), (1, 1), ((1, 1), (1, 1)), "f32"),
    ((2, 9, 8, 6), (3, 3), 3, (2, 2), (1, 1), ((0, 1), (1, 1)), "f32"),  # multiplier
    ((1, 11, 10, 5), (3, 2), 1, (1, 2), (2, 3), ((2, 2), (0, 0)), "f64"),
    ((2, 9, 9, 4), (3, 3), 1, (2, 2), (1, 1), ((0, 0), (0, 0)), "f32"),  # unread end
    ((2, 13, 6), (4,), 1, (3,), (1,), ((2, 1),), "f32"),  # 1-D
    ((2, 7, 6, 64), (3, 3), 1, (2, 2), (1, 1), ((1, 1), (1, 1)), "f32"),  # vector blocks
    ((1, 6, 5, 48), (3, 3), 1, (1, 1), (2, 2), ((2, 2), (2, 2)), "f64"),  # 2 tap parts
    ((2, 9, 8, 16), (3, 3), 1, (1, 1), (1, 1), ((1, 1), (1, 1)), "f32"),  # 3 tap parts
    ((2, 40, 16), (30,), 1, (1,), (1,), ((3, 3),), "f32"),  # too many positions to sum at once
]


@pytest.mark.parametrize("case", range(len(FILTER_CASES)))
def test_depthwise_filter_gradient_matches_the_evaluator(case: int) -> None:
    x_dims, taps, multiplier, strides, dilations, pads, element_type = FILTER_CASES[case]
    channels = x_dims[-1]
    module, lhs, rhs = filter_gradient_module(x_dims, taps, channels * multiplier, strides,
                                              dilations, pads, channels, element_type)
    conv = convolution_depthwise.plan(module.entry.root)
    assert conv is not None and conv.filter_gradient and conv.multiplier == multiplier
    assert conv.tap_sums == (multiplier == 1 and channels % convolution_depthwise.TAP_LANES == 0
                             and conv.taps <= convolution_depthwise.MAX_TAP_SUMS)
    rng = np.random.default_rng(case)
    check(module, [rng.integers(-3, 4, s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)],
          "convolution")


def test_depthwise_filter_gradient_tap_parts_keep_the_bits() -> None:
    """Few channel blocks cut the window positions into parts (more units); each element
    is still one chain over the pixels: the same bits on one thread or two, and with
    the positions in one part."""
    (x_dims, taps, _, strides, dilations, pads, _), = [
        case for case in FILTER_CASES if case[0] == (2, 9, 8, 16)]

    def module() -> tuple:
        return filter_gradient_module(x_dims, taps, x_dims[-1], strides, dilations, pads,
                                      x_dims[-1], "f32")

    conv = convolution_depthwise.plan(module()[0].entry.root)
    assert conv.tap_parts == 3 and conv.units == 3
    rng = np.random.default_rng(5)
    args = [rng.uniform(-1, 1, s.dims).astype(np.float32) for s in module()[1:]]

    def bits(threads: int) -> np.ndarray:
        return compile_module(module()[0], threads=threads, cache=False)(*args)[0]

    reference = bits(2)
    np.testing.assert_array_equal(bits(1), reference)
    original = convolution_depthwise.MIN_TAP_UNITS
    try:
        convolution_depthwise.MIN_TAP_UNITS = 1
        assert convolution_depthwise.plan(module()[0].entry.root).tap_parts == 1
        np.testing.assert_array_equal(bits(2), reference)
    finally:
        convolution_depthwise.MIN_TAP_UNITS = original


def test_depthwise_edge_values() -> None:
    module, lhs, rhs = _forward_module((2, 6, 5, 8), (3, 3), 1, "{size=3x3 pad=1_1x1_1}",
                                       "f32")
    rng = np.random.default_rng(3)
    # Finite weights: the evaluator multiplies a padded zero by a weight (0·inf = NaN)
    # where XLA's semantics (and every CPU kernel) skip the position.
    check(module, [random_array(lhs, rng), rng.standard_normal(rhs.dims).astype(np.float32)],
          "convolution")


@pytest.mark.parametrize("x_dims, window", [
    ((0, 5, 5, 4), "{size=3x3 pad=1_1x1_1}"),  # no batch
    ((2, 5, 5, 4), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x0}"),  # partly flipped
])
def test_depthwise_declines_what_the_element_generator_runs(x_dims: tuple[int, ...],
                                                           window: str) -> None:
    module, lhs, rhs = _forward_module(x_dims, (3, 3), 1, window, "f32")
    assert convolution_depthwise.plan(module.entry.root) is None
    rng = np.random.default_rng(0)
    check(module, [rng.standard_normal(s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)],
          "convolution")
