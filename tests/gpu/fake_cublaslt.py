"""A model of cuBLASLt for machines without a GPU: the dozen functions `codegen/gpu/
cublaslt.py` binds, as C callbacks over host memory.

Written from `cublasLt.h` on its own (prototypes, attribute numbers and sizes, the
heuristic result's layout), not from the binding: the binding calls these callbacks
through its own `CFUNCTYPE` prototypes, so every argument crosses the C calling
convention, and a SetAttribute whose size is not the attribute's type's is refused
(`CUBLAS_STATUS_INVALID_VALUE`), as cuBLASLt refuses it. `cublasLtMatmul` computes
D = alpha * op(A) op(B) + beta * C from the layouts' types, rows, columns, leading
dimensions and batch strides and then the epilogue the descriptor names (bias along D's
rows from the bias pointer, relu as max(x, 0)), in f32, rounded once into D's type: a
wrong transpose, layout or epilogue attribute gives wrong numbers. Accesses are checked to
stay inside one live allocation (`fake_cupy._memory_at`).

Documented rules it keeps: the workspace pointer must be 256-byte aligned (cuBLAS's
documentation of cublasLtMatmul), else CUBLAS_STATUS_INVALID_VALUE; the heuristic reads the
bias pointer from the descriptor "to determine expected pointer alignment" (cublasLt.h), so
the algorithm it returns records that alignment and refuses a less aligned bias.
Observed by public users, kept as such: the heuristic answers INVALID_VALUE for a GEMM with
a dimension of 1 (PyTorch's addmm, aten/src/ATen/native/cuda/Blas.cpp), and a bias pointer
less than 16-byte aligned fails with a misaligned address at run time (Marian's
src/tensors/gpu/prod.cpp; llm.c checks 16): recorded in `errors` (a test fails) and
answered CUBLAS_STATUS_EXECUTION_FAILED, since a device fault is not a refusal.

Model choices, not cuBLASLt facts: the heuristic offers one algorithm, whose workspace is
`workspace` bytes and which needs every pointer aligned to the preference's minimum
alignment; it offers none below `min_alignment` (2 bytes by default: any element-aligned
pointer, which cuBLASLt is understood to serve, more slowly), which the tests raise to
force the executable's fallback. NaN in relu: `np.maximum` (NaN stays NaN); cuBLASLt's
behaviour there is not documented.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Any

import fake_cupy
import numpy as np

SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED, INTERNAL_ERROR = 0, 1, 7, 15, 14
EXECUTION_FAILED = 13
WORKSPACE_ALIGNMENT, BIAS_FAULT_ALIGNMENT = 256, 16
# attribute -> size in bytes (cublasLt.h: the attribute's type).
DESC_SIZES = {0: 4, 1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4, 7: 4, 8: 8, 10: 8, 11: 8, 12: 8,
              13: 8, 14: 8, 15: 4}
LAYOUT_SIZES = {0: 4, 1: 4, 2: 8, 3: 8, 4: 8, 5: 4, 6: 8, 7: 8}
PREFERENCE_SIZES = {0: 4, 1: 8, 3: 4, 5: 4, 6: 4, 7: 4, 8: 4, 9: 4, 10: 4, 11: 4, 12: 8}
UNPACK = {4: "<i", 8: "<q"}
EPILOGUE_DEFAULT, EPILOGUE_RELU, EPILOGUE_BIAS, EPILOGUE_RELU_BIAS = 1, 2, 4, 6
ALGO_MARK = 0x1A160
HEURISTIC_RESULT_BYTES = 96  # algo (64), workspaceSize (8), state (4), waves (4), 4 ints

_V, _I, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_PROTOTYPES: dict[str, tuple[Any, ...]] = {
    "cublasLtCreate": (_V,),
    "cublasLtMatmulDescCreate": (_V, _I, _I),
    "cublasLtMatmulDescDestroy": (_V,),
    "cublasLtMatmulDescSetAttribute": (_V, _I, _V, _S),
    "cublasLtMatrixLayoutCreate": (_V, _I, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64),
    "cublasLtMatrixLayoutDestroy": (_V,),
    "cublasLtMatrixLayoutSetAttribute": (_V, _I, _V, _S),
    "cublasLtMatmulPreferenceCreate": (_V,),
    "cublasLtMatmulPreferenceDestroy": (_V,),
    "cublasLtMatmulPreferenceSetAttribute": (_V, _I, _V, _S),
    "cublasLtMatmulAlgoGetHeuristic": (_V, _V, _V, _V, _V, _V, _V, _I, _V, _V),
    "cublasLtMatmul": (_V, _V, _V, _V, _V, _V, _V, _V, _V, _V, _V, _V, _V, _V, _S, _V),
}


@dataclass
class LtCall:
    """One cublasLtMatmul, as the model read it."""

    epilogue: int
    transa: int
    transb: int
    m: int
    n: int
    k: int
    batch: int
    bias: int
    data_type: int
    alignment: int


@dataclass
class FakeCublasLt:
    min_alignment: int = 2
    workspace: int = 1 << 16
    # Statuses to answer instead (NOT_SUPPORTED and the like), for the fallback tests.
    heuristic_status: int = SUCCESS
    matmul_status: int = SUCCESS
    objects: dict[int, dict[str, Any]] = field(default_factory=dict)
    calls: list[LtCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # exceptions inside callbacks
    heuristic_queries: int = 0
    _next: int = 0x1000

    def __post_init__(self) -> None:
        self._callbacks = {}
        for name, args in _PROTOTYPES.items():
            body = getattr(self, "_" + name.removeprefix("cublasLt"))
            self._callbacks[name] = ctypes.CFUNCTYPE(ctypes.c_int, *args)(self._guard(body))

    def address_of(self, name: str) -> int:
        return int(ctypes.cast(self._callbacks[name], ctypes.c_void_p).value or 0)

    def live(self, kind: str) -> int:
        return sum(o["kind"] == kind for o in self.objects.values())

    def _guard(self, body: Any) -> Any:
        def call(*args: Any) -> int:
            try:
                return int(body(*args))
            except Exception as error:  # noqa: BLE001 - a C caller cannot take exceptions
                self.errors.append(f"{body.__name__}: {type(error).__name__}: {error}")
                return INTERNAL_ERROR
        return call

    def _new(self, out: int | None, kind: str, **values: Any) -> int:
        self._next += 0x100
        self.objects[self._next] = {"kind": kind, **values}
        ctypes.c_void_p.from_address(out).value = self._next  # type: ignore[arg-type]
        return SUCCESS

    def _object(self, address: int | None, kind: str) -> dict[str, Any]:
        found = self.objects.get(address or 0)
        if found is None or found["kind"] != kind:
            raise ValueError(f"no live {kind} at {address}")
        return found

    def _set(self, address: int | None, kind: str, sizes: dict[int, int], attribute: int,
             buffer: int | None, size: int) -> int:
        target = self._object(address, kind)
        if attribute not in sizes or size != sizes[attribute] or not buffer:
            return INVALID_VALUE
        raw = ctypes.string_at(buffer, size)
        target.setdefault("attributes", {})[attribute] = struct.unpack(UNPACK[size], raw)[0]
        return SUCCESS

    # -- the C functions -------------------------------------------------------------------
    def _Create(self, out: int | None) -> int:
        return self._new(out, "handle")

    def _MatmulDescCreate(self, out: int | None, compute: int, scale: int) -> int:
        if compute != 68 or scale != 0:  # CUBLAS_COMPUTE_32F, CUDA_R_32F: all we model
            return NOT_SUPPORTED
        return self._new(out, "desc", compute=compute, scale=scale)

    def _MatmulDescSetAttribute(self, desc: int | None, attribute: int, buffer: int | None,
                                size: int) -> int:
        return self._set(desc, "desc", DESC_SIZES, attribute, buffer, size)

    def _MatrixLayoutCreate(self, out: int | None, data_type: int, rows: int, cols: int,
                            ld: int) -> int:
        if data_type not in fake_cupy.CUDA_TYPES or ld < max(1, rows):
            return INVALID_VALUE
        return self._new(out, "layout", type=data_type, rows=rows, cols=cols, ld=ld)

    def _MatrixLayoutSetAttribute(self, layout: int | None, attribute: int,
                                  buffer: int | None, size: int) -> int:
        return self._set(layout, "layout", LAYOUT_SIZES, attribute, buffer, size)

    def _MatmulPreferenceCreate(self, out: int | None) -> int:
        return self._new(out, "preference")

    def _MatmulPreferenceSetAttribute(self, preference: int | None, attribute: int,
                                      buffer: int | None, size: int) -> int:
        return self._set(preference, "preference", PREFERENCE_SIZES, attribute, buffer, size)

    def _destroy(self, address: int | None, kind: str) -> int:
        self._object(address, kind)
        del self.objects[address]  # type: ignore[arg-type]
        return SUCCESS

    def _MatmulDescDestroy(self, desc: int | None) -> int:
        return self._destroy(desc, "desc")

    def _MatrixLayoutDestroy(self, layout: int | None) -> int:
        return self._destroy(layout, "layout")

    def _MatmulPreferenceDestroy(self, preference: int | None) -> int:
        return self._destroy(preference, "preference")

    def _MatmulAlgoGetHeuristic(self, handle: int | None, desc: int | None, a: int | None,
                                b: int | None, c: int | None, d: int | None,
                                preference: int | None, requested: int, results: int | None,
                                count: int | None) -> int:
        self._object(handle, "handle")
        *_, m, n, k, _ = self._shapes(desc, a, b, c, d)  # raises on inconsistent ones
        prefs = self._object(preference, "preference").get("attributes", {})
        self.heuristic_queries += 1
        if self.heuristic_status != SUCCESS:
            return self.heuristic_status
        if requested < 1 or not results or not count:
            return INVALID_VALUE
        if min(m, n, k) == 1:
            return INVALID_VALUE
        alignment = min(prefs.get(attr, 256) for attr in (5, 6, 7, 8))
        attrs = self._object(desc, "desc").get("attributes", {})
        epilogue = attrs.get(7, EPILOGUE_DEFAULT)
        bias = attrs.get(8, 0) if epilogue & EPILOGUE_BIAS else 0
        bias_alignment = min(256, bias & -bias) if bias else 256
        offered = alignment >= self.min_alignment and epilogue in (
            EPILOGUE_DEFAULT, EPILOGUE_RELU, EPILOGUE_BIAS, EPILOGUE_RELU_BIAS) and \
            prefs.get(1, 0) >= self.workspace
        ctypes.c_int.from_address(count).value = int(offered)
        if offered:
            ctypes.memset(results, 0, HEURISTIC_RESULT_BYTES)
            struct.pack_into("<QQQ", (ctypes.c_char * 24).from_address(results), 0, ALGO_MARK,
                             alignment, bias_alignment)
            struct.pack_into("<Qif",
                             (ctypes.c_char * 16).from_address(results + 64), 0,
                             self.workspace, SUCCESS, 1.0)
        return SUCCESS

    def _shapes(self, desc: int | None, a: int | None, b: int | None, c: int | None,
                d: int | None) -> tuple[Any, ...]:
        attrs = self._object(desc, "desc").get("attributes", {})
        layouts = [self._object(x, "layout") for x in (a, b, c, d)]
        transa, transb = attrs.get(3, 0), attrs.get(4, 0)
        (ar, ac), (br, bc) = [(x["rows"], x["cols"]) for x in layouts[:2]]
        m, k = (ar, ac) if transa == 0 else (ac, ar)
        k2, n = (br, bc) if transb == 0 else (bc, br)
        batches = {x.get("attributes", {}).get(5, 1) for x in layouts}
        if k != k2 or any((x["rows"], x["cols"]) != (m, n) for x in layouts[2:]) or \
                len(batches) != 1 or len({x["type"] for x in layouts}) != 1:
            raise ValueError(f"inconsistent matmul: op(A) {m}x{k}, op(B) {k2}x{n}, "
                             f"C/D {[(x['rows'], x['cols']) for x in layouts[2:]]}, "
                             f"batches {batches}")
        return attrs, layouts, transa, transb, m, n, k, batches.pop()

    def _Matmul(self, handle: int | None, desc: int | None, alpha: int | None,
                a: int | None, a_desc: int | None, b: int | None, b_desc: int | None,
                beta: int | None, c: int | None, c_desc: int | None, d: int | None,
                d_desc: int | None, algo: int | None, workspace: int | None,
                workspace_size: int, stream: int | None) -> int:
        self._object(handle, "handle")
        if self.matmul_status != SUCCESS:
            return self.matmul_status
        attrs, layouts, transa, transb, m, n, k, batch = self._shapes(desc, a_desc, b_desc,
                                                                      c_desc, d_desc)
        mark, alignment, bias_alignment = struct.unpack("<QQQ", ctypes.string_at(algo, 24)) \
            if algo else (0, 0, 0)
        if mark != ALGO_MARK:
            return INVALID_VALUE
        epilogue, bias = attrs.get(7, EPILOGUE_DEFAULT), attrs.get(8, 0)
        pointers = [p or 0 for p in (a, b, c, d)] + ([bias] if epilogue & 4 else [])
        if any(p % alignment for p in pointers) or workspace_size < self.workspace or \
                (workspace or 0) % WORKSPACE_ALIGNMENT:
            return INVALID_VALUE
        if epilogue & EPILOGUE_BIAS and bias % BIAS_FAULT_ALIGNMENT:
            self.errors.append(f"misaligned address: a bias at {bias:#x} (not 16-byte aligned)")
            return EXECUTION_FAILED
        if epilogue & EPILOGUE_BIAS and bias % bias_alignment:
            return INVALID_VALUE  # an algorithm chosen for a more aligned bias
        fake_cupy._memory_at(workspace or 0, np.dtype(np.uint8), workspace_size)
        dtype = np.dtype(fake_cupy.CUDA_TYPES[layouts[0]["type"]])

        def matrices(pointer: int | None, layout: dict[str, Any]) -> np.ndarray:
            stride = layout.get("attributes", {}).get(6, 0)
            return fake_cupy._strided_matrices(pointer or 0, dtype, layout["rows"],
                                               layout["cols"], layout["ld"], stride, batch)

        op_a, op_b = matrices(a, layouts[0]), matrices(b, layouts[1])
        op_a = op_a.transpose(0, 2, 1) if transa else op_a
        op_b = op_b.transpose(0, 2, 1) if transb else op_b
        scale, shift = (np.frombuffer(ctypes.string_at(p, 4), np.float32)[0]
                        for p in (alpha, beta))
        value = scale * np.matmul(op_a.astype(np.float32), op_b.astype(np.float32))
        if shift != 0:
            value = value + shift * matrices(c, layouts[2]).astype(np.float32)
        if epilogue & EPILOGUE_BIAS:  # a vector of D's rows, D's type (no BIAS_DATA_TYPE)
            value = value + fake_cupy._memory_at(bias, dtype, m).astype(np.float32)[:, None]
        if epilogue & EPILOGUE_RELU:
            value = np.maximum(value, np.float32(0))
        out = matrices(d, layouts[3])
        out[...] = value.astype(dtype)
        self.calls.append(LtCall(epilogue, transa, transb, m, n, k, batch, bias,
                                 layouts[0]["type"], alignment))
        return SUCCESS
