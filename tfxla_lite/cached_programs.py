"""The rewrite cache as a stage of the compile: a trace seen before skips mark to link.

`tfxla_lite/driver.py` asks `load` first: a hit gives the program of an earlier process
(its clusters, report and executables, each checked against this trace and found in the
compile caches) registered with the launch op; a miss compiles, and `store` writes the
result when it is of the plain kind the cache holds. Keys, the entry format and the
checks are `tfxla_lite/rewrite_cache.py`'s.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import tensorflow as tf

from tfxla_lite import rewrite_cache
from tfxla_lite.clustering.body_graphs import CONTROL_FLOW_OPS
from tfxla_lite.clustering.rules_variables import written_variables
from tfxla_lite.codegen import background as background_jobs
from tfxla_lite.codegen import cache as code_caches
from tfxla_lite.codegen.cpu.parallel import effective_threads
from tfxla_lite.codegen.module_cache import executable_from_cache
from tfxla_lite.hlo import HloModule
from tfxla_lite.hlo.parser import parse_module
from tfxla_lite.program import (
    CompilationError,
    CompiledClusterArtifacts,
    Program,
    Settings,
    launch_key,
    must_compile_error,
    register_with_launch_op,
    tensor_spec,
)
from tfxla_lite.rewrite import CompiledCluster
from tfxla_lite.runtime import gpu_launch, loader

logger = logging.getLogger("tfxla_lite")


def key(graph_def: Any, settings: Settings) -> str | None:
    """The trace's rewrite cache key, None with the cache off. An entry this process is
    still writing (`store`, once its O3 code is there) is waited for."""
    if not rewrite_cache.enabled(settings.options):
        return None
    cache_key = rewrite_cache.rewrite_key(graph_def, settings.jit_compile, settings.options,
                                          settings.dynamic, settings.max_specializations)
    pending = background_jobs.pending(("rewrites", cache_key))
    if pending is not None:
        pending.result()
    return cache_key


def load(cache_key: str | None, graph: tf.Graph, function_name: str, settings: Settings
         ) -> Program | None:
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
        raise must_compile_error(function_name, offending)
    threads = effective_threads(None)
    found = []
    try:
        for cached in entry.clusters:
            inputs = [graph.get_tensor_by_name(t) for t in cached.inputs]
            outputs = [graph.get_tensor_by_name(t) for t in cached.outputs]
            for name in (*cached.op_names, *cached.control_inputs):
                graph.get_operation_by_name(name)
            if (tuple(t.dtype.name for t in outputs) != cached.output_dtypes
                    or tuple(tensor_spec(t)[1] for t in outputs) != cached.output_shapes):
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
        key = launch_key(function_name, cached.name)
        registrations.append(loader.Registration(key))
        # The variables it writes follow from its ops, as when it was compiled.
        written = written_variables(graph, cached.op_names)
        register_with_launch_op(key, executable, inputs,
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


def store(cache_key: str | None, graph: tf.Graph, program: Program) -> None:
    """Write `program`'s rewrite to the rewrite cache when it is of the plain kind the
    cache holds (tfxla_lite/rewrite_cache.py) and every executable is in the caches."""
    plain = (not program.bodies and not program.dynamic_clusters and not program.renames
             and not program.dropped and all(c.compiled for c in program.report.clusters)
             and len(program.clusters) == len(program.compiled)
             and all(c.gpu_launch is None and c.fallback is None for c in program.compiled))
    keys = [getattr(a.executable, "optimized_key", None) for a in program.clusters]
    if cache_key is None or not plain or not all(isinstance(k, str) for k in keys):
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


def store_refusal(cache_key: str | None, graph: tf.Graph, error: CompilationError) -> None:
    """Store a must-compile refusal of the trace's own ops (not of a body's, not a failed
    lowering: those carry no `offending` or come from graphs the cache does not hold)."""
    if cache_key is None or not error.offending or any(op.type in CONTROL_FLOW_OPS
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
            self.__dict__["_hlo"] = parse_module(self.hlo_text)
        return self.__dict__["_hlo"]

    @hlo.setter
    def hlo(self, value: HloModule | None) -> None:
        self.__dict__["_hlo"] = value
