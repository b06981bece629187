"""Code that runs now, better code later: the CPU backend's background compiles.

On a kernel-cache miss `cpu.compile` may hand LLVM's O3 work to the background thread
(`codegen/background.py`) and return a `BackgroundExecutable` at once. A tiered compile
(`tiered=True`) first compiles the IR with a cheap LLVM (the *quick tier*) and runs that
code until the O3 code is swapped in through a trampoline in the quick object; an
overlapped compile (`background=True`) has no quick code, and readers of its code wait.
Only O3 code reaches the kernel caches. Design: docs/architecture.md, "Tiered compiles";
measurements: docs/benchmarks.md, "A tiered LLVM compile".
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tfxla_lite.codegen import background
from tfxla_lite.codegen import cache as stage_cache
from tfxla_lite.codegen.cpu import engine, kernel_cache
from tfxla_lite.codegen.executable import ENTRY_SIGNATURE, Executable, Prepared

logger = logging.getLogger("tfxla_lite")

# The quick tier's LLVM: the IR pipeline's level and the code generator's.
QUICK_SPEED_LEVEL = 1
QUICK_CODEGEN_LEVEL = 0

# Functions (by name prefix) that the quick tier compiles at O3 all the same, in a part
# of their own (`module_split`'s `apart`): dots' register blocks and the packed GEMM ran
# several times slower at the quick levels, so a loop started at once lost more than the
# quick first call saved (docs/benchmarks.md, "Register blocks at O3 inside the quick tier").
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


class BackgroundExecutable(Executable):
    """An `Executable` whose O3 machine code a background job makes (`start`) and swaps in
    when done (`adopt`). With `quick` code (a tiered compile) it runs that until then, and
    keeps it if O3 fails (`tier_error`, logged). Without, reading its entry, engine or
    optimized IR, or calling it, waits for the job and raises the job's error."""

    entry_address = Prepared("_code")
    engine = Prepared("_code")
    _entry = Prepared("_code")

    def __init__(self, *args: Any, quick: QuickCode | None = None, **kwargs: Any) -> None:
        self.__dict__.update(_quick=quick, _o3=None, _job=None)
        super().__init__(*args, **kwargs)

    def __post_init__(self) -> None:
        if self.__dict__["_quick"] is not None:  # else `adopt` makes `_entry`
            super().__post_init__()

    def _code(self) -> None:
        if self.__dict__["_quick"] is None:
            self.wait()

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
        quick = self.__dict__["_quick"] is not None
        return "quick" if quick and self.__dict__["_o3"] is None else "o3"

    @property
    def ready(self) -> bool:
        return self.__dict__["_quick"] is not None or self.job.done()

    @property
    def job(self) -> concurrent.futures.Future:
        """The background compile (`start`)."""
        return self.__dict__["_job"]

    @property
    def tier_error(self) -> BaseException | None:
        """The background compile's error, once it failed."""
        job = self.job
        if not job.done():
            return None
        return background.AbandonedCompile("cancelled") if job.cancelled() else job.exception()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background compile (at most `timeout` seconds; whether it is over).
        Without quick code, its error is raised here."""
        if not background.wait_for_compiles(timeout, [self.job]):
            return False
        error = self.tier_error
        if error is not None and self.__dict__["_quick"] is None:
            raise error
        return True

    def start(self, make_code: Callable[[], kernel_cache.CompiledCode],
              job_key: tuple[str, str] | None) -> None:
        """Submit `make_code` (O3 code, stored in the kernel caches) as the background job
        (keyed by `job_key`: a second compile of the module waits for it), then `adopt`
        its code. A tiered compile's job is dropped if it would start at exit."""
        tiered = self.__dict__["_quick"] is not None
        job = background.submit(self._finish, make_code, key=job_key, droppable=tiered)
        self.__dict__["_job"] = job
        job.add_done_callback(self._report)

    def _finish(self, make_code: Callable[[], kernel_cache.CompiledCode]
                ) -> kernel_cache.CompiledCode:
        code = make_code()
        self.adopt(code)
        return code

    def adopt(self, code: kernel_cache.CompiledCode) -> None:
        """Run `code` from now on (launches already running finish on the quick code)."""
        self.__dict__["_o3"] = code  # held as long as the executable: launches call it
        quick = self.__dict__["_quick"]
        if quick is None:
            self.__dict__.update(_entry_address=code.entry_address, _engine=code.engine)
            self.__dict__["__entry"] = ENTRY_SIGNATURE(code.entry_address)
            return
        _SETTER(quick.setter_address)(code.entry_address)
        stage_cache.count("tier_swaps")

    def _report(self, job: concurrent.futures.Future) -> None:
        error = self.tier_error
        if error is None or self.__dict__["_quick"] is None:
            return  # without quick code, every reader gets the error
        if isinstance(error, background.AbandonedCompile):
            stage_cache.count("tier_abandoned")
            return
        stage_cache.count("tier_failures")
        name = getattr(self.__dict__.get("module"), "name", "a module")
        logger.warning("tfxla-lite: the O3 compile of %s failed, its quick-tier code keeps "
                       "running: %s: %s", name, type(error).__name__, error)
