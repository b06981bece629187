"""Runs generated CUDA on the CPU: a test device for machines without a GPU.

The generated kernels use a small part of CUDA: grid-stride loops over `blockIdx`,
`threadIdx`, `blockDim` and `gridDim`, `__shared__` arrays, `__syncthreads`,
`__syncwarp`, `__shfl_down_sync`, libdevice math and the f16/bf16 conversions (and it
counts the row kernels' 16-byte vector accesses, `vector_accesses`, and those at a
misaligned address, which a GPU faults on and x86 does not). This
module compiles a program as C++20 with g++ against a shim of exactly those, and runs a
launch the way the hardware does as far as the kernels can tell: the blocks one after
another, every thread of a block on its own OS thread, barriers for the block and for
each warp of 32 consecutive threads, shuffles through per-warp slots between two warp
barriers. A thread that returns drops out of the barriers (no deadlock on early exit).

It is not a GPU: no memory model beyond the barriers' ordering, no timing, float math
from glibc instead of libdevice (results agree within the usual ulps), and the grid is
clamped to a few blocks (the kernels' grid-stride loops make any grid correct, so this
also tests that). What it checks is what a compiler cannot: that kernels compute the
right values.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

MAX_BLOCKS = 3  # blocks actually run per launch (gridDim.x says so to the kernel)

SHIM = r"""
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

using std::signbit;
using std::isfinite;
using std::copysign;

struct tl_dim3 { unsigned x, y, z; };
thread_local tl_dim3 threadIdx;
thread_local unsigned tl_tid;
tl_dim3 blockIdx, blockDim, gridDim;  // one block runs at a time

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __shared__ static  // one copy, shared by the threads of the running block

struct tl_block {
  std::barrier<>* block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> slots;
};
tl_block* tl_state;

inline void __syncthreads() { tl_state->block->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { tl_state->warps[tl_tid / 32]->arrive_and_wait(); }
template <class T> T __shfl_down_sync(unsigned, T value, int offset) {
  unsigned warp = tl_tid / 32, lane = tl_tid % 32;
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  tl_state->slots[warp * 32 + lane] = bits;
  __syncwarp();
  unsigned source = lane + offset < 32 ? lane + offset : lane;
  uint64_t got = tl_state->slots[warp * 32 + source];
  __syncwarp();
  T result;
  std::memcpy(&result, &got, sizeof(T));
  return result;
}

template <class T> inline T min(T a, T b) { return a < b ? a : b; }
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long l; std::memcpy(&l, &x, 8); return l; }
inline unsigned int __float_as_uint(float x) { unsigned int u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __fmul_rn(float a, float b) { volatile float p = a * b; return p; }
inline double __dmul_rn(double a, double b) { volatile double p = a * b; return p; }

struct __half { uint16_t bits; };
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half_rn(float x) {
  _Float16 f = (_Float16)x; __half h; std::memcpy(&h.bits, &f, 2); return h; }
inline __half __double2half(double x) {
  _Float16 f = (_Float16)x; __half h; std::memcpy(&h.bits, &f, 2); return h; }
inline __half __ushort_as_half(unsigned short bits) { __half h; h.bits = bits; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }

struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t u = (uint32_t)h.bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u; std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {uint16_t(u >> 16)};
}
inline __nv_bfloat16 __double2bfloat16(double x) { return __float2bfloat16_rn((float)x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }

// Counts the row kernels' 16-byte vector loads and stores (`tl_load_vector`,
// `tl_store_vector`) and those at an address that is not 16-byte aligned, which a GPU
// would fault on (x86 does not).
#include <atomic>
std::atomic<long long> tl_vector_counts[3];  // loads, stores, misaligned
inline void tl_count_vector_access(const void* p, bool store) {
  ++tl_vector_counts[store ? 1 : 0];
  if (reinterpret_cast<uintptr_t>(p) % 16) ++tl_vector_counts[2];
}
#define TL_VECTOR_HOOK(pointer, store) tl_count_vector_access(pointer, store)
extern "C" long long tl_vector_count(int which) { return tl_vector_counts[which].exchange(0); }

struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

static void tl_run(unsigned grid, unsigned bx, unsigned by, const std::function<void()>& body) {
  unsigned threads = bx * by;
  gridDim = {grid, 1, 1};
  blockDim = {bx, by, 1};
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx = {b, 0, 0};
    std::barrier<> block(threads);
    tl_block state;
    state.block = &block;
    for (unsigned w = 0; w < (threads + 31) / 32; ++w)
      state.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
    state.slots.assign(threads + 32, 0);
    tl_state = &state;
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        tl_tid = t;
        threadIdx = {t % bx, t / bx, 0};
        body();
        tl_state->warps[t / 32]->arrive_and_drop();
        tl_state->block->arrive_and_drop();
      });
    for (auto& thread : pool) thread.join();
  }
}
"""

_KERNEL = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)')


def find_compiler() -> str | None:
    return shutil.which("g++")


def _parameter_type(parameter: str) -> str:
    """`const float* __restrict__ in0` -> `const float*`."""
    text = parameter.replace("__restrict__", "").strip()
    return re.sub(r"\s*\w+$", "", text).strip()


class EmulatedModule:
    """A program compiled for the CPU; `launch(name, grid, block, pointers)` runs a kernel."""

    _cache: dict[str, EmulatedModule] = {}

    def __init__(self, source: str) -> None:
        self.kernels = {name: [p for p in params.split(",") if p.strip()]
                        for _, name, params in _KERNEL.findall(source)}
        body = re.sub(r"#include <cuda_(fp16|bf16)\.h>", "", source)
        wrappers = []
        for name, params in self.kernels.items():
            arguments = ", ".join(f"({_parameter_type(p)})args[{n}]"
                                  for n, p in enumerate(params))
            wrappers.append(f'extern "C" void tl_launch_{name}(unsigned grid, unsigned bx, '
                            f"unsigned by, void** args) {{\n"
                            f"  tl_run(grid, bx, by, [&] {{ {name}({arguments}); }});\n}}\n")
        text = SHIM + body + "\n" + "\n".join(wrappers)
        folder = Path(tempfile.mkdtemp(prefix="tfxla_lite_emulator_"))
        (folder / "module.cc").write_text(text)
        result = subprocess.run(
            [find_compiler() or "g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
             "-w", "module.cc", "-o", "module.so"], cwd=folder, capture_output=True,
            text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"emulator build failed:\n{result.stderr[:6000]}")
        self.library = ctypes.CDLL(str(folder / "module.so"))
        self.folder = folder

    @classmethod
    def of(cls, source: str) -> EmulatedModule:
        key = hashlib.sha256(source.encode()).hexdigest()
        if key not in cls._cache:
            cls._cache[key] = cls(source)
        return cls._cache[key]

    def launch(self, name: str, grid: int, block: tuple[int, int], pointers: list[int]) -> None:
        assert len(pointers) == len(self.kernels[name]), name
        function = getattr(self.library, f"tl_launch_{name}")
        function.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                             ctypes.POINTER(ctypes.c_void_p)]
        array = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
        function(min(grid, MAX_BLOCKS), block[0], block[1], array)


def vector_accesses() -> tuple[int, int, int]:
    """(vector loads, vector stores, misaligned ones) the emulated modules ran since the
    last call, summed over modules."""
    totals = [0, 0, 0]
    for module in EmulatedModule._cache.values():
        function = module.library.tl_vector_count
        function.restype = ctypes.c_longlong
        function.argtypes = [ctypes.c_int]
        for which in range(3):
            totals[which] += function(which)
    return totals[0], totals[1], totals[2]


def cleanup() -> None:
    for module in EmulatedModule._cache.values():
        shutil.rmtree(module.folder, ignore_errors=True)
    EmulatedModule._cache.clear()


__all__ = ["EmulatedModule", "MAX_BLOCKS", "cleanup", "find_compiler", "vector_accesses"]
