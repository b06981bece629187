"""Control flow: the bodies of While and If ops, clustered inside.

A While, If or Case op whose functions lower entirely joins a cluster whole as an HLO
`while` or `conditional` (clustering/rules_control_flow.py, which builds the function
graphs with `function_graph` and `op_calls`); this module's body-by-body path is for the
others (and for every loop with `Options(hlo_control_flow=False)`).

Where it sits: `driver.compile_bodies` asks `body_calls(graph)` for the function
attributes of every While/StatelessWhile (`cond`, `body`) and If/StatelessIf
(`then_branch`, `else_branch`) op of a traced graph. Each such function is a
FunctionDef of the graph's library, not a call, so inlining (`inline.py`) leaves it
alone. The driver turns each into a graph of its own (`function_graph`), marks,
clusters and compiles it like a traced function (`driver.compile_graph`, recursively:
a loop inside a loop body is handled the same way), and `rewritten_body` traces the
rewritten body, launch ops included, into a new function with the same signature. The
control-flow op stays in TensorFlow and calls the new function (`rename_functions`): TF
lowers it to Switch/Merge or Enter/Exit frames when it runs the graph, and the launch ops
run in those frames like any kernel.

The body's argument shapes are the loop variables' shape invariants (a While's
`output_shapes`) or the If's input shapes, so loop-carried dimensions may be
unknown: those clusters take the per-shape path of `tfxla_lite/dynamic.py`.
Resource and TensorList arguments get the handle data of the tensors the op is
given, so that variable reads inside have their shapes. Integer arguments that do
not change in the loop become constants inside, or value-keyed shapes
(`_invariant_kind`); TensorLists of shapes a forward loop accumulated for its
gradient loop are marked so that their pops count as shapes (`shape_lists`).

`trip_count` estimates how many times a While body runs per call, for the FLOP
weights of `tfxla_lite.coverage`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
from tensorflow.python.ops import handle_data_util

from tfxla_lite.clustering.mark import (
    SHAPE_DETERMINED_ATTR,
    SHAPE_LIST_ATTR,
    shape_determined,
)
from tfxla_lite.clustering.registry import constant_value
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.rewrite import import_rewritten, used_functions, without_colocation_outside

WHILE_OPS = frozenset({"While", "StatelessWhile"})
IF_OPS = frozenset({"If", "StatelessIf"})
# Compiled only whole, as HLO `conditional` (clustering/rules_control_flow.py).
CASE_OPS = frozenset({"Case", "StatelessCase"})
# Each control-flow op type and the attributes that name its functions.
FUNCTION_ATTRS: dict[str, tuple[str, ...]] = {
    **{t: ("cond", "body") for t in WHILE_OPS},
    **{t: ("then_branch", "else_branch") for t in IF_OPS},
}
CONTROL_FLOW_OPS = frozenset(FUNCTION_ATTRS)
CONTROL_FLOW_REASON = "control flow: stays in TF, its bodies are clustered inside"


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


def rewritten_body(graph: FuncGraph, graph_def: tf.compat.v1.GraphDef, output_names: Sequence[str],
                   control_names: Sequence[str], functions: Sequence[Any],
                   library: Mapping[str, function_pb2.FunctionDef]) -> Any:
    """A ConcreteFunction with `graph`'s signature that runs `graph_def` (the rewritten
    body): it imports the GraphDef with the body's placeholders bound to its arguments.
    `functions` (ConcreteFunctions the GraphDef calls: fallback branches, rewritten
    nested bodies) are added to it first. The library functions it calls are taken from
    `library` (the trace's own), so that they are the very definitions the trace's graph
    has: TF refuses two different functions of one name in a graph."""
    placeholders = list(graph.inputs)
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in placeholders]
    placeholder_names = [t.op.name for t in placeholders]
    library = {**{f.signature.name: f for f in graph_def.library.function}, **library}
    pruned = tf.compat.v1.GraphDef()
    pruned.CopyFrom(graph_def)
    del pruned.library.function[:]
    for name in sorted(used_functions(graph_def.node, library)):
        pruned.library.function.add().CopyFrom(library[name])

    def body(*arguments: tf.Tensor) -> list[tf.Tensor]:
        for placeholder, argument in zip(placeholders, arguments):
            if placeholder.dtype in (tf.resource, tf.variant):
                handle_data_util.copy_handle_data(placeholder, argument)
        func_graph = tf.compat.v1.get_default_graph()
        for function in functions:
            function.add_to_graph(func_graph)
        # An output that is an argument passed through (a loop variable the body does not
        # change) is that argument: import binds placeholders but does not return them.
        passed = {f"{name}:0": argument for name, argument in zip(placeholder_names, arguments)}
        imported = iter(import_rewritten(
            pruned, placeholder_names, arguments,
            [name for name in output_names if name not in passed], control_names))
        return [tf.identity(passed[name]) if name in passed else next(imported)
                for name in output_names]

    body.__name__ = f"tfxla_lite_{graph.name}"
    return original_tf_function()(body, autograph=False).get_concrete_function(*specs)


def rename_functions(graph_def: tf.compat.v1.GraphDef,
                     renames: Mapping[tuple[str, str], str]) -> None:
    """Point attribute `attr` of node `node` at function `renames[node, attr]`, in place."""
    for node in graph_def.node:
        for attr in FUNCTION_ATTRS.get(node.op, ()):
            new = renames.get((node.name, attr))
            if new is not None:
                node.attr[attr].func.name = new


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
