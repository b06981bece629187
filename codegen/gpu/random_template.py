"""The CUDA text of the `rng-bit-generator` kernel (`random_bits.py` plans it and says how
it works): `emit_random`, the template of the `random` plan kind.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.gpu.cuda_source import Writer, storage_type
from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan
from tfxla_lite.codegen.gpu.random_bits import THREADS, bits_shape, counters
from tfxla_lite.codegen.gpu.templates import KernelSource, _header, _output_names, _signature
from tfxla_lite.hlo.random_bits import (
    PHILOX_MULTIPLIERS,
    PHILOX_ROUND_KEYS,
    THREEFRY_PARITY,
    THREEFRY_ROTATIONS,
    algorithm_of,
    threefry_half_dims,
)
from tfxla_lite.hlo.shape import Shape


def emit_random(plan: KernelPlan, assignment: Any, tables: Any) -> KernelSource:
    """The CUDA text of a `random` plan."""
    (inst,) = plan.members
    params, names = _signature(plan, assignment)
    state_out, bits_out = _output_names(inst, names)
    state = names[id(inst.operand(0))]
    shape = bits_shape(inst)
    words = inst.operand(0).shape.dims[0]
    hashed = counters(inst)
    philox = algorithm_of(inst.attributes) == "rng_philox"
    w = Writer()
    w.open(_header(plan.name, params, THREADS))
    if philox:
        low, high = (f"{state}[1]", f"{state}[2]") if words == 3 else (f"{state}[1]",
                                                                        f"{state}[0]")
        w.line(f"const unsigned long long low = {low}, high = {high};")
    else:
        w.line(f"const unsigned long long counter = {state}[1];")
    w.open("if (blockIdx.x == 0 && threadIdx.x == 0)")
    for word in range(words):
        w.line(f"{state_out}[{word}] = {state}[{word}];")
    if philox:
        w.line(f"const unsigned long long advanced = low + {hashed}ULL;")
        w.line(f"{state_out}[1] = advanced;")
        if words == 3:
            w.line(f"{state_out}[2] = high + (advanced < low ? 1ULL : 0ULL);")
    else:
        w.line(f"{state_out}[1] = counter + {hashed}ULL;")
    w.close()
    if hashed:  # an empty output: the state alone
        w.line(f"const unsigned long long key = {state}[0];")
        w.open(f"for (long long u = blockIdx.x * (long long)blockDim.x + threadIdx.x; "
               f"u < {hashed}LL; u += (long long)gridDim.x * blockDim.x)")
        if philox:
            _philox(w, shape, bits_out)
        else:
            _threefry(w, shape, bits_out)
        w.close()
    w.close()
    return KernelSource(plan, [plan.name], w.text())


def _store(shape: Shape, output: str, position: str, value: str) -> str:
    """Store the low bits of u64 `value` as an element of `shape`'s type (XLA truncates
    8- and 16-bit outputs from the 32-bit values)."""
    unsigned = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int",
                8: "unsigned long long"}[shape.numpy_dtype.itemsize]
    return f"{output}[{position}] = ({storage_type(shape.element_type)})({unsigned})({value});"


def _philox(w: Writer, shape: Shape, output: str) -> None:
    n, wide = shape.num_elements, shape.numpy_dtype.itemsize == 8
    w.line("const unsigned long long c_low = low + (unsigned long long)u;")
    w.line("const unsigned long long c_high = high + (c_low < low ? 1ULL : 0ULL);")
    w.line("unsigned int x0 = (unsigned int)c_low, x1 = (unsigned int)(c_low >> 32), "
           "x2 = (unsigned int)c_high, x3 = (unsigned int)(c_high >> 32);")
    w.line("unsigned int k0 = (unsigned int)key, k1 = (unsigned int)(key >> 32);")
    w.open("for (int round = 0; round < 10; round++)")
    w.line(f"const unsigned long long p0 = (unsigned long long)x0 * {PHILOX_MULTIPLIERS[0]}u;")
    w.line(f"const unsigned long long p1 = (unsigned long long)x2 * {PHILOX_MULTIPLIERS[1]}u;")
    w.line("const unsigned int y0 = (unsigned int)(p1 >> 32) ^ x1 ^ k0;")
    w.line("const unsigned int y2 = (unsigned int)(p0 >> 32) ^ x3 ^ k1;")
    w.line("x0 = y0; x1 = (unsigned int)p1; x2 = y2; x3 = (unsigned int)p0;")
    w.line(f"k0 += {PHILOX_ROUND_KEYS[0]}u; k1 += {PHILOX_ROUND_KEYS[1]}u;")
    w.close()
    if wide:
        w.line("const unsigned long long v[2] = {x0 | ((unsigned long long)x1 << 32), "
               "x2 | ((unsigned long long)x3 << 32)};")
        per = 2
    else:
        w.line("const unsigned long long v[4] = {x0, x1, x2, x3};")
        per = 4
    w.open(f"for (int lane = 0; lane < {per}; lane++)")
    w.line(f"const long long e = u * {per} + lane;")
    w.line(f"if (e < {n}LL) {_store(shape, output, 'e', 'v[lane]')}")
    w.close()


def _threefry(w: Writer, shape: Shape, output: str) -> None:
    wide = shape.numpy_dtype.itemsize == 8
    w.line("const unsigned long long input = counter + (unsigned long long)u;")
    w.line("const unsigned int ks0 = (unsigned int)key, ks1 = (unsigned int)(key >> 32);")
    w.line(f"const unsigned int ks[3] = {{ks0, ks1, {THREEFRY_PARITY}u ^ ks0 ^ ks1}};")
    w.line("unsigned int x0 = (unsigned int)input + ks[0], "
           "x1 = (unsigned int)(input >> 32) + ks[1];")
    for block in range(5):
        for r in THREEFRY_ROTATIONS[4 * (block % 2):4 * (block % 2) + 4]:
            w.line(f"x0 += x1; x1 = ((x1 << {r}) | (x1 >> {32 - r})) ^ x0;")
        w.line(f"x0 += ks[{(block + 1) % 3}]; x1 += ks[{(block + 2) % 3}] + {block + 1}u;")
    if wide:
        w.line(_store(shape, output, "u", "x0 | ((unsigned long long)x1 << 32)"))
        return
    if not shape.dims:  # a scalar: half 0 of counter c
        w.line(_store(shape, output, "0", "x0"))
        return
    # Half-shape element u (row-major over `half`) gives elements 2p and 2p + 1 along
    # the split dimension (those inside the shape).
    split, half = threefry_half_dims(shape.dims)
    inner = 1
    for size in half[split + 1:]:
        inner *= size
    outer_stride = inner * shape.dims[split]  # elements per step of the dims before split
    w.line(f"const long long before = u / {inner * half[split]}, "
           f"p = u / {inner} % {half[split]}, after = u % {inner};")
    for which, value in ((0, "x0"), (1, "x1")):
        w.line(f"if (2 * p + {which} < {shape.dims[split]}) "
               + _store(shape, output, f"before * {outer_stride} + (2 * p + {which}) * "
                        f"{inner} + after", value))
