"""What a compile makes: the `Program` of one traced signature and the types around it.

The shared vocabulary of the front end: `tfxla_lite/driver.py` builds a `Program`
(stage by stage, `tfxla_lite/stages.py`), `tfxla_lite/api.py` caches and calls it, and
`tfxla_lite/cached_programs.py` rebuilds one from the rewrite cache. It sits below all
three, so that they import it and never each other for these types.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfxla_lite import dump
from tfxla_lite.clustering.body_graphs import BodyCall
from tfxla_lite.clustering.registry import variable_spec
from tfxla_lite.dynamic import DynamicCluster
from tfxla_lite.hlo import HloModule
from tfxla_lite.hlo.stablehlo import module_to_stablehlo
from tfxla_lite.options import Options
from tfxla_lite.report import ClusteringReport, FallbackNode
from tfxla_lite.rewrite import CompiledCluster
from tfxla_lite.runtime import loader, register_executable

# Distinct input signatures a dynamic cluster compiles before new ones run in TF, as
# XLA's megamorphic-cluster heuristic (device_compiler.h) stops compiling.
DEFAULT_MAX_SPECIALIZATIONS = 10


class CompilationError(tf.errors.InvalidArgumentError):
    """A function compiled with `jit_compile=True` holds something that cannot compile.

    `offending` lists the nodes, each with op type, node name, reason and the
    user's Python source line.
    """

    def __init__(self, message: str, offending: list[FallbackNode] | None = None) -> None:
        super().__init__(None, None, message)
        self.offending = list(offending or [])


@dataclass
class CompiledClusterArtifacts:
    """Everything `experimental_get_compiler_ir` and the report show of one cluster."""

    name: str
    hlo: HloModule
    hlo_text: str
    executable: Any  # tfxla_lite.codegen.Executable


@dataclass
class Program:
    """One input signature's compiled form: a tf.function over the rewritten graph.

    Also the compiled form of one loop body or branch (`BodyProgram.program`), which has
    no `concrete_function` or `run` of its own.
    """

    concrete_function: Any
    report: ClusteringReport
    clusters: list[CompiledClusterArtifacts] = field(default_factory=list)
    run: Callable[..., Any] | None = None
    # What a call of this signature runs, set by tfxla_lite.api for every program:
    # `run` traced for it (skipping tf.function's dispatch), or the original trace.
    concrete_run: Any = None
    # Set by tfxla_lite.api: a call's positional tensors are `concrete_run`'s flat inputs
    # as they are (checked on the first call), so later calls skip TF's structured binding.
    flat_call: bool = False
    # Clusters with unknown dimensions, compiled per input signature at run time.
    dynamic_clusters: list[DynamicCluster] = field(default_factory=list)
    # The graph that was marked and rewritten: the trace's, or its copy with function
    # calls inlined.
    graph: Any = None
    # The compiled functions of its While and If ops (tfxla_lite/control_flow.py).
    bodies: list[BodyProgram] = field(default_factory=list)
    # What the rewrite needs: the compiled clusters, the control-flow attributes to
    # re-point ((node, attr) -> function name) and the functions they name.
    compiled: list[CompiledCluster] = field(default_factory=list)
    renames: dict[tuple[str, str], str] = field(default_factory=dict)
    functions: list[Any] = field(default_factory=list)
    # Clusters whose machine code LLVM is still making in the background, registered with
    # the launch op once it is there: (key, executable, inputs, outputs). The rewritten
    # function's trace waits for them (`driver.finish_pending`), before anything can launch.
    pending: list[tuple[str, Any, list[Any], list[Any]]] = field(default_factory=list)
    # The trace holds a tf.custom_gradient (or another gradient override): its gradient
    # function closes over tensors of the trace's own graph, so only the original trace
    # can be differentiated (tfxla_lite/api.py runs it where a gradient may be taken).
    custom_gradients: bool = False
    # One per key its launch nodes name (bodies' in `bodies`): a key is unregistered, and
    # its code freed, when the last holder goes. The program holds them, and so does
    # every graph of its rewritten function (`driver.rewrite`), since a graph that
    # calls that function may outlive the program.
    registrations: list[loader.Registration] = field(default_factory=list)
    # Nodes must-compile leaves out of the rewrite: assertions, as TF's XLA compiles them
    # away (tfxla_lite/assertions.py).
    dropped: frozenset[str] = frozenset()

    @property
    def has_launches(self) -> bool:
        """Whether the rewrite changes anything: a launch op here or in a body."""
        return bool(self.compiled) or bool(self.renames)

    def all_artifacts(self) -> list[Any]:
        """Every compiled cluster and dynamic specialization, bodies included, in order."""
        compiled: list[Any] = list(self.clusters)
        for dynamic_cluster in self.dynamic_clusters:
            compiled.extend(dynamic_cluster.specializations)
        for body in self.bodies:
            compiled.extend(body.program.all_artifacts())
        return compiled

    def all_registrations(self) -> list[loader.Registration]:
        """The registrations of its keys and of its bodies' keys."""
        found = list(self.registrations)
        for body in self.bodies:
            found.extend(body.program.all_registrations())
        return found

    def all_dynamic_clusters(self) -> list[DynamicCluster]:
        found = list(self.dynamic_clusters)
        for body in self.bodies:
            found.extend(body.program.all_dynamic_clusters())
        return found

    def compiler_ir(self, stage: str) -> str:
        """`stage`'s text of every compiled cluster, in order. CPU clusters have 'llvm'
        and 'llvm_unoptimized', GPU clusters 'cuda' and 'kernel_plan' instead: another
        device's cluster gets a comment line saying where its code is, and a stage no
        cluster has raises ValueError naming the stages there are."""
        texts = {
            "hlo": lambda c: c.hlo_text,
            "optimized_hlo": lambda c: c.executable.optimized_hlo_text,
            "buffer_assignment": lambda c: c.executable.assignment.to_text(),
            "llvm": lambda c: c.executable.llvm_ir_optimized,
            "llvm_unoptimized": lambda c: c.executable.llvm_ir,
            "cuda": lambda c: c.executable.cuda_source,
            "kernel_plan": lambda c: c.executable.kernel_plan,
            "stablehlo": lambda c: module_to_stablehlo(c.hlo),
        }
        if stage not in texts:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(texts)}")
        compiled = self.all_artifacts()
        if not compiled:
            return ""
        # Here, not at the top: the GPU backend loads only where a GPU cluster is shown.
        from tfxla_lite.codegen.gpu.inspection import STAGES as GPU_STAGES

        devices = [dump.device_of(c.executable) for c in compiled]  # and their stages:
        cpu_stages = tuple(s for s in texts if s not in ("cuda", "kernel_plan"))
        stages = {d: cpu_stages if d == "CPU" else GPU_STAGES for d in devices}
        if not any(stage in stages[d] for d in devices):
            where = []
            for device in stages:
                names = ", ".join(c.name for c, d in zip(compiled, devices) if d == device)
                where.append(f"{names} on {device} (stages {', '.join(stages[device])})")
            raise ValueError(f"stage {stage!r} does not apply to this function's compiled "
                             f"clusters: {'; '.join(where)}")
        comment = {"llvm": ";", "llvm_unoptimized": ";", "cuda": "//"}.get(stage, "#")
        return "\n".join(
            texts[stage](c) if stage in stages[d] else
            f"{comment} {c.name} runs on {d}: no {stage} stage; its code is stage "
            f"'{'llvm' if d == 'CPU' else 'cuda'}'\n" for c, d in zip(compiled, devices))


@dataclass
class BodyProgram:
    """One function of a While or If op (a loop body or condition, a branch), compiled:
    `function` is the rewritten ConcreteFunction the op now calls, None when nothing in
    it compiled (the op keeps calling the original)."""

    call: BodyCall
    program: Program
    function: Any = None


@dataclass(frozen=True)
class Settings:
    """What every graph of one build (the trace, its loop bodies) is compiled with."""

    jit_compile: bool | None
    options: Options
    dynamic: bool
    max_specializations: int | None


def must_compile_error(function_name: str, offending: list[FallbackNode]) -> CompilationError:
    """The error of a must-compile trace with ops that cannot compile, one line each."""
    lines = [f"tfxla-lite: jit_compile=True, but {len(offending)} op(s) of {function_name} "
             "cannot be compiled:"]
    for node in offending:
        where = f" at {node.source}" if node.source else ""
        lines.append(f"  {node.op_type} node '{node.op_name}'{where}: {node.reason}")
    return CompilationError("\n".join(lines), offending)


_launch_keys = itertools.count()


def launch_key(function_name: str, cluster_name: str) -> str:
    """A key for a launch op to name its executable by, unique in the process."""
    return f"{function_name}/{cluster_name}/{next(_launch_keys)}"


def tensor_spec(tensor: tf.Tensor) -> tuple[tf.DType, tuple[int, ...]]:
    """A tensor's dtype and static dims; a resource handle's are its variable's."""
    if tensor.dtype == tf.resource:
        spec = variable_spec(tensor)
        if spec is None:
            raise ValueError(f"variable {tensor.name} has no static dtype and shape")
        return spec
    return tensor.dtype, tuple(int(d) for d in tensor.shape)


def register_with_launch_op(key: str, executable: Any, inputs: list[tf.Tensor],
                            outputs: list[tf.Tensor]) -> None:
    """Register a CPU executable with the launch op under `key`, with the cluster's
    boundary tensors' dtypes and shapes."""
    register_executable(key, executable.entry_address, executable.temp_bytes,
                        [tensor_spec(t) for t in inputs], [tensor_spec(t) for t in outputs],
                        owner=executable, donations=executable.donations)
