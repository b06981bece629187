"""CPU code for `convolution` against the NumPy evaluator: TF's XLA golden modules and
random convolutions over every attribute, compiled unfused (the element generator) and
through the pipeline."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import check

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "hlo"))
from convolution_cases import convolution_module, random_case  # noqa: E402

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
