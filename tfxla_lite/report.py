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


@dataclass(frozen=True)
class JitCompileFallback:
    """Why a `jit_compile=True` trace did not run as one tfxla-lite program, and where it
    ran instead (`tfxla_lite/xla_fallback.py`)."""

    target: str  # "xla": TF's XLA ran the whole trace; "auto": auto-clustering
    reason: str
    ops: tuple[FallbackNode, ...]  # the ops tfxla-lite could not compile that decided it
    compute_ops: int = 0  # the trace's compute ops, which TF's XLA ran ("xla")

    @property
    def runs_on_xla(self) -> bool:
        return self.target == "xla"


@dataclass
class ClusteringReport:
    function_name: str
    jit_compile: bool | None
    clusters: list[ClusterReport] = field(default_factory=list)
    fallbacks: list[FallbackNode] = field(default_factory=list)
    note: str | None = None  # set when the whole function was left to TensorFlow
    jit_compile_fallback: JitCompileFallback | None = None

    @property
    def runs_on_xla(self) -> bool:
        """Whether TF's XLA runs this trace whole (a `jit_compile=True` fallback)."""
        return self.jit_compile_fallback is not None and self.jit_compile_fallback.runs_on_xla

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
        from tfxla_lite.distributed import task_tag

        task = task_tag()
        lines = [f"tfxla-lite clustering report for {self.function_name} ({mode})"
                 + (f" on {task}" if task else "")]
        if self.note:
            lines.append(f"  {self.note}")
        fallback = self.jit_compile_fallback
        if fallback is not None and not fallback.runs_on_xla:
            lines.append(f"  jit_compile=True fallback, auto-clustering: {fallback.reason}")
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
            lines.append("  cannot be compiled by tfxla-lite, so TF's XLA runs the trace:"
                         if self.runs_on_xla else "  left in TensorFlow:")
            width = max(len(f.op_type) for f in self.fallbacks)
            for node in self.fallbacks:
                where = f"  [{node.source}]" if node.source else ""
                lines.append(f"    {node.op_type:<{width}} {node.op_name}: {node.reason}{where}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: object, cycle: bool) -> None:  # IPython
        printer.text(str(self))  # type: ignore[attr-defined]
