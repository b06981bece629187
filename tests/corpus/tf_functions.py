"""The corpus: small `tf.function`s whose HLO, as TF's own XLA prints it, the parser reads.

Each case names its inputs (dtype, shape) and the tolerance-table entry its numerics
are compared under. Cases listed in `EXPECTED_GAPS` lower to opcodes tfxla-lite does
not implement yet; the tests check that they parse and fail with an error naming
the opcode, so the coverage gap stays visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

F32 = "float32"
S32 = "int32"
PRED = "bool"


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: tuple[tuple[str, tuple[int, ...]], ...]
    tolerance: str = "Sum"  # an entry of tests/tolerances.py


def _layer_norm(x: Any) -> Any:
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-5)


CASES: tuple[Case, ...] = (
    # XLA contracts x * y + x into a fused multiply-add: not bit-exact, hence "Sum".
    Case("elementwise_chain", lambda x, y: x * y + x - y * 0.5, ((F32, (4, 8)), (F32, (4, 8)))),
    Case("broadcast_bias", lambda x, b: x + b, ((F32, (4, 8)), (F32, (8,))), "AddV2"),
    Case("broadcast_outer", lambda x, y: x[:, None] * y[None, :], ((F32, (5,)), (F32, (3,))),
         "Mul"),
    Case("unary_chain", lambda x: tf.tanh(tf.exp(-tf.abs(x))) + tf.sqrt(tf.abs(x) + 1.0),
         ((F32, (3, 7)),)),
    Case("reduce_sum_rows", lambda x: tf.reduce_sum(x, axis=1), ((F32, (6, 9)),)),
    Case("reduce_sum_fused", lambda x, y, z: tf.reduce_sum(x + y * z),
         ((F32, (4, 8)), (F32, (4, 8)), (F32, (4, 8)))),
    Case("reduce_max_min", lambda x: (tf.reduce_max(x, axis=0), tf.reduce_min(x, axis=1)),
         ((F32, (5, 6)),), "Max"),
    Case("reduce_mean", lambda x: tf.reduce_mean(x, axis=[0, 2]), ((F32, (2, 3, 4)),)),
    Case("softmax", lambda x: tf.nn.softmax(x), ((F32, (4, 16)),), "Softmax"),
    Case("log_softmax", lambda x: tf.nn.log_softmax(x), ((F32, (3, 10)),), "LogSoftmax"),
    Case("matmul", lambda a, b: a @ b, ((F32, (4, 8)), (F32, (8, 5))), "MatMul"),
    Case("matmul_transposed", lambda a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True),
         ((F32, (8, 4)), (F32, (5, 8))), "MatMul"),
    Case("batch_matmul", lambda a, b: tf.linalg.matmul(a, b),
         ((F32, (3, 4, 8)), (F32, (3, 8, 2))), "MatMul"),
    Case("relu_mlp", lambda x, w1, b1, w2: tf.nn.relu(x @ w1 + b1) @ w2,
         ((F32, (4, 6)), (F32, (6, 8)), (F32, (8,)), (F32, (8, 3))), "MatMul"),
    Case("transpose_reshape", lambda x: tf.reshape(tf.transpose(x, [2, 0, 1]), [4, 6]),
         ((F32, (2, 3, 4)),), "Transpose"),
    Case("casts", lambda x, i: (tf.cast(x, tf.int32), tf.cast(i, tf.float32) * 1.5,
                                tf.cast(x > 0, tf.float32)),
         ((F32, (3, 4)), (S32, (3, 4))), "Cast"),
    Case("compare_select", lambda x, y: tf.where(x > y, x, y * 2.0),
         ((F32, (4, 5)), (F32, (4, 5))), "SelectV2"),
    Case("bool_logic", lambda x, y, p: tf.logical_or(tf.logical_and(x < y, p), tf.equal(x, y)),
         ((F32, (6,)), (F32, (6,)), (PRED, (6,))), "LogicalAnd"),
    Case("layer_norm", _layer_norm, ((F32, (4, 12)),)),
    Case("gelu", lambda x: tf.nn.gelu(x, approximate=False), ((F32, (5, 5)),), "Erf"),
    Case("clip_square", lambda x: tf.square(tf.clip_by_value(x, -1.0, 1.0)), ((F32, (4, 4)),),
         "Square"),
    Case("concat_slice", lambda x, y: tf.concat([x, y], axis=1)[:, 1:7:2],
         ((F32, (3, 4)), (F32, (3, 5))), "ConcatV2"),
    Case("int_arithmetic", lambda i, j: (i * j + 3, tf.maximum(i, j) - tf.abs(j)),
         ((S32, (4, 4)), (S32, (4, 4))), "Mul"),
    Case("one_hot", lambda i: tf.one_hot(i, 5), ((S32, (6,)),), "OneHot"),
    # Lower to reverse, pad, gather, reduce-window and a variadic reduce.
    Case("reverse", lambda x: tf.reverse(x, [1]), ((F32, (3, 4)),), "ReverseV2"),
    Case("pad", lambda x: tf.pad(x, [[1, 0], [0, 2]]), ((F32, (3, 4)),), "Pad"),
    Case("gather", lambda x, i: tf.gather(x, i), ((F32, (5, 3)), (S32, (4,))), "GatherV2"),
    Case("cumsum", lambda x: tf.cumsum(x, axis=1), ((F32, (3, 6)),), "Cumsum"),
    Case("argmax", lambda x: tf.argmax(x, axis=1, output_type=tf.int32), ((F32, (4, 7)),),
         "ArgMax"),
)
