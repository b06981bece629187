"""cuBLASLt through ctypes: one `cublasLtMatmul` per kOutput fusion whose epilogue it fuses.

Part of the GPU backend's run time, beside `gemm.py` (the plain cuBLAS GEMM). CuPy binds
cuBLAS but not cuBLASLt (`cupy_backends/cuda/libs` has no cublasLt module up to CuPy 14),
so the handful of functions needed are bound here, with the prototypes and enumerator
values of `cublasLt.h`. The library is the one cuBLAS itself loaded (cuBLAS runs on
cuBLASLt, so once CuPy has a cuBLAS handle, libcublasLt is in the process: its path is
read from /proc/self/maps), else found by name or in the pip wheels (`nvidia/cublas/lib`).

`LtMatmul` is the call for one fusion: the descriptors are made once (the GEMM's
transposes, leading dimensions and batch strides from `gemm.plan_gemm`'s plan, the
epilogue from `lt_epilogue.py`), the algorithm is asked of cuBLASLt's heuristic once per
pointer alignment and bias alignment seen, and a call sets the bias pointer and runs.
Where cuBLASLt offers no algorithm, answers a status instead of running, cannot be loaded,
or the plan or the pointers are ones public users keep away from cuBLASLt (`refusal`, a
bias less than 16 bytes aligned), the executable runs the fusion as before (cuBLAS product
into scratch, then the loop kernel), so a fused plan never fails a build. Each enumerator,
attribute type, prototype and rule used here, with the public source it was checked
against, is listed in docs/gpu.md ("cuBLASLt: the facts the binding relies on").

The function table goes through `ctypes.CFUNCTYPE` prototypes made from addresses, so the
tests can hand it a model of cuBLASLt written against the header on its own
(`tests/gpu/fake_cublaslt.py`): the arguments cross the real C calling convention.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import glob
import itertools
import os
import site
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tfxla_lite.codegen.gpu.gemm import StridedGemm
from tfxla_lite.codegen.gpu.lt_epilogue import LtEpilogue

# cublasLt.h, cublas_api.h and library_types.h enumerators.
CUBLAS_STATUS_SUCCESS = 0
CUBLAS_COMPUTE_32F = 68
CUDA_R_32F = 0
DATA_TYPES = {"f16": 2, "bf16": 14, "f32": 0}  # cudaDataType_t
MATMUL_DESC_TRANSA, MATMUL_DESC_TRANSB, MATMUL_DESC_EPILOGUE = 3, 4, 7
MATMUL_DESC_BIAS_POINTER = 8
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = (5, 6, 7, 8)  # A, B, C, D bytes
WORKSPACE_BYTES = 4 << 20  # cuBLASLt's workspace, from the executable's arena
MAX_ALIGNMENT = 256  # cuBLASLt's default alignment preference
# cuBLAS's documentation of cublasLtMatmul: "The workspace pointer must be aligned to at least
# a multiple of 256 bytes".
WORKSPACE_ALIGNMENT = 256
# The bias pointer has no alignment preference (the heuristic reads it from the descriptor);
# Marian (src/tensors/gpu/prod.cpp) met misaligned-address failures below 8, then 16 bytes
# (A100), and llm.c refuses any cuBLASLt pointer not 16-byte aligned: less runs unfused.
BIAS_ALIGNMENT = 16
# PyTorch keeps cuBLASLt away from dimensions of 65535 * 32 or more before CUDA 12.1
# (aten/src/ATen/native/cuda/Blas.cpp); this binding does not read the library's version.
MAX_DIMENSION = 65535 * 32


class MatmulAlgo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: uint64_t data[8]."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [("algo", MatmulAlgo), ("workspace_size", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves_count", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


_P = ctypes.c_void_p
_OUT = ctypes.POINTER(ctypes.c_void_p)  # where a Create function writes its descriptor
# name -> argument types; every function returns cublasStatus_t (int).
PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "cublasLtCreate": (_OUT,),
    "cublasLtMatmulDescCreate": (_OUT, ctypes.c_int, ctypes.c_int),
    "cublasLtMatmulDescDestroy": (_P,),
    "cublasLtMatmulDescSetAttribute": (_P, ctypes.c_int, _P, ctypes.c_size_t),
    "cublasLtMatrixLayoutCreate": (_OUT, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                   ctypes.c_int64),
    "cublasLtMatrixLayoutDestroy": (_P,),
    "cublasLtMatrixLayoutSetAttribute": (_P, ctypes.c_int, _P, ctypes.c_size_t),
    "cublasLtMatmulPreferenceCreate": (_OUT,),
    "cublasLtMatmulPreferenceDestroy": (_P,),
    "cublasLtMatmulPreferenceSetAttribute": (_P, ctypes.c_int, _P, ctypes.c_size_t),
    "cublasLtMatmulAlgoGetHeuristic": (_P, _P, _P, _P, _P, _P, _P, ctypes.c_int,
                                       ctypes.POINTER(HeuristicResult),
                                       ctypes.POINTER(ctypes.c_int)),
    "cublasLtMatmul": (_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
                       ctypes.POINTER(MatmulAlgo), _P, ctypes.c_size_t, _P),
}


class Library:
    """cuBLASLt's functions, called through `PROTOTYPES` at the addresses `address_of`
    gives (a loaded libcublasLt's symbols, or a model's callbacks)."""

    def __init__(self, address_of: Callable[[str], int], name: str = "libcublasLt") -> None:
        self.name = name
        # Kept: a model's `address_of` is a bound method, and its object owns the
        # callbacks the addresses point at (freed with it, a call would jump into freed
        # memory).
        self._address_of = address_of
        self._functions = {fn: ctypes.CFUNCTYPE(ctypes.c_int, *args)(address_of(fn))
                           for fn, args in PROTOTYPES.items()}
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()

    def call(self, function: str, *args: Any) -> None:
        status = self._functions[function](*args)
        if status != CUBLAS_STATUS_SUCCESS:
            raise RuntimeError(f"{function} failed: cublasStatus_t {status}")

    def create(self, function: str, *args: Any) -> int:
        """Call a Create function; the descriptor it made."""
        made = ctypes.c_void_p()
        self.call(function, ctypes.byref(made), *args)
        return int(made.value or 0)

    def handle(self, device: int) -> int:
        """One cuBLASLt handle per device for the process (made on first use)."""
        with self._lock:
            if device not in self._handles:
                self._handles[device] = self.create("cublasLtCreate")
            return self._handles[device]


def set_attribute(library: Library, function: str, descriptor: int, attribute: int,
                  value: Any) -> None:
    """`function` (a SetAttribute) with `value`, a ctypes scalar: its address and size,
    which cuBLASLt checks against the attribute's own type."""
    library.call(function, descriptor, attribute, ctypes.byref(value), ctypes.sizeof(value))


def _loaded_path() -> str | None:
    """The libcublasLt this process has loaded already (through cuBLAS), if any."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "libcublasLt.so" in os.path.basename(path):
                    return path
    return None


def _candidates() -> list[str]:
    found = [p for p in (_loaded_path(), ctypes.util.find_library("cublasLt")) if p]
    found += [f"libcublasLt.so.{v}" for v in (13, 12, 11)]
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    found += [p for root in roots if root
              for p in sorted(glob.glob(os.path.join(root, "lib64", "libcublasLt.so*")))]
    with contextlib.suppress(Exception):
        for root in site.getsitepackages() + [site.getusersitepackages()]:
            found += sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib",
                                                   "libcublasLt.so*")))
    return found


def _address(dll: ctypes.CDLL, function: str) -> int:
    return int(ctypes.cast(getattr(dll, function), ctypes.c_void_p).value or 0)


def open_library() -> Library:
    """The process's libcublasLt, bound; raises OSError saying where it looked."""
    for path in _candidates():
        try:
            dll = ctypes.CDLL(path)
        except OSError:
            continue
        return Library(functools.partial(_address, dll), path)
    raise OSError("libcublasLt not found (loaded by cuBLAS, by name, under CUDA_PATH or in "
                  "the nvidia-cublas wheel)")


_lock = threading.Lock()
_library: tuple[Library | None, str] | None = None
_override: list[tuple[Library | None, str]] = []


def library(cupy: Any) -> tuple[Library | None, str]:
    """(cuBLASLt bound, "") or (None, why not), worked out once per process."""
    global _library
    if _override:
        return _override[-1]
    with _lock:
        if _library is None:
            with contextlib.suppress(Exception):
                cupy.cuda.get_cublas_handle()  # loads libcublas, and with it libcublasLt
            try:
                _library = (open_library(), "")
            except OSError as error:
                _library = (None, str(error))
        return _library


@contextlib.contextmanager
def use_library(replacement: Library | None, reason: str = "") -> Iterator[Library | None]:
    """Bind `replacement` instead of libcublasLt inside the block (the tests' model), or
    none (`reason` saying why): a stand-in CuPy must never reach the real library."""
    entry = (replacement, reason)
    _override.append(entry)
    try:
        yield replacement
    finally:
        _override.remove(entry)


def _stored_dims(gemm: StridedGemm) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, columns) of A = op(rhs^T) and B = op(lhs^T) as stored, column-major (the
    layouts' dimensions: for op T the stored matrix is the transpose of op(X))."""
    g = gemm
    return ((g.k, g.n) if g.rhs.transpose else (g.n, g.k),
            (g.m, g.k) if g.lhs.transpose else (g.k, g.m))


def refusal(gemm: StridedGemm) -> str | None:
    """Why `gemm`'s plan is not given to cuBLASLt at all, or None. Before CUDA 12.1,
    PyTorch's addmm takes its cuBLASLt path only where every dimension is below 65535 * 32
    and 16-bit operands are dense (its comment: to "skip 16b transA and non-trans-B having
    leading dim >> rows when they are sliced from a large tensor"); the binding does not
    read the library's version, so both hold for every version here."""
    g = gemm
    if max(g.m, g.n, g.k) >= MAX_DIMENSION:
        return (f"a dimension of {max(g.m, g.n, g.k)} (m, n, k = {g.m}, {g.n}, {g.k}) is not "
                f"below 65535 * 32")
    if g.element_type in ("f16", "bf16"):
        for name, operand, (rows, _) in zip(("rhs", "lhs"), (g.rhs, g.lhs), _stored_dims(g),
                                            strict=True):
            if operand.ld != max(1, rows):
                return (f"the {g.element_type} {name} is read with leading dimension "
                        f"{operand.ld} over {rows} rows (not dense)")
    return None


class LtMatmul:
    """One kOutput fusion as a cuBLASLt matmul with its epilogue, for `gemm`'s plan (the
    same operand reading as `gemm.run_gemm`: D^T = op(rhs^T) . op(lhs^T), column-major
    n x m, so the bias runs along D's n rows, the output's minor dimensions)."""

    def __init__(self, library: Library, gemm: StridedGemm, epilogue: LtEpilogue,
                 device: int) -> None:
        g, lib = gemm, library
        self.library, self.gemm, self.epilogue = library, gemm, epilogue
        self.handle = lib.handle(device)
        self.desc = lib.create("cublasLtMatmulDescCreate", CUBLAS_COMPUTE_32F, CUDA_R_32F)
        desc_attr = "cublasLtMatmulDescSetAttribute"
        set_attribute(lib, desc_attr, self.desc, MATMUL_DESC_TRANSA,
                      ctypes.c_int32(int(g.rhs.transpose)))
        set_attribute(lib, desc_attr, self.desc, MATMUL_DESC_TRANSB,
                      ctypes.c_int32(int(g.lhs.transpose)))
        set_attribute(lib, desc_attr, self.desc, MATMUL_DESC_EPILOGUE,
                      ctypes.c_uint32(epilogue.code))
        data = DATA_TYPES[g.element_type]
        a_dims, b_dims = _stored_dims(g)
        self.layouts = [self._layout(data, *a_dims, g.rhs.ld, g.rhs.batch_stride),
                        self._layout(data, *b_dims, g.lhs.ld, g.lhs.batch_stride),
                        self._layout(data, g.n, g.m, max(1, g.n), g.m * g.n)]
        self.preference = lib.create("cublasLtMatmulPreferenceCreate")
        set_attribute(lib, "cublasLtMatmulPreferenceSetAttribute", self.preference,
                      PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE_BYTES))
        # Per (alignment of A, B, C, D and the bias, the bias's own alignment).
        self._algorithms: dict[tuple[int, int], HeuristicResult | None] = {}
        self._lock = threading.Lock()
        self._one, self._zero = ctypes.byref(ctypes.c_float(1.0)), ctypes.byref(ctypes.c_float(0.0))
        # Byte offsets of lhs, rhs and out per looped batch index (none: one call).
        size = {"f16": 2, "bf16": 2, "f32": 4}[g.element_type]
        self._shifts = [tuple(size * sum(i * s for i, s in zip(index, strides, strict=True))
                              for strides in (g.lhs.outer_strides, g.rhs.outer_strides,
                                              g.out_outer_strides))
                        for index in _outer_indices(g.outer)]
        self._bias: int | None = None  # the bias pointer the descriptor holds
        self._matmul = library._functions["cublasLtMatmul"]
        self.calls = self.refused = 0
        self.failures: list[str] = []  # statuses cuBLASLt answered instead of running

    def _layout(self, data: int, rows: int, cols: int, ld: int, stride: int) -> int:
        layout = self.library.create("cublasLtMatrixLayoutCreate", data, rows, cols, ld)
        if self.gemm.batch > 1:
            set_attribute(self.library, "cublasLtMatrixLayoutSetAttribute", layout,
                          LAYOUT_BATCH_COUNT, ctypes.c_int32(self.gemm.batch))
            set_attribute(self.library, "cublasLtMatrixLayoutSetAttribute", layout,
                          LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride))
        return layout

    def _algorithm(self, key: tuple[int, int]) -> HeuristicResult | None:
        """cuBLASLt's first algorithm for pointers of `key[0]` bytes' alignment and a bias
        of `key[1]`'s. The bias pointer is set already: cublasLt.h says the heuristic
        "depend[s] on its value to determine expected pointer alignment", so an algorithm
        found for one bias alignment is not reused for a less aligned bias."""
        alignment = key[0]
        if key not in self._algorithms:
            lib = self.library
            for attribute in PREF_MIN_ALIGNMENT:
                set_attribute(lib, "cublasLtMatmulPreferenceSetAttribute", self.preference,
                              attribute, ctypes.c_uint32(alignment))
            result, count = HeuristicResult(), ctypes.c_int(0)
            a, b, d = self.layouts
            # NOT_SUPPORTED (no heuristic for this configuration) is a refusal, not an error.
            status = lib._functions["cublasLtMatmulAlgoGetHeuristic"](
                self.handle, self.desc, a, b, d, d, self.preference, 1, ctypes.byref(result),
                ctypes.byref(count))
            if status != CUBLAS_STATUS_SUCCESS:
                self.failures.append(f"cublasLtMatmulAlgoGetHeuristic: cublasStatus_t {status}")
            usable = status == CUBLAS_STATUS_SUCCESS and count.value > 0 and \
                result.state == CUBLAS_STATUS_SUCCESS and result.workspace_size <= WORKSPACE_BYTES
            self._algorithms[key] = result if usable else None
        return self._algorithms[key]

    def run(self, lhs: int, rhs: int, out: int, bias: int | None, workspace: int,
            stream: int) -> bool:
        """`out = epilogue(dot(lhs, rhs))` on device pointers (dense operands as the plan
        reads them, copies made); False, having done nothing, where cuBLASLt has no
        algorithm for these pointers' alignment, or the bias is less than BIAS_ALIGNMENT or
        the workspace less than WORKSPACE_ALIGNMENT bytes aligned (the caller then runs the
        unfused path)."""
        # Alignments: the largest power of two up to MAX_ALIGNMENT dividing the pointers
        # (x & -x of x | MAX_ALIGNMENT), inline since this runs per call.
        combined = lhs | rhs | out | MAX_ALIGNMENT
        bias_alignment = MAX_ALIGNMENT
        if bias is not None:
            bias_alignment = (bias | MAX_ALIGNMENT) & -(bias | MAX_ALIGNMENT)
            combined |= bias
        if bias_alignment < BIAS_ALIGNMENT or workspace % WORKSPACE_ALIGNMENT:
            self.refused += 1
            return False
        shifts = self._shifts
        if len(shifts) > 1:
            for shift in shifts:
                combined |= shift[0] | shift[1] | shift[2]
        key = (combined & -combined, bias_alignment)
        lib, (a, b, d) = self.library, self.layouts
        with self._lock:  # the descriptor's bias pointer is per call
            if bias is not None and bias != self._bias:
                set_attribute(lib, "cublasLtMatmulDescSetAttribute", self.desc,
                              MATMUL_DESC_BIAS_POINTER, ctypes.c_void_p(bias))
                self._bias = bias
            found = self._algorithm(key)
            if found is None:
                self.refused += 1
                return False
            algo = ctypes.byref(found.algo)
            for lhs_shift, rhs_shift, out_shift in shifts:
                status = self._matmul(self.handle, self.desc, self._one, rhs + rhs_shift, a,
                                      lhs + lhs_shift, b, self._zero, out + out_shift, d,
                                      out + out_shift, d, algo, workspace, WORKSPACE_BYTES,
                                      stream)
                if status != CUBLAS_STATUS_SUCCESS:
                    # Refused before running (an invalid or unsupported configuration):
                    # the caller's unfused path rewrites the whole output; this alignment
                    # is not tried again.
                    self.failures.append(f"cublasLtMatmul: cublasStatus_t {status}")
                    self._algorithms[key] = None
                    self.refused += 1
                    return False
            self.calls += 1
        return True

    def close(self) -> None:
        """Destroy the descriptors (the handle stays with the library)."""
        lib = self.library
        for layout in self.layouts:
            lib.call("cublasLtMatrixLayoutDestroy", layout)
        lib.call("cublasLtMatmulPreferenceDestroy", self.preference)
        lib.call("cublasLtMatmulDescDestroy", self.desc)
        self.layouts = []

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Not at interpreter exit: the library's functions (or a model's callbacks) may be
        # gone by then, and module globals (contextlib...) may be None; the process's end
        # frees the descriptors anyway.
        if _finalizing():
            return
        try:
            if self.layouts:
                self.close()
        except Exception:  # a finalizer must not raise
            pass


def _outer_indices(outer: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(s) for s in outer)) if outer else iter([()])

