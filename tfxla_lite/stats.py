"""Process-wide compile counters, for the one-line summary auto-jit prints at exit.

`tfxla_lite.api` records the `ClusteringReport` of every program it builds in
`PROCESS_STATS`, a `jit_compile=True` trace that TF's XLA runs included (its ops count
as seen, not compiled); `tfxla_lite.autojit` logs `summary()` at exit. TF-free.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tfxla_lite.report import ClusteringReport

# Ops that move values rather than compute them; they are not counted as "compute ops
# seen" (marking's plumbing, plus constants and the launch op's own kind).
_NOT_COMPUTE = frozenset({
    "Placeholder", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "VarHandleOp", "Identity", "IdentityN", "NoOp", "Const",
})


@dataclass
class CompileStats:
    """Counts over every program built in this process."""

    functions: int = 0  # traces handed to the compiler (one per function and signature)
    clusters_compiled: int = 0  # = launch ops placed
    clusters_failed: int = 0  # formed, but left to TF because they did not compile
    ops_compiled: int = 0  # compute ops inside compiled clusters
    ops_seen: int = 0  # compute ops in every traced graph
    functions_left_to_tf: int = 0  # whole traces run by TF after an internal error
    must_compile_fallbacks: int = 0  # jit_compile=True traces not run as one program
    xla_fallbacks: int = 0  # of those, the traces TF's XLA ran whole
    ops_on_xla: int = 0  # compute ops of the traces TF's XLA ran

    def record(self, report: ClusteringReport) -> None:
        self.functions += 1
        fallback = report.jit_compile_fallback
        if fallback is not None:
            self.must_compile_fallbacks += 1
            if fallback.runs_on_xla:
                self.xla_fallbacks += 1
                self.ops_on_xla += fallback.compute_ops
                self.ops_seen += fallback.compute_ops
                return
        if report.note:
            self.functions_left_to_tf += 1
            return
        compiled_ops = 0
        for cluster in report.clusters:
            if cluster.compiled:
                self.clusters_compiled += 1
                compiled_ops += sum(op_type not in _NOT_COMPUTE for _, op_type in cluster.ops)
            else:
                self.clusters_failed += 1
        # A failed cluster's ops are listed among the fallbacks too.
        left = sum(node.op_type not in _NOT_COMPUTE for node in report.fallbacks)
        self.ops_compiled += compiled_ops
        self.ops_seen += compiled_ops + left

    def summary(self) -> str:
        share = f" ({100.0 * self.ops_compiled / self.ops_seen:.0f}%)" if self.ops_seen else ""
        return (f"tfxla-lite summary: {self.functions} traces, {self.clusters_compiled} clusters "
                f"compiled (launch ops), {self.ops_compiled} of {self.ops_seen} compute ops "
                f"compiled{share}, {self.clusters_failed} clusters failed, "
                f"{self.functions_left_to_tf} traces left to TF, "
                f"{self.must_compile_fallbacks} jit_compile=True fallbacks "
                f"({self.xla_fallbacks} traces, {self.ops_on_xla} compute ops, run by TF's "
                f"XLA; the others auto-clustered)")


PROCESS_STATS = CompileStats()


def compute_op_count(op_types: Iterable[str]) -> int:
    """How many of these op types compute (the count `CompileStats` calls compute ops)."""
    return sum(op_type not in _NOT_COMPUTE for op_type in op_types)
