"""The rewrite cache: a warm process reuses a whole trace's clustering and compile.

`driver.build_program` asks here (through `cached_programs.py`) before marking. The key
fingerprints the traced GraphDef with everything the result depends on; the entry holds
each compiled cluster's boundary, lowered HLO and optimized-module key, so a hit runs no
mark, lower, pass or LLVM. A refused must-compile build is stored too (the same
`CompilationError`, without marking again). Source lines always come from the current
trace. Only plain programs are stored; keys, checks and what is stored:
docs/architecture.md, "Rewrite cache".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import tensorflow as tf

from tfxla_lite.codegen import cache as stage_cache
from tfxla_lite.codegen import module_cache
from tfxla_lite.codegen.cpu.kernel_cache import METADATA
from tfxla_lite.report import ClusteringReport, ClusterReport, FallbackNode


@dataclass(frozen=True)
class CachedCluster:
    """One compiled cluster of an entry: what `CompiledCluster` needs, and its compile."""

    name: str
    op_names: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    control_inputs: tuple[str, ...]
    device: str  # the ops' placement, as the trace had it
    output_dtypes: tuple[str, ...]  # tf.DType names
    output_shapes: tuple[tuple[int, ...], ...]
    optimized_key: str  # module_cache.optimized_key of the lowered module
    hlo_text: str  # as lowered, with the writer's metadata (refreshed on load)


@dataclass(frozen=True)
class RewriteEntry:
    """A build's result: its clusters and report, or (`must_compile_error`) the nodes
    for which jit_compile=True refused the trace (no clusters then)."""

    clusters: tuple[CachedCluster, ...]
    report_clusters: tuple[ClusterReport, ...]
    fallbacks: tuple[tuple[str, str, str], ...]  # (op name, op type, reason)
    must_compile_error: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"clusters": [dataclasses.asdict(c) for c in self.clusters],
                "report_clusters": [dataclasses.asdict(c) for c in self.report_clusters],
                "fallbacks": [list(f) for f in self.fallbacks],
                "must_compile_error": self.must_compile_error}

    @staticmethod
    def from_json(data: dict[str, Any]) -> RewriteEntry:
        """Typed, so that a payload of the wrong shape fails here and not in a launch."""
        def strings(items: Any) -> tuple[str, ...]:
            return tuple(str(item) for item in items)

        clusters = tuple(CachedCluster(
            str(c["name"]), strings(c["op_names"]), strings(c["inputs"]), strings(c["outputs"]),
            strings(c["control_inputs"]), str(c["device"]), strings(c["output_dtypes"]),
            tuple(tuple(int(d) for d in dims) for dims in c["output_shapes"]),
            str(c["optimized_key"]), str(c["hlo_text"])) for c in data["clusters"])
        report_clusters = tuple(ClusterReport(
            str(c["name"]), tuple((str(n), str(t)) for n, t in c["ops"]), int(c["num_inputs"]),
            int(c["num_outputs"]), bool(c["compiled"]),
            None if c["error"] is None else str(c["error"]), int(c["kernel_count"]),
            int(c["temp_bytes"]), int(c["temp_bytes_without_reuse"]))
            for c in data["report_clusters"])
        fallbacks = tuple((str(n), str(t), str(r)) for n, t, r in data["fallbacks"])
        if set(data) != {"clusters", "report_clusters", "fallbacks", "must_compile_error"}:
            raise ValueError(f"unexpected fields {sorted(data)}")
        error = data["must_compile_error"]
        if not isinstance(error, bool) or (error and (clusters or report_clusters)):
            raise ValueError("a must-compile error entry has no clusters")
        return RewriteEntry(clusters, report_clusters, fallbacks, error)


def enabled(options: Any) -> bool:
    """Whether a build with `options` may use the rewrite cache (see the module docstring)."""
    from tfxla_lite import dump

    return (stage_cache.policy(options.cache).disk and not options.verify
            and dump.dump_directory(options) is None)


# -- the key -------------------------------------------------------------------------------

# `tf.custom_gradient` names each use's gradient "CustomGradient-<uid>" from a counter
# of the process (TF's `ops.uid()`), kept in the IdentityN's `_gradient_op_type`: the
# same code traced after other work (another function, a retrace) gets another number.
# Nothing that marks, clusters or lowers reads it (the gradient is already in the trace).
_GRADIENT_OP_TYPE = "_gradient_op_type"
_CUSTOM_GRADIENT = re.compile(rb"CustomGradient-\d+")


def graph_fingerprint(graph_def: tf.compat.v1.GraphDef) -> str:
    """The hash of `graph_def` serialized deterministically, its custom-gradient names
    numbered by first appearance (the graph is restored before returning)."""
    renamed: dict[bytes, bytes] = {}
    originals = []
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    for node in nodes:
        if _GRADIENT_OP_TYPE not in node.attr:
            continue
        value = node.attr[_GRADIENT_OP_TYPE]
        if value.WhichOneof("value") == "s" and _CUSTOM_GRADIENT.fullmatch(value.s):
            originals.append((value, value.s))
            value.s = renamed.setdefault(value.s, b"CustomGradient-%d" % len(renamed))
    try:
        return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()
    finally:
        for value, original in originals:
            value.s = original


def _canonical(value: Any) -> Any:
    """Options values as JSON that is the same in every process (frozensets sorted)."""
    if isinstance(value, (frozenset, set)):
        return sorted(str(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# Options that act only while a program runs or compiles, never on what a build
# produces: a change of them must not miss the cache (the compile switches decide how
# and whether code is compiled and cached, not what the rewrite is).
_RUNTIME_ONLY_OPTIONS = frozenset({"parallel_runtime", "pause_collector", "log_level",
                                   "cache", "tiered_llvm", "overlap_llvm", "autograph_cache",
                                   "background_nice", "cublaslt_epilogues"})


def rewrite_key(graph_def: tf.compat.v1.GraphDef, jit_compile: bool | None, options: Any,
                dynamic: bool, max_specializations: int | None) -> str:
    """The key of one build: the trace's fingerprint and every setting that changes it
    (all options but `_RUNTIME_ONLY_OPTIONS`)."""
    from tfxla_lite.codegen.cpu.parallel import effective_threads

    settings = {"jit_compile": jit_compile, "dynamic": dynamic,
                "max_specializations": max_specializations, "threads": effective_threads(None),
                "options": {f.name: _canonical(getattr(options, f.name))
                            for f in dataclasses.fields(options)
                            if f.name not in _RUNTIME_ONLY_OPTIONS}}
    hasher = hashlib.sha256(graph_fingerprint(graph_def).encode())
    hasher.update(json.dumps(settings, sort_keys=True).encode())
    return hasher.hexdigest()


# The TF-side modules whose code decides the clusters, their boundaries and the rewrite.
_TF_SIDE_MODULES = ("api.py", "driver.py", "program.py", "cached_programs.py", "rewrite.py",
                    "rewrite_cache.py", "dynamic.py", "control_flow.py", "options.py")


@cache
def _tf_side_source_hash() -> str:
    import tfxla_lite
    import tfxla_lite.clustering

    hasher = hashlib.sha256()
    clustering = Path(tfxla_lite.clustering.__file__).parent
    api = Path(tfxla_lite.__file__).parent
    paths = [*sorted(clustering.glob("*.py")), *(api / name for name in _TF_SIDE_MODULES)]
    for path in paths:
        hasher.update(path.name.encode() + b"\0" + path.read_bytes())
    return hasher.hexdigest()[:16]


def environment() -> dict[str, str]:
    """Everything besides the key that an entry must have been written with."""
    return {**module_cache.environment(), "tensorflow": tf.__version__,
            "tf_side_sources": _tf_side_source_hash()}


# Hits are counted by the caller, once it has checked the entry against the trace.
STAGE = stage_cache.Stage("rewrites", ".tlr", "tfxla-lite-rewrite-2", environment, "rewrite",
                          counts_hits=False)


def load(key: str) -> RewriteEntry | None:
    """The verified entry of `key`, or None (a miss: absent, or not trusted and removed)."""
    return STAGE.load_json(key, RewriteEntry.from_json)


def reject(key: str, error: Any) -> None:
    """Count, log and remove the entry of `key`, which failed the caller's checks."""
    STAGE.reject(key, error)


def store(key: str, entry: RewriteEntry) -> None:
    """Write `entry` atomically; a failure (read-only cache, full disk) is only logged."""
    STAGE.store_json(key, entry.to_json())


# -- source metadata of the current trace -------------------------------------------------

_OP_NAME = re.compile(r'op_name="((?:[^"\\\n]|\\.)*)"')
_SOURCE = re.compile(r' source_file="(?:[^"\\\n]|\\.)*" source_line=-?\d+')


def with_current_sources(hlo_text: str, graph: tf.Graph) -> str:
    """`hlo_text` whose metadata's source file and line are those of `graph`'s ops (by
    `op_name`), as lowering `graph` now would stamp them; names `graph` lacks keep none."""
    from tfxla_lite.clustering.registry import source_location

    sources: dict[str, str] = {}

    def current(match: re.Match[str]) -> str:
        block = match.group(0)
        name = _OP_NAME.search(block)
        if name is None:
            return block
        op_name = json.loads(f'"{name.group(1)}"')
        if op_name not in sources:
            try:
                location = source_location(graph.get_operation_by_name(op_name))
            except (KeyError, ValueError):
                location = None
            sources[op_name] = "" if location is None else (
                f' source_file="{_escape(location[0])}" source_line={location[1]}')
        return _SOURCE.sub("", block)[:-1] + sources[op_name] + "}"

    return METADATA.sub(current, hlo_text)


def _escape(text: str) -> str:  # as the HLO printer escapes strings
    return text.replace("\\", "\\\\").replace('"', '\\"')


def fallbacks_from(entry: RewriteEntry, graph: tf.Graph, lazy: bool = False
                   ) -> list[FallbackNode]:
    """The entry's nodes left to TF, their source lines looked up in `graph` (KeyError
    or ValueError for a name `graph` lacks); with `lazy`, when each is first read."""
    from tfxla_lite.clustering.mark import format_source

    nodes: list[FallbackNode] = []
    for name, op_type, reason in entry.fallbacks:
        operation = graph.get_operation_by_name(name)
        nodes.append(_TraceFallbackNode(name, op_type, reason, operation=operation) if lazy else
                     FallbackNode(name, op_type, reason, format_source(operation)))
    return nodes


def report_from(entry: RewriteEntry, function_name: str, jit_compile: bool | None,
                graph: tf.Graph) -> ClusteringReport:
    """The entry's clustering report, its source lines looked up in `graph` when read."""
    return ClusteringReport(function_name, jit_compile, list(entry.report_clusters),
                            fallbacks_from(entry, graph, lazy=True))


class _TraceFallbackNode(FallbackNode):
    """A node of a rewrite cache hit's report whose source line is looked up in the trace
    when first read: a warm start reads none (a Keras training step leaves its variable
    plumbing to TF, and finding the user's frame of each of the MLP step's 28 such nodes
    in TF's tracebacks took 1.5-1.7 ms of CPU), while a report printed, shown or compared reads the
    same line as an eager lookup. Equal to, hashed and printed as the `FallbackNode` of
    the same fields."""

    def __init__(self, op_name: str, op_type: str, reason: str, source: str | None = None,
                 operation: Any = None) -> None:  # `source` as the dataclass's (`replace`)
        super().__init__(op_name, op_type, reason, source)
        if operation is not None:
            self.__dict__["_operation"] = operation

    @property  # type: ignore[override]
    def source(self) -> str | None:
        operation = self.__dict__.get("_operation")
        if operation is not None:
            from tfxla_lite.clustering.mark import format_source

            # The line is set before the operation goes: a reader on another thread finds
            # one or the other.
            self.__dict__["_source"] = format_source(operation)
            self.__dict__.pop("_operation", None)
        return self.__dict__["_source"]

    @source.setter
    def source(self, value: str | None) -> None:  # the dataclass's __init__
        self.__dict__["_source"] = value

    def _fields(self) -> tuple[Any, ...]:
        return self.op_name, self.op_type, self.reason, self.source

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FallbackNode):
            return NotImplemented
        return self._fields() == (other.op_name, other.op_type, other.reason, other.source)

    def __hash__(self) -> int:
        return hash(self._fields())  # as the frozen dataclass hashes its fields

    def __repr__(self) -> str:
        return repr(FallbackNode(*self._fields()))
