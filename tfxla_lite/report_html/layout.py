"""A layered layout for directed graphs, computed in Python (no Graphviz, no network).

Used by `report_html.svg` to draw TF graphs and HLO entry computations. The method is
Sugiyama's, kept small: break cycles (edges that close a cycle in a depth-first search
are ignored), put every node on its longest-path layer from the sources (sources themselves
just above their first consumer), then order
each layer by the barycenter of its neighbours in the layer before (down sweeps) and
after (up sweeps). Edges that skip layers are drawn as curves without dummy nodes,
which is enough for the graphs a report shows (tens to a few hundred nodes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SWEEPS = 4


@dataclass(frozen=True)
class Placement:
    layer: int
    position: int  # order within the layer, from 0


def acyclic_edges(nodes: Sequence[str], edges: Iterable[tuple[str, str]]
                  ) -> list[tuple[str, str]]:
    """`edges` without self-loops, unknown ends and the back edges of a depth-first search."""
    known = set(nodes)
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for source, target in edges:
        if source in known and target in known and source != target:
            successors[source].append(target)
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    kept: list[tuple[str, str]] = []
    for root in nodes:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(successors[root]))]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                continue
            if state.get(child) == 1:
                continue  # a back edge: it would close a cycle
            kept.append((node, child))
            if child not in state:
                state[child] = 1
                stack.append((child, iter(successors[child])))
    return kept


def layered_layout(nodes: Sequence[str], edges: Iterable[tuple[str, str]]
                   ) -> dict[str, Placement]:
    """A layer and an order within it for every node; edges point to higher layers."""
    kept = acyclic_edges(nodes, edges)
    predecessors: dict[str, list[str]] = {n: [] for n in nodes}
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for source, target in kept:
        predecessors[target].append(source)
        successors[source].append(target)

    # Longest path from the sources, in topological order (Kahn).
    remaining = {n: len(predecessors[n]) for n in nodes}
    ready = [n for n in nodes if remaining[n] == 0]
    layer = {n: 0 for n in nodes}
    while ready:
        node = ready.pop()
        for child in successors[node]:
            layer[child] = max(layer[child], layer[node] + 1)
            remaining[child] -= 1
            if remaining[child] == 0:
                ready.append(child)

    # Sources (constants, arguments) sit right above their first consumer rather than
    # all in layer 0, which would make the first layer as wide as the graph's inputs.
    for node in nodes:
        if not predecessors[node] and successors[node]:
            layer[node] = min(layer[child] for child in successors[node]) - 1

    depth = max(layer.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(depth)]
    for node in nodes:  # graph order as the first ordering: keeps sibling ops together
        layers[layer[node]].append(node)

    position = {n: i for row in layers for i, n in enumerate(row)}
    for sweep in range(SWEEPS):
        downward = sweep % 2 == 0
        order = range(1, depth) if downward else range(depth - 2, -1, -1)
        for index in order:
            neighbours = predecessors if downward else successors
            row = layers[index]

            def barycenter(node: str, row: list[str] = row,
                           neighbours: dict[str, list[str]] = neighbours) -> float:
                linked = neighbours[node]
                if not linked:
                    return float(position[node])
                return sum(position[n] for n in linked) / len(linked)

            row.sort(key=barycenter)
            for i, node in enumerate(row):
                position[node] = i
    return {n: Placement(layer[n], position[n]) for n in nodes}
