"""The NumPy reference evaluator: what every HLO opcode computes, on NumPy arrays.

One reference per opcode of `tfxla_lite.hlo.opcodes.OPCODES` (docs/conventions.md, habit 2); a
test fails when one is missing. Passes are checked by evaluating a module before
and after them, and the backends by comparing their kernels with `evaluate`.

Semantics follow XLA's CPU backend where NumPy differs (integer division by zero,
NaN-propagating max/min, saturating converts, clamped dynamic indices, f16/bf16
accumulating in f32, ...): docs/architecture.md, "The reference evaluator's semantics".
NumPy floating-point warnings are silenced: overflow to inf and NaN are results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tfxla_lite.hlo import bit_ops, convolution, linalg, random_bits, sort
from tfxla_lite.hlo.attributes import ScatterDimensions
from tfxla_lite.hlo.dynamic_padder import check_evaluable
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_identity_on_integers, opcodes_in
from tfxla_lite.hlo.shape import FLOAT_TYPES, SIGNED_TYPES, UNSIGNED_TYPES, Shape

Value = np.ndarray | tuple
# A reference maps an instruction and its operands' values to its value. A parameter
# gets the argument it stands for as its one operand.
Reference = Callable[[Instruction, Sequence[Any]], Any]

REFERENCES: dict[str, Reference] = {}


def _reference(*opcodes: str) -> Callable[[Reference], Reference]:
    def register(fn: Reference) -> Reference:
        for opcode in opcodes:
            REFERENCES[opcode] = fn
        return fn

    return register


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype NumPy computes `dtype` values in: f32 for the 2-byte floats it lacks."""
    if dtype.kind == "V" or dtype.name == "bfloat16":
        return np.dtype(np.float32)
    return dtype


def _result(value: Any, shape: Shape) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype != shape.numpy_dtype:
        array = array.astype(shape.numpy_dtype)
    if array.shape != shape.dims and not shape.admits(array.shape):
        raise AssertionError(f"reference produced {array.shape}, expected {shape}")
    return array


# -- elementwise ------------------------------------------------------------------------

def _round_afz(x: np.ndarray) -> np.ndarray:
    truncated = np.trunc(x)
    return np.where(np.abs(x - truncated) >= 0.5, truncated + np.sign(x), truncated)


def _erf(x: np.ndarray) -> np.ndarray:
    wide = np.asarray(x, dtype=np.float64)
    return np.vectorize(math.erf, otypes=[np.float64])(wide) if wide.size else wide


_FLOAT_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exponential": np.exp,
    "exponential-minus-one": np.expm1,
    "log": np.log,
    "log-plus-one": np.log1p,
    "tanh": np.tanh,
    "logistic": lambda x: 1 / (1 + np.exp(-x)),
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "cbrt": np.cbrt,
    "erf": _erf,
    "floor": np.floor,
    "ceil": np.ceil,
    "round-nearest-afz": _round_afz,
    "round-nearest-even": np.rint,
    "sine": np.sin,
    "cosine": np.cos,
    "tan": np.tan,
}


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


# Unary opcodes of every type, computed on the operand as floats compute.
_ANY_TYPE_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs, "negate": np.negative, "sign": np.sign, "is-finite": np.isfinite}


@_reference(*opcodes_in("unary"))
def _unary(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    (x,) = operands
    opcode = inst.opcode
    if opcode == "copy":
        return _result(np.array(x, copy=True), inst.shape)
    if opcode == "not":
        return _result(np.logical_not(x) if x.dtype == np.bool_ else np.invert(x), inst.shape)
    wide = x.astype(_compute_dtype(x.dtype))
    if opcode in _ANY_TYPE_UNARY:
        return _result(_ANY_TYPE_UNARY[opcode](wide), inst.shape)
    if not _is_float(x.dtype):
        if is_identity_on_integers(opcode):
            return _result(x, inst.shape)
        raise TypeError(f"{opcode} takes floats, got {x.dtype}")
    return _result(_FLOAT_UNARY[opcode](wide), inst.shape)


def _integer_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    zero = b == 0
    if a.dtype.kind == "u":
        quotient = a // np.where(zero, 1, b).astype(a.dtype)
        return np.where(zero, np.iinfo(a.dtype).max, quotient).astype(a.dtype)
    overflow = (a == np.iinfo(a.dtype).min) & (b == -1)
    safe = np.where(zero | overflow, 1, b).astype(a.dtype)
    quotient = a // safe
    # Floor division rounds toward -inf; step back toward zero where it did.
    inexact = (quotient * safe != a) & ((a < 0) != (safe < 0))
    quotient = quotient + inexact.astype(a.dtype)
    return np.where(zero, -1, quotient).astype(a.dtype)


def _integer_remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    zero = b == 0
    safe = np.where(zero, 1, b).astype(a.dtype)
    if a.dtype.kind == "i":
        safe = np.where(safe == -1, 1, safe).astype(a.dtype)  # x % -1 is 0, no overflow
    return np.where(zero, a, np.fmod(a, safe)).astype(a.dtype)


def _integer_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    value = np.power(a, np.where(b < 0, 0, b).astype(b.dtype))
    if a.dtype.kind == "i":
        negative = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        value = np.where(b < 0, negative, value)
    return value.astype(a.dtype)


def _shift(opcode: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    out_of_range = (b < 0) | (b >= bits) if b.dtype.kind == "i" else b >= bits
    amount = np.where(out_of_range, 0, b).astype(a.dtype)
    if opcode == "shift-left":
        return np.where(out_of_range, 0, np.left_shift(a, amount)).astype(a.dtype)
    if opcode == "shift-right-arithmetic":
        # On the bit pattern, as XLA's `ashr`: an unsigned value's top bit fills too.
        signed = a.view(np.dtype(f"i{a.dtype.itemsize}"))
        shifted = np.right_shift(signed, amount.view(signed.dtype))
        fill = np.where(signed < 0, -1, 0).astype(signed.dtype)
        return np.where(out_of_range, fill, shifted).astype(signed.dtype).view(a.dtype)
    unsigned = np.dtype(f"u{a.dtype.itemsize}")
    logical = np.right_shift(a.view(unsigned), amount.view(unsigned)).view(a.dtype)
    return np.where(out_of_range, 0, logical).astype(a.dtype)


_FLOAT_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
    "remainder": np.fmod,
    "atan2": np.arctan2,
}


@_reference(*opcodes_in("binary"))
def _binary(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    a, b = operands
    opcode = inst.opcode
    if _is_float(a.dtype):
        compute = _compute_dtype(a.dtype)
        value = _FLOAT_BINARY[opcode](a.astype(compute), b.astype(compute))
    elif opcode in ("and", "or", "xor"):
        value = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[opcode](a, b)
    elif opcode.startswith("shift"):
        value = _shift(opcode, a, b)
    elif opcode == "divide":
        value = _integer_divide(a, b)
    elif opcode == "remainder":
        value = _integer_remainder(a, b)
    elif opcode == "power":
        value = _integer_power(a, b)
    elif opcode == "atan2":
        raise TypeError(f"atan2 takes floats, got {a.dtype}")
    else:  # add, subtract, multiply, maximum, minimum wrap or compare as NumPy does
        value = _FLOAT_BINARY[opcode](a, b)
    return _result(value, inst.shape)


_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                "GT": np.greater, "GE": np.greater_equal}


@_reference("compare")
def _compare(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    a, b = operands
    if inst.attributes.get("type") == "TOTALORDER" and a.dtype.kind == "f":
        a, b = _total_order_key(a), _total_order_key(b)
    compute = _compute_dtype(a.dtype)
    return _result(_COMPARISONS[inst.attributes["direction"]](a.astype(compute),
                                                               b.astype(compute)), inst.shape)


def _total_order_key(x: np.ndarray) -> np.ndarray:
    """Signed integers ordered as XLA's TOTALORDER orders floats: -NaN < -inf < ... <
    -0.0 < +0.0 < ... < inf < +NaN (the bits, negatives with all but the sign flipped)."""
    bits = np.ascontiguousarray(x).view(np.dtype(f"i{x.dtype.itemsize}"))
    magnitude = np.array(np.iinfo(bits.dtype).max, dtype=bits.dtype)
    return np.where(bits < 0, bits ^ magnitude, bits)


@_reference("select")
def _select(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    predicate, on_true, on_false = operands
    return _result(np.where(predicate, on_true, on_false), inst.shape)


@_reference("clamp")
def _clamp(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    low, x, high = operands
    compute = _compute_dtype(x.dtype)
    value = np.minimum(np.maximum(x.astype(compute), low.astype(compute)), high.astype(compute))
    return _result(value, inst.shape)


@_reference("convert")
def _convert(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    (x,) = operands
    target = inst.shape.element_type
    dtype = inst.shape.numpy_dtype
    if _is_float(x.dtype) and target in SIGNED_TYPES | UNSIGNED_TYPES:
        info = np.iinfo(dtype)
        truncated = np.trunc(x.astype(np.float64))
        truncated = np.where(np.isnan(truncated), 0, truncated)
        # float64 cannot hold every int64 bound exactly: pin the ends explicitly.
        inside = np.clip(truncated, float(info.min), float(info.max))
        inside = np.where((inside >= float(info.max)) | (inside <= float(info.min)), 0, inside)
        value = inside.astype(dtype)
        value = np.where(truncated >= float(info.max), info.max, value)
        value = np.where(truncated <= float(info.min), info.min, value)
        return _result(value.astype(dtype), inst.shape)
    if target == "pred":
        return _result(x != 0, inst.shape)
    if x.dtype.name == "bfloat16" and target not in FLOAT_TYPES:
        x = x.astype(np.float32)
    return _result(x.astype(dtype), inst.shape)


# -- data movement and sources ----------------------------------------------------------

@_reference("parameter")
def _parameter(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    (argument,) = operands
    if inst.shape.is_tuple:
        return tuple(argument)  # type: ignore[return-value]
    array = np.asarray(argument)
    if not inst.shape.admits(array.shape):  # a dynamic dimension: at most its bound
        raise ValueError(f"argument for %{inst.name} has shape {array.shape}, "
                         f"expected {inst.shape}")
    return _result(array, inst.shape)


@_reference("constant")
def _constant(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return _result(inst.literal, inst.shape)


@_reference("iota")
def _iota(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    dims = inst.shape.dims
    axis = int(inst.attributes["iota_dimension"])
    line = np.arange(dims[axis]).reshape([-1 if i == axis else 1 for i in range(len(dims))])
    return _result(np.broadcast_to(line, dims).astype(inst.shape.numpy_dtype), inst.shape)


@_reference("broadcast")
def _broadcast(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    (x,) = operands
    mapping = list(inst.dimensions)  # operand dim i -> output dim mapping[i]
    order = sorted(range(len(mapping)), key=lambda i: mapping[i])
    x = np.transpose(x, order)
    expanded = [1] * inst.shape.rank
    target = list(inst.shape.dims)
    for i in order:
        expanded[mapping[i]] = target[mapping[i]] = operands[0].shape[i]  # a dynamic size
    value = np.broadcast_to(x.reshape(expanded), target)
    return _result(np.array(value, copy=True), inst.shape)


@_reference("reshape", "bitcast")
def _reshape(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return _result(np.reshape(operands[0], inst.shape.dims), inst.shape)


@_reference("transpose")
def _transpose(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return _result(np.ascontiguousarray(np.transpose(operands[0], inst.dimensions)), inst.shape)


@_reference("slice")
def _slice(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    index = tuple(slice(start, limit, stride) for start, limit, stride in inst.attributes["slice"])
    return _result(np.array(operands[0][index], copy=True), inst.shape)


@_reference("concatenate")
def _concatenate(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return _result(np.concatenate(list(operands), axis=inst.dimensions[0]), inst.shape)


@_reference("tuple")
def _tuple(inst: Instruction, operands: Sequence[Any]) -> tuple:
    return tuple(operands)


@_reference("get-tuple-element")
def _get_tuple_element(inst: Instruction, operands: Sequence[Any]) -> Any:
    return operands[0][int(inst.attributes["index"])]


@_reference("call", "fusion")
def _call(inst: Instruction, operands: Sequence[Any]) -> Any:
    return evaluate_computation(inst.called_computations[0], list(operands))


@_reference("reverse")
def _reverse(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    return _result(np.array(np.flip(operands[0], axis=inst.dimensions), copy=True), inst.shape)


@_reference("pad")
def _pad(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, value = operands
    config = inst.attributes["padding"].dimensions
    # Interior padding first, then positive edges; negative edges slice afterwards.
    spread = tuple((n - 1) * (d.interior + 1) + 1 if n else 0 for n, d in zip(x.shape, config))
    grown = tuple(max(d.low, 0) + n + max(d.high, 0) for n, d in zip(spread, config))
    out = np.full(grown, value[()], dtype=x.dtype)
    placed = tuple(slice(max(d.low, 0), max(d.low, 0) + n, d.interior + 1)
                   for n, d in zip(spread, config))
    out[placed] = x
    trimmed = tuple(slice(max(-d.low, 0), size - max(-d.high, 0))
                    for size, d in zip(grown, config))
    return _result(np.array(out[trimmed], copy=True), inst.shape)


def _clamped_starts(starts: Sequence[Any], dims: tuple[int, ...], sizes: tuple[int, ...]
                    ) -> list[int]:
    """XLA clamps dynamic start indices so the whole slice stays inside the operand."""
    return [min(max(int(s), 0), dim - size) for s, dim, size in zip(starts, dims, sizes)]


@_reference("dynamic-slice")
def _dynamic_slice(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, *starts = operands
    sizes = inst.shape.dims
    begin = _clamped_starts(starts, x.shape, sizes)
    index = tuple(slice(b, b + n) for b, n in zip(begin, sizes))
    return _result(np.array(x[index], copy=True), inst.shape)


@_reference("dynamic-update-slice")
def _dynamic_update_slice(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, update, *starts = operands
    begin = _clamped_starts(starts, x.shape, update.shape)
    out = np.array(x, copy=True)
    out[tuple(slice(b, b + n) for b, n in zip(begin, update.shape))] = update
    return _result(out, inst.shape)


@_reference("gather")
def _gather(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, indices = operands
    attrs = inst.attributes
    offset_dims = tuple(attrs["offset_dims"])
    collapsed = set(attrs["collapsed_slice_dims"])
    start_index_map = tuple(attrs["start_index_map"])
    vector_dim = int(attrs["index_vector_dim"])
    sizes = tuple(attrs["slice_sizes"])
    if vector_dim == indices.ndim:
        indices = indices[..., None]
    indices = np.moveaxis(indices, vector_dim, -1).astype(np.int64)
    out = np.empty(inst.shape.dims, dtype=x.dtype)
    batch_dims = [d for d in range(inst.shape.rank) if d not in offset_dims]
    kept = [d for d in range(x.ndim) if d not in collapsed]
    for out_index in np.ndindex(*inst.shape.dims):
        vector = indices[tuple(out_index[d] for d in batch_dims)]
        start = [0] * x.ndim
        for k, d in enumerate(start_index_map):
            start[d] = min(max(int(vector[k]), 0), x.shape[d] - sizes[d])
        position = list(start)
        for d, o in zip(kept, (out_index[d] for d in offset_dims), strict=True):
            position[d] += o
        out[out_index] = x[tuple(position)]
    return _result(out, inst.shape)


def _scatter_targets(inst: Instruction, operand_dims: tuple[int, ...], indices: np.ndarray,
                     update_dims: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """For every update element, in row-major order: the operand's linear position it
    combines into, and whether its whole window lies inside the operand (XLA skips the
    update windows that do not, and never clamps them)."""
    rank = len(operand_dims)
    numbers = ScatterDimensions.of(inst.attributes, rank, update_dims)
    vector_dim = numbers.index_vector_dim
    if vector_dim == indices.ndim:
        indices = indices[..., None]
    indices = np.moveaxis(indices, vector_dim, -1).astype(np.int64)
    count = int(np.prod(update_dims, dtype=np.int64))
    grid = np.indices(update_dims, dtype=np.int64).reshape(len(update_dims), count)
    vectors = indices[tuple(grid[d] for d in numbers.scatter_dims)].reshape(-1, indices.shape[-1])
    vectors = np.broadcast_to(vectors, (count, indices.shape[-1]))
    position = np.zeros((rank, count), dtype=np.int64)
    valid = np.ones(count, dtype=bool)
    for k, d in enumerate(numbers.to_operand):
        position[d] = vectors[:, k]
    for d in range(rank):
        valid &= (position[d] >= 0) & (position[d] <= operand_dims[d] - numbers.window_sizes[d])
    for d, u in zip(numbers.window_operand_dims, numbers.window_dims, strict=True):
        position[d] += grid[u]
    strides = [int(np.prod(operand_dims[d + 1:], dtype=np.int64)) for d in range(rank)]
    linear = np.zeros(count, dtype=np.int64)
    for d in range(rank):
        linear += np.where(valid, position[d], 0) * strides[d]
    return linear, valid


@_reference("scatter")
def _scatter(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    x, indices, updates = operands
    linear, valid = _scatter_targets(inst, x.shape, indices, updates.shape)
    combiner = inst.called_computations[0]
    out = np.array(x, copy=True).reshape(-1)
    targets, values = linear[valid], updates.reshape(-1)[valid]
    root = combiner.root
    ufunc = _fast_reducer(combiner)
    half = _is_half(x.dtype)
    if root is not None and root.opcode == "parameter" and root.parameter_number == 1:
        # Assignment: the last update of each repeated target wins.
        _, last = np.unique(targets[::-1], return_index=True)
        kept = targets.size - 1 - last
        out[targets[kept]] = values[kept]
    elif ufunc is not None and not half:
        ufunc.at(out, targets, values)  # in order, repeated targets included
    else:  # any other combiner, and 2-byte floats (rounded after every combination)
        for target, value in zip(targets, values):
            out[target] = evaluate_computation(combiner, [out[target], value])
    return _result(out.reshape(x.shape), inst.shape)


# -- control flow ----------------------------------------------------------------------

@_reference("while")
def _while(inst: Instruction, operands: Sequence[Any]) -> Any:
    condition, body = inst.called_computations
    (state,) = operands
    while bool(evaluate_computation(condition, [state])):
        state = evaluate_computation(body, [state])
    return state


@_reference("conditional")
def _conditional(inst: Instruction, operands: Sequence[Any]) -> Any:
    selector, *arguments = operands
    branches = inst.called_computations
    if selector.dtype == np.bool_:  # (true_computation, false_computation)
        chosen = 0 if bool(selector) else 1
    else:  # an out-of-range index runs the last branch, as XLA does
        chosen = int(selector)
        chosen = chosen if 0 <= chosen < len(branches) else len(branches) - 1
    return evaluate_computation(branches[chosen], [arguments[chosen]])


# -- reduce and dot ---------------------------------------------------------------------

_REDUCERS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
             "minimum": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or}


def _fast_reducer(computation: Computation) -> np.ufunc | None:
    """The ufunc of a `to_apply` that is one binary op of its two parameters, if any."""
    root = computation.root
    if root is None or root.opcode not in _REDUCERS or len(computation.instructions) != 3:
        return None
    if {o.opcode for o in root.operands} != {"parameter"} or len(set(root.operands)) != 2:
        return None
    ufunc = _REDUCERS[root.opcode]
    if root.shape.element_type == "pred" and ufunc in (np.bitwise_and, np.bitwise_or):
        return np.logical_and if ufunc is np.bitwise_and else np.logical_or
    return ufunc


def _is_half(dtype: np.dtype) -> bool:
    return dtype.kind == "f" and dtype.itemsize == 2 or dtype.name == "bfloat16"


def _rounds_per_step(computation: Computation, dtype: np.dtype) -> bool:
    """Whether folding with `computation` must round after every step: a sum or product
    of 2-byte floats (the fast path would accumulate in f32 and round once)."""
    root = computation.root
    return _is_half(dtype) and root is not None and root.opcode in ("add", "multiply")


@_reference("reduce")
def _reduce(inst: Instruction, operands: Sequence[Any]) -> Any:
    n = len(operands) // 2
    inputs, inits = list(operands[:n]), list(operands[n:])
    axes = tuple(sorted(inst.dimensions))
    computation = inst.called_computations[0]
    ufunc = _fast_reducer(computation) if n == 1 else None
    if ufunc is not None:
        (x,), (init,) = inputs, inits
        # 2-byte float sums and products accumulate in f32 (see the module docstring).
        compute = np.dtype(np.float32) if _is_half(x.dtype) else _compute_dtype(x.dtype)
        value = ufunc.reduce(x.astype(compute), axis=axes, dtype=compute,
                             initial=init.astype(compute)[()])
        return _result(value, inst.shape)
    # General path: fold the computation over each output element's inputs in
    # row-major order, starting from the init values.
    kept = [d for d in range(inputs[0].ndim) if d not in axes]
    kept_shape = tuple(inputs[0].shape[d] for d in kept)
    rows = [np.transpose(x, kept + list(axes)).reshape(kept_shape + (-1,)) for x in inputs]
    results = [np.empty(kept_shape, dtype=init.dtype) for init in inits]
    for index in np.ndindex(*kept_shape):
        elements = ([np.asarray(row[index + (k,)]) for row in rows]
                    for k in range(rows[0].shape[-1]))
        for result, accumulator in zip(results, _fold(computation, inits, elements),
                                       strict=True):
            result[index] = accumulator
    return _reduce_results(inst, results)


def _fold(computation: Computation, inits: Sequence[Any],
          elements: Iterable[list[np.ndarray]]) -> list[Any]:
    """Apply a (variadic) reducer computation over `elements`, starting from `inits`."""
    accumulators: list[Any] = list(inits)
    for values in elements:
        out = evaluate_computation(computation, accumulators + values)
        accumulators = list(out) if isinstance(out, tuple) else [out]
    return accumulators


def _reduce_results(inst: Instruction, results: list[np.ndarray]) -> Any:
    """One result array, or a tuple of them for a variadic reduction."""
    if len(results) == 1:
        return _result(results[0], inst.shape)
    return tuple(_result(r, s) for r, s in zip(results, inst.shape.tuple_shapes or (), strict=True))


_IDENTITIES: dict[Any, Callable[[np.dtype], Any]] = {
    np.add: lambda t: 0, np.multiply: lambda t: 1, np.logical_or: lambda t: False,
    np.logical_and: lambda t: True, np.bitwise_or: lambda t: 0,
    np.bitwise_and: lambda t: np.invert(np.zeros((), t)),
    np.maximum: lambda t: -np.inf if t.kind == "f" else np.iinfo(t).min,
    np.minimum: lambda t: np.inf if t.kind == "f" else np.iinfo(t).max,
}


def _window_positions(inst: Instruction, input_dims: tuple[int, ...]) -> tuple[
        np.ndarray, np.ndarray]:
    """For every (output element, window element): the input's linear position and
    whether it is a real element (not padding, not a base-dilation hole)."""
    window = inst.attributes["window"].dimensions
    out_dims = inst.shape.dims if not inst.shape.is_tuple else \
        inst.shape.tuple_shapes[0].dims  # type: ignore[index]
    valid = np.ones(out_dims + tuple(d.size for d in window), dtype=bool)
    rank = len(window)
    linear = np.zeros(valid.shape, dtype=np.int64)
    strides = [int(np.prod(input_dims[d + 1:], dtype=np.int64)) for d in range(rank)]
    for d, w in enumerate(window):
        out = np.arange(out_dims[d]).reshape([-1 if k == d else 1 for k in range(2 * rank)])
        offset = np.arange(w.size).reshape([-1 if k == rank + d else 1 for k in range(2 * rank)])
        dilated = out * w.stride + offset * w.window_dilation - w.padding_low
        inside = (dilated >= 0) & (dilated % w.base_dilation == 0) & (
            dilated // w.base_dilation < input_dims[d])
        valid = valid & inside
        linear = linear + np.where(inside, dilated // w.base_dilation, 0) * strides[d]
    return linear, valid


@_reference("reduce-window")
def _reduce_window(inst: Instruction, operands: Sequence[Any]) -> Any:
    n = len(operands) // 2
    inputs, inits = list(operands[:n]), list(operands[n:])
    computation = inst.called_computations[0]
    linear, valid = _window_positions(inst, inputs[0].shape)
    rank = inputs[0].ndim
    out_dims = linear.shape[:rank]
    window_elements = int(np.prod(linear.shape[rank:], dtype=np.int64))
    ufunc = _fast_reducer(computation) if n == 1 and not _rounds_per_step(
        computation, inputs[0].dtype) else None
    if ufunc is not None and ufunc in _IDENTITIES:
        (x,), (init,) = inputs, inits
        compute = _compute_dtype(x.dtype)
        flat = x.astype(compute).reshape(-1)
        identity = np.asarray(_IDENTITIES[ufunc](compute), dtype=compute)
        gathered = np.where(valid, flat[linear] if flat.size else identity, identity)
        windows = gathered.reshape(out_dims + (window_elements,))
        folded = ufunc.reduce(windows, axis=-1, dtype=compute, initial=init.astype(compute)[()])
        return _result(folded, inst.shape)
    # General path: fold each window's real elements in row-major order from the inits.
    flats = [x.reshape(-1) for x in inputs]
    windows_linear = linear.reshape(out_dims + (window_elements,))
    windows_valid = valid.reshape(out_dims + (window_elements,))
    results = [np.empty(out_dims, dtype=init.dtype) for init in inits]
    for index in np.ndindex(*out_dims):
        elements = ([np.asarray(flat[position]) for flat in flats]
                    for position, real in zip(windows_linear[index], windows_valid[index])
                    if real)
        for result, accumulator in zip(results, _fold(computation, inits, elements),
                                       strict=True):
            result[index] = accumulator
    return _reduce_results(inst, results)


@_reference("dot")
def _dot(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    lhs, rhs = operands
    attrs = inst.attributes
    lb, rb = list(attrs.get("lhs_batch_dims", ())), list(attrs.get("rhs_batch_dims", ()))
    lc = list(attrs.get("lhs_contracting_dims", ()))
    rc = list(attrs.get("rhs_contracting_dims", ()))
    lf = [d for d in range(lhs.ndim) if d not in lb + lc]
    rf = [d for d in range(rhs.ndim) if d not in rb + rc]
    batch = tuple(lhs.shape[d] for d in lb)

    def size(array: np.ndarray, dims: list[int]) -> int:
        return int(np.prod([array.shape[d] for d in dims], dtype=np.int64))

    compute = np.dtype(np.float32) if lhs.dtype.itemsize < 4 and _is_float(lhs.dtype) \
        else lhs.dtype
    left = np.transpose(lhs, lb + lf + lc).astype(compute).reshape(
        size(lhs, lb), size(lhs, lf), size(lhs, lc))
    right = np.transpose(rhs, rb + rc + rf).astype(compute).reshape(
        size(rhs, rb), size(rhs, rc), size(rhs, rf))
    product = np.matmul(left, right)
    dims = batch + tuple(lhs.shape[d] for d in lf) + tuple(rhs.shape[d] for d in rf)
    return _result(product.reshape(dims), inst.shape)


@_reference("sort")
def _sort(inst: Instruction, operands: Sequence[Any]) -> Any:
    comparator = inst.called_computations[0]
    dimension = sort.sort_dimension(inst.attributes, operands[0].ndim)

    def less(scalars: Sequence[np.ndarray]) -> bool:
        return bool(evaluate_computation(comparator, list(scalars)))

    results = sort.reference(operands, dimension, less)
    return results[0] if len(results) == 1 else tuple(results)


@_reference("topk")
def _topk(inst: Instruction, operands: Sequence[Any]) -> Any:
    return sort.topk_reference(operands[0], int(inst.attributes["k"]),
                               bool(inst.attributes.get("largest", True)))


@_reference("convolution")
def _convolution(inst: Instruction, operands: Sequence[Any]) -> np.ndarray:
    lhs, rhs = operands
    compute = np.dtype(np.float32) if lhs.dtype.itemsize < 4 and _is_float(lhs.dtype) \
        else lhs.dtype
    feature_groups, batch_groups = convolution.group_counts(inst.attributes)
    result = convolution.reference(lhs, rhs, inst.attributes["window"],
                                   inst.attributes["dim_labels"], feature_groups, batch_groups,
                                   compute)
    return _result(result, inst.shape)


# cholesky, triangular-solve, rng-bit-generator, bitcast-convert, reduce-precision, the
# dimension-size ops and opt-barrier: their references sit with their shape rules.
for _module in (linalg, bit_ops, random_bits):
    REFERENCES.update(_module.REFERENCES)


# -- driver -----------------------------------------------------------------------------

def evaluate_computation(computation: Computation, args: Sequence[Any]) -> Any:
    """Run `computation` on `args` (one per parameter, in parameter-number order)."""
    params = computation.parameters
    if len(args) != len(params):
        raise ValueError(f"%{computation.name} takes {len(params)} arguments, got {len(args)}")
    values: dict[int, Any] = {}
    with np.errstate(all="ignore"):
        for inst in computation.instructions:
            if inst.opcode == "parameter":
                operands: list[Any] = [args[inst.parameter_number]]
            else:
                operands = [values[id(o)] for o in inst.operands]
            try:
                reference = REFERENCES[inst.opcode]
            except KeyError:
                raise NotImplementedError(f"no reference for opcode {inst.opcode!r}") from None
            if inst.shape.is_dynamic or any(o.shape.is_dynamic for o in inst.operands):
                operands = check_evaluable(inst, operands)
            values[id(inst)] = reference(inst, operands)
    if computation.root is None:
        raise ValueError(f"%{computation.name} has no root")
    return values[id(computation.root)]


def evaluate(module: HloModule, *args: Any) -> Value:
    """Run the entry computation of `module`; arrays are converted to the parameters' dtypes."""
    if module.entry is None:
        raise ValueError(f"module {module.name} has no entry computation")
    params = module.entry.parameters
    if len(args) != len(params):
        raise ValueError(f"module {module.name} takes {len(params)} arguments, got {len(args)}")
    converted = [arg if param.shape.is_tuple
                 else np.asarray(arg).astype(param.shape.numpy_dtype, copy=False)
                 for param, arg in zip(params, args, strict=True)]
    return evaluate_computation(module.entry, converted)
