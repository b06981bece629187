"""CPU kernel of HLO `rng-bit-generator`: XLA's Philox4x32-10 and ThreeFry2x32-20, bit for bit.

The functions, the counters and where each hash lands are `tfxla_lite/hlo/random_bits.py`'s
(XLA's `prng.cc` as `RngBitGeneratorExpander` uses it). The kernel is
`void kernel(state_out, bits_out, state_in)`: it hashes counter after counter in one
serial loop (each hash gives 4 u32 lanes for Philox, 2 for ThreeFry), stores the lanes
where the element order puts them, and writes the advanced state. `compiler.py` hands
every entry `rng-bit-generator` here, as it hands sorts to `sort.py`.
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import (
    I32,
    I64,
    ConstantPool,
    Index,
    KernelContext,
    i64,
    kernel_name,
    new_kernel_function,
    register_own_kernel,
)
from tfxla_lite.hlo import random_bits
from tfxla_lite.hlo.ir import Instruction
from tfxla_lite.hlo.shape import Shape


def _u32(value: int) -> ir.Constant:
    return ir.Constant(I32, value & 0xFFFFFFFF)


def _halves(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    return b.trunc(x, I32), b.trunc(b.lshr(x, i64(32)), I32)


def _join(b: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    return b.or_(b.zext(low, I64), b.shl(b.zext(high, I64), i64(32)))


def _philox(b: ir.IRBuilder, lanes: list[ir.Value], key: tuple[ir.Value, ir.Value]
            ) -> list[ir.Value]:
    x = list(lanes)
    k0, k1 = key
    for _ in range(10):
        p0 = b.mul(b.zext(x[0], I64), i64(random_bits.PHILOX_MULTIPLIERS[0]))
        p1 = b.mul(b.zext(x[2], I64), i64(random_bits.PHILOX_MULTIPLIERS[1]))
        (low0, high0), (low1, high1) = _halves(b, p0), _halves(b, p1)
        x = [b.xor(b.xor(high1, x[1]), k0), low1, b.xor(b.xor(high0, x[3]), k1), low0]
        k0 = b.add(k0, _u32(random_bits.PHILOX_ROUND_KEYS[0]))
        k1 = b.add(k1, _u32(random_bits.PHILOX_ROUND_KEYS[1]))
    return x


def _threefry(b: ir.IRBuilder, x0: ir.Value, x1: ir.Value, key: tuple[ir.Value, ir.Value]
              ) -> tuple[ir.Value, ir.Value]:
    ks = [key[0], key[1], b.xor(b.xor(_u32(random_bits.THREEFRY_PARITY), key[0]), key[1])]
    x = [b.add(x0, ks[0]), b.add(x1, ks[1])]
    rotations = random_bits.THREEFRY_ROTATIONS
    for block in range(5):
        for r in rotations[4 * (block % 2):4 * (block % 2) + 4]:
            x[0] = b.add(x[0], x[1])
            rotated = b.or_(b.shl(x[1], _u32(r)), b.lshr(x[1], _u32(32 - r)))
            x[1] = b.xor(rotated, x[0])
        x[0] = b.add(x[0], ks[(block + 1) % 3])
        x[1] = b.add(b.add(x[1], ks[(block + 2) % 3]), _u32(block + 1))
    return x[0], x[1]


@register_own_kernel("rng-bit-generator")
def emit_rng_kernel(module: ir.Module, pool: ConstantPool, inst: Instruction,
                    threads: int) -> ir.Function:
    """The kernel `void kernel(state_out, bits_out, state_in)` of entry `inst`."""
    state_shape = inst.operand(0).shape
    random_bits.check_shapes(state_shape, inst.shape, inst.attributes)
    assert inst.shape.tuple_shapes is not None
    shape = inst.shape.tuple_shapes[1]
    ctx, (state_out, bits_out), (state_in,) = new_kernel_function(
        module, pool, inst, kernel_name(inst), 2, [])
    b = ctx.builder
    words = [ctx.load(state_in, state_shape, Index(state_shape.dims, linear=i64(w)))
             for w in range(state_shape.dims[0])]
    key = _halves(b, words[0])
    n = shape.num_elements
    wide = shape.numpy_dtype.itemsize == 8
    new_words = list(words)
    if random_bits.algorithm_of(inst.attributes) == "rng_philox":
        low, high = (words[1], words[2]) if len(words) == 3 else (words[1], words[0])
        lanes_per = 2 if wide else 4
        counters = -(-n // lanes_per)
        with ctx.loop(counters, name="counter") as c:
            counter_low = b.add(low, c)
            carry = b.zext(b.icmp_unsigned("<", counter_low, low), I64)
            lanes = _philox(b, [*_halves(b, counter_low), *_halves(b, b.add(high, carry))],
                            key)
            values = [_join(b, lanes[0], lanes[1]), _join(b, lanes[2], lanes[3])] if wide \
                else lanes
            for lane, value in enumerate(values):
                element = b.add(b.mul(c, i64(lanes_per)), i64(lane))
                with b.if_then(b.icmp_signed("<", element, i64(n))):
                    _store(ctx, value, bits_out, shape, Index(shape.dims, linear=element))
        advanced = b.add(low, i64(counters))
        new_words[1] = advanced
        if len(words) == 3:
            new_words[2] = b.add(high, b.zext(b.icmp_unsigned("<", advanced, low), I64))
    else:
        counter = words[1]
        if wide:
            with ctx.loop(n, name="element") as e:
                x0, x1 = _threefry(b, *_halves(b, b.add(counter, e)), key)
                _store(ctx, _join(b, x0, x1), bits_out, shape, Index(shape.dims, linear=e))
            new_words[1] = b.add(counter, i64(n))
        else:
            split, half = random_bits.threefry_half_dims(shape.dims)
            count = Shape("u32", half).num_elements
            with ctx.loop(count, name="element") as e:
                x0, x1 = _threefry(b, *_halves(b, b.add(counter, e)), key)
                multi = Index(half, linear=e).get_multi(b)
                for which, value in enumerate((x0, x1)):
                    if not shape.dims:
                        if which == 0:
                            _store(ctx, value, bits_out, shape, Index.scalar())
                        continue
                    position = b.add(b.mul(multi[split], i64(2)), i64(which))
                    at = list(multi)
                    at[split] = position
                    with b.if_then(b.icmp_signed("<", position, i64(shape.dims[split]))):
                        _store(ctx, value, bits_out, shape, Index(shape.dims, at))
            new_words[1] = b.add(counter, i64(count))
    for w, word in enumerate(new_words):
        ctx.store(word, state_out, state_shape, Index(state_shape.dims, linear=i64(w)))
    b.ret_void()
    return ctx.function


def _store(ctx: KernelContext, value: ir.Value, output: ir.Value, shape: Shape,
           index: Index) -> None:
    """A 32- or 64-bit value stored as the element type (narrow types truncate)."""
    b = ctx.builder
    width = shape.numpy_dtype.itemsize * 8
    if value.type.width != width:
        value = b.trunc(value, ir.IntType(width))
    ctx.store(value, output, shape, index)
