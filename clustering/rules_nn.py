"""Lowering rules of TF's model-building ops: losses (softmax cross-entropy, L2Loss),
ArgMax/ArgMin, OneHot and two-operand Einsum.

Registered into `registry.OP_RULES` on import. HLO here has no variadic reduce, so
ArgMax is a max-reduce, a compare against it and a min-reduce of matching indices
(from an iota): the first index wins ties, and NaN never wins, as in TF's CPU kernel
(TF's XLA differs: there NaN wins). Einsum becomes transposes and reshapes around one batched dot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    ALL,
    BOOL,
    FLOAT,
    INTEGER,
    NUMERIC,
    LoweringContext,
    LoweringError,
    constant_value,
    element_type,
    known_dims,
    register,
    value_range,
)
from tfxla_lite.clustering.rules_tensor import MATMUL_DTYPES, softmax_parts
from tfxla_lite.hlo import Instruction, Shape
from tfxla_lite.hlo.ir import Computation, HloModule
from tfxla_lite.hlo.shape import FLOAT_TYPES

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _iota(ctx: LoweringContext, etype: str, dims: tuple[int, ...], axis: int) -> Instruction:
    return ctx.emit("iota", [], shape=Shape(etype, dims), iota_dimension=axis)


def _spread(ctx: LoweringContext, x: Instruction, dims: tuple[int, ...], axis: int
            ) -> Instruction:
    """`x` (of `dims` without `axis`) broadcast along `axis` to `dims`."""
    kept = tuple(i for i in range(len(dims)) if i != axis)
    return ctx.emit("broadcast", [x], shape=x.shape.with_dims(dims), dimensions=kept)


# -- losses ------------------------------------------------------------------------------------
@register("L2Loss", dtypes=FLOAT)
def _lower_l2_loss(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    # sum(x * x * 0.5), in TF's order
    x = operands[0]
    halves = ctx.emit("multiply", [ctx.emit("multiply", [x, x]), ctx.full(0.5, x.shape)])
    return [ctx.reduce(halves, range(x.shape.rank), "add", 0)]


@register("SoftmaxCrossEntropyWithLogits", dtypes=FLOAT)
def _lower_softmax_cross_entropy(ctx: LoweringContext, op: tf.Operation, operands: Operands
                                 ) -> list[Instruction]:
    # loss = sum(labels * (log(sum(exp(shifted))) - shifted)), backprop = softmax - labels,
    # with shifted = logits - max(logits), per row (TF's xent_op.h).
    dims = ctx.output_shape(1).dims
    logits, labels = (ctx.broadcast_to(x, dims) for x in operands)
    shifted, exponent, total = softmax_parts(ctx, logits)
    per_class = ctx.emit("multiply", [labels, ctx.emit("subtract", [ctx.emit("log", [total]),
                                                                     shifted])])
    loss = ctx.reduce(per_class, [len(dims) - 1], "add", 0)
    backprop = ctx.emit("subtract", [ctx.emit("divide", [exponent, total]), labels])
    return [loss, backprop]


@register("SparseSoftmaxCrossEntropyWithLogits", dtypes=FLOAT | INTEGER,
          note="a label out of range gives a NaN loss (TF's CPU kernel raises)")
def _lower_sparse_softmax_cross_entropy(ctx: LoweringContext, op: tf.Operation,
                                        operands: Operands) -> list[Instruction]:
    # loss = log(sum(exp(shifted))) - shifted[label]; backprop = softmax - one_hot(label).
    logits, labels = operands
    dims = logits.shape.dims
    last = len(dims) - 1
    shifted, exponent, total = softmax_parts(ctx, logits)
    classes = _iota(ctx, labels.shape.element_type, dims, last)
    one_hot = ctx.emit("compare", [classes, _spread(ctx, labels, dims, last)], direction="EQ")
    zeros = ctx.full(0, shifted.shape)
    picked = ctx.reduce(ctx.emit("select", [one_hot, shifted, zeros]), [last], "add", 0)
    row_total = ctx.reduce(exponent, [last], "add", 0)
    loss = ctx.emit("subtract", [ctx.emit("log", [row_total]), picked])
    in_range = ctx.emit("and", [
        ctx.emit("compare", [labels, ctx.full(0, labels.shape)], direction="GE"),
        ctx.emit("compare", [labels, ctx.full(dims[last], labels.shape)], direction="LT")])
    loss = ctx.emit("select", [in_range, loss, ctx.full(np.nan, loss.shape)])
    probabilities = ctx.emit("divide", [exponent, total])
    backprop = ctx.emit("subtract", [probabilities,
                                     ctx.convert(one_hot, probabilities.shape.element_type)])
    return [loss, backprop]


# -- arg max / min ------------------------------------------------------------------------------
def _check_arg_reduce(op: tf.Operation) -> str | None:
    dims = known_dims(op.inputs[0])
    axis = constant_value(op.inputs[1])
    if dims is None or axis is None:
        return None  # marking reports unknown shapes and non-constant inputs itself
    if not dims:
        return "a scalar input"
    if dims[int(axis) % len(dims)] == 0:
        return "an empty reduced dimension (TF raises)"
    return None


def _arg_reduce(kind: str) -> Any:
    def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands) -> list[Instruction]:
        # TF's CPU kernel starts from (index 0, the lowest finite value) and moves only on a
        # strictly greater value: NaN never wins, nor do values at or past that bound. So:
        # clamp the losers to the bound, take the extreme, and the first index reaching it
        # (index 0 when nothing beat the bound: every element then equals it).
        x = operands[0]
        if x.shape.element_type == "pred":  # false < true, as TF's kernel orders bools
            x = ctx.convert(x, "s32")
        dims = x.shape.dims
        axis = int(ctx.static_input(1)) % len(dims)
        lowest, highest = value_range(x.shape.element_type)
        bound = ctx.full(lowest if kind == "maximum" else highest, x.shape)
        beats = ctx.emit("compare", [x, bound], direction="GT" if kind == "maximum" else "LT")
        contenders = ctx.emit("select", [beats, x, bound])
        extreme = ctx.reduce(contenders, [axis], kind, lowest if kind == "maximum"
                             else highest)
        hit = ctx.emit("compare", [contenders, _spread(ctx, extreme, dims, axis)],
                       direction="EQ")
        etype = element_type(op.outputs[0].dtype)
        indices = _iota(ctx, etype, dims, axis)
        candidates = ctx.emit("select", [hit, indices, ctx.full(dims[axis], indices.shape)])
        return [ctx.reduce(candidates, [axis], "minimum", dims[axis])]

    lower.__doc__ = f"TF's Arg{'Max' if kind == 'maximum' else 'Min'}: first index of the extreme."
    return lower


_ARG_NOTE = "NaN never wins, as in TF's CPU kernel"
register("ArgMax", dtypes=NUMERIC | BOOL, static_inputs=(1,), check=_check_arg_reduce,
         note=_ARG_NOTE)(_arg_reduce("maximum"))
register("ArgMin", dtypes=NUMERIC | BOOL, static_inputs=(1,), check=_check_arg_reduce,
         note=_ARG_NOTE)(_arg_reduce("minimum"))


@register("InTopKV2", dtypes=frozenset({"float32", "bool"}) | INTEGER, static_inputs=(2,),
          note="k constant")
def _lower_in_top_k(ctx: LoweringContext, op: tf.Operation,
                    operands: Operands) -> list[Instruction]:
    """TF's InTopKV2 (Keras's top-k accuracy): whether each row's target class is among
    its k largest predictions, ties counting for the target (fewer than k predictions
    strictly greater). False, as in TF's CPU kernel, for a target out of range and for a
    row with any non-finite prediction."""
    predictions, targets = operands[0], operands[1]
    dims = predictions.shape.dims
    k = int(ctx.static_input(2))
    index_type = targets.shape.element_type
    classes = _iota(ctx, index_type, dims, 1)
    chosen = ctx.emit("compare", [classes, _spread(ctx, targets, dims, 1)], direction="EQ")
    # Exactly one element is chosen in range (0 + x is x for any x but -0.0, whose sign
    # no comparison below sees); none out of range, which `in_range` says.
    target = ctx.reduce(ctx.emit("select", [chosen, predictions,
                                            ctx.full(0.0, predictions.shape)]), [1], "add", 0.0)
    greater = ctx.emit("compare", [predictions, _spread(ctx, target, dims, 1)],
                       direction="GT")
    ahead = ctx.reduce(ctx.convert(greater, "s32"), [1], "add", 0)
    finite = ctx.emit("compare", [ctx.emit("abs", [predictions]),
                                  ctx.full(np.inf, predictions.shape)], direction="LT")
    all_finite = ctx.reduce(ctx.convert(finite, "s32"), [1], "minimum", 1)
    row = Shape("s32", dims[:1])
    in_range = ctx.emit("and", [
        ctx.emit("compare", [targets, ctx.full(0, targets.shape)], direction="GE"),
        ctx.emit("compare", [targets, ctx.full(dims[1], targets.shape)], direction="LT")])
    within = ctx.emit("compare", [ahead, ctx.full(max(min(k, 2**31 - 1), -(2**31)), row)],
                      direction="LT")
    finite_row = ctx.emit("compare", [all_finite, ctx.full(1, row)], direction="EQ")
    return [ctx.emit("and", [ctx.emit("and", [in_range, within]), finite_row])]


# -- top-k (and so tf.sort, tf.argsort) ---------------------------------------------------------
# Three forms of one order (`_lower_top_k`): short rows count the elements ahead of each
# (n² compares, vectorized); a few of many stream through HLO `topk`; the rest sort the
# row (HLO `sort`).
# Rows up to this long rank every element by counting those ahead of it (n² compares a
# row, vectorized). Longer rows: up to _TOP_K_STREAMING_MAX results by HLO `topk`, one
# pass keeping the k best (a compare an element, k shifts for one that enters: an
# ascending row, the worst case, costs n·k); more sort (values, indices) with HLO
# `sort`, n log n comparisons through the comparator, some 20-50 ns each
# (codegen/cpu/sort.py).
_TOP_K_COUNTING_MAX = 256
_TOP_K_STREAMING_MAX = 64


def _check_top_k(op: tf.Operation) -> str | None:
    dims = known_dims(op.inputs[0])
    k = constant_value(op.inputs[1])
    if dims is None or k is None:
        return None  # marking reports unknown shapes and non-constant inputs itself
    if not dims:
        return "a scalar input"
    if not 0 <= int(k) <= dims[-1]:
        return f"k = {int(k)} out of [0, {dims[-1]}]"
    return None


@register("TopKV2", dtypes=NUMERIC, static_inputs=(1,), check=_check_top_k,
          note="NaN ranks above +inf")
def _lower_top_k(ctx: LoweringContext, op: tf.Operation, operands: Operands
                 ) -> list[Instruction]:
    # Element i is ahead of element j when x_i > x_j, or when they are equal and i < j:
    # TF's CPU kernel's stable descending order (-0.0 and 0.0 equal, kept in index order).
    # NaN, which TF's comparator leaves unordered, ranks above +inf (TF's XLA too, for a
    # NaN with the sign bit clear). A total order, so counting and sorting agree. Short
    # rows: the place of j is the count of elements ahead of it; output p takes the
    # element whose place is p.
    x = operands[0]
    dims = x.shape.dims
    k = int(ctx.static_input(1))
    if dims[-1] > _TOP_K_COUNTING_MAX:
        if k <= _TOP_K_STREAMING_MAX:
            return _top_k_by_topk(ctx, op, x, k)
        return _top_k_by_sort(ctx, op, x, k)
    rank, n = len(dims), dims[-1]
    batch = dims[:-1]
    square = batch + (n, n)  # axis rank - 1: i, axis rank: j
    x_i = ctx.emit("broadcast", [x], shape=x.shape.with_dims(square),
                   dimensions=tuple(range(rank - 1)) + (rank - 1,))
    x_j = ctx.emit("broadcast", [x], shape=x.shape.with_dims(square),
                   dimensions=tuple(range(rank - 1)) + (rank,))
    ahead = _ahead(ctx.emit, x_i, x_j, _iota(ctx, "s32", square, rank - 1),
                   _iota(ctx, "s32", square, rank), x.shape.element_type in FLOAT_TYPES)
    place = ctx.reduce(ctx.convert(ahead, "s32"), [rank - 1], "add", 0)  # batch + (n,)
    picks = batch + (k, n)  # axis rank - 1: output p, axis rank: element j
    hit = ctx.emit("compare", [
        ctx.emit("broadcast", [place], shape=place.shape.with_dims(picks),
                 dimensions=tuple(range(rank - 1)) + (rank,)),
        _iota(ctx, "s32", picks, rank - 1)], direction="EQ")
    positions = _iota(ctx, "s32", picks, rank)
    indices = ctx.reduce(ctx.emit("select", [hit, positions, ctx.full(0, positions.shape)]),
                         [rank], "add", 0)
    # Exactly one hit a row: a maximum over the rest at the type's bottom keeps it (NaN
    # and -0.0 included).
    etype = x.shape.element_type
    bottom = float("-inf") if etype in FLOAT_TYPES else value_range(etype)[0]
    spread = ctx.emit("broadcast", [x], shape=x.shape.with_dims(picks),
                      dimensions=tuple(range(rank - 1)) + (rank,))
    values = ctx.reduce(ctx.emit("select", [hit, spread, ctx.full(bottom, spread.shape)]),
                        [rank], "maximum", bottom)
    return [values, ctx.convert(indices, element_type(op.outputs[1].dtype))]


def _ahead(create: Any, x: Instruction, y: Instruction, x_index: Instruction,
           y_index: Instruction, is_float: bool) -> Instruction:
    """Whether x (at x_index) is ahead of y (at y_index) in `_lower_top_k`'s order,
    element-wise, built with `create(opcode, operands, **attributes)` (a lowering's
    `ctx.emit` or a computation's `create`)."""
    greater = create("compare", [x, y], direction="GT")
    equal = create("compare", [x, y], direction="EQ")
    if is_float:
        nan_x = create("compare", [x, x], direction="NE")
        nan_y = create("compare", [y, y], direction="NE")
        greater = create("or", [greater, create("and", [nan_x, create("not", [nan_y])])])
        equal = create("or", [equal, create("and", [nan_x, nan_y])])
    earlier = create("compare", [x_index, y_index], direction="LT")
    return create("or", [greater, create("and", [equal, earlier])])


def _top_k_by_topk(ctx: LoweringContext, op: tf.Operation, x: Instruction, k: int
                   ) -> list[Instruction]:
    """HLO `topk`, whose order is `_lower_top_k`'s (tfxla_lite/hlo/sort.py)."""
    both = ctx.emit("topk", [x], k=k, largest=True)
    values = ctx.emit("get-tuple-element", [both], index=0)
    positions = ctx.emit("get-tuple-element", [both], index=1)
    return [values, ctx.convert(positions, element_type(op.outputs[1].dtype))]


def _top_k_by_sort(ctx: LoweringContext, op: tf.Operation, x: Instruction, k: int
                   ) -> list[Instruction]:
    """The k first of (values, indices) sorted together along the last dimension, as
    tf2xla's TopKV2 does, under `_lower_top_k`'s order."""
    dims = x.shape.dims
    rank = len(dims)
    indices = _iota(ctx, "s32", dims, rank - 1)
    comparator = _top_k_order(ctx.module, x.shape.element_type)
    both = ctx.emit("sort", [x, indices], called_computations=[comparator],
                    dimensions=(rank - 1,), is_stable=True)
    spec = tuple((0, size, 1) for size in dims[:-1]) + ((0, k, 1),)
    values = ctx.emit("slice", [ctx.emit("get-tuple-element", [both], index=0)], slice=spec)
    positions = ctx.emit("slice", [ctx.emit("get-tuple-element", [both], index=1)], slice=spec)
    return [values, ctx.convert(positions, element_type(op.outputs[1].dtype))]


def _top_k_order(module: HloModule, etype: str) -> Computation:
    """The comparator of `_lower_top_k`'s order over (value, index) pairs, one a module
    for each value type."""
    def build(comp: Computation) -> None:
        scalar, index = Shape(etype, ()), Shape("s32", ())
        lhs, rhs = comp.add_parameter(0, scalar, "lhs"), comp.add_parameter(1, scalar, "rhs")
        lhs_index = comp.add_parameter(2, index, "lhs_index")
        rhs_index = comp.add_parameter(3, index, "rhs_index")
        comp.root = _ahead(comp.create, lhs, rhs, lhs_index, rhs_index, etype in FLOAT_TYPES)

    return module.shared_computation(f"top_k_order_{etype}", build)


# -- one-hot ------------------------------------------------------------------------------------
@register("OneHot", dtypes=ALL, static_inputs=(1,), note="constant depth")
def _lower_one_hot(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    indices, _, on_value, off_value = operands
    out = ctx.output_shape()
    axis = int(op.get_attr("axis")) % out.rank
    positions = _iota(ctx, indices.shape.element_type, out.dims, axis)
    hit = ctx.emit("compare", [positions, _spread(ctx, indices, out.dims, axis)],
                   direction="EQ")
    return [ctx.emit("select", [hit, ctx.broadcast_to(on_value, out.dims),
                                ctx.broadcast_to(off_value, out.dims)])]


# -- einsum -------------------------------------------------------------------------------------
def parse_einsum(equation: str, count: int) -> tuple[list[str], str]:
    """The input terms and output term of `equation`; LoweringError for forms not lowered
    here (ellipses, repeated labels in one term, more than two operands)."""
    equation = equation.replace(" ", "")
    if "." in equation:
        raise LoweringError("einsum ellipsis not supported")
    left, arrow, output = equation.partition("->")
    terms = left.split(",")
    if len(terms) != count or count not in (1, 2):
        raise LoweringError(f"einsum with {len(terms)} operands (1 or 2 supported)")
    if not arrow:  # implicit output: the labels seen once, sorted
        labels = "".join(terms)
        output = "".join(sorted(c for c in set(labels) if labels.count(c) == 1))
    for term in terms + [output]:
        if len(set(term)) != len(term):
            raise LoweringError(f"einsum term {term!r} repeats a label (a diagonal)")
    return terms, output


def _check_einsum(op: tf.Operation) -> str | None:
    try:
        terms, _ = parse_einsum(op.get_attr("equation").decode(), len(op.inputs))
    except LoweringError as error:
        return str(error)
    sizes: dict[str, int] = {}
    for term, tensor in zip(terms, op.inputs):
        dims = known_dims(tensor)
        if dims is None or len(dims) != len(term):
            return None  # marking reports unknown shapes itself
        for label, size in zip(term, dims):
            if sizes.setdefault(label, size) != size:
                return f"einsum label {label!r} broadcasts ({sizes[label]} vs {size})"
    return None


def _transpose_to(ctx: LoweringContext, x: Instruction, have: str, want: str) -> Instruction:
    perm = tuple(have.index(c) for c in want)
    if perm == tuple(range(len(perm))):
        return x
    return ctx.emit("transpose", [x], dimensions=perm)


@register("Einsum", dtypes=MATMUL_DTYPES, check=_check_einsum,
          note="one or two operands, no ellipsis, no repeated labels in a term")
def _lower_einsum(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    terms, output = parse_einsum(op.get_attr("equation").decode(), len(operands))
    sizes = {c: d for term, x in zip(terms, operands) for c, d in zip(term, x.shape.dims)}
    # Sum out the labels only one operand has and the output lacks.
    values, kept_terms = [], []
    for k, (term, x) in enumerate(zip(terms, operands)):
        others = "".join(t for j, t in enumerate(terms) if j != k) + output
        axes = [i for i, c in enumerate(term) if c not in others]
        if axes:
            x = ctx.reduce(x, axes, "add", 0)
            term = "".join(c for c in term if c in others)
        values.append(x)
        kept_terms.append(term)
    if len(values) == 1:
        return [_transpose_to(ctx, values[0], kept_terms[0], output)]

    (a, b), (ta, tb) = values, kept_terms
    batch = "".join(c for c in ta if c in tb and c in output)
    contract = "".join(c for c in ta if c in tb and c not in output)
    free_a = "".join(c for c in ta if c not in tb)
    free_b = "".join(c for c in tb if c not in ta)

    def size(labels: str) -> int:
        return int(np.prod([sizes[c] for c in labels], dtype=np.int64))

    # [B, M, K] x [B, K, N] -> [B, M, N]: one batched dot of canonical operands.
    a = ctx.reshape(_transpose_to(ctx, a, ta, batch + free_a + contract),
                    (size(batch), size(free_a), size(contract)))
    b = ctx.reshape(_transpose_to(ctx, b, tb, batch + contract + free_b),
                    (size(batch), size(contract), size(free_b)))
    product = ctx.dot(a, b, lhs_batch_dims=(0,), rhs_batch_dims=(0,),
                      lhs_contracting_dims=(2,), rhs_contracting_dims=(1,))
    labels = batch + free_a + free_b
    product = ctx.reshape(product, [sizes[c] for c in labels])
    return [_transpose_to(ctx, product, labels, output)]
