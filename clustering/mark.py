"""Marking: which ops of a traced TF graph may be compiled, and why each other one may not.

The first step of clustering (mark → cluster → lower). Every op gets a `Decision`;
the reasons are the ones a user reads in `tfxla_lite.explain` and in must-compile
errors, so each names the op type, dtype, input or device at fault. The checks follow
TF's mark_for_compilation_pass in spirit: a registered lowering, supported dtypes,
fully static shapes, compile-time constants where the lowering needs values, no
state, no resources, a device we compile for.

With `MarkOptions(dynamic_shapes=True)` (docs/architecture.md, "Unknown dimensions")
shapes need only a known rank, and a value the lowering needs may also be one that
only the shapes determine (`shape_determined`: Shape → StridedSlice → Pack ...): the
cluster is compiled at run time for each concrete input shape, when those are
constants. The op's own check then runs only where it can (an exception on an
unknown dimension defers it to that compilation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfxla_lite.clustering.control_flow_ops import HANDLE_OPS, VARIANT_OPS
from tfxla_lite.clustering.registry import (
    OP_RULES,
    OpRule,
    constant_value,
    known_dims,
    source_frames,
)
from tfxla_lite.clustering.rules_conv_cost import tf_kernel_faster
from tfxla_lite.clustering.rules_linalg import LINALG_OPS, tf_linalg_faster
from tfxla_lite.clustering.rules_pool import MAX_POOL_GRAD_TF_KERNEL_OPS, tf_max_pool_grad_faster
from tfxla_lite.clustering.rules_resize import RESIZE_TF_KERNEL_OPS, tf_resize_faster
from tfxla_lite.clustering.rules_variables import VARIABLE_OPS

if TYPE_CHECKING:
    import tensorflow as tf

# Ops that move arguments and variables around. Must-compile mode tolerates these
# staying outside clusters; everything else that cannot compile is an error there.
PLUMBING_OPS = frozenset({
    "Placeholder", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "VarHandleOp", "Identity", "IdentityN", "NoOp",
})
# Plumbing that never joins a cluster, whatever its dtype (Identity can compile; the
# variable ops of rules_variables.py can, when their variables have static shapes).
NEVER_CLUSTERED = PLUMBING_OPS - {"Identity", "IdentityN"} - VARIABLE_OPS

PLUMBING_REASON = "argument/variable plumbing"
# TF's kernel is faster than tfxla-lite's for the op's shape (`MarkOptions.tf_kernels`).
TF_KERNEL_REASON = "runs on TF's kernel, faster than tfxla-lite's for its shape"
_TF_KERNEL_HOW = " (rules_conv_cost.py; --compile_convolutions compiles it)"
_TF_LINALG_HOW = " (rules_linalg.py; jit_compile=True compiles it)"
_TF_POOL_HOW = " (rules_pool.py; jit_compile=True compiles it)"
_TF_RESIZE_REASON = ("runs on TF's kernel, faster than tfxla-lite's for its shape "
                     "(rules_resize.py; jit_compile=True compiles it)")
RESOURCE_REASON = "resource op / variable plumbing"
STATEFUL_REASON = "stateful op"
# Auto mode checks an assertion in TF, as plain TF does; must-compile leaves it out, as
# TF's XLA does (tfxla_lite/assertions.py).
ASSERT_REASON = "assertion: checked in TF (jit_compile=True compiles it away, as TF's XLA does)"
VARIANT_REASON = "variant op (TensorList, dataset, optional)"
# tf.distribute's cross-replica communication: it synchronizes devices, so it stays in TF
# between the per-replica clusters.
COLLECTIVE_REASON = "collective communication op (tf.distribute)"
_COLLECTIVE_PREFIXES = ("Collective", "NcclAllReduce", "NcclReduce", "NcclBroadcast")


@dataclass(frozen=True)
class MarkOptions:
    """What marking accepts. `device_types`: TF device types we compile for (an op
    explicitly placed elsewhere stays in TF); `denylist`: op types never compiled;
    `allowlist`: when set, the only op types compiled."""

    device_types: frozenset[str] = frozenset({"CPU", "GPU"})
    denylist: frozenset[str] = field(default_factory=frozenset)
    # When set, only these op types may compile (TFXLA_LITE_FLAGS=--ops_to_cluster).
    allowlist: frozenset[str] | None = None
    dynamic_shapes: bool = False
    # Op types whose ops stay on TF's own kernels where those are faster for the op's
    # shape (convolutions: oneDNN, rules_conv_cost.py, unless `compile_convolutions`;
    # Cholesky, MatrixTriangularSolve: rules_linalg.py, in auto-clustering only).
    tf_kernels: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Decision:
    """Whether one op may join a cluster; `reason` says why not, `source` is 'file:line'."""

    op_name: str
    op_type: str
    compilable: bool
    reason: str | None = None
    source: str | None = None


def device_type(device: str) -> str | None:
    """'GPU' for '/job:localhost/replica:0/task:0/device:GPU:0', None for ''."""
    if not device:
        return None
    for part in device.split("/"):
        if part.lower().startswith("device:"):
            return part.split(":")[1].upper()
        if part.lower().startswith(("cpu:", "gpu:")):
            return part.split(":")[0].upper()
    return None


def why_not_compilable(op: tf.Operation, options: MarkOptions | None = None) -> str | None:
    """The reason `op` cannot be compiled, or None when it can."""
    options = options or MarkOptions()
    if op.type in NEVER_CLUSTERED:
        return PLUMBING_REASON
    if op.type.startswith(_COLLECTIVE_PREFIXES):
        return COLLECTIVE_REASON
    if op.type in options.denylist:
        return f"op type {op.type} is on the denylist"
    if options.allowlist is not None and op.type not in options.allowlist:
        return f"op type {op.type} is not in --ops_to_cluster"
    tensors = list(op.inputs) + list(op.outputs)
    dtypes = {t.dtype.base_dtype.name for t in tensors}
    variable_op = op.type in VARIABLE_OPS  # stateful, on resources: rules_variables.py
    if "resource" in dtypes and not variable_op and op.type not in HANDLE_OPS:
        return RESOURCE_REASON
    # TensorLists and functional control flow: their rules lower lists as (buffer, length)
    # and check the functions' ops (clustering/rules_control_flow.py).
    lists = op.type in VARIANT_OPS
    if "variant" in dtypes and not lists:
        return VARIANT_REASON
    if op.type == "Assert":
        return ASSERT_REASON
    rule = OP_RULES.get(op.type)
    if rule is None:
        if _is_stateful(op):
            return STATEFUL_REASON
        return f"op type {op.type} has no lowering"
    # Functional control flow: by its functions' ops; variable ops: rules_variables.py.
    if _is_stateful(op) and op.type not in HANDLE_OPS and not variable_op:
        return STATEFUL_REASON
    kind = device_type(op.device)
    if kind is not None and kind not in options.device_types:
        return f"placed on device {op.device}"
    value_free = rule.value_free_indices(op)
    lists_ok = frozenset({"variant"}) if lists else frozenset()
    for i, t in enumerate(op.inputs):
        if i not in value_free and t.dtype.base_dtype.name not in rule.dtypes | lists_ok:
            return f"dtype {t.dtype.name} not supported by {op.type}"
    for t in op.outputs:
        if t.dtype.base_dtype.name not in rule.dtypes | lists_ok:
            return f"dtype {t.dtype.name} not supported by {op.type}"
    reason = _why_not_by_shapes_or_rule(op, rule, options)
    if reason is None and op.type in RESIZE_TF_KERNEL_OPS and op.type in options.tf_kernels:
        return f"op type {op.type} {_TF_RESIZE_REASON}" if tf_resize_faster(op) else None
    if reason is None and op.type in options.tf_kernels:
        # Last, and by shape: a grouped convolution (no TF CPU kernel) is never left to TF.
        if op.type in LINALG_OPS:
            if tf_linalg_faster(op):
                return f"op type {op.type} {TF_KERNEL_REASON}{_TF_LINALG_HOW}"
        elif op.type in MAX_POOL_GRAD_TF_KERNEL_OPS:
            if tf_max_pool_grad_faster(op):
                return f"op type {op.type} {TF_KERNEL_REASON}{_TF_POOL_HOW}"
        elif tf_kernel_faster(op):
            return f"op type {op.type} {TF_KERNEL_REASON}{_TF_KERNEL_HOW}"
    return reason


def _why_not_by_shapes_or_rule(op: tf.Operation, rule: OpRule, options: MarkOptions
                               ) -> str | None:
    dynamic = options.dynamic_shapes
    for i in rule.static_input_indices(op):
        if constant_value(op.inputs[i]) is None and not (dynamic
                                                         and shape_determined(op.inputs[i])):
            return f"input {i} must be a constant"
    if dynamic:
        return _why_not_dynamic(op, rule)
    for i, t in enumerate(op.outputs):
        if known_dims(t) is None:
            return f"shape of output {i} not fully static"
    for i, t in enumerate(op.inputs):
        if known_dims(t) is None:
            return f"shape of input {i} not fully static"
    if rule.check is not None:
        return rule.check(op)
    return None


def _why_not_dynamic(op: tf.Operation, rule: OpRule) -> str | None:
    """The shape checks of dynamic mode: known ranks, and the values that decide an
    output's shape (Reshape's shape) known once the input shapes are."""
    for i, t in enumerate(op.outputs):
        if known_dims(t) is None and not rank_determined(t):
            return f"rank of output {i} unknown"
    for i, t in enumerate(op.inputs):
        if known_dims(t) is None and not rank_determined(t):
            return f"rank of input {i} unknown"
    if any(known_dims(t) is None for t in op.outputs):
        for i in rule.value_free_indices(op):
            t = op.inputs[i]
            if t.dtype.base_dtype.name in _SHAPE_DTYPES and not shape_determined(t):
                return f"input {i} decides an output shape but is not derived from shapes"
    if rule.check is None:
        return None
    try:
        return rule.check(op)
    except Exception:  # noqa: BLE001 - the check needs static dims: it runs when compiling
        return None


_SHAPE_DTYPES = frozenset({"int32", "int64"})
# Ops whose value is a function of their inputs' shapes alone.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# Set on a loop body's or branch's integer argument whose value outside is
# shape-determined and that the loop never changes (tfxla_lite/control_flow.py): inside
# the body it is as good as the Shape it came from.
SHAPE_DETERMINED_ATTR = "_tfxla_lite_shape_determined"
# Set on a gradient loop body's TensorList argument whose forward loop pushed only
# shape-determined values (while_v2 keeps the shapes a gradient needs that way): what
# the body pops from it is a shape, value-keyed like one.
SHAPE_LIST_ATTR = "_tfxla_lite_shape_list"
_LIST_READS = frozenset({"TensorListPopBack", "TensorListGetItem"})


def rank_determined(tensor: tf.Tensor, _seen: dict[str, bool] | None = None) -> bool:
    """Whether `tensor`'s rank is known once the shapes of the graph's inputs are: a
    known rank, or an output of a stateless, lowerable op whose inputs' ranks are so
    determined and whose values that decide shapes (a Sum's axes from
    BroadcastGradientArgs) are shape-determined; compiled per shape, it is static."""
    if tensor.shape.rank is not None:
        return True
    seen = {} if _seen is None else _seen
    if tensor.name not in seen:
        seen[tensor.name] = False
        op = tensor.op
        rule = OP_RULES.get(op.type)
        seen[tensor.name] = (
            rule is not None and not _is_stateful(op)
            and all(rank_determined(t, seen) for t in op.inputs)
            and all(shape_determined(op.inputs[i]) for i in rule.value_free_indices(op)
                    if op.inputs[i].dtype.base_dtype.name in _SHAPE_DTYPES))
    return seen[tensor.name]


def shape_determined(tensor: tf.Tensor, _seen: dict[str, bool] | None = None) -> bool:
    """Whether `tensor`'s value is known once the shapes of the graph's inputs are: a
    compile-time constant, a Shape/Size/Rank of a tensor of known rank, or a stateless,
    lowerable integer op of such values."""
    seen = {} if _seen is None else _seen
    if tensor.name in seen:
        return seen[tensor.name]
    seen[tensor.name] = False  # no cycles in a graph, but be safe
    op = tensor.op
    if tensor.dtype.base_dtype.name not in _SHAPE_DTYPES | {"bool"}:
        result = False
    elif op.type == "Placeholder" and SHAPE_DETERMINED_ATTR in op.node_def.attr:
        result = True
    elif op.type in _LIST_READS and _is_shape_list(op.inputs[0]):
        result = True
    elif op.type in _SHAPE_OPS:
        result = all(t.shape.rank is not None for t in op.inputs)
    elif constant_value(tensor) is not None:
        result = True
    else:
        rule = OP_RULES.get(op.type)
        result = (rule is not None and not _is_stateful(op)
                  and all(shape_determined(t, seen) for i, t in enumerate(op.inputs)
                          if i not in rule.value_free_indices(op)))
    seen[tensor.name] = result
    return result


def _is_shape_list(handle: tf.Tensor) -> bool:
    """Whether TensorList `handle` is (a pop away from) a placeholder of SHAPE_LIST_ATTR."""
    op = handle.op
    while op.type in _LIST_READS and op.inputs:
        op = op.inputs[0].op
    return op.type == "Placeholder" and SHAPE_LIST_ATTR in op.node_def.attr


def _is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):  # an op without an OpDef (a function call)
        return True


def format_source(op: tf.Operation) -> str | None:
    """'file:line' of the user's frame that made `op`, with the library frame that made it
    for the user when there is one: 'model.py:12 (via keras/src/ops/nn.py:1539)'."""
    return str(source_frames(op)) or None


def mark(graph: tf.Graph, options: MarkOptions | None = None) -> dict[str, Decision]:
    """A Decision for every op of `graph`, keyed by op name, in the graph's op order."""
    options = options or MarkOptions()
    decisions: dict[str, Decision] = {}
    for op in graph.get_operations():
        reason = why_not_compilable(op, options)
        decisions[op.name] = Decision(op.name, op.type, reason is None, reason,
                                      format_source(op))
    return decisions
