"""CPU code for `convolution` against the NumPy evaluator: TF's XLA golden modules and
random convolutions over every attribute, compiled unfused (the element generator) and
through the pipeline, the GEMM path (patches and library GEMM calls) and the direct
register blocks where they apply."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hlo"))
from convolution_cases import convolution_module, random_case  # noqa: E402

from tfxla_lite.codegen import compile_module  # noqa: E402
from tfxla_lite.codegen.cpu import (  # noqa: E402
    convolution_direct,
    convolution_gemm,
    engine,
    gemm_packed,
)
from tfxla_lite.hlo.attributes import parse_window  # noqa: E402
from tfxla_lite.hlo.convolution import ConvolutionDimensions  # noqa: E402
from tfxla_lite.hlo.parser import parse_module  # noqa: E402
from tfxla_lite.hlo.shape import Shape  # noqa: E402

GOLDEN = Path(__file__).resolve().parent.parent / "hlo" / "convolution_golden"


@pytest.mark.parametrize("name", sorted(p.stem for p in GOLDEN.glob("*.hlo")))
def test_golden_convolutions(name: str) -> None:
    arrays = np.load(GOLDEN / "tf_results.npz")
    module = parse_module((GOLDEN / f"{name}.hlo").read_text())
    executable = check(module, [arrays[f"{name}.lhs"], arrays[f"{name}.rhs"]], "convolution")
    (actual,) = executable(arrays[f"{name}.lhs"], arrays[f"{name}.rhs"])
    np.testing.assert_allclose(actual, arrays[f"{name}.out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(24))
def test_random_convolutions_unfused(seed: int) -> None:
    lhs, rhs, window, dnums, feature_groups, batch_groups = random_case(seed)
    module = convolution_module(lhs, rhs, window, dnums, feature_groups, batch_groups)
    rng = np.random.default_rng(seed)
    args = [rng.integers(-3, 4, s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)]
    check(module, args, "convolution", fused=False)


@pytest.mark.parametrize("element_type", ["f16", "bf16"])
def test_half_floats_accumulate_in_f32(element_type: str) -> None:
    lhs, rhs = Shape(element_type, (1, 1, 9)), Shape(element_type, (1, 9, 1))
    module = convolution_module(lhs, rhs, parse_window("{size=1}"),
                                ConvolutionDimensions.channels_last(1))
    x = np.ones(lhs.dims, lhs.numpy_dtype)
    x[0, 0, 0] = 256 if element_type == "bf16" else 2048
    (out,) = check(module, [x, np.ones(rhs.dims, rhs.numpy_dtype)], "convolution")(
        x, np.ones(rhs.dims, rhs.numpy_dtype))
    assert float(out.reshape(-1)[0]) == float(x[0, 0, 0]) + 8


# -- the GEMM path (convolution_gemm.py) ------------------------------------------------------

GEMM_CASES = [
    # (input NHWC, filter HWIO, window text, feature groups, element type)
    ((2, 9, 8, 5), (3, 3, 5, 7), "{size=3x3 pad=1_1x1_1}", 1, "f32"),
    ((2, 9, 8, 5), (3, 3, 5, 7), "{size=3x3 stride=2x3 pad=0_1x2_0}", 1, "f32"),
    ((1, 11, 10, 3), (3, 2, 3, 4), "{size=3x2 pad=-1_2x1_-1 rhs_dilate=2x3}", 1, "f64"),
    ((3, 6, 7, 16), (1, 1, 16, 9), "{size=1x1}", 1, "f32"),  # the input is the patches
    ((3, 6, 7, 16), (1, 1, 16, 9), "{size=1x1 stride=2x2}", 1, "f32"),
    ((2, 6, 6, 32), (3, 3, 16, 24), "{size=3x3 pad=1_1x1_1}", 2, "f32"),  # 2 wide groups
    ((4, 40, 33, 8), (3, 3, 8, 12), "{size=3x3 pad=1_1x1_1}", 1, "f32"),  # parallel units
    ((2, 13, 5), (4, 5, 6), "{size=4 stride=3 pad=2_1}", 1, "f32"),  # 1-D
    ((1, 4, 5, 6, 3), (2, 3, 2, 3, 5), "{size=2x3x2 pad=1_0x1_1x0_1}", 1, "f32"),  # 3-D
]


@pytest.mark.parametrize("case", range(len(GEMM_CASES)))
def test_gemm_path_matches_the_evaluator(case: int) -> None:
    x_dims, w_dims, window, groups, element_type = GEMM_CASES[case]
    lhs, rhs = Shape(element_type, x_dims), Shape(element_type, w_dims)
    module = convolution_module(lhs, rhs, parse_window(window),
                                ConvolutionDimensions.channels_last(len(x_dims) - 2), groups)
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    assert convolution_gemm.plan(conv) is not None
    rng = np.random.default_rng(case)
    args = [rng.standard_normal(s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)]
    executable = check(module, args, "convolution")
    symbol = engine.gemm(element_type).symbol
    assert symbol in executable.llvm_ir


TRANSPOSED_FILTER_CASES = [
    # (gradient NHWC, forward filter HWIO = the `01oi` kernel, window text)
    ((2, 9, 8, 7), (3, 3, 5, 7), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}"),
    ((2, 9, 8, 7), (3, 3, 5, 7), "{size=3x3 pad=2_2x2_2}"),  # not reversed
    ((1, 11, 10, 4), (3, 2, 3, 4), "{size=3x2 pad=2_1x1_2 rhs_dilate=2x3 rhs_reversal=1x1}"),
    ((3, 6, 7, 16), (1, 1, 9, 16), "{size=1x1 rhs_reversal=1x1}"),  # the gradient is P
    ((4, 40, 33, 8), (3, 3, 12, 8), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}"),  # parallel
    ((2, 13, 6), (4, 5, 6), "{size=4 pad=3_3 rhs_reversal=1}"),  # 1-D
    ((1, 4, 5, 6, 5), (2, 3, 2, 3, 5), "{size=2x3x2 pad=1_0x1_1x0_1 rhs_reversal=1x1x1}"),
]


@pytest.mark.parametrize("case", range(len(TRANSPOSED_FILTER_CASES)))
@pytest.mark.parametrize("element_type", ["f32", "f64"])
def test_gemm_path_transposed_filter(case: int, element_type: str) -> None:
    x_dims, w_dims, window = TRANSPOSED_FILTER_CASES[case]
    lhs, rhs = Shape(element_type, x_dims), Shape(element_type, w_dims)
    module = convolution_module(lhs, rhs, parse_window(window),
                                convolution_gemm.transposed_filter_dimensions(len(x_dims) - 2))
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    assert conv.shape.dims[-1] == w_dims[-2]  # the `o` of `01oi`
    assert convolution_gemm.plan(conv).transposed_filter
    rng = np.random.default_rng(case)
    args = [rng.integers(-3, 4, s.dims).astype(s.numpy_dtype) for s in (lhs, rhs)]
    executable = check(module, args, "convolution")
    assert engine.gemm(element_type).symbol in executable.llvm_ir


def test_gemm_path_declines_partly_reversed_filters() -> None:
    module = convolution_module(Shape("f32", (1, 5, 5, 3)), Shape("f32", (3, 3, 2, 3)),
                                parse_window("{size=3x3 rhs_reversal=1x0}"),
                                convolution_gemm.transposed_filter_dimensions(2))
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    assert convolution_gemm.plan(conv) is None
    rng = np.random.default_rng(0)
    check(module, [rng.standard_normal(s.dims).astype(np.float32)
                   for s in (conv.operands[0].shape, conv.operands[1].shape)], "convolution")


def test_gemm_path_plan_is_fixed_by_the_shape() -> None:
    module = convolution_module(Shape("f32", (16, 32, 32, 64)), Shape("f32", (3, 3, 64, 64)),
                                parse_window("{size=3x3 pad=1_1x1_1}"),
                                ConvolutionDimensions.channels_last(2))
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    plan = convolution_gemm.plan(conv)
    assert plan.k == 576 and plan.rows == 16 * 32 * 32 and not plan.direct
    assert plan.block_rows % convolution_gemm.ROW_ALIGN == 0
    assert plan.block_rows * plan.k * 4 <= convolution_gemm.PATCH_BYTES
    depthwise = convolution_module(Shape("f32", (1, 8, 8, 6)), Shape("f32", (3, 3, 1, 6)),
                                   parse_window("{size=3x3 pad=1_1x1_1}"),
                                   ConvolutionDimensions.channels_last(2), 6)
    (conv,) = [i for i in depthwise.entry.instructions if i.opcode == "convolution"]
    assert convolution_gemm.plan(conv) is None  # one-column groups: the element generator


# -- the direct path (convolution_direct.py) --------------------------------------------------

DIRECT_CASES = [
    # (input NHWC, filter HWIO, window text, feature groups): V = 4, 3, 2, 1 vectors
    ((2, 9, 8, 16), (3, 3, 16, 64), "{size=3x3 pad=1_1x1_1}", 1),
    ((2, 9, 8, 8), (3, 3, 8, 48), "{size=3x3 stride=2x3 pad=0_1x2_0}", 1),
    ((3, 7, 5, 64), (1, 1, 64, 80), "{size=1x1}", 1),  # 5 one-vector strips
    ((2, 7, 7, 64), (1, 1, 64, 96), "{size=1x1 stride=2x2}", 1),
    ((2, 6, 6, 32), (3, 3, 16, 32), "{size=3x3 pad=1_1x1_1}", 2),  # 2 groups
    ((4, 20, 17, 8), (3, 3, 8, 16), "{size=3x3 pad=1_1x1_1 rhs_dilate=2x2}", 1),
    ((1, 11, 10, 12), (3, 2, 12, 32), "{size=3x2 pad=-1_2x1_-1 rhs_dilate=2x3}", 1),
    ((2, 2, 2, 128), (3, 3, 128, 512), "{size=3x3 pad=1_1x1_1}", 1),  # features split
    ((2, 13, 16), (5, 16, 128), "{size=5 stride=3 pad=2_1}", 1),  # 1-D
    ((1, 4, 5, 6, 8), (2, 3, 2, 8, 32), "{size=2x3x2 pad=1_0x1_1x0_1}", 1),  # 3-D
]


# Backprop-input's form (`01oi` filters, reversed): (gradient NHWC, filter HWIO, window)
DIRECT_TRANSPOSED_CASES = [
    ((2, 9, 8, 64), (3, 3, 32, 64), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}"),
    ((2, 9, 8, 16), (3, 3, 48, 16), "{size=3x3 pad=2_2x2_2}"),  # not reversed
    ((1, 11, 10, 12), (3, 2, 32, 12), "{size=3x2 pad=2_1x1_2 rhs_dilate=2x3 rhs_reversal=1x1}"),
    ((3, 6, 7, 64), (1, 1, 80, 64), "{size=1x1 stride=2x2 rhs_reversal=1x1}"),
    ((2, 2, 2, 128), (3, 3, 256, 128), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}"),
    ((2, 13, 16), (5, 32, 16), "{size=5 pad=4_4 rhs_reversal=1}"),  # 1-D
    # Enough FLOPs that the filter's transpose runs on the team too.
    ((4, 8, 8, 128), (3, 3, 96, 128), "{size=3x3 pad=1_1x1_1 rhs_reversal=1x1}"),
]


def _direct_module(case: int) -> tuple[object, object, list[Shape]]:
    if case >= len(DIRECT_CASES):
        x_dims, w_dims, window = DIRECT_TRANSPOSED_CASES[case - len(DIRECT_CASES)]
        groups, dnums = 1, convolution_gemm.transposed_filter_dimensions(len(x_dims) - 2)
    else:
        x_dims, w_dims, window, groups = DIRECT_CASES[case]
        dnums = ConvolutionDimensions.channels_last(len(x_dims) - 2)
    shapes = [Shape("f32", x_dims), Shape("f32", w_dims)]
    module = convolution_module(*shapes, parse_window(window), dnums, groups)
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    return module, conv, shapes


@pytest.mark.skipif(not gemm_packed.available(), reason="the direct path needs AVX-512")
@pytest.mark.parametrize("case", range(len(DIRECT_CASES) + len(DIRECT_TRANSPOSED_CASES)))
def test_direct_path_matches_the_evaluator(case: int) -> None:
    module, conv, shapes = _direct_module(case)
    assert convolution_direct.direct_plan(convolution_gemm.plan(conv)) is not None
    rng = np.random.default_rng(case)
    # Integers: every sum exact, whatever the order; then NaN, ±inf and -0.0 among the
    # input's (the padding's zeros meet finite weights only).
    args = [rng.integers(-3, 4, s.dims).astype(np.float32) for s in shapes]
    executable = check(module, args, "convolution")
    assert "conv_direct.kernel" in executable.llvm_ir
    x = args[0].copy().reshape(-1)
    spots = rng.choice(x.size, size=min(x.size, 8), replace=False)
    x[spots] = np.resize(np.float32([np.nan, np.inf, -np.inf, -0.0]), spots.size)
    check(module, [x.reshape(args[0].shape), args[1]], "convolution")


def test_direct_plan_is_fixed_by_the_shape() -> None:
    for case in range(len(DIRECT_CASES) + len(DIRECT_TRANSPOSED_CASES)):
        _, conv, _ = _direct_module(case)
        plan = convolution_direct.direct_plan(convolution_gemm.plan(conv))
        if plan is None:
            continue
        assert plan.block_pixels % plan.rows == 0 and plan.width * plan.strips == (
            conv.shape.dims[-1] // plan.conv.groups)
        assert plan.block_pixels * plan.taps * 8 <= convolution_direct.POINTER_BYTES
        assert plan.pixel_blocks * plan.block_pixels >= plan.conv.rows
        assert (plan.pixel_blocks - 1) * plan.block_pixels < plan.conv.rows
        assert plan.chunks * plan.chunk >= plan.strips
        most = plan.conv.groups * plan.strips * -(-plan.conv.rows // plan.rows)
        assert plan.units >= min(2, most)
    # Small images, wide layers: the features are split, each unit taking every pixel.
    _, conv, _ = _direct_module(7)
    plan = convolution_direct.direct_plan(convolution_gemm.plan(conv))
    assert plan.pixel_blocks == 1 and plan.chunks == plan.units >= 4
    # Short patches and few input features keep the GEMM path.
    for x_dims, w_dims in [((2, 8, 8, 16), (1, 1, 16, 64)), ((2, 8, 8, 3), (7, 7, 3, 64)),
                           ((2, 8, 8, 16), (3, 3, 16, 24))]:
        module = convolution_module(Shape("f32", x_dims), Shape("f32", w_dims),
                                    parse_window(f"{{size={w_dims[0]}x{w_dims[1]}}}"),
                                    ConvolutionDimensions.channels_last(2))
        (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
        assert convolution_direct.direct_plan(convolution_gemm.plan(conv)) is None
    # A 1×1 backprop-input: one library GEMM reads its filter transposed in place.
    module = convolution_module(Shape("f32", (2, 4, 4, 256)), Shape("f32", (1, 1, 64, 256)),
                                parse_window("{size=1x1 rhs_reversal=1x1}"),
                                convolution_gemm.transposed_filter_dimensions(2))
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    assert convolution_gemm.plan(conv).direct
    assert convolution_direct.direct_plan(convolution_gemm.plan(conv)) is None


@pytest.mark.skipif(not gemm_packed.available(), reason="the direct path needs AVX-512")
@pytest.mark.parametrize("case", [0, 7, len(DIRECT_CASES),
                                  len(DIRECT_CASES) + len(DIRECT_TRANSPOSED_CASES) - 1])
def test_direct_path_bits_do_not_depend_on_units_or_threads(
        case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """One fma chain per element inside one unit: the same bits on one thread or two,
    for other unit counts and pixel blocks."""
    _, conv, shapes = _direct_module(case)
    rng = np.random.default_rng(3)
    args = [rng.uniform(-1, 1, s.dims).astype(np.float32) for s in shapes]

    def bits(threads: int) -> np.ndarray:
        executable = compile_module(_direct_module(case)[0], threads=threads, cache=False)
        assert "conv_direct.kernel" in executable.llvm_ir
        return executable(*args)[0]

    reference = bits(2)
    units = convolution_direct.direct_plan(convolution_gemm.plan(conv)).units
    for setting in ({"MIN_UNITS": 1}, {"MIN_UNITS": 16, "MAX_BLOCK_PIXELS": 24}):
        with monkeypatch.context() as patch:
            for name, value in setting.items():
                patch.setattr(convolution_direct, name, value)
            other = convolution_direct.direct_plan(convolution_gemm.plan(conv)).units
            assert other != units or setting["MIN_UNITS"] == 1
            np.testing.assert_array_equal(bits(1), reference, err_msg=str(setting))
