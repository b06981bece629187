"""Shared helpers of the clustering tests: inputs with edge values, and the
trace → mark → cluster → lower → evaluate (→ compile) round trip checked against TF."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering import cluster_graph, lower_cluster
from tfxla_lite.hlo.evaluator import evaluate

try:  # the CPU backend is optional for these tests; TFXLA_LITE_TEST_NO_CODEGEN=1 skips it
    from tfxla_lite.codegen import compile_module
except ImportError:  # pragma: no cover
    compile_module = None
if os.environ.get("TFXLA_LITE_TEST_NO_CODEGEN"):
    compile_module = None

try:
    from tfxla_lite.hlo.verifier import verify
except ImportError:  # pragma: no cover
    verify = None

EDGE_VALUES = (np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0)


def sample(shape: Sequence[int], dtype: Any = np.float32, seed: int = 0, edges: bool = True,
           low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random values of `shape`; floats get NaN, ±inf and ±0.0 at random places."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(int(low) * 3, int(high) * 3 + 1, size=shape).astype(dtype)
    values = rng.uniform(low, high, size=shape).astype(dtype)
    if edges and values.size:
        flat = values.reshape(-1)
        places = rng.permutation(flat.size)[:min(flat.size, len(EDGE_VALUES))]
        flat[places] = np.array(EDGE_VALUES[:len(places)], dtype)
    return values


def trace(fn: Callable[..., Any], args: Sequence[np.ndarray]) -> Any:
    specs = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in args]
    return tf.function(fn).get_concrete_function(*specs)


def run_clusters(concrete: Any, args: Sequence[np.ndarray], compiled: bool = True,
                 min_cluster_size: int = 1) -> tuple[dict[str, np.ndarray],
                                                     dict[str, np.ndarray]]:
    """Evaluate every cluster of the traced function, each on TF-computed inputs.

    Returns (evaluated, compiled) values by output tensor name; `compiled` is empty
    when there is no CPU backend.
    """
    graph = concrete.graph
    result = cluster_graph(graph, min_cluster_size=min_cluster_size)
    feeds = {t.name: a for t, a in zip(graph.inputs, args)}
    # A captured variable's handle: the launch op passes the value the variable holds.
    held = {id(v.handle): v for v in getattr(concrete, "variables", ())}
    for external, internal in graph.captures:
        if id(external) in held:
            feeds[internal.name] = held[id(external)].numpy()
    evaluated: dict[str, np.ndarray] = {}
    executed: dict[str, np.ndarray] = {}
    for cluster in result.clusters:
        module = lower_cluster(graph, cluster)
        if verify is not None:
            verify(module)
        missing = [n for n in cluster.inputs if n not in feeds]
        assert not missing, f"{cluster.name} reads tensors made outside any test input: {missing}"
        inputs = [feeds[n] for n in cluster.inputs]
        values = evaluate(module, *inputs)
        evaluated.update(zip(cluster.outputs, values))
        if compiled and compile_module is not None:
            executable = compile_module(module)
            executed.update(zip(cluster.outputs, executable(*inputs)))
    return evaluated, executed


def tf_result(fn: Callable[..., Any], args: Sequence[np.ndarray], xla: bool = False
              ) -> list[np.ndarray]:
    """`fn`'s outputs as TF's kernels compute them; as TF's XLA does where asked (`xla`)
    or where TF's CPU kernel refuses the arguments (a layout or a stride with a
    dilation it lacks), since must-compile mirrors TF's XLA there."""
    tensors = [tf.constant(a) for a in args]
    if not xla:
        try:
            return [np.asarray(t) for t in tf.nest.flatten(fn(*tensors))]
        except (tf.errors.UnimplementedError, tf.errors.InvalidArgumentError):
            pass
    return [np.asarray(t) for t in tf.nest.flatten(tf.function(fn, jit_compile=True)(*tensors))]


def check_against_tf(fn: Callable[..., Any], args: Sequence[np.ndarray], op_type: str,
                     compiled: bool = True, compare: Callable[..., None] | None = None,
                     expected: Sequence[np.ndarray] | None = None) -> None:
    """Trace `fn`, require `op_type` in it and every output made by a cluster, and
    compare each output with `expected` (default: TF's eager result)."""
    if expected is None:
        expected = [t.numpy() for t in tf.nest.flatten(fn(*[tf.constant(a) for a in args]))]
    concrete = trace(fn, args)
    types = {op.type for op in concrete.graph.get_operations()}
    assert op_type in types, f"{op_type} not in traced graph: {sorted(types)}"
    evaluated, executed = run_clusters(concrete, args, compiled)
    compare = compare or assert_close
    for i, (tensor, want) in enumerate(zip(concrete.graph.outputs, expected, strict=True)):
        assert tensor.name in evaluated, f"output {tensor.name} not made by a cluster"
        compare(evaluated[tensor.name], want, op_type, f"output {i}, evaluator")
        if tensor.name in executed:
            compare(np.asarray(executed[tensor.name]), want, op_type, f"output {i}, compiled")


def over_shapes(fn: Callable[..., Any], arity: int) -> Callable[..., list[Any]]:
    """`fn` applied to consecutive groups of `arity` arguments: one trace, many shapes."""

    def apply_all(*args: Any) -> list[Any]:
        return [fn(*args[i:i + arity]) for i in range(0, len(args), arity)]

    return apply_all


def inputs(shape_groups: Sequence[Sequence[tuple[int, ...]]], dtypes: Sequence[Any],
           edges: bool = True, **kwargs: Any) -> list[np.ndarray]:
    args = []
    for g, shapes in enumerate(shape_groups):
        for k, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            args.append(sample(shape, dtype, seed=10 * g + k, edges=edges, **kwargs))
    return args


def check_in_both_modes(fn: Callable[..., Any], tensors: Sequence[tf.Tensor], op_type: str,
                        compiled_ops: set[str]) -> None:
    """`fn` through `tfxla_lite.function` in auto-clustering and strict must-compile mode:
    every output within `op_type`'s tolerance of TF's, nothing run on TF's XLA, and none
    of `compiled_ops` left in TF."""
    expected = [t.numpy() for t in tf.nest.flatten(fn(*tensors))]
    for jit_compile in (None, True):
        compiled = tl.function(fn, jit_compile=jit_compile,
                               options=tl.Options(min_cluster_size=1, verify=True,
                                                  strict_jit_compile=bool(jit_compile)))
        actual = tf.nest.flatten(compiled(*tensors))
        for got, want in zip(actual, expected, strict=True):
            assert_close(got.numpy(), want, op_type, f"jit_compile={jit_compile}")
        report = compiled.explain(*tensors)
        assert not report.runs_on_xla
        stuck = {f.op_type for f in report.fallbacks}
        assert not stuck & compiled_ops, report
