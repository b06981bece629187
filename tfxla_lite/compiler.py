"""From one traced `tf.function` to a runnable program with compiled clusters.

The driver of the data flow for one input signature, read top to bottom:
mark every op, form clusters, lower each cluster to HLO, compile it (passes,
fusion, buffer assignment, LLVM), register its executable with the launch op,
rewrite the GraphDef so each cluster is one launch node, and wrap the result
in a new `tf.function` that re-binds arguments, captures and variable writes.
A trace seen before (in this or an earlier process) skips marking through compiling:
its clusters and executables come from the rewrite cache (`tfxla_lite/rewrite_cache.py`).

With `dynamic=True`, shapes need only known ranks: a cluster with unknown
dimensions is planned here and compiled by the launch op at run time, once per
concrete input signature (`tfxla_lite/dynamic.py`).

The functions of While and If ops (loop bodies and conditions, branches) go through
the same steps first, each as a graph of its own (`_compile_bodies`,
`tfxla_lite/control_flow.py`); the op stays in TF and calls the rewritten function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from tfxla_lite import assertions, control_flow, dump, flags, numerics_check, rewrite_cache
from tfxla_lite import dynamic as dynamic_clusters
from tfxla_lite.autojit import original_tf_function
from tfxla_lite.clustering.cluster import form_clusters
from tfxla_lite.clustering.lower import lower_cluster
from tfxla_lite.clustering.mark import PLUMBING_OPS, MarkOptions, format_source, mark
from tfxla_lite.clustering.registry import variable_spec
from tfxla_lite.clustering.rules_control_flow import FUNCTIONAL_OPS
from tfxla_lite.clustering.rules_conv import CONVOLUTION_OPS
from tfxla_lite.clustering.rules_linalg import LINALG_OPS
from tfxla_lite.clustering.rules_resize import RESIZE_TF_KERNEL_OPS
from tfxla_lite.clustering.rules_variables import VARIABLE_OPS, written_variables
from tfxla_lite.codegen import background as background_jobs
from tfxla_lite.codegen import cache as code_caches
from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu.parallel import effective_threads
from tfxla_lite.codegen.module_cache import CachedExecutable, executable_from_cache
from tfxla_lite.hlo import HloModule
from tfxla_lite.hlo.stablehlo import module_to_stablehlo
from tfxla_lite.inline import inline_function_calls, is_compiled_function
from tfxla_lite.options import Options
from tfxla_lite.report import ClusteringReport, ClusterReport, FallbackNode
from tfxla_lite.rewrite import (
    CompiledCluster,
    add_branch_functions,
    import_rewritten,
    rewrite_graph_def,
    rewritten_op_names,
    rewritten_tensor_name,
)
from tfxla_lite.runtime import BuildError, gpu_launch, load_library, loader, register_executable

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
    dynamic_clusters: list[dynamic_clusters.DynamicCluster] = field(default_factory=list)
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
    # function's trace waits for them (`_finish_pending`), before anything can launch.
    pending: list[tuple[str, Any, list[Any], list[Any]]] = field(default_factory=list)
    # The trace holds a tf.custom_gradient (or another gradient override): its gradient
    # function closes over tensors of the trace's own graph, so only the original trace
    # can be differentiated (tfxla_lite/api.py runs it where a gradient may be taken).
    custom_gradients: bool = False
    # One per key its launch nodes name (bodies' in `bodies`): a key is unregistered, and
    # its code freed, when the last holder goes. The program holds them, and so does
    # every graph of its rewritten function (`_rewritten_function`), since a graph that
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

    def all_dynamic_clusters(self) -> list[dynamic_clusters.DynamicCluster]:
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

    call: control_flow.BodyCall
    program: Program
    function: Any = None


def _tensor_spec(tensor: tf.Tensor) -> tuple[tf.DType, tuple[int, ...]]:
    """A tensor's dtype and static dims; a resource handle's are its variable's."""
    if tensor.dtype == tf.resource:
        spec = variable_spec(tensor)
        if spec is None:
            raise ValueError(f"variable {tensor.name} has no static dtype and shape")
        return spec
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
    settings = _Settings(jit_compile, options, dynamic, max_specializations)
    # Before any kernel is JIT-linked (compiled or loaded from a cache): kernels linked
    # once the op library is loaded run their parallel parts on TF's thread pool. A
    # library that cannot be built fails the first registration instead, with its error.
    with contextlib.suppress(BuildError, OSError, RuntimeError):
        load_library()
    graph_def = graph.as_graph_def(add_shapes=True)
    # A warm process finds the whole result in the rewrite cache: no marking, clustering,
    # lowering, pass or LLVM (tfxla_lite/rewrite_cache.py).
    cache_key = (rewrite_cache.rewrite_key(graph_def, jit_compile, options, dynamic,
                                           max_specializations)
                 if rewrite_cache.enabled(options) else None)
    pending = background_jobs.pending(("rewrites", cache_key))
    if pending is not None:  # written once this process's O3 code is stored
        pending.result()
    program = _program_from_cache(graph, function_name, settings, cache_key)
    if program is None:
        try:
            program = _compile_graph(graph, function_name, settings)
        except CompilationError as error:
            if cache_key is not None:
                _store_refusal(cache_key, graph, error)
            raise
        if cache_key is not None:
            _store_in_cache(cache_key, graph, program)
    program.concrete_function = concrete_function
    program.custom_gradients = has_gradient_overrides(graph_def)
    program.run = _rewritten_function(concrete_function, program, graph_def,
                                      options.check_numerics)
    return program


def has_gradient_overrides(graph_def: Any) -> bool:
    """Whether a node of `graph_def` or of its function library has its gradient
    overridden (`_gradient_op_type`, which `tf.custom_gradient` and
    `gradient_override_map` set)."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return any("_gradient_op_type" in node.attr for node in nodes)


def _program_from_cache(graph: tf.Graph, function_name: str, settings: _Settings,
                        cache_key: str | None) -> Program | None:
    """The program of a rewrite cache hit, or None: then the caller compiles. Every part
    of the entry is checked against `graph`, and every executable must still be in the
    compile caches; source lines come from `graph`, never from the entry."""
    entry = rewrite_cache.load(cache_key) if cache_key is not None else None
    if entry is None:
        return None
    if entry.must_compile_error:
        try:
            offending = rewrite_cache.fallbacks_from(entry, graph)
        except (KeyError, ValueError) as error:
            rewrite_cache.reject(cache_key, error)
            return None
        code_caches.count("rewrite_hits")
        raise CompilationError(_must_compile_message(function_name, offending), offending)
    threads = effective_threads(None)
    found = []
    try:
        for cached in entry.clusters:
            inputs = [graph.get_tensor_by_name(t) for t in cached.inputs]
            outputs = [graph.get_tensor_by_name(t) for t in cached.outputs]
            for name in (*cached.op_names, *cached.control_inputs):
                graph.get_operation_by_name(name)
            if (tuple(t.dtype.name for t in outputs) != cached.output_dtypes
                    or tuple(_tensor_spec(t)[1] for t in outputs) != cached.output_shapes):
                raise ValueError(f"{cached.name}: outputs differ from the trace's")
            if gpu_launch.placed_gpu(cached.device) is not None:
                raise ValueError(f"{cached.name} would run on a GPU")
            # Source lines are looked up in this trace when something reads the texts.
            current = functools.partial(rewrite_cache.with_current_sources, cached.hlo_text,
                                        graph)
            executable = executable_from_cache(
                cached.optimized_key, cached.hlo_text, threads,
                code_caches.policy(settings.options.cache), current)
            if executable is None:  # pruned or invalidated below: compile again
                code_caches.count("rewrite_misses")
                return None
            found.append((cached, inputs, outputs, executable))
        report = rewrite_cache.report_from(entry, function_name, settings.jit_compile, graph)
    except (KeyError, ValueError, TypeError) as error:  # an entry that does not fit
        rewrite_cache.reject(cache_key, error)
        return None
    code_caches.count("rewrite_hits")
    compiled: list[CompiledCluster] = []
    artifacts: list[CompiledClusterArtifacts] = []
    registrations: list[loader.Registration] = []
    for cached, inputs, outputs, executable in found:
        key = f"{function_name}/{cached.name}/{next(_executable_ids)}"
        registrations.append(loader.Registration(key))
        # The variables it writes follow from its ops, as when it was compiled.
        written = written_variables(graph, cached.op_names)
        _register(key, executable, inputs,
                  outputs + [graph.get_tensor_by_name(h) for h in written])
        compiled.append(CompiledCluster(
            name=cached.name, op_names=cached.op_names, inputs=cached.inputs,
            outputs=cached.outputs, control_inputs=cached.control_inputs, key=key,
            output_dtypes=tuple(t.dtype for t in outputs), output_shapes=cached.output_shapes,
            input_dtypes=tuple(t.dtype for t in inputs),
            variable_writes=tuple(cached.inputs.index(h) for h in written)))
        artifacts.append(_CachedArtifacts(cached.name, None, "", executable))
    logger.info("tfxla-lite: %s from the rewrite cache: %d clusters", function_name,
                len(compiled))
    return Program(None, report, artifacts, graph=graph, compiled=compiled,
                   registrations=registrations)


def _register(key: str, executable: Any, inputs: list[tf.Tensor],
              outputs: list[tf.Tensor]) -> None:
    """Register a CPU executable with the launch op under `key`, with the cluster's
    boundary tensors' dtypes and shapes."""
    register_executable(key, executable.entry_address, executable.temp_bytes,
                        [_tensor_spec(t) for t in inputs], [_tensor_spec(t) for t in outputs],
                        owner=executable, donations=executable.donations)


def _store_in_cache(cache_key: str, graph: tf.Graph, program: Program) -> None:
    """Write `program`'s rewrite to the rewrite cache when it is of the plain kind the
    cache holds (tfxla_lite/rewrite_cache.py) and every executable is in the caches."""
    plain = (not program.bodies and not program.dynamic_clusters and not program.renames
             and not program.dropped and all(c.compiled for c in program.report.clusters)
             and len(program.clusters) == len(program.compiled)
             and all(c.gpu_launch is None and c.fallback is None for c in program.compiled))
    keys = [getattr(a.executable, "optimized_key", None) for a in program.clusters]
    if not plain or not all(isinstance(k, str) for k in keys):
        return
    clusters = []
    for compiled, artifact, key in zip(program.compiled, program.clusters, keys):
        operation = graph.get_operation_by_name(compiled.op_names[0])
        clusters.append(rewrite_cache.CachedCluster(
            compiled.name, compiled.op_names, compiled.inputs, compiled.outputs,
            compiled.control_inputs, operation.device,
            tuple(d.name for d in compiled.output_dtypes),
            tuple(tuple(int(d) for d in s) for s in compiled.output_shapes), key,
            artifact.hlo_text))
    fallbacks = tuple((f.op_name, f.op_type, f.reason) for f in program.report.fallbacks)
    entry = rewrite_cache.RewriteEntry(tuple(clusters), tuple(program.report.clusters),
                                       fallbacks)
    # Written only once the machine code it refers to is in the kernel caches: a tiered
    # or background compile stores its O3 code when done, and a warm process must find it
    # (one that fails leaves no entry).
    jobs = [job for a in program.clusters
            if (job := getattr(a.executable, "job", None)) is not None]
    if not jobs:
        rewrite_cache.store(cache_key, entry)
        return
    # On the compile thread, after those jobs (one thread, in order): `wait_for_compiles`
    # waits for the write too, and a second trace of this graph in the process for it.
    background_jobs.submit(_store_after, jobs, cache_key, entry, key=("rewrites", cache_key))


def _store_after(jobs: list[Any], cache_key: str, entry: rewrite_cache.RewriteEntry) -> None:
    background_jobs.wait_for_compiles(jobs=jobs)
    if all(not job.cancelled() and job.exception() is None for job in jobs):
        rewrite_cache.store(cache_key, entry)


def _store_refusal(cache_key: str, graph: tf.Graph, error: CompilationError) -> None:
    """Store a must-compile refusal of the trace's own ops (not of a body's, not a failed
    lowering: those carry no `offending` or come from graphs the cache does not hold)."""
    if not error.offending or any(op.type in control_flow.CONTROL_FLOW_OPS
                                  for op in graph.get_operations()):
        return
    offending = tuple((f.op_name, f.op_type, f.reason) for f in error.offending)
    rewrite_cache.store(cache_key, rewrite_cache.RewriteEntry((), (), offending, True))


class _CachedArtifacts(CompiledClusterArtifacts):
    """A cluster from the rewrite cache: its lowered text is the executable's (metadata
    looked up on first read), its HLO module parsed from it only when something reads it."""

    @property  # type: ignore[override]
    def hlo_text(self) -> str:
        return self.executable.hlo_text

    @hlo_text.setter
    def hlo_text(self, value: str) -> None:
        pass  # always the executable's

    @property  # type: ignore[override]
    def hlo(self) -> HloModule:
        if self.__dict__.get("_hlo") is None:
            from tfxla_lite.hlo.parser import parse_module

            self.__dict__["_hlo"] = parse_module(self.hlo_text)
        return self.__dict__["_hlo"]

    @hlo.setter
    def hlo(self, value: HloModule | None) -> None:
        self.__dict__["_hlo"] = value


@dataclass(frozen=True)
class _Settings:
    """What every graph of one build (the trace, its loop bodies) is compiled with."""

    jit_compile: bool | None
    options: Options
    dynamic: bool
    max_specializations: int | None


def _compile_graph(graph: tf.Graph, function_name: str, settings: _Settings,
                   library: dict[str, Any] | None = None) -> Program:
    """Mark, cluster and compile `graph` and, first, the bodies of its control-flow ops;
    a Program without `run` (the caller rewrites and imports). `library`: the trace's
    FunctionDefs by name, for a body (default: `graph`'s own)."""
    jit_compile, options, dynamic = settings.jit_compile, settings.options, settings.dynamic
    report = ClusteringReport(function_name, jit_compile)
    tf_kernels = frozenset() if options.compile_convolutions else CONVOLUTION_OPS
    if not jit_compile:  # must-compile compiles linear algebra whatever its shape
        tf_kernels |= LINALG_OPS
    if not jit_compile:  # must-compile compiles every resize gradient
        tf_kernels |= RESIZE_TF_KERNEL_OPS
    denied = frozenset() if options.hlo_control_flow else FUNCTIONAL_OPS
    decisions = mark(graph, MarkOptions(dynamic_shapes=dynamic, denylist=denied,
                                        allowlist=options.ops_to_cluster,
                                        tf_kernels=tf_kernels))
    min_size = 1 if jit_compile else options.min_cluster_size
    # Bodies first: in must-compile mode a body that cannot compile is the error. A loop or
    # branch that joins a cluster whole (an HLO while/conditional) needs no compiled bodies.
    whole = _clustered_control_flow(graph, decisions, min_size, options)
    bodies, renames, functions, assertion_ifs = _compile_bodies(graph, function_name,
                                                                settings, library, whole)
    dropped = assertions.dropped_nodes(graph, assertion_ifs) if jit_compile else frozenset()
    for name in dropped:
        decisions[name] = dataclasses.replace(decisions[name], compilable=False,
                                              reason=assertions.DROPPED_REASON)
    clusters = form_clusters(graph, decisions, min_cluster_size=min_size,
                             max_cluster_size=options.max_cluster_size,
                             merge_independent=options.merge_independent_clusters)
    clusters = _variables_in_static_clusters(graph, decisions, clusters, dynamic, min_size,
                                             options, bool(jit_compile))

    clustered = {name for c in clusters for name in c.op_names}
    for op in graph.get_operations():
        decision = decisions[op.name]
        if op.name in clustered:
            continue
        reason = decision.reason if not decision.compilable else "cluster too small"
        if op.type in control_flow.CONTROL_FLOW_OPS:
            reason = control_flow.CONTROL_FLOW_REASON + (
                f" ({decision.reason})" if decision.reason else "")
        source = decision.source or format_source(op)
        report.fallbacks.append(FallbackNode(op.name, op.type, reason or "", source))

    if jit_compile:
        # Plumbing stays in TF by design; so does a Const shared by several clusters
        # (each embeds its value), which is compilable but in no cluster; so do
        # control-flow ops, whose bodies compiled above.
        offending = [f for f in report.fallbacks
                     if f.op_type not in PLUMBING_OPS and not decisions[f.op_name].compilable
                     and f.op_type not in control_flow.CONTROL_FLOW_OPS
                     and f.op_name not in dropped]
        if offending:
            raise CompilationError(_must_compile_message(function_name, offending),
                                   offending)

    compiled: list[CompiledCluster] = []
    artifacts: list[CompiledClusterArtifacts] = []
    planned: list[dynamic_clusters.DynamicCluster] = []
    # The trace's own clusters (not a body's: its rewritten function is traced within this
    # compile) compile LLVM in the background, overlapping the next cluster's Python work
    # and TF's trace of the rewritten graph; not with dumps, which read the code at once.
    background = (library is None and overlap_llvm(options)
                  and dump.dump_directory(options) is None)
    # A cache miss runs on quick-tier code until its O3 code, compiled in the background,
    # is swapped in (codegen/cpu/tiers.py); not with dumps, which show the O3 code at once.
    tiered = _tiered(options)
    pending: list[tuple[str, Any, list[Any], list[Any]]] = []
    registrations: list[loader.Registration] = []
    for cluster in clusters:
        ops = tuple((name, graph.get_operation_by_name(name).type) for name in cluster.op_names)
        # A cluster TF runs on a GPU compiles for it, or stays in TF there.
        gpu = gpu_launch.placed_gpu(cluster.device)
        try:
            if dynamic and not dynamic_clusters.is_static(graph, cluster):
                key = f"{function_name}/{cluster.name}/{next(_executable_ids)}"
                dynamic_cluster = _plan_dynamic(graph, cluster, key, jit_compile, options,
                                                settings.max_specializations, gpu)
                if gpu is None:
                    registrations.append(loader.Registration(key))
                dynamic_cluster.on_compiled = _dump_specialization(options, function_name, gpu)
                compiled.append(_dynamic_compiled_cluster(
                    cluster, dynamic_cluster, fallback=not jit_compile,
                    written=written_variables(graph, cluster.op_names)))
                planned.append(dynamic_cluster)
                report.clusters.append(ClusterReport(
                    cluster.name, ops, len(dynamic_cluster.inputs), len(cluster.outputs), True))
                logger.info("tfxla-lite: %s of %s has unknown dimensions: compiled per input "
                            "shape at run time%s", cluster.name, function_name,
                            "" if gpu is None else f" for GPU:{gpu}")
                continue
            started = time.perf_counter()
            module = lower_cluster(graph, cluster)
            if gpu is not None:
                executable = gpu_launch.compile_cluster(module, gpu, options.effective_pipeline,
                                                        options.verify)
                dump.dump_cluster(options, function_name, cluster.name, executable.hlo_text,
                                  executable, time.perf_counter() - started,
                                  title=f"{cluster.name} on GPU:{gpu}")
            else:
                executable = compile_module(module, pipeline=options.effective_pipeline,
                                            verify=options.verify,
                                            donate=_forwardable(
                                                graph, cluster.inputs,
                                                written_variables(graph, cluster.op_names)),
                                            cache=options.cache,
                                            background=background and not tiered,
                                            tiered=tiered)
                dump.dump_cluster(options, function_name, cluster.name, executable.hlo_text,
                                  executable, time.perf_counter() - started)
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
        # The variables it writes: the executable's last outputs (clustering/lower.py).
        written = written_variables(graph, cluster.op_names)
        variable_writes = tuple(cluster.inputs.index(h) for h in written)
        launch_on_gpu = None
        if gpu is not None:
            launch_on_gpu = gpu_launch.GpuLaunch(key, executable, gpu,
                                                 [_tensor_spec(t) for t in inputs],
                                                 [_tensor_spec(t) for t in outputs])
        else:
            # Made before the key is registered: once registered, a key is only
            # unregistered by its registration's collection.
            registrations.append(loader.Registration(key))
            written_handles = [graph.get_tensor_by_name(h) for h in written]
            if getattr(executable, "ready", True):
                _register(key, executable, inputs, outputs + written_handles)
            else:  # registered when LLVM is done, before the rewritten graph can run
                pending.append((key, executable, inputs, outputs + written_handles))
        compiled.append(CompiledCluster(
            name=cluster.name, op_names=tuple(cluster.op_names), inputs=tuple(cluster.inputs),
            outputs=tuple(cluster.outputs), control_inputs=tuple(cluster.control_inputs), key=key,
            output_dtypes=tuple(t.dtype for t in outputs),
            output_shapes=tuple(_tensor_spec(t)[1] for t in outputs),
            input_dtypes=tuple(t.dtype for t in inputs), gpu_launch=launch_on_gpu,
            variable_writes=variable_writes))
        artifacts.append(CompiledClusterArtifacts(cluster.name, module, executable.hlo_text,
                                                  executable))
        report.clusters.append(ClusterReport(
            cluster.name, ops, len(cluster.inputs), len(cluster.outputs), True,
            kernel_count=executable.kernel_count, temp_bytes=executable.temp_bytes,
            temp_bytes_without_reuse=_temp_bytes_without_reuse(executable)))
        logger.info("tfxla-lite: compiled %s of %s: %d ops, %d kernels%s", cluster.name,
                    function_name, len(ops), executable.kernel_count,
                    "" if gpu is None else f" for GPU:{gpu}")

    dump.dump_trace(options, graph, report)
    # The bodies' clusters and fallbacks are part of this function's report, their names
    # prefixed with the body's function name.
    for body in bodies:
        _merge_body_report(report, body)
    return Program(None, report, artifacts, dynamic_clusters=planned, graph=graph,
                   bodies=bodies, compiled=compiled, renames=renames, functions=functions,
                   pending=pending, registrations=registrations, dropped=dropped)


def overlap_llvm(options: Options) -> bool:
    """Whether a trace's clusters compile LLVM in the background: the `overlap_llvm`
    option, else `TFXLA_LITE_OVERLAP_LLVM=1` (the code is the same either way). Off by
    default: no gain was measured (docs/benchmarks.md, "Session 5's end")."""
    if options.overlap_llvm is not None:
        return options.overlap_llvm
    return flags.switch("overlap_llvm")


def tiered_llvm(options: Options) -> bool:
    """Whether a compile-cache miss runs first on quick-tier code (the O1 pipeline, code
    generation at level 0) while the O3 code compiles in the background: the
    `tiered_llvm` option, else `TFXLA_LITE_TIERED` (on unless 0, off, false, no or none).
    Only O3 code is cached either way (codegen/cpu/tiers.py; measurements in
    docs/benchmarks.md, "A tiered LLVM compile")."""
    if options.tiered_llvm is not None:
        return options.tiered_llvm
    return flags.switch("tiered_llvm")


def _tiered(options: Options) -> bool:
    """Tiered compiles for this build: on by the switch, off with dumps (which show the
    O3 code as each cluster compiles, so a quick tier would only be waste)."""
    return tiered_llvm(options) and dump.dump_directory(options) is None


def _finish_pending(program: Program) -> None:
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
        _register(key, executable, inputs, outputs)
    program.pending.clear()


def _temp_bytes_without_reuse(executable: Any) -> int:
    """From the cached figure when the executable came from the optimized-module cache,
    whose buffer assignment is rebuilt only on demand (codegen/cache.py)."""
    if isinstance(executable, CachedExecutable):
        return executable.temp_bytes_without_reuse
    return executable.assignment.temp_bytes_without_reuse


def _clustered_control_flow(graph: tf.Graph, decisions: dict[str, Any], min_size: int,
                            options: Options) -> frozenset[str]:
    """The While and If ops that clusters take whole (clustering/rules_control_flow.py),
    as clustering `decisions` (a copy) forms them."""
    if not any(d.compilable and d.op_type in control_flow.CONTROL_FLOW_OPS
               for d in decisions.values()):
        return frozenset()
    clusters = form_clusters(graph, dict(decisions), min_cluster_size=min_size,
                             max_cluster_size=options.max_cluster_size,
                             merge_independent=options.merge_independent_clusters)
    return frozenset(name for c in clusters for name in c.op_names
                     if graph.get_operation_by_name(name).type
                     in control_flow.CONTROL_FLOW_OPS)


def _compile_bodies(graph: tf.Graph, function_name: str, settings: _Settings,
                    library: dict[str, Any] | None, whole: frozenset[str] = frozenset()
                    ) -> tuple[list[BodyProgram], dict[tuple[str, str], str], list[Any],
                               set[str]]:
    """Compile the functions of `graph`'s While and If ops (tfxla_lite/control_flow.py),
    but for those in `whole` (compiled within a cluster as HLO control flow).

    Returns the body programs, the function attributes to re-point ((node, attr) → the
    rewritten function's name), the rewritten ConcreteFunctions to add to the graph
    the rewritten GraphDef is imported into, and the If ops whose branches hold only
    assertions that must-compile dropped (`assertions.assertion_only`). In auto mode a
    body that fails to compile stays as it was.
    """
    if not any(op.type in control_flow.CONTROL_FLOW_OPS for op in graph.get_operations()):
        return [], {}, [], set()
    if library is None:  # as the rewrite exports it (add_shapes also marks library nodes)
        library = {f.signature.name: f
                   for f in graph.as_graph_def(add_shapes=True).library.function}
    calls = control_flow.body_calls(graph, library)
    bodies: list[BodyProgram] = []
    renames: dict[tuple[str, str], str] = {}
    functions: list[Any] = []
    done: dict[tuple[Any, ...], BodyProgram] = {}
    branches: dict[str, list[BodyProgram]] = {}  # If node -> its branches' programs
    shape_lists: set[tuple[str, int]] = set()  # While outputs that accumulate shapes
    for call in calls:
        if is_compiled_function(call.function, library) or call.node in whole:
            continue  # tfxla-lite's own output, in a graph that calls a compiled function
        call = control_flow.with_shape_lists(call, shape_lists)  # noqa: PLW2901
        # Constants and shapes of the arguments shape the compiled body: share it only
        # between calls with the very same arguments (one function named twice).
        signature = (call.function, tuple(str(s) for s in call.shapes),
                     tuple(t.name for t in call.arguments))
        if signature in done:
            body = done[signature]
        else:
            try:
                body_graph = control_flow.function_graph(library, call)
                body_graph = inline_function_calls(body_graph) or body_graph
                program = _compile_graph(body_graph, call.function, settings, library)
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
            bodies.append(body)
            shape_lists |= control_flow.shape_lists(call, program.graph)
        if call.op_type in assertions.IF_OPS:
            branches.setdefault(call.node, []).append(body)
        if body.function is not None:
            renames[(call.node, call.attr)] = body.function.function_def.signature.name
            if body.function not in functions:
                functions.append(body.function)
    assertion_ifs = {
        node for node, found in branches.items()
        if len(found) == 2 and any(b.program.dropped for b in found)
        and all(assertions.assertion_only(b.program.graph, b.program.dropped) for b in found)}
    return bodies, renames, functions, assertion_ifs


def _rewritten_body(program: Program, library: dict[str, Any]) -> Any:
    """The ConcreteFunction that replaces a body: its graph with launch ops."""
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


def _merge_body_report(report: ClusteringReport, body: BodyProgram) -> None:
    prefix = f"{body.call.function}/"
    for cluster in body.program.report.clusters:
        report.clusters.append(dataclasses.replace(
            cluster, name=prefix + cluster.name,
            ops=tuple((prefix + name, op_type) for name, op_type in cluster.ops)))
    for node in body.program.report.fallbacks:
        report.fallbacks.append(dataclasses.replace(node, op_name=prefix + node.op_name))


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


# Why a variable op stays out of the cluster it would join.
_VARIABLE_IN_DYNAMIC_REASON = ("variable op in a cluster of unknown dimensions with a fallback "
                               "(auto mode) or for a GPU (variables compile in CPU clusters "
                               "without a fallback)")


def _variables_in_static_clusters(graph: tf.Graph, decisions: dict[str, Any],
                                  clusters: list[Any], dynamic: bool, min_size: int,
                                  options: Options, must_compile: bool) -> list[Any]:
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
        clusters = form_clusters(graph, decisions, min_cluster_size=min_size,
                                 max_cluster_size=options.max_cluster_size,
                                 merge_independent=options.merge_independent_clusters)
    return clusters


def _plan_dynamic(graph: tf.Graph, cluster: Any, key: str, jit_compile: bool | None,
                  options: Options, max_specializations: int | None, gpu: int | None = None
                  ) -> dynamic_clusters.DynamicCluster:
    """Plan a cluster with unknown dimensions and register its compile callback (with the
    launch op; a GPU cluster's launch calls it itself: `_dynamic_compiled_cluster`)."""
    planned = dynamic_clusters.plan_dynamic_cluster(graph, cluster, key, cluster.name)
    planned.pipeline = options.effective_pipeline
    planned.verify = options.verify
    planned.pause_collector = options.pause_collector
    # Must-compile has no fallback to run: like TF's jit_compile=True, every shape compiles.
    planned.must_compile = bool(jit_compile)
    planned.tiered = _tiered(options)
    planned.cache = options.cache
    planned.max_specializations = None if jit_compile else max_specializations
    planned.gpu = gpu
    if gpu is None:
        dynamic_clusters.register(planned)
    return planned


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


def _dynamic_compiled_cluster(cluster: Any, planned: dynamic_clusters.DynamicCluster,
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


def _must_compile_message(function_name: str, offending: list[FallbackNode]) -> str:
    lines = [f"tfxla-lite: jit_compile=True, but {len(offending)} op(s) of {function_name} "
             "cannot be compiled:"]
    for node in offending:
        where = f" at {node.source}" if node.source else ""
        lines.append(f"  {node.op_type} node '{node.op_name}'{where}: {node.reason}")
    return "\n".join(lines)


def _rewritten_function(concrete_function: Any, program: Program,
                        graph_def: Any = None, check_numerics: str = "off") -> Callable:
    """A tf.function that runs the rewritten graph; called like the original function.
    Its dynamic clusters take any shape, so it retraces with unknown dims; `program.graph`
    is the graph the clusters are of (the trace's, or its copy with calls inlined)."""
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
        arguments = list(func_graph.inputs)
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
        _finish_pending(program)
        # The graph keeps its keys registered: TF's function (and any graph that calls
        # it, through its AtomicFunction) holds the graph after the program is gone.
        func_graph._tfxla_lite_registrations = program.all_registrations()
        values = [next(results) if isinstance(t, tf.Tensor) else t for t in flat]
        return tf.nest.pack_sequence_as(structured, values, expand_composites=True)

    # TF's own tf.function: with tfxla-lite enabled, tf.function is ours.
    generalize = bool(program.all_dynamic_clusters())
    return original_tf_function()(rewritten, autograph=False, reduce_retracing=generalize)
