"""Compiler options: one frozen object, made once and passed down (docs/conventions.md, habit 10).

`Options` is what `tfxla_lite.function` hands to the compiler for every trace.
Its values come from the dataclass defaults, then `TFXLA_LITE_FLAGS` (parsed
once, `tfxla_lite.flags`), then `tfxla_lite.set_options(...)`; a
`Function(options=...)` overrides all three. Every value is checked when the
object is made, so a bad option fails where it was given, never deep in a trace.
This module imports no TensorFlow: the start-up hook reads it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace

LOG_LEVELS = ("debug", "info", "warning", "error")
# What the parallel parts of kernels launched by TF run on (`parallel_runtime`).
PARALLEL_RUNTIMES = ("tf", "openmp", "serial", "tf_team")
# What `cache` may be (`tfxla_lite.codegen.cache.policy`).
CACHE_SETTINGS = ("on", "memory", "off")
# What `prefer_vector_width` may be (`tfxla_lite.codegen.cpu.engine.vector_width`).
VECTOR_WIDTHS = ("auto", "256", "512")
# What `check_numerics` may be (`tfxla_lite.numerics_check`).
CHECK_NUMERICS_MODES = ("off", "compare", "raise")
# The compile switches' defaults: where neither the options, the process's options nor
# the switch's variable set one (`flags.switch`).
SWITCH_DEFAULTS = {"cache": "on", "tiered_llvm": True, "overlap_llvm": False,
                   "autograph_cache": True, "background_nice": 10, "cublaslt_epilogues": True}


class OptionsError(ValueError):
    """An option with a wrong name, type or value."""


@dataclass(frozen=True)
class Options:
    """How `tfxla_lite.function` clusters and compiles: every switch of tfxla-lite. Each
    field but the two commented below is a flag (`tfxla_lite/flags.py`); what it means,
    its default and its environment variable: docs/flags.md's table
    (tests/flags/test_flag_docs.py keeps a row per flag). The compile switches
    (`SWITCH_DEFAULTS`) default to None: the process's value then decides
    (`flags.switch`); docs/architecture.md, "Switches".
    """

    min_cluster_size: int = 4  # auto mode; must-compile uses 1
    max_cluster_size: int | None = None
    merge_independent_clusters: bool = True
    # The pass pipeline as text (`passes/pipeline.py`); None: the default one.
    pipeline: str | None = None
    verify: bool = False
    auto_jit: int = 0
    ops_to_cluster: frozenset[str] | None = None
    clustering_debug: bool = False
    dump_to: str | None = None
    dump_hlo_as_text: bool = False
    disable_passes: tuple[str, ...] = ()
    strict_jit_compile: bool = False
    compile_convolutions: bool = False
    # While/If/Case ops join clusters whole as HLO control flow; False: their bodies compile.
    hlo_control_flow: bool = True
    log_level: str | None = None
    pause_collector: bool = True
    parallel_runtime: str = "tf"  # "tf", "tf_team", "openmp" or "serial", process-wide
    output_pool_mb: int = 1024
    cache: str | None = None
    tiered_llvm: bool | None = None
    overlap_llvm: bool | None = None
    autograph_cache: bool | None = None
    background_nice: int | None = None
    cublaslt_epilogues: bool | None = None
    check_numerics: str = "off"  # "compare" or "raise": docs/numerics_check.md
    prefer_vector_width: str = "auto"  # process-wide, read when a cluster compiles

    def __post_init__(self) -> None:
        _check_int("min_cluster_size", self.min_cluster_size, minimum=1)
        if self.max_cluster_size is not None:
            _check_int("max_cluster_size", self.max_cluster_size, minimum=1)
            if self.max_cluster_size < self.min_cluster_size:
                raise OptionsError(f"max_cluster_size ({self.max_cluster_size}) is smaller "
                                   f"than min_cluster_size ({self.min_cluster_size})")
        _check_int("auto_jit", self.auto_jit, minimum=-1)
        _check_int("output_pool_mb", self.output_pool_mb, minimum=0)
        if self.output_pool_mb >= 1 << 43:  # in bytes, an int64
            raise OptionsError(f"output_pool_mb is too large: {self.output_pool_mb}")
        if self.auto_jit > 2:
            raise OptionsError(f"auto_jit must be -1, 0, 1 or 2, got {self.auto_jit}")
        for name in ("verify", "clustering_debug", "dump_hlo_as_text", "strict_jit_compile",
                     "pause_collector", "compile_convolutions", "hlo_control_flow"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.ops_to_cluster is not None:
            if isinstance(self.ops_to_cluster, str) or not all(
                    isinstance(op, str) and op.isidentifier() for op in self.ops_to_cluster):
                raise OptionsError("ops_to_cluster must be a set of TF op type names, got "
                                   f"{self.ops_to_cluster!r}")
            if not self.ops_to_cluster:
                raise OptionsError("ops_to_cluster is empty: nothing could be clustered")
            object.__setattr__(self, "ops_to_cluster", frozenset(self.ops_to_cluster))
        if self.dump_to is not None and (not isinstance(self.dump_to, str) or not self.dump_to):
            raise OptionsError(f"dump_to must be a directory path, got {self.dump_to!r}")
        if self.log_level is not None and self.log_level not in LOG_LEVELS:
            raise OptionsError(f"log_level must be one of {', '.join(LOG_LEVELS)}, "
                               f"got {self.log_level!r}")
        for name in ("tiered_llvm", "overlap_llvm", "autograph_cache", "cublaslt_epilogues"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name} must be a bool or None, got {getattr(self, name)!r}")
        if self.background_nice is not None:
            _check_int("background_nice", self.background_nice, minimum=-20)
        if self.cache is not None and self.cache not in CACHE_SETTINGS:
            raise OptionsError(f"cache must be one of {', '.join(CACHE_SETTINGS)} or None, "
                               f"got {self.cache!r}")
        if self.check_numerics not in CHECK_NUMERICS_MODES:
            raise OptionsError(f"check_numerics must be one of {', '.join(CHECK_NUMERICS_MODES)}"
                               f", got {self.check_numerics!r}")
        if self.prefer_vector_width not in VECTOR_WIDTHS:
            raise OptionsError(f"prefer_vector_width must be one of {', '.join(VECTOR_WIDTHS)}"
                               f", got {self.prefer_vector_width!r}")
        if self.parallel_runtime not in PARALLEL_RUNTIMES:
            raise OptionsError(f"parallel_runtime must be one of {', '.join(PARALLEL_RUNTIMES)}, "
                               f"got {self.parallel_runtime!r}")
        if self.pipeline is not None:
            _check_pass_names("pipeline", _split(self.pipeline))
        if isinstance(self.disable_passes, str):
            raise OptionsError("disable_passes must be a sequence of pass names, got a string")
        object.__setattr__(self, "disable_passes", tuple(self.disable_passes))
        _check_pass_names("disable_passes", self.disable_passes)

    def with_changes(self, **changes: object) -> Options:
        unknown = sorted(set(changes) - set(option_names()))
        if unknown:
            raise OptionsError(f"unknown option(s) {', '.join(unknown)}; options are "
                               f"{', '.join(option_names())}")
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def effective_pipeline(self) -> str:
        """The pipeline text the compiler runs: `pipeline` (or the default) less
        `disable_passes`. With every pass disabled it is "," (no passes), because an
        empty text means "the default pipeline" to `compile_module`."""
        from tfxla_lite.passes.pipeline import DEFAULT_PIPELINE

        names = _split(self.pipeline if self.pipeline is not None else DEFAULT_PIPELINE)
        kept = [name for name in names if name not in self.disable_passes]
        return ",".join(kept) or ","

    @property
    def logging_level(self) -> int | None:
        """The `logging` level for the "tfxla_lite" logger (clustering_debug: INFO at most)."""
        level = getattr(logging, self.log_level.upper()) if self.log_level else None
        if self.clustering_debug:
            level = min(level, logging.INFO) if level is not None else logging.INFO
        return level


def option_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Options))


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise OptionsError(f"{name} must be at least {minimum}, got {value}")


def _check_pass_names(option: str, names: list[str] | tuple[str, ...]) -> None:
    # Every pass may be disabled: codegen compiles an unfused op as a kernel of its own
    # and copies outputs that alias parameters itself (checked in tests/flags).
    if not names:
        return  # nothing to check: keeps the start-up path free of NumPy
    from tfxla_lite.passes.pipeline import PASSES

    unknown = [name for name in names if not isinstance(name, str) or name not in PASSES]
    if unknown:
        raise OptionsError(f"{option}: unknown pass(es) {', '.join(map(str, unknown))}; "
                           f"passes are {', '.join(sorted(PASSES))}")


DEFAULT_OPTIONS = Options()
