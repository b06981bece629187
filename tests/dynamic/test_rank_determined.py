"""Ops whose output rank is unknown when tracing but decided by the input shapes
(`mark.rank_determined`): a Sum over BroadcastGradientArgs' axes, as in the gradient of a
batched MatMul (a Keras Transformer step with an unknown batch dimension), compiles per
input shape instead of staying in TF, with TF's values for every batch size."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.runtime import loader


def _sum_over_broadcast_axes(x: tf.Tensor) -> tf.Tensor:
    axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x)[:-2], s1=tf.constant([1]))[0]
    return tf.reduce_sum(tf.sin(x), axis=axes) * 2.0


@pytest.mark.parametrize("jit_compile", [True, None], ids=["jit_compile", "auto"])
def test_sum_of_rank_decided_by_shapes_compiles_per_shape(jit_compile) -> None:
    spec = [tf.TensorSpec([None, 3, 4], tf.float32)]
    inner = tl.function(_sum_over_broadcast_axes, jit_compile=jit_compile)
    compiled = tf.function(lambda x: inner(x), input_signature=spec)
    plain = tf.function(_sum_over_broadcast_axes, input_signature=spec)
    assert plain.get_concrete_function().outputs[0].shape.rank is None
    rng = np.random.default_rng(0)
    for batch in (2, 1, 5, 0):
        x = tf.constant(rng.standard_normal((batch, 3, 4)), tf.float32)
        before = loader.launch_timing().launches
        actual = compiled(x).numpy()
        assert loader.launch_timing().launches - before == 1, f"batch {batch}: one launch"
        assert_close(actual, plain(x).numpy(), "Sum", f"batch {batch}")
    (program,) = inner._programs.values()
    assert program.report.jit_compile_fallback is None
    assert "Sum" not in {f.op_type for f in program.report.fallbacks}
