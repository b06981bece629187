"""Regenerates the golden convolutions: TF's XLA HLO text (`stage='hlo'`) of each case and
TF's XLA result on seeded inputs. Run with TF installed:
`.venv/bin/python tests/hlo/convolution_golden/make_golden.py`."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tensorflow as tf

HERE = Path(__file__).parent


def _cases() -> dict:
    return {
        "conv2d_nhwc_same_stride": (
            lambda x, w: tf.nn.conv2d(x, w, strides=[1, 2, 2, 1], padding="SAME"),
            (1, 5, 6, 3), (3, 3, 3, 4)),
        "conv2d_nchw_dilated": (
            lambda x, w: tf.nn.conv2d(x, w, strides=1, padding="VALID", data_format="NCHW",
                                      dilations=[1, 1, 2, 2]),
            (1, 3, 7, 7), (3, 3, 3, 4)),
        "conv2d_explicit_grouped": (
            lambda x, w: tf.nn.conv2d(x, w, strides=1, padding=[[0, 0], [1, 2], [0, 1], [0, 0]]),
            (2, 5, 5, 4), (2, 2, 2, 6)),
        "depthwise": (
            lambda x, w: tf.nn.depthwise_conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME"),
            (1, 5, 5, 3), (3, 3, 3, 2)),
        "conv3d": (
            lambda x, w: tf.nn.conv3d(x, w, strides=[1, 1, 2, 1, 1], padding="SAME"),
            (1, 4, 5, 5, 2), (2, 3, 3, 2, 3)),
        "conv1d": (lambda x, w: tf.nn.conv1d(x, w, stride=1, padding="SAME"), (2, 9, 3), (3, 3, 4)),
        "backprop_input": (
            lambda x, w: tf.nn.conv2d_transpose(x, w, output_shape=[1, 8, 8, 3], strides=2,
                                                padding="SAME"),
            (1, 4, 4, 5), (3, 3, 3, 5)),
        "backprop_filter": (
            lambda x, dy: tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=[3, 3, 3, 4], out_backprop=dy, strides=[1, 1, 1, 1],
                padding="SAME"),
            (1, 6, 6, 3), (1, 6, 6, 4)),
        "depthwise_backprop_filter": (
            lambda x, dy: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                input=x, filter_sizes=[3, 3, 3, 2], out_backprop=dy, strides=[1, 1, 1, 1],
                padding="SAME"),
            (2, 5, 5, 3), (2, 5, 5, 6)),
    }


def main() -> None:
    rng = np.random.default_rng(21)
    arrays = {}
    for name, (fn, lhs_shape, rhs_shape) in _cases().items():
        lhs = rng.standard_normal(lhs_shape).astype(np.float32)
        rhs = rng.standard_normal(rhs_shape).astype(np.float32)
        compiled = tf.function(fn, jit_compile=True)
        text = compiled.experimental_get_compiler_ir(lhs, rhs)(stage="hlo")
        (HERE / f"{name}.hlo").write_text(text)
        arrays[f"{name}.lhs"], arrays[f"{name}.rhs"] = lhs, rhs
        arrays[f"{name}.out"] = compiled(lhs, rhs).numpy()
    np.savez_compressed(HERE / "tf_results.npz", **arrays)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
