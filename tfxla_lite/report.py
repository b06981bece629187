"""The clustering report: which ops compiled in which cluster, and why the rest did not.

Made by `tfxla_lite.explain(f, *args)` and kept on every compiled program, so
that a user can see, for each node of a traced function, whether it runs in a
compiled cluster or stays in TensorFlow, with the reason and the Python line
that created it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterReport:
    name: str
    ops: tuple[tuple[str, str], ...]  # (op name, op type) in topological order
    num_inputs: int
    num_outputs: int
    compiled: bool
    error: str | None = None
    kernel_count: int = 0
    temp_bytes: int = 0
    temp_bytes_without_reuse: int = 0


@dataclass(frozen=True)
class FallbackNode:
    """A node left to TensorFlow, and why."""

    op_name: str
    op_type: str
    reason: str
    source: str | None


@dataclass
class ClusteringReport:
    function_name: str
    jit_compile: bool | None
    clusters: list[ClusterReport] = field(default_factory=list)
    fallbacks: list[FallbackNode] = field(default_factory=list)
    note: str | None = None  # set when the whole function was left to TensorFlow

    @property
    def compiled_clusters(self) -> list[ClusterReport]:
        return [c for c in self.clusters if c.compiled]

    def cluster_of(self, op_name: str) -> str | None:
        for cluster in self.compiled_clusters:
            if any(name == op_name for name, _ in cluster.ops):
                return cluster.name
        return None

    def __str__(self) -> str:
        mode = {True: "must-compile", None: "auto-clustering", False: "off"}[self.jit_compile]
        lines = [f"tfxla-lite clustering report for {self.function_name} ({mode})"]
        if self.note:
            lines.append(f"  {self.note}")
        for cluster in self.clusters:
            state = "compiled" if cluster.compiled else f"NOT compiled: {cluster.error}"
            lines.append(f"  {cluster.name}: {len(cluster.ops)} ops, {cluster.num_inputs} inputs, "
                         f"{cluster.num_outputs} outputs, {state}")
            if cluster.compiled:
                lines.append(f"    {cluster.kernel_count} kernels, temp arena "
                             f"{cluster.temp_bytes} bytes ({cluster.temp_bytes_without_reuse} "
                             "without buffer reuse)")
            for name, op_type in cluster.ops:
                lines.append(f"    {op_type:<20} {name}")
        if self.fallbacks:
            lines.append("  left in TensorFlow:")
            width = max(len(f.op_type) for f in self.fallbacks)
            for node in self.fallbacks:
                where = f"  [{node.source}]" if node.source else ""
                lines.append(f"    {node.op_type:<{width}} {node.op_name}: {node.reason}{where}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:  # IPython
        printer.text(str(self))  # type: ignore[attr-defined]
