"""The CUDA element generator of `convolution` on the CPU emulator, against the NumPy
evaluator: TF's XLA golden modules with feature groups, batch groups and a transposed
(lhs-dilated) convolution."""

from __future__ import annotations

from pathlib import Path

import cuda_emulator
import fake_cupy
import numpy as np
import pytest
from gpu_checks import assert_matches
from hlo_builders import flatten

from tfxla_lite.codegen.gpu import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

pytestmark = pytest.mark.skipif(cuda_emulator.find_compiler() is None, reason="no g++")

GOLDEN = Path(__file__).resolve().parent.parent / "hlo" / "convolution_golden"


@pytest.mark.parametrize("name", ["conv2d_explicit_grouped", "depthwise_backprop_filter",
                                  "backprop_input"])
def test_gpu_convolution_emulated(emulated: fake_cupy.Recorder, name: str) -> None:
    arrays = np.load(GOLDEN / "tf_results.npz")
    args = [arrays[f"{name}.lhs"], arrays[f"{name}.rhs"]]
    text = (GOLDEN / f"{name}.hlo").read_text()
    expected = flatten(evaluate(parse_module(text), *args))
    executable = compile_module(parse_module(text), verify=True)
    assert_matches(executable.run_numpy(*args), expected, f"{name} (emulated)")
    assert emulated.launches
