"""Loads the TfxlaLiteLaunch op and keeps the process-wide executable registry.

Where it sits: codegen produces an executable whose entry point has the ABI
`void entry(void** params, void** outputs, void* temp)`; `register_executable` puts
its address under a key in the C++ registry (through ctypes), and the graph rewrite
emits `launch(...)` nodes, which find it by that key at run time.

`tf.load_op_library` and `ctypes.CDLL` open the same file, and share its static state
(checked on TF 2.21), so what ctypes registers is what the kernel sees.

A dynamic cluster (unknown dimensions) registers a compile function instead of an
executable (`register_dynamic`): the op calls it back, through a ctypes callback, with
each new input signature, and caches the `Specialization` it returns, or its refusal.

Lifetime: every registration hands the op library an owner token, and the library
reports the token back (`tfxla_lite_take_released`) once the executable or dynamic
cluster is unregistered or replaced and no running launch holds it; only then is the
Python owner (the code's JIT engine, a dynamic cluster's callback) dropped, so a launch
never runs freed code. `Registration` unregisters its key when it is collected: the
compiler gives one to every program and rewritten graph that launches the key.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf

from tfxla_lite.runtime import build

OP_TYPE = "TfxlaLiteLaunch"
COMPILE_OP_TYPE = "TfxlaLiteCompile"
# Must match kAbiVersion in launch_op.cc.
ABI_VERSION = 6

# Compile callback outcomes; must match CompileOutcome in launch_op.cc.
COMPILED, REFUSED, FAILED, REFUSE_ALL = 0, 1, 2, 3

TensorSpecLike = tuple[Any, Sequence[int]]  # (tf.DType | numpy dtype | str, static shape)


@dataclass(frozen=True)
class OpLibrary:
    """The loaded op library: the TF op module and the same file opened by ctypes."""

    path: str
    module: ModuleType
    cdll: ctypes.CDLL


_load_lock = threading.Lock()
_library: OpLibrary | None = None
# owner token -> the object whose lifetime keeps machine code mapped (or a dynamic
# cluster's callback alive), until the op library reports the token released.
_owners: dict[int, Any] = {}
# Reentrant: a `Registration` finalizer may run inside a collection triggered while this
# thread holds it.
_owners_lock = threading.RLock()
_owner_tokens = itertools.count(1)
# Keys whose `Registration` was collected, unregistered at the next chance (a finalizer
# must not wait for the lock another thread holds).
_doomed: deque[str] = deque()


def load_library() -> OpLibrary:
    """Builds the op library if it is not cached, then loads it once per process."""
    global _library
    with _load_lock:
        if _library is None:
            # build_op_library returns only a library that matches its build's record
            # (size and SHA-256): a damaged file in the cache is rebuilt, never loaded.
            path = str(build.build_op_library())
            try:
                module = tf.load_op_library(path)
            except tf.errors.NotFoundError as error:
                raise RuntimeError(
                    f"TensorFlow cannot load the op library {path}: {error.message}; "
                    f"`python -m tfxla_lite.runtime.build --force` rebuilds it") from error
            cdll = ctypes.CDLL(path)
            _declare_c_functions(cdll)
            version = cdll.tfxla_lite_abi_version()
            if version != ABI_VERSION:
                raise RuntimeError(
                    f"{path} has launch ABI {version}, this tfxla_lite expects {ABI_VERSION}"
                )
            _library = OpLibrary(path=path, module=module, cdll=cdll)
            _bind_parallel_runtime(cdll)
            _apply_output_pool_option(cdll)
        return _library


# What `tfxla_lite_set_parallel_runtime` takes; must match ParallelRuntime in launch_op.cc.
PARALLEL_RUNTIMES = {"tf": 0, "openmp": 1, "serial": 2, "tf_team": 3}
_RUNTIME_NAMES = {code: name for name, code in PARALLEL_RUNTIMES.items()}


def _bind_parallel_runtime(cdll: ctypes.CDLL) -> None:
    """Kernels JIT-linked from now on run their parallel regions through the library
    (`codegen/cpu/parallel.py`); the runtime is the process's `parallel_runtime` option."""
    from tfxla_lite.codegen.cpu import parallel
    from tfxla_lite.flags import get_options
    from tfxla_lite.options import OptionsError

    # libgomp first: the library finds GOMP_parallel in the process (RTLD_GLOBAL) for
    # the openmp runtime and for kernels run outside a launch.
    parallel.openmp_available()
    parallel.use_parallel_runtime(
        ctypes.cast(cdll.tfxla_lite_parallel, ctypes.c_void_p).value)
    try:
        runtime = get_options().parallel_runtime
    except OptionsError:
        return  # bad TFXLA_LITE_FLAGS: reported where the options are used; keep "tf"
    _set_runtime(cdll, runtime)


def apply_parallel_runtime(name: str) -> None:
    """Set the runtime when the library is loaded; a no-op before (it reads the option
    when it loads). Called by `tfxla_lite.flags` whenever the process's options change."""
    library = _library
    if library is not None:
        _set_runtime(library.cdll, name)


def _set_runtime(cdll: ctypes.CDLL, name: str) -> str:
    if name not in PARALLEL_RUNTIMES:
        raise ValueError(f"unknown parallel runtime {name!r}; runtimes are "
                         f"{', '.join(PARALLEL_RUNTIMES)}")
    previous = cdll.tfxla_lite_set_parallel_runtime(PARALLEL_RUNTIMES[name])
    return _RUNTIME_NAMES[previous]


def set_parallel_runtime(name: str) -> str:
    """What parallel kernels launched by TF run their parts on, from the next parallel
    region on, process-wide: "tf" (the launching op's intra-op thread pool, closures
    scheduled per region), "tf_team" (the pool, helpers that stay for a launch's regions),
    "openmp" (libgomp's team) or "serial" (the launching thread alone). Returns the
    previous one.
    Usually set through the `parallel_runtime` option; this switch is for A/B runs."""
    return _set_runtime(load_library().cdll, name)


def parallel_runtime() -> str:
    """The parallel runtime launches use now (see `set_parallel_runtime`)."""
    return _RUNTIME_NAMES[load_library().cdll.tfxla_lite_parallel_runtime()]


@dataclass(frozen=True)
class ParallelStats:
    """Parallel regions of launched kernels since the process started: run on TF's pool,
    on libgomp, by the caller alone; the pool closures scheduled, those that ran a
    region's task, and those that started after their region was done (and returned at
    once). Once the pool has run every closure, scheduled = entered + late."""

    on_pool: int
    on_openmp: int
    serial: int
    workers_scheduled: int
    workers_entered: int
    workers_late: int


def parallel_stats() -> ParallelStats:
    counts = [ctypes.c_int64(0) for _ in range(6)]
    load_library().cdll.tfxla_lite_parallel_stats(*(ctypes.byref(c) for c in counts))
    return ParallelStats(*(c.value for c in counts))


@dataclass(frozen=True)
class LaunchTiming:
    """Where launches' time went since the process started, nanoseconds summed. Per
    launch: `prologue` (output allocation and temp arena, before `entry`) and `entry`.
    Per parallel region on TF's pool: the caller's time in `Schedule` (waking a worker),
    in its own share of the task, and waiting for the workers that entered (`join`);
    per pool closure, `closure_start`, its delay from being scheduled to starting."""

    launches: int
    prologue_ns: int
    entry_ns: int
    schedule_ns: int
    caller_task_ns: int
    join_ns: int
    closure_start_ns: int


def launch_timing() -> LaunchTiming:
    """The op library's timing counters now (subtract two readings for an interval)."""
    cdll = load_library().cdll
    launch = [ctypes.c_int64(0) for _ in range(3)]
    cdll.tfxla_lite_launch_timing(*(ctypes.byref(c) for c in launch))
    region = [ctypes.c_int64(0) for _ in range(4)]
    cdll.tfxla_lite_parallel_timing(*(ctypes.byref(c) for c in region))
    task, join, start, schedule = (c.value for c in region)
    return LaunchTiming(*(c.value for c in launch), schedule_ns=schedule, caller_task_ns=task,
                        join_ns=join, closure_start_ns=start)


def set_join_spin(microseconds: float) -> float:
    """How long a pool region's caller spins for its last workers before it sleeps on a
    condition variable (default 20 us), from the next region on, process-wide; returns
    the previous value. For A/B runs (`benchmarks/launch_timeline.py`)."""
    if microseconds < 0:
        raise ValueError(f"set_join_spin: the spin must be at least 0 us, got {microseconds}")
    previous = load_library().cdll.tfxla_lite_set_join_spin(round(microseconds * 1000))
    return previous / 1000


def set_team_idle(microseconds: float) -> float:
    """How long a "tf_team" runtime helper waits for its launch's next parallel region before
    it gives its pool thread back (default 20 us), from the next helper on,
    process-wide; returns the previous value. For A/B runs."""
    if microseconds < 0:
        raise ValueError(f"set_team_idle: the wait must be at least 0 us, got {microseconds}")
    previous = load_library().cdll.tfxla_lite_set_team_idle(round(microseconds * 1000))
    return previous / 1000


def team_regions_entered() -> int:
    """Parallel regions "tf_team" runtime helpers entered since the process started (a helper
    that stays for a launch enters several)."""
    return load_library().cdll.tfxla_lite_team_regions_entered()


def _apply_output_pool_option(cdll: ctypes.CDLL) -> None:
    """The process's `output_pool_mb` option, read when the library loads."""
    from tfxla_lite.flags import get_options
    from tfxla_lite.options import OptionsError

    try:
        megabytes = get_options().output_pool_mb
    except OptionsError:
        return  # bad TFXLA_LITE_FLAGS: reported where the options are used; keep the default
    _set_output_pool(cdll, enabled=megabytes > 0, cap_bytes=megabytes << 20, huge_pages=None)


def apply_output_pool(megabytes: int) -> None:
    """Set the output pool's cap (0: off) when the library is loaded; a no-op before (it
    reads the option when it loads). Called by `tfxla_lite.flags` when options change."""
    library = _library
    if library is not None:
        _set_output_pool(library.cdll, enabled=megabytes > 0, cap_bytes=megabytes << 20,
                         huge_pages=None)


def _set_output_pool(cdll: ctypes.CDLL, enabled: bool | None, cap_bytes: int | None,
                     huge_pages: bool | None) -> None:
    def flag(value: bool | None) -> int:
        return -1 if value is None else int(value)

    if cap_bytes is not None and not 0 <= cap_bytes <= _INT64_MAX:
        raise ValueError(f"the output pool's cap must be between 0 and 2^63-1 bytes, "
                         f"got {cap_bytes}")
    cdll.tfxla_lite_set_output_pool(flag(enabled), -1 if cap_bytes is None else cap_bytes,
                                    flag(huge_pages))


@dataclass(frozen=True)
class OutputPoolStats:
    """The launch op's pool of output blocks (launch_op.cc, "Output pool"). Counts since
    the process started: outputs given an idle block (`hits`), a newly mapped one
    (`misses`), or left to TF's allocator although large enough (`bypassed`: the pool
    off, memory of a special kind, a failed mapping); blocks given back when TF released
    their tensors (`returned`) and blocks unmapped (`released`: over the cap, trimmed).
    Now: the cap on idle bytes, the bytes idle and their peak (since the last reset), the
    bytes held by live tensors, the idle blocks, and the settings."""

    hits: int
    misses: int
    bypassed: int
    returned: int
    released: int
    cap_bytes: int
    idle_bytes: int
    peak_idle_bytes: int
    in_use_bytes: int
    idle_blocks: int
    enabled: bool
    huge_pages: bool


def output_pool_stats(reset_peak: bool = False) -> OutputPoolStats:
    """The output pool's counters now; `reset_peak` restarts `peak_idle_bytes` from the
    bytes idle now (after reading it)."""
    values = (ctypes.c_int64 * 12)()
    load_library().cdll.tfxla_lite_output_pool_stats(values, int(reset_peak))
    counts = [int(v) for v in values]
    return OutputPoolStats(*counts[:10], enabled=bool(counts[10]), huge_pages=bool(counts[11]))


def set_output_pool(enabled: bool | None = None, cap_bytes: int | None = None,
                    huge_pages: bool | None = None) -> OutputPoolStats:
    """Configure the output pool process-wide, from the next output on (None: unchanged);
    returns the stats from before. `enabled=False` leaves every output to TF's allocator;
    `cap_bytes` bounds the idle blocks, trimming them now (0: each block is unmapped as
    it returns); `huge_pages` advises new blocks of 2 MB and up for transparent huge
    pages. Usually set through the `output_pool_mb` option; this is for A/B runs."""
    cdll = load_library().cdll
    before = output_pool_stats()
    _set_output_pool(cdll, enabled, cap_bytes, huge_pages)
    return before


def trim_output_pool(keep_bytes: int = 0) -> None:
    """Unmap the oldest idle output blocks until at most `keep_bytes` bytes stay idle."""
    load_library().cdll.tfxla_lite_trim_output_pool(max(0, int(keep_bytes)))


def load_ops() -> ModuleType:
    """The op module (`load_ops().tfxla_lite_launch(...)`); registers the op with TF.

    Call it before `tf.graph_util.import_graph_def` of a graph holding launch nodes.
    """
    return load_library().module


def _declare_c_functions(cdll: ctypes.CDLL) -> None:
    int_p = ctypes.POINTER(ctypes.c_int)
    int64_p = ctypes.POINTER(ctypes.c_int64)
    cdll.tfxla_lite_register.argtypes = [
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int,
        int_p,
        int_p,
        int64_p,
        ctypes.c_int,
        int_p,
        int_p,
        int64_p,
        int_p,
    ]
    cdll.tfxla_lite_register.restype = ctypes.c_int
    cdll.tfxla_lite_register_owned.argtypes = [
        ctypes.c_int64, *cdll.tfxla_lite_register.argtypes]
    cdll.tfxla_lite_register_owned.restype = ctypes.c_int
    cdll.tfxla_lite_take_released.argtypes = [int64_p, ctypes.c_int64]
    cdll.tfxla_lite_take_released.restype = ctypes.c_int64
    cdll.tfxla_lite_unregister.argtypes = [ctypes.c_char_p]
    cdll.tfxla_lite_unregister.restype = ctypes.c_int
    cdll.tfxla_lite_registry_size.argtypes = []
    cdll.tfxla_lite_registry_size.restype = ctypes.c_int64
    cdll.tfxla_lite_abi_version.argtypes = []
    cdll.tfxla_lite_abi_version.restype = ctypes.c_int
    cdll.tfxla_lite_register_dynamic.argtypes = [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, int_p, int_p, int64_p, int_p,
        ctypes.c_int64,
    ]
    cdll.tfxla_lite_register_dynamic.restype = ctypes.c_int
    cdll.tfxla_lite_fulfill.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, int_p,
        ctypes.c_int, int_p, int_p, int64_p, ctypes.c_int64,
    ]
    cdll.tfxla_lite_fulfill.restype = ctypes.c_int
    cdll.tfxla_lite_fail.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    cdll.tfxla_lite_fail.restype = None
    cdll.tfxla_lite_dynamic_stats.argtypes = [
        ctypes.c_char_p, int64_p, int64_p, int_p,
    ]
    cdll.tfxla_lite_dynamic_stats.restype = ctypes.c_int
    cdll.tfxla_lite_arena_stats.argtypes = [int64_p, int64_p]
    cdll.tfxla_lite_arena_stats.restype = None
    cdll.tfxla_lite_forwarded_outputs.argtypes = []
    cdll.tfxla_lite_forwarded_outputs.restype = ctypes.c_int64
    cdll.tfxla_lite_variables_in_place.argtypes = []
    cdll.tfxla_lite_variables_in_place.restype = ctypes.c_int64
    cdll.tfxla_lite_set_parallel_runtime.argtypes = [ctypes.c_int]
    cdll.tfxla_lite_set_parallel_runtime.restype = ctypes.c_int
    cdll.tfxla_lite_parallel_runtime.argtypes = []
    cdll.tfxla_lite_parallel_runtime.restype = ctypes.c_int
    cdll.tfxla_lite_parallel_stats.argtypes = [int64_p] * 6
    cdll.tfxla_lite_parallel_stats.restype = None
    cdll.tfxla_lite_parallel_timing.argtypes = [int64_p] * 4
    cdll.tfxla_lite_parallel_timing.restype = None
    cdll.tfxla_lite_launch_timing.argtypes = [int64_p] * 3
    cdll.tfxla_lite_launch_timing.restype = None
    cdll.tfxla_lite_set_join_spin.argtypes = [ctypes.c_int64]
    cdll.tfxla_lite_set_join_spin.restype = ctypes.c_int64
    cdll.tfxla_lite_set_team_idle.argtypes = [ctypes.c_int64]
    cdll.tfxla_lite_set_team_idle.restype = ctypes.c_int64
    cdll.tfxla_lite_team_regions_entered.argtypes = []
    cdll.tfxla_lite_team_regions_entered.restype = ctypes.c_int64
    cdll.tfxla_lite_set_output_pool.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    cdll.tfxla_lite_set_output_pool.restype = None
    cdll.tfxla_lite_trim_output_pool.argtypes = [ctypes.c_int64]
    cdll.tfxla_lite_trim_output_pool.restype = None
    cdll.tfxla_lite_output_pool_stats.argtypes = [int64_p, ctypes.c_int]
    cdll.tfxla_lite_output_pool_stats.restype = None


def as_tf_dtype(dtype: Any) -> tf.DType:
    """tf.DType, numpy dtype or type, or a name such as "float32" -> tf.DType."""
    if isinstance(dtype, tf.DType):
        return dtype
    return tf.as_dtype(np.dtype(dtype))


def _static_shape(shape: Any, what: str) -> tuple[int, ...]:
    dims = tf.TensorShape(shape)
    if not dims.is_fully_defined():
        raise ValueError(f"{what}: shape {dims} is not static; an executable has fixed shapes")
    return tuple(int(d) for d in dims.as_list())


# The int64 limit of TF's sizes; ctypes wraps larger Python ints silently, so every size
# handed to the op library is checked against it here.
_INT64_MAX = 2**63 - 1
# The op library rounds temp arenas up to its 64-byte alignment.
MAX_TEMP_BYTES = _INT64_MAX - 64


def _check_size(shape: tuple[int, ...], dtype: tf.DType, what: str) -> None:
    count = math.prod(shape)
    if count * max(1, dtype.size) > _INT64_MAX:
        raise ValueError(f"{what}: shape {list(shape)} of {dtype.name} has {count} elements, "
                         f"more than a tensor can hold (2^63-1 elements and bytes)")


def _check_temp_bytes(temp_bytes: int, what: str) -> None:
    if not 0 <= temp_bytes <= MAX_TEMP_BYTES:
        raise ValueError(f"{what}: temp_bytes {temp_bytes} is not between 0 and "
                         f"{MAX_TEMP_BYTES}")


def _flatten_specs(specs: Sequence[TensorSpecLike], what: str) -> tuple[int, Any, Any, Any]:
    """Specs -> (count, dtype enums, ranks, all dims concatenated) as ctypes arrays."""
    dtypes, ranks, dims = [], [], []
    for index, (dtype, shape) in enumerate(specs):
        dtypes.append(as_tf_dtype(dtype).as_datatype_enum)
        static = _static_shape(shape, f"{what} {index}")
        _check_size(static, as_tf_dtype(dtype), f"{what} {index}")
        ranks.append(len(static))
        dims.extend(static)
    # One spare element each, so that no array is empty (a NULL pointer is fine too).
    return (
        len(dtypes),
        (ctypes.c_int * (len(dtypes) + 1))(*dtypes),
        (ctypes.c_int * (len(ranks) + 1))(*ranks),
        (ctypes.c_int64 * (len(dims) + 1))(*dims),
    )


def register_executable(
    key: str,
    entry_address: int,
    temp_bytes: int,
    input_specs: Sequence[TensorSpecLike],
    output_specs: Sequence[TensorSpecLike],
    owner: Any = None,
    donations: Sequence[tuple[int, int]] = (),
) -> None:
    """Makes `key` launchable: `launch(..., key)` will call `entry_address`.

    `entry_address` is the address of a function with the launch ABI (for example
    llvmlite's `get_function_address`); `owner` is any object that keeps its code
    alive (the executable, its JIT engine), held until `unregister(key)` (or a
    registration replacing this one) and the last launch running the code returned.
    Specs are (dtype, static shape) pairs, in argument order. Registering a key
    again replaces the executable. `donations` lists (output j, input i) pairs whose
    output the code may write over the input's own buffer (`Executable.donations`):
    the op then forwards input i to output j whenever TF no longer needs it.
    """
    if not key:
        raise ValueError("register_executable: the key must be a non-empty string")
    if not entry_address:
        raise ValueError(f"register_executable({key!r}): entry_address is null")
    _check_temp_bytes(temp_bytes, f"register_executable({key!r})")
    n_in, in_dtypes, in_ranks, in_dims = _flatten_specs(input_specs, "input")
    n_out, out_dtypes, out_ranks, out_dims = _flatten_specs(output_specs, "output")
    forward = [-1] * n_out
    for j, i in donations:
        if not (0 <= j < n_out and 0 <= i < n_in) or forward[j] != -1:
            raise ValueError(f"register_executable({key!r}): bad donation {(j, i)}")
        forward[j] = i
    forward_from = (ctypes.c_int * max(1, n_out))(*forward)
    cdll = load_library().cdll
    with _owners_lock:
        _release_owners(cdll)
        token = next(_owner_tokens)
        _owners[token] = owner  # before the library can run the code
        status = cdll.tfxla_lite_register_owned(
            token,
            key.encode(),
            ctypes.c_void_p(entry_address),
            int(temp_bytes),
            n_in,
            in_dtypes,
            in_ranks,
            in_dims,
            n_out,
            out_dtypes,
            out_ranks,
            out_dims,
            forward_from,
        )
        if status < 0:
            del _owners[token]
            raise ValueError(f"register_executable({key!r}): the op library rejected the specs")


def unregister(key: str) -> bool:
    """Removes `key`; returns whether it was registered.

    Launches already running keep the entry they read and its code: the owner is
    dropped once the last of them returned (see the module docstring).
    """
    cdll = load_library().cdll
    with _owners_lock:
        removed = bool(cdll.tfxla_lite_unregister(key.encode()))
        _release_owners(cdll)
    return removed


def _release_owners(cdll: ctypes.CDLL) -> None:
    """Unregister the keys of collected `Registration`s, then drop the owners whose
    executables the op library no longer holds. Called with `_owners_lock` held."""
    while _doomed:
        cdll.tfxla_lite_unregister(_doomed.popleft().encode())
    released: list[Any] = []
    batch = (ctypes.c_int64 * 64)()
    while True:
        count = cdll.tfxla_lite_take_released(batch, len(batch))
        released.extend(_owners.pop(batch[i], None) for i in range(count))
        if count < len(batch):
            break
    # Dropped here, under the lock: an owner's engine frees its code as it goes, and a
    # finalizer it triggers re-enters through the reentrant lock.
    released.clear()


def release_owners() -> int:
    """Unregister the keys whose `Registration` was collected and drop every owner the op
    library released; returns how many owners are still held. Every registration and
    `registry_size` does it too."""
    if _library is None:
        return len(_owners)
    with _owners_lock:
        _release_owners(_library.cdll)
        return len(_owners)


class Registration:
    """Holds `key` registered: when this object is collected (or `release()`d) the key
    is unregistered, and its code freed once no launch runs it. Whoever may still launch
    the key (a program, the rewritten graph whose launch nodes name it) holds it."""

    __slots__ = ("__weakref__", "_finalizer", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self._finalizer = weakref.finalize(self, _doom, key)
        self._finalizer.atexit = False  # the process's registry goes with it

    def release(self) -> None:
        """Unregister the key now (launches of it fail with `NotFoundError` from now on)."""
        self._finalizer()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    def __repr__(self) -> str:
        return f"<Registration {self.key!r}{'' if self.alive else ' released'}>"


def _doom(key: str) -> None:
    """A `Registration`'s finalizer: possibly inside a collection on any thread, so it
    unregisters at once only when the lock is free, else at the next registry call."""
    _doomed.append(key)
    library = _library
    if library is not None and _owners_lock.acquire(blocking=False):
        try:
            _release_owners(library.cdll)
        finally:
            _owners_lock.release()


@dataclass(frozen=True)
class ArenaStats:
    """Temp arenas the launch nodes of this process allocated, and launches that reused
    an idle one (each node keeps its arenas from launch to launch)."""

    allocated: int
    reused: int


def arena_stats() -> ArenaStats:
    allocated, reused = ctypes.c_int64(0), ctypes.c_int64(0)
    load_library().cdll.tfxla_lite_arena_stats(ctypes.byref(allocated), ctypes.byref(reused))
    return ArenaStats(allocated.value, reused.value)


def forwarded_outputs() -> int:
    """Outputs launches of this process wrote in an input's own buffer."""
    return int(load_library().cdll.tfxla_lite_forwarded_outputs())


def variables_in_place() -> int:
    """Variable writes launches of this process made in the variable's own buffer (the
    rest went to a new buffer: another tensor held the old one, or the executable reads
    the old value after writing)."""
    return int(load_library().cdll.tfxla_lite_variables_in_place())


def registry_size() -> int:
    """How many executables are registered in this process (as the C++ side counts),
    after the keys of collected `Registration`s are unregistered."""
    cdll = load_library().cdll
    with _owners_lock:
        _release_owners(cdll)
    return int(cdll.tfxla_lite_registry_size())


def launch(
    inputs: Sequence[Any],
    key: str,
    output_dtypes: Sequence[Any],
    output_shapes: Sequence[Any],
    name: str | None = None,
) -> list[tf.Tensor]:
    """Runs the executable registered under `key`; eager or while tracing a graph.

    `output_shapes` may leave dimensions unknown (None) for shape inference; the
    executable's registered shapes are what run, and they must be compatible.
    """
    output_dtypes = [as_tf_dtype(dtype) for dtype in output_dtypes]
    output_shapes = [tf.TensorShape(shape) for shape in output_shapes]
    if len(output_dtypes) != len(output_shapes):
        raise ValueError(
            f"launch({key!r}): {len(output_dtypes)} output dtypes, {len(output_shapes)} shapes"
        )
    results = load_ops().tfxla_lite_launch(
        args=list(inputs),
        key=key,
        Tout=output_dtypes,
        output_shapes=output_shapes,
        name=name,
    )
    if not output_dtypes:
        # With no outputs the generated wrapper returns the Operation (graph) or None.
        return []
    return list(results)


# -- dynamic clusters ---------------------------------------------------------------------
# int callback(request, num_inputs, dtypes, ranks, dims_flat, data)
_CompileCallback = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int64),
    ctypes.POINTER(ctypes.c_void_p),
)


@dataclass(frozen=True)
class SpecializationRequest:
    """One new input signature of a dynamic cluster: every input's dtype and shape, and
    the values of its value-keyed inputs (copies, keyed by input index)."""

    dtypes: tuple[tf.DType, ...]
    shapes: tuple[tuple[int, ...], ...]
    values: dict[int, np.ndarray]

    @property
    def signature(self) -> tuple:
        """Hashable; equal exactly when the op's own cache key is equal."""
        values = tuple((i, v.dtype.str, v.shape, v.tobytes())
                       for i, v in sorted(self.values.items()))
        return self.dtypes, self.shapes, values


@dataclass(frozen=True)
class Specialization:
    """An executable for one signature. `param_inputs`: the node inputs passed to `entry`,
    in order (value-keyed inputs are embedded); `owner` keeps the code alive."""

    entry_address: int
    temp_bytes: int
    param_inputs: tuple[int, ...]
    output_specs: tuple[TensorSpecLike, ...]
    owner: Any = None


@dataclass(frozen=True)
class Refusal:
    """No executable for this signature: the node's fallback runs. `for_all_new`: refuse
    every signature not seen yet too, without asking again (a megamorphic cluster)."""

    for_all_new: bool = False


CompileFunction = Any  # Callable[[SpecializationRequest], Specialization | Refusal]


@dataclass
class _DynamicEntry:
    """What keeps a dynamic key's callback alive (each specialization's code has its own
    owner token)."""

    callback: Any


@dataclass(frozen=True)
class DynamicStats:
    compiled: int
    refused: int
    refuses_all_new: bool


def register_dynamic(
    key: str,
    input_specs: Sequence[TensorSpecLike],
    value_inputs: Sequence[int],
    compile_function: CompileFunction,
) -> None:
    """Makes `key` a dynamic cluster: launches (and `TfxlaLiteCompile`) with an input
    signature not seen before call `compile_function(SpecializationRequest)`, which returns
    a `Specialization`, a `Refusal`, or raises (the op then fails with the message).

    `input_specs` are (dtype, shape) with None for unknown dimensions; their ranks must be
    known. The bytes of the inputs in `value_inputs` are part of the signature. The
    callback runs on a TF thread with the GIL taken by ctypes, and may run for two
    signatures at once: `compile_function` must be thread-safe.
    """
    if not key:
        raise ValueError("register_dynamic: the key must be a non-empty string")
    dtypes, ranks, dims = [], [], []
    for index, (dtype, shape) in enumerate(input_specs):
        partial = tf.TensorShape(shape)
        if partial.rank is None:
            raise ValueError(f"register_dynamic({key!r}): input {index} has unknown rank")
        dtypes.append(as_tf_dtype(dtype))
        ranks.append(partial.rank)
        dims.extend(-1 if d is None else int(d) for d in partial.as_list())
    count = len(dtypes)
    value_keyed = [0] * count
    for index in value_inputs:
        value_keyed[index] = 1
    cdll = load_library().cdll
    entry = _DynamicEntry(callback=None)

    def callback(request, num_inputs, dtype_enums, rank_array, dims_flat, data):  # noqa: ANN001
        # Never let an exception out: ctypes would print it and return 0 (COMPILED).
        try:
            shapes, offset = [], 0
            for i in range(num_inputs):
                shapes.append(tuple(dims_flat[offset + d] for d in range(rank_array[i])))
                offset += rank_array[i]
            values = {}
            for i in value_inputs:
                dtype = dtypes[i].as_numpy_dtype
                nbytes = int(np.prod(shapes[i], dtype=np.int64)) * np.dtype(dtype).itemsize
                raw = ctypes.string_at(data[i], nbytes) if nbytes else b""
                values[i] = np.frombuffer(raw, dtype=dtype).reshape(shapes[i]).copy()
            result = compile_function(SpecializationRequest(
                tuple(dtypes), tuple(shapes), values))
            if isinstance(result, Refusal):
                return REFUSE_ALL if result.for_all_new else REFUSED
            return _fulfill(cdll, request, result)
        except BaseException as error:  # noqa: BLE001 - reported by the op as its error
            cdll.tfxla_lite_fail(request, f"{type(error).__name__}: {error}".encode())
            return FAILED

    entry.callback = _CompileCallback(callback)
    with _owners_lock:
        _release_owners(cdll)
        token = next(_owner_tokens)
        _owners[token] = entry
        status = cdll.tfxla_lite_register_dynamic(
            key.encode(),
            ctypes.cast(entry.callback, ctypes.c_void_p),
            count,
            (ctypes.c_int * (count + 1))(*[d.as_datatype_enum for d in dtypes]),
            (ctypes.c_int * (count + 1))(*ranks),
            (ctypes.c_int64 * (len(dims) + 1))(*dims),
            (ctypes.c_int * (count + 1))(*value_keyed),
            token,
        )
        if status < 0:
            del _owners[token]
            raise ValueError(f"register_dynamic({key!r}): the op library rejected the specs")


def _fulfill(cdll: ctypes.CDLL, request: int, result: Specialization) -> int:
    if not result.entry_address:
        raise ValueError("a specialization needs an entry address")
    _check_temp_bytes(result.temp_bytes, "a specialization")
    n_out, out_dtypes, out_ranks, out_dims = _flatten_specs(result.output_specs, "output")
    params = list(result.param_inputs)
    with _owners_lock:
        # Kept before the op can call the code, until the library releases the token.
        token = next(_owner_tokens)
        _owners[token] = result.owner
    status = cdll.tfxla_lite_fulfill(
        request, ctypes.c_void_p(result.entry_address), int(result.temp_bytes), len(params),
        (ctypes.c_int * (len(params) + 1))(*params), n_out, out_dtypes, out_ranks, out_dims,
        token)
    if status < 0:
        with _owners_lock:
            _owners.pop(token, None)
        raise ValueError("the op library rejected the specialization")
    return COMPILED


def dynamic_stats(key: str) -> DynamicStats | None:
    """Signatures compiled and refused by the dynamic cluster `key` (None: no such key)."""
    compiled, refused, refuse_all = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int()
    status = load_library().cdll.tfxla_lite_dynamic_stats(
        key.encode(), ctypes.byref(compiled), ctypes.byref(refused), ctypes.byref(refuse_all))
    if status < 0:
        return None
    return DynamicStats(compiled.value, refused.value, bool(refuse_all.value))


def compiled_for(inputs: Sequence[Any], key: str, name: str | None = None) -> tf.Tensor:
    """`TfxlaLiteCompile`: a bool scalar, true when `key` has (or now compiles) an
    executable for these inputs, false when the fallback must run."""
    return load_ops().tfxla_lite_compile(args=list(inputs), key=key, name=name)
