"""The functions of While, If and Case ops as graphs of their own.

A control-flow op names FunctionDefs of the graph's library (a While's `cond` and
`body`, an If's branches, a Case's `branches`); they are not calls, so inlining leaves
them alone. `op_calls` says what each function is called with (`BodyCall`: arguments,
their shapes, which are the same in every run), and `function_graph` builds the function
as a graph with placeholders of those shapes and the arguments' handle data (resource
and TensorList shapes), loop-invariant integers of known value as constants and
shape-determined ones marked. Both paths of control flow use them: the rules that
compile a loop or branch whole as HLO (`rules_control_flow.py`) and the driver's
body-by-body compile (`tfxla_lite/driver.py`, `compile_bodies`, and
`tfxla_lite/control_flow.py`).

The body's argument shapes are the loop variables' shape invariants (a While's
`output_shapes`) or the If's input shapes, so loop-carried dimensions may be unknown.
TensorLists of shapes a forward loop accumulated for its gradient loop are marked so
that their pops count as shapes (`shape_lists`). `trip_count` estimates how many times
a While body runs per call, for the FLOP weights of `tfxla_lite.coverage`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import (
    attr_value_pb2,
    cpp_shape_inference_pb2,
    full_type_pb2,
    function_pb2,
)
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
from tensorflow.python.ops import handle_data_util

from tfxla_lite.clustering.control_flow_ops import CASE_OPS, IF_OPS, WHILE_OPS
from tfxla_lite.clustering.inline import without_colocation_outside
from tfxla_lite.clustering.mark import SHAPE_DETERMINED_ATTR, SHAPE_LIST_ATTR, shape_determined
from tfxla_lite.clustering.registry import constant_value

# Each While and If op type and the attributes that name its functions (a Case compiles
# only whole, as HLO `conditional`: clustering/rules_control_flow.py).
FUNCTION_ATTRS: dict[str, tuple[str, ...]] = {
    **{t: ("cond", "body") for t in WHILE_OPS},
    **{t: ("then_branch", "else_branch") for t in IF_OPS},
}
CONTROL_FLOW_OPS = frozenset(FUNCTION_ATTRS)


@dataclass(frozen=True)
class BodyCall:
    """One function attribute of one control-flow op: what the function is called with."""

    node: str  # the control-flow op in the parent graph
    op_type: str
    attr: str  # 'body', 'cond', 'then_branch' or 'else_branch'
    function: str  # the FunctionDef's name in the library
    arguments: tuple[Any, ...]  # the parent's tensors passed as the function's arguments
    shapes: tuple[tf.TensorShape, ...]  # the arguments' shapes inside the function
    # Per argument: the same value in every run of the function (a branch's arguments;
    # a loop variable the body returns unchanged, such as a captured shape).
    invariant: tuple[bool, ...] = ()
    # Per argument: a TensorList of shape-determined values (`shape_lists`).
    shape_list: tuple[bool, ...] = ()
    # Per argument: the one value every element of a TensorList has when known at compile
    # time (a forward loop's accumulated shapes once the batch is known), else None: what
    # the function pops from it becomes that constant (`function_graph`).
    popped: tuple[Any, ...] = ()
    # Per argument: a TensorList's (element dtype, static element dims) when known better
    # than the argument's handle data says (a list made with an unknown batch), else None.
    element_shapes: tuple[Any, ...] = ()


def body_calls(graph: tf.Graph, library: Mapping[str, function_pb2.FunctionDef]
               ) -> list[BodyCall]:
    """Every function attribute of every While and If op of `graph`, in op order."""
    calls = []
    for op in graph.get_operations():
        if op.type in FUNCTION_ATTRS:
            calls.extend(op_calls(op, library))
    return calls


def op_calls(op: tf.Operation, library: Mapping[str, function_pb2.FunctionDef],
             exact_shapes: bool = False) -> list[BodyCall]:
    """The calls of one While, If or Case op's functions (a Case's `branches`, attr
    'branches:k'). `exact_shapes`: the arguments' shapes are the op's inputs' own, not a
    While's shape invariants (an HLO loop's state has one shape)."""
    if op.type in WHILE_OPS:
        arguments = tuple(op.inputs)
        shapes = [tf.TensorShape(s) for s in op.get_attr("output_shapes")]
        if exact_shapes or len(shapes) != len(arguments):
            shapes = [t.shape for t in arguments]
        body = library.get(op.get_attr("body").name)
        unchanged = _unchanged_arguments(body) if body is not None else set()
        invariant = tuple(k in unchanged for k in range(len(arguments)))
    else:
        arguments = tuple(op.inputs[1:])
        shapes = [t.shape for t in arguments]
        invariant = (True,) * len(arguments)
    if op.type in CASE_OPS:
        named = [(f"branches:{k}", f.name) for k, f in enumerate(op.get_attr("branches"))]
    else:
        named = [(attr, op.get_attr(attr).name) for attr in FUNCTION_ATTRS[op.type]]
    return [BodyCall(op.name, op.type, attr, function, arguments, tuple(shapes), invariant)
            for attr, function in named]


def _unchanged_arguments(body: function_pb2.FunctionDef) -> set[int]:
    """The loop variables a While body returns as it got them (through Identity ops)."""
    nodes = {node.name: node for node in body.node_def}
    positions = {arg.name: k for k, arg in enumerate(body.signature.input_arg)}
    unchanged = set()
    for k, output in enumerate(body.signature.output_arg):
        name = body.ret[output.name].split(":")[0]
        while name in nodes and nodes[name].op == "Identity" and nodes[name].input:
            name = nodes[name].input[0].split(":")[0]
        if positions.get(name) == k:
            unchanged.add(k)
    return unchanged


# Invariant integer arguments of known value up to this many elements become constants.
_MAX_CONSTANT_ELEMENTS = 64


def _invariant_kind(call: BodyCall, k: int) -> Any:
    """For an invariant integer argument: its value when known (it becomes a Const), or
    SHAPE_DETERMINED_ATTR when only shapes determine it (a value-keyed input inside)."""
    source = call.arguments[k]
    if (not call.invariant or not call.invariant[k]
            or source.dtype.base_dtype not in (tf.int32, tf.int64)):
        return None
    value = constant_value(source)
    if value is not None and value.size <= _MAX_CONSTANT_ELEMENTS:
        return value
    if shape_determined(source):
        return SHAPE_DETERMINED_ATTR
    return None


def function_graph(library: Mapping[str, function_pb2.FunctionDef], call: BodyCall
                   ) -> FuncGraph:
    """The FunctionDef of `call` as a graph with placeholders of the call's shapes and
    handle data; `inputs`, `outputs` and `control_outputs` are set, and the functions
    it uses (nested loops) are in its library."""
    fdef = library[call.function]
    # TF looks the functions the body's nodes name up in the default graph (or the eager
    # context, where a trace's nested branches may no longer be): give it a graph that
    # holds them.
    with _graph_with_functions(fdef.node_def, library).as_default():
        graph_def, flat_names = function_def_to_graph_def(fdef, list(call.shapes))
    arguments = {flat_names[arg.name].split(":")[0]: (k, source)
                 for k, (arg, source) in enumerate(zip(fdef.signature.input_arg,
                                                       call.arguments))}
    body = tf.compat.v1.GraphDef()
    body.versions.CopyFrom(graph_def.versions)
    body.node.extend(n for n in graph_def.node if n.name not in arguments)
    for name in sorted(used_functions(graph_def.node, library)):
        body.library.function.add().CopyFrom(library[name])
    if call.popped:
        _popped_constants(body, call, flat_names, fdef)
    if any("_class" in node.attr for node in body.node):
        # A colocation with an argument (OptionalHasValue with its optional, in Keras'
        # loop over steps) names a node the import does not create.
        body = without_colocation_outside(body, {node.name for node in body.node})
    graph = FuncGraph(call.function)
    with graph.as_default():
        # The arguments first, with their handle data, so that shape inference sees the
        # shapes of variables and list elements as the body's ops are imported.
        input_map = {}
        for node in graph_def.node:
            if node.name not in arguments:
                continue
            k, source = arguments[node.name]
            dtype = tf.as_dtype(node.attr["dtype"].type)
            # The FunctionDef's own argument shapes (its trace's, of an unknown batch) win
            # over the call's in function_def_to_graph_def: keep the more specific.
            shape = tf.TensorShape(node.attr["shape"].shape)
            if shape.is_compatible_with(call.shapes[k]):
                node.attr["shape"].shape.CopyFrom(shape.merge_with(call.shapes[k]).as_proto())
            kind = _invariant_kind(call, k)
            if kind is not None and not isinstance(kind, str):
                # A loop-invariant shape or axis of known value: a constant inside, so
                # that the ops reading it (Reshape, BroadcastGradientArgs) can compile.
                placeholder = tf.constant(kind, dtype=dtype, name=node.name)
            else:
                placeholder = tf.compat.v1.placeholder(
                    dtype, tf.TensorShape(node.attr["shape"].shape), name=node.name)
            if placeholder.op.name != node.name:
                raise ValueError(f"argument {node.name} of {call.function} was renamed")
            if isinstance(kind, str):  # SHAPE_DETERMINED_ATTR
                placeholder.op._set_attr(  # noqa: SLF001 - no public setter
                    SHAPE_DETERMINED_ATTR, attr_value_pb2.AttrValue(b=True))
            if call.shape_list and call.shape_list[k]:
                placeholder.op._set_attr(  # noqa: SLF001 - no public setter
                    SHAPE_LIST_ATTR, attr_value_pb2.AttrValue(b=True))
            if source.dtype in (tf.resource, tf.variant):
                handle_data_util.copy_handle_data(source, placeholder)
            if call.element_shapes and call.element_shapes[k] is not None:
                _set_element_shape(placeholder, call.element_shapes[k])
            input_map[f"{node.name}:0"] = placeholder
        used = {r.split(":")[0].lstrip("^") for n in body.node for r in n.input}
        input_map = {k: v for k, v in input_map.items() if k[:-2] in used}
        tf.graph_util.import_graph_def(body, input_map=input_map, name="")
    graph.inputs = [graph.get_tensor_by_name(flat_names[arg.name])
                    for arg in fdef.signature.input_arg]
    graph.outputs = [graph.get_tensor_by_name(flat_names[fdef.ret[arg.name]])
                     for arg in fdef.signature.output_arg]
    graph.control_outputs = [graph.get_operation_by_name(fdef.control_ret[name])
                             for name in fdef.signature.control_output]
    return graph


def _popped_constants(body: tf.compat.v1.GraphDef, call: BodyCall, flat_names: dict[str, str],
                      fdef: function_pb2.FunctionDef) -> None:
    """Each `TensorListPopBack` element popped from an argument of known elements
    (`BodyCall.popped`), as a Const in `body`: TF's shape inference then gives the
    Reshapes to it static shapes, and the lowering its value."""
    lists = {flat_names[arg.name].split(":")[0]: value
             for arg, value in zip(fdef.signature.input_arg, call.popped) if value is not None}
    nodes = {node.name: node for node in body.node}
    sources: dict[str, Any] = {}
    for node in body.node:  # a pop's list: the argument, perhaps popped from before
        if node.op != "TensorListPopBack":
            continue
        name = node.input[0].split(":")[0]
        while name in nodes and nodes[name].op in ("TensorListPopBack", "Identity"):
            name = nodes[name].input[0].split(":")[0]
        if name in lists:
            sources[node.name] = lists[name]
    if not sources:
        return
    constants = {}
    for pop, value in sources.items():
        constant = body.node.add()
        constant.name = f"{pop}/tfxla_lite_popped"
        constant.op = "Const"
        tensor = tf.make_tensor_proto(value)
        constant.attr["dtype"].type = tensor.dtype
        constant.attr["value"].tensor.CopyFrom(tensor)
        constants[f"{pop}:1"] = constant.name
    for node in body.node:
        for i, name in enumerate(node.input):
            if name in constants:
                node.input[i] = constants[name]


def _set_element_shape(placeholder: tf.Tensor, element: tuple[tf.DType, tuple[int, ...]]
                       ) -> None:
    """Give TensorList `placeholder` handle data of static elements (with the full type
    TF's list ops give theirs), so that shape inference in the body sees what it reads
    from the list as static."""
    dtype, dims = element
    name = _FULL_TYPE_NAMES.get(dtype.name, dtype.name.upper())
    data = cpp_shape_inference_pb2.CppShapeInferenceResult.HandleData(is_set=True)
    entry = data.shape_and_type.add()
    entry.dtype = dtype.as_datatype_enum
    entry.shape.CopyFrom(tf.TensorShape(dims).as_proto())
    entry.type.type_id = full_type_pb2.TFT_ARRAY
    tensor = entry.type.args.add()
    tensor.type_id = full_type_pb2.TFT_TENSOR
    tensor.args.add().type_id = full_type_pb2.FullTypeId.Value(f"TFT_{name}")
    handle_data_util.set_handle_data(placeholder, data)


_FULL_TYPE_NAMES = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "HALF"}


def shape_lists(call: BodyCall, body: tf.Graph) -> set[tuple[str, int]]:
    """The outputs (While op name, index) of a compiled While body `call` that are
    TensorLists of shape-determined values: the body returns `TensorListPushBack(list,
    value)` with such a value, as while_v2 accumulates the shapes its gradient needs.
    A gradient loop that is given one of them pops shapes (`with_shape_lists`)."""
    if call.op_type not in WHILE_OPS or call.attr != "body":
        return set()
    found = set()
    for k, output in enumerate(body.outputs):
        op = output.op
        while op.type == "Identity" and op.inputs:
            op = op.inputs[0].op
        if op.type == "TensorListPushBack" and shape_determined(op.inputs[1]):
            found.add((call.node, k))
    return found


def with_shape_lists(call: BodyCall, lists: set[tuple[str, int]]) -> BodyCall:
    """`call` with `shape_list` set for the arguments that are outputs in `lists`."""
    flags = []
    for source in call.arguments:
        op, index = source.op, source.value_index
        while op.type == "Identity" and op.inputs:
            op, index = op.inputs[0].op, op.inputs[0].value_index
        flags.append(source.dtype == tf.variant and (op.name, index) in lists)
    return dataclasses.replace(call, shape_list=tuple(flags)) if any(flags) else call


def _graph_with_functions(nodes: Iterable[Any],
                          library: Mapping[str, function_pb2.FunctionDef]) -> tf.Graph:
    """A graph whose function library holds the functions `nodes` use."""
    holder = tf.compat.v1.GraphDef()
    for name in sorted(used_functions(nodes, library)):
        holder.library.function.add().CopyFrom(library[name])
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(holder, name="")
    return graph


def used_functions(nodes: Iterable[Any], library: Mapping[str, Any]
                   ) -> set[str]:
    """The names of the library functions `nodes` call, directly or through others."""
    found: set[str] = set()
    pending = list(nodes)
    while pending:
        node = pending.pop()
        for value in node.attr.values():
            names = [value.func.name] if value.HasField("func") else [
                f.name for f in value.list.func]
            for name in names:
                if name in library and name not in found:
                    found.add(name)
                    pending.extend(library[name].node_def)
    return found


def trip_count(op: tf.Operation, default: int, _depth: int = 0) -> int:
    """How many times the body of While `op` runs per call, estimated: the constant
    `maximum_iterations` of a `tf.while_loop` (loop variable 1 of while_v2), the trip
    count of the forward loop for a gradient loop (whose maximum is the forward loop's
    counter), else `default`."""
    if op.type not in WHILE_OPS or len(op.inputs) < 2 or _depth > 8:
        return default
    if op.node_def.attr.get("_num_original_outputs") is None:
        return default  # not a tf.while_loop: no maximum_iterations slot
    maximum = op.inputs[1]
    value = constant_value(maximum)
    if value is not None and value.size == 1 and int(value) >= 0:
        return int(value)
    source = maximum.op
    while source.type in ("Identity", "StopGradient") and source.inputs:
        source = source.inputs[0].op
    if source.type in WHILE_OPS:
        return trip_count(source, default, _depth + 1)
    return default
