"""Background compiles: the process's one compile thread, and the one wait for its jobs.

Below `cpu/` (it imports nothing of tfxla-lite but `flags`). Every background job goes
through `submit` (a tiered or overlapped compile's O3 code, `cpu/tiers.py`; the rewrite
cache's write after them, `cached_programs.py`); a keyed job lets a later compile of the
same thing wait instead of compiling again (`pending`). `wait_for_compiles` is the one
wait. One thread per process (a forked child makes its own), at the `background_nice`
priority; at interpreter exit, droppable jobs that have not started within
`EXIT_WAIT_SECONDS` are dropped (`AbandonedCompile`), the others still run so that the
next process finds their results on disk.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from tfxla_lite import flags

# At interpreter exit, droppable jobs queued to start within this many seconds still run.
EXIT_WAIT_SECONDS = 10.0

_lock = threading.Lock()
_exit_deadline: float | None = None


class AbandonedCompile(RuntimeError):
    """A background compile dropped at interpreter exit (`EXIT_WAIT_SECONDS`)."""


def submit(function: Callable[..., Any], *args: Any, key: tuple[str, str] | None = None,
           droppable: bool = False) -> concurrent.futures.Future:
    """Run `function(*args)` on the process's compile thread. `key` (a namespace, a key):
    `pending(key)` gives the job until it is done. `droppable`: dropped if it would start
    after the interpreter began to exit (`EXIT_WAIT_SECONDS`)."""
    pid = os.getpid()
    job = _pool_of_process(pid).submit(_run, function, args, droppable)
    jobs, keyed = _jobs_of_process(pid), _keys_of_process(pid)
    with _lock:
        jobs.add(job)
        if key is not None:
            keyed[key] = job

    def forget(_: Any) -> None:
        with _lock:
            jobs.discard(job)
            if key is not None and keyed.get(key) is job:
                del keyed[key]

    job.add_done_callback(forget)
    return job


def _run(function: Callable[..., Any], args: tuple[Any, ...], droppable: bool) -> Any:
    if droppable and _exit_deadline is not None and time.monotonic() > _exit_deadline:
        raise AbandonedCompile("the interpreter is exiting")
    return function(*args)


def pending(key: tuple[str, str]) -> concurrent.futures.Future | None:
    """The job of this process submitted with `key`, until it is done."""
    with _lock:
        return _keys_of_process(os.getpid()).get(key)


def forget_keys(namespace: str) -> None:
    """Forget the keys of `namespace` of this process's jobs (the jobs run on)."""
    with _lock:
        keyed = _keys_of_process(os.getpid())
        for key in [key for key in keyed if key[0] == namespace]:
            del keyed[key]


def wait_for_compiles(timeout: float | None = None,
                      jobs: Iterable[concurrent.futures.Future] | None = None) -> bool:
    """`tfxla_lite.wait_for_compiles()`: wait until `jobs` (default: every background job
    of the process submitted so far, and any they lead to) are over, so that from then on
    every executable runs its O3 code and the disk caches hold it. False when `timeout`
    seconds passed first. A job's error is not raised here: the compile that failed was
    logged, and its executable keeps its quick-tier code (`Executable.tier`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    given = None if jobs is None else list(jobs)
    while True:
        with _lock:
            candidates = given if given is not None else _jobs_of_process(os.getpid())
            running = [job for job in candidates if not job.done()]
        if not running:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        _, running_now = concurrent.futures.wait(running, left)
        if running_now and deadline is not None and time.monotonic() >= deadline:
            return False


@functools.cache
def _jobs_of_process(pid: int) -> set[concurrent.futures.Future]:
    return set()


@functools.cache
def _keys_of_process(pid: int) -> dict[tuple[str, str], concurrent.futures.Future]:
    return {}


@functools.cache
def _pool_of_process(pid: int) -> concurrent.futures.ThreadPoolExecutor:
    """One compile thread per process (an executor inherited from a parent would never
    run a task)."""
    register = getattr(threading, "_register_atexit", None)
    if register is not None:  # before concurrent.futures joins the thread at exit
        register(_at_exit)
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfxla-lite-llvm",
                                                 initializer=_lower_priority)


def _lower_priority() -> None:
    """Run the compile thread `background_nice` above the process's nice value (Linux sets
    it per thread), so that a first call's own work and its launches come first: at 0 the
    O3 compile took a core from the first call, at 19 it starved behind a loop of calls
    right after (docs/benchmarks.md, "A tiered LLVM compile")."""
    nice = flags.switch("background_nice")
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread)
                                                    + nice))
    except OSError:
        pass


def _at_exit() -> None:
    """At interpreter exit, before the compile thread is joined: droppable jobs that have
    not started within `EXIT_WAIT_SECONDS` are dropped."""
    global _exit_deadline
    _exit_deadline = time.monotonic() + EXIT_WAIT_SECONDS
