"""Lowering rules of TF's stateless random ops: TF's own Philox-4x32-10 and TF's own
conversions of its bits to numbers, so a compiled op draws exactly what TF's CPU kernel
draws (TF's XLA draws other numbers).

Registered into `registry.OP_RULES` on import. The facts come from TF's sources
(`philox_random.h`, `random_distributions*.h`, `random_op_cpu.h`,
`stateless_random_ops*.{cc,h}`); Philox is primitive HLO as XLA's RngBitGeneratorExpander
writes it, one counter value per output group. Normals are TF's Box-Muller with libm's
`sinf`/`cosf` and glibc's `logf` written out (the backend's own f32 log differs in the
last bit); truncated normals stay in TF (a redraw loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
         dims: tuple[int, ...], etype: str, per_group: int,
         lanes_of: Callable[[int], Sequence[int]], convert: Callable[..., Instruction]
         ) -> Instruction:
    """An output of `dims` drawn as TF's fixed-sample distributions draw it: each group
    of `per_group` outputs from one Philox call, output q of a group from its lanes
    `lanes_of(q)`; `convert(lanes, position)` maps those u32 lanes (and the u32 position
    q of each element in its group) to values.

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
    index = ctx.emit("iota", [], shape=Shape("u64", (size,)), iota_dimension=0)
    group = _binary(ctx, "shift-right-logical", index, per_group.bit_length() - 1)
    bits = group_bits(ctx, key, counter, group)
    position = ctx.convert(_binary(ctx, "and", index, per_group - 1), "u32")
    chosen = []
    for slot in range(len(lanes_of(0))):
        value = bits[lanes_of(per_group - 1)[slot]]
        for q in range(per_group - 2, -1, -1):
            if lanes_of(q)[slot] != lanes_of(q + 1)[slot]:  # positions <= q take its lane
                at_most = ctx.emit("compare", [position, _full(ctx, q, "u32", (size,))],
                                   direction="LE")
                value = ctx.emit("select", [at_most, bits[lanes_of(q)[slot]], value])
        chosen.append(value)
    return ctx.reshape(convert(chosen, position), dims)


def _equals(ctx: LoweringContext, x: Instruction, value: int) -> Instruction:
    return ctx.emit("compare", [x, _full(ctx, value, x.shape.element_type, x.shape.dims)],
                    direction="EQ")


def _fill_fixed(ctx: LoweringContext, key: Instruction,
                counter: tuple[Instruction, Instruction], dims: tuple[int, ...], etype: str,
                convert: Callable[[list[Instruction]], Instruction]) -> Instruction:
    """`fill` for the distributions whose outputs each take their own lanes: one for a
    32-bit or smaller type, two for a 64-bit one (UniformDistribution, the integers)."""
    width = _lanes_per_output(etype)
    return fill(ctx, key, counter, dims, etype, 4 // width,
                lambda q: range(q * width, (q + 1) * width),
                lambda lanes, position: convert(lanes))


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

    return _fill_fixed(ctx, key, counter, dims, etype, convert)


# -- normals: Box-Muller with glibc's logf ----------------------------------------------------
# glibc's logf (sysdeps/ieee754/flt-32/e_logf.c, e_logf_data.c; ARM's optimized routines):
# x = 2^k z with z in [OFF, 2 OFF), a 16-entry table of (1/c, log c) by z's top mantissa
# bits, log1p(z/c - 1) by a cubic in double, rounded once to float.
_LOGF_OFF = 0x3F330000
_LOGF_TABLE = tuple((float.fromhex(a), float.fromhex(b)) for a, b in (
    ("0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2"),
    ("0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2"),
    ("0x1.49539f0f010bp+0", "-0x1.01eae7f513a67p-2"),
    ("0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3"),
    ("0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3"),
    ("0x1.25e227b0b8eap+0", "-0x1.1aa2bc79c81p-3"),
    ("0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4"),
    ("0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4"),
    ("0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5"),
    ("0x1p+0", "0x0p+0"),
    ("0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5"),
    ("0x1.ca4b31f026aap-1", "0x1.c5e53aa362eb4p-4"),
    ("0x1.b2036576afce6p-1", "0x1.526e57720db08p-3"),
    ("0x1.9c2d163a1aa2dp-1", "0x1.bc2860d22477p-3"),
    ("0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2"),
    ("0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2")))
_LOGF_LN2 = float.fromhex("0x1.62e42fefa39efp-1")
_LOGF_POLY = tuple(float.fromhex(a) for a in (
    "-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2", "-0x1.ffffef20a4123p-2"))
# BoxMullerFloat's floor on u1, and its float bits.
_EPSILON, _EPSILON_BITS = 1.0e-7, 0x33D6BF95


def _f64(ctx: LoweringContext, value: float, like: Instruction) -> Instruction:
    return _full(ctx, value, "f64", like.shape.dims)  # type: ignore[arg-type]


def _table(ctx: LoweringContext, index: Instruction, values: Sequence[float]) -> Instruction:
    """values[index] for a u32 `index` < 16, as a tree of selects on its bits."""
    level = [_f64(ctx, v, index) for v in values]
    bit = 0
    while len(level) > 1:
        chosen = _binary(ctx, "and", _binary(ctx, "shift-right-logical", index, bit), 1)
        odd = _equals(ctx, chosen, 1)
        level = [ctx.emit("select", [odd, level[j + 1], level[j]])
                 for j in range(0, len(level), 2)]
        bit += 1
    return level[0]


def box_muller_log(ctx: LoweringContext, mantissa: Instruction) -> Instruction:
    """glibc's logf(u1) for Box-Muller's u1 = max(m * 2^-23, 1e-7f) of the u32 mantissa
    bits m, in f32. u1 takes 2^23 values, and on every one of them this double
    arithmetic (no fused multiply-adds) gives glibc's result, with or without its FMA
    variant; the CPU backend's own f32 log differs in the last bit on some."""
    # u1's float bits: m = 2^p + ..., so u1 = 2^(p-23) (1 + ...): exponent field 104 + p.
    p = _full(ctx, 0, "u32", mantissa.shape.dims)  # type: ignore[arg-type]
    for step in (16, 8, 4, 2, 1):
        candidate = _binary(ctx, "add", p, step)
        above = ctx.emit("compare", [ctx.emit("shift-right-logical", [mantissa, candidate]),
                                     _full(ctx, 0, "u32", mantissa.shape.dims)],
                         direction="NE")
        p = ctx.emit("select", [above, candidate, p])
    fraction = _binary(ctx, "and", ctx.emit("shift-left", [
        mantissa, ctx.emit("subtract", [_full(ctx, 23, "u32", p.shape.dims), p])]), 0x7FFFFF)
    ix = ctx.emit("or", [_binary(ctx, "shift-left", _binary(ctx, "add", p, 104), 23), fraction])
    zero = _equals(ctx, mantissa, 0)
    ix = ctx.emit("select", [zero, _full(ctx, _EPSILON_BITS, "u32", ix.shape.dims), ix])
    # e_logf.c: tmp = ix - OFF; i = (tmp >> 19) % 16; k = tmp >> 23 (arithmetic); z = x 2^-k
    tmp = _binary(ctx, "subtract", ix, _LOGF_OFF)
    index = _binary(ctx, "and", _binary(ctx, "shift-right-logical", tmp, 19), 15)
    k = _binary(ctx, "shift-right-arithmetic", ctx.convert(tmp, "s32"), 23)  # <= 0 here
    u1 = _mantissa_fraction(ctx, mantissa, 0x7FFFFF, 23, "f32")
    u1 = ctx.emit("select", [zero, ctx.full(_EPSILON, u1.shape), u1])
    scale = ctx.convert(ctx.emit("shift-left", [_full(ctx, 1, "u32", k.shape.dims),
                                                ctx.convert(ctx.emit("negate", [k]), "u32")]),
                        "f64")
    z = ctx.emit("multiply", [ctx.convert(u1, "f64"), scale])
    invc = _table(ctx, index, [c for c, _ in _LOGF_TABLE])
    logc = _table(ctx, index, [log for _, log in _LOGF_TABLE])
    r = ctx.emit("subtract", [ctx.emit("multiply", [z, invc]), _f64(ctx, 1.0, z)])
    y0 = ctx.emit("add", [logc, ctx.emit("multiply", [ctx.convert(k, "f64"),
                                                      _f64(ctx, _LOGF_LN2, z)])])
    r2 = ctx.emit("multiply", [r, r])
    a0, a1, a2 = (_f64(ctx, a, z) for a in _LOGF_POLY)
    y = ctx.emit("add", [ctx.emit("multiply", [a1, r]), a2])
    y = ctx.emit("add", [ctx.emit("multiply", [a0, r2]), y])
    y = ctx.emit("add", [ctx.emit("multiply", [y, r2]), ctx.emit("add", [y0, r])])
    return ctx.convert(y, "f32")


def _box_muller_f32(ctx: LoweringContext, lanes: list[Instruction], position: Instruction
                    ) -> Instruction:
    """BoxMullerFloat(x0, x1): sin(v1) u2 for an even position, cos(v1) u2 for an odd
    one, with u2 = sqrtf(-2 logf(u1)) and v1 = (float)(2 pi (double)u(x1)); sinf and
    cosf give what sincosf gives."""
    log_u1 = box_muller_log(ctx, _binary(ctx, "and", lanes[0], 0x7FFFFF))
    u2 = ctx.emit("sqrt", [ctx.emit("multiply", [ctx.full(-2.0, log_u1.shape), log_u1])])
    u = ctx.convert(_mantissa_fraction(ctx, lanes[1], 0x7FFFFF, 23, "f32"), "f64")
    v1 = ctx.convert(ctx.emit("multiply", [_f64(ctx, 2 * math.pi, u), u]), "f32")
    return _sin_or_cos(ctx, v1, position, u2)


def _sin_or_cos(ctx: LoweringContext, v1: Instruction, position: Instruction,
                u2: Instruction) -> Instruction:
    odd = _equals(ctx, _binary(ctx, "and", position, 1), 1)
    chosen = ctx.emit("select", [odd, ctx.emit("cosine", [v1]), ctx.emit("sine", [v1])])
    return ctx.emit("multiply", [chosen, u2])


def _box_muller_f64(ctx: LoweringContext, lanes: list[Instruction], position: Instruction
                    ) -> Instruction:
    """BoxMullerDouble(x0, x1, x2, x3): glibc's log, sin and cos (as its sincos) on
    u1 = max(Uint64ToDouble(x0, x1), 1e-7) and v1 = 2 pi Uint64ToDouble(x2, x3)."""
    u1 = _uniform_float(ctx, lanes[:2], "f64")
    u1 = ctx.emit("maximum", [u1, _f64(ctx, _EPSILON, u1)])
    v1 = ctx.emit("multiply", [_f64(ctx, 2 * math.pi, u1), _uniform_float(ctx, lanes[2:], "f64")])
    u2 = ctx.emit("sqrt", [ctx.emit("multiply", [_f64(ctx, -2.0, u1), ctx.emit("log", [u1])])])
    return _sin_or_cos(ctx, v1, position, u2)


def normal(ctx: LoweringContext, key: Instruction, counter: tuple[Instruction, Instruction],
           dims: tuple[int, ...], etype: str) -> Instruction:
    """NormalDistribution: four floats (f16, bf16 rounded from f32 ones) per Philox call,
    a Box-Muller pair from lanes (0, 1) and (2, 3); two doubles from all four lanes."""
    if etype == "f64":
        return fill(ctx, key, counter, dims, etype, 2, lambda q: range(4),
                    lambda lanes, position: _box_muller_f64(ctx, lanes, position))
    return fill(ctx, key, counter, dims, etype, 4, lambda q: (q // 2 * 2, q // 2 * 2 + 1),
                lambda lanes, position: ctx.convert(_box_muller_f32(ctx, lanes, position),
                                                    etype))


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


def _bits_as(convert: Any, key_counter: Any) -> Any:
    """A draw of fixed width: each element's lanes converted by `convert(ctx, lanes,
    etype)` (uniform floats, full-range integers)."""
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        etype = shape.element_type
        return [_fill_fixed(ctx, key, counter, shape.dims, etype,
                            lambda lanes: convert(ctx, lanes, etype))]
    return lower


def _normal(key_counter: Any) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        return [normal(ctx, key, counter, shape.dims, shape.element_type)]
    return lower


def _uniform_int(key_counter: Any, bounds: int) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        shape = ctx.output_shape()
        key, counter = key_counter(ctx, operands)
        return [uniform_int(ctx, key, counter, shape.dims, shape.element_type,
                             operands[bounds], operands[bounds + 1])]
    return lower


register("StatelessRandomUniformV2", dtypes=FLOAT | KEY_COUNTER, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE)(_bits_as(_uniform_float, _v2_key_counter))
register("StatelessRandomUniformFullIntV2", dtypes=INTEGER | UNSIGNED, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE)(_bits_as(_full_int, _v2_key_counter))
register("StatelessRandomUniformIntV2", dtypes=INTEGER | KEY_COUNTER, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE + "; minval < maxval (an empty range at run "
         "time draws minval + bits; TF raises)")(_uniform_int(_v2_key_counter, 4))
register("StatelessRandomUniform", dtypes=FLOAT | SEEDS, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE)(_bits_as(_uniform_float, _seeded_key_counter))
register("StatelessRandomUniformFullInt", dtypes=INTEGER | UNSIGNED, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE)(_bits_as(_full_int, _seeded_key_counter))
register("StatelessRandomUniformInt", dtypes=INTEGER, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE + "; minval < maxval (an empty range at run "
         "time draws minval + bits; TF raises)")(_uniform_int(_seeded_key_counter, 2))
register("StatelessRandomNormalV2", dtypes=FLOAT | KEY_COUNTER, static_inputs=(0, 3),
         check=_check_v2, note=_BITS_NOTE + "; glibc's logf, sinf, cosf")(_normal(_v2_key_counter))
register("StatelessRandomNormal", dtypes=FLOAT | SEEDS, static_inputs=(0,),
         check=_check_seeded, note=_BITS_NOTE + "; glibc's logf, sinf, cosf")(
             _normal(_seeded_key_counter))
