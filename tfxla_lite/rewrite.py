"""Graph rewrite: each compiled cluster becomes one `TfxlaLiteLaunch` node.

The last step of the data flow on the TensorFlow side. It takes the GraphDef
of a traced `tf.function`, removes the ops of every compiled cluster, adds one
launch node per cluster that reads the cluster's inputs and produces its
outputs, and re-points every consumer outside the cluster (data and control
edges) at the launch node. `import_rewritten` then imports the result into the
`tf.function` being traced, binding the original placeholders to the new
function's arguments and captures (see ARCHITECTURE.md, "Re-import works").

A cluster with unknown dimensions that has a fallback (`CompiledCluster.fallback`)
becomes `TfxlaLiteCompile` → `StatelessIf(compiled, launch, original ops)` instead;
the If node takes the launch node's name, so consumers are re-pointed the same way
(docs/architecture.md, "Unknown dimensions").

A cluster compiled for a GPU (`CompiledCluster.gpu_launch`) becomes the nodes its
`GpuLaunch` emits instead: EagerPyFunc → EnsureShape → IdentityN, the IdentityN taking
the launch node's name (tfxla_lite/runtime/gpu_launch.py, docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from tfxla_lite.clustering.body_graphs import used_functions
from tfxla_lite.clustering.inline import without_colocation_outside

LAUNCH_OP_TYPE = "TfxlaLiteLaunch"
# The launch of a cluster that reads or writes variables: the same kernel, stateful (TF
# neither prunes it nor calls a function holding it as stateless).
VARIABLE_LAUNCH_OP_TYPE = "TfxlaLiteVariableLaunch"
LAUNCH_OP_TYPES = frozenset({LAUNCH_OP_TYPE, VARIABLE_LAUNCH_OP_TYPE})
COMPILE_OP_TYPE = "TfxlaLiteCompile"
# Each launch node carries its cluster's own TF ops, as XlaLaunch names its cluster's
# function: a GraphDef whose placeholder `ORIGINAL_INPUT_PREFIX<j>` stands for launch
# input j, and the names of the tensors that are its outputs. The launch op's gradient
# (tfxla_lite/gradients.py) differentiates them; the op's kernel never reads them.
ORIGINAL_ATTR = "_tfxla_lite_original"
ORIGINAL_OUTPUTS_ATTR = "_tfxla_lite_original_outputs"
ORIGINAL_INPUT_PREFIX = "tfxla_lite_input_"


@dataclass(frozen=True)
class CompiledCluster:
    """What the rewrite needs of one cluster: its ops, its boundary, its executable."""

    name: str
    op_names: tuple[str, ...]
    inputs: tuple[str, ...]  # tensor names 'op:i' read from outside, in parameter order
    outputs: tuple[str, ...]  # tensor names 'op:i' produced inside, in output order
    control_inputs: tuple[str, ...]  # outside op names with control edges into the cluster
    key: str  # executable registry key
    output_dtypes: tuple[tf.DType, ...]
    output_shapes: tuple[Any, ...]  # static dims, or tf.TensorShape with unknown dims
    input_dtypes: tuple[tf.DType, ...]
    # (launch, original ops) ConcreteFunctions over `inputs`: the launch runs when
    # TfxlaLiteCompile says the signature compiled, the original ops otherwise. They
    # must be added to the graph the rewritten GraphDef is imported into.
    fallback: tuple[Any, Any] | None = None
    # A cluster compiled for a GPU (tfxla_lite/runtime/gpu_launch.py: `GpuLaunch`), whose
    # nodes replace the TfxlaLiteLaunch node; `key` is then unused by the rewrite.
    gpu_launch: Any = None
    # Positions in `inputs` of the resource handles whose variables the cluster writes:
    # the executable's outputs after `outputs`, stored into those variables by the launch
    # (clustering/rules_variables.py).
    variable_writes: tuple[int, ...] = ()

    @property
    def launch_name(self) -> str:
        return f"tfxla_lite_launch_{self.name}"

    @property
    def compile_name(self) -> str:
        return f"tfxla_lite_compile_{self.name}"


def _split_input(reference: str) -> tuple[str, int, bool]:
    """A GraphDef input ('op', 'op:2', '^op') as (op name, output index, is_control)."""
    if reference.startswith("^"):
        return reference[1:], -1, True
    if ":" in reference:
        op, index = reference.rsplit(":", 1)
        if index.isdigit():
            return op, int(index), False
    return reference, 0, False


def _graph_def_reference(tensor_name: str) -> str:
    op, index, _ = _split_input(tensor_name)
    return op if index == 0 else f"{op}:{index}"


class _Redirect:
    """Maps references to tensors and ops of clusters onto their launch nodes."""

    def __init__(self, clusters: Sequence[CompiledCluster]) -> None:
        self.owner: dict[str, CompiledCluster] = {}
        for cluster in clusters:
            for name in cluster.op_names:
                self.owner[name] = cluster
        self.output_index = {
            cluster.name: {_split_input(t)[:2]: i for i, t in enumerate(cluster.outputs)}
            for cluster in clusters
        }

    def __call__(self, reference: str, inside: CompiledCluster | None = None) -> str:
        """The GraphDef reference ('op', 'op:i', '^op') after the rewrite."""
        op, index, control = _split_input(reference)
        cluster = self.owner.get(op)
        if cluster is None or cluster is inside:
            return reference
        if control:
            return f"^{cluster.launch_name}"
        position = self.output_index[cluster.name].get((op, index))
        if position is None:
            raise ValueError(f"tensor {op}:{index} leaves {cluster.name} but is not one of its "
                             "outputs")
        return f"{cluster.launch_name}:{position}"


def rewritten_tensor_name(tensor_name: str, clusters: Sequence[CompiledCluster]) -> str:
    """The name ('op:i') that tensor `tensor_name` of the original graph has after the rewrite."""
    op, index, _ = _split_input(_Redirect(clusters)(_graph_def_reference(tensor_name)))
    return f"{op}:{index}"


def rewritten_op_names(op_names: Sequence[str], clusters: Sequence[CompiledCluster]
                       ) -> list[str]:
    """The ops of `op_names` after the rewrite: an op of a cluster is its launch node
    (a variable write, among a function's control outputs), each named once."""
    redirect = _Redirect(clusters)
    found: list[str] = []
    for name in op_names:
        new = redirect(f"^{name}")[1:]
        if new not in found:
            found.append(new)
    return found


def rewrite_graph_def(graph_def: tf.compat.v1.GraphDef,
                      clusters: Sequence[CompiledCluster]) -> tf.compat.v1.GraphDef:
    """A copy of `graph_def` with each cluster replaced by its launch node."""
    redirect = _Redirect(clusters)
    owner = redirect.owner

    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    nodes_by_name = {node.name: node for node in graph_def.node}
    library = {f.signature.name: f for f in graph_def.library.function}
    for node in graph_def.node:
        if node.name in owner:
            continue
        copy = result.node.add()
        copy.CopyFrom(node)
        del copy.input[:]
        seen_controls: set[str] = set()
        for reference in node.input:
            new = redirect(reference)
            if new.startswith("^"):
                if new in seen_controls:
                    continue
                seen_controls.add(new)
            copy.input.append(new)

    for cluster in clusters:
        launch = result.node.add()
        launch.name = cluster.launch_name
        # A cluster reading a variable is stateful too, as its reads are: else a stateless
        # function holding it runs unordered with the caller's later writes.
        reads = any(dtype == tf.resource for dtype in cluster.input_dtypes)
        launch.op = (VARIABLE_LAUNCH_OP_TYPE if cluster.variable_writes or reads
                     else LAUNCH_OP_TYPE)
        first = nodes_by_name[cluster.op_names[0]]
        launch.device = first.device
        inputs = [redirect(_graph_def_reference(t), cluster) for t in cluster.inputs]
        launch.input.extend(inputs)
        controls = []
        for op_name in cluster.control_inputs:
            reference = redirect(f"^{op_name}", cluster)
            if reference not in controls:
                controls.append(reference)
        launch.input.extend(controls)
        input_types = [d.as_datatype_enum for d in cluster.input_dtypes]
        output_types = [d.as_datatype_enum for d in cluster.output_dtypes]
        shapes = [tf.TensorShape(shape).as_proto() for shape in cluster.output_shapes]
        launch.attr["_output_shapes"].list.shape.extend(shapes)
        if cluster.gpu_launch is not None:
            cluster.gpu_launch.fill_nodes(result, launch)
            continue
        if cluster.fallback is not None:
            _make_fallback_if(result, launch, cluster, inputs, input_types, output_types, shapes)
            continue
        launch.attr["key"].s = cluster.key.encode()
        template = cluster_template(nodes_by_name, cluster, library)
        if template is not None:
            template.versions.CopyFrom(graph_def.versions)
            set_original(launch, template, cluster.outputs)
        launch.attr["Tin"].list.type.extend(input_types)
        launch.attr["Tout"].list.type.extend(output_types)
        launch.attr["output_shapes"].list.shape.extend(shapes)
        if cluster.variable_writes:
            launch.attr["variable_writes"].list.i.extend(cluster.variable_writes)
    return result


def template_node(node: Any) -> tf.compat.v1.NodeDef:
    """A copy of `node` (a NodeDef) for a cluster's template GraphDef: no inputs, no
    device, none of the attributes that name nodes outside it (`_class`) or shapes it
    no longer has (`_output_shapes`)."""
    copy = tf.compat.v1.NodeDef()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.device = ""
    for attr in ("_class", "_output_shapes"):
        if attr in copy.attr:
            del copy.attr[attr]
    return copy


def cluster_template(nodes_by_name: dict[str, Any], cluster: CompiledCluster,
                     library: dict[str, Any] | None = None) -> tf.compat.v1.GraphDef | None:
    """The cluster's own ops as a GraphDef over placeholders for its inputs (Const nodes
    it reads from outside copied in), or None where it reads another outside tensor.
    The functions of `library` its ops call (a loop's body, compiled whole) come along,
    so that TF can differentiate the loop."""
    inside = set(cluster.op_names)
    positions = {_split_input(t)[:2]: j for j, t in enumerate(cluster.inputs)}
    template = tf.compat.v1.GraphDef()
    for j, dtype in enumerate(cluster.input_dtypes):
        placeholder = template.node.add()
        placeholder.name = f"{ORIGINAL_INPUT_PREFIX}{j}"
        placeholder.op = "Placeholder"
        placeholder.attr["dtype"].type = dtype.as_datatype_enum
    copied: set[str] = set()
    body = []
    for name in cluster.op_names:
        node = template_node(nodes_by_name[name])
        for reference in nodes_by_name[name].input:
            op, index, control = _split_input(reference)
            if op in inside:
                node.input.append(reference)
            elif control:
                continue
            elif (op, index) in positions:
                node.input.append(f"{ORIGINAL_INPUT_PREFIX}{positions[op, index]}")
            elif nodes_by_name[op].op == "Const":
                if op not in copied:
                    copied.add(op)
                    template.node.append(template_node(nodes_by_name[op]))
                node.input.append(reference)
            else:
                return None
        body.append(node)
    template.node.extend(body)
    if library:
        for function in sorted(used_functions(body, library)):
            copy = template.library.function.add()
            copy.CopyFrom(library[function])
            # As the trace defined it, not as the export with shapes marks it: TF refuses
            # two definitions of one name in a graph.
            if "_input_shapes" in copy.attr:
                del copy.attr["_input_shapes"]
            for node in copy.node_def:
                if "_output_shapes" in node.attr:
                    del node.attr["_output_shapes"]
    return template


def set_original(launch: Any, template: tf.compat.v1.GraphDef,
                 outputs: Sequence[str]) -> None:
    """Attach the cluster's own ops to `launch` (a NodeDef or an Operation)."""
    serialized = tf.compat.v1.AttrValue(s=template.SerializeToString())
    names = tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(
        s=[name.encode() for name in outputs]))
    if isinstance(launch, tf.Operation):
        launch._set_attr(ORIGINAL_ATTR, serialized)  # noqa: SLF001 - no public setter
        launch._set_attr(ORIGINAL_OUTPUTS_ATTR, names)  # noqa: SLF001
    else:
        launch.attr[ORIGINAL_ATTR].CopyFrom(serialized)
        launch.attr[ORIGINAL_OUTPUTS_ATTR].CopyFrom(names)


def _make_fallback_if(graph_def: tf.compat.v1.GraphDef, node: Any, cluster: CompiledCluster,
                      inputs: list[str], input_types: list[int], output_types: list[int],
                      shapes: list[Any]) -> None:
    """Turn `node` into `StatelessIf(TfxlaLiteCompile(inputs), launch, original)`."""
    then_function, else_function = cluster.fallback  # type: ignore[misc]
    compile_node = graph_def.node.add()
    compile_node.name = cluster.compile_name
    compile_node.op = COMPILE_OP_TYPE
    compile_node.device = node.device
    compile_node.input.extend(inputs)
    compile_node.attr["key"].s = cluster.key.encode()
    compile_node.attr["Tin"].list.type.extend(input_types)

    controls = [r for r in node.input if r.startswith("^")]
    del node.input[:]
    node.op = "StatelessIf"
    node.input.extend([compile_node.name, *inputs, *controls])
    node.attr["Tcond"].type = tf.bool.as_datatype_enum
    node.attr["Tin"].list.type.extend(input_types)
    node.attr["Tout"].list.type.extend(output_types)
    node.attr["then_branch"].func.name = then_function.function_def.signature.name
    node.attr["else_branch"].func.name = else_function.function_def.signature.name
    node.attr["output_shapes"].list.shape.extend(shapes)
    # As tf.cond does in a tf.function: TF lowers the If into Switch/Merge when it
    # instantiates the function, so the branches run inline.
    node.attr["_lower_using_switch_merge"].b = True


def add_branch_functions(graph: tf.Graph, clusters: Sequence[CompiledCluster]) -> None:
    """Add the fallback branches of `clusters` to `graph`, before `import_rewritten`."""
    for cluster in clusters:
        for function in cluster.fallback or ():
            function.add_to_graph(graph)


def import_rewritten(graph_def: tf.compat.v1.GraphDef, placeholder_names: Sequence[str],
                     feeds: Sequence[tf.Tensor], output_names: Sequence[str],
                     control_output_names: Sequence[str]) -> list[tf.Tensor]:
    """Import `graph_def` into the graph being traced and return its outputs.

    `feeds[i]` stands in for placeholder `placeholder_names[i]` (arguments first,
    then captures, as in `ConcreteFunction.inputs`). The ops of
    `control_output_names` (variable writes) become control dependencies of the
    returned tensors, so that they run whenever the outputs are computed.
    """
    # TF captures small eager constants by value: their "placeholder" is a Const node
    # (possibly absorbed into a cluster), which is not mapped.
    placeholders = {node.name for node in graph_def.node if node.op == "Placeholder"}
    input_map = {f"{name}:0": feed for name, feed in zip(placeholder_names, feeds)
                 if name in placeholders}
    # Ops removed into clusters and placeholders bound by input_map are not created.
    present = {node.name for node in graph_def.node} - {n for n in placeholder_names
                                                         if n in placeholders}
    if any("_class" in node.attr for node in graph_def.node):
        graph_def = without_colocation_outside(graph_def, present)
    elements = list(output_names) + list(control_output_names)
    imported = tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                              return_elements=elements, name="tfxla_lite")
    tensors = imported[: len(output_names)]
    controls = imported[len(output_names):]
    if not controls:
        return [tf.identity(t) for t in tensors]
    with tf.control_dependencies(controls):
        return [tf.identity(t) for t in tensors]
