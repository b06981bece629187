"""Fusion on a real training step (issue 19): a 2-block Transformer encoder with an
embedding, gelu feed-forward layers and Adam, at test sizes. Its backward reductions
(LayerNorm gamma/beta and bias gradients) must read the forward values they need from
materialized buffers, not recompute the forward chain from the embedding onwards:
before the cost model counted fan-in, one backward kernel took 37 parameters (the
embedding table among them) and the optimized module was 3.1 times the lowered one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.workloads import transformer_encoder_adam  # noqa: E402

VOCABULARY, FEATURES = 100, 64


def _instructions(text: str) -> int:
    return len(re.findall(r"^  (?:ROOT )?%", text, re.M))


def _fusion_parameters(text: str) -> list[list[str]]:
    """The parameter shapes of each fused computation of an optimized module."""
    return [parameters for parameters, _ in _fusions(text)]


def _fusions(text: str) -> list[tuple[list[str], str]]:
    """Each fused computation's parameter shapes and body."""
    found = re.findall(r"^%fused_computation\S* \((.*?)\) ->[^{]*\{\n(.*?)^\}", text,
                       re.M | re.S)
    return [(re.findall(r"param_[\d.]+: (\w+\[[\d,]*\])", header), body)
            for header, body in found]


@pytest.fixture(scope="module")
def step_ir():
    workload = transformer_encoder_adam(4, 32, VOCABULARY, FEATURES, 4, 2)
    fn, args = workload.make()
    compiled = tl.function(fn)
    loss = compiled(*args)
    reference_fn, reference_args = workload.make()
    expected = tf.function(reference_fn)(*reference_args)
    assert_close(np.asarray(loss), np.asarray(expected), "model gradient", "first loss")
    ir = compiled.experimental_get_compiler_ir(*args)
    return ir(stage="hlo"), ir(stage="optimized_hlo")


def test_backward_kernels_do_not_recompute_the_forward_chain(step_ir) -> None:
    lowered, optimized = step_ir
    parameters = _fusion_parameters(optimized)
    assert parameters, "no fusion formed"
    assert max(len(p) for p in parameters) <= 12
    # No reduction reaches back to the embedding table (the gather's kernel reads it; the
    # optimizer's element-wise updates of the table's variable and slots take arrays of
    # its shape too).
    table = f"f32[{VOCABULARY},{FEATURES}]"
    assert not [body for shapes, body in _fusions(optimized)
                if table in shapes and " reduce(" in body]


def test_the_optimized_step_stays_close_to_the_lowered_one(step_ir) -> None:
    lowered, optimized = step_ir
    # Fused computations repeat their parameters and the cheap producers duplicated
    # into several kernels; the forward chain copied into every backward reduction
    # made this 3.1.
    assert _instructions(optimized) <= 2.2 * _instructions(lowered)
