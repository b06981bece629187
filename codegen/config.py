"""The compiler core's environment switches: the one module under `codegen/` that reads
`os.environ` (tests/codegen/test_config.py fails on a read anywhere else).

Where it sits: below the rest of `codegen/`, imported by the modules a switch concerns
(`cache`, `cpu.tiers`, `cpu.parallel`, `gpu.lt_epilogue`) and by the front end, which
asks here only where its `Options` leave a switch unset. Every read happens at the call,
not at import: benchmarks and tests switch a variable between two compiles of one process
to compare both sides.

User-facing (each also an `Options` field and a flag; the front end passes the field
down as a parameter of `codegen.compile_module`, and the variable decides only where
the field is None or a caller of `compile_module` passes nothing):

- `TFXLA_LITE_CACHE` (`cache_setting`, `--cache`): "on" (unset or 1), "memory" (the
  process only) or "off" (0, off, false, no, none) for the compile caches.
- `TFXLA_LITE_TIERED` (`tiered_llvm`, `--tiered_llvm`): tiered LLVM compiles, on unless
  switched off.
- `TFXLA_LITE_OVERLAP_LLVM` (`overlap_llvm`, `--overlap_llvm`): LLVM on a background
  thread, on only when it is 1.
- `TFXLA_LITE_AUTOGRAPH_CACHE` (`switched_off`): the AutoGraph cache alone, on unless
  switched off.

Developer and benchmark knobs (environment only):

- `TFXLA_LITE_BACKGROUND_NICE` (`background_nice`): the nice increment of the background
  compile thread, for A/B runs of its priority.
- `TFXLA_LITE_CUBLASLT` (`cublaslt_epilogues`): cuBLASLt's fused dot epilogues on the GPU,
  on unless switched off, so that a GPU run can time both paths.

`default_gomp_spin_count` is the one write: libgomp reads its spin policy only from the
environment, once, when it loads, and has no call to set it later.
"""

from __future__ import annotations

import os

CACHE = "TFXLA_LITE_CACHE"
TIERED = "TFXLA_LITE_TIERED"
OVERLAP_LLVM = "TFXLA_LITE_OVERLAP_LLVM"
AUTOGRAPH_CACHE = "TFXLA_LITE_AUTOGRAPH_CACHE"
BACKGROUND_NICE = "TFXLA_LITE_BACKGROUND_NICE"
CUBLASLT = "TFXLA_LITE_CUBLASLT"

CACHE_SETTINGS = ("on", "memory", "off")
OFF = frozenset({"0", "off", "false", "no", "none"})
# libgomp's idle threads spin this many iterations (tens of microseconds), then sleep:
# an executable's kernels run back to back, and a team idle between launches leaves
# the cores to TF's threads soon (docs/architecture.md, "Switches").
GOMP_SPIN_COUNT = "20000"


def switched_off(variable: str) -> bool:
    """Whether `variable` turns its switch off (0, off, false, no or none; unset: on)."""
    return os.environ.get(variable, "1").strip().lower() in OFF


def cache_setting() -> str:
    """The compile caches `TFXLA_LITE_CACHE` asks for: "on", "memory" or "off"."""
    value = os.environ.get(CACHE, "1").strip().lower()
    if value in OFF:
        return "off"
    return "memory" if value == "memory" else "on"


def tiered_llvm() -> bool:
    """Whether `TFXLA_LITE_TIERED` leaves tiered compiles on (`codegen/cpu/tiers.py`)."""
    return not switched_off(TIERED)


def overlap_llvm() -> bool:
    """Whether `TFXLA_LITE_OVERLAP_LLVM` is 1: LLVM's work on a background thread."""
    return os.environ.get(OVERLAP_LLVM, "0") == "1"


def background_nice(default: int) -> int:
    """The background compile thread's nice increment: `TFXLA_LITE_BACKGROUND_NICE`, else
    `default`. A value that is no integer raises ValueError naming the variable."""
    text = os.environ.get(BACKGROUND_NICE)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{BACKGROUND_NICE} must be an integer, got {text!r}") from None


def cublaslt_epilogues() -> bool:
    """Whether `TFXLA_LITE_CUBLASLT` leaves cuBLASLt epilogues on (unset: on)."""
    return not switched_off(CUBLASLT)


def default_gomp_spin_count() -> None:
    """Set `GOMP_SPINCOUNT` for libgomp before it loads, unless the user chose a wait
    policy (`OMP_WAIT_POLICY` or `GOMP_SPINCOUNT`). libgomp reads both from the process
    environment in its load-time constructor and exports no call that sets them later,
    so this is the only way; docs/architecture.md, "Switches", says so."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = GOMP_SPIN_COUNT
