"""The CPU filter-gradient path (`codegen/cpu/convolution_filter.py`: the forward's
patches transposed times the output gradient, accumulated GEMMs per pixel block)
against the NumPy evaluator, over strides, dilations, paddings, 1×1 filters read in
place, split input features, groups, 1-D/3-D and edge values; and its plan; and the
direct register blocks (`convolution_filter_direct.py`) over the same attributes."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import check, random_array

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hlo"))
from convolution_cases import convolution_module  # noqa: E402

from tfxla_lite.codegen import compile_module  # noqa: E402
from tfxla_lite.codegen.cpu import (  # noqa: E402
    convolution_filter,
    convolution_filter_direct,
    engine,
    gemm_packed,
)
from tfxla_lite.hlo.attributes import Window, WindowDimension  # noqa: E402
from tfxla_lite.hlo.convolution import ConvolutionDimensions  # noqa: E402
from tfxla_lite.hlo.ir import HloModule  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402


def filter_gradient_module(x_dims: tuple[int, ...], taps: tuple[int, ...], outputs: int,
                           strides: tuple[int, ...], dilations: tuple[int, ...],
                           pads: tuple[tuple[int, int], ...], groups: int = 1,
                           element_type: str = "f32") -> tuple[HloModule, Shape, Shape]:
    """The `f01b_i01o->01bf` convolution of a forward convolution's filter gradient, as
    `clustering/rules_conv_grad.py` builds it, with its input and gradient shapes."""
    grad = []
    window = []
    for i, (k, s, d, (low, high)) in enumerate(zip(taps, strides, dilations, pads)):
        size = x_dims[1 + i]
        out = max(0, (size + low + high - (k - 1) * d - 1) // s + 1)
        grad.append(out)
        expanded = (out - 1) * s + 1 if out else 0
        total = expanded + (k - 1) * d - size
        window.append(WindowDimension(out, d, low, total - low, s))
    lhs = Shape(element_type, x_dims)
    rhs = Shape(element_type, (x_dims[0], *grad, outputs))
    module = convolution_module(lhs, rhs, Window(tuple(window)),
                                ConvolutionDimensions.filter_gradient(len(taps)),
                                batch_groups=groups)
    assert module.entry.root.shape.dims == (*taps, x_dims[-1] // groups, outputs)
    return module, lhs, rhs


CASES = [
    # (x NHWC, taps, outputs, strides, dilations, pads, groups, element type)
    ((2, 9, 8, 5), (3, 3), 7, (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "f32"),
    ((2, 9, 8, 5), (3, 3), 7, (2, 3), (1, 1), ((0, 1), (2, 0)), 1, "f32"),  # strides
    ((1, 11, 10, 3), (3, 2), 4, (1, 1), (2, 3), ((0, 0), (1, 1)), 1, "f64"),  # dilations
    ((2, 9, 9, 4), (3, 3), 6, (2, 2), (1, 1), ((0, 0), (0, 0)), 1, "f32"),  # unread end
    ((3, 6, 7, 16), (1, 1), 9, (1, 1), (1, 1), ((0, 0), (0, 0)), 1, "f32"),  # x is P
    ((3, 6, 7, 16), (1, 1), 9, (2, 2), (1, 1), ((0, 0), (0, 0)), 1, "f32"),  # 1×1 strided
    ((2, 5, 4, 300), (1, 1), 20, (1, 1), (1, 1), ((0, 0), (0, 0)), 1, "f32"),  # Cin split
    ((1, 4, 4, 300), (2, 2), 9, (1, 1), (1, 1), ((1, 0), (0, 1)), 1, "f32"),  # partial split
    ((2, 6, 6, 32), (3, 3), 24, (1, 1), (1, 1), ((1, 1), (1, 1)), 2, "f32"),  # 2 groups
    ((4, 40, 33, 8), (3, 3), 80, (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "f32"),  # many blocks
    ((2, 13, 5), (4,), 6, (3,), (1,), ((2, 1),), 1, "f32"),  # 1-D
    ((1, 4, 5, 6, 3), (2, 3, 2), 5, (1, 1, 2), (1, 1, 1), ((1, 0), (1, 1), (0, 1)), 1,
     "f32"),  # 3-D
    ((2, 7, 7, 1), (7, 7), 8, (2, 2), (1, 1), ((3, 3), (3, 3)), 1, "f32"),  # one channel
    ((2, 7, 7, 1), (3, 3), 32, (1, 1), (1, 1), ((1, 1), (1, 1)), 1, "f32"),  # not direct
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_filter_gradient_path_matches_the_evaluator(case: int) -> None:
    x_dims, taps, outputs, strides, dilations, pads, groups, element_type = CASES[case]
    module, lhs, rhs = filter_gradient_module(x_dims, taps, outputs, strides, dilations, pads,
                                              groups, element_type)
    conv = convolution_filter.plan(module.entry.root)
    assert conv is not None
    direct = convolution_filter_direct.direct_plan(conv)
    rng = np.random.default_rng(case)
    # Small integers: sums over thousands of pixels stay exact in any order.
    args = [rng.integers(-3, 4, s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)]
    executable = check(module, args, "convolution")
    assert ("conv_filter_direct.kernel" in executable.llvm_ir) == (direct is not None)
    assert (engine.gemm(element_type).symbol in executable.llvm_ir) == (direct is None)


# The direct register blocks (convolution_filter_direct.py): output features a multiple
# of 16 per group, V = 4, 3, 2, 1 vectors, input features padded to the block's rows.
DIRECT_CASES = [
    ((2, 9, 8, 16), (3, 3), 32, (1, 1), (1, 1), ((1, 1), (1, 1)), 1),
    ((2, 9, 8, 12), (3, 3), 48, (2, 3), (1, 1), ((0, 1), (2, 0)), 1),  # strides
    ((1, 11, 10, 10), (3, 2), 64, (1, 1), (2, 3), ((0, 0), (1, 1)), 1),  # dilations
    ((2, 9, 9, 20), (3, 3), 16, (2, 2), (1, 1), ((0, 0), (0, 0)), 1),  # unread end
    ((2, 5, 4, 300), (1, 1), 16, (1, 1), (1, 1), ((0, 0), (0, 0)), 1),  # Cin split
    ((2, 6, 6, 32), (3, 3), 64, (1, 1), (1, 1), ((1, 1), (1, 1)), 2),  # 2 groups
    ((4, 40, 33, 8), (3, 3), 80, (1, 1), (1, 1), ((1, 1), (1, 1)), 1),  # many blocks
    ((2, 13, 16), (4,), 32, (3,), (1,), ((2, 1),), 1),  # 1-D
    ((1, 4, 5, 6, 8), (2, 3, 2), 16, (1, 1, 2), (1, 1, 1), ((1, 0), (1, 1), (0, 1)), 1),
    ((2, 7, 7, 9), (7, 7), 16, (2, 2), (1, 1), ((3, 3), (3, 3)), 1),  # 9 of 2·5 rows
]


@pytest.mark.skipif(not gemm_packed.available(), reason="the direct path needs AVX-512")
@pytest.mark.parametrize("case", range(len(DIRECT_CASES)))
def test_filter_gradient_direct_path(case: int) -> None:
    module, lhs, rhs = filter_gradient_module(*DIRECT_CASES[case])
    plan = convolution_filter_direct.direct_plan(convolution_filter.plan(module.entry.root))
    assert plan is not None and plan.input_block % plan.rows == 0
    assert plan.units >= min(convolution_filter_direct.MIN_UNITS, plan.conv.groups
                             * plan.conv.taps * -(-plan.conv.group_inputs // plan.rows)
                             * plan.strips)
    rng = np.random.default_rng(case)
    args = [rng.integers(-3, 4, s.dims).astype(np.float32) for s in (lhs, rhs)]
    executable = check(module, args, "convolution")
    assert "conv_filter_direct.kernel" in executable.llvm_ir
    # NaN, ±inf and -0.0 among the input's values, the gradient finite.
    x = args[0].copy().reshape(-1)
    spots = rng.choice(x.size, size=min(x.size, 8), replace=False)
    x[spots] = np.resize(np.float32([np.nan, np.inf, -np.inf, -0.0]), spots.size)
    check(module, [x.reshape(lhs.dims), args[1]], "convolution")


def test_filter_gradient_path_edge_values() -> None:
    module, lhs, rhs = filter_gradient_module((2, 6, 5, 4), (3, 3), 8, (1, 1), (1, 1),
                                              ((1, 1), (1, 1)))
    rng = np.random.default_rng(7)
    # A finite gradient: the evaluator multiplies a padded zero by it (0·inf = NaN) where
    # XLA's semantics (and every CPU kernel) skip the position.
    check(module, [random_array(lhs, rng), rng.standard_normal(rhs.dims).astype(np.float32)],
          "convolution")


@pytest.mark.parametrize("x_dims, outputs, groups", [
    ((0, 4, 4, 3), 5, 1),  # no batch: zeros, from the element generator
    ((2, 4, 4, 0), 5, 1),  # no input features: an empty filter
    ((2, 4, 4, 6), 6, 6),  # depthwise: one-column groups
])
def test_filter_gradient_path_declines_what_the_element_generator_runs(
        x_dims: tuple[int, ...], outputs: int, groups: int) -> None:
    module, lhs, rhs = filter_gradient_module(x_dims, (3, 3), outputs, (1, 1), (1, 1),
                                              ((1, 1), (1, 1)), groups)
    assert convolution_filter.plan(module.entry.root) is None
    rng = np.random.default_rng(0)
    check(module, [rng.standard_normal(s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)],
          "convolution")


def test_filter_gradient_plan_is_fixed_by_the_shape() -> None:
    module, _, _ = filter_gradient_module((16, 16, 16, 64), (3, 3), 64, (1, 1), (1, 1),
                                          ((1, 1), (1, 1)))
    conv = convolution_filter.plan(module.entry.root)
    assert conv.units >= convolution_filter.MIN_UNITS
    assert conv.tap_block * conv.input_block <= convolution_filter.UNIT_ROWS
    assert conv.block_pixels * conv.tap_block * conv.input_block * 4 \
        <= convolution_filter.PATCH_BYTES
    wide, _, _ = filter_gradient_module((16, 4, 4, 1024), (1, 1), 256, (1, 1), (1, 1),
                                        ((0, 0), (0, 0)))
    conv = convolution_filter.plan(wide.entry.root)
    assert conv.direct and conv.tap_block == 1 and conv.input_block <= 256


@pytest.mark.skipif(not gemm_packed.available(), reason="the direct path needs AVX-512")
@pytest.mark.parametrize("case", [0, 4, 6])
def test_filter_gradient_direct_bits_do_not_depend_on_units_or_threads(
        case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sum continues from the value stored after the pixel block before: the same
    bits on one thread or two, for other unit counts and pixel blocks."""
    _, lhs, rhs = filter_gradient_module(*DIRECT_CASES[case])
    rng = np.random.default_rng(5)
    args = [rng.uniform(-1, 1, s.dims).astype(np.float32) for s in (lhs, rhs)]

    def bits(threads: int) -> np.ndarray:
        module, _, _ = filter_gradient_module(*DIRECT_CASES[case])
        executable = compile_module(module, threads=threads, cache=False)
        assert "conv_filter_direct.kernel" in executable.llvm_ir
        return executable(*args)[0]

    reference = bits(2)
    for setting in ({"MIN_UNITS": 1, "BLOCK_PIXELS": 7}, {"MIN_UNITS": 64}):
        with monkeypatch.context() as patch:
            for name, value in setting.items():
                patch.setattr(convolution_filter_direct, name, value)
            np.testing.assert_array_equal(bits(1), reference, err_msg=str(setting))
