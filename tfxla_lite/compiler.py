"""From one traced `tf.function` to a runnable program with compiled clusters.

The driver of the data flow for one input signature, read top to bottom:
mark every op, form clusters, lower each cluster to HLO, compile it (passes,
fusion, buffer assignment, LLVM), register its executable with the launch op,
rewrite the GraphDef so each cluster is one launch node, and wrap the result
in a new `tf.function` that re-binds arguments, captures and variable writes.

With `dynamic=True`, shapes need only known ranks: a cluster with unknown
dimensions is planned here and compiled by the launch op at run time, once per
concrete input signature (`tfxla_lite/dynamic.py`).
"""

from __future__ import annotations

import itertools
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfxla_lite import dump
from tfxla_lite import dynamic as dynamic_clusters
from tfxla_lite.autojit import original_tf_function
from tfxla_lite.clustering.cluster import form_clusters
from tfxla_lite.clustering.lower import lower_cluster
from tfxla_lite.clustering.mark import PLUMBING_OPS, MarkOptions, format_source, mark
from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo import HloModule
from tfxla_lite.inline import inline_function_calls
from tfxla_lite.options import Options
from tfxla_lite.report import ClusteringReport, ClusterReport, FallbackNode
from tfxla_lite.rewrite import (
    CompiledCluster,
    add_branch_functions,
    import_rewritten,
    rewrite_graph_def,
    rewritten_tensor_name,
)
from tfxla_lite.runtime import register_executable

logger = logging.getLogger("tfxla_lite")

_executable_ids = itertools.count()

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
    """One input signature's compiled form: a tf.function over the rewritten graph."""

    concrete_function: Any
    report: ClusteringReport
    clusters: list[CompiledClusterArtifacts] = field(default_factory=list)
    run: Callable[..., Any] | None = None
    # What a call of this signature runs, set by tfxla_lite.api for every program:
    # `run` traced for it (skipping tf.function's dispatch), or the original trace.
    concrete_run: Any = None
    # Clusters with unknown dimensions, compiled per input signature at run time.
    dynamic_clusters: list[dynamic_clusters.DynamicCluster] = field(default_factory=list)
    # The graph that was marked and rewritten: the trace's, or its copy with function
    # calls inlined.
    graph: Any = None

    def compiler_ir(self, stage: str) -> str:
        texts = {
            "hlo": lambda c: c.hlo_text,
            "optimized_hlo": lambda c: c.executable.optimized_hlo_text,
            "buffer_assignment": lambda c: c.executable.assignment.to_text(),
            "llvm": lambda c: c.executable.llvm_ir_optimized,
            "llvm_unoptimized": lambda c: c.executable.llvm_ir,
        }
        if stage not in texts:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(texts)}")
        compiled = list(self.clusters)
        for dynamic_cluster in self.dynamic_clusters:
            compiled.extend(dynamic_cluster.specializations)
        if not compiled:
            return ""
        return "\n".join(texts[stage](c) for c in compiled)


def _tensor_spec(tensor: tf.Tensor) -> tuple[tf.DType, tuple[int, ...]]:
    return tensor.dtype, tuple(int(d) for d in tensor.shape)


def build_program(concrete_function: Any, jit_compile: bool | None, options: Options,
                  dynamic: bool = False, max_specializations: int | None = None) -> Program:
    """Cluster, compile and rewrite one traced function; see the module docstring.

    `dynamic`: compile clusters whose dimensions are unknown per input signature at run
    time; in auto mode at most `max_specializations` signatures each (default
    `options.max_shape_specializations` if set, else DEFAULT_MAX_SPECIALIZATIONS),
    after which new ones run the cluster's TF ops.
    """
    # Nested function calls are spelled out first, so that their bodies can join the
    # caller's clusters (tfxla_lite/inline.py); node names stay those of the trace.
    graph = inline_function_calls(concrete_function.graph) or concrete_function.graph
    function_name = concrete_function.name
    if isinstance(function_name, bytes):
        function_name = function_name.decode()
    if max_specializations is None:
        max_specializations = getattr(options, "max_shape_specializations",
                                      DEFAULT_MAX_SPECIALIZATIONS)
    report = ClusteringReport(function_name, jit_compile)
    decisions = mark(graph, MarkOptions(dynamic_shapes=dynamic,
                                        allowlist=options.ops_to_cluster))
    min_size = 1 if jit_compile else options.min_cluster_size
    clusters = form_clusters(graph, decisions, min_cluster_size=min_size,
                             max_cluster_size=options.max_cluster_size)

    clustered = {name for c in clusters for name in c.op_names}
    for op in graph.get_operations():
        decision = decisions[op.name]
        if op.name in clustered:
            continue
        reason = decision.reason if not decision.compilable else "cluster too small"
        source = decision.source or format_source(op)
        report.fallbacks.append(FallbackNode(op.name, op.type, reason or "", source))

    if jit_compile:
        # Plumbing stays in TF by design; so does a Const shared by several clusters
        # (each embeds its value), which is compilable but in no cluster.
        offending = [f for f in report.fallbacks
                     if f.op_type not in PLUMBING_OPS and not decisions[f.op_name].compilable]
        if offending:
            raise CompilationError(_must_compile_message(function_name, offending),
                                   offending)

    compiled: list[CompiledCluster] = []
    artifacts: list[CompiledClusterArtifacts] = []
    planned: list[dynamic_clusters.DynamicCluster] = []
    for cluster in clusters:
        ops = tuple((name, graph.get_operation_by_name(name).type) for name in cluster.op_names)
        try:
            if dynamic and not dynamic_clusters.is_static(graph, cluster):
                key = f"{function_name}/{cluster.name}/{next(_executable_ids)}"
                dynamic_cluster = _plan_dynamic(graph, cluster, key, jit_compile, options,
                                                max_specializations)
                dynamic_cluster.on_compiled = _dump_specialization(options, function_name)
                compiled.append(_dynamic_compiled_cluster(cluster, dynamic_cluster,
                                                          fallback=not jit_compile))
                planned.append(dynamic_cluster)
                report.clusters.append(ClusterReport(
                    cluster.name, ops, len(dynamic_cluster.inputs), len(cluster.outputs), True))
                logger.info("tfxla-lite: %s of %s has unknown dimensions: compiled per input "
                            "shape at run time", cluster.name, function_name)
                continue
            started = time.perf_counter()
            module = lower_cluster(graph, cluster)
            executable = compile_module(module, pipeline=options.effective_pipeline,
                                        verify=options.verify)
            dump.dump_cluster(options, function_name, cluster.name, executable.hlo_text, executable,
                              time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 - any failure means: leave it to TF
            if jit_compile:
                raise CompilationError(
                    f"tfxla-lite could not compile {cluster.name} of "
                    f"{function_name}: {type(error).__name__}: {error}") from error
            logger.warning("tfxla-lite: %s falls back to TensorFlow: %s", cluster.name, error)
            logger.debug("%s", traceback.format_exc())
            report.clusters.append(ClusterReport(cluster.name, ops, len(cluster.inputs),
                                                 len(cluster.outputs), False, str(error)))
            for name, op_type in ops:
                report.fallbacks.append(FallbackNode(
                    name, op_type, f"{cluster.name} failed to compile: {error}",
                    format_source(graph.get_operation_by_name(name))))
            continue
        key = f"{function_name}/{cluster.name}/{next(_executable_ids)}"
        inputs = [graph.get_tensor_by_name(t) for t in cluster.inputs]
        outputs = [graph.get_tensor_by_name(t) for t in cluster.outputs]
        register_executable(key, executable.entry_address, executable.temp_bytes,
                            [_tensor_spec(t) for t in inputs], [_tensor_spec(t) for t in outputs],
                            owner=executable)
        compiled.append(CompiledCluster(
            name=cluster.name, op_names=tuple(cluster.op_names), inputs=tuple(cluster.inputs),
            outputs=tuple(cluster.outputs), control_inputs=tuple(cluster.control_inputs), key=key,
            output_dtypes=tuple(t.dtype for t in outputs),
            output_shapes=tuple(_tensor_spec(t)[1] for t in outputs),
            input_dtypes=tuple(t.dtype for t in inputs)))
        artifacts.append(CompiledClusterArtifacts(cluster.name, module, executable.hlo_text,
                                                  executable))
        report.clusters.append(ClusterReport(
            cluster.name, ops, len(cluster.inputs), len(cluster.outputs), True,
            kernel_count=executable.kernel_count, temp_bytes=executable.temp_bytes,
            temp_bytes_without_reuse=executable.assignment.temp_bytes_without_reuse))
        logger.info("tfxla-lite: compiled %s of %s: %d ops, %d kernels", cluster.name,
                    function_name, len(ops), executable.kernel_count)

    dump.dump_trace(options, graph, report)
    program = Program(concrete_function, report, artifacts, dynamic_clusters=planned,
                      graph=graph)
    program.run = _rewritten_function(concrete_function, compiled, generalize=bool(planned),
                                      graph=graph)
    return program


def _plan_dynamic(graph: tf.Graph, cluster: Any, key: str, jit_compile: bool | None,
                  options: Options, max_specializations: int | None
                  ) -> dynamic_clusters.DynamicCluster:
    """Plan a cluster with unknown dimensions and register its compile callback."""
    planned = dynamic_clusters.plan_dynamic_cluster(graph, cluster, key, cluster.name)
    planned.pipeline = options.effective_pipeline
    planned.verify = options.verify
    # Must-compile has no fallback to run: like TF's jit_compile=True, every shape compiles.
    planned.must_compile = bool(jit_compile)
    planned.max_specializations = None if jit_compile else max_specializations
    dynamic_clusters.register(planned)
    return planned


def _dump_specialization(options: Options, function_name: str) -> Callable | None:
    """The hook a dynamic cluster calls as each shape compiles, when dumps are on."""
    if dump.dump_directory(options) is None:
        return None

    def on_compiled(artifacts: Any, seconds: float) -> None:
        dump.dump_cluster(options, function_name, artifacts.name.split(" ")[0],
                          artifacts.hlo_text, artifacts.executable, seconds, artifacts.name)

    return on_compiled


def _dynamic_compiled_cluster(cluster: Any, planned: dynamic_clusters.DynamicCluster,
                              fallback: bool) -> CompiledCluster:
    return CompiledCluster(
        name=cluster.name, op_names=tuple(cluster.op_names), inputs=planned.inputs,
        outputs=tuple(cluster.outputs), control_inputs=tuple(cluster.control_inputs),
        key=planned.key, output_dtypes=planned.output_dtypes,
        output_shapes=planned.output_shapes, input_dtypes=planned.input_dtypes,
        fallback=planned.branch_functions() if fallback else None)


def _must_compile_message(function_name: str, offending: list[FallbackNode]) -> str:
    lines = [f"tfxla-lite: jit_compile=True, but {len(offending)} op(s) of {function_name} "
             "cannot be compiled:"]
    for node in offending:
        where = f" at {node.source}" if node.source else ""
        lines.append(f"  {node.op_type} node '{node.op_name}'{where}: {node.reason}")
    return "\n".join(lines)


def _rewritten_function(concrete_function: Any, clusters: list[CompiledCluster],
                        generalize: bool = False, graph: tf.Graph | None = None) -> Callable:
    """A tf.function that runs the rewritten graph; called like the original function.
    `generalize`: its dynamic clusters take any shape, so retrace with unknown dims.
    `graph`: the graph the clusters are of, when not the trace's own (inlined calls)."""
    graph = graph if graph is not None else concrete_function.graph
    graph_def = rewrite_graph_def(graph.as_graph_def(add_shapes=True), clusters)
    placeholder_names = [t.op.name for t in concrete_function.inputs]
    captured = list(concrete_function.captured_inputs)
    num_arguments = len(concrete_function.inputs) - len(captured)
    structured = concrete_function.structured_outputs
    flat = tf.nest.flatten(structured, expand_composites=True)
    output_names = [rewritten_tensor_name(t.name, clusters) for t in flat
                    if isinstance(t, tf.Tensor)]
    control_names = [op.name for op in graph.control_outputs]

    def rewritten(*args: Any, **kwargs: Any) -> Any:
        func_graph = tf.compat.v1.get_default_graph()
        arguments = list(func_graph.inputs)
        if len(arguments) != num_arguments:
            raise AssertionError(f"tfxla-lite: traced {len(arguments)} arguments, the original "
                                 f"function has {num_arguments}")
        captures = [func_graph.capture(c) for c in captured]
        add_branch_functions(func_graph, clusters)
        results = iter(import_rewritten(graph_def, placeholder_names, arguments + captures,
                                        output_names, control_names))
        values = [next(results) if isinstance(t, tf.Tensor) else t for t in flat]
        return tf.nest.pack_sequence_as(structured, values, expand_composites=True)

    # TF's own tf.function: with tfxla-lite enabled, tf.function is ours.
    return original_tf_function()(rewritten, autograph=False, reduce_retracing=generalize)
