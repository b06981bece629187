"""Function-call inlining: a traced graph with its nested function calls spelled out.

The step before marking (docs/architecture.md, section 2). A `tf.function` called
inside another one, and layers or libraries that wrap their work in `tf.function`,
leave `PartitionedCall` / `StatefulPartitionedCall` nodes whose bodies are
FunctionDefs of the graph's library; marking sees only the call node, so none of
the body can join the caller's clusters. `inline_function_calls` copies each body
into the caller's GraphDef under the call node's name, as TF's runtime inliner
(`inline_function_utils.cc`) does before it runs the graph, and re-imports the result
into a fresh graph that the compiler marks, clusters and rewrites instead of the
traced one. Stateful ops of a body come along as they are, so marking keeps them in
TF, with their control edges.

What must hold for the driver's rewrite (`tfxla_lite/driver.py`, `rewrite`), and does:

- Every node of the traced graph keeps its name, its placeholders (arguments and
  captures) included; a resource placeholder keeps its handle data, so variable
  reads have their shapes.
- A call node becomes an `IdentityN` of the same name over the body's results, so
  every reference to `call:i` (consumers, the function's outputs) still names the
  same value, and `^call` still waits for the body's control outputs (its variable
  writes), as a call does. The IdentityN may join a cluster, so a call among the
  function's control outputs is replaced there by its body's control outputs.
- Control inputs of a call reach every body node that has no other inputs.

Not inlined: calls of functions that say not to be (`_noinline`), that name an
implementation to be swapped (`api_implements`, `_implements`), that TF's XLA must
compile (`_XlaMustCompile`: `jit_compile=True`, tfxla-lite's XLA fallback), that tfxla-lite
compiled already (`is_compiled_function`), or that are not in the library; and bodies
of control flow (If, While), which are not calls (`body_graphs.py`). A must-compile
function therefore never reaches marking as ops among the caller's: a
`tfxla_lite.function(jit_compile=True)` called in a trace is its own compiled call, or
TF's XLA call where it falls back (`tfxla_lite/xla_fallback.py`) or where a custom
gradient of it may be taken (`api.Function._custom_gradient_on_xla`), so the caller's
auto-clustering cost rules never leave its ops to TF kernels that may not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def
from tensorflow.python.ops import handle_data_util

CALL_OP_TYPES = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
# The ops tfxla-lite's rewrite puts in a graph (tfxla_lite/rewrite.py).
COMPILED_OP_TYPES = frozenset({"TfxlaLiteLaunch", "TfxlaLiteVariableLaunch",
                               "TfxlaLiteCompile"})
# Function attributes that ask for the call to stay a call; `_XlaMustCompile` marks a
# `jit_compile=True` function TF's XLA runs (tfxla-lite's fallback, Keras's grouped
# convolutions), which inlined would put ops TF's CPU kernels may refuse among TF's.
_KEEP_CALL_ATTRIBUTES = ("_noinline", "api_implements", "_implements", "_XlaMustCompile")
# Nested calls deeper than this stay calls (a guard against recursive libraries).
MAX_DEPTH = 16


def has_function_calls(graph: tf.Graph) -> bool:
    return any(op.type in CALL_OP_TYPES for op in graph.get_operations())


def inline_function_calls(graph: tf.Graph) -> tf.Graph | None:
    """A new graph with `graph`'s function calls inlined (recursively), or None when
    there is nothing to inline. See the module docstring for what it keeps."""
    if not has_function_calls(graph):
        return None
    graph_def = graph.as_graph_def(add_shapes=True)
    library = {f.signature.name: f for f in graph_def.library.function}
    waits_for: dict[str, list[str]] = {}
    for _ in range(MAX_DEPTH):
        calls = [n for n in graph_def.node if _inlinable(n, library)]
        if not calls:
            break
        graph_def = inline_calls(graph_def, calls, library, waits_for)
    if not waits_for:
        return None
    control_outputs = _resolve([op.name for op in getattr(graph, "control_outputs", [])],
                               waits_for)
    return _import(graph_def, graph, control_outputs)


def _resolve(names: list[str], waits_for: Mapping[str, list[str]]) -> list[str]:
    """Control outputs with each inlined call replaced by its body's control outputs
    (the stateful ops, which stay in TF), so that none names a node a cluster absorbs."""
    resolved: list[str] = []
    pending = list(names)
    while pending:
        name = pending.pop(0)
        if name in waits_for:
            pending[:0] = waits_for[name]
        elif name not in resolved:
            resolved.append(name)
    return resolved


def _inlinable(node: Any, library: Mapping[str, function_pb2.FunctionDef]) -> bool:
    if node.op not in CALL_OP_TYPES:
        return False
    function = library.get(node.attr["f"].func.name)
    if function is None:
        return False
    attributes = function.attr
    if any(name in attributes and (attributes[name].b or attributes[name].s)
           for name in _KEEP_CALL_ATTRIBUTES):
        return False
    return not is_compiled_function(function.signature.name, library)


def is_compiled_function(name: str, library: Mapping[str, function_pb2.FunctionDef]) -> bool:
    """Whether function `name` is tfxla-lite's output already: it, or a function it uses,
    holds a launch op. Such a call (Keras' compiled step inside its outer loop function,
    both traced through the patched tf.function) stays a call, as TF keeps a call of a
    jit_compile=True function out of the caller's clusters: compiling it again would
    only re-cluster what is left around its launch ops."""
    seen: set[str] = set()
    pending = [name]
    while pending:
        current = pending.pop()
        if current in seen or current not in library:
            continue
        seen.add(current)
        for node in library[current].node_def:
            if node.op in COMPILED_OP_TYPES:
                return True
            for value in node.attr.values():
                if value.HasField("func"):
                    pending.append(value.func.name)
                pending.extend(f.name for f in value.list.func)
    return False


def inline_calls(graph_def: tf.compat.v1.GraphDef, calls: Iterable[Any],
                 library: Mapping[str, function_pb2.FunctionDef],
                 waits_for: dict[str, list[str]]) -> tf.compat.v1.GraphDef:
    """A copy of `graph_def` with each call node of `calls` replaced by its body;
    `waits_for[call name]` gets the body's control outputs, renamed."""
    call_names = {node.name for node in calls}
    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    taken = {node.name for node in graph_def.node}
    for node in graph_def.node:
        if node.name not in call_names:
            result.node.add().CopyFrom(node)
            continue
        body = library[node.attr["f"].func.name]
        nodes = _inlined_body(node, body, taken)
        result.node.extend(nodes)
        waits_for[node.name] = [r[1:] for r in nodes[-1].input if r.startswith("^")]
    return result


def _inlined_body(call: Any, body: function_pb2.FunctionDef, taken: set[str]) -> list[Any]:
    """The nodes that replace `call`: its body under the call's name, an Identity per
    argument, and an IdentityN named like the call over the body's results."""
    body_graph, flat_names = function_def_to_graph_def(body)
    prefix = _unique_prefix(call.name, taken)
    renamed = {node.name: f"{prefix}/{node.name}" for node in body_graph.node}
    taken.update(renamed.values())
    data_inputs = [i for i in call.input if not i.startswith("^")]
    control_inputs = [i for i in call.input if i.startswith("^")]
    arguments = [arg.name for arg in body.signature.input_arg]
    if len(arguments) != len(data_inputs):
        raise ValueError(f"call {call.name} passes {len(data_inputs)} inputs to "
                         f"{body.signature.name}, which takes {len(arguments)}")

    nodes = []
    for node in body_graph.node:
        copy = tf.compat.v1.NodeDef()
        if node.name in arguments:
            # The argument's placeholder becomes an Identity of what the call passed.
            copy.name, copy.op = renamed[node.name], "Identity"
            copy.attr["T"].type = node.attr["dtype"].type
            copy.input.append(data_inputs[arguments.index(node.name)])
            copy.input.extend(control_inputs)
            copy.device = call.device
            nodes.append(copy)
            continue
        copy.CopyFrom(node)
        copy.name = renamed[node.name]
        del copy.input[:]
        copy.input.extend(_rename_reference(r, renamed) for r in node.input)
        if not node.input:  # a source (Const, VarHandleOp): it waits as the call did
            copy.input.extend(control_inputs)
        if not copy.device:
            copy.device = call.device
        _rename_colocations(copy, renamed)
        nodes.append(copy)

    results = [_rename_reference(_graph_reference(flat_names[body.ret[arg.name]]), renamed)
               for arg in body.signature.output_arg]
    controls = [f"^{renamed[name]}" for name in body.control_ret.values()]
    output = tf.compat.v1.NodeDef(name=call.name, device=call.device)
    if results:
        output.op = "IdentityN"
        output.attr["T"].list.type.extend(call.attr["Tout"].list.type)
        output.input.extend(results)
    else:
        output.op = "NoOp"
    output.input.extend(controls)
    if "_output_shapes" in call.attr:
        output.attr["_output_shapes"].CopyFrom(call.attr["_output_shapes"])
    nodes.append(output)
    return nodes


def _unique_prefix(name: str, taken: set[str]) -> str:
    prefix, suffix = name, 0
    while any(n == prefix or n.startswith(prefix + "/") for n in taken if n != name):
        suffix += 1
        prefix = f"{name}_inlined_{suffix}"
    return prefix


def _graph_reference(tensor_name: str) -> str:
    """'op:0' → 'op', as GraphDef inputs write output 0."""
    return tensor_name[:-2] if tensor_name.endswith(":0") else tensor_name


def _rename_reference(reference: str, renamed: Mapping[str, str]) -> str:
    control = reference.startswith("^")
    name = reference[1:] if control else reference
    op, _, index = name.partition(":")
    op = renamed.get(op, op)
    name = f"{op}:{index}" if index else op
    return f"^{name}" if control else name


def _rename_colocations(node: Any, renamed: Mapping[str, str]) -> None:
    if "_class" not in node.attr:
        return
    constraints = [c.decode() for c in node.attr["_class"].list.s]
    del node.attr["_class"].list.s[:]
    for constraint in constraints:
        if constraint.startswith("loc:@"):
            constraint = "loc:@" + renamed.get(constraint[5:], constraint[5:])
        node.attr["_class"].list.s.append(constraint.encode())


def _import(graph_def: tf.compat.v1.GraphDef, original: tf.Graph,
            control_outputs: list[str]) -> tf.Graph:
    """`graph_def` in a new FuncGraph whose placeholders are those of `original` again,
    by name, with their handle data (import alone would lose it, and with it the shapes
    of variable reads), and whose inputs, outputs and control outputs are the same by
    name."""
    placeholders = {op.name: op.outputs[0] for op in original.get_operations()
                    if op.type == "Placeholder"}
    kept = tf.compat.v1.GraphDef()
    kept.versions.CopyFrom(graph_def.versions)
    kept.library.CopyFrom(graph_def.library)
    kept.node.extend(n for n in graph_def.node if n.name not in placeholders)
    if any("_class" in n.attr for n in kept.node):
        # A colocation with a placeholder (IteratorGetNext with its iterator argument, in
        # Keras' multi_step_on_iterator) names a node this import does not create, which
        # import_graph_def rejects; the placeholder is an argument, placed with the call.
        kept = without_colocation_outside(kept, {n.name for n in kept.node})
    inlined = FuncGraph(f"{getattr(original, 'name', 'graph')}_inlined")
    if _scopes_of(placeholders) & {n.name for n in kept.node}:
        _import_whole(inlined, graph_def, kept, placeholders)
    else:
        with inlined.as_default():
            input_map = {}
            for name, tensor in placeholders.items():
                new = tf.compat.v1.placeholder(tensor.dtype, tensor.shape, name=name)
                if new.op.name != name:
                    raise ValueError(f"placeholder {name} was renamed {new.op.name}")
                handle_data_util.copy_handle_data(tensor, new)
                for attr, value in tensor.op.node_def.attr.items():
                    if attr.startswith("_tfxla_lite"):  # a loop body's argument annotations
                        new.op._set_attr(attr, value)  # noqa: SLF001 - no public setter
                input_map[f"{name}:0"] = new
            used = {r.split(":")[0].lstrip("^") for n in kept.node for r in n.input}
            input_map = {k: v for k, v in input_map.items() if k[:-2] in used}
            tf.graph_util.import_graph_def(kept, input_map=input_map, name="")
    inlined.inputs = [inlined.get_tensor_by_name(t.name)
                      for t in getattr(original, "inputs", [])]
    inlined.outputs = [inlined.get_tensor_by_name(t.name)
                       for t in getattr(original, "outputs", [])]
    inlined.control_outputs = [inlined.get_operation_by_name(name) for name in control_outputs]
    # The captures stay with the original graph; clustering still needs where their
    # variables live (clustering/cluster.py).
    inlined._tfxla_lite_capture_devices = capture_devices(original)
    return inlined


def capture_devices(graph: tf.Graph) -> dict[str, str]:
    """Placeholder name -> the device of the resource handle it captures (a FuncGraph's
    captures), for the handles whose device is known."""
    found = dict(getattr(graph, "_tfxla_lite_capture_devices", {}))
    for external, internal in getattr(graph, "captures", ()):
        if internal.dtype == tf.resource and getattr(external, "device", ""):
            found[internal.op.name] = external.device
    return found


def _scopes_of(names: Iterable[str]) -> set[str]:
    """The name scopes that names like 'a/b/c' open ('a', 'a/b')."""
    scopes = set()
    for name in names:
        parts = name.split("/")
        scopes.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return scopes


def _import_whole(inlined: tf.Graph, graph_def: tf.compat.v1.GraphDef,
                  kept: tf.compat.v1.GraphDef, placeholders: Mapping[str, tf.Tensor]) -> None:
    """Import `kept` with its placeholders into the empty `inlined` at once, for a graph
    with a node named like a placeholder's scope ('CollectiveReduceV2' beside the captured
    'CollectiveReduceV2/group_size' in Keras's loop under MultiWorkerMirroredStrategy):
    import_graph_def renames a node whose name a scope of the graph already takes, so
    placeholders made first would rename it. Their handle data is set afterwards, passed
    on through Identity and IdentityN, and the traced shapes (`_output_shapes`) set."""
    whole = tf.compat.v1.GraphDef()
    whole.CopyFrom(kept)
    whole.node.extend(n for n in graph_def.node if n.name in placeholders)
    with inlined.as_default():
        tf.graph_util.import_graph_def(whole, name="")
    for name, tensor in placeholders.items():
        handle_data_util.copy_handle_data(tensor, inlined.get_tensor_by_name(f"{name}:0"))
    shapes = {n.name: n.attr["_output_shapes"].list.shape for n in whole.node
              if "_output_shapes" in n.attr}
    forwarded = [op for op in inlined.get_operations() if op.type in ("Identity", "IdentityN")
                 and any(t.dtype == tf.resource for t in op.outputs)]
    for _ in range(MAX_DEPTH):  # forwarding chains: an argument of an argument
        for op in forwarded:
            for source, target in zip(op.inputs, op.outputs):
                if target.dtype == tf.resource:
                    handle_data_util.copy_handle_data(source, target)
    for op in inlined.get_operations():
        for tensor, shape in zip(op.outputs, shapes.get(op.name, ())):
            if tensor.dtype != tf.resource:
                tensor.set_shape(tf.TensorShape(shape))


def without_colocation_outside(graph_def: tf.compat.v1.GraphDef,
                                present: set[str]) -> tf.compat.v1.GraphDef:
    """A copy of `graph_def` whose `_class: loc:@op` colocation constraints name only
    ops in `present` (import_graph_def rejects a constraint on an op it cannot find)."""
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    for node in result.node:
        if "_class" not in node.attr:
            continue
        kept = [c for c in node.attr["_class"].list.s
                if not c.startswith(b"loc:@") or c[5:].decode() in present]
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
        if not kept:
            del node.attr["_class"]
    return result
