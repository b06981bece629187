"""`Executable`: compiled kernels plus their buffer plan, callable on NumPy arrays.

The end of the compiler core's data flow and what the runtime's TF launch op runs. Each
exports one reentrant native function at `entry_address`,
`void entry(void** params, void** outputs, void* temp)`: the ABI (buffers, the temp
arena, donations, lifetime) is in docs/architecture.md, "The ABI of a compiled executable".
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape

ENTRY_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
TEMP_ALIGNMENT = 64
_IDLE_ARENAS = 4  # per executable, kept between calls


class _Text:
    """A text field given as a string, or as a callable that gives it when the field is
    first read (the LLVM IR texts: only dumps and `experimental_get_compiler_ir` read
    them, and a cache hit or a module compiled in parts would otherwise decompress or
    link them for every executable)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, instance: Any, owner: type | None = None) -> str:
        if instance is None:  # a dataclass field without a default
            raise AttributeError(self.key[1:])
        value = instance.__dict__[self.key]
        if not isinstance(value, str):
            value = instance.__dict__[self.key] = value()
        return value

    def __set__(self, instance: Any, value: str | Callable[[], str]) -> None:
        instance.__dict__[self.key] = value


class Prepared:
    """An attribute of an `Executable` subclass that calls the instance's method `prepare`
    (by name) before each read (a cache hit's parsed module, a background compile's
    code): stored in the instance's `__dict__` under `_<name>`."""

    def __init__(self, prepare: str) -> None:
        self.prepare = prepare

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        getattr(instance, self.prepare)()
        return instance.__dict__[self.key]

    def __set__(self, instance: Any, value: Any) -> None:
        instance.__dict__[self.key] = value


@dataclass(eq=False)
class Executable:
    """A compiled HLO module: its native entry point, buffer plan and every dump."""

    module: HloModule
    assignment: Any  # tfxla_lite.passes.buffer_assignment.BufferAssignment
    parameter_shapes: list[Shape]
    output_shapes: list[Shape]
    temp_bytes: int
    kernel_count: int
    # As emitted, before LLVM's optimization; then as optimized (or callables giving them).
    llvm_ir: str = _Text()  # type: ignore[assignment]
    llvm_ir_optimized: str = _Text()  # type: ignore[assignment]
    entry_address: int
    engine: Any = field(repr=False)  # the llvmlite ExecutionEngine that owns the code
    hlo_text: str = ""  # before tfxla_lite.passes.optimize
    optimized_hlo_text: str = ""
    assignment_text: str = ""
    # Where the machine code came from: "llvm" (compiled for this executable), or a
    # compile cache hit, "memory" or "disk" (codegen/cpu/kernel_cache.py).
    compiled_from: str = "llvm"
    # (output j, parameter i): outputs[j] may be params[i]'s own buffer (see the ABI).
    donations: tuple[tuple[int, int], ...] = ()
    _entry: Any = field(init=False, repr=False)
    # Idle temp arenas, reused by later calls (a fresh large array is a fresh mapping
    # whose pages fault in on every call); a call takes one or makes one.
    _arenas: list[np.ndarray] = field(default_factory=list, init=False, repr=False)
    _arenas_lock: Any = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._entry = ENTRY_SIGNATURE(self.entry_address)

    @property
    def tier(self) -> str:
        """Which LLVM made the code that runs: "o3", or "quick" until a tiered compile's
        O3 code is swapped in (`codegen/cpu/tiers.py`)."""
        return "o3"

    @property
    def ready(self) -> bool:
        """Whether its code can run now (a background compile's may not yet)."""
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile of its code, if any (at most `timeout` seconds);
        whether it is over."""
        return True

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        """Run on NumPy arrays (no TF involved); returns freshly allocated outputs."""
        if len(arrays) != len(self.parameter_shapes):
            raise ValueError(f"{self.module.name} takes {len(self.parameter_shapes)} "
                             f"arguments, got {len(arrays)}")
        inputs = []
        for i, (array, shape) in enumerate(zip(arrays, self.parameter_shapes)):
            array = np.asarray(array)
            if array.dtype != shape.numpy_dtype:
                raise ValueError(f"argument {i} has dtype {array.dtype}, expected "
                                 f"{shape.numpy_dtype} ({shape})")
            if array.shape != shape.dims:
                raise ValueError(f"argument {i} has shape {array.shape}, expected "
                                 f"{shape.dims} ({shape})")
            inputs.append(np.ascontiguousarray(array))
        outputs = [np.empty(shape.dims, dtype=shape.numpy_dtype) for shape in self.output_shapes]
        params = (ctypes.c_void_p * max(1, len(inputs)))(*[a.ctypes.data for a in inputs])
        results = (ctypes.c_void_p * max(1, len(outputs)))(*[o.ctypes.data for o in outputs])
        temp, temp_pointer = self._take_arena()
        try:
            # ctypes releases the GIL for the call: threads run executables in parallel.
            self._entry(ctypes.addressof(params), ctypes.addressof(results), temp_pointer)
        finally:
            self._give_arena(temp)
        del inputs
        return outputs

    def _take_arena(self) -> tuple[np.ndarray | None, int | None]:
        if self.temp_bytes == 0:
            return None, None
        with self._arenas_lock:
            raw = self._arenas.pop() if self._arenas else None
        if raw is None:
            raw = np.empty(self.temp_bytes + TEMP_ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % TEMP_ALIGNMENT
        return raw, raw.ctypes.data + start

    def _give_arena(self, raw: np.ndarray | None) -> None:
        if raw is not None:
            with self._arenas_lock:
                if len(self._arenas) < _IDLE_ARENAS:
                    self._arenas.append(raw)
