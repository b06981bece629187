"""A stand-in for CuPy on machines without a GPU: NumPy memory, kernels that only check
how they are called.

`GpuExecutable` is the one piece of the GPU backend that needs CuPy. With this module
installed as `cupy`, its Python side runs for real: the arena and its views, the thunk
order, the arguments of every launch (checked against the kernel's own parameter list in
the CUDA source: count, order, element types, block size against `__launch_bounds__`),
and the cuBLAS dots: `gemm_strided_batched_ex` models `cublasGemmStridedBatchedEx` on the
raw pointers, flags, leading dimensions and strides it is given (`test_gpu_gemm.py`
checks it against cuBLAS's definition). Generated kernels do not run (a launch records
itself and writes nothing) unless `emulate` runs them on `cuda_emulator`.
"""

from __future__ import annotations

import ctypes
import re
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_STORAGE = {"bool": np.bool_, "signed char": np.int8, "short": np.int16, "int": np.int32,
            "long long": np.int64, "unsigned char": np.uint8, "unsigned short": np.uint16,
            "unsigned int": np.uint32, "unsigned long long": np.uint64, "__half": np.float16,
            "float": np.float32, "double": np.float64}
try:
    import ml_dtypes

    _STORAGE["__nv_bfloat16"] = ml_dtypes.bfloat16
except ImportError:  # pragma: no cover
    pass


_LIVE: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def _register(memory: np.ndarray) -> None:
    """Remember a device allocation, so that cuBLAS's reads and writes through raw
    pointers are checked to stay inside one (`_memory_at`)."""
    root = memory
    while isinstance(root.base, np.ndarray):
        root = root.base
    _LIVE[id(root)] = root


class MemoryPointer:
    def __init__(self, base: np.ndarray, offset: int = 0) -> None:
        self.base, self.offset = base, offset

    @property
    def ptr(self) -> int:
        return self.base.ctypes.data + self.offset

    def __add__(self, offset: int) -> MemoryPointer:
        return MemoryPointer(self.base, self.offset + offset)


class FakeArray:
    """A device array: NumPy memory behind CuPy's few attributes the executable uses."""

    def __init__(self, array: np.ndarray, base: np.ndarray | None = None,
                 offset: int = 0) -> None:
        self.array = array
        self._base = base if base is not None else array
        self._offset = offset
        _register(self._base)

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)
    ndim = property(lambda self: self.array.ndim)

    @property
    def data(self) -> MemoryPointer:
        base = self._base.reshape(-1)
        return MemoryPointer(base.view(np.uint8) if base.size else np.zeros(1, np.uint8),
                             self._offset)

    def reshape(self, *shape: Any) -> FakeArray:
        return FakeArray(self.array.reshape(*shape))

    def transpose(self, axes: list[int]) -> FakeArray:
        return FakeArray(self.array.transpose(axes))

    def view(self, dtype: Any) -> FakeArray:
        return FakeArray(self.array.view(dtype), self._base, self._offset)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, FakeArray) and not value.array.flags.c_contiguous:
            RECORDER.operand_copies += 1  # a strided read: one copy kernel on a GPU
        self.array[key] = value.array if isinstance(value, FakeArray) else value

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.array.__dlpack__()  # host memory: nothing to order with a stream

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.array.__dlpack_device__()


@dataclass
class Launch:
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    arguments: list[FakeArray]


@dataclass
class Gemm:
    """One `gemmStridedBatchedEx` call, as cuBLAS receives it."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    stride_a: int
    ldb: int
    stride_b: int
    ldc: int
    stride_c: int
    batch: int
    data_type: int
    compute_type: int


@dataclass
class Recorder:
    launches: list[Launch] = field(default_factory=list)
    gemms: list[Gemm] = field(default_factory=list)
    operand_copies: int = 0  # strided arrays copied densely (a copy kernel on a GPU)
    # Host waits: `Device.synchronize` (the whole device) and `Stream.synchronize`.
    device_syncs: int = 0
    stream_syncs: int = 0


RECORDER = Recorder()
ALLOCATION_ALIGNMENT = 256


class RawModule:
    emulate = False  # run kernels on the CPU (`cuda_emulator`) instead of only checking

    def __init__(self, code: str, options: tuple[str, ...] = ()) -> None:
        assert "--std=c++17" in options
        self.code = code
        self.emulated = None
        if self.emulate:
            from cuda_emulator import EmulatedModule

            self.emulated = EmulatedModule.of(code)
        self.signatures: dict[str, tuple[int, list[str]]] = {}
        pattern = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\('
                             r'([^)]*)\)')
        for threads, name, params in pattern.findall(code):
            types_ = [re.sub(r"^const |\*.*$", "", p.strip()).strip()
                      for p in params.split(",")]
            self.signatures[name] = (int(threads), types_)

    def get_function(self, name: str) -> Any:
        if name not in self.signatures:
            raise KeyError(f"no kernel {name} in the module")
        threads, types_ = self.signatures[name]

        def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
            assert len(args) == len(types_), (name, len(args), types_)
            for arg, c_type in zip(args, types_):
                if c_type != "void":
                    assert arg.dtype == np.dtype(_STORAGE[c_type]), (name, arg.dtype, c_type)
            assert grid[0] >= 1 and int(np.prod(block)) == threads, (name, grid, block)
            RECORDER.launches.append(Launch(name, grid, block, list(args)))
            if self.emulated is not None:
                self.emulated.launch(name, grid[0], (block[0], block[1]),
                                     [a.data.ptr for a in args])

        return launch


def _aligned_zeros(shape: Any, dtype: Any) -> np.ndarray:
    """Zeros starting at a multiple of 256 bytes, as CuPy's memory pool allocates (TF
    also checks the alignment of CPU tensors it receives by DLPack)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.zeros(count * dtype.itemsize + ALLOCATION_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALLOCATION_ALIGNMENT
    return raw[start:start + count * dtype.itemsize].view(dtype).reshape(shape)


def _from_dlpack(value: Any) -> FakeArray:
    """CuPy's `from_dlpack` over host memory: the producer's bytes, not a copy."""
    return FakeArray(np.from_dlpack(value))


def _asarray(value: Any) -> FakeArray:
    return value if isinstance(value, FakeArray) else FakeArray(np.asarray(value))


def _ndarray(shape: tuple[int, ...], dtype: Any, memptr: MemoryPointer) -> FakeArray:
    view = np.ndarray(shape, dtype=dtype, buffer=memptr.base, offset=memptr.offset)
    return FakeArray(view, memptr.base, memptr.offset)


def _ascontiguousarray(value: Any) -> FakeArray:
    array = _asarray(value).array
    if not array.flags.c_contiguous:
        RECORDER.operand_copies += 1  # CuPy copies only then, as NumPy does
    return FakeArray(np.ascontiguousarray(array))


# cuBLAS's and the CUDA runtime's enumerators, with the values of their headers.
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F = 68, 70
CUBLAS_GEMM_DEFAULT = -1
CUDA_TYPES: dict[int, Any] = {2: np.float16, 0: np.float32, 1: np.float64}  # R_16F, _32F, _64F
CUDA_R_16BF = 14
if "__nv_bfloat16" in _STORAGE:
    CUDA_TYPES[CUDA_R_16BF] = _STORAGE["__nv_bfloat16"]


class CublasError(RuntimeError):
    """CUBLAS_STATUS_INVALID_VALUE and friends: what cuBLAS refuses before computing."""


def _memory_at(pointer: int, dtype: np.dtype, elements: int) -> np.ndarray:
    """`elements` of `dtype` from the raw address `pointer`, which must lie inside one
    live allocation (a real GPU would fault or read another buffer's bytes)."""
    end = pointer + elements * dtype.itemsize
    for root in list(_LIVE.values()):
        start = root.ctypes.data
        if start <= pointer and end <= start + root.nbytes:
            raw = (ctypes.c_uint8 * (end - pointer)).from_address(pointer)
            return np.frombuffer(raw, dtype=dtype)
    raise CublasError(f"cuBLAS would access [{pointer:#x}, {end:#x}) outside any allocation")


def _strided_matrices(pointer: int, dtype: np.dtype, rows: int, cols: int, ld: int,
                      stride: int, batch: int) -> np.ndarray:
    """The column-major rows x cols matrices at `pointer` (element (i, j) of matrix b at
    i + j*ld + b*stride), as a (batch, rows, cols) NumPy view of that memory."""
    extent = (rows - 1) + (cols - 1) * ld + (batch - 1) * stride + 1
    memory = _memory_at(pointer, dtype, extent)
    size = dtype.itemsize
    return np.lib.stride_tricks.as_strided(memory, (batch, rows, cols),
                                           (stride * size, size, ld * size))


def gemm_strided_batched_ex(handle: int, transa: int, transb: int, m: int, n: int, k: int,
                            alpha: int, a: int, a_type: int, lda: int, stride_a: int,
                            b: int, b_type: int, ldb: int, stride_b: int, beta: int,
                            c: int, c_type: int, ldc: int, stride_c: int, batch: int,
                            compute_type: int, algo: int) -> None:
    """`cublasGemmStridedBatchedEx` over host memory, for every batch index b:
    C_b = alpha * op(A_b) . op(B_b) + beta * C_b, column-major, each matrix at its
    pointer plus b times its stride; op(X) is X (`CUBLAS_OP_N`) or its transpose, so A is
    stored m x k (N) or k x m (T) with leading dimension lda, B k x n or n x k, C m x n.
    Products accumulate in the compute type (f32 for 2-byte inputs) and round once into
    C's type; C is not read when beta is 0 (cuBLAS's rule: NaNs there do not leak)."""
    assert handle and algo == CUBLAS_GEMM_DEFAULT
    if a_type != b_type or a_type != c_type or a_type not in CUDA_TYPES:
        raise CublasError(f"unsupported types {a_type}, {b_type}, {c_type}")
    dtype = np.dtype(CUDA_TYPES[a_type])
    compute = {CUBLAS_COMPUTE_32F: np.dtype(np.float32),
               CUBLAS_COMPUTE_64F: np.dtype(np.float64)}[compute_type]
    if (compute == np.float64) != (dtype == np.float64):
        raise CublasError(f"compute type {compute_type} with data type {a_type}")
    a_rows, a_cols = (m, k) if transa == CUBLAS_OP_N else (k, m)
    b_rows, b_cols = (k, n) if transb == CUBLAS_OP_N else (n, k)
    if min(m, n, k, batch) < 0 or lda < max(1, a_rows) or ldb < max(1, b_rows) or \
            ldc < max(1, m) or transa not in (0, 1) or transb not in (0, 1):
        raise CublasError(f"invalid value: m={m} n={n} k={k} lda={lda} ldb={ldb} ldc={ldc}")
    RECORDER.gemms.append(Gemm(transa, transb, m, n, k, lda, stride_a, ldb, stride_b, ldc,
                               stride_c, batch, a_type, compute_type))
    if m * n * batch == 0:
        return
    c_matrices = _strided_matrices(c, dtype, m, n, ldc, stride_c, batch)
    if k == 0:
        product = np.zeros((batch, m, n), compute)
    else:
        a_matrices = _strided_matrices(a, dtype, a_rows, a_cols, lda, stride_a, batch)
        b_matrices = _strided_matrices(b, dtype, b_rows, b_cols, ldb, stride_b, batch)
        if transa == CUBLAS_OP_T:
            a_matrices = a_matrices.transpose(0, 2, 1)
        if transb == CUBLAS_OP_T:
            b_matrices = b_matrices.transpose(0, 2, 1)
        product = np.matmul(a_matrices.astype(compute), b_matrices.astype(compute))
    # alpha and beta: host pointers (CuPy's default pointer mode), read as cuBLAS does.
    scale, shift = (np.frombuffer((ctypes.c_uint8 * compute.itemsize).from_address(p),
                                  dtype=compute)[0] for p in (alpha, beta))
    if scale != 1:
        product = product * scale
    if shift != 0:
        product = product + shift * c_matrices.astype(compute)
    assert c_matrices.flags.writeable
    c_matrices[...] = product.astype(dtype)  # overlapping outputs are undefined in cuBLAS


class Device:
    def __init__(self, device: int = 0) -> None:
        self.id = device
        self.attributes = {"MultiProcessorCount": 4}

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def synchronize(self) -> None:
        RECORDER.device_syncs += 1


class Stream:
    """CuPy's current stream (the legacy default stream: pointer 0)."""

    ptr = 0

    def synchronize(self) -> None:
        RECORDER.stream_syncs += 1


_STREAM = Stream()


def module(emulate: bool = False) -> types.ModuleType:
    """A fresh `cupy` stand-in (install it in `sys.modules`); with `emulate`, kernels run
    on the CPU through `cuda_emulator`."""
    fake = types.ModuleType("cupy")
    fake.RawModule = type("RawModule", (RawModule,), {"emulate": emulate})  # type: ignore
    fake.asarray = _asarray  # type: ignore[attr-defined]
    fake.ascontiguousarray = _ascontiguousarray  # type: ignore[attr-defined]
    fake.empty = lambda shape, dtype=np.float32: FakeArray(  # type: ignore[attr-defined]
        _aligned_zeros(shape, dtype))
    fake.ndarray = _ndarray  # type: ignore[attr-defined]
    fake.asnumpy = lambda a: np.array(_asarray(a).array)  # type: ignore[attr-defined]
    fake.from_dlpack = _from_dlpack  # type: ignore[attr-defined]
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device = Device  # type: ignore[attr-defined]
    cuda.runtime = types.SimpleNamespace(  # type: ignore[attr-defined]
        getDeviceCount=lambda: 1, CUDA_R_16F=2, CUDA_R_32F=0, CUDA_R_64F=1,
        CUDA_R_16BF=CUDA_R_16BF)
    cuda.cublas = types.SimpleNamespace(  # type: ignore[attr-defined]
        CUBLAS_OP_N=CUBLAS_OP_N, CUBLAS_OP_T=CUBLAS_OP_T,
        CUBLAS_COMPUTE_32F=CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_64F=CUBLAS_COMPUTE_64F,
        CUBLAS_GEMM_DEFAULT=CUBLAS_GEMM_DEFAULT,
        gemmStridedBatchedEx=gemm_strided_batched_ex)
    cuda.get_cublas_handle = lambda: 1  # type: ignore[attr-defined]
    cuda.get_current_stream = lambda: _STREAM  # type: ignore[attr-defined]
    cuda.get_cuda_path = lambda: None  # type: ignore[attr-defined]
    fake.cuda = cuda  # type: ignore[attr-defined]
    return fake
