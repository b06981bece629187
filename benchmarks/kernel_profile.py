"""Per-kernel time of tfxla-lite's compiled executables: where a step's time goes.

Run: .venv/bin/python -m benchmarks.kernel_profile WORKLOAD [--iterations N] [--top K]
     (WORKLOAD: a name of `benchmarks/workloads.py`, e.g. mlp_train_b128, or a model-zoo
     step MODEL:MODE of `benchmarks/zoo.py`, e.g. transformer:train, transformer:infer)

Inside `profiling()`, every kernel call that `entry` makes is bracketed by the CPU's
cycle counter (`llvm.readcyclecounter`, the TSC on x86: constant rate), and each
kernel's total and minimum cycles per call are kept in a global array of its
executable. The minimum is the kernel's cost when nothing else ran on the machine
(useful on a busy machine); the mean includes waits for a preempted team thread.
Kernels are labelled by their entry instruction, kind and shape, dots by their GEMM
plan and schedule (`codegen/cpu/dot.py`), fusions by the opcodes they hold. The
compile caches are bypassed (a cached executable would carry no counters), and so is
the tiered compile: what is profiled is the O3 code, compiled before the first call,
never the quick tier that runs until the swap (`codegen/cpu/tiers.py`). The CLI
times the same step under TF's XLA, interleaved, for reference.

Nothing of this changes the compiler: `profiling()` wraps the kernel emitters and the
CPU backend's `compile` for its duration only.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from llvmlite import ir

from tfxla_lite.codegen import compile_module, cpu
from tfxla_lite.codegen.cpu import compiler, multi_output
from tfxla_lite.codegen.cpu import dot as dot_codegen
from tfxla_lite.codegen.cpu import engine as cpu_engine
from tfxla_lite.codegen.executable import ENTRY_SIGNATURE, TEMP_ALIGNMENT
from tfxla_lite.hlo.ir import Instruction

_COUNTERS = "kernel_profile.counters"
_SLOTS = 4096  # [total cycles of kernel i, then minimum cycles of kernel i] per executable
_I64 = ir.IntType(64)


@dataclass(frozen=True)
class KernelTime:
    label: str
    is_dot: bool
    total_seconds: float
    min_seconds: float


@dataclass
class Profile:
    """The executables compiled inside `profiling()`, each with its kernels' labels."""

    executables: list[tuple[Any, list[str], list[bool]]] = field(default_factory=list)
    _baseline: list[np.ndarray] = field(default_factory=list)

    def reset(self) -> None:
        """Start counting totals from now (minimums keep their lowest value)."""
        self._baseline = [self._counters(ex)[:_SLOTS // 2].copy()
                          for ex, _, _ in self.executables]

    def kernels(self, calls: int) -> list[KernelTime]:
        """Each kernel's mean over `calls` calls since `reset()`, and its minimum."""
        hertz = cycles_per_second()
        rows = []
        for n, (executable, labels, dots) in enumerate(self.executables):
            counters = self._counters(executable)
            base = self._baseline[n] if n < len(self._baseline) else 0
            totals = (counters[:_SLOTS // 2] - base)[:len(labels)]
            minimums = counters[_SLOTS // 2:_SLOTS // 2 + len(labels)]
            for label, is_dot, total, minimum in zip(labels, dots, totals, minimums):
                rows.append(KernelTime(label, is_dot, total / calls / hertz, minimum / hertz))
        return rows

    @staticmethod
    def _counters(executable: Any) -> np.ndarray:
        address = executable.engine.get_global_value_address(_COUNTERS)
        return np.ctypeslib.as_array((ctypes.c_int64 * _SLOTS).from_address(address))


def describe(inst: Instruction) -> tuple[str, bool]:
    """A kernel's label and whether it is a GEMM-shaped dot."""
    kind = inst.attributes.get("kind", "") if inst.opcode == "fusion" else ""
    head = f"{inst.name} {inst.opcode}{'/' + kind if kind else ''} {inst.shape}"
    dot = dot_codegen.kernel_dot(inst)
    plan = dot_codegen.plan_gemm(dot) if dot is not None else None
    if plan is not None:
        sched = dot_codegen.schedule(plan)
        batch = f" batch {plan.batch_sizes}" if plan.batch_sizes else ""
        return (f"{head}: GEMM {plan.m}x{plan.n}x{plan.k}{batch}"
                f"{' A^T' if plan.transpose_a else ''}{' B^T' if plan.transpose_b else ''}, "
                f"{sched.strategy}, {sched.units} x {sched.block_m}x{sched.block_n}"), True
    if inst.opcode == "fusion":
        opcodes = collections.Counter(i.opcode for i in inst.fused_computation.instructions
                                      if i.opcode != "parameter")
        return f"{head}: {', '.join(sorted(opcodes))}", dot is not None
    return head, inst.opcode == "dot"


def _timed(emit: Callable[..., ir.Function], labels: list[tuple[str, bool]]
           ) -> Callable[..., ir.Function]:
    """`emit`, with the kernel it returns wrapped in a function that counts its cycles."""

    @functools.wraps(emit)
    def timed(module: ir.Module, pool: Any, inst: Instruction, *args: Any, **kwargs: Any
              ) -> ir.Function:
        kernel = emit(module, pool, inst, *args, **kwargs)
        counters = module.globals.get(_COUNTERS)
        if counters is None:
            counters = ir.GlobalVariable(module, ir.ArrayType(_I64, _SLOTS), _COUNTERS)
            counters.initializer = ir.Constant(ir.ArrayType(_I64, _SLOTS), None)
            labels.clear()
        number = len(labels)
        if number >= _SLOTS // 2:
            raise ValueError(f"kernel_profile: more than {_SLOTS // 2} kernels in one module")
        labels.append(describe(inst))
        wrapper = ir.Function(module, kernel.function_type, name=kernel.name + ".profiled")
        b = ir.IRBuilder(wrapper.append_basic_block("entry"))
        clock = module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(_I64, []))
        start = b.call(clock, [])
        b.call(kernel, list(wrapper.args))
        cycles = b.sub(b.call(clock, []), start)

        def slot(index: int) -> ir.Value:
            return b.gep(counters, [_I64(0), _I64(index)], inbounds=True)

        total = slot(number)
        b.store(b.add(b.load(total), cycles), total)
        minimum = slot(_SLOTS // 2 + number)
        old = b.load(minimum)  # 0 until the first call: compare x - 1 unsigned
        smaller = b.icmp_unsigned("<", b.sub(cycles, _I64(1)), b.sub(old, _I64(1)))
        b.store(b.select(smaller, cycles, old), minimum)
        b.ret_void()
        return wrapper

    return timed


@contextlib.contextmanager
def profiling() -> Iterator[Profile]:
    """Executables compiled inside this block count their kernels' cycles; they
    are compiled at O3 on the calling thread (no quick tier, no background LLVM), so
    the profile is of the code a warm process runs."""
    profile = Profile()
    labels: list[tuple[str, bool]] = []
    saved = (compiler.emit_kernel, multi_output.emit_kernel, cpu.compile,
             os.environ.get("TFXLA_LITE_CACHE"))
    original_compile = cpu.compile

    def compile_executable(*args: Any, **kwargs: Any) -> Any:
        labels.clear()
        kwargs["cache"] = False
        # The O3 code, at once: a tiered executable's counters would be its quick tier's
        # (the engine it holds), which stop counting at the swap, and a background compile
        # may not even have swapped in by the time the steps are timed.
        kwargs["tiered"] = kwargs["background"] = False
        executable = original_compile(*args, **kwargs)
        if labels:
            profile.executables.append((executable, [text for text, _ in labels],
                                        [is_dot for _, is_dot in labels]))
        return executable

    compiler.emit_kernel = _timed(compiler.emit_kernel, labels)
    multi_output.emit_kernel = _timed(multi_output.emit_kernel, labels)
    cpu.compile = compile_executable  # what `codegen.compile_module` calls
    # No cache hit may skip the emitters (compile_module looks its caches up first).
    os.environ["TFXLA_LITE_CACHE"] = "0"
    try:
        yield profile
    finally:
        compiler.emit_kernel, multi_output.emit_kernel, cpu.compile, cache = saved
        if cache is None:
            os.environ.pop("TFXLA_LITE_CACHE", None)
        else:
            os.environ["TFXLA_LITE_CACHE"] = cache


@functools.cache
def cycles_per_second() -> float:
    """The cycle counter's rate, against `time.perf_counter` over 0.2 s."""
    module = ir.Module(name="kernel_profile_clock")
    function = ir.Function(module, ir.FunctionType(_I64, []), name="cycles")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    b.ret(b.call(module.declare_intrinsic("llvm.readcyclecounter",
                                          fnty=ir.FunctionType(_I64, [])), []))
    engine, _ = cpu_engine.jit(cpu_engine.parse_and_verify(str(module)))
    read = ctypes.CFUNCTYPE(ctypes.c_uint64)(engine.get_function_address("cycles"))
    start, cycles = time.perf_counter(), read()
    time.sleep(0.2)
    rate = (read() - cycles) / (time.perf_counter() - start)
    cycles_per_second.engine = engine  # type: ignore[attr-defined]  # keep the code alive
    return rate


@dataclass(frozen=True)
class ThreadScaling:
    """Per-call samples of one executable called on preallocated buffers (`thread_scaling`)."""

    threads: int
    wall: list[float]  # seconds per call
    cpu: list[float]  # the process's CPU seconds per call (all threads)

    def both_busy(self, share: float = 1.6) -> list[float]:
        """Wall times of the calls whose CPU time reached `share` times their wall time:
        the calls on which a second thread really worked beside the caller."""
        return [w for w, c in zip(self.wall, self.cpu) if c >= share * w]


def thread_scaling(make_module: Callable[[], Any], arrays: list[np.ndarray],
                   threads: tuple[int, ...] = (1, 2), repeats: int = 100,
                   moved_bytes: int = 128 << 20) -> tuple[dict[int, ThreadScaling],
                                                          list[np.ndarray]]:
    """The module `make_module()` builds, compiled once per thread count and called
    directly through its entry on preallocated outputs and arena (no allocation, no page
    fault, no TF), the thread counts interleaved call by call in a rotating order.
    Enough copies of the inputs and outputs are cycled through that the calls together
    touch `moved_bytes` (default 128 MiB, beyond this machine's 32 MiB L3: each call
    reads its inputs from DRAM, as in the benchmark, where other work runs between
    bursts). Returns the samples per thread count and the outputs of the first thread
    count's last call on the first copy (for checking). Every thread count must give
    the same bits (each element is computed whole by one thread): checked here."""
    executables = {count: compile_module(make_module(), threads=count, cache=False)
                   for count in threads}
    first = executables[threads[0]]
    per_call = sum(a.nbytes for a in arrays) + sum(s.byte_size for s in first.output_shapes)
    copies = max(1, -(-moved_bytes // max(per_call, 1)))
    sets = []
    for _ in range(copies):
        inputs = [np.ascontiguousarray(a).copy() for a in arrays]
        outputs = [np.zeros(s.dims, s.numpy_dtype) for s in first.output_shapes]
        sets.append((inputs, outputs))
    calls: dict[int, list[Callable[[], None]]] = {}
    keep: list[Any] = []
    for count, executable in executables.items():
        entry = ENTRY_SIGNATURE(executable.entry_address)
        arena = np.zeros(executable.temp_bytes + TEMP_ALIGNMENT, np.uint8)
        temp = arena.ctypes.data + (-arena.ctypes.data % TEMP_ALIGNMENT) \
            if executable.temp_bytes else None
        calls[count] = []
        for inputs, outputs in sets:
            params = (ctypes.c_void_p * max(1, len(inputs)))(*[a.ctypes.data for a in inputs])
            results = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
            keep += [params, results, arena]
            calls[count].append(functools.partial(entry, ctypes.addressof(params),
                                                  ctypes.addressof(results), temp))
    reference = None
    for count in threads:  # warm every copy; identical bits for every thread count
        for call in calls[count]:
            call()
        got = [o.copy() for o in sets[0][1]]
        if reference is None:
            reference = got
        elif not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(reference, got)):
            raise AssertionError(f"thread_scaling: {count} threads computed other bits "
                                 f"than {threads[0]}")
    samples = {count: ThreadScaling(count, [], []) for count in threads}
    order = list(threads)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for count in order[shift:] + order[:shift]:
            call = calls[count][repeat % copies]
            cpu = process_cpu_seconds()
            start = time.perf_counter()
            call()
            wall = time.perf_counter() - start
            samples[count].cpu.append(process_cpu_seconds() - cpu)
            samples[count].wall.append(wall)
    del keep
    return samples, reference or []


def process_cpu_seconds() -> float:
    """The CPU time of all this process's threads, each read through its own clock.

    `time.process_time()` adds the other threads' times as the scheduler last accounted
    them (at a tick or a switch): a team thread still running on the other core counts
    late, in a later call's figure. A thread's own clock (Linux's per-thread CPU clock
    id, `~tid << 3 | 6`) is brought up to date when read."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        try:
            total += time.clock_gettime((~int(tid) << 3) | 6)
        except OSError:  # the thread ended meanwhile
            continue
    return total


def concurrent_streams(make_module: Callable[[], Any], arrays: list[np.ndarray],
                       repeats: int = 50, moved_bytes: int = 128 << 20,
                       ) -> tuple[list[float], list[tuple[float, float]]]:
    """The module compiled for one thread, run by two Python threads at once (ctypes
    releases the GIL), each on its own copies of the buffers cycled through
    `moved_bytes`: what one thread's kernel costs while another streams beside it, as the
    two threads of a parallel kernel do. Returns the thread CPU seconds of single calls
    with nothing of ours beside them, and per concurrent pair each thread's CPU seconds
    for the pairs whose runs overlapped by at least 90% of the longer one (thread CPU
    time counts a stall on memory, not a wait for a core)."""
    executable = compile_module(make_module(), threads=1, cache=False)
    entry = ENTRY_SIGNATURE(executable.entry_address)
    per_call = sum(a.nbytes for a in arrays) + sum(s.byte_size for s in executable.output_shapes)
    copies = max(2, -(-moved_bytes // max(per_call, 1)))
    keep: list[Any] = []
    calls = []
    for _ in range(copies):
        inputs = [np.ascontiguousarray(a).copy() for a in arrays]
        outputs = [np.zeros(s.dims, s.numpy_dtype) for s in executable.output_shapes]
        arena = np.zeros(executable.temp_bytes + TEMP_ALIGNMENT, np.uint8)
        temp = arena.ctypes.data + (-arena.ctypes.data % TEMP_ALIGNMENT) \
            if executable.temp_bytes else None
        params = (ctypes.c_void_p * max(1, len(inputs)))(*[a.ctypes.data for a in inputs])
        results = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
        keep += [inputs, outputs, arena, params, results]
        calls.append(functools.partial(entry, ctypes.addressof(params),
                                       ctypes.addressof(results), temp))
    for call in calls:
        call()
    alone: list[float] = []
    pairs: list[tuple[float, float]] = []
    for repeat in range(repeats):
        first, second = calls[(2 * repeat) % copies], calls[(2 * repeat + 1) % copies]
        barrier = threading.Barrier(2)
        runs: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)] * 2

        def run(slot: int, call: Callable[[], None], barrier: threading.Barrier = barrier,
                runs: list = runs) -> None:
            barrier.wait()
            cpu, start = time.thread_time(), time.perf_counter()
            call()
            runs[slot] = (time.thread_time() - cpu, start, time.perf_counter())

        threads = [threading.Thread(target=run, args=(n, c)) for n, c in enumerate((first,
                                                                                    second))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        (cpu_a, start_a, end_a), (cpu_b, start_b, end_b) = runs
        overlap = min(end_a, end_b) - max(start_a, start_b)
        if overlap >= 0.9 * max(end_a - start_a, end_b - start_b):
            pairs.append((cpu_a, cpu_b))
        cpu = time.thread_time()
        calls[(2 * repeat + 2) % copies]()
        alone.append(time.thread_time() - cpu)
    del keep
    return alone, pairs


def scaling_report(samples: dict[int, ThreadScaling], moved: float = 0.0) -> str:
    """Best and median ms per thread count, and the same over the calls on which every
    thread worked (CPU time at least 1.6x the wall time: on a shared machine the second
    thread often gets no core, and a median of all calls measures the load)."""
    def quantiles(values: list[float]) -> str:
        if not values:
            return "    -- /    --"
        ordered = sorted(values)
        line = f"{ordered[0] * 1e3:6.3f} / {ordered[len(ordered) // 2] * 1e3:6.3f}"
        return line + (f" ({moved / ordered[0] / 1e9:5.1f} GB/s best)" if moved else "")

    lines = []
    for count, s in samples.items():
        line = f"  {count} thread{'s' if count > 1 else ' '}: best / median ms {quantiles(s.wall)}"
        line += f", CPU/wall {statistics.median(c / w for c, w in zip(s.cpu, s.wall)):.2f}"
        if count > 1:
            busy = s.both_busy()
            line += (f"; calls with both threads busy {len(busy)}/{len(s.wall)}: "
                     f"{quantiles(busy)}")
        lines.append(line)
    return "\n".join(lines)


def report(kernels: list[KernelTime], top: int) -> str:
    total = sum(k.total_seconds for k in kernels)
    dots = sum(k.total_seconds for k in kernels if k.is_dot)
    floor = sum(k.min_seconds for k in kernels)
    dot_floor = sum(k.min_seconds for k in kernels if k.is_dot)
    lines = [f"kernels: {len(kernels)}; mean per step {total * 1e3:.3f} ms (dots "
             f"{dots * 1e3:.3f}, other {(total - dots) * 1e3:.3f}); sum of per-kernel minimums "
             f"{floor * 1e3:.3f} ms (dots {dot_floor * 1e3:.3f})",
             f"{'mean us':>9} {'min us':>9}  kernel"]
    for k in sorted(kernels, key=lambda k: -k.total_seconds)[:top]:
        lines.append(f"{k.total_seconds * 1e6:9.1f} {k.min_seconds * 1e6:9.1f}  {k.label}")
    return "\n".join(lines)


def _steps(name: str) -> tuple[str, Profile, Callable[[], object], Callable[[], object]]:
    """The workload's or zoo step's name, the profile of its tfxla-lite step, that step
    (compiled inside `profiling()` by its first call) and its TF XLA step."""
    import tensorflow as tf

    import tfxla_lite as tl
    from benchmarks.workloads import by_name, measured_options

    if ":" in name:  # a model-zoo step, MODEL:MODE
        from benchmarks.zoo import zoo

        model, _, mode = name.partition(":")
        chosen = [s for s in zoo([model], quick=False) if s.mode == mode]
        if not chosen:
            raise SystemExit(f"kernel_profile: no zoo step {name!r} (MODEL:train or :infer)")
        variant = chosen[0].prepare()
        with profiling() as profile:
            lite = variant("lite")
            lite.call()
        return name, profile, lite.call, variant("xla").call
    (workload,) = by_name([name], quick=False)
    fn, args = workload.make()
    lite_function = tl.function(fn, jit_compile=True, options=measured_options())
    with profiling() as profile:
        lite_function(*args)
    xla = tf.function(fn, jit_compile=True)
    return workload.name, profile, lambda: lite_function(*args), lambda: xla(*args)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", help="a name of benchmarks/workloads.py, or a model-zoo "
                        "step as MODEL:MODE (benchmarks/zoo.py), e.g. transformer:infer")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--top", type=int, default=30)
    options = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    name, profile, lite, xla = _steps(options.workload)
    for _ in range(3):
        lite(), xla()
    profile.reset()
    steps: dict[str, list[float]] = {"tfxla-lite": [], "TF XLA": []}
    for _ in range(options.iterations):
        for label, step in (("tfxla-lite", lite), ("TF XLA", xla)):
            start = time.perf_counter()
            step()
            steps[label].append(time.perf_counter() - start)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"{name}, {options.iterations} steps each, interleaved; load {load}")
    for label, seconds in steps.items():
        print(f"  {label:>10}: step median {np.median(seconds) * 1e3:.3f} ms, "
              f"min {min(seconds) * 1e3:.3f} ms")
    calls = options.iterations  # each executable runs once per step
    print(report(profile.kernels(calls), options.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
