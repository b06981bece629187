"""Assertions under must-compile (`jit_compile=True`): the nodes TF's XLA compiles away.

tf2xla's `Assert` emits nothing, so TF's XLA never checks an assertion. Before
clustering, `driver.cluster_graph` asks `dropped_nodes` for the same nodes: every
`Assert`, an `If` whose branches hold only assertions (`assertion_only`, the AssertGuard
of `tf.debugging.assert_*`), then to a fixed point every stateless node whose readers
all went and every unread string-valued one; the rewrite leaves them out (`without`).
Auto mode drops nothing: the assertion runs in TF, as plain TF checks it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import tensorflow as tf

ASSERT_OPS = frozenset({"Assert"})
DROPPED_REASON = ("assertion: compiled away under jit_compile=True, as TF's XLA does "
                  "(not checked)")
# What an assertion-only branch may hold besides dropped nodes.
_PLUMBING = frozenset({"Placeholder", "Identity", "IdentityN", "NoOp"})


def assertion_only(graph: tf.Graph, dropped: Collection[str]) -> bool:
    """Whether every op of a branch's `graph` is `dropped` or plumbing (an If is left out
    only when one of its branches also dropped something: `driver.compile_bodies`)."""
    return all(op.name in dropped or op.type in _PLUMBING for op in graph.get_operations())


def dropped_nodes(graph: tf.Graph, assertion_ifs: Iterable[str] = ()) -> frozenset[str]:
    """The names of the nodes of `graph` that must-compile leaves out: its Asserts, the
    If ops of `assertion_ifs` (their branches are `assertion_only`) whose outputs reach
    only unread Identity nodes, and the stateless nodes only those read."""
    outputs = {t.op.name for t in graph.outputs}
    dropped = {op.name for op in graph.get_operations() if op.type in ASSERT_OPS}
    for name in assertion_ifs:
        readers = _unread_identities(graph.get_operation_by_name(name), outputs)
        if readers is not None:
            dropped |= {name, *readers}
    changed = True
    while changed:
        changed = False
        for op in graph.get_operations():
            if op.name in dropped or op.name in outputs or op.type == "Placeholder":
                continue
            readers = [c for t in op.outputs for c in t.consumers()]
            unread = not readers and not op._control_outputs and _all_strings(op)
            if ((unread or (readers and all(c.name in dropped for c in readers)))
                    and not _is_stateful(op)):
                dropped.add(op.name)
                changed = True
    return frozenset(dropped)


def _unread_identities(op: tf.Operation, outputs: Collection[str]) -> set[str] | None:
    """The Identity nodes `op`'s outputs reach, when nothing else reads them and none is a
    graph output; None otherwise."""
    found: set[str] = set()
    pending = [c for t in op.outputs for c in t.consumers()]
    while pending:
        reader = pending.pop()
        if reader.type not in ("Identity", "IdentityN") or reader.name in outputs:
            return None
        if reader.name not in found:
            found.add(reader.name)
            pending.extend(c for t in reader.outputs for c in t.consumers())
    return found


def _all_strings(op: tf.Operation) -> bool:
    """Whether `op` makes only strings (an assertion's message, which no kernel reads
    once the Assert is gone: tf.function leaves such constants in the outer graph)."""
    return bool(op.outputs) and all(t.dtype == tf.string for t in op.outputs)


def _is_stateful(op: tf.Operation) -> bool:
    try:
        return bool(op.op_def.is_stateful)
    except (AttributeError, ValueError):  # an op without an OpDef (a function call)
        return True


def without(graph_def: Any, dropped: Collection[str]) -> Any:
    """`graph_def` without the `dropped` nodes and the control edges to them, in place;
    nothing left reads a dropped node's outputs (`dropped_nodes` makes sure)."""
    if not dropped:
        return graph_def
    kept = [node for node in graph_def.node if node.name not in dropped]
    for node in kept:
        inputs = [i for i in node.input if not (i.startswith("^") and i[1:] in dropped)]
        if len(inputs) != len(node.input):
            del node.input[:]
            node.input.extend(inputs)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    return graph_def
