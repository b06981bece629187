"""Background LLVM work of the CPU backend: the thread it runs on, the tiered compile, exit.

Where it sits: `cpu.compile` hands LLVM's work on a compile-cache miss to a background
thread in two ways. `background=True` (`TFXLA_LITE_OVERLAP_LLVM`) gives a
`PendingExecutable` that waits for the O3 code when read. `tiered=True`
(`TFXLA_LITE_TIERED`) compiles the emitted IR at once with a cheap LLVM, the *quick
tier* (the O1 pipeline and code generation at level 0, 20-35% less LLVM time for
kernels 1.1-2.8x slower: docs/benchmarks.md, "What a cheaper LLVM level would give a
cold first call"), and the O3 compile of the same IR in the background; once that is
done the executable runs the O3 code. Only O3 code reaches the kernel caches, so a
warm process never loads quick code. Register-blocked dots' block functions and the
packed GEMM's are compiled at O3 even in the quick tier, in a part of their own
(`O3_EVEN_WHEN_QUICK`). The O3 compile is a job of the background executor
(`codegen/background.py`).

The swap. The quick tier's object holds, beside the module, a trampoline that is the
executable's entry (the address the launch op and `Executable.__call__` call) and a
slot, a pointer that starts null::

    entry_tiered(params, outputs, temp):
        next = load atomic acquire slot
        if next == null: entry(params, outputs, temp)   # the quick code
        else:            next(params, outputs, temp)    # the O3 code

Storing the O3 entry's address in the slot (an atomic release store, by a function of
the same object) switches every later call, whoever made it and through whatever key
or specialization it was registered (the launch op's per-shape cache of a dynamic
cluster holds the address it was given, so re-registering would not reach it); a
launch already running on the quick code finishes on it. The quick engine stays alive
as long as the executable, since its trampoline is the entry (a few KB to a few tens
of KB of code per cluster); the O3 engine likewise once swapped in. The cost after the
swap is one load and one indirect call per launch.

A failure of the O3 compile after a quick success keeps the quick code, which is the
same IR compiled by the same LLVM with the same IEEE float semantics: it is logged as
a warning, counted (`cache.stats().tier_failures`) and kept in `tier_error`, and
nothing is cached. At interpreter exit, O3 compiles that have not started soon enough
are dropped (`background.EXIT_WAIT_SECONDS`; no entry written).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tfxla_lite.codegen import background
from tfxla_lite.codegen import cache as stage_cache
from tfxla_lite.codegen.cpu import engine, kernel_cache, machine_code
from tfxla_lite.codegen.executable import Executable

logger = logging.getLogger("tfxla_lite")

# The quick tier's LLVM: the IR pipeline's level and the code generator's.
QUICK_SPEED_LEVEL = 1
QUICK_CODEGEN_LEVEL = 0

# Functions (by name prefix) that the quick tier compiles at O3 all the same, in a part
# of their own (`module_split`'s `apart`), beside the rest at the quick levels: the
# register blocks of dots (`dot_blocks.py`, one noinline function per block shape) ran
# 3-7x slower at the quick tier's levels (mlp_infer_b64 1.63 against 0.42 ms; at code
# generation level 1 as fast as O3 but as costly to compile), and a training loop
# started at once paid more in slow steps until the swap than its first call saved.
# The block's callers (the tile loops) and the rest of such a module take the quick
# tier: self-attention's module costs 91 ms of LLVM at O3 and 66 at the quick levels,
# its block alone 12 at O3 (docs/benchmarks.md, "Register blocks at O3 inside the quick
# tier"). The packed GEMM's functions (`gemm_packed.py`: micro-kernel, panels, packing)
# likewise: 21 GFLOP/s at the quick levels against 102 at O3 (2048³, one thread); the
# first six 2048³ calls took 1228, 1122, 1073, 752, 317, 355 ms tiered without them
# here, 717, 381, 336, 372, 420, 376 with them, 612, 293, 320, 312, 298, 310 with tiers
# off (load 3.5). Dots by the library GEMM ran at O3's speed at the quick tier (MLP 2.33
# against 2.44 ms, the MLP step 3.16 against 3.32) and emitted small dots and
# vector-matrix products within 1.15x (batch-1 inference 0.060 against 0.054 ms).
O3_EVEN_WHEN_QUICK = ("dot_block.", "gemm_packed.")

TIER_ENTRY = "tfxla_lite.tier.entry"
TIER_SET = "tfxla_lite.tier.set"
_TIER_SLOT = "tfxla_lite.tier.slot"
_SETTER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _trampoline(entry_name: str) -> str:
    """The IR appended to the quick tier's entry part: the slot, the trampoline that
    calls the quick `entry` until the slot is set, and the slot's setter."""
    return f"""
@"{_TIER_SLOT}" = internal global ptr null, align 8

define void @"{TIER_ENTRY}"(ptr %params, ptr %outputs, ptr %temp) nounwind {{
start:
  %next = load atomic ptr, ptr @"{_TIER_SLOT}" acquire, align 8
  %quick = icmp eq ptr %next, null
  br i1 %quick, label %run_quick, label %run_next
run_quick:
  call void @"{entry_name}"(ptr %params, ptr %outputs, ptr %temp) noinline
  ret void
run_next:
  call void %next(ptr %params, ptr %outputs, ptr %temp)
  ret void
}}

define void @"{TIER_SET}"(ptr %next) nounwind {{
start:
  store atomic ptr %next, ptr @"{_TIER_SLOT}" release, align 8
  ret void
}}
"""


@dataclass(frozen=True)
class QuickCode:
    """The quick tier's machine code: its engine, the trampoline (the executable's entry)
    and the slot's setter, and its parts' optimized bitcode (shown only if O3 fails)."""

    engine: Any
    entry_address: int
    setter_address: int
    bitcode: tuple[bytes, ...]
    internal: frozenset[str]


def o3_even_when_quick(names: Iterable[str]) -> list[str]:
    """The functions among `names` that the quick tier compiles at O3 (`O3_EVEN_WHEN_QUICK`)."""
    return [name for name in names if name.startswith(O3_EVEN_WHEN_QUICK)]


def quick_code(parts: list[str], entry_name: str, internal: frozenset[str],
               o3_last: bool = False) -> QuickCode:
    """Compile a module's emitted `parts` at the quick tier's levels, with the trampoline
    added to the part that defines `entry_name`, and load them into one engine.
    `o3_last`: the last part (the functions `o3_even_when_quick` set apart) is compiled
    at O3 on a thread of its own, beside the others."""
    parts = list(parts)
    marker = f'define void @"{entry_name}"('
    owner = next((n for n, text in enumerate(parts) if marker in text), None)
    if owner is None or (o3_last and owner == len(parts) - 1):
        raise RuntimeError(f"tiered compile: no quick part defines {entry_name!r}")
    parts[owner] += _trampoline(entry_name)
    if o3_last:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            o3 = pool.submit(engine.compile_parts, parts[-1:])
            quick = engine.compile_parts(parts[:-1], QUICK_SPEED_LEVEL, QUICK_CODEGEN_LEVEL)
            compiled = engine.CompiledParts(quick.objects + o3.result().objects,
                                            quick.bitcode + o3.result().bitcode)
    else:
        compiled = engine.compile_parts(parts, QUICK_SPEED_LEVEL, QUICK_CODEGEN_LEVEL)
    llvm_engine = engine.load_objects(compiled.objects)
    entry = llvm_engine.get_function_address(TIER_ENTRY)
    setter = llvm_engine.get_function_address(TIER_SET)
    if not entry or not setter:
        raise RuntimeError("tiered compile: the quick object lacks its trampoline")
    stage_cache.count("quick_compilations")
    return QuickCode(llvm_engine, entry, setter, compiled.bitcode, internal)


class TieredExecutable(Executable):
    """An `Executable` that runs quick-tier code until its O3 code, compiled in the
    background, is swapped in (see the module docstring). `tier` says which runs:
    "quick", then "o3". `entry_address` and `engine` are the quick tier's trampoline and
    engine throughout (the trampoline forwards to the O3 code); `llvm_ir_optimized`
    waits for the O3 compile and shows its module (the quick tier's, under a comment
    saying so, when O3 failed). `wait()` waits for the O3 compile and never raises its
    error (`tier_error`)."""

    def __init__(self, *args: Any, quick: QuickCode, **kwargs: Any) -> None:
        self.__dict__.update(_quick=quick, _tier="quick", _o3=None, _tier_error=None)
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def llvm_ir_optimized(self) -> str:
        self.wait()
        code = self.__dict__["_o3"]
        if code is not None:
            text = code.llvm_ir_optimized
            return text if isinstance(text, str) else text()
        quick = self.__dict__["_quick"]
        return (f"; tfxla-lite: the O3 compile failed ({self.tier_error}); this is the "
                "quick tier's code\n" + engine.linked_text(quick.bitcode, quick.internal))

    @llvm_ir_optimized.setter
    def llvm_ir_optimized(self, value: Any) -> None:
        pass  # always the O3 code's (or the quick tier's)

    @property
    def tier(self) -> str:
        return self.__dict__["_tier"]

    @property
    def tier_error(self) -> BaseException | None:
        """The O3 compile's error, when it failed (the quick code keeps running)."""
        return self.__dict__["_tier_error"]

    def start(self, job: concurrent.futures.Future) -> None:
        """Take the background O3 compile's future (`o3_job`)."""
        self.__dict__["_job"] = job
        job.add_done_callback(self._finished)

    def swap(self, code: kernel_cache.CompiledCode) -> None:
        """Run `code` (the O3 compile's) from now on."""
        self.__dict__["_o3"] = code  # held as long as the executable: launches call it
        _SETTER(self.__dict__["_quick"].setter_address)(code.entry_address)
        self.__dict__["_tier"] = "o3"
        stage_cache.count("tier_swaps")

    def _finished(self, job: concurrent.futures.Future) -> None:
        error = (job.exception() if not job.cancelled()
                 else background.AbandonedCompile("cancelled"))
        if error is None:
            return
        self.__dict__["_tier_error"] = error
        if isinstance(error, background.AbandonedCompile):
            stage_cache.count("tier_abandoned")
            return
        stage_cache.count("tier_failures")
        logger.warning("tfxla-lite: the O3 compile of %s failed, its quick-tier code keeps "
                       "running: %s: %s", self.module_name, type(error).__name__, error)

    @property
    def module_name(self) -> str:
        module = self.__dict__.get("module")
        return getattr(module, "name", "a module")


def o3_tier(executable: TieredExecutable, emitted: Any, key: str, signature: dict[str, Any],
            caches: stage_cache.CachePolicy) -> kernel_cache.CompiledCode:
    """The background half of a tiered compile: O3 machine code on one thread, the kernel
    caches' writes, then the swap."""
    code = machine_code.o3_machine_code(emitted, threads=1)
    kernel_cache.store(key, signature, code, caches)
    executable.swap(code)
    return code
