"""Lowering rules of TF's stateless random ops: TF's own Philox-4x32-10 and TF's own
conversions of its bits to numbers, so a compiled op draws exactly what TF's CPU kernel
draws (TF's XLA draws other numbers: its bit generator and conversions differ).

Registered into `registry.OP_RULES` on import. The facts come from TF's sources:
`xla/tsl/lib/random/philox_random.h` (the generator and `Skip`),
`random_distributions.h` / `random_distributions_utils.h` (`Uint32ToFloat`,
`Uint16ToHalf`, `Uint16ToGfloat16`, `Uint64ToDouble`, the integer distributions),
`core/kernels/random_op_cpu.h` (`FillPhiloxRandomTask`: output group `g` takes one
generator call at counter + g), `stateless_random_ops.cc` (`GenerateKey`: a seed
scrambled into key and counter by one Philox call) and `stateless_random_ops_v2_util.h`
(key and counter as uint64 words; AUTO_SELECT means Philox).

Philox is written in primitive HLO as XLA's RngBitGeneratorExpander writes it: u32
lanes, a 32x32->64 multiply split by shift-right-logical and convert, xor and add.
Each output group is one counter value (the group index, an iota shifted right, added
to the 128-bit counter with its carry); each element selects its lanes. Floats
come from the mantissa bits: `Uint32ToFloat(x)` is `bits(0x3f800000 | x & 0x7fffff) - 1`,
exactly `(x & 0x7fffff) * 2^-23`, which needs no bitcast-convert.

The normal distributions stay in TF: Box-Muller calls glibc's `logf` and `sincosf`,
and the CPU backend's `log` is its own polynomial, so the numbers would not be TF's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    FLOAT,
    INTEGER,
    LoweringContext,
    constant_value,
    known_dims,
    register,
)
from tfxla_lite.hlo import Instruction, Shape

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]

# TF's rng_alg.h: the ids an `alg` input may hold; AUTO_SELECT runs Philox on every device.
PHILOX, AUTO_SELECT = 1, 3
# philox_random.h: the round multipliers and the Weyl key increments.
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)
_ROUNDS = 10
# stateless_random_ops.cc GenerateKey: the fixed key that scrambles a seed.
_SEED_KEY = (0x3EC8F720, 0x02461E29)

UNSIGNED = frozenset({"uint32", "uint64"})
KEY_COUNTER = frozenset({"uint64"})
SEEDS = frozenset({"int32", "int64"})


# -- bit helpers ---------------------------------------------------------------------------
def _full(ctx: LoweringContext, value: int, etype: str, dims: tuple[int, ...]) -> Instruction:
    return ctx.full(value, Shape(etype, dims))


def _binary(ctx: LoweringContext, opcode: str, a: Instruction, b: Instruction | int
            ) -> Instruction:
    """`a opcode b`, a Python int `b` becoming a constant of `a`'s shape."""
    if isinstance(b, int):
        b = _full(ctx, b, a.shape.element_type, a.shape.dims)
    return ctx.emit(opcode, [a, b])


def _low_high(ctx: LoweringContext, word: Instruction) -> tuple[Instruction, Instruction]:
    """The low and high u32 halves of a u64 `word`."""
    high = _binary(ctx, "shift-right-logical", word, 32)
    return ctx.convert(word, "u32"), ctx.convert(high, "u32")


def _word(ctx: LoweringContext, low: Instruction, high: Instruction) -> Instruction:
    """The u64 `low | high << 32` of two u32 halves (Uint32sToUint64)."""
    shifted = _binary(ctx, "shift-left", ctx.convert(high, "u64"), 32)
    return ctx.emit("or", [ctx.convert(low, "u64"), shifted])


def _element(ctx: LoweringContext, vector: Instruction, index: int) -> Instruction:
    """Element `index` of a rank-1 `vector`, as a scalar."""
    piece = ctx.emit("slice", [vector], slice=((index, index + 1, 1),))
    return ctx.reshape(piece, ())


# -- the generator ---------------------------------------------------------------------------
def philox(ctx: LoweringContext, counter: list[Instruction], key: list[Instruction]
           ) -> list[Instruction]:
    """PhiloxRandom::operator(): ten rounds on four u32 counter lanes (arrays of one
    shape) under a two-lane u32 scalar key, raised by the Weyl increments between rounds."""
    dims = counter[0].shape.dims
    for round_index in range(_ROUNDS):
        if round_index:
            key = [_binary(ctx, "add", k, step) for k, step in zip(key, _KEY_INCREMENTS)]
        lanes = [ctx.broadcast_to(k, dims) for k in key]
        products = [_binary(ctx, "multiply", ctx.convert(counter[lane], "u64"), multiplier)
                    for lane, multiplier in zip((0, 2), _MULTIPLIERS)]
        (low0, high0), (low1, high1) = (_low_high(ctx, p) for p in products)
        counter = [ctx.emit("xor", [ctx.emit("xor", [high1, counter[1]]), lanes[0]]), low1,
                   ctx.emit("xor", [ctx.emit("xor", [high0, counter[3]]), lanes[1]]), low0]
    return counter


def key_counter_from_seed(ctx: LoweringContext, seed: Instruction
                          ) -> tuple[Instruction, Instruction, Instruction]:
    """GenerateKey: a seed of two int32 or int64 words (each widened to 64 bits with its
    sign) as the counter of one Philox call under a fixed key; its result is the key
    (lanes 0, 1) and the counter's high word (lanes 2, 3). Returns (key, counter low
    word, counter high word), u64 scalars."""
    words = [ctx.convert(ctx.convert(_element(ctx, seed, i), "s64"), "u64") for i in (0, 1)]
    halves = [half for word in words for half in _low_high(ctx, word)]
    key = [ctx.constant(k, "u32") for k in _SEED_KEY]
    mix = philox(ctx, halves, key)
    return _word(ctx, mix[0], mix[1]), ctx.constant(0, "u64"), _word(ctx, mix[2], mix[3])


def group_bits(ctx: LoweringContext, key: Instruction, counter: tuple[Instruction, Instruction],
               group: Instruction) -> list[Instruction]:
    """The four u32 lanes of Philox at counter + g for each output group g in the u64
    array `group` (FillPhiloxRandomTask skips the generator by the group index: a
    128-bit add)."""
    dims = group.shape.dims
    low = ctx.emit("add", [ctx.broadcast_to(counter[0], dims), group])
    carry = ctx.convert(ctx.emit("compare", [low, group], direction="LT"), "u64")
    high = ctx.emit("add", [ctx.broadcast_to(counter[1], dims), carry])
    lanes = [*_low_high(ctx, low), *_low_high(ctx, high)]
    return philox(ctx, lanes, list(_low_high(ctx, key)))


def fill(ctx: LoweringContext, key: Instruction, counter: tuple[Instruction, Instruction],
         dims: tuple[int, ...], etype: str, lanes_per_output: int, convert: Any
         ) -> Instruction:
    """An output of `dims` drawn as TF's fixed-sample distributions draw it: each group
    of 4 / `lanes_per_output` outputs from one Philox call, output i of a group from
    lanes [i * lanes_per_output, ...); `convert(lanes)` maps those u32 lanes to values.

    Element-wise throughout: each element runs its group's Philox and selects its own
    lanes. That repeats a group's Philox for each of its elements, but keeps one
    vectorizable loop; gathering the lanes of one call per group into output order
    (a concatenate) computes no less, as every element of the concatenation evaluates
    the whole shared round chain."""
    size = 1
    for d in dims:
        size *= d
    if size == 0:
        return _full(ctx, 0, etype, dims)
    per_group = 4 // lanes_per_output
    index = ctx.emit("iota", [], shape=Shape("u64", (size,)), iota_dimension=0)
    group = _binary(ctx, "shift-right-logical", index, per_group.bit_length() - 1)
    bits = group_bits(ctx, key, counter, group)
    position = ctx.convert(_binary(ctx, "and", index, per_group - 1), "u32")
    chosen = []
    for lane in range(lanes_per_output):
        value = bits[(per_group - 1) * lanes_per_output + lane]
        for i in range(per_group - 2, -1, -1):
            here = ctx.emit("compare", [position, _full(ctx, i, "u32", (size,))],
                            direction="EQ")
            value = ctx.emit("select", [here, bits[i * lanes_per_output + lane], value])
        chosen.append(value)
    return ctx.reshape(convert(chosen), dims)


# -- TF's conversions of bits to numbers -------------------------------------------------------
def _mantissa_fraction(ctx: LoweringContext, bits: Instruction, mask: int, width: int,
                       etype: str) -> Instruction:
    """`bits(1.0 | bits & mask) - 1.0` of a float with `width` mantissa bits, computed as
    the exact `(bits & mask) * 2^-width` in f32 and rounded (exactly) to `etype`."""
    mantissa = ctx.convert(_binary(ctx, "and", bits, mask), "f32")
    scale = ctx.full(2.0 ** -width, mantissa.shape)
    return ctx.convert(ctx.emit("multiply", [mantissa, scale]), etype)


def _uniform_float(ctx: LoweringContext, lanes: list[Instruction], etype: str) -> Instruction:
    if etype == "f32":  # Uint32ToFloat
        return _mantissa_fraction(ctx, lanes[0], 0x7FFFFF, 23, "f32")
    if etype == "f16":  # Uint16ToHalf
        return _mantissa_fraction(ctx, lanes[0], 0x3FF, 10, "f16")
    if etype == "bf16":  # Uint16ToGfloat16
        return _mantissa_fraction(ctx, lanes[0], 0x7F, 7, "bf16")
    # Uint64ToDouble: 20 mantissa bits from the first lane, 32 from the second.
    high = _binary(ctx, "and", lanes[0], 0xFFFFF)
    mantissa = ctx.convert(_word(ctx, lanes[1], high), "f64")
    return ctx.emit("multiply", [mantissa, ctx.full(2.0 ** -52, mantissa.shape)])


def _full_int(ctx: LoweringContext, lanes: list[Instruction], etype: str) -> Instruction:
    """UniformFullIntDistribution: the lane itself, or lane0 | lane1 << 32."""
    bits = lanes[0] if len(lanes) == 1 else _word(ctx, lanes[0], lanes[1])
    return ctx.convert(bits, etype)


def _lanes_per_output(etype: str) -> int:
    return 2 if etype in ("f64", "s64", "u64") else 1


def uniform_int(ctx: LoweringContext, key: Instruction, counter: tuple[Instruction, ...],
                 dims: tuple[int, ...], etype: str, low: Instruction, high: Instruction
                 ) -> Instruction:
    """UniformDistribution of integers: lo + bits % (hi - lo), all modulo 2^width
    (SignedAdd), the range and the sum taken unsigned."""
    unsigned = "u64" if _lanes_per_output(etype) == 2 else "u32"
    low_bits = ctx.convert(low, unsigned)
    span = ctx.emit("subtract", [ctx.convert(high, unsigned), low_bits])

    def convert(lanes: list[Instruction]) -> Instruction:
        bits = _full_int(ctx, lanes, unsigned)
        offset = ctx.emit("remainder", [bits, ctx.broadcast_to(span, bits.shape.dims)])
        value = ctx.emit("add", [ctx.broadcast_to(low_bits, bits.shape.dims), offset])
        return ctx.convert(value, etype)

    return fill(ctx, key, counter, dims, etype, _lanes_per_output(etype), convert)


# -- checks ------------------------------------------------------------------------------------
def _alg_reason(op: tf.Operation, index: int) -> str | None:
    alg = constant_value(op.inputs[index])
    if alg is None:
        return f"input {index} (alg) must be a constant"
    if int(alg) not in (PHILOX, AUTO_SELECT):
        return (f"alg {int(alg)} is not Philox: only TF's Philox is reproduced bit for bit "
                "(ThreeFry stays in TF)")
    return None


def _check_v2(op: tf.Operation) -> str | None:
    """The V2 ops: (shape, key, counter, alg, ...)."""
    if known_dims(op.inputs[1]) != (1,):
        return "key must have shape [1]"
    counter = known_dims(op.inputs[2])
    if counter is None or len(counter) != 1 or counter[0] < 2:
        return "counter must be a vector of at least 2 words"
    reason = _alg_reason(op, 3)
    if reason is None and op.type == "StatelessRandomUniformIntV2":
        if op.outputs[0].dtype.base_dtype.name not in INTEGER:
            return "an unsigned output (TF's CPU kernel draws int32 and int64)"
        return _range_reason(op, 4)
    return reason


def _check_seeded(op: tf.Operation) -> str | None:
    """The v1 ops: (shape, seed, ...)."""
    if known_dims(op.inputs[1]) != (2,):
        return "seed must have shape [2]"
    if op.inputs[1].dtype.base_dtype.name not in SEEDS:
        return f"seed of dtype {op.inputs[1].dtype.name} (TF's kernel takes int32 and int64)"
    if op.type == "StatelessRandomUniformInt":
        return _range_reason(op, 2)
    return None


def _range_reason(op: tf.Operation, index: int) -> str | None:
    """minval and maxval scalars; constant ones must satisfy minval < maxval, else TF's
    kernel raises (a runtime empty range draws lo + bits, XLA's x % 0 = x)."""
    for i in (index, index + 1):
        if known_dims(op.inputs[i]) != ():
            return f"input {i} must be a scalar"
    low, high = constant_value(op.inputs[index]), constant_value(op.inputs[index + 1])
    if low is not None and high is not None and not int(low) < int(high):
        return "minval must be below maxval (TF raises)"
    return None


def _check_key_counter(op: tf.Operation) -> str | None:
    if known_dims(op.inputs[0]) != (2,):
        return "seed must have shape [2]"
    return None


# -- the rules ---------------------------------------------------------------------------------
_BITS_NOTE = "TF's Philox bit for bit (TF's XLA draws other numbers)"


@register("StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg",
          dtypes=SEEDS | KEY_COUNTER, check=_check_key_counter,
          note="TF's seed scrambling (GenerateKey); the alg output is Philox")
def _lower_get_key_counter(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    key, low, high = key_counter_from_seed(ctx, operands[0])
    counter = ctx.emit("concatenate", [ctx.reshape(low, (1,)), ctx.reshape(high, (1,))],
                       dimensions=(0,))
    results = [ctx.reshape(key, (1,)), counter]
    if op.type == "StatelessRandomGetKeyCounterAlg":
        results.append(ctx.constant(PHILOX, "s32"))
    return results


def _v2_key_counter(ctx: LoweringContext, operands: Operands
                    ) -> tuple[Instruction, tuple[Instruction, Instruction]]:
    key, counter = operands[1], operands[2]
    return _element(ctx, key, 0), (_element(ctx, counter, 0), _element(ctx, counter, 1))


def _seeded_key_counter(ctx: LoweringContext, operands: Operands
                        ) -> tuple[Instruction, tuple[Instruction, Instruction]]:
    key, low, high = key_counter_from_seed(ctx, operands[1])
    return key, (low, high)


def _uniform(key_counter: Any) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        etype = shape.element_type
        return [fill(ctx, key, counter, shape.dims, etype, _lanes_per_output(etype),
                     lambda lanes: _uniform_float(ctx, lanes, etype))]
    return lower


def _uniform_full_int(key_counter: Any) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        etype = shape.element_type
        return [fill(ctx, key, counter, shape.dims, etype, _lanes_per_output(etype),
                     lambda lanes: _full_int(ctx, lanes, etype))]
    return lower


def _uniform_int(key_counter: Any, bounds: int) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        return [uniform_int(ctx, key, counter, shape.dims, shape.element_type,
                             operands[bounds], operands[bounds + 1])]
    return lower


register("StatelessRandomUniformV2", dtypes=FLOAT | KEY_COUNTER, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE)(_uniform(_v2_key_counter))
register("StatelessRandomUniformFullIntV2", dtypes=INTEGER | UNSIGNED, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE)(_uniform_full_int(_v2_key_counter))
register("StatelessRandomUniformIntV2", dtypes=INTEGER | KEY_COUNTER, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE + "; minval < maxval (an empty range at run "
         "time draws minval + bits; TF raises)")(_uniform_int(_v2_key_counter, 4))
register("StatelessRandomUniform", dtypes=FLOAT | SEEDS, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE)(_uniform(_seeded_key_counter))
register("StatelessRandomUniformFullInt", dtypes=INTEGER | UNSIGNED, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE)(_uniform_full_int(_seeded_key_counter))
register("StatelessRandomUniformInt", dtypes=INTEGER, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE + "; minval < maxval (an empty range at run "
         "time draws minval + bits; TF raises)")(_uniform_int(_seeded_key_counter, 2))
