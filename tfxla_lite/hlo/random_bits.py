"""HLO `rng-bit-generator`: shape rule and NumPy reference, bit for bit as XLA's CPU backend.

`(u64[s], T[dims]) rng-bit-generator(u64[s] state), algorithm=rng_philox` returns the next
state and an array of random bits (unsigned or signed integers of 8 to 64 bits), as XLA's
`RngBitGeneratorExpander` expands it into the generators of `prng.cc` (Philox4x32-10 by
default, ThreeFry2x32-20). How the state, counters and lanes map to elements:
docs/architecture.md, "rng-bit-generator's bits". Used by `opcodes.py`, `evaluator.py`
and the CPU kernel (`codegen/cpu/random_bits.py`), which computes the same functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.hlo.shape import INTEGER_TYPES, Shape

if TYPE_CHECKING:  # ir imports opcodes, which imports this module
    from tfxla_lite.hlo.ir import Instruction

ALGORITHMS = ("rng_default", "rng_philox", "rng_three_fry")
PHILOX_ROUND_KEYS = (0x9E3779B9, 0xBB67AE85)
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
THREEFRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
THREEFRY_PARITY = 0x1BD11BDA
_M32 = np.uint64(0xFFFFFFFF)


class RandomShapeError(ValueError):
    """Operands or attributes rng-bit-generator does not take."""


def algorithm_of(attributes: Mapping[str, Any]) -> str:
    """`rng_philox` or `rng_three_fry` (`rng_default` is Philox on XLA's CPU backend)."""
    algorithm = str(attributes.get("algorithm", "rng_default"))
    if algorithm not in ALGORITHMS:
        raise RandomShapeError(f"rng-bit-generator algorithm is one of {', '.join(ALGORITHMS)}"
                               f", got {algorithm}")
    return "rng_philox" if algorithm == "rng_default" else algorithm


def check_shapes(state: Shape, result: Shape, attributes: Mapping[str, Any]) -> None:
    """Whether `result` is a shape rng-bit-generator of `state` can give (verifier)."""
    algorithm = algorithm_of(attributes)
    sizes = (2, 3) if algorithm == "rng_philox" else (2,)
    if state.is_tuple or state.element_type != "u64" or state.rank != 1 \
            or state.dims[0] not in sizes:
        raise RandomShapeError(f"{algorithm} takes a u64 state of "
                               f"{' or '.join(map(str, sizes))} words, got {state}")
    if not result.is_tuple or len(result.tuple_shapes or ()) != 2 \
            or result.tuple_shapes[0] != state or result.tuple_shapes[1].is_tuple \
            or result.tuple_shapes[1].element_type not in INTEGER_TYPES:
        raise RandomShapeError(f"rng-bit-generator gives (state, integer array), got {result}")


def _split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x & _M32, x >> np.uint64(32)


def philox4x32(lanes: list[np.ndarray], key: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """Philox4x32-10 of u32 lanes (held in u64 arrays) under the two u32 key words."""
    x = list(lanes)
    k0, k1 = key
    for _ in range(10):
        p0 = x[0] * np.uint64(PHILOX_MULTIPLIERS[0])
        p1 = x[2] * np.uint64(PHILOX_MULTIPLIERS[1])
        x = [(p1 >> np.uint64(32)) ^ x[1] ^ k0, p1 & _M32,
             (p0 >> np.uint64(32)) ^ x[3] ^ k1, p0 & _M32]
        k0 = (k0 + np.uint64(PHILOX_ROUND_KEYS[0])) & _M32
        k1 = (k1 + np.uint64(PHILOX_ROUND_KEYS[1])) & _M32
    return x


def threefry2x32(x0: np.ndarray, x1: np.ndarray, key: tuple[int, int]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """ThreeFry2x32 with 20 rounds of u32 words (held in u64 arrays)."""
    ks = [np.uint64(key[0]), np.uint64(key[1]),
          np.uint64(THREEFRY_PARITY ^ key[0] ^ key[1])]

    def rotate(v: np.ndarray, r: int) -> np.ndarray:
        return ((v << np.uint64(r)) | (v >> np.uint64(32 - r))) & _M32

    x = [(x0 + ks[0]) & _M32, (x1 + ks[1]) & _M32]
    for block in range(5):
        for r in THREEFRY_ROTATIONS[4 * (block % 2):4 * (block % 2) + 4]:
            x[0] = (x[0] + x[1]) & _M32
            x[1] = rotate(x[1], r) ^ x[0]
        x[0] = (x[0] + ks[(block + 1) % 3]) & _M32
        x[1] = (x[1] + ks[(block + 2) % 3] + np.uint64(block + 1)) & _M32
    return x[0], x[1]


def threefry_half_dims(dims: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(split dimension, half dims) of XLA's SplitShapeIntoHalves; a scalar: (0, (1,))."""
    if not dims:
        return 0, (1,)
    even = [d for d, size in enumerate(dims) if size % 2 == 0]
    split = even[0] if even else max(range(len(dims)), key=lambda d: (dims[d], -d))
    half = list(dims)
    half[split] = -(-dims[split] // 2)
    return split, tuple(half)


def reference(state: np.ndarray, shape: Shape, attributes: Mapping[str, Any]
              ) -> tuple[np.ndarray, np.ndarray]:
    state = np.asarray(state, dtype=np.uint64)
    algorithm = algorithm_of(attributes)
    bits = 64 if shape.numpy_dtype.itemsize == 8 else 32
    n = shape.num_elements
    key = state[0]
    new_state = state.copy()
    if algorithm == "rng_philox":
        low, high = (state[1], state[2]) if state.size == 3 else (state[1], state[0])
        counters = -(-n // 4) if bits == 32 else -(-n // 2)
        i = np.arange(counters, dtype=np.uint64)
        counter_low = low + i
        counter_high = high + (counter_low < low).astype(np.uint64)
        lanes = philox4x32([*_split(counter_low), *_split(counter_high)], _split(key))
        if bits == 32:
            values = np.stack(lanes, axis=-1).reshape(-1)[:n]
        else:
            values = np.stack([lanes[0] | (lanes[1] << np.uint64(32)),
                               lanes[2] | (lanes[3] << np.uint64(32))], axis=-1).reshape(-1)[:n]
        advanced_low = low + np.uint64(counters)
        new_state[1] = advanced_low
        if state.size == 3:
            new_state[2] = high + np.uint64(advanced_low < low)
    else:
        counter = state[1]
        key_words = (int(key) & 0xFFFFFFFF, int(key) >> 32)
        if bits == 64:
            inputs = counter + np.arange(n, dtype=np.uint64)
            x0, x1 = threefry2x32(*_split(inputs), key_words)
            values = x0 | (x1 << np.uint64(32))
            new_state[1] = counter + np.uint64(n)
        else:
            split, half = threefry_half_dims(shape.dims)
            count = int(np.prod(half))
            inputs = counter + np.arange(count, dtype=np.uint64)
            x0, x1 = threefry2x32(*_split(inputs), key_words)
            pair = np.stack([x0.reshape(half), x1.reshape(half)], axis=split + 1)
            joined = list(half)
            joined[split] *= 2
            full = pair.reshape(joined)
            values = full[tuple(slice(0, d) for d in shape.dims)] if shape.dims else full[0]
            new_state[1] = counter + np.uint64(count)
    values = np.asarray(values, dtype=np.uint64).reshape(shape.dims)
    unsigned = np.dtype(f"u{shape.numpy_dtype.itemsize}")
    return new_state, values.astype(unsigned).view(shape.numpy_dtype)


def _rng_bit_generator(inst: Instruction, operands: Sequence[Any]) -> tuple:
    check_shapes(inst.operand(0).shape, inst.shape, inst.attributes)
    assert inst.shape.tuple_shapes is not None
    return reference(operands[0], inst.shape.tuple_shapes[1], inst.attributes)


# The evaluator's reference of this opcode (`evaluator.REFERENCES`).
REFERENCES = {"rng-bit-generator": _rng_bit_generator}
