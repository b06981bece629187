"""Parallel kernels: a kernel's outermost range split into parts run on several threads.

`compiler.py` emits each kernel as a range function over part of its outermost loop and
asks `emit_launch` to call it: once below `PARALLEL_MIN_WORK` elements or without
threads, else through `tfxla_lite_parallel(task, data, threads, 0)` (libgomp's
`GOMP_parallel` signature), whose task claims parts from a shared counter. The symbol is
bound at link time, to libgomp until the op library loads, then to its runtime (the
`parallel_runtime` option). Each element is computed whole by one thread with the same
code, so results never depend on the thread count. docs/architecture.md, "Parallel
kernels".
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import Any

import llvmlite.binding as llvm
from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import I32, I64, PTR, VOID, KernelContext, i64

# Elements of work (the largest array a kernel reads or writes) below which a kernel
# stays serial: a parallel region costs a few microseconds to start and join.
PARALLEL_MIN_WORK = 1 << 16

_LIBGOMP = ("libgomp.so.1", "/usr/lib/x86_64-linux-gnu/libgomp.so.1", "libgomp.dylib")
_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
# The symbol emitted code calls for a parallel region (GOMP_parallel's signature).
RUNTIME_SYMBOL = "tfxla_lite_parallel"
# libgomp's idle threads spin this many iterations (tens of microseconds), then sleep: an
# executable's kernels run back to back, and a team idle between launches leaves the
# cores to TF's threads soon (docs/architecture.md, "Switches").
GOMP_SPIN_COUNT = b"20000"
# The user's choice of libgomp's wait policy, which `_load_libgomp` leaves alone.
_WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# The address `RUNTIME_SYMBOL` is bound to when not libgomp's (`use_parallel_runtime`).
_runtime_address: int | None = None


def default_threads() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@functools.cache
def openmp_available() -> bool:
    """Load libgomp into the process (once) and bind its entry points into the JIT;
    whether that worked. Its idle threads spin `GOMP_SPIN_COUNT` (`_load_libgomp`)."""
    for name in _LIBGOMP:
        try:
            library = _load_libgomp(name)
        except OSError:
            continue
        try:
            addresses = [ctypes.cast(getattr(library, symbol), ctypes.c_void_p).value
                         for symbol in _SYMBOLS]
        except AttributeError:
            continue
        for symbol, address in zip(_SYMBOLS, addresses):
            llvm.add_symbol(symbol, address)
        if _runtime_address is None:
            llvm.add_symbol(RUNTIME_SYMBOL, addresses[0])
        return True
    return False


def _load_libgomp(name: str) -> ctypes.CDLL:
    """libgomp loaded RTLD_GLOBAL, its idle threads spinning `GOMP_SPIN_COUNT` unless the
    user chose a wait policy. libgomp reads the policy only from the C environment, in
    its load-time constructor, and has no call to set it later: the variable is put in
    the C environment for the load and taken out again, so that neither `os.environ`
    nor a process started later sees it."""
    chosen = any(variable in os.environ for variable in _WAIT_POLICY_VARIABLES)
    libc = ctypes.CDLL(None)
    if not chosen:
        libc.setenv(b"GOMP_SPINCOUNT", GOMP_SPIN_COUNT, 0)
    try:
        return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    finally:
        if not chosen:
            libc.unsetenv(b"GOMP_SPINCOUNT")


def use_parallel_runtime(address: int) -> None:
    """Bind `tfxla_lite_parallel` in kernels linked from now on to `address`, a function
    with GOMP_parallel's signature (the op library's, `tfxla_lite.runtime.loader`).
    Kernels linked before keep the function they were linked to."""
    global _runtime_address
    if not address:
        raise ValueError("use_parallel_runtime: the address is null")
    _runtime_address = address
    llvm.add_symbol(RUNTIME_SYMBOL, address)


def parallel_runtime_bound() -> bool:
    """Whether kernels linked now call the op library's runtime (not libgomp directly)."""
    return _runtime_address is not None


def effective_threads(threads: int | None) -> int:
    """The team size kernels ask for: `threads` (None: every CPU), 1 without libgomp."""
    count = default_threads() if threads is None else int(threads)
    if count < 1:
        raise ValueError(f"thread count must be at least 1, got {threads}")
    if count > 1 and not openmp_available():
        return 1
    return count


def _declare(module: ir.Module, name: str, signature: ir.FunctionType) -> ir.Function:
    existing = module.globals.get(name)
    if isinstance(existing, ir.Function):
        return existing
    function = ir.Function(module, signature, name=name)
    function.attributes.add("nounwind")
    return function


def emit_unit_kernel(module: ir.Module, pool: object, inst: object, name: str,
                     noalias_output: bool, new_kernel: Callable[..., Any], units: int,
                     threads: int, emit_unit: Callable[[KernelContext, ir.Value, ir.Value],
                                                       None]) -> ir.Function:
    """A kernel that runs `units` independent units of work: a range function looping
    `emit_unit(ctx, output, unit)` over [begin, end), and a launcher covering [0, units)
    on `threads` threads (`emit_launch`). `new_kernel` is the backend's kernel builder
    (`dot.NewKernel`); the launcher is the kernel the entry calls."""
    ctx, output, _ = new_kernel(module, pool, inst, name, noalias_output, [I64, I64])
    begin, end = ctx.function.args[-2:]
    begin.name, end.name = "begin", "end"
    with ctx.loop(end, name="unit", start=begin) as unit:
        emit_unit(ctx, output, unit)
    ctx.builder.ret_void()
    launcher, output, inputs = new_kernel(module, pool, inst, name + ".launch", noalias_output)
    emit_launch(launcher, ctx.function, [output, *inputs], units, threads)
    launcher.builder.ret_void()
    return launcher.function


def emit_launch(ctx: KernelContext, range_function: ir.Function, pointers: list[ir.Value],
                total: int, threads: int, align: int = 1) -> None:
    """Call `range_function(*pointers, begin, end)` so that it covers [0, total).

    With `threads` > 1 the range is cut into `_PARTS_PER_THREAD * threads` contiguous
    parts whose bounds are multiples of `align` (so that no vector or cache line is
    split between threads), and the team's threads claim parts one at a time from a
    shared counter: a thread the OS does not schedule in time leaves its parts to the
    others instead of holding the whole kernel up.
    """
    b = ctx.builder
    if threads <= 1 or total < 2:
        b.call(range_function, [*pointers, i64(0), i64(total)])
        return
    module = ctx.module
    counter = ctx.alloca(I64, name="parallel.next")
    b.store(i64(0), counter)
    data = ctx.alloca(PTR, name="parallel.data", count=len(pointers) + 1)
    for n, pointer in enumerate([counter, *pointers]):
        b.store(pointer, b.gep(data, [i64(n)], inbounds=True, source_etype=PTR))
    part = -(-total // (_PARTS_PER_THREAD * threads))
    part = -(-part // align) * align
    task = _task(module, range_function, len(pointers), total, part)
    run_parallel = _declare(module, RUNTIME_SYMBOL, ir.FunctionType(VOID, [PTR, PTR, I32, I32]))
    b.call(run_parallel, [task, data, ir.Constant(I32, threads), ir.Constant(I32, 0)])


# Parts per thread: more balance the load and let a pool worker that starts late still
# find parts to take; fewer cost fewer atomic increments (measured: docs/benchmarks.md).
_PARTS_PER_THREAD = 16


def _task(module: ir.Module, range_function: ir.Function, count: int, total: int,
          part: int) -> ir.Function:
    """`void task(ptr data)`: claim parts of [0, total) until none is left, running the
    range function on each. data[0] is the shared part counter, data[1:] the pointers."""
    function = ir.Function(module, ir.FunctionType(VOID, [PTR]),
                           name=f"{range_function.name}.task")
    function.linkage = "internal"
    function.attributes.add("nounwind")
    (data,) = function.args
    data.name = "data"
    entry = function.append_basic_block("entry")
    claim = function.append_basic_block("claim")
    work = function.append_basic_block("work")
    done = function.append_basic_block("done")
    b = ir.IRBuilder(entry)
    counter = b.load(data, typ=PTR)
    pointers = [b.load(b.gep(data, [i64(n + 1)], inbounds=True, source_etype=PTR), typ=PTR)
                for n in range(count)]
    b.branch(claim)
    b.position_at_end(claim)
    index = b.atomic_rmw("add", counter, i64(1), "monotonic")
    begin = b.mul(index, i64(part))
    b.cbranch(b.icmp_signed("<", begin, i64(total)), work, done)
    b.position_at_end(work)
    end = b.add(begin, i64(part))
    end = b.select(b.icmp_signed("<", end, i64(total)), end, i64(total))
    b.call(range_function, [*pointers, begin, end])
    b.branch(claim)
    b.position_at_end(done)
    b.ret_void()
    return function
