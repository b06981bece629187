"""`tfxla-lite coverage`: FLOPs estimates per op, and the command on a small script,
beside TF's own auto-clustering read from its mark_for_compilation dumps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import tensorflow as tf

from tfxla_lite.coverage import op_flops

SCRIPT = '''
import numpy as np, tensorflow as tf
v = tf.Variable(tf.ones((8, 8)))

@tf.function
def step(x):
    y = tf.nn.relu(x @ v) * 2.0 + 1.0
    v.assign_add(tf.reduce_mean(y) * tf.ones((8, 8)) * 0.01)
    return tf.reduce_sum(tf.tanh(y))

for _ in range(2):
    print(float(step(np.ones((4, 8), np.float32))))
'''


def test_flops_estimates() -> None:
    def fn(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        product = tf.matmul(a, b, transpose_a=True)  # (5, 3) from (4, 5) and (4, 3)
        return tf.reduce_sum(tf.tanh(product)), tf.reshape(product, [15])

    graph = tf.function(fn).get_concrete_function(
        tf.TensorSpec((4, 5)), tf.TensorSpec((None, 3))).graph
    flops = {op.type: op_flops(op, assumed_dim=4) for op in graph.get_operations()}
    assert flops["MatMul"] == 2 * 5 * 3 * 4
    assert flops["Tanh"] == 15 and flops["Sum"] == 15
    assert flops["Reshape"] == 0 and flops["Placeholder"] == 0


def test_coverage_command(tmp_path: Path) -> None:
    script = tmp_path / "small.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TFXLA_LITE_FLAGS"}
    completed = subprocess.run([sys.executable, "-m", "tfxla_lite", "coverage", "--json",
                                str(script)], capture_output=True, text=True, env=env,
                               timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = json.loads(completed.stdout)
    [function] = result["functions"]
    assert function["ops_compiled"] >= 5
    assert function["ops_compiled"] + function["ops_left"] == 9
    assert function["flops_compiled"] >= 2 * 4 * 8 * 8
    assert all(":" in reason for reason in function["left_out"])
    tf_side = result["tf_auto_clustering"]
    assert tf_side["error"] is None and tf_side["graphs"] >= 1
    assert tf_side["ops_clustered"] > 0 and tf_side["clusters"] >= 1


def test_flops_of_convolutions_and_pooling() -> None:
    """Convolutions and each backprop at 2 FLOPs per multiply-add of the forward
    convolution; pooling and its gradients by window size."""

    def fn(x: tf.Tensor, w: tf.Tensor, d: tf.Tensor) -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            tape.watch([x, w, d])
            y = tf.nn.conv2d(x, w, 1, "SAME")  # (2, 8, 8, 6)
            z = tf.nn.depthwise_conv2d(y, d, [1, 1, 1, 1], "SAME")  # (2, 8, 8, 12)
            pooled = tf.nn.max_pool2d(z, 2, 2, "VALID") + tf.nn.avg_pool2d(z, 2, 2, "VALID")
            loss = tf.reduce_sum(pooled)
        return tape.gradient(loss, [x, w, d])

    graph = tf.function(fn).get_concrete_function(
        tf.TensorSpec((2, 8, 8, 3)), tf.TensorSpec((3, 3, 3, 6)),
        tf.TensorSpec((3, 3, 6, 2))).graph
    flops = {op.type: op_flops(op) for op in graph.get_operations()}
    conv = 2 * (2 * 8 * 8 * 6) * 3 * 3 * 3
    depthwise = 2 * (2 * 8 * 8 * 12) * 3 * 3
    assert flops["Conv2D"] == flops["Conv2DBackpropFilter"] == conv
    assert flops["Conv2DBackpropInput"] == conv
    assert flops["DepthwiseConv2dNative"] == depthwise
    assert flops["DepthwiseConv2dNativeBackpropInput"] == depthwise
    assert flops["DepthwiseConv2dNativeBackpropFilter"] == depthwise
    pooled = 2 * 4 * 4 * 12
    assert flops["MaxPool"] == flops["AvgPool"] == pooled * 4
    assert flops["MaxPoolGrad"] == flops["AvgPoolGrad"] == pooled * 4
