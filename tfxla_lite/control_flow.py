"""Control flow, body by body: a loop body or branch compiled as a function of its own.

A While, If or Case op whose functions lower entirely joins a cluster whole as an HLO
`while` or `conditional` (clustering/rules_control_flow.py); this path is for the others
(and for every loop with `Options(hlo_control_flow=False)`). The driver
(`tfxla_lite/driver.py`, `compile_bodies`) makes each function of a While or If op a
graph of its own (`clustering/body_graphs.py`), marks, clusters and compiles it like a
traced function (`compile_graph`, recursively: a loop inside a loop body is handled the
same way), and `rewritten_body` traces the rewritten body, launch ops included, into a
new function with the same signature. The control-flow op stays in TensorFlow and calls
the new function (`rename_functions`): TF lowers it to Switch/Merge or Enter/Exit frames
when it runs the graph, and the launch ops run in those frames like any kernel. Clusters
of a body with unknown loop-carried dimensions take the per-shape path of
`tfxla_lite/dynamic.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops import handle_data_util

from tfxla_lite.clustering.body_graphs import FUNCTION_ATTRS, used_functions
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.rewrite import import_rewritten

CONTROL_FLOW_REASON = "control flow: stays in TF, its bodies are clustered inside"


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
