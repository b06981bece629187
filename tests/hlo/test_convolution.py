"""HLO `convolution`: XLA's text (golden modules TF's XLA printed) round trips, the shape
rule, the NumPy reference against TF's XLA results and against a plain loop over the
definition, and the flop count."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from convolution_cases import convolution_module, random_case

from tfxla_lite.hlo.attributes import Window, WindowDimension, parse_window
from tfxla_lite.hlo.convolution import (
    ConvolutionDimensions,
    flops,
    parse_dim_labels,
)
from tfxla_lite.hlo.cost_analysis import instruction_cost
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.opcodes import ShapeError, infer_shape
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.printer import module_to_text
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.hlo.verifier import VerificationError, verify

GOLDEN = Path(__file__).parent / "convolution_golden"
GOLDEN_NAMES = sorted(p.stem for p in GOLDEN.glob("*.hlo"))


def _convolution_line(text: str) -> str:
    (line,) = [line.strip() for line in text.splitlines() if " convolution(" in line]
    return line


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_golden_round_trip(name: str) -> None:
    text = (GOLDEN / f"{name}.hlo").read_text()
    module = parse_module(text)
    verify(module)
    printed = module_to_text(module)
    assert module_to_text(parse_module(printed)) == printed
    # The convolution prints exactly as XLA printed it: attributes, order and all.
    assert _convolution_line(printed) == _convolution_line(text)


def test_golden_cases_cover_the_attributes() -> None:
    lines = [_convolution_line((GOLDEN / f"{n}.hlo").read_text()) for n in GOLDEN_NAMES]
    for needle in ("stride=", "pad=", "lhs_dilate=", "rhs_dilate=", "feature_group_count=",
                   "batch_group_count=", "dim_labels=bf01_", "dim_labels=f01b_i01o->01bf",
                   "b012f_012io->b012f"):
        assert any(needle in line for line in lines), needle


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_evaluator_matches_tf_xla(name: str) -> None:
    arrays = np.load(GOLDEN / "tf_results.npz")
    module = parse_module((GOLDEN / f"{name}.hlo").read_text())
    result = evaluate(module, arrays[f"{name}.lhs"], arrays[f"{name}.rhs"])
    np.testing.assert_allclose(result, arrays[f"{name}.out"], rtol=1e-5, atol=1e-5)


# -- a plain loop over the definition --------------------------------------------------

def _loop_reference(lhs: np.ndarray, rhs: np.ndarray, window: Window,
                    dnums: ConvolutionDimensions, feature_groups: int, batch_groups: int,
                    out_shape: tuple[int, ...]) -> np.ndarray:
    """Each output element summed in float64 straight from XLA's operation semantics."""
    out = np.zeros(out_shape, np.float64)
    outputs = rhs.shape[dnums.kernel_output_feature]
    group_inputs = rhs.shape[dnums.kernel_input_feature]
    for index in np.ndindex(*out_shape):
        b, o = index[dnums.output_batch], index[dnums.output_feature]
        first = (o // (outputs // feature_groups)) * group_inputs
        batch = b + (o // (outputs // batch_groups)) * (lhs.shape[dnums.input_batch]
                                                         // batch_groups)
        total = 0.0
        for position in itertools.product(*(range(d.size) for d in window.dimensions)):
            lhs_index = [0] * lhs.ndim
            rhs_index = [0] * rhs.ndim
            real = True
            for i, (k, d) in enumerate(zip(position, window.dimensions)):
                at = index[dnums.output_spatial[i]] * d.stride + k * d.window_dilation \
                    - d.padding_low
                if at < 0 or at % d.base_dilation:
                    real = False
                    break
                at //= d.base_dilation
                if at >= lhs.shape[dnums.input_spatial[i]]:
                    real = False
                    break
                lhs_index[dnums.input_spatial[i]] = at
                rhs_index[dnums.kernel_spatial[i]] = d.size - 1 - k if d.window_reversal else k
            if not real:
                continue
            lhs_index[dnums.input_batch] = batch
            rhs_index[dnums.kernel_output_feature] = o
            for c in range(group_inputs):
                lhs_index[dnums.input_feature] = first + c
                rhs_index[dnums.kernel_input_feature] = c
                total += float(lhs[tuple(lhs_index)]) * float(rhs[tuple(rhs_index)])
        out[index] = total
    return out


@pytest.mark.parametrize("seed", range(40))
def test_evaluator_matches_the_definition(seed: int) -> None:
    lhs, rhs, window, dnums, feature_groups, batch_groups = random_case(seed)
    module = convolution_module(lhs, rhs, window, dnums, feature_groups, batch_groups)
    verify(module)
    text = module_to_text(module)
    assert module_to_text(parse_module(text)) == text
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, lhs.dims).astype(lhs.numpy_dtype)
    w = rng.integers(-3, 4, rhs.dims).astype(rhs.numpy_dtype)
    result = evaluate(module, x, w)
    assert result.shape == module.entry.root.shape.dims
    expected = _loop_reference(x, w, window, dnums, feature_groups, batch_groups, result.shape)
    # Small integers: every partial sum is exact in each type.
    np.testing.assert_array_equal(result.astype(np.float64), expected)


def test_reversal_is_a_flipped_kernel() -> None:
    dnums = ConvolutionDimensions.channels_last(2)
    plain = Window((WindowDimension(3, padding_low=1, padding_high=1), WindowDimension(2)))
    reversed_ = parse_window("{size=3x2 pad=1_1x0_0 rhs_reversal=1x1}")
    assert str(reversed_) == "{size=3x2 pad=1_1x0_0 rhs_reversal=1x1}"
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 4)).astype(np.float32)
    lhs, rhs = Shape("f32", x.shape), Shape("f32", w.shape)
    flipped = evaluate(convolution_module(lhs, rhs, plain, dnums), x, w[::-1, ::-1].copy())
    np.testing.assert_allclose(evaluate(convolution_module(lhs, rhs, reversed_, dnums), x, w),
                               flipped, rtol=1e-6, atol=1e-6)


def test_half_floats_accumulate_in_f32() -> None:
    # 2048 + 1 + 1 + ...: summed in f16 every 1 after the first would round away.
    dnums = ConvolutionDimensions.channels_last(1)
    x = np.ones((1, 1, 9), np.float16)
    x[0, 0, 0] = 2048
    w = np.ones((1, 9, 1), np.float16)
    module = convolution_module(Shape("f16", x.shape), Shape("f16", w.shape),
                                Window((WindowDimension(1),)), dnums)
    assert evaluate(module, x, w)[0, 0, 0] == np.float16(2056)


# -- text, shape rule, verifier ----------------------------------------------------------

@pytest.mark.parametrize("labels", ["b01f_01io->b01f", "bf01_oi01->bf01", "f01b_i01o->01bf",
                                    "b0f_0io->b0f", "bf_io->bf", "b012f_012io->b012f",
                                    "0bf1_o1i0->f10b"])
def test_dim_labels_round_trip(labels: str) -> None:
    assert str(parse_dim_labels(labels)) == labels


@pytest.mark.parametrize("labels", ["b01f_01io", "b01f_01io->b01", "bb1f_01io->b01f",
                                    "b02f_01io->b01f", "b01f_01fo->b01f", "b01f_01io->b01x"])
def test_bad_dim_labels_are_parse_errors(labels: str) -> None:
    with pytest.raises(ValueError):
        parse_dim_labels(labels)
    text = _convolution_module_text(f"dim_labels={labels}")
    with pytest.raises(ParseError, match="dim_labels"):
        parse_module(text)


def _convolution_module_text(attributes: str, lhs: str = "f32[1,5,5,4]",
                             rhs: str = "f32[3,3,4,2]", out: str = "f32[1,5,5,2]") -> str:
    return f"""HloModule m

ENTRY main {{
  x = {lhs} parameter(0)
  w = {rhs} parameter(1)
  ROOT c = {out} convolution(x, w), window={{size=3x3 pad=1_1x1_1}}, {attributes}
}}
"""


def test_precision_config_is_kept() -> None:
    text = _convolution_module_text(
        "dim_labels=b01f_01io->b01f, operand_precision={highest,highest}")
    printed = module_to_text(parse_module(text))
    assert "operand_precision={highest,highest}" in printed


@pytest.mark.parametrize("attributes, rhs, out, message", [
    ("dim_labels=b01f_01io->b01f, feature_group_count=3", "f32[3,3,4,2]", "f32[1,5,5,2]",
     "feature_group_count"),
    ("dim_labels=b01f_01io->b01f, batch_group_count=2", "f32[3,3,4,2]", "f32[1,5,5,2]",
     "batch"),
    ("dim_labels=b01f_01io->b01f, feature_group_count=2, batch_group_count=2",
     "f32[3,3,2,2]", "f32[1,5,5,2]", "both"),
    ("dim_labels=b01f_01io->b01f", "f32[2,3,4,2]", "f32[1,5,5,2]", "window size"),
    ("dim_labels=b01f_01io->b01f", "f32[3,3,4,2]", "f32[1,5,5,3]", "differs from inferred"),
    ("dim_labels=b0f_0io->b0f", "f32[3,3,4,2]", "f32[1,5,5,2]", "rank"),
])
def test_verifier_rejects_bad_convolutions(attributes: str, rhs: str, out: str,
                                           message: str) -> None:
    module = parse_module(_convolution_module_text(attributes, rhs=rhs, out=out))
    with pytest.raises(VerificationError, match=message):
        verify(module)


def test_shape_rule() -> None:
    dnums = ConvolutionDimensions.channels_last(2)
    window = parse_window("{size=3x3 stride=2x1 pad=1_1x-1_0 lhs_dilate=1x2 rhs_dilate=2x1}")
    shape = infer_shape("convolution", [Shape("f32", (2, 9, 4, 6)), Shape("f32", (3, 3, 3, 8))],
                        {"window": window, "dim_labels": dnums, "feature_group_count": 2})
    # rows: 9 padded to 11, window 5 -> 4 at stride 2; columns: 4 dilated to 7, -1 -> 6,
    # window 3 -> 4
    assert shape == Shape("f32", (2, 4, 4, 8))
    with pytest.raises(ShapeError, match="numeric"):
        infer_shape("convolution", [Shape("f32", (1, 3, 3)), Shape("s32", (1, 3, 3))],
                    {"window": parse_window("{size=3}"),
                     "dim_labels": ConvolutionDimensions.channels_last(1)})


# -- cost ---------------------------------------------------------------------------------

def test_flops_count_window_positions_on_the_input() -> None:
    dnums = ConvolutionDimensions.channels_last(2)
    lhs, rhs = Shape("f32", (2, 8, 8, 16)), Shape("f32", (3, 3, 16, 32))
    valid = parse_window("{size=3x3}")
    out = infer_shape("convolution", [lhs, rhs], {"window": valid, "dim_labels": dnums})
    # No padding: 2·N·Ho·Wo·Cout·Kh·Kw·Cin.
    assert flops(lhs, rhs, out, {"window": valid, "dim_labels": dnums}) == \
        2 * 2 * 6 * 6 * 32 * 3 * 3 * 16
    same = parse_window("{size=3x3 pad=1_1x1_1}")
    out = infer_shape("convolution", [lhs, rhs], {"window": same, "dim_labels": dnums})
    # Padding: per dimension 8·3 positions less the 2 that fall into the pads.
    assert flops(lhs, rhs, out, {"window": same, "dim_labels": dnums}) == \
        2 * 2 * 22 * 22 * 32 * 16
    module = parse_module((GOLDEN / "conv2d_explicit_grouped.hlo").read_text())
    (conv,) = [i for i in module.entry.instructions if i.opcode == "convolution"]
    # feature_group_count=2: 2 input features per group, 6 outputs, batch 2; rows
    # (5, pad 1_2, size 2, 7 outputs): 5 + 5 valid of 14, columns (5, pad 0_1, size 2,
    # 5 outputs): 5 + 4 of 10.
    assert instruction_cost(conv).flops == 2 * 2 * 6 * 2 * 10 * 9
