"""Cluster formation: contract edges between compilable ops without creating cycles.

The step after marking, as TF's mark_for_compilation_pass: one cluster per compilable
op, then an edge u→v between clusters on one device is contracted only when no other
path u⇝v exists, to a fixed point; small clusters (by ops other than `TRIVIAL_OPS`)
are dropped. Consts never join by contraction (a Const read by one cluster is absorbed,
its value embedded); a pass-through op with control inputs joins only after the fixed
point. Clusters that no path joins then merge into one launch
(`merge_independent_clusters`). docs/architecture.md, section 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from tfxla_lite.clustering.control_flow_ops import FUNCTIONAL_OPS
from tfxla_lite.clustering.inline import capture_devices
from tfxla_lite.clustering.mark import Decision, MarkOptions, mark
from tfxla_lite.clustering.registry import OP_RULES, known_dims
from tfxla_lite.clustering.rules_variables import WRITES

if TYPE_CHECKING:
    import tensorflow as tf

TRIVIAL_OPS = frozenset({"Const", "Identity", "StopGradient", "Snapshot", "PreventGradient"})


@dataclass
class Cluster:
    """A set of ops compiled together, and the tensors and control edges crossing it.

    `inputs`: tensor names ('op:idx') read from outside, in first-use order, except
    values of Const ops (embedded) and inputs whose values the lowering never reads
    (e.g. Reshape's shape). `outputs`: tensors made inside and used outside or
    returned by the function. `control_inputs`: outside ops with control edges into
    the cluster; `control_outputs`: outside ops with control edges from it.
    """

    name: str
    op_names: list[str]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    control_inputs: list[str] = field(default_factory=list)
    control_outputs: list[str] = field(default_factory=list)
    device: str = ""

    @property
    def size(self) -> int:
        return len(self.op_names)


@dataclass
class ClusteringResult:
    """Decisions for every op and the clusters formed from the compilable ones."""

    decisions: dict[str, Decision]
    clusters: list[Cluster]

    def cluster_of(self, op_name: str) -> Cluster | None:
        for cluster in self.clusters:
            if op_name in cluster.op_names:
                return cluster
        return None

    def summary(self) -> str:
        """A short text report: one line per cluster, one per op left out, with why."""
        lines = [f"{len(self.clusters)} cluster(s)"]
        for c in self.clusters:
            lines.append(f"  {c.name}: {len(c.op_names)} ops, {len(c.inputs)} inputs, "
                         f"{len(c.outputs)} outputs")
        clustered = {name for c in self.clusters for name in c.op_names}
        for d in self.decisions.values():
            if d.op_name not in clustered:
                why = d.reason or "compilable, but its cluster was too small"
                where = f" ({d.source})" if d.source else ""
                lines.append(f"  not compiled: {d.op_name} [{d.op_type}]: {why}{where}")
        return "\n".join(lines)


def counted_size(op_types: Iterable[str]) -> int:
    """The size a cluster is measured by: its ops other than TRIVIAL_OPS; a loop or branch
    (whose functions' ops it holds) counts as a cluster of the default minimum size."""
    return sum(_CONTROL_FLOW_SIZE if t in FUNCTIONAL_OPS else 1 for t in op_types
               if t not in TRIVIAL_OPS)


_CONTROL_FLOW_SIZE = 4


def _dependency_graph(ops: list[tf.Operation]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(op.name for op in ops)
    for op in ops:
        for tensor in op.inputs:
            graph.add_edge(tensor.op.name, op.name)
        for control in op.control_inputs:
            graph.add_edge(control.name, op.name)
    return graph


def _contract(ops: list[tf.Operation], candidates: set[str], max_size: int | None,
              order: dict[str, int], deferred: frozenset[str] = frozenset()
              ) -> dict[str, list[str]]:
    """Edge contraction to a fixed point; returns representative -> member op names.

    The `deferred` candidates take part only once nothing else contracts (paths
    through them still count against cycles from the start)."""
    by_name = {op.name: op for op in ops}
    contracted = _dependency_graph(ops)
    members = {name: [name] for name in candidates}
    sizes = {name: counted_size([by_name[name].type]) for name in candidates}
    waiting = set(deferred) & candidates
    changed = True
    while changed or waiting:
        if not changed:  # a fixed point without the deferred ops: now with them
            waiting.clear()
        changed = False
        for u in sorted(members, key=order.__getitem__):
            if u not in members or u in waiting:  # merged away earlier, or deferred
                continue
            for v in sorted(contracted.successors(u), key=order.__getitem__):
                if v not in members or v in waiting or by_name[u].device != by_name[v].device:
                    continue
                if max_size is not None and sizes[u] + sizes[v] > max_size:
                    continue
                if not _only_path_is_direct(contracted, u, v):
                    continue
                for p in list(contracted.predecessors(v)):
                    if p != u:
                        contracted.add_edge(p, u)
                for s in list(contracted.successors(v)):
                    contracted.add_edge(u, s)
                contracted.remove_node(v)
                members[u].extend(members.pop(v))
                sizes[u] += sizes.pop(v)
                changed = True
    return members


def _only_path_is_direct(graph: nx.DiGraph, u: str, v: str) -> bool:
    """True when the edge u→v is the only path from u to v."""
    if graph.out_degree(u) == 1 or graph.in_degree(v) == 1:
        return True  # cheap common case: chains
    graph.remove_edge(u, v)
    try:
        return not nx.has_path(graph, u, v)
    finally:
        graph.add_edge(u, v)


# A TensorList (a variant) is an HLO tuple only inside a cluster: it never crosses one's edge.
LIST_BOUNDARY_REASON = "TensorList that would cross a cluster's boundary"


def form_clusters(graph: tf.Graph, decisions: dict[str, Decision], min_cluster_size: int = 4,
                  max_cluster_size: int | None = None, merge_independent: bool = True
                  ) -> list[Cluster]:
    """Clusters of compilable ops, named cluster_0, cluster_1... in topological order.

    `merge_independent`: clusters with no path between them merge into one launch
    (`merge_independent_clusters`). An op that would pass a TensorList across a cluster's
    edge is refused in `decisions` (LIST_BOUNDARY_REASON) and the clusters formed again."""
    while True:
        clusters = _form_clusters(graph, decisions, min_cluster_size, max_cluster_size,
                                  merge_independent)
        refused = _list_crossings(graph, clusters)
        if not refused:
            return clusters
        for name in refused:
            decisions[name] = dataclasses.replace(decisions[name], compilable=False,
                                                  reason=LIST_BOUNDARY_REASON)


def _list_crossings(graph: tf.Graph, clusters: list[Cluster]) -> set[str]:
    """The ops of `clusters` that read a TensorList from outside or give one (or a
    resource handle) outside."""
    refused = set()
    for cluster in clusters:
        inside = set(cluster.op_names)
        for name in cluster.inputs:
            tensor = graph.get_tensor_by_name(name)
            if tensor.dtype.base_dtype.name == "variant":
                refused.update(op.name for op in tensor.consumers() if op.name in inside)
        for name in cluster.outputs:  # nor a loop's variable handle, passed on
            tensor = graph.get_tensor_by_name(name)
            if tensor.dtype.base_dtype.name in ("variant", "resource"):
                refused.add(tensor.op.name)
    return refused


def _form_clusters(graph: tf.Graph, decisions: dict[str, Decision], min_cluster_size: int,
                   max_cluster_size: int | None, merge_independent: bool) -> list[Cluster]:
    ops = graph.get_operations()
    dependencies = _dependency_graph(ops)
    index = {op.name: n for n, op in enumerate(ops)}
    topo = list(nx.lexicographical_topological_sort(dependencies, key=index.__getitem__))
    order = {name: n for n, name in enumerate(topo)}
    by_name = {op.name: op for op in ops}

    # A Const with control inputs (gradients make them: `with control_dependencies([grad])`)
    # sits on paths between ops, so it contracts like any op; otherwise the path through
    # it would keep its producer and consumers apart.
    candidates = {name for name, d in decisions.items()
                  if d.compilable and name in by_name
                  and (by_name[name].type != "Const" or by_name[name].control_inputs)}
    # A pass-through op with control inputs (the Identity of a tf.function's result,
    # which waits for the variable writes) joins last: merged with its producer first,
    # it would keep that producer out of the cluster that feeds the writes, since the
    # path through the writes would close a cycle. Left alone it stays in TF for free.
    deferred = frozenset(name for name in candidates if by_name[name].control_inputs
                         and by_name[name].type in TRIVIAL_OPS - {"Const"})
    groups = _contract(ops, candidates, max_cluster_size, order, deferred)

    owner: dict[str, str] = {}
    kept: list[list[str]] = []
    for group in groups.values():
        if counted_size(by_name[n].type for n in group) >= max(min_cluster_size, 1):
            kept.append(group)
    kept.sort(key=lambda g: min(order[n] for n in g))
    if merge_independent:
        kept = merge_independent_clusters(kept, dependencies, topo, by_name, max_cluster_size)
    for number, group in enumerate(kept):
        for name in group:
            owner[name] = f"cluster_{number}"
    _absorb_constants(ops, decisions, owner)

    edges = _CrossingEdges(ops)
    clusters = []
    for number in range(len(kept)):
        name = f"cluster_{number}"
        op_names = sorted((n for n, c in owner.items() if c == name), key=order.__getitem__)
        clusters.append(_describe(graph, name, [by_name[n] for n in op_names], edges))
    return clusters


def merge_independent_clusters(groups: list[list[str]], dependencies: nx.DiGraph,
                               topo: list[str], by_name: dict[str, tf.Operation],
                               max_size: int | None) -> list[list[str]]:
    """Merge clusters that no path joins, in either direction, into one launch each.

    Independent work (each variable's optimizer update) would otherwise be a launch op
    apiece. A cluster joins the first earlier group (topological order) it neither
    reaches nor is reached from, on the same device and within `max_size`; clusters with
    unknown dimensions stay apart. `reach[g]`, a bit set of the clusters reachable from
    group g, is kept transitively closed as groups merge, so no merge closes a cycle
    through a third cluster (docs/architecture.md, section 2).
    """
    if len(groups) < 2:
        return groups
    owner = {name: n for n, group in enumerate(groups) for name in group}
    # Clusters reachable from each op: successors' own bits and what they reach, from the
    # sinks up.
    below: dict[str, int] = {}
    for name in reversed(topo):
        bits = 0
        for successor in dependencies.successors(name):
            bits |= below[successor]
            if successor in owner:
                bits |= 1 << owner[successor]
        below[name] = bits
    reach = [0] * len(groups)
    for name, n in owner.items():
        reach[n] |= below[name]
    mask = [1 << n for n in range(len(groups))]
    for n in range(len(groups)):
        reach[n] &= ~mask[n]  # a path leaving a cluster and coming back is contraction's
    sizes = [counted_size(by_name[name].type for name in group) for group in groups]
    mergeable = [_static(by_name[name] for name in group) for group in groups]
    device = [by_name[group[0]].device for group in groups]
    # A device-less variable read runs where its variable lives (a MirroredStrategy
    # replica's on that replica's device): one launch must not read variables of two.
    variables = _variable_devices(groups, by_name)
    leader = list(range(len(groups)))  # the group each one now belongs to
    for n in range(1, len(groups)):
        if not mergeable[n]:
            continue
        for m in range(n):
            if (leader[m] != m or not mergeable[m] or device[m] != device[n]
                    or len(variables[m] | variables[n]) > 1
                    or (max_size is not None and sizes[m] + sizes[n] > max_size)
                    or reach[m] & mask[n] or reach[n] & mask[m]):
                continue
            mask[m] |= mask[n]
            reach[m] |= reach[n]
            variables[m] |= variables[n]
            sizes[m] += sizes[n]
            leader[n] = m
            for other in range(len(groups)):
                if leader[other] == other and reach[other] & mask[m]:
                    reach[other] |= reach[m]
            break
    merged: dict[int, list[str]] = {}
    for n, group in enumerate(groups):
        merged.setdefault(leader[n], []).extend(group)
    return list(merged.values())


def _variable_devices(groups: list[list[str]], by_name: dict[str, tf.Operation]
                      ) -> list[set[str]]:
    """The devices of the captured variables each group reads, as far as the graph says
    (`inline.capture_devices`: a FuncGraph's captures, or those an inlined graph kept)."""
    if not groups:
        return []
    where = capture_devices(by_name[groups[0][0]].graph)
    result = []
    for group in groups:
        found = set()
        for name in group:
            for tensor in by_name[name].inputs:
                if tensor.dtype.name == "resource":
                    while tensor.op.type in ("Identity", "IdentityN") and tensor.op.inputs:
                        tensor = tensor.op.inputs[tensor.value_index
                                                  if tensor.op.type == "IdentityN" else 0]
                    found.add(where.get(tensor.op.name, ""))
        result.append(found - {""})
    return result


def _static(ops: Iterable[tf.Operation]) -> bool:
    """Every dim known at compile time, as lowering knows them (`known_dims`: also the
    outputs TF's shape inference leaves unknown but whose values fold, e.g.
    BroadcastGradientArgs' in a gradient)."""
    return all(known_dims(t) is not None for op in ops for t in list(op.inputs) + op.outputs
               if t.dtype.base_dtype.name not in ("resource", "variant"))


class _CrossingEdges:
    """Who reads each tensor and who waits on each op, computed once per graph."""

    def __init__(self, ops: list[tf.Operation]) -> None:
        self.readers: dict[str, list[str]] = {}
        self.waiters: dict[str, list[str]] = {}
        for op in ops:
            for tensor in op.inputs:
                self.readers.setdefault(tensor.name, []).append(op.name)
            for control in op.control_inputs:
                self.waiters.setdefault(control.name, []).append(op.name)


def _absorb_constants(ops: list[tf.Operation], decisions: dict[str, Decision],
                      owner: dict[str, str]) -> None:
    """Put each compilable Const whose every consumer is in one cluster into that cluster."""
    consumers: dict[str, set[str | None]] = {}
    for op in ops:
        for tensor in op.inputs:
            consumers.setdefault(tensor.op.name, set()).add(owner.get(op.name))
        for control in op.control_inputs:
            consumers.setdefault(control.name, set()).add(None)
    for op in ops:
        decision = decisions.get(op.name)
        if op.type != "Const" or decision is None or not decision.compilable:
            continue
        users = consumers.get(op.name, set())
        if len(users) == 1 and None not in users and not op.control_inputs:
            owner[op.name] = next(iter(users))  # type: ignore[assignment]


def _describe(graph: tf.Graph, name: str, ops: list[tf.Operation], edges: _CrossingEdges
              ) -> Cluster:
    inside = {op.name for op in ops}
    returned = {t.name for t in getattr(graph, "outputs", [])}
    inputs: list[str] = []
    control_inputs: list[str] = []
    for op in ops:
        value_free = OP_RULES[op.type].value_free_indices(op)
        for i, tensor in enumerate(op.inputs):
            if (i in value_free or tensor.op.name in inside or tensor.op.type == "Const"
                    or tensor.name in inputs):
                continue
            inputs.append(tensor.name)
        for control in op.control_inputs:
            if control.name not in inside and control.name not in control_inputs:
                control_inputs.append(control.name)

    outputs: list[str] = []
    control_outputs: list[str] = []
    for op in ops:
        for tensor in op.outputs:
            readers = edges.readers.get(tensor.name, [])
            if tensor.name in returned or any(r not in inside for r in readers):
                outputs.append(tensor.name)
        for waiter in edges.waiters.get(op.name, []):
            if waiter not in inside and waiter not in control_outputs:
                control_outputs.append(waiter)
    outputs.extend(_reads_after_writes(ops, outputs))
    device = ops[0].device if ops else ""
    return Cluster(name, [op.name for op in ops], inputs, outputs, control_inputs,
                   control_outputs, device)


_READS = ("ReadVariableOp", "ResourceGather")


def _reads_after_writes(ops: list[tf.Operation], outputs: list[str]) -> list[str]:
    """Reads of a variable after the cluster wrote it, whose floating value flows into
    `outputs`: extra outputs, so that a gradient of the launch takes the value the
    launch read from the launch (tfxla_lite/gradients.py), as TF's XLA keeps a
    differentiated function's intermediates, since only the launch holds it."""
    by_name = {op.name: op for op in ops}
    written = {t.name for op in ops for t in op.inputs[:WRITES.get(op.type, 0)]}
    if not written:
        return []
    # Backwards: data edges alone, and data and control edges (which hold TF's order of
    # one variable's ops).
    data: dict[str, list[str]] = {}
    earlier: dict[str, list[str]] = {}
    for op in ops:
        sources = [t.op.name for t in op.inputs if t.op.name in by_name]
        data[op.name] = sources
        earlier[op.name] = sources + [c.name for c in op.control_inputs if c.name in by_name]
    floating = [name.split(":")[0] for name in outputs
                if ops[0].graph.get_tensor_by_name(name).dtype.is_floating]
    feeding = set(floating) | reached(floating, data)
    found = []
    for name in feeding:
        op = by_name[name]
        if (op.type in _READS and op.outputs[0].dtype.is_floating
                and op.outputs[0].name not in outputs and op.inputs[0].name in written
                and any(op.inputs[0].name in
                        {t.name for t in by_name[n].inputs[:WRITES.get(by_name[n].type, 0)]}
                        for n in reached([name], earlier))):
            found.append(op.outputs[0].name)
    return sorted(found)


def reached(start: Sequence[str], edges: dict[str, list[str]]) -> set[str]:
    """The nodes reached from the nodes `start` along `edges`, `start` excluded (unless
    reached again)."""
    seen: set[str] = set()
    pending = [n for name in start for n in edges.get(name, [])]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(edges.get(name, []))
    return seen


def cluster_graph(graph: tf.Graph, options: MarkOptions | None = None,
                  min_cluster_size: int = 4, max_cluster_size: int | None = None,
                  merge_independent: bool = True) -> ClusteringResult:
    """Mark and cluster `graph` in one call."""
    decisions = mark(graph, options)
    return ClusteringResult(decisions, form_clusters(graph, decisions, min_cluster_size,
                                                     max_cluster_size, merge_independent))
