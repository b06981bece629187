"""`TFXLA_LITE_FLAGS`: the environment flags, parsed once into the process's `Options`.

The flags mirror TensorFlow's `TF_XLA_FLAGS` and XLA's `XLA_FLAGS` without their
prefixes (`--tf_xla_auto_jit=2` is `--auto_jit=2`, `--xla_dump_to=DIR` is
`--dump_to=DIR`). `PROCESS_OPTIONS` is the one place the process's options live:
the defaults, then the environment (read at first use), then
`tfxla_lite.set_options(...)`; a compile switch left unset there falls back to its own
variable (`TFXLA_LITE_CACHE`, ...), read at each `switch` call. `tfxla_lite.function`
reads it when a function is made and passes the result down; nothing else keeps option
state.
This module imports no TensorFlow: the start-up hook (`tfxla_lite._startup`) uses it.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfxla_lite import options as options_module
from tfxla_lite.options import Options, OptionsError

ENVIRONMENT_VARIABLE = "TFXLA_LITE_FLAGS"

logger = logging.getLogger("tfxla_lite")


class FlagError(OptionsError):
    """A flag in `TFXLA_LITE_FLAGS` that is unknown, malformed or out of range."""


_TRUE = ("true", "1")
_FALSE = ("false", "0")


def _integer(text: str) -> int:
    return int(text)


def _boolean(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("expected true, false, 1 or 0")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError("expected a comma-separated list of names")
    return names


def _text(text: str) -> str:
    if not text:
        raise ValueError("expected a value")
    return text


def _lowered(text: str) -> str:
    """A keyword value (a level, a runtime, a mode), matched case-insensitively."""
    return _text(text).lower()


@dataclass(frozen=True)
class Flag:
    name: str
    value_name: str  # how the help spells the value; "" for a bool flag
    convert: Callable[[str], Any]
    help: str
    option: str = ""  # the Options field; the flag's name when empty

    @property
    def field(self) -> str:
        return self.option or self.name

    @property
    def is_bool(self) -> bool:
        return self.convert is _boolean


FLAGS: dict[str, Flag] = {flag.name: flag for flag in (
    Flag("auto_jit", "N", _integer,
         "1 or 2: auto-cluster every tf.function of the process (TF's --tf_xla_auto_jit); "
         "0 or -1: off"),
    Flag("min_cluster_size", "N", _integer,
         "smallest cluster compiled in auto mode, in ops (default 4)"),
    Flag("max_cluster_size", "N", _integer, "largest cluster, in ops (default: no limit)"),
    Flag("merge_independent_clusters", "", _boolean,
         "clusters no path joins run as one launch op (default true)"),
    Flag("ops_to_cluster", "OP,OP,...", lambda text: frozenset(_names(text)),
         "only these TF op types may join a cluster, e.g. AddV2,MatMul"),
    Flag("clustering_debug", "", _boolean, "log every clustering decision at INFO"),
    Flag("dump_to", "DIR", _text,
         "write XLA-style dumps and report.html into DIR ('-': HLO to stdout)"),
    Flag("dump_hlo_as_text", "", _boolean,
         "dump HLO as text (the default format; alone: HLO to stdout)"),
    Flag("disable_passes", "PASS,PASS,...", _names,
         "take these passes out of the pipeline, e.g. fuse,cse"),
    Flag("verify", "", _boolean, "run the HLO verifier after every pass"),
    Flag("strict_jit_compile", "", _boolean,
         "tf.function(jit_compile=True) raises when tfxla-lite cannot compile it, "
         "instead of falling back to TF's XLA (or auto-clustering) with a warning"),
    Flag("compile_convolutions", "", _boolean,
         "compile every Conv2D/Conv3D/DepthwiseConv2dNative and their gradients (default "
         "false: auto-clustering leaves those oneDNN runs faster for their shape in TF, "
         "rules_conv_cost.py; must-compile compiles every one)"),
    Flag("log_level", "LEVEL", _lowered,
         "level of the 'tfxla_lite' logger: debug, info, warning or error"),
    Flag("pause_collector", "", _boolean,
         "pause Python's garbage collector while a signature compiles (default true)"),
    Flag("parallel_runtime", "RUNTIME", _lowered,
         "what big kernels' parallel parts run on: tf (TF's intra-op pool, the default), "
         "tf_team (the pool, helpers that stay for a launch), openmp (libgomp) or serial"),
    Flag("prefer_vector_width", "auto|256|512", _lowered,
         "the vector width LLVM's vectorizers prefer on AVX-512 CPUs: auto (512 where "
         "measured faster, else the CPU's own tuning), 256 or 512; process-wide"),
    Flag("output_pool_mb", "MB", _integer,
         "cap on the idle output blocks the launch op keeps mapped (default 1024; 0: off)"),
    Flag("cache", "on|memory|off", _lowered,
         "the compile caches: on (process and disk), memory (process only) or off "
         "(default: TFXLA_LITE_CACHE, else on)"),
    Flag("tiered_llvm", "", _boolean,
         "a cache miss runs quick code until its O3 code is ready "
         "(default: TFXLA_LITE_TIERED, else true)"),
    Flag("overlap_llvm", "", _boolean,
         "compile a trace's clusters' LLVM on a background thread "
         "(default: TFXLA_LITE_OVERLAP_LLVM=1, else false)"),
    Flag("autograph_cache", "", _boolean,
         "keep AutoGraph's conversions on disk (default: TFXLA_LITE_AUTOGRAPH_CACHE, else true)"),
    Flag("background_nice", "N", _integer,
         "nice increment of the background compile thread (default: "
         "TFXLA_LITE_BACKGROUND_NICE, else 10)"),
    Flag("cublaslt_epilogues", "", _boolean,
         "fuse dot epilogues into cuBLASLt on the GPU (default: TFXLA_LITE_CUBLASLT, else true)"),
    Flag("check_numerics", "off|compare|raise", _lowered,
         "compare every launch with its cluster's TF ops (numerics_report()); raise: fail "
         "on NaN/Inf only compiled code makes (default off)"),
)}


_OFF = frozenset({"0", "off", "false", "no", "none"})


def _on_unless_off(text: str) -> bool:
    return text.strip().lower() not in _OFF


def _cache_setting(text: str) -> str:
    value = text.strip().lower()
    return "off" if value in _OFF else "memory" if value == "memory" else "on"


def _nice(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{SWITCH_VARIABLES['background_nice']} must be an integer, "
                         f"got {text!r}") from None


# The compile switches' own environment variables: Options field -> (variable, reading).
# Below `TFXLA_LITE_FLAGS` and `set_options`, read at each `switch` call.
_SWITCH_READINGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "cache": ("TFXLA_LITE_CACHE", _cache_setting),
    "tiered_llvm": ("TFXLA_LITE_TIERED", _on_unless_off),
    "overlap_llvm": ("TFXLA_LITE_OVERLAP_LLVM", lambda text: text == "1"),
    "autograph_cache": ("TFXLA_LITE_AUTOGRAPH_CACHE", _on_unless_off),
    "background_nice": ("TFXLA_LITE_BACKGROUND_NICE", _nice),
    "cublaslt_epilogues": ("TFXLA_LITE_CUBLASLT", _on_unless_off),
}
SWITCH_VARIABLES = {name: variable for name, (variable, _) in _SWITCH_READINGS.items()}


def switch(name: str, options: Options | None = None) -> Any:
    """Compile switch `name` (a key of `options.SWITCH_DEFAULTS`): `options`' own value
    when set, else the process's (`TFXLA_LITE_FLAGS`, `set_options`), else its variable's
    (read now, so that a benchmark may switch it between two compiles), else the default."""
    for source in (options, get_options()):
        value = getattr(source, name, None)
        if value is not None:
            return value
    variable, read = _SWITCH_READINGS[name]
    text = os.environ.get(variable)
    return options_module.SWITCH_DEFAULTS[name] if text is None else read(text)


def flags_help() -> str:
    """One line per flag, for error messages and `python -m tfxla_lite run --help`."""
    lines = []
    for flag in FLAGS.values():
        spelled = f"--{flag.name}" + ("=[true|false]" if flag.is_bool else
                                      f"={flag.value_name}")
        lines.append(f"  {spelled:<34} {flag.help}")
    return "\n".join(lines)


def _error(message: str) -> FlagError:
    return FlagError(f"{ENVIRONMENT_VARIABLE}: {message}\nvalid flags:\n{flags_help()}")


def parse_flags(text: str) -> dict[str, Any]:
    """The option changes that `text` (e.g. "--auto_jit=2 --verify") asks for.

    Bool flags take `--x`, `--x=true|false|1|0`; a repeated flag keeps its last
    value. Raises `FlagError`, listing the valid flags, on an unknown or malformed
    flag, and on values `Options` refuses.
    """
    try:
        tokens = shlex.split(text)
    except ValueError as error:
        raise _error(f"cannot split {text!r}: {error}") from None
    changes: dict[str, Any] = {}
    for token in tokens:
        if not token.startswith("--") or token == "--":
            raise _error(f"{token!r} is not a flag (flags look like --name=value)")
        name, has_value, value = token[2:].partition("=")
        flag = FLAGS.get(name)
        if flag is None:
            raise _error(f"unknown flag --{name}")
        if not has_value:
            if not flag.is_bool:
                raise _error(f"--{name} needs a value: --{name}={flag.value_name}")
            value = "true"
        try:
            changes[flag.field] = flag.convert(value)
        except ValueError as error:
            raise _error(f"bad value {value!r} for --{name}: {error}") from None
    try:
        Options(**changes)
    except OptionsError as error:
        raise _error(str(error)) from None
    return changes


class OptionsHolder:
    """The process's options: defaults, then the environment, then `set_options`.

    The environment is parsed at the first `get()` and kept. `get()` builds the
    `Options` from `options.DEFAULT_OPTIONS` each time, so a test that replaces
    the defaults sees its own.
    """

    def __init__(self, variable: str = ENVIRONMENT_VARIABLE) -> None:
        self.variable = variable
        self._environment: dict[str, Any] | None = None
        self._changes: dict[str, Any] = {}
        self._announced = False

    def environment_changes(self) -> dict[str, Any]:
        if self._environment is None:
            self._environment = parse_flags(os.environ.get(self.variable, ""))
        return self._environment

    def get(self) -> Options:
        options = options_module.DEFAULT_OPTIONS.with_changes(
            **{**self.environment_changes(), **self._changes})
        if not self._announced:
            self._announced = True
            self._apply(options)
        return options

    def set(self, **changes: Any) -> Options:
        options = self.get().with_changes(**changes)  # validates before anything is kept
        self._changes.update(changes)
        self._apply(options)
        return options

    def _apply(self, options: Options) -> None:
        """What options do outside the compiler: the logger's level, the parallel runtime,
        the output pool."""
        configure_logging(options)
        configure_parallel_runtime(options)
        configure_output_pool(options)

    def reset(self) -> None:
        """Forget the environment and `set_options`: the next `get()` reads both anew."""
        self._environment = None
        self._changes = {}
        self._announced = False


PROCESS_OPTIONS = OptionsHolder()


def get_options() -> Options:
    """The process's current options (see `OptionsHolder`)."""
    return PROCESS_OPTIONS.get()


def set_options(**changes: Any) -> Options:
    """Change the process's options, e.g. `set_options(min_cluster_size=1, verify=True)`.

    Checked like the flags (`OptionsError`, a `ValueError`, on a bad name or value);
    applies to functions made afterwards. Returns the new options.
    """
    return PROCESS_OPTIONS.set(**changes)


def configure_parallel_runtime(options: Options) -> None:
    """Hand `parallel_runtime` to the op library when it is loaded; a library loaded
    later reads the process's options itself (`tfxla_lite.runtime.loader`). Imports no
    TensorFlow: without the loader there is nothing to configure."""
    loader = sys.modules.get("tfxla_lite.runtime.loader")
    if loader is not None:
        loader.apply_parallel_runtime(options.parallel_runtime)


def configure_output_pool(options: Options) -> None:
    """Hand `output_pool_mb` to the op library when it is loaded (as
    `configure_parallel_runtime` does; a library loaded later reads it itself)."""
    loader = sys.modules.get("tfxla_lite.runtime.loader")
    if loader is not None:
        loader.apply_output_pool(options.output_pool_mb)


_LOG_HANDLER_NAME = "tfxla_lite.flags"


def configure_logging(options: Options) -> None:
    """Set the "tfxla_lite" logger's level; give it a stderr handler when nothing would
    print its records (no handler on it or on the root logger)."""
    level = options.logging_level
    if level is None:
        return
    package_logger = logging.getLogger("tfxla_lite")
    package_logger.setLevel(level)
    if package_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_LOG_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger.addHandler(handler)
