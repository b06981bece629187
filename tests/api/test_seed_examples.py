"""The seed examples compiled end to end and checked against TensorFlow."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.examples import EXAMPLES
from tfxla_lite.rewrite import LAUNCH_OP_TYPE


def _launch_ops(concrete_function) -> list:
    graph_def = concrete_function.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    return [n for n in nodes if n.op == LAUNCH_OP_TYPE]


# Relative to the largest magnitude of the expected result: the dots accumulate in a
# different order than oneDNN's; the reductions in a different order than Eigen's.
TOLERANCE = {"reduce_sum_fma": 1e-5, "mlp": 1e-5, "gelu": 1e-6, "softmax": 1e-6,
             "self_attention": 1e-5}


@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("jit_compile", [True, None])
def test_seed_example_matches_tensorflow(name: str, jit_compile: bool | None) -> None:
    example = EXAMPLES[name].small()
    inputs = example.inputs(seed=1)
    expected = tf.function(example.fn)(*inputs).numpy()
    compiled = tl.function(example.fn, jit_compile=jit_compile)
    actual = compiled(*inputs)
    assert isinstance(actual, tf.Tensor)
    assert actual.dtype == tf.float32 and actual.shape == expected.shape
    scale = max(float(np.max(np.abs(expected))), 1.0)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=0, atol=TOLERANCE[name] * scale)
    report = tl.explain(compiled, *inputs)
    if jit_compile:
        assert len(report.compiled_clusters) >= 1
    launches = _launch_ops(compiled.get_concrete_function(*inputs))
    assert len(launches) == len(report.compiled_clusters)


def test_reduce_sum_fma_is_one_fused_kernel() -> None:
    example = EXAMPLES["reduce_sum_fma"].small()
    f = tl.function(example.fn, jit_compile=True)
    inputs = example.inputs()
    hlo = f.experimental_get_compiler_ir(*inputs)(stage="optimized_hlo")
    entry = hlo[hlo.index("ENTRY"):]
    assert sum(" fusion(" in line for line in entry.splitlines()) == 1, hlo
    report = tl.explain(f, *inputs)
    assert [c.kernel_count for c in report.compiled_clusters] == [1]


def test_compiler_ir_stages() -> None:
    f = tl.function(EXAMPLES["gelu"].fn, jit_compile=True)
    x = EXAMPLES["gelu"].small().inputs()[0]
    ir = f.experimental_get_compiler_ir(x)
    assert ir(stage="hlo").startswith("HloModule")
    assert "fusion(" in ir(stage="optimized_hlo")
    assert "kind=kLoop" in ir(stage="optimized_hlo")
    assert "temp" in ir(stage="buffer_assignment").lower()
    assert "define" in ir(stage="llvm")
    with pytest.raises(ValueError, match="unknown stage"):
        ir(stage="bogus")


def test_one_program_per_signature() -> None:
    traces = []

    def fn(x):
        traces.append(x.shape)
        return tf.nn.relu(x) * 2.0 + 1.0

    f = tl.function(fn, jit_compile=True)
    for shape in [(4,), (4,), (8, 2), (4,)]:
        x = np.ones(shape, np.float32)
        np.testing.assert_array_equal(f(x).numpy(), np.full(shape, 3.0, np.float32))
    assert len(f._programs) == 2
    assert len(traces) == 2


def test_auto_mode_leaves_small_clusters_to_tensorflow() -> None:
    # As TF's auto-clustering: Mul, AddV2 and Sum make 3 ops, under min_cluster_size=4.
    example = EXAMPLES["reduce_sum_fma"].small()
    inputs = example.inputs()
    auto = tl.function(example.fn)
    report = tl.explain(auto, *inputs)
    assert not report.compiled_clusters
    assert {f.reason for f in report.fallbacks if f.op_type == "Sum"} == {"cluster too small"}
    smaller = tl.function(example.fn, min_cluster_size=3)
    assert len(tl.explain(smaller, *inputs).compiled_clusters) == 1
    np.testing.assert_allclose(smaller(*inputs).numpy(), auto(*inputs).numpy(), rtol=1e-5)


def test_launch_of_a_compiled_cluster_rejects_wrong_shape_and_dtype() -> None:
    from tfxla_lite.runtime import launch

    f = tl.function(EXAMPLES["gelu"].fn, jit_compile=True)
    x = np.linspace(-3, 3, 64).astype(np.float32)
    f(x)
    (node,) = _launch_ops(f.get_concrete_function(x))
    key = node.attr["key"].s.decode()
    good = launch([tf.constant(x)], key, [tf.float32], [(64,)])
    np.testing.assert_allclose(good[0].numpy(), f(x).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="shape"):
        launch([tf.constant(x[:32])], key, [tf.float32], [(64,)])
    with pytest.raises(tf.errors.InvalidArgumentError):
        launch([tf.constant(x.astype(np.float64))], key, [tf.float32], [(64,)])


def test_input_signature_with_unknown_dims_compiles_per_concrete_shape() -> None:
    def fn(x):
        return tf.reduce_sum(tf.nn.relu(x) * 2.0, axis=1)

    f = tl.function(fn, jit_compile=True,
                    input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    for rows in (2, 3, 2):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 5.0
        np.testing.assert_allclose(f(x).numpy(), fn(x).numpy(), rtol=1e-6)
    assert len(f._programs) == 2
    with pytest.raises(TypeError, match="Can not cast"):  # TF's own error
        f(np.ones((2, 5), np.float32))
