"""Clusters with unknown dimensions: compiled at run time, once per concrete input shape.

Where it sits: `driver.build_program(..., dynamic=True)` marks with known ranks
instead of static shapes (`MarkOptions(dynamic_shapes=True)`). A cluster whose shapes
are all static still takes the ahead-of-time path; any other becomes a
`DynamicCluster`, which the launch op calls back (`runtime.register_dynamic`) with
each new input signature. See docs/architecture.md, "Unknown dimensions".

A dynamic cluster keeps a *template*: a GraphDef of its own ops whose outside
tensors are placeholders `tfxla_lite_input_<j>` (the launch op's inputs) or copied
constants. For a signature, every placeholder gets its concrete shape, or becomes a
Const of its value when it is *value-keyed* (a small integer tensor that only shapes
determine, such as `tf.shape(x)[0]` computed outside the cluster): importing that
into a fresh `tf.Graph` lets TF's shape inference make every shape static, and then
`lower_cluster` and `compile_module` run as for a static cluster. Value-keyed inputs
are part of the op's cache key, so they never make a result wrong.

The fallback (auto mode): the graph rewrite puts the cluster's original ops in the
else branch of a `StatelessIf` on `TfxlaLiteCompile`, as TF's build_xla_ops_pass
pairs `_XlaCompile` with the original cluster. They run when this module refuses a
signature: it failed to compile, or the cluster met `max_specializations` distinct
signatures already (XLA's megamorphic clusters, device_compiler.h), which is logged
once. In must-compile mode there is no limit and no fallback: a failure is the op's
error.

A cluster on a GPU (`DynamicCluster.gpu`) is planned and bounded the same way, compiles
each signature with the GPU backend, and is called by its GPU launch
(`runtime/gpu_launch.py: GpuDynamicLaunch`), not the launch op: the launch runs the
original ops (`original_function`) itself for a refused signature.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import cpp_shape_inference_pb2
from tensorflow.python.ops import handle_data_util

from tfxla_lite.clustering.body_graphs import used_functions
from tfxla_lite.clustering.cluster import Cluster
from tfxla_lite.clustering.control_flow_ops import FUNCTIONAL_OPS, WHILE_OPS
from tfxla_lite.clustering.lower import lower_cluster
from tfxla_lite.clustering.mark import shape_determined
from tfxla_lite.clustering.registry import OP_RULES, constant_value, known_dims, variable_spec
from tfxla_lite.clustering.rules_control_flow import list_shape, variable_dims
from tfxla_lite.clustering.rules_variables import written_variables
from tfxla_lite.codegen import compile_module
from tfxla_lite.collector import collector_paused
from tfxla_lite.hlo import HloModule
from tfxla_lite.rewrite import ORIGINAL_INPUT_PREFIX, set_original, template_node
from tfxla_lite.runtime import gpu_launch, loader

logger = logging.getLogger("tfxla_lite")

# The launch node's `ORIGINAL_ATTR` template and this one are the same GraphDef.
INPUT_PREFIX = ORIGINAL_INPUT_PREFIX
_VALUE_DTYPES = frozenset({"int32", "int64", "bool"})


def is_static(graph: tf.Graph, cluster: Cluster) -> bool:
    """Whether `cluster` compiles ahead of time: every shape static, every value its
    lowering needs a compile-time constant."""
    for name in cluster.op_names:
        op = graph.get_operation_by_name(name)
        if any(known_dims(t) is None for t in list(op.inputs) + list(op.outputs)):
            return False
        rule = OP_RULES.get(op.type)
        if rule is not None and any(constant_value(op.inputs[i]) is None
                                    for i in rule.static_input_indices(op)):
            return False
    return True


@dataclass
class SpecializationArtifacts:
    """One compiled signature, for `experimental_get_compiler_ir`."""

    name: str
    hlo: HloModule
    hlo_text: str
    executable: Any  # tfxla_lite.codegen.Executable


@dataclass
class DynamicCluster:
    """One cluster compiled per input signature; callable as the launch op's compile
    function (`SpecializationRequest` → `Specialization` | `Refusal`).

    `inputs` are the launch op's inputs (tensor names of the original graph): the
    cluster's inputs, then the tensors read only for their shape or value.
    """

    name: str
    key: str
    cluster: Cluster
    inputs: tuple[str, ...]
    input_dtypes: tuple[tf.DType, ...]
    input_shapes: tuple[tf.TensorShape, ...]
    value_inputs: tuple[int, ...]
    param_inputs: tuple[int, ...]
    output_dtypes: tuple[tf.DType, ...]
    output_shapes: tuple[tf.TensorShape, ...]
    template: tf.compat.v1.GraphDef
    # Optimize → assign → emit → link for one shape's HLO: the driver's `compile_code`
    # with the build's options and device (tfxla_lite/driver.py); a tiered compile's
    # quick code is swapped for O3 behind the address the launch op keeps.
    compile_code: Callable[[HloModule], Any] = compile_module
    pause_collector: bool = True  # the option of that name: GC off while a shape compiles
    max_specializations: int | None = 10  # None: no limit (must-compile mode)
    must_compile: bool = False
    # The GPU TF runs the cluster on, None for the CPU: a GPU cluster's launch
    # (runtime/gpu_launch.py: `GpuDynamicLaunch`) calls this object, not the launch op.
    gpu: int | None = None
    # Each resource input's handle data (the variable's dtype and static shape), which
    # the template's placeholders lose: a must-compile CPU cluster binds its variables.
    handle_data: dict[int, bytes] = field(default_factory=dict)
    specializations: list[SpecializationArtifacts] = field(default_factory=list)
    # Called with (SpecializationArtifacts, compile seconds) after each compile (dumps).
    on_compiled: Any = None
    _results: dict[Any, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _logged_limit: bool = field(default=False, repr=False)

    # -- the compile callback ------------------------------------------------------------
    def __call__(self, request: loader.SpecializationRequest) -> Any:
        # Serialized per cluster: a second thread with the same signature then finds
        # the first one's result, and the count of signatures is exact.
        with self._lock:
            signature = request.signature
            if signature in self._results:
                return self._results[signature]
            if (self.max_specializations is not None
                    and len(self._results) >= self.max_specializations):
                if not self._logged_limit:
                    self._logged_limit = True
                    logger.warning(
                        "tfxla-lite: %s met %d distinct input shapes (the limit); new shapes "
                        "run in TensorFlow from now on", self.key, len(self._results))
                return loader.Refusal(for_all_new=True)
            try:
                with collector_paused(self.pause_collector):
                    result = self.compile(request)
            except Exception as error:
                if self.must_compile:
                    raise
                logger.warning("tfxla-lite: %s falls back to TensorFlow for input shapes %s: "
                               "%s: %s", self.key, list(request.shapes), type(error).__name__,
                               error)
                result = loader.Refusal()
            self._results[signature] = result
            return result

    def compile(self, request: loader.SpecializationRequest) -> loader.Specialization:
        """Lower and compile the cluster for the shapes (and values) of `request`."""
        started = time.perf_counter()
        graph_def = self.specialized_graph_def(request)
        graph, inputs = self._imported(graph_def)
        for _ in range(_MAX_REFINEMENTS):
            # What a loop's lists hold is known now: their reads after it get static
            # shapes too, as in a trace of this batch size (a stacked RNN's next loop
            # learns its shapes from the last one's, a round later).
            if not _with_list_shapes(graph, graph_def):
                break
            graph, inputs = self._imported(graph_def)
        cluster = Cluster(self.cluster.name, list(self.cluster.op_names),
                          [t if isinstance(t, str) else t.name
                           for t in (inputs[j] for j in self.param_inputs)],
                          list(self.cluster.outputs))
        module = lower_cluster(graph, cluster)
        executable = self.compile_code(module)
        outputs = [graph.get_tensor_by_name(t) for t in self.cluster.outputs]
        output_specs = tuple((t.dtype, known_dims(t)) for t in outputs)
        # The variables it writes are the executable's last outputs (clustering/lower.py).
        output_specs += tuple(variable_spec(graph.get_tensor_by_name(h))
                              for h in written_variables(graph, self.cluster.op_names))
        shapes = ", ".join(str(list(s)) for s in request.shapes)
        self.specializations.append(SpecializationArtifacts(
            f"{self.cluster.name} ({shapes})", module, executable.hlo_text, executable))
        if self.on_compiled is not None:
            self.on_compiled(self.specializations[-1], time.perf_counter() - started)
        logger.info("tfxla-lite: compiled %s for input shapes %s: %d kernels", self.key, shapes,
                    executable.kernel_count)
        if self.gpu is not None:
            return gpu_launch.GpuSpecialization(executable, self.param_inputs, output_specs)
        return loader.Specialization(executable.entry_address, executable.temp_bytes,
                                     self.param_inputs, output_specs, owner=executable)

    def _imported(self, graph_def: tf.compat.v1.GraphDef) -> tuple[tf.Graph, dict[int, Any]]:
        """A fresh graph of `graph_def`, and each parameter's tensor (name) in it."""
        graph = tf.Graph()
        inputs: dict[int, Any] = {j: f"{INPUT_PREFIX}{j}:0" for j in self.param_inputs}
        with graph.as_default():
            # A variable's handle carries its dtype and shape before the ops that read it
            # are imported, so that TF's shape inference gives their shapes.
            handles = {}
            for j, data in self.handle_data.items():
                handle = tf.compat.v1.placeholder(tf.resource, (), name=f"tfxla_lite_handle_{j}")
                handle_data_util.set_handle_data(
                    handle,
                    cpp_shape_inference_pb2.CppShapeInferenceResult.HandleData.FromString(data))
                handles[inputs[j]] = inputs[j] = handle
            tf.graph_util.import_graph_def(graph_def, input_map=handles, name="")
        return graph, inputs

    def specialized_graph_def(self, request: loader.SpecializationRequest
                              ) -> tf.compat.v1.GraphDef:
        """The template with each input's concrete shape, value-keyed inputs as Consts."""
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(self.template)
        for node in graph_def.node:
            if not node.name.startswith(INPUT_PREFIX):
                continue
            j = int(node.name[len(INPUT_PREFIX):])
            if j in request.values:
                value = request.values[j]
                node.op = "Const"
                del node.attr["shape"]
                node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
                    value, dtype=self.input_dtypes[j], shape=value.shape))
            else:
                node.attr["shape"].shape.CopyFrom(tf.TensorShape(request.shapes[j]).as_proto())
        _with_loop_shapes(graph_def)
        return graph_def

    # -- the fallback branch -------------------------------------------------------------
    def branch_functions(self) -> tuple[Any, Any]:
        """ConcreteFunctions of (launch, original ops) over the launch inputs, for the
        rewrite's `StatelessIf`."""

        def compiled(*args: tf.Tensor) -> list[tf.Tensor]:
            results = loader.launch(args, self.key, self.output_dtypes, self.output_shapes)
            if results:  # what its gradient differentiates (tfxla_lite/gradients.py)
                set_original(results[0].op, self.template, self.cluster.outputs)
            return results

        return self._over_inputs(compiled), self.original_function()

    def original_function(self) -> Any:
        """A ConcreteFunction of the cluster's own TF ops over the launch inputs: the
        fallback (the CPU's else branch; what a GPU launch runs for a refused signature)."""
        template, outputs = self.template, list(self.cluster.outputs)
        input_names = [f"{INPUT_PREFIX}{j}:0" for j in range(len(self.inputs))]

        def original(*args: tf.Tensor) -> list[tf.Tensor]:
            return tf.graph_util.import_graph_def(template, input_map=dict(zip(input_names, args)),
                                                  return_elements=outputs, name="original")

        return self._over_inputs(original)

    def _over_inputs(self, body: Any) -> Any:
        specs = [tf.TensorSpec(s, d) for s, d in zip(self.input_shapes, self.input_dtypes)]
        body.__name__ = f"tfxla_lite_{self.name}_{body.__name__}"
        return tf.function(body, autograph=False).get_concrete_function(*specs)


def plan_dynamic_cluster(graph: tf.Graph, cluster: Cluster, key: str, name: str
                         ) -> DynamicCluster:
    """The launch inputs, their kinds and the template of `cluster` (not registered)."""
    inside = set(cluster.op_names)
    template = tf.compat.v1.GraphDef()
    inputs: list[str] = []
    constants: dict[str, str] = {}  # outside tensor -> Const node name in the template

    def reference(tensor: tf.Tensor) -> str:
        if tensor.name in constants:
            return constants[tensor.name]
        if tensor.name not in inputs:
            value = constant_value(tensor) if tensor.op.type != "Const" else None
            if tensor.op.type == "Const" or value is not None:
                constants[tensor.name] = _add_constant(template, tensor, value)
                return constants[tensor.name]
            inputs.append(tensor.name)
        return f"{INPUT_PREFIX}{inputs.index(tensor.name)}"

    # The cluster's own inputs first, in parameter order, then what else it reads.
    for tensor_name in cluster.inputs:
        reference(graph.get_tensor_by_name(tensor_name))
    body = []
    for op_name in cluster.op_names:
        op = graph.get_operation_by_name(op_name)
        node = template_node(op.node_def)
        for tensor in op.inputs:
            if tensor.op.name in inside:
                node.input.append(tensor.name if tensor.value_index else tensor.op.name)
            else:
                node.input.append(reference(tensor))
        node.input.extend(f"^{c.name}" for c in op.control_inputs if c.name in inside)
        body.append(node)

    tensors = [graph.get_tensor_by_name(t) for t in inputs]
    value_inputs = tuple(j for j, t in enumerate(tensors)
                         if t.dtype.base_dtype.name in _VALUE_DTYPES and shape_determined(t))
    param_inputs = tuple(j for j, t in enumerate(tensors)
                         if t.name in cluster.inputs and j not in value_inputs)
    for j, tensor in enumerate(tensors):
        if tensor.shape.rank is None:
            raise ValueError(f"{cluster.name}: input {tensor.name} has unknown rank")
        placeholder = template.node.add()
        placeholder.name = f"{INPUT_PREFIX}{j}"
        placeholder.op = "Placeholder"
        placeholder.attr["dtype"].type = tensor.dtype.as_datatype_enum
        placeholder.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
    template.node.extend(body)
    template.versions.CopyFrom(graph.graph_def_versions)
    _add_functions(template, graph)

    outputs = [graph.get_tensor_by_name(t) for t in cluster.outputs]
    handle_data = {j: handle_data_util.get_resource_handle_data(t).SerializeToString()
                   for j, t in enumerate(tensors) if t.dtype == tf.resource}
    return DynamicCluster(
        name=name, key=key, cluster=cluster, inputs=tuple(inputs),
        input_dtypes=tuple(t.dtype for t in tensors),
        input_shapes=tuple(t.shape for t in tensors), value_inputs=value_inputs,
        param_inputs=param_inputs, output_dtypes=tuple(t.dtype for t in outputs),
        output_shapes=tuple(t.shape for t in outputs), template=template,
        handle_data=handle_data)


def _add_functions(template: tf.compat.v1.GraphDef, graph: tf.Graph) -> None:
    """The library functions the template's loops and branches call (compiled whole as
    HLO control flow), so that it imports on its own."""
    if not any(node.op in FUNCTIONAL_OPS for node in template.node):
        return
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    for name in sorted(used_functions(template.node, library)):
        template.library.function.add().CopyFrom(library[name])


def _with_loop_shapes(graph_def: tf.compat.v1.GraphDef) -> None:
    """Drop each While's `output_shapes` (its trace's, of unknown batch): TF's shape
    inference then gives its outputs its inputs' concrete shapes, which an HLO loop keeps
    (clustering/rules_control_flow.py refuses a body that changes them)."""
    for node in graph_def.node:
        if node.op in WHILE_OPS and "output_shapes" in node.attr:
            del node.attr["output_shapes"].list.shape[:]


_MAX_REFINEMENTS = 8
# The TensorList reads whose `element_shape` input (by index) shapes their result.
_LIST_READS = {"TensorListStack": 1, "TensorListGetItem": 2, "TensorListPopBack": 1}


def _with_list_shapes(graph: tf.Graph, graph_def: tf.compat.v1.GraphDef) -> bool:
    """Give each TensorList read of `graph` whose result shape TF leaves partly unknown
    (a list out of a loop, traced with an unknown batch) its list's static element
    shape in `graph_def`, as an `element_shape` Const (and a stack its `num_elements`);
    make a `VariableShape` of a handle out of a loop a Const. Whether anything changed."""
    nodes = {node.name: node for node in graph_def.node}
    changed = False
    for op in graph.get_operations():
        if (op.type == "VariableShape" and op.name in nodes
                and not op.outputs[0].shape.is_fully_defined()
                and (dims := variable_dims(op.inputs[0])) is not None):
            # A handle out of a loop (no handle data once imported): its shape as a Const.
            node = nodes[op.name]
            dtype = op.outputs[0].dtype
            node.op = "Const"
            del node.input[:]
            for name in list(node.attr):
                del node.attr[name]
            node.attr["dtype"].type = dtype.as_datatype_enum
            node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
                np.array(dims, dtype.as_numpy_dtype)))
            changed = True
            continue
        index = _LIST_READS.get(op.type)
        if index is None or op.name not in nodes or op.outputs[
                1 if op.type == "TensorListPopBack" else 0].shape.is_fully_defined() or (
                f"{op.name}/tfxla_lite_element_shape" in nodes):
            continue
        shape = list_shape(op.inputs[0])
        if shape is None:
            continue
        buffer = shape.tuple_shapes[0]  # type: ignore[index]
        constant = graph_def.node.add()
        constant.name = f"{op.name}/tfxla_lite_element_shape"
        constant.op = "Const"
        constant.attr["dtype"].type = op.inputs[index].dtype.as_datatype_enum
        constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(
            np.array(buffer.dims[1:], op.inputs[index].dtype.as_numpy_dtype)))
        node = nodes[op.name]
        node.input[index] = constant.name
        if op.type == "TensorListStack":
            node.attr["num_elements"].i = buffer.dims[0]
        changed = True
    return changed


def _add_constant(template: tf.compat.v1.GraphDef, tensor: tf.Tensor,
                  value: np.ndarray | None) -> str:
    """A Const node in `template` for an outside tensor of known value; its name."""
    node = template.node.add()
    if value is None:  # a Const op itself: copied under its own name, as lowering expects
        node.CopyFrom(template_node(tensor.op.node_def))
        return tensor.op.name
    node.name = f"tfxla_lite_constant_{len(template.node)}"
    node.op = "Const"
    node.attr["dtype"].type = tensor.dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value),
                                                            dtype=tensor.dtype))
    return node.name


def register(dynamic_cluster: DynamicCluster) -> None:
    """Make the launch op call `dynamic_cluster` for each new input signature."""
    loader.register_dynamic(dynamic_cluster.key,
                            list(zip(dynamic_cluster.input_dtypes, dynamic_cluster.input_shapes)),
                            dynamic_cluster.value_inputs, dynamic_cluster)
