"""The compile driver: one traced `tf.function` to a runnable `Program`, as a chain of stages.

    trace → mark → (bodies) → cluster → lower → optimize → assign → emit → link
          → register → rewrite

`tfxla_lite/api.py` traces (a `ConcreteFunction` per input signature) and calls
`build_program`, which reads as that chain; `compile_graph` is the part of it that runs
once per graph (the trace, and each loop body or branch that stays in TF). Lower is
`clustering/lower.py`; optimize → assign → emit → link is one call,
`codegen.compile_module` (its passes are the HLO pass pipeline of
`tfxla_lite/passes/pipeline.py`, not this module); register hands each executable to
the launch op; rewrite makes each cluster one launch node and re-imports the graph.

Besides the chain: a trace seen before (in this or an earlier process) skips mark to
link (`tfxla_lite/cached_programs.py`); with `dynamic=True`, a cluster with unknown
dimensions is planned here and compiled by the launch op at run time, once per
concrete input signature, through the same `compile_code` (`tfxla_lite/dynamic.py`);
the functions of While and If ops are compiled first, each through `compile_graph`
(`compile_bodies`, `tfxla_lite/control_flow.py`), and the op stays in TF calling the
rewritten function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
import traceback
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfxla_lite import assertions, cached_programs, control_flow, dump, flags, numerics_check
from tfxla_lite import dynamic as dynamic_clusters
from tfxla_lite.clustering import body_graphs
from tfxla_lite.clustering.cluster import Cluster, form_clusters
from tfxla_lite.clustering.control_flow_ops import IF_OPS
from tfxla_lite.clustering.inline import inline_function_calls, is_compiled_function
from tfxla_lite.clustering.lower import lower_cluster
from tfxla_lite.clustering.mark import PLUMBING_OPS, Decision, MarkOptions, format_source, mark
from tfxla_lite.clustering.rules_control_flow import FUNCTIONAL_OPS
from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
from tfxla_lite.clustering.rules_linalg import LINALG_OPS
from tfxla_lite.clustering.rules_pool import MAX_POOL_GRAD_TF_KERNEL_OPS
from tfxla_lite.clustering.rules_resize import RESIZE_TF_KERNEL_OPS
from tfxla_lite.clustering.rules_variables import VARIABLE_OPS, written_variables
from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.module_cache import CachedExecutable
from tfxla_lite.hlo import HloModule
from tfxla_lite.options import Options
from tfxla_lite.original_function import original_tf_function
from tfxla_lite.program import (
    DEFAULT_MAX_SPECIALIZATIONS,
    BodyProgram,
    CompilationError,
    CompiledClusterArtifacts,
    Program,
    Settings,
    launch_key,
    must_compile_error,
    register_with_launch_op,
    tensor_spec,
)
from tfxla_lite.report import ClusteringReport, ClusterReport, FallbackNode
from tfxla_lite.rewrite import (
    CompiledCluster,
    add_branch_functions,
    import_rewritten,
    rewrite_graph_def,
    rewritten_op_names,
    rewritten_tensor_name,
)
from tfxla_lite.runtime import BuildError, gpu_launch, load_library, loader

logger = logging.getLogger("tfxla_lite")


def build_program(concrete_function: Any, jit_compile: bool | None, options: Options,
                  dynamic: bool = False, max_specializations: int | None = None) -> Program:
    """Cluster, compile and rewrite one traced function: the chain of the module docstring.

    `dynamic`: compile clusters whose dimensions are unknown per input signature at run
    time; in auto mode at most `max_specializations` signatures each (default
    DEFAULT_MAX_SPECIALIZATIONS), after which new ones run the cluster's TF ops.
    """
    # Nested function calls are spelled out first, so that their bodies can join the
    # caller's clusters (clustering/inline.py); node names stay those of the trace.
    graph = inline_function_calls(concrete_function.graph) or concrete_function.graph
    function_name = concrete_function.name
    if isinstance(function_name, bytes):
        function_name = function_name.decode()
    if max_specializations is None:
        max_specializations = DEFAULT_MAX_SPECIALIZATIONS
    settings = Settings(jit_compile, options, dynamic, max_specializations)
    # Before any kernel is JIT-linked (compiled or loaded from a cache): kernels linked
    # once the op library is loaded run their parallel parts on TF's thread pool. A
    # library that cannot be built fails the first registration instead, with its error.
    with contextlib.suppress(BuildError, OSError, RuntimeError):
        load_library()
    graph_def = graph.as_graph_def(add_shapes=True)
    # A warm process finds the whole result in the rewrite cache: no mark to link.
    cache_key = cached_programs.key(graph_def, settings)
    program = cached_programs.load(cache_key, graph, function_name, settings)
    if program is None:
        try:
            program = compile_graph(graph, function_name, settings)  # mark → … → register
        except CompilationError as error:
            cached_programs.store_refusal(cache_key, graph, error)
            raise
        cached_programs.store(cache_key, graph, program)
    program.concrete_function = concrete_function
    program.custom_gradients = has_gradient_overrides(graph_def)
    program.run = rewrite(concrete_function, program, graph_def, options.check_numerics)
    return program


def compile_graph(graph: tf.Graph, function_name: str, settings: Settings,
                  library: dict[str, Any] | None = None) -> Program:
    """Mark, cluster, compile and register `graph`'s clusters and, first, the bodies of
    its control-flow ops; a Program without `run` (the caller rewrites and imports).
    `library`: the trace's FunctionDefs by name, for a body (default: `graph`'s own)."""
    marking = mark_graph(graph, settings)
    # Bodies first: in must-compile mode a body that cannot compile is the error.
    bodies = compile_bodies(graph, function_name, settings, library, marking.whole)
    clustering = cluster_graph(graph, marking, settings, bodies.assertion_ifs)
    report = ClusteringReport(function_name, settings.jit_compile,
                              fallbacks=list(clustering.fallbacks))
    if settings.jit_compile:
        check_must_compile(function_name, clustering)
    program = Program(None, report, graph=graph, bodies=bodies.programs,
                      renames=bodies.renames, functions=bodies.functions,
                      dropped=clustering.dropped)
    # The trace's own clusters (not a body's: its rewritten function is traced within this
    # compile) may compile LLVM in the background, overlapping TF's trace of the rewrite.
    background = library is None and flags.switch("overlap_llvm", settings.options)
    for cluster in clustering.clusters:
        # A cluster TF runs on a GPU compiles for it, or stays in TF there.
        gpu = gpu_launch.placed_gpu(cluster.device)
        try:
            if settings.dynamic and not dynamic_clusters.is_static(graph, cluster):
                plan_dynamic(program, graph, cluster, settings, gpu)
                continue
            artifacts = lower_and_compile(graph, cluster, function_name, settings.options,
                                          gpu, background)
        except Exception as error:  # noqa: BLE001 - any failure means: leave it to TF
            leave_to_tf(program, graph, cluster, settings, error)
            continue
        register(program, graph, cluster, artifacts, gpu)
    dump.dump_trace(settings.options, graph, report)
    # The bodies' clusters and fallbacks are part of this function's report, their names
    # prefixed with the body's function name.
    for body in bodies.programs:
        _merge_body_report(report, body)
    return program


# -- mark and cluster ------------------------------------------------------------------------


@dataclass
class Marking:
    """Every op's compilability, and the control-flow ops that clusters take whole."""

    decisions: dict[str, Decision]
    min_size: int  # the smallest cluster worth compiling
    whole: frozenset[str]  # While/If ops that compile as HLO control flow inside a cluster


def mark_graph(graph: tf.Graph, settings: Settings) -> Marking:
    """Mark: which ops can compile, and why each other cannot (clustering/mark.py)."""
    options, jit_compile = settings.options, settings.jit_compile
    # Must-compile compiles every convolution too, as TF's XLA does, where the cost rule
    # would send the trace to the auto-clustering fallback (docs/benchmarks.md).
    compile_all = options.compile_convolutions or bool(jit_compile)
    tf_kernels = frozenset() if compile_all else CONVOLUTION_OPS
    if not jit_compile:  # must-compile compiles linear algebra, resize, pool gradients always
        tf_kernels |= LINALG_OPS | RESIZE_TF_KERNEL_OPS | MAX_POOL_GRAD_TF_KERNEL_OPS
    denied = frozenset() if options.hlo_control_flow else FUNCTIONAL_OPS
    decisions = mark(graph, MarkOptions(dynamic_shapes=settings.dynamic, denylist=denied,
                                        allowlist=options.ops_to_cluster,
                                        tf_kernels=tf_kernels))
    min_size = 1 if jit_compile else options.min_cluster_size
    return Marking(decisions, min_size, _clustered_control_flow(graph, decisions, min_size,
                                                                options))


def _clustered_control_flow(graph: tf.Graph, decisions: dict[str, Decision], min_size: int,
                            options: Options) -> frozenset[str]:
    """The While and If ops that clusters take whole (clustering/rules_control_flow.py),
    as clustering `decisions` (a copy) forms them: they need no compiled bodies."""
    if not any(d.compilable and d.op_type in body_graphs.CONTROL_FLOW_OPS
               for d in decisions.values()):
        return frozenset()
    clusters = _form_clusters(graph, dict(decisions), min_size, options)
    return frozenset(name for c in clusters for name in c.op_names
                     if graph.get_operation_by_name(name).type
                     in body_graphs.CONTROL_FLOW_OPS)


def _form_clusters(graph: tf.Graph, decisions: dict[str, Decision], min_size: int,
                   options: Options) -> list[Cluster]:
    return form_clusters(graph, decisions, min_cluster_size=min_size,
                         max_cluster_size=options.max_cluster_size,
                         merge_independent=options.merge_independent_clusters)


@dataclass
class Clustering:
    """The clusters of one graph, and every op left to TF with the reason."""

    clusters: list[Cluster]
    decisions: dict[str, Decision]
    fallbacks: list[FallbackNode]
    dropped: frozenset[str]  # assertions must-compile leaves out (tfxla_lite/assertions.py)


def cluster_graph(graph: tf.Graph, marking: Marking, settings: Settings,
                  assertion_ifs: set[str]) -> Clustering:
    """Cluster: contract compilable ops into clusters without cycles (clustering/cluster.py)."""
    options, decisions = settings.options, marking.decisions
    dropped = (assertions.dropped_nodes(graph, assertion_ifs) if settings.jit_compile
               else frozenset())
    for name in dropped:
        decisions[name] = dataclasses.replace(decisions[name], compilable=False,
                                              reason=assertions.DROPPED_REASON)
    clusters = _form_clusters(graph, decisions, marking.min_size, options)
    clusters = _variables_in_static_clusters(graph, decisions, clusters, settings.dynamic,
                                             marking.min_size, options,
                                             bool(settings.jit_compile))
    clustered = {name for c in clusters for name in c.op_names}
    fallbacks = []
    for op in graph.get_operations():
        decision = decisions[op.name]
        if op.name in clustered:
            continue
        reason = decision.reason if not decision.compilable else "cluster too small"
        if op.type in body_graphs.CONTROL_FLOW_OPS:
            reason = control_flow.CONTROL_FLOW_REASON + (
                f" ({decision.reason})" if decision.reason else "")
        source = decision.source or format_source(op)
        fallbacks.append(FallbackNode(op.name, op.type, reason or "", source))
    return Clustering(clusters, decisions, fallbacks, dropped)


# Why a variable op stays out of the cluster it would join.
_VARIABLE_IN_DYNAMIC_REASON = ("variable op in a cluster of unknown dimensions with a fallback "
                               "(auto mode) or for a GPU (variables compile in CPU clusters "
                               "without a fallback)")


def _variables_in_static_clusters(graph: tf.Graph, decisions: dict[str, Decision],
                                  clusters: list[Cluster], dynamic: bool, min_size: int,
                                  options: Options, must_compile: bool) -> list[Cluster]:
    """`clusters`, formed again without the variable ops of any cluster for a GPU, or
    compiled per input shape at run time with a fallback (auto mode: the fallback's
    StatelessIf cannot hold writes); the launch op binds CPU variables, per shape too.
    `decisions` records why those ops stay in TF."""
    for _ in range(3):  # each round only removes ops; a third is rarely needed
        refused = [name for cluster in clusters
                   if gpu_launch.placed_gpu(cluster.device) is not None
                   or (dynamic and not must_compile
                       and not dynamic_clusters.is_static(graph, cluster))
                   for name in cluster.op_names if decisions[name].op_type in VARIABLE_OPS]
        if not refused:
            return clusters
        for name in refused:
            decisions[name] = dataclasses.replace(decisions[name], compilable=False,
                                                  reason=_VARIABLE_IN_DYNAMIC_REASON)
        clusters = _form_clusters(graph, decisions, min_size, options)
    return clusters


def check_must_compile(function_name: str, clustering: Clustering) -> None:
    """Must-compile: raise `CompilationError` naming every computational op left to TF.
    Plumbing stays in TF by design; so does a Const shared by several clusters (each
    embeds its value), which is compilable but in no cluster; so do control-flow ops,
    whose bodies compiled before."""
    offending = [f for f in clustering.fallbacks
                 if f.op_type not in PLUMBING_OPS
                 and not clustering.decisions[f.op_name].compilable
                 and f.op_type not in body_graphs.CONTROL_FLOW_OPS
                 and f.op_name not in clustering.dropped]
    if offending:
        raise must_compile_error(function_name, offending)


# -- control flow: the bodies of While and If ops ----------------------------------------------


@dataclass
class Bodies:
    """The compiled functions of a graph's While and If ops, and how the rewrite uses them."""

    programs: list[BodyProgram] = field(default_factory=list)
    # (node, attr) -> the rewritten function's name, for the rewrite to re-point.
    renames: dict[tuple[str, str], str] = field(default_factory=dict)
    # The rewritten ConcreteFunctions, added to the graph the rewrite is imported into.
    functions: list[Any] = field(default_factory=list)
    # If ops whose branches hold only assertions that must-compile dropped.
    assertion_ifs: set[str] = field(default_factory=set)


def compile_bodies(graph: tf.Graph, function_name: str, settings: Settings,
                   library: dict[str, Any] | None, whole: frozenset[str] = frozenset()
                   ) -> Bodies:
    """Compile the functions of `graph`'s While and If ops (tfxla_lite/control_flow.py)
    through `compile_graph`, but for those in `whole` (compiled within a cluster as HLO
    control flow). In auto mode a body that fails to compile stays as it was."""
    found = Bodies()
    if not any(op.type in body_graphs.CONTROL_FLOW_OPS for op in graph.get_operations()):
        return found
    if library is None:  # as the rewrite exports it (add_shapes also marks library nodes)
        library = {f.signature.name: f
                   for f in graph.as_graph_def(add_shapes=True).library.function}
    done: dict[tuple[Any, ...], BodyProgram] = {}
    branches: dict[str, list[BodyProgram]] = {}  # If node -> its branches' programs
    shape_lists: set[tuple[str, int]] = set()  # While outputs that accumulate shapes
    for call in body_graphs.body_calls(graph, library):
        if is_compiled_function(call.function, library) or call.node in whole:
            continue  # tfxla-lite's own output, in a graph that calls a compiled function
        call = body_graphs.with_shape_lists(call, shape_lists)  # noqa: PLW2901
        # Constants and shapes of the arguments shape the compiled body: share it only
        # between calls with the very same arguments (one function named twice).
        signature = (call.function, tuple(str(s) for s in call.shapes),
                     tuple(t.name for t in call.arguments))
        body = done.get(signature)
        if body is None:
            try:
                body_graph = body_graphs.function_graph(library, call)
                body_graph = inline_function_calls(body_graph) or body_graph
                program = compile_graph(body_graph, call.function, settings, library)
                rewritten = (_rewritten_body(program, library)
                             if program.has_launches or program.dropped else None)
            except CompilationError:
                raise
            except Exception as error:  # noqa: BLE001 - auto mode: the body runs as it is
                if settings.jit_compile:
                    raise CompilationError(
                        f"tfxla-lite could not compile {call.function} ({call.attr} of "
                        f"{call.node}) in {function_name}: {type(error).__name__}: "
                        f"{error}") from error
                logger.warning("tfxla-lite: %s of %s in %s stays as it is: %s: %s", call.attr,
                               call.node, function_name, type(error).__name__, error)
                logger.debug("%s", traceback.format_exc())
                continue
            body = BodyProgram(call, program, rewritten)
            done[signature] = body
            found.programs.append(body)
            shape_lists |= body_graphs.shape_lists(call, program.graph)
        if call.op_type in IF_OPS:
            branches.setdefault(call.node, []).append(body)
        if body.function is not None:
            found.renames[(call.node, call.attr)] = body.function.function_def.signature.name
            if body.function not in found.functions:
                found.functions.append(body.function)
    found.assertion_ifs = {
        node for node, pair in branches.items()
        if len(pair) == 2 and any(b.program.dropped for b in pair)
        and all(assertions.assertion_only(b.program.graph, b.program.dropped) for b in pair)}
    return found


def _merge_body_report(report: ClusteringReport, body: BodyProgram) -> None:
    prefix = f"{body.call.function}/"
    for cluster in body.program.report.clusters:
        report.clusters.append(dataclasses.replace(
            cluster, name=prefix + cluster.name,
            ops=tuple((prefix + name, op_type) for name, op_type in cluster.ops)))
    for node in body.program.report.fallbacks:
        report.fallbacks.append(dataclasses.replace(node, op_name=prefix + node.op_name))


# -- lower → optimize → assign → emit → link ---------------------------------------------------


@dataclass(frozen=True)
class CodeTarget:
    """How a lowered cluster becomes code: its device, passes, caches and LLVM's timing."""

    gpu: int | None
    pipeline: str
    verify: bool
    cache: str | None
    tiered: bool
    background: bool = False

    @classmethod
    def of(cls, options: Options, gpu: int | None, background: bool = False) -> CodeTarget:
        # Dumps read the code at once: no background LLVM and no quick tier then.
        dumping = dump.dump_directory(options) is not None
        return cls(gpu, options.effective_pipeline, options.verify, options.cache,
                   flags.switch("tiered_llvm", options) and not dumping,
                   background and not dumping)


def compile_code(module: HloModule, target: CodeTarget, donate: Collection[int] = ()) -> Any:
    """Optimize → assign buffers → emit → link: `codegen.compile_module` for the CPU, the
    GPU backend for a GPU. For a static cluster here, and for each shape of a dynamic one."""
    if target.gpu is not None:
        return gpu_launch.compile_cluster(module, target.gpu, target.pipeline, target.verify)
    return compile_module(module, pipeline=target.pipeline, verify=target.verify,
                          donate=donate, cache=target.cache, background=target.background,
                          tiered=target.tiered)


def lower_and_compile(graph: tf.Graph, cluster: Cluster, function_name: str, options: Options,
                      gpu: int | None, background: bool) -> CompiledClusterArtifacts:
    """Lower a static cluster to HLO (clustering/lower.py) and compile it; dumped if asked."""
    started = time.perf_counter()
    module = lower_cluster(graph, cluster)
    donate = [] if gpu is not None else _forwardable(
        graph, cluster.inputs, written_variables(graph, cluster.op_names))
    executable = compile_code(module, CodeTarget.of(options, gpu, background), donate)
    dump.dump_cluster(options, function_name, cluster.name, executable.hlo_text, executable,
                      time.perf_counter() - started,
                      title=None if gpu is None else f"{cluster.name} on GPU:{gpu}")
    return CompiledClusterArtifacts(cluster.name, module, executable.hlo_text, executable)


# Producers of cluster inputs that something besides the launch still holds (the
# caller's arguments, variables' buffers, constants): TF never forwards those.
_HELD_INPUTS = frozenset({"Placeholder", "ReadVariableOp", "Const", "VarHandleOp"})


def _forwardable(graph: tf.Graph, inputs: list[str] | tuple[str, ...],
                 written: list[str] | tuple[str, ...] = ()) -> list[int]:
    """The cluster inputs TF may forward to an output when the launch is their last
    reader: intermediates of TF ops (codegen/cpu/donation.py compiles in-place variants
    for them, which costs compile time, so arguments and variables' reads are left out),
    and the handles of the variables it writes (`written`), whose new value the launch
    writes over the old one where no other tensor holds it."""
    return [n for n, name in enumerate(inputs)
            if name in written or graph.get_tensor_by_name(name).op.type not in _HELD_INPUTS
            and graph.get_tensor_by_name(name).dtype != tf.resource]


def leave_to_tf(program: Program, graph: tf.Graph, cluster: Cluster, settings: Settings,
                error: Exception) -> None:
    """A cluster that failed to compile: must-compile's error, else its ops run in TF."""
    function_name = program.report.function_name
    if settings.jit_compile:
        raise CompilationError(f"tfxla-lite could not compile {cluster.name} of "
                               f"{function_name}: {type(error).__name__}: {error}") from error
    logger.warning("tfxla-lite: %s falls back to TensorFlow: %s", cluster.name, error)
    logger.debug("%s", traceback.format_exc())
    ops = _ops(graph, cluster)
    program.report.clusters.append(ClusterReport(cluster.name, ops, len(cluster.inputs),
                                                 len(cluster.outputs), False, str(error)))
    for name, op_type in ops:
        program.report.fallbacks.append(FallbackNode(
            name, op_type, f"{cluster.name} failed to compile: {error}",
            format_source(graph.get_operation_by_name(name))))


def _ops(graph: tf.Graph, cluster: Cluster) -> tuple[tuple[str, str], ...]:
    return tuple((name, graph.get_operation_by_name(name).type) for name in cluster.op_names)


# -- register ----------------------------------------------------------------------------------


def register(program: Program, graph: tf.Graph, cluster: Cluster,
             artifacts: CompiledClusterArtifacts, gpu: int | None) -> None:
    """Register: hand a static cluster's executable to the launch op (a GPU cluster's to
    its GPU launch) under a new key, and add it to `program` for the rewrite."""
    function_name, executable = program.report.function_name, artifacts.executable
    key = launch_key(function_name, cluster.name)
    inputs = [graph.get_tensor_by_name(t) for t in cluster.inputs]
    outputs = [graph.get_tensor_by_name(t) for t in cluster.outputs]
    # The variables it writes: the executable's last outputs (clustering/lower.py).
    written = written_variables(graph, cluster.op_names)
    launch_on_gpu = None
    if gpu is not None:
        launch_on_gpu = gpu_launch.GpuLaunch(key, executable, gpu,
                                             [tensor_spec(t) for t in inputs],
                                             [tensor_spec(t) for t in outputs])
    else:
        # Made before the key is registered: once registered, a key is only
        # unregistered by its registration's collection.
        program.registrations.append(loader.Registration(key))
        written_handles = [graph.get_tensor_by_name(h) for h in written]
        if getattr(executable, "ready", True):
            register_with_launch_op(key, executable, inputs, outputs + written_handles)
        else:  # registered when LLVM is done, before the rewritten graph can run
            program.pending.append((key, executable, inputs, outputs + written_handles))
    program.compiled.append(CompiledCluster(
        name=cluster.name, op_names=tuple(cluster.op_names), inputs=tuple(cluster.inputs),
        outputs=tuple(cluster.outputs), control_inputs=tuple(cluster.control_inputs), key=key,
        output_dtypes=tuple(t.dtype for t in outputs),
        output_shapes=tuple(tensor_spec(t)[1] for t in outputs),
        input_dtypes=tuple(t.dtype for t in inputs), gpu_launch=launch_on_gpu,
        variable_writes=tuple(cluster.inputs.index(h) for h in written)))
    program.clusters.append(artifacts)
    ops = _ops(graph, cluster)
    program.report.clusters.append(ClusterReport(
        cluster.name, ops, len(cluster.inputs), len(cluster.outputs), True,
        kernel_count=executable.kernel_count, temp_bytes=executable.temp_bytes,
        temp_bytes_without_reuse=_temp_bytes_without_reuse(executable)))
    logger.info("tfxla-lite: compiled %s of %s: %d ops, %d kernels%s", cluster.name,
                function_name, len(ops), executable.kernel_count,
                "" if gpu is None else f" for GPU:{gpu}")


def _temp_bytes_without_reuse(executable: Any) -> int:
    """From the cached figure when the executable came from the optimized-module cache,
    whose buffer assignment is rebuilt only on demand (codegen/module_cache.py)."""
    if isinstance(executable, CachedExecutable):
        return executable.temp_bytes_without_reuse
    return executable.assignment.temp_bytes_without_reuse


def plan_dynamic(program: Program, graph: tf.Graph, cluster: Cluster, settings: Settings,
                 gpu: int | None) -> None:
    """Register a cluster with unknown dimensions for the launch op to compile per input
    signature at run time, through `compile_code` (a GPU cluster's launch calls it itself:
    `_dynamic_compiled_cluster`), and add it to `program` for the rewrite."""
    function_name, options = program.report.function_name, settings.options
    key = launch_key(function_name, cluster.name)
    planned = dynamic_clusters.plan_dynamic_cluster(graph, cluster, key, cluster.name)
    planned.compile_code = functools.partial(compile_code, target=CodeTarget.of(options, gpu))
    planned.pause_collector = options.pause_collector
    # Must-compile has no fallback to run: like TF's jit_compile=True, every shape compiles.
    planned.must_compile = bool(settings.jit_compile)
    planned.max_specializations = (None if settings.jit_compile
                                   else settings.max_specializations)
    planned.gpu = gpu
    if gpu is None:
        dynamic_clusters.register(planned)
        program.registrations.append(loader.Registration(key))
    planned.on_compiled = _dump_specialization(options, function_name, gpu)
    program.compiled.append(_dynamic_compiled_cluster(
        cluster, planned, fallback=not settings.jit_compile,
        written=written_variables(graph, cluster.op_names)))
    program.dynamic_clusters.append(planned)
    program.report.clusters.append(ClusterReport(
        cluster.name, _ops(graph, cluster), len(planned.inputs), len(cluster.outputs), True))
    logger.info("tfxla-lite: %s of %s has unknown dimensions: compiled per input "
                "shape at run time%s", cluster.name, function_name,
                "" if gpu is None else f" for GPU:{gpu}")


def _dump_specialization(options: Options, function_name: str,
                         gpu: int | None = None) -> Callable | None:
    """The hook a dynamic cluster calls as each shape compiles, when dumps are on."""
    if dump.dump_directory(options) is None:
        return None
    device = "" if gpu is None else f" on GPU:{gpu}"  # titled as a static GPU cluster

    def on_compiled(artifacts: Any, seconds: float) -> None:
        dump.dump_cluster(options, function_name, artifacts.name.split(" ")[0],
                          artifacts.hlo_text, artifacts.executable, seconds,
                          artifacts.name + device)

    return on_compiled


def _dynamic_compiled_cluster(cluster: Cluster, planned: dynamic_clusters.DynamicCluster,
                              fallback: bool, written: list[str]) -> CompiledCluster:
    launch_on_gpu = None
    if planned.gpu is not None:  # its fallback runs inside the launch, not in an If
        launch_on_gpu = gpu_launch.GpuDynamicLaunch(
            planned.key, planned.gpu, list(zip(planned.input_dtypes, planned.input_shapes)),
            list(zip(planned.output_dtypes, planned.output_shapes)), planned.value_inputs,
            planned, planned.original_function() if fallback else None)
    return CompiledCluster(
        name=cluster.name, op_names=tuple(cluster.op_names), inputs=planned.inputs,
        outputs=tuple(cluster.outputs), control_inputs=tuple(cluster.control_inputs),
        key=planned.key, output_dtypes=planned.output_dtypes,
        output_shapes=planned.output_shapes, input_dtypes=planned.input_dtypes,
        fallback=planned.branch_functions() if fallback and launch_on_gpu is None else None,
        gpu_launch=launch_on_gpu,
        variable_writes=tuple(planned.inputs.index(h) for h in written))


def finish_pending(program: Program) -> None:
    """Wait for the clusters LLVM is still compiling and register them with the launch op.
    A failure is raised here, in the rewritten function's trace: in must-compile mode it
    is the compile's error, in auto mode the function runs in TF (`api.Function._build`)."""
    for key, executable, inputs, outputs in list(program.pending):
        try:
            executable.wait()
        except Exception as error:
            name = key.split("/")[-2] if key.count("/") >= 2 else key
            raise RuntimeError(f"LLVM could not compile {name}: {type(error).__name__}: "
                               f"{error}") from error
        register_with_launch_op(key, executable, inputs, outputs)
    program.pending.clear()


# -- rewrite -----------------------------------------------------------------------------------


def has_gradient_overrides(graph_def: Any) -> bool:
    """Whether a node of `graph_def` or of its function library has its gradient
    overridden (`_gradient_op_type`, which `tf.custom_gradient` and
    `gradient_override_map` set)."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return any("_gradient_op_type" in node.attr for node in nodes)


def rewrite(concrete_function: Any, program: Program, graph_def: Any = None,
            check_numerics: str = "off") -> Callable:
    """Rewrite: a tf.function that runs the rewritten graph, called like the original
    function. Its dynamic clusters take any shape, so it retraces with unknown dims;
    `program.graph` is the graph the clusters are of (the trace's, or its copy with calls
    inlined)."""
    graph = program.graph
    clusters = program.compiled
    if graph_def is None:  # `graph`'s, as build_program exported it
        graph_def = graph.as_graph_def(add_shapes=True)
    graph_def = rewrite_graph_def(graph_def, clusters)
    control_flow.rename_functions(graph_def, program.renames)
    assertions.without(graph_def, program.dropped)
    if check_numerics != "off":  # each launch beside its TF ops (docs/numerics_check.md)
        graph_def = numerics_check.instrument(graph_def, check_numerics,
                                              concrete_function.name)
    placeholder_names = [t.op.name for t in concrete_function.inputs]
    captured = list(concrete_function.captured_inputs)
    num_arguments = len(concrete_function.inputs) - len(captured)
    structured = concrete_function.structured_outputs
    flat = tf.nest.flatten(structured, expand_composites=True)
    output_names = [rewritten_tensor_name(t.name, clusters) for t in flat
                    if isinstance(t, tf.Tensor)]
    control_names = rewritten_op_names(
        [op.name for op in graph.control_outputs if op.name not in program.dropped], clusters)

    def rewritten(*args: Any, **kwargs: Any) -> Any:
        func_graph = tf.compat.v1.get_default_graph()
        # A variable argument's entry is its eager handle, which the trace captured as
        # the argument's placeholder; capturing it again returns that placeholder.
        arguments = [func_graph.capture(t) if hasattr(t, "numpy") else t
                     for t in func_graph.inputs]
        if len(arguments) != num_arguments:
            raise AssertionError(f"tfxla-lite: traced {len(arguments)} arguments, the original "
                                 f"function has {num_arguments}")
        captures = [func_graph.capture(c) for c in captured]
        # The trace's variables: a call under a tape marks them read (TF's `_call_flat`),
        # so that the tape watches the trainable ones the launches read.
        for variable in concrete_function.graph.variables:
            func_graph.watch_variable(variable)
        add_branch_functions(func_graph, clusters)
        for function in program.functions:  # the rewritten loop bodies and branches
            function.add_to_graph(func_graph)
        results = iter(import_rewritten(graph_def, placeholder_names, arguments + captures,
                                        output_names, control_names))
        # The launch nodes' code must be registered before the graph can run; LLVM made it
        # while this trace ran.
        finish_pending(program)
        # The graph keeps its keys registered: TF's function (and any graph that calls
        # it, through its AtomicFunction) holds the graph after the program is gone.
        func_graph._tfxla_lite_registrations = program.all_registrations()
        values = [next(results) if isinstance(t, tf.Tensor) else t for t in flat]
        return tf.nest.pack_sequence_as(structured, values, expand_composites=True)

    # TF's own tf.function: with tfxla-lite enabled, tf.function is ours.
    generalize = bool(program.all_dynamic_clusters())
    return original_tf_function()(rewritten, autograph=False, reduce_retracing=generalize)


def _rewritten_body(program: Program, library: dict[str, Any]) -> Any:
    """The ConcreteFunction that replaces a loop body or branch: its graph, rewritten."""
    graph = program.graph
    graph_def = rewrite_graph_def(graph.as_graph_def(add_shapes=True), program.compiled)
    control_flow.rename_functions(graph_def, program.renames)
    assertions.without(graph_def, program.dropped)
    output_names = [rewritten_tensor_name(t.name, program.compiled) for t in graph.outputs]
    control_names = rewritten_op_names(
        [op.name for op in graph.control_outputs if op.name not in program.dropped],
        program.compiled)
    fallbacks = [f for c in program.compiled for f in (c.fallback or ())]
    return control_flow.rewritten_body(graph, graph_def, output_names, control_names,
                                       [*program.functions, *fallbacks], library)
