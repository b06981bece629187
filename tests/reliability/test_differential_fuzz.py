"""Differential fuzzing against TF: random graphs over the op registry, run as plain
`tf.function` (the oracle) and under `tfxla_lite.function` in both modes.

Each value of a graph is compared where the op that made it saw bit-identical inputs in
both runs (an earlier op's last-ulp difference may be amplified by a later one, which
says nothing about the later op), through `tests/tolerances.assert_close` with the op's
own tolerance. Must-compile runs with `strict_jit_compile`, so a refusal is a failure
rather than a silent run on TF's XLA. What differs by XLA's documented semantics
(docs/supported_ops.md, "Semantics that differ from TF") is excluded by `_xla_semantics`,
each case with its reason; a graph TF itself refuses (integer division by zero) is
skipped, as XLA defines a value there. Failures shrink to a reproducer
(`RandomGraph.describe`).

CI runs a bounded slice (`--slow-slice`, a few hundred graphs over the dtype groups,
seeded by the day); `TFXLA_LITE_FUZZ_EXAMPLES=N` runs N graphs per group.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from graph_strategy import FLOATS, INTS, OP_SPECS, RandomGraph, random_graphs
from hypothesis import HealthCheck, given, note, seed, settings
from tolerances import assert_close

import tfxla_lite as tl
from tfxla_lite.clustering.registry import OP_RULES
from tfxla_lite.clustering.rules_variables import VARIABLE_OPS

_EXAMPLES = int(os.environ.get("TFXLA_LITE_FUZZ_EXAMPLES", "40"))
_DAY = datetime.date.today().toordinal()

# Registered ops the random graphs do not build, and where each is tested against TF.
NOT_FUZZED = {
    "Const": "every graph's attributes are Consts",
    "InTopKV2": "targets index the predictions' classes: tests/clustering/test_training_ops.py",
    **{op: "needs operands of related shapes: tests/clustering (dot, einsum tests)" for op in (
        "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum")},
    **{op: "convolutions: tests/clustering and tests/hlo/test_convolution.py" for op in (
        "Conv2D", "Conv3D", "DepthwiseConv2dNative")},
    **{op: "convolution gradients, sizes from a ShapeN: tests/clustering/"
           "test_conv_gradients.py" for op in (
        "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2",
        "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter", "ShapeN")},
    "ConcatOffset": "shape operands folded at compile time: tests/clustering/"
                    "test_conv_gradients.py",
    **{op: "pooling: windows over rank-4/5 inputs, ties, NaN and gradients in "
           "tests/clustering/test_pooling.py" for op in (
        "MaxPool", "MaxPoolV2", "MaxPool3D", "AvgPool", "AvgPool3D", "MaxPoolGrad",
        "MaxPoolGradV2", "MaxPool3DGrad", "AvgPoolGrad", "AvgPool3DGrad", "MaxPoolGradGrad",
        "MaxPoolGradGradV2", "MaxPool3DGradGrad")},
    **{op: "batch norm: per-feature statistics of rank-4/5 inputs, every output and the "
           "gradients in tests/clustering/test_batch_norm.py" for op in (
        "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGrad",
        "FusedBatchNormGradV2", "FusedBatchNormGradV3")},
    **{op: "gradient plumbing made by tf.GradientTape: tests/api/test_gradients.py" for op in (
        "BiasAddGrad", "BroadcastGradientArgs", "StridedSliceGrad", "PreventGradient",
        "IdentityN", "InvertPermutation", "DynamicStitch")},
    **{op: "index operands of related shapes: tests/clustering (indexing tests)" for op in (
        "Gather", "GatherNd", "ScatterNd", "TensorScatterAdd", "TensorScatterMax",
        "TensorScatterMin", "TensorScatterUpdate")},
    **{op: "variables: state across calls, aliasing and order against TF in "
           "tests/runtime/test_variables.py" for op in sorted(VARIABLE_OPS)},
    **{op: "losses with label operands: tests/clustering (nn tests)" for op in (
        "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits")},
    **{op: "static-shape builders without a tensor operand: tests/clustering" for op in (
        "Fill", "Range", "SplitV", "BiasAddV1")},
    **{op: "seeded draws, bit for bit against TF over shapes, seeds, counters and dtypes: "
           "tests/clustering/test_random_ops.py" for op in (
        "StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg",
        "StatelessRandomUniformV2", "StatelessRandomUniformIntV2",
        "StatelessRandomUniformFullIntV2", "StatelessRandomUniform",
        "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
        "StatelessRandomNormalV2", "StatelessRandomNormal")},
    **{op: "functional control flow and TensorLists, built from FunctionDefs and list handles: "
           "tests/clustering/test_control_flow_lowering.py" for op in (
        "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
        "EmptyTensorList", "TensorListReserve", "TensorListFromTensor", "TensorListSetItem",
        "TensorListGetItem", "TensorListPushBack", "TensorListPopBack", "TensorListStack",
        "TensorListLength", "TensorListElementShape", "VariableShape")},
    **{op: "image resizes and their gradients, sizes and pixel rules as operands or attributes: "
           "tests/clustering/test_resize.py" for op in (
        "ResizeBilinear", "ResizeBilinearGrad", "ResizeNearestNeighbor",
        "ResizeNearestNeighborGrad", "ResizeBicubic", "ResizeBicubicGrad")},
    **{op: "block shapes, paddings and crops of related sizes: "
           "tests/clustering/test_space_to_batch.py" for op in (
        "SpaceToBatchND", "BatchToSpaceND", "SpaceToDepth", "DepthToSpace")},
    **{op: "matrices of related shapes (positive definite, triangular), and bit casts between "
           "dtype pairs: tests/clustering/test_rules_linalg.py" for op in (
        "Cholesky", "MatrixTriangularSolve", "Bitcast")},
}

_INT_DIVISION = frozenset({"Div", "FloorDiv", "TruncateDiv", "FloorMod", "TruncateMod"})


def _xla_semantics(op_type: str, inputs: list[np.ndarray], output: np.ndarray) -> str | None:
    """Why `op_type` on `inputs` may legitimately give XLA's value rather than TF's kernel's
    (docs/supported_ops.md's semantics table), or None when the values must agree."""
    first = inputs[0]
    kind = first.dtype.kind
    if op_type in _INT_DIVISION and kind in "iu":
        # TF raises on a zero divisor (skipped before we get here) and its kernels are
        # undefined behaviour on INT_MIN / -1; XLA defines both.
        divisor = np.broadcast_to(inputs[1], np.broadcast_shapes(first.shape, inputs[1].shape))
        if (divisor == -1).any() or (divisor == 0).any():
            return "integer division by zero or INT_MIN / -1: XLA's value"
    if op_type == "Cast" and _is_float(first) and output.dtype.kind in "iub":
        info_ok = np.isfinite(first.astype(np.float64)).all()
        if not info_ok or output.dtype.kind in "iu" and (
                np.abs(first.astype(np.float64)) >= np.iinfo(output.dtype).max).any():
            return "cast of NaN, inf or an out-of-range float to an integer saturates in XLA"
    if op_type == "Pow" and kind in "iu":
        return "integer Pow: negative exponents and overflow are XLA's"
    if op_type == "Mean" and kind in "iu":
        return "integer Mean over an empty axis is 0 / 0 = -1 in XLA"
    if op_type == "Softmax" and _is_float(first) and np.isnan(first.astype(np.float64)).any():
        return "Softmax of a row holding NaN: TF's oneDNN kernel zeroes the rest of the row"
    if op_type in ("TopKV2", "ArgMax", "ArgMin") and _is_float(first) \
            and np.isnan(first.astype(np.float64)).any():
        return "order of NaN: XLA's total order"
    if op_type in ("Sum", "Mean", "Prod", "Cumsum", "Cumprod", "L2Loss", "AddN", "MatMul",
                   "BiasAdd", "UnsortedSegmentSum", "UnsortedSegmentProd", "CumulativeLogsumexp",
                   "Softmax", "LogSoftmax") and first.dtype.itemsize == 2 and _is_float(first):
        return "2-byte float accumulation: XLA sums in float32, TF's kernels in the 2-byte type"
    if op_type in ("Abs", "Neg", "Square", "Mul", "Add", "AddV2", "Sub", "SquaredDifference",
                   "Sum", "Prod", "Cumsum", "Cumprod", "AddN", "MatMul", "BiasAdd",
                   "UnsortedSegmentSum", "UnsortedSegmentProd", "Sign") and kind in "iu":
        extremes = [np.iinfo(first.dtype).min, np.iinfo(first.dtype).max]
        if any(np.isin(x, extremes).any() for x in inputs if x.dtype.kind in "iu"):
            return "signed integer overflow: both wrap, but TF's kernels are undefined there"
    return None


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not _is_float(a):
        return bool((a == b).all())
    wa, wb = a.astype(np.float64), b.astype(np.float64)
    same = (wa == wb) & (np.signbit(wa) == np.signbit(wb)) | (np.isnan(wa) & np.isnan(wb))
    return bool(same.all())


def _run(fn, inputs: list[np.ndarray]) -> list[np.ndarray] | tf.errors.OpError:
    try:
        return [np.asarray(v.numpy()) for v in fn(*[tf.constant(a) for a in inputs])]
    except tf.errors.OpError as error:  # TF's Truncate* divisions raise InternalError
        return error


def check_graph(graph: RandomGraph) -> None:
    """Run `graph` as plain TF and under tfxla-lite in both modes; compare op by op."""
    note(graph.describe())
    fn = graph.function()
    expected = _run(tf.function(fn), graph.inputs)
    if isinstance(expected, tf.errors.OpError):
        return  # TF refuses these values (an integer divided by zero): XLA defines one
    auto = tl.function(fn, min_cluster_size=1)
    strict = tl.function(fn, jit_compile=True, options=tl.Options(strict_jit_compile=True))
    for mode, compiled in (("auto", auto), ("jit_compile", strict)):
        actual = _run(compiled, graph.inputs)
        assert not isinstance(actual, tf.errors.OpError), f"{mode}: raised {actual}"
        _compare(graph, actual, expected, mode)


def _compare(graph: RandomGraph, actual: list[np.ndarray], expected: list[np.ndarray],
             mode: str) -> None:
    count = len(graph.inputs)
    ours, theirs = list(graph.inputs) + actual, list(graph.inputs) + expected
    for k, (op_type, _, operands) in enumerate(graph.steps):
        index = count + k
        if not all(_identical(ours[i], theirs[i]) for i in operands):
            continue  # an earlier op differed within its tolerance: not this op's doing
        inputs = [theirs[i] for i in operands]
        if _xla_semantics(op_type, inputs, theirs[index]) is not None:
            continue
        assert_close(ours[index], theirs[index], op_type, f"{mode}, v{index}")


_GROUPS = {"f32_f64": ("float32", "float64"), "f16_bf16": ("float16", "bfloat16"),
           "int": INTS, "bool": ("bool",), "mixed": FLOATS + INTS + ("bool",)}


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(_GROUPS))
def test_random_graphs_match_tf(group: str, cache_root: Path) -> None:
    @seed(_DAY * 7 + sorted(_GROUPS).index(group))
    @settings(max_examples=_EXAMPLES, deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(random_graphs(_GROUPS[group]))
    def fuzz(graph: RandomGraph) -> None:
        check_graph(graph)

    fuzz()


def test_every_registered_op_is_fuzzed_or_listed() -> None:
    """A new lowering joins the fuzzer (graph_strategy.OP_SPECS) or says where it is tested."""
    fuzzed = {spec.op_type for spec in OP_SPECS}
    missing = set(OP_RULES) - fuzzed - set(NOT_FUZZED)
    assert not missing, f"registered ops neither fuzzed nor listed in NOT_FUZZED: {missing}"
    assert not fuzzed & set(NOT_FUZZED)
