"""The HLO opcode table: each opcode's category, arity, cost facts and shape rule.

One registration per opcode (docs/conventions.md, habit 2): every fact about an
opcode is its `OpcodeInfo` here; other layers ask the table
(`is_elementwise`, `is_expensive`, `opcodes_in("unary")`) instead of listing opcodes.
Beside it, keyed by the same names, sit the NumPy reference (`evaluator.REFERENCES`),
the CPU emitters (`tfxla_lite.codegen.cpu`) and the GPU element generators
(`tfxla_lite.codegen.gpu.elemental`); tests/hlo/test_opcode_table.py fails when an
opcode lacks one of them (docs/architecture.md, "Adding an HLO opcode").

Attribute names and meanings are XLA's (see `xla/hlo/ir/hlo_instruction.h`):
`dimensions`, `direction`, `slice`, `index`, `iota_dimension`, `kind`,
`lhs_batch_dims`, `lhs_contracting_dims`, `rhs_batch_dims`,
`rhs_contracting_dims`, `parameter_number`, `literal`, `padding` (a `PaddingConfig`),
`window` (a `Window`), convolution's `dim_labels` (a `ConvolutionDimensions`),
`feature_group_count` and `batch_group_count` (`convolution.py`), `dynamic_slice_sizes`,
and gather's `offset_dims`,
`collapsed_slice_dims`, `start_index_map`, `index_vector_dim`, `slice_sizes`, and
scatter's `update_window_dims`, `inserted_window_dims`, `scatter_dims_to_operand_dims`,
`index_vector_dim` (scatter calls its combiner `to_apply`, as reduce does).
`while` calls (condition, body); `conditional` calls its branches, for a pred
index (true_computation, false_computation). `sort` takes `dimensions={d}`, `is_stable`
(a bool) and its comparator `to_apply`; `topk` takes `k` and `largest` (`sort.py`).
`cholesky` takes `lower`, `triangular-solve` `left_side`, `lower`, `unit_diagonal` and
`transpose_a` (`linalg.py`); `rng-bit-generator` its `algorithm` (`random_bits.py`);
`bitcast-convert` (its `element_type`, as convert), `reduce-precision` (`exponent_bits`,
`mantissa_bits`), `get-dimension-size`, `set-dimension-size` and `opt-barrier` are in
`bit_ops.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfxla_lite.hlo import bit_ops, linalg
from tfxla_lite.hlo.attributes import PaddingConfig, Window
from tfxla_lite.hlo.convolution import ConvolutionShapeError, convolution_shape
from tfxla_lite.hlo.shape import INTEGER_TYPES, Shape
from tfxla_lite.hlo.sort import SortShapeError, sort_shape, topk_shape

if TYPE_CHECKING:  # ir imports this module
    from tfxla_lite.hlo.ir import Instruction

ShapeRule = Callable[[list[Shape], Mapping[str, Any]], Shape]


class ShapeError(ValueError):
    """Operands or attributes that no shape rule accepts."""


# Categories whose opcodes map equal-shaped operands to an equal-shaped result, element
# by element; fusion and in-place buffer reuse rely on that. "unary" and "binary" are
# the attribute-free functions of one and of two operands of one type, which each
# backend computes in one `emit_unary` / `emit_binary`; "elementwise" are the others
# (compare, convert, select, clamp, reduce-precision), each generated on its own.
ELEMENTWISE_CATEGORIES = frozenset({"unary", "binary", "elementwise"})


@dataclass(frozen=True)
class OpcodeInfo:
    name: str
    # What kind of computation it is: one of ELEMENTWISE_CATEGORIES, "data-movement",
    # "reduction", "dot", "convolution", "sort", "linalg", "random", "control-flow" or
    # "other" (parameters, constants, tuples, calls).
    category: str
    # None: the instruction carries its shape, which its operands do not decide (a
    # parameter, iota, broadcast, reshape, call); the verifier checks it on its own.
    shape_rule: ShapeRule | None
    # How many operands it takes; None: any number (tuple, concatenate, reduce, ...).
    arity: int | None
    # A transcendental function of its operands, as XLA's cost analysis counts them
    # (`transcendentals` in cost_analysis.py).
    transcendental: bool = False
    # Not duplicated into several fusions (XLA's IsExpensive): the transcendentals, and
    # divide and remainder, which take many cycles a vector.
    expensive: bool = False
    # Operand order does not change the result bits (NaN payloads aside): CSE matches
    # op(a, b) with op(b, a).
    commutative: bool = False
    # Reads nothing, or its operand at its own linear index (reshape, bitcast): with the
    # elementwise opcodes, what a kernel can run over a flat index (`is_flat`).
    flat: bool = False
    # Rounds a float to a whole number: on integers (already whole) the identity.
    rounds_to_integer: bool = False


OPCODES: dict[str, OpcodeInfo] = {}
_ROUNDING = frozenset({"floor", "ceil", "round-nearest-afz", "round-nearest-even"})


def _register(name: str, category: str, arity: int | None, rule: ShapeRule | None,
              transcendental: bool = False, expensive: bool = False,
              commutative: bool = False, flat: bool = False) -> None:
    OPCODES[name] = OpcodeInfo(name, category, rule, arity, transcendental,
                               expensive or transcendental, commutative, flat,
                               name in _ROUNDING)


def opcodes_in(*categories: str) -> tuple[str, ...]:
    """The opcodes of `categories`, in registration order: what an emitter registers for."""
    return tuple(name for name, info in OPCODES.items() if info.category in categories)


def infer_shape(opcode: str, operand_shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    """The result shape of `opcode` applied to operands of `operand_shapes`."""
    try:
        info = OPCODES[opcode]
    except KeyError:
        raise ShapeError(f"unknown opcode {opcode!r}") from None
    _require(info.shape_rule is not None, f"{opcode}'s shape is given, not inferred")
    _require(info.arity is None or len(operand_shapes) == info.arity,
             f"{opcode} takes {info.arity} operand(s), got {len(operand_shapes)}")
    return info.shape_rule(operand_shapes, attributes)  # type: ignore[misc]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ShapeError(message)


def _same_arrays(shapes: list[Shape], opcode: str) -> Shape:
    _require(len(shapes) > 0, f"{opcode} needs operands")
    first = shapes[0]
    for s in shapes:
        _require(not s.is_tuple, f"{opcode} takes arrays, got {s}")
        _require(s.dims == first.dims, f"{opcode} operands differ in dims: {shapes}")
    if any(s.dynamic for s in shapes):  # a dimension dynamic in any operand is (XLA)
        flags = tuple(any(s.is_dynamic_dimension(d) for s in shapes) for d in range(first.rank))
        return Shape(first.element_type, first.dims, None, flags)
    return first


def _unary_rule(result_type: str | None = None) -> ShapeRule:
    def rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
        s = _same_arrays(shapes, "unary op")
        return s.with_element_type(result_type) if result_type else s

    return rule


def _binary_rule(result_type: str | None = None) -> ShapeRule:
    def rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
        s = _same_arrays(shapes, "binary op")
        _require(shapes[0].element_type == shapes[1].element_type,
                 f"binary op operands differ in type: {shapes}")
        return s.with_element_type(result_type) if result_type else s

    return rule


_TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "logistic", "sqrt",
    "rsqrt", "cbrt", "erf", "sine", "cosine", "tan", "power", "atan2",
})
COMPARISON_DIRECTIONS = ("EQ", "NE", "LT", "LE", "GT", "GE")

for _name in ("abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one",
              "tanh", "logistic", "sqrt", "rsqrt", "cbrt", "erf", "sign", "floor", "ceil",
              "round-nearest-afz", "round-nearest-even", "not", "sine", "cosine", "tan", "copy"):
    _register(_name, "unary", 1, _unary_rule(), _name in _TRANSCENDENTAL)
_register("is-finite", "unary", 1, _unary_rule("pred"))
for _name in ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
              "remainder", "atan2", "and", "or", "xor", "shift-left", "shift-right-arithmetic",
              "shift-right-logical"):
    _register(_name, "binary", 2, _binary_rule(), _name in _TRANSCENDENTAL,
              _name in ("divide", "remainder"),
              _name in ("add", "multiply", "maximum", "minimum", "and", "or", "xor"))


def _compare_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(attributes.get("direction") in COMPARISON_DIRECTIONS,
             f"compare needs direction in {COMPARISON_DIRECTIONS}")
    return _binary_rule("pred")(shapes, attributes)


def _convert_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    # The target type is the instruction's own shape; builders pass it as 'element_type'.
    _require("element_type" in attributes, "convert needs an element_type")
    return shapes[0].with_element_type(attributes["element_type"])


def _select_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(shapes[0].element_type == "pred", "select's predicate must be pred")
    _require(shapes[1].element_type == shapes[2].element_type, "select branches differ in type")
    return _same_arrays(shapes, "select").with_element_type(shapes[1].element_type)


def _clamp_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    lo, x, hi = shapes
    for bound in (lo, hi):
        _require(bound.dims in ((), x.dims), f"clamp bound {bound} does not fit {x}")
    return x


_register("compare", "elementwise", 2, _compare_rule)
_register("convert", "elementwise", 1, _convert_rule)
_register("select", "elementwise", 3, _select_rule)
_register("clamp", "elementwise", 3, _clamp_rule)


def _constant_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(not shapes and "literal" in attributes, "constant takes a literal and no operands")
    return Shape.of_array(attributes["literal"])


def _transpose_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    (s,) = shapes
    perm = tuple(attributes["dimensions"])
    _require(sorted(perm) == list(range(s.rank)), f"transpose dimensions {perm} for {s}")
    return s.with_dims(tuple(s.dims[p] for p in perm))


def _reduce_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(len(shapes) % 2 == 0 and shapes, "reduce takes inputs then as many init values")
    n = len(shapes) // 2
    inputs, inits = shapes[:n], shapes[n:]
    merged = _same_arrays(inputs, "reduce")
    dims = set(attributes["dimensions"])
    _require(all(0 <= d < inputs[0].rank for d in dims), f"reduce dimensions {dims}")
    for init in inits:
        _require(init.dims == (), "reduce init values are scalars")
    kept = tuple(d for i, d in enumerate(inputs[0].dims) if i not in dims)
    dynamic = tuple(merged.is_dynamic_dimension(i) for i in range(merged.rank) if i not in dims)
    results = [Shape(init.element_type, kept, None, dynamic) for init in inits]
    return results[0] if n == 1 else Shape.tuple_of(results)


def _dot_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    lhs, rhs = shapes
    lb = tuple(attributes.get("lhs_batch_dims", ()))
    rb = tuple(attributes.get("rhs_batch_dims", ()))
    lc = tuple(attributes.get("lhs_contracting_dims", ()))
    rc = tuple(attributes.get("rhs_contracting_dims", ()))
    _require(len(lb) == len(rb) and len(lc) == len(rc), "dot dimension lists differ in length")
    for a, b in zip(lb + lc, rb + rc):
        _require(lhs.dims[a] == rhs.dims[b], f"dot dims differ: {lhs} vs {rhs}")
    _require(lhs.element_type == rhs.element_type, "dot operands differ in type")
    batch = tuple(lhs.dims[d] for d in lb)
    lhs_free = tuple(d for i, d in enumerate(lhs.dims) if i not in lb and i not in lc)
    rhs_free = tuple(d for i, d in enumerate(rhs.dims) if i not in rb and i not in rc)
    return Shape(lhs.element_type, batch + lhs_free + rhs_free)


def _slice_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    (s,) = shapes
    spec = attributes["slice"]
    _require(len(spec) == s.rank, f"slice spec {spec} for {s}")
    dims = []
    for (start, limit, stride), size in zip(spec, s.dims):
        _require(0 <= start <= limit <= size and stride >= 1, f"slice {spec} out of {s}")
        dims.append((limit - start + stride - 1) // stride)
    return s.with_dims(tuple(dims))


def _concatenate_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    (axis,) = attributes["dimensions"]
    first = shapes[0]
    for s in shapes:
        _require(s.rank == first.rank and s.element_type == first.element_type,
                 f"concatenate operands differ: {shapes}")
        _require(all(a == b for i, (a, b) in enumerate(zip(s.dims, first.dims)) if i != axis),
                 f"concatenate operands differ off axis {axis}: {shapes}")
    dims = list(first.dims)
    dims[axis] = sum(s.dims[axis] for s in shapes)
    return first.with_dims(tuple(dims))


def _reverse_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    s = _same_arrays(shapes, "reverse")
    dims = tuple(attributes["dimensions"])
    _require(len(set(dims)) == len(dims) and all(0 <= d < s.rank for d in dims),
             f"reverse dimensions {dims} for {s}")
    return s


def _pad_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    operand, value = shapes
    _require(not operand.is_tuple and value.dims == () and not value.is_tuple,
             f"pad takes an array and a scalar, got {shapes}")
    _require(operand.element_type == value.element_type, f"pad operands differ in type: {shapes}")
    config = attributes["padding"]
    _require(isinstance(config, PaddingConfig) and len(config.dimensions) == operand.rank,
             f"padding {config} does not fit {operand}")
    dims = []
    for size, d in zip(operand.dims, config.dimensions):
        _require(d.interior >= 0, f"negative interior padding in {config}")
        result = d.low + d.high + size + max(size - 1, 0) * d.interior
        _require(result >= 0, f"padding {config} leaves a negative dimension of {operand}")
        dims.append(result)
    return operand.with_dims(tuple(dims))


def _require_start_indices(shapes: list[Shape], rank: int, opcode: str) -> None:
    _require(len(shapes) == rank, f"{opcode} takes one start index per dimension ({rank})")
    for s in shapes:
        _require(not s.is_tuple and s.dims == () and s.element_type in INTEGER_TYPES,
                 f"{opcode} start indices are integer scalars, got {s}")
    _require(len({s.element_type for s in shapes}) <= 1,
             f"{opcode} start indices differ in type: {shapes}")


def _dynamic_slice_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(len(shapes) >= 1 and not shapes[0].is_tuple, "dynamic-slice takes an array")
    operand = shapes[0]
    _require_start_indices(shapes[1:], operand.rank, "dynamic-slice")
    sizes = tuple(attributes["dynamic_slice_sizes"])
    _require(len(sizes) == operand.rank and all(
        0 <= n <= size for n, size in zip(sizes, operand.dims)),
        f"dynamic_slice_sizes {sizes} out of {operand}")
    return operand.with_dims(sizes)


def _dynamic_update_slice_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(len(shapes) >= 2, "dynamic-update-slice takes an operand, an update and starts")
    operand, update = shapes[:2]
    _require(not operand.is_tuple and not update.is_tuple and operand.rank == update.rank
             and operand.element_type == update.element_type and all(
                 u <= o for u, o in zip(update.dims, operand.dims)),
             f"dynamic-update-slice update {update} does not fit {operand}")
    _require_start_indices(shapes[2:], operand.rank, "dynamic-update-slice")
    return operand


def _gather_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    operand, indices = shapes
    _require(not operand.is_tuple and not indices.is_tuple
             and indices.element_type in INTEGER_TYPES, f"gather operands {shapes}")
    offset_dims = tuple(attributes["offset_dims"])
    collapsed = tuple(attributes["collapsed_slice_dims"])
    start_index_map = tuple(attributes["start_index_map"])
    index_vector_dim = int(attributes["index_vector_dim"])
    slice_sizes = tuple(attributes["slice_sizes"])
    for key in ("operand_batching_dims", "start_indices_batching_dims"):
        _require(not tuple(attributes.get(key, ())), f"gather {key} is not supported")
    _require(0 <= index_vector_dim <= indices.rank, f"index_vector_dim {index_vector_dim}")
    vector = indices.dims[index_vector_dim] if index_vector_dim < indices.rank else 1
    _require(len(start_index_map) == vector, f"start_index_map {start_index_map} for an index "
                                             f"vector of {vector}")
    _require(len(slice_sizes) == operand.rank and all(
        0 <= n <= size for n, size in zip(slice_sizes, operand.dims)),
        f"slice_sizes {slice_sizes} out of {operand}")
    for dims, what in ((collapsed, "collapsed_slice_dims"), (start_index_map, "start_index_map")):
        _require(len(set(dims)) == len(dims) and all(0 <= d < operand.rank for d in dims),
                 f"{what} {dims} for {operand}")
    _require(all(slice_sizes[d] <= 1 for d in collapsed),
             f"collapsed_slice_dims {collapsed} must have slice size 1 or 0")
    batch = [n for d, n in enumerate(indices.dims) if d != index_vector_dim]
    offsets = [n for d, n in enumerate(slice_sizes) if d not in collapsed]
    _require(len(offsets) == len(offset_dims), f"offset_dims {offset_dims} for {len(offsets)} "
                                               "uncollapsed slice dimensions")
    rank = len(batch) + len(offsets)
    _require(list(offset_dims) == sorted(set(offset_dims)) and all(
        0 <= d < rank for d in offset_dims), f"offset_dims {offset_dims} for rank {rank}")
    batch_iter, offset_iter = iter(batch), iter(offsets)
    dims = [next(offset_iter) if d in offset_dims else next(batch_iter) for d in range(rank)]
    return operand.with_dims(tuple(dims))


def _sorting_rule(rule: ShapeRule,
                  errors: tuple[type[ValueError], ...] = (SortShapeError,)) -> ShapeRule:
    """`rule`, its own errors (`errors`) raised as ShapeError."""
    def checked(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
        try:
            return rule(shapes, attributes)
        except errors as error:
            raise ShapeError(str(error)) from None

    return checked


def _scatter_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    """XLA's ShapeInference::InferScatterShape for one operand and no batching dims."""
    operand, indices, updates = shapes
    _require(not any(s.is_tuple for s in shapes) and indices.element_type in INTEGER_TYPES
             and operand.element_type == updates.element_type, f"scatter operands {shapes}")
    window_dims = tuple(attributes["update_window_dims"])
    inserted = tuple(attributes["inserted_window_dims"])
    to_operand = tuple(attributes["scatter_dims_to_operand_dims"])
    index_vector_dim = int(attributes["index_vector_dim"])
    for key in ("input_batching_dims", "scatter_indices_batching_dims"):
        _require(not tuple(attributes.get(key, ())), f"scatter {key} is not supported")
    _require(0 <= index_vector_dim <= indices.rank, f"index_vector_dim {index_vector_dim}")
    vector = indices.dims[index_vector_dim] if index_vector_dim < indices.rank else 1
    _require(len(to_operand) == vector, f"scatter_dims_to_operand_dims {to_operand} for an "
                                        f"index vector of {vector}")
    _require(list(window_dims) == sorted(set(window_dims)) and all(
        0 <= d < updates.rank for d in window_dims),
        f"update_window_dims {window_dims} for updates {updates}")
    _require(list(inserted) == sorted(set(inserted)) and all(
        0 <= d < operand.rank for d in inserted),
        f"inserted_window_dims {inserted} for {operand}")
    _require(len(set(to_operand)) == len(to_operand) and all(
        0 <= d < operand.rank for d in to_operand),
        f"scatter_dims_to_operand_dims {to_operand} for {operand}")
    _require(len(window_dims) + len(inserted) == operand.rank,
             f"update_window_dims {window_dims} and inserted_window_dims {inserted} do not "
             f"cover the operand's rank {operand.rank}")
    scatter_dims = [n for d, n in enumerate(indices.dims) if d != index_vector_dim]
    _require(updates.rank == len(window_dims) + len(scatter_dims),
             f"updates {updates} have rank {updates.rank}, expected "
             f"{len(window_dims) + len(scatter_dims)}")
    update_scatter = [n for d, n in enumerate(updates.dims) if d not in window_dims]
    _require(update_scatter == scatter_dims,
             f"updates {updates} do not match the scatter dims {scatter_dims} of {indices}")
    window_operand_dims = [d for d in range(operand.rank) if d not in inserted]
    for d, u in zip(window_operand_dims, window_dims):
        _require(updates.dims[u] <= operand.dims[d],
                 f"update window dim {u} of {updates} is larger than {operand}")
    return operand


def _reduce_window_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    _require(len(shapes) % 2 == 0 and shapes,
             "reduce-window takes inputs then as many init values")
    n = len(shapes) // 2
    inputs, inits = shapes[:n], shapes[n:]
    first = _same_arrays(inputs, "reduce-window")
    for init in inits:
        _require(not init.is_tuple and init.dims == (), "reduce-window init values are scalars")
    window = attributes["window"]
    _require(isinstance(window, Window) and len(window.dimensions) == first.rank,
             f"window {window} does not fit {first}")
    for d in window.dimensions:
        _require(d.size >= 0 and d.stride >= 1 and d.window_dilation >= 1
                 and d.base_dilation >= 1, f"window {window} has a bad dimension")
    dims = tuple(d.output_size(size) for d, size in zip(window.dimensions, first.dims))
    results = [Shape(init.element_type, dims) for init in inits]
    return results[0] if n == 1 else Shape.tuple_of(results)


def _convolution_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    try:
        return convolution_shape(shapes, attributes)
    except ConvolutionShapeError as error:
        raise ShapeError(str(error)) from None


def _while_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    return shapes[0]


def _tuple_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    return Shape.tuple_of(shapes)


def _get_tuple_element_rule(shapes: list[Shape], attributes: Mapping[str, Any]) -> Shape:
    (s,) = shapes
    _require(s.is_tuple, "get-tuple-element takes a tuple")
    return s.tuple_shapes[attributes["index"]]  # type: ignore[index]


_register("parameter", "other", 0, None, flat=True)
_register("constant", "other", 0, _constant_rule, flat=True)
_register("iota", "other", 0, None)
_register("broadcast", "data-movement", 1, None)
_register("reshape", "data-movement", 1, None, flat=True)
_register("bitcast", "data-movement", 1, None, flat=True)
_register("transpose", "data-movement", 1, _transpose_rule)
_register("slice", "data-movement", 1, _slice_rule)
_register("concatenate", "data-movement", None, _concatenate_rule)
_register("reduce", "reduction", None, _reduce_rule)
_register("dot", "dot", 2, _dot_rule, expensive=True)
_register("convolution", "convolution", 2, _convolution_rule, expensive=True)
_register("reverse", "data-movement", 1, _reverse_rule)
_register("pad", "data-movement", 2, _pad_rule)
_register("dynamic-slice", "data-movement", None, _dynamic_slice_rule)
_register("dynamic-update-slice", "data-movement", None, _dynamic_update_slice_rule)
_register("gather", "data-movement", 2, _gather_rule)
_register("reduce-window", "reduction", None, _reduce_window_rule)
_register("scatter", "data-movement", 3, _scatter_rule)
_register("sort", "sort", None, _sorting_rule(sort_shape))
_register("topk", "sort", 1, _sorting_rule(topk_shape))
_register("while", "control-flow", 1, _while_rule)
_OWN_ERRORS = (linalg.LinalgShapeError, bit_ops.BitOpShapeError)
for _name, _category, _arity, _rule in (
        ("cholesky", "linalg", 1, linalg.cholesky_shape),
        ("triangular-solve", "linalg", 2, linalg.triangular_solve_shape),
        ("bitcast-convert", "data-movement", 1, bit_ops.bitcast_convert_shape),
        ("reduce-precision", "elementwise", 1, bit_ops.reduce_precision_shape),
        ("get-dimension-size", "other", 1, bit_ops.get_dimension_size_shape),
        ("set-dimension-size", "other", 2, bit_ops.set_dimension_size_shape),
        ("opt-barrier", "other", 1, bit_ops.optimization_barrier_shape)):
    _register(_name, _category, _arity, _sorting_rule(_rule, _OWN_ERRORS))
_register("rng-bit-generator", "random", 1, None)
_register("conditional", "control-flow", None, None)
_register("tuple", "other", None, _tuple_rule)
_register("get-tuple-element", "other", 1, _get_tuple_element_rule)
_register("fusion", "other", None, None)
_register("call", "other", None, None)


def is_elementwise(opcode: str) -> bool:
    info = OPCODES.get(opcode)
    return info is not None and info.category in ELEMENTWISE_CATEGORIES


def is_flat(instructions: Iterable[Instruction]) -> bool:
    """Whether every instruction reads its operands at its own linear index (elementwise
    and flat opcodes) or reads a scalar (a broadcast scalar; clamp's scalar bounds are
    elementwise): a kernel computing them runs over a flat index, no multi-index."""
    for inst in instructions:
        info = OPCODES.get(inst.opcode)
        if info is not None and (info.flat or info.category in ELEMENTWISE_CATEGORIES):
            continue
        if inst.opcode == "broadcast" and not inst.operand(0).shape.dims:
            continue
        return False
    return True


def is_identity_on_integers(opcode: str) -> bool:
    """Whether `opcode` rounds floats to whole numbers, and so returns integers as they
    are (floor, ceil and the two round-nearest opcodes)."""
    info = OPCODES.get(opcode)
    return info is not None and info.rounds_to_integer


def is_transcendental(opcode: str) -> bool:
    """Whether `opcode` computes a transcendental function (XLA's cost analysis)."""
    info = OPCODES.get(opcode)
    return info is not None and info.transcendental


def is_expensive(opcode: str) -> bool:
    info = OPCODES.get(opcode)
    return info is not None and info.expensive


def is_commutative(opcode: str) -> bool:
    info = OPCODES.get(opcode)
    return info is not None and info.commutative
