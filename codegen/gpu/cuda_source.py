"""CUDA C text for the GPU backend: element types, literals, the prelude, a line writer.

The lowest layer of `tfxla_lite.codegen.gpu`: everything here is plain Python producing
strings, so the emitter can be tested (and its output compiled with nvcc) without CuPy
or a GPU. Values compute in a *compute type*: the storage type, except f16 and bf16,
which load into `float`, are rounded back to their own precision after every HLO op
(`round_half`), and are stored with round-to-nearest-even. Small integers keep their
own C type; arithmetic on signed integers runs in the unsigned type of the same width
and converts back, so that overflow wraps (two's complement) instead of being
undefined behaviour the CUDA compiler could exploit.
"""

from __future__ import annotations

import math
import re

import numpy as np

from tfxla_lite.hlo.shape import numpy_dtype

# XLA element type -> C type in memory.
STORAGE_TYPES = {
    "pred": "bool", "s8": "signed char", "s16": "short", "s32": "int", "s64": "long long",
    "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
    "u64": "unsigned long long", "f16": "__half", "bf16": "__nv_bfloat16", "f32": "float",
    "f64": "double",
}
HALF_TYPES = frozenset({"f16", "bf16"})
FLOAT_TYPES = frozenset({"f16", "bf16", "f32", "f64"})
SIGNED_TYPES = frozenset({"s8", "s16", "s32", "s64"})
UNSIGNED_TYPES = frozenset({"u8", "u16", "u32", "u64"})
INTEGER_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32,
                "u64": 64}
UNSIGNED_OF = {"s8": "unsigned char", "s16": "unsigned short", "s32": "unsigned int",
               "s64": "unsigned long long"}
SIGNED_OF = {"u8": "signed char", "u16": "short", "u32": "int", "u64": "long long"}


def storage_type(element_type: str) -> str:
    try:
        return STORAGE_TYPES[element_type]
    except KeyError:
        raise NotImplementedError(f"GPU backend: element type {element_type}") from None


def compute_type(element_type: str) -> str:
    """The C type a value of `element_type` is computed in."""
    return "float" if element_type in HALF_TYPES else storage_type(element_type)


def is_float(element_type: str) -> bool:
    return element_type in FLOAT_TYPES


# The half types are stored as themselves and computed in float: (to float, to storage).
_HALF_CONVERSIONS = {"f16": ("__half2float", "__float2half_rn"),
                     "bf16": ("__bfloat162float", "__float2bfloat16_rn")}


def _from_storage(element_type: str, value: str) -> str:
    """A stored value converted to the compute type."""
    if element_type not in _HALF_CONVERSIONS:
        return value
    return f"{_HALF_CONVERSIONS[element_type][0]}({value})"


def load(element_type: str, pointer: str, index: str) -> str:
    """Read element `index` of `pointer` into the compute type."""
    return _from_storage(element_type, f"{pointer}[{index}]")


def to_storage(element_type: str, value: str) -> str:
    """A compute-type value converted for a store."""
    if element_type not in _HALF_CONVERSIONS:
        return value
    return f"{_HALF_CONVERSIONS[element_type][1]}({value})"


def round_half(element_type: str, value: str) -> str:
    """A float-computed f16/bf16 result rounded to its own precision (identity otherwise)."""
    return _from_storage(element_type, to_storage(element_type, value))


def literal(element_type: str, value: object) -> str:
    """A C expression of compute type with exactly the value `value` of `element_type`."""
    if element_type == "pred":
        return "true" if bool(value) else "false"
    if element_type in FLOAT_TYPES:
        number = float(np.asarray(value).astype(np.float64))
        if element_type == "f64":
            if math.isfinite(number):
                return f"{number!r}"
            bits = int(np.float64(number).view(np.uint64))
            return f"__longlong_as_double(0x{bits:016x}LL)"
        if element_type != "f32":  # the value of its own type, exact in float
            number = float(np.asarray(number).astype(numpy_dtype(element_type)))
        single = np.float32(number)
        if math.isfinite(number):
            text = str(single)  # NumPy's shortest text that reads back as this float
            return text + ("f" if any(c in text for c in ".e") else ".0f")
        return f"__int_as_float(0x{int(single.view(np.uint32)):08x})"
    number = int(np.asarray(value).astype(np.int64 if element_type in SIGNED_TYPES
                                          else np.uint64))
    if element_type == "s64":
        if number == -(1 << 63):
            return "(-9223372036854775807LL - 1)"
        return f"{number}LL"
    if element_type == "u64":
        return f"{number}ULL"
    if element_type == "s32" and number == -(1 << 31):
        return "(-2147483647 - 1)"
    if element_type in UNSIGNED_TYPES:
        return f"(({storage_type(element_type)}){number}u)"
    return f"(({storage_type(element_type)}){number})"


def integer_limits(element_type: str) -> tuple[str, str]:
    """C literals of the least and greatest value of an integer type."""
    bits = INTEGER_BITS[element_type]
    if element_type in SIGNED_TYPES:
        return (literal(element_type, -(1 << (bits - 1))),
                literal(element_type, (1 << (bits - 1)) - 1))
    return literal(element_type, 0), literal(element_type, (1 << bits) - 1)


def identifier(name: str) -> str:
    """A C identifier from an HLO name (`add.3` -> `add_3`)."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return text if text and not text[0].isdigit() else "_" + text


# Helpers every module starts with. Templates keep the emitter free of per-type variants;
# all are inlined. NaN-propagating max/min order -0.0 below +0.0, as XLA's `maximum`.
PRELUDE = r"""
template <class T> __device__ __forceinline__ T tl_max(T a, T b) { return a > b ? a : b; }
template <class T> __device__ __forceinline__ T tl_min(T a, T b) { return a < b ? a : b; }
template <> __device__ __forceinline__ bool tl_max(bool a, bool b) { return a || b; }
template <> __device__ __forceinline__ bool tl_min(bool a, bool b) { return a && b; }
template <class T> __device__ __forceinline__ T tl_fmax(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}
template <class T> __device__ __forceinline__ T tl_fmin(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}
template <class T> __device__ __forceinline__ T tl_fsign(T x) {
  return x != x ? x : copysign(x != T(0) ? T(1) : T(0), x);
}
// Integer division never traps: x/0 = -1, x%0 = x, MIN/-1 = MIN, MIN%-1 = 0.
template <class T> __device__ __forceinline__ T tl_sdiv(T x, T y, T lowest) {
  if (y == T(0)) return T(-1);
  if (y == T(-1) && x == lowest) return lowest;
  return T(x / y);
}
template <class T> __device__ __forceinline__ T tl_srem(T x, T y, T lowest) {
  if (y == T(0)) return x;
  if (y == T(-1) && x == lowest) return T(0);
  return T(x % y);
}
template <class T> __device__ __forceinline__ T tl_udiv(T x, T y) {
  return y == T(0) ? T(~T(0)) : T(x / y);
}
template <class T> __device__ __forceinline__ T tl_urem(T x, T y) {
  return y == T(0) ? x : T(x % y);
}
// Shifts by an amount outside [0, bits) give 0, or the sign fill for arithmetic shifts.
template <class T, class U> __device__ __forceinline__ T tl_shl(T x, T y, int bits) {
  return (U)y < (U)bits ? T((U)x << (U)y) : T(0);
}
template <class T, class U> __device__ __forceinline__ T tl_shr_logical(T x, T y, int bits) {
  return (U)y < (U)bits ? T((U)x >> (U)y) : T(0);
}
// Arithmetic shifts see the bits as signed (S), whatever the type, as LLVM's ashr.
template <class T, class U, class S>
__device__ __forceinline__ T tl_shr_arithmetic(T x, T y, int bits) {
  return (U)y < (U)bits ? T((S)x >> (U)y) : T((S)x < S(0) ? S(-1) : S(0));
}
// Exponentiation by squaring; a negative exponent gives 0 except for bases 1 and -1.
template <class T, class U, bool Signed> __device__ __forceinline__ T tl_ipow(T x, T y) {
  if constexpr (Signed) {
    if (y < T(0)) {
      if (x == T(1)) return T(1);
      if (x == T(-1)) return ((U)y & U(1)) ? T(-1) : T(1);
      return T(0);
    }
  }
  typedef decltype(U(0) + 0u) W;  // at least unsigned int: no promotion to signed int
  U result = 1, base = (U)x, exponent = (U)y;
  while (exponent) {
    if (exponent & U(1)) result = U(W(result) * W(base));
    base = U(W(base) * W(base));
    exponent >>= 1;
  }
  return T(result);
}
// Float to integer: truncate toward zero, saturate, NaN gives 0 (XLA's convert).
template <class T> __device__ __forceinline__ T tl_f2i(double x, T lowest, T highest) {
  if (x != x) return T(0);
  if (x <= (double)lowest) return lowest;
  if (x >= (double)highest) return highest;
  return T(x);
}
// Warp shuffles of every compute type: types under 32 bits travel as int.
template <class T> __device__ __forceinline__ T tl_shfl_down(T v, int offset) {
  return __shfl_down_sync(0xffffffffu, v, offset);
}
template <> __device__ __forceinline__ bool tl_shfl_down(bool v, int offset) {
  return __shfl_down_sync(0xffffffffu, (int)v, offset) != 0;
}
#define TL_SMALL_SHUFFLE(T) \
  template <> __device__ __forceinline__ T tl_shfl_down(T v, int offset) { \
    return (T)__shfl_down_sync(0xffffffffu, (int)v, offset); }
TL_SMALL_SHUFFLE(signed char)
TL_SMALL_SHUFFLE(unsigned char)
TL_SMALL_SHUFFLE(short)
TL_SMALL_SHUFFLE(unsigned short)
// 16-byte vector accesses of row kernels (row_vectors.py): N elements of T at a 16-byte
// aligned address, one ld/st.global.v4 (the emulator defines the hook to check alignment).
#ifndef TL_VECTOR_HOOK
#define TL_VECTOR_HOOK(pointer, store)
#endif
template <class T, int N> struct alignas(sizeof(T) * N) tl_vector { T v[N]; };
template <int N, class T> __device__ __forceinline__ tl_vector<T, N> tl_load_vector(const T* p) {
  TL_VECTOR_HOOK(p, false);
  return *reinterpret_cast<const tl_vector<T, N>*>(p);
}
template <int N, class T>
__device__ __forceinline__ void tl_store_vector(T* p, const tl_vector<T, N>& value) {
  TL_VECTOR_HOOK(p, true);
  *reinterpret_cast<tl_vector<T, N>*>(p) = value;
}
"""


def prelude(element_types: set[str]) -> str:
    """The module's header: the half-precision headers it needs, then `PRELUDE`."""
    lines = ["// Generated by tfxla-lite's GPU backend (tfxla_lite.codegen.gpu)."]
    if "f16" in element_types:
        lines.append("#include <cuda_fp16.h>")
    if "bf16" in element_types:
        lines.append("#include <cuda_bf16.h>")
    return "\n".join(lines) + "\n" + PRELUDE


class Writer:
    """Lines of C with indentation, and fresh variable names."""

    def __init__(self, indent: int = 0) -> None:
        self.lines: list[str] = []
        self.depth = indent
        self._names = 0

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def fresh(self, stem: str = "v") -> str:
        self._names += 1
        return f"{stem}{self._names}"

    def open(self, header: str) -> None:
        """`header {` and one level deeper; close with `close()`."""
        self.line(header + " {" if header else "{")
        self.depth += 1

    def close(self, trailer: str = "") -> None:
        self.depth -= 1
        self.line("}" + trailer)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
