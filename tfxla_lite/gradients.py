"""Gradients of compiled clusters: what TF's autodiff finds for a `TfxlaLiteLaunch` node.

Where it sits: the graph rewrite (`tfxla_lite/rewrite.py`) gives every launch node its
cluster's own TF ops (`ORIGINAL_ATTR`: a GraphDef over placeholders for the launch
inputs, and `ORIGINAL_OUTPUTS_ATTR`: which of its tensors are the launch outputs), as
TF's XlaLaunch names its cluster's function. When TF differentiates a graph holding a
launch node (`tf.GradientTape` around a compiled call, eager or inside another
`tf.function`; `tf.gradients`; the forward and backward functions TF derives for a
concrete function), the gradient registered for the op type (`tfxla_lite/api.py`,
where `tfxla_lite.function` lives) calls a `LaunchGradient`: it imports those ops
again over the launch's inputs and differentiates them with TF's own gradient rules.
That function is itself a tfxla-lite function, so the backward pass is clustered and
compiled; its launch nodes carry their clusters' ops in turn, which is what makes
second and higher derivatives (and `tape.jacobian`, `ForwardAccumulator` over a
backward pass) work the same way.

The cluster's forward values are recomputed inside the backward cluster, fused with
the gradient's ops, instead of being kept from the forward launch (XLA's
rematerialization, chosen here for every cluster): the forward launch stays one kernel
set with no extra outputs, at the cost of the forward's arithmetic once more in the
backward pass. A GPU cluster's nodes (EagerPyFunc) are not launch nodes and have no
such gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfxla_lite.rewrite import ORIGINAL_ATTR, ORIGINAL_INPUT_PREFIX, ORIGINAL_OUTPUTS_ATTR

__all__ = ["LaunchGradient", "launch_gradient"]


def _differentiable(dtype: tf.DType) -> bool:
    return dtype.is_floating or dtype.is_complex


@dataclass(frozen=True)
class LaunchGradient:
    """The gradient of one launch node's cluster, as a Python function of the launch
    inputs followed by the incoming gradients of the outputs in `present`; returns
    the gradients of the inputs in `differentiable` (None where unconnected).

    Hashable: equal clusters with equal masks share one compiled gradient."""

    template: bytes  # the serialized GraphDef of the cluster's own ops
    outputs: tuple[str, ...]  # its tensors that are the launch outputs, in order
    input_count: int
    present: tuple[int, ...]  # outputs with an incoming gradient
    differentiable: tuple[int, ...]  # inputs that get a gradient

    def __call__(self, *tensors: tf.Tensor) -> list[tf.Tensor | None]:
        inputs, output_gradients = tensors[:self.input_count], tensors[self.input_count:]
        graph_def = tf.compat.v1.GraphDef.FromString(self.template)
        input_map = {f"{ORIGINAL_INPUT_PREFIX}{j}:0": tensor for j, tensor in enumerate(inputs)}
        outputs = tf.graph_util.import_graph_def(
            graph_def, input_map=input_map,
            return_elements=[self.outputs[i] for i in self.present], name="original")
        return tf.gradients(outputs, [inputs[j] for j in self.differentiable],
                            grad_ys=list(output_gradients))

    def input_gradients(self, results: Sequence[Any]) -> list[Any]:
        """One entry per launch input: the computed gradient, or None."""
        gradients: list[Any] = [None] * self.input_count
        for j, gradient in zip(self.differentiable, results):
            gradients[j] = gradient
        return gradients


def launch_gradient(op: tf.Operation, output_gradients: Sequence[Any]
                    ) -> tuple[LaunchGradient | None, list[tf.Tensor]]:
    """The gradient function of launch node `op` for these incoming gradients, and the
    tensors to call it with; (None, []) when no gradient flows (no floating input or
    no floating output with a gradient). Raises LookupError for a launch node without
    its cluster's ops, as TF does for an op with no gradient."""
    try:
        template = op.get_attr(ORIGINAL_ATTR)
        outputs = tuple(name.decode() for name in op.get_attr(ORIGINAL_OUTPUTS_ATTR))
    except ValueError as error:
        raise LookupError(f"tfxla-lite: launch node '{op.name}' does not carry its "
                          "cluster's TF ops, so it has no gradient") from error
    if list(op.get_attr("variable_writes")):
        # Its ops would write the variables again when rerun for the gradient.
        raise LookupError(f"tfxla-lite: launch node '{op.name}' writes variables, so it has "
                          "no gradient (differentiate a function that only reads them)")
    present = tuple(i for i, gradient in enumerate(output_gradients)
                    if gradient is not None and _differentiable(op.outputs[i].dtype))
    # A variable read inside the cluster takes its gradient through the handle, as
    # ReadVariableOp's gradient does (the rerun ops read the variable again).
    differentiable = tuple(j for j, tensor in enumerate(op.inputs)
                           if _differentiable(tensor.dtype) or tensor.dtype == tf.resource)
    if not present or not differentiable:
        return None, []
    gradient = LaunchGradient(template, outputs, len(op.inputs), present, differentiable)
    # A gradient arriving as IndexedSlices (a Gather downstream) is made dense: the
    # compiled gradient takes tensors.
    incoming = [tf.convert_to_tensor(output_gradients[i]) for i in present]
    return gradient, [*op.inputs, *incoming]
