"""GPU kernel of HLO `rng-bit-generator`: a whole kernel, bit for bit the evaluator's.

Where it sits: `kernels.plan_instruction` hands every entry `rng-bit-generator` to
`plan_random` (fusion never takes one), `compiler.emit_plan` to
`random_template.emit_random`. The bits
are `tfxla_lite/hlo/random_bits.py`'s (XLA's `prng.cc`; docs/architecture.md,
"rng-bit-generator's bits"): a thread per counter hashes it (Philox4x32-10: four 32-bit
lanes, or two 64-bit values; ThreeFry2x32-20: one 64-bit value, or two 32-bit halves
placed along the split dimension) and writes the elements it gives; thread 0 of block 0
writes the advanced state. The kernel reads the state once per thread and writes a
separate buffer, so no thread sees another's writes.
"""

from __future__ import annotations

from tfxla_lite.codegen.gpu.kernel_plan import KernelPlan, Launch
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.random_bits import algorithm_of, threefry_half_dims
from tfxla_lite.hlo.shape import Shape

RANDOM_OPCODES = frozenset({"rng-bit-generator"})  # the opcodes `plan_random` takes
THREADS = 128


def bits_shape(inst: Instruction) -> Shape:
    assert inst.shape.tuple_shapes is not None
    return inst.shape.tuple_shapes[1]


def counters(inst: Instruction) -> int:
    """How many counters the kernel hashes (the state advances by as many)."""
    shape = bits_shape(inst)
    n, wide = shape.num_elements, shape.numpy_dtype.itemsize == 8
    if algorithm_of(inst.attributes) == "rng_philox":
        return -(-n // (2 if wide else 4))
    if wide:
        return n
    count = 1
    for size in threefry_half_dims(shape.dims)[1]:
        count *= size
    return count


def plan_random(inst: Instruction, name: str) -> KernelPlan:
    """A thread per counter; at least one thread, which writes the state."""
    units = max(counters(inst), 1)
    return KernelPlan("random", name, [inst], Launch((THREADS, 1), units, THREADS), rows=units)
