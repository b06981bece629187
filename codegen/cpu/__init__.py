"""The CPU backend: LLVM IR per kernel with llvmlite, optimized and JIT-compiled by MCJIT.

`compile(module, assignment)` turns an optimized, buffer-assigned HLO module into an
`Executable`; `EMITTERS` is the registry of element generators keyed by HLO opcode.
Layout: `emitter.py` (types, indices, loops, registry), `elementwise.py`,
`data_movement.py`, `indexing.py`, `reduction.py`, `dot.py` (the generators and kernel shapes),
`convolution.py` and `convolution_gemm.py` (convolutions: element generator, patches + GEMM),
`variadic_reduce.py` (variadic reduces, tuples as structs), `calls.py` (call),
`multi_output.py` (kernels with several outputs), `control_flow.py` (while and
conditional: loops and branches calling their computations' functions),
`sort.py` (sort, topk), `linalg.py` (cholesky, triangular-solve), `random_bits.py`
(rng-bit-generator), `bit_ops.py` (bitcast-convert, reduce-precision, the dimension-size
ops, opt-barrier), `math.py` (vectorizable f32 transcendentals), `compiler.py` (kernels
and the ABI's `entry`), `parallel.py` (kernels split across libgomp's threads),
`engine.py` (LLVM, JIT, BLAS).
"""

from __future__ import annotations

from tfxla_lite.codegen.cpu import convolution, indexing  # noqa: F401  (register emitters)
from tfxla_lite.codegen.cpu.compiler import compile
from tfxla_lite.codegen.cpu.emitter import EMITTERS

# Opcodes that have no element generator, and why; compiling one raises
# NotImplementedError naming it.
UNSUPPORTED_OPCODES: dict[str, str] = {
    "fusion": "an entry fusion is a kernel (compiler.py); nested fusions are not supported",
}

__all__ = ["EMITTERS", "UNSUPPORTED_OPCODES", "compile"]
