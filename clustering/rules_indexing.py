"""Lowering rules of TF's indexing ops: gathers, scatters, segment sums, reverses, scans.

Registered into `registry.OP_RULES` on import, each as TF's XLA bridge lowers it
(`tf2xla/kernels/gather_op.cc`, `segment_reduction_ops.cc`, `scatter_nd_op.cc`,
`reverse_op.cc`, `scan_ops.cc`): gathers are one `gather`, segment reductions and
scatters one `scatter`, scans a `reduce-window` over the whole axis. Out-of-range
indices and 2-byte float accumulation follow XLA or TF's CPU kernels op by op:
docs/supported_ops.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    ALL,
    FLOAT,
    NUMERIC,
    LoweringContext,
    LoweringError,
    constant_value,
    register,
    value_range,
)
from tfxla_lite.hlo import Computation, Instruction, Shape
from tfxla_lite.hlo.attributes import Window, WindowDimension

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


# -- gathers ------------------------------------------------------------------------------------
def _gather_axes(op: tf.Operation) -> tuple[int, int] | str:
    """(axis, batch_dims), normalized, or the reason they cannot compile. Needs ranks
    only: a cluster with unknown dimensions compiles per shape."""
    params, indices = op.inputs[0].shape.rank, op.inputs[1].shape.rank
    if params is None or indices is None:
        return "ranks are not known"
    if op.type == "Gather":
        axis, batch_dims = 0, 0
    else:
        value = constant_value(op.inputs[2])
        if value is None:
            return "input 2 (axis) must be a constant"
        axis, batch_dims = int(value), int(op.get_attr("batch_dims"))
    if batch_dims < 0:
        batch_dims += indices
    if axis < 0:
        axis += params
    if not 0 <= batch_dims <= indices or not batch_dims <= axis < params:
        return f"axis {axis} and batch_dims {batch_dims} out of range"
    return axis, batch_dims


def _check_gather(op: tf.Operation) -> str | None:
    axes = _gather_axes(op)
    return axes if isinstance(axes, str) else None


def _iota(ctx: LoweringContext, etype: str, dims: tuple[int, ...], axis: int) -> Instruction:
    return ctx.emit("iota", [], shape=Shape(etype, dims), iota_dimension=axis)


@register("GatherV2", "Gather", dtypes=ALL, static_inputs=(2,),
          check=_check_gather, note="constant axis, any batch_dims; an index out of range is "
                                    "clamped (TF's CPU kernel raises)")
def _lower_gather(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    axes = _gather_axes(op)
    assert not isinstance(axes, str)
    return [gather(ctx, operands[0], operands[1], *axes)]


def gather(ctx: LoweringContext, params: Instruction, indices: Instruction, axis: int,
           batch_dims: int) -> Instruction:
    """TF's gather of `params` along `axis` (normalized, as `batch_dims`) at `indices`, as
    one HLO `gather`; shared with ResourceGather (rules_variables.py)."""
    rank = indices.shape.rank
    dims = indices.shape.dims
    # Index vectors [b0, ..., b(k-1), index] along a new last dimension.
    etype = indices.shape.element_type
    column = dims + (1,)
    parts = [_iota(ctx, etype, column, d) for d in range(batch_dims)]
    parts.append(ctx.reshape(indices, column))
    vectors = parts[0] if len(parts) == 1 else ctx.emit("concatenate", parts,
                                                        dimensions=(rank,))
    starts = tuple(range(batch_dims)) + (axis,)
    if any(params.shape.dims[d] == 0 for d in starts):
        return _gather_from_nothing(ctx)
    sizes = tuple(1 if d in starts else n for d, n in enumerate(params.shape.dims))
    out_rank = params.shape.rank - 1 - batch_dims + rank
    offset_dims = tuple(range(batch_dims, axis)) + tuple(range(axis + rank - batch_dims,
                                                               out_rank))
    return ctx.emit("gather", [params, vectors], offset_dims=offset_dims,
                    collapsed_slice_dims=starts, start_index_map=starts,
                    index_vector_dim=rank, slice_sizes=sizes)


def _gather_from_nothing(ctx: LoweringContext) -> Instruction:
    """A gather along an axis of size 0: HLO has no slice of size 1 there. With no indices
    the result is empty; with some, TF raises and there is no element to clamp to."""
    out = ctx.output_shape()
    if out.num_elements:
        raise LoweringError("gather of indices from an axis of size 0")
    return ctx.full(0, out)


def _check_gather_nd(op: tf.Operation) -> str | None:
    indices = op.inputs[1].shape
    if indices.rank is None or indices.rank == 0 or indices[-1] is None:
        return "indices need a known rank of at least 1 and a known last dimension"
    if op.inputs[0].shape.rank is not None and indices[-1] > op.inputs[0].shape.rank:
        return f"index vectors of {indices[-1]} for params of rank {op.inputs[0].shape.rank}"
    return None


@register("GatherNd", dtypes=ALL, check=_check_gather_nd,
          note="an index out of range is clamped (TF's CPU kernel raises)")
def _lower_gather_nd(ctx: LoweringContext, op: tf.Operation, operands: Operands
                     ) -> list[Instruction]:
    # Index vectors along the last dimension name the first `depth` params dims; the rest
    # of params is each gathered slice.
    params, indices = operands
    depth = indices.shape.dims[-1]
    batch = indices.shape.rank - 1
    named = tuple(range(depth))
    if any(params.shape.dims[d] == 0 for d in named):
        return [_gather_from_nothing(ctx)]
    sizes = tuple(1 if d < depth else n for d, n in enumerate(params.shape.dims))
    out_rank = batch + params.shape.rank - depth
    return [ctx.emit("gather", [params, indices], offset_dims=tuple(range(batch, out_rank)),
                     collapsed_slice_dims=named, start_index_map=named,
                     index_vector_dim=batch, slice_sizes=sizes)]


def _stitch_positions(op: tf.Operation) -> list[int] | str | None:
    """For each output row of a DynamicStitch with constant indices, the position of its
    source in the data rows laid end to end (the last one naming it wins, as in TF); a
    reason when the indices leave a row out; None while they are not known (indices that
    follow from shapes are constants once a cluster compiles for its shapes)."""
    count = int(op.get_attr("N"))
    values = [constant_value(op.inputs[m]) for m in range(count)]
    if any(v is None for v in values):
        return None
    flat = [int(i) for v in values for i in v.reshape(-1)]  # type: ignore[union-attr]
    rows = max(flat, default=-1) + 1
    source = {index: position for position, index in enumerate(flat)}
    if min(flat, default=0) < 0 or len(source) != rows:
        return "indices must name every output row once or more, none negative"
    return [source[j] for j in range(rows)]


def _check_dynamic_stitch(op: tf.Operation) -> str | None:
    positions = _stitch_positions(op)
    return positions if isinstance(positions, str) else None


@register("DynamicStitch", dtypes=ALL, static_leading="N", check=_check_dynamic_stitch,
          note="constant indices that cover every output row")
def _lower_dynamic_stitch(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    # The shape arithmetic of gradients (reduced_shape) stitches shape vectors at constant
    # positions: the data rows laid end to end, then gathered in output order.
    count = int(op.get_attr("N"))
    out = ctx.output_shape()
    rest = out.dims[1:]
    rows = []
    for m in range(count):
        n = int(ctx.static_input(m).size)
        rows.append(ctx.reshape(operands[count + m], (n,) + rest))
    table = rows[0] if len(rows) == 1 else ctx.emit("concatenate", rows, dimensions=(0,))
    positions = _stitch_positions(op)
    if not isinstance(positions, list):
        raise LoweringError(f"DynamicStitch {op.name}: {positions or 'indices not constant'}")
    if positions == list(range(table.shape.dims[0])):
        return [table]
    where = ctx.constant(np.array(positions, np.int64), "s64")
    return [ctx.emit("gather", [table, where], offset_dims=tuple(range(1, out.rank)),
                     collapsed_slice_dims=(0,), start_index_map=(0,), index_vector_dim=1,
                     slice_sizes=(1,) + rest)]


# -- scatters -----------------------------------------------------------------------------------
def _combiner(ctx: LoweringContext, kind: str, etype: str) -> Any:
    """The scalar computation (old, new) -> combined of a scatter.

    `assign` gives new (XLA's TensorScatterUpdate). The others follow TF's CPU kernels
    rather than HLO's NaN-propagating maximum: Eigen's `maxi(a, b) = a < b ? b : a` and
    `mini(a, b) = b < a ? b : a` keep `a` when a comparison with NaN is false. The
    TensorScatter ops call them as (old, new), so a NaN update is ignored (`maximum`,
    `minimum`); the segment reductions as (new, old), so a NaN row replaces the running
    value and a later row replaces the NaN (`segment_maximum`, `segment_minimum`).
    """
    if kind in ("add", "multiply"):
        return ctx.module.reduction_computation(kind, etype)
    name = f"scatter_{kind}_{etype}"
    for comp in ctx.module.computations:
        if comp.name == name:
            return comp
    comp = ctx.module.new_computation(name)
    old = comp.add_parameter(0, Shape(etype, ()), name="old")
    new = comp.add_parameter(1, Shape(etype, ()), name="new")
    if kind == "assign":
        comp.root = new
    elif kind in ("subtract", "divide"):  # ResourceScatterSub/Div: old - new, old / new
        comp.root = comp.create(kind, [old, new])
    else:
        a, b = (new, old) if kind.startswith("segment_") else (old, new)
        b_wins = comp.create("compare", [a, b] if kind.endswith("maximum") else [b, a],
                             direction="LT")
        comp.root = comp.create("select", [b_wins, b, a])
    return comp


def scatter(ctx: LoweringContext, operand: Instruction, indices: Instruction,
             updates: Instruction, kind: str, index_vector_dim: int, inserted: int
             ) -> Instruction:
    """Scatter `updates` into `operand` at the first `inserted` operand dims that each
    index vector names; the remaining dims are windows."""
    etype = operand.shape.element_type
    combiner = _combiner(ctx, kind, etype)
    scatter_rank = indices.shape.rank - (1 if index_vector_dim < indices.shape.rank else 0)
    return ctx.emit("scatter", [operand, indices, updates], called_computations=[combiner],
                    update_window_dims=tuple(range(scatter_rank, updates.shape.rank)),
                    inserted_window_dims=tuple(range(inserted)),
                    scatter_dims_to_operand_dims=tuple(range(inserted)),
                    index_vector_dim=index_vector_dim)


def _extreme(etype: str, kind: str) -> Any:
    """What an empty segment holds: TF's CPU kernel starts from the lowest (highest)
    finite value, where XLA starts from -inf (inf)."""
    lowest, highest = value_range(etype)
    return lowest if kind.endswith("maximum") else highest


_SEGMENT_KINDS = {"UnsortedSegmentSum": ("add", 0), "UnsortedSegmentProd": ("multiply", 1),
                  "UnsortedSegmentMax": ("segment_maximum", None),
                  "UnsortedSegmentMin": ("segment_minimum", None)}
_SEGMENT_NOTE = ("constant num_segments; an id out of range drops its row (TF's CPU kernel "
                 "raises on ids >= num_segments)")


@register(*_SEGMENT_KINDS, dtypes=NUMERIC, static_inputs=(2,),
          note=_SEGMENT_NOTE)
def _lower_unsorted_segment(ctx: LoweringContext, op: tf.Operation, operands: Operands
                            ) -> list[Instruction]:
    # TF's segment_reduction_ops.cc: scatter the data rows into a tensor of the initial
    # value (0, 1, the lowest or the highest value) at their segment ids.
    data, ids = operands[0], operands[1]
    kind, init = _SEGMENT_KINDS[op.type]
    out = ctx.output_shape()
    start = ctx.full(_extreme(out.element_type, kind) if init is None else init, out)
    return [scatter(ctx, start, ids, data, kind, ids.shape.rank, 1)]


def _check_scatter_nd(op: tf.Operation) -> str | None:
    indices = op.inputs[1 if op.type.startswith("Tensor") else 0].shape
    if indices.rank is None or indices.rank == 0 or indices[-1] is None:
        return "indices need a known rank of at least 1 and a known last dimension"
    return None


_SCATTER_NOTE = "an index out of range drops its update (TF's CPU kernel raises)"


@register("ScatterNd", dtypes=NUMERIC, unused_inputs=(2,), check=_check_scatter_nd,
          note=_SCATTER_NOTE)
def _lower_scatter_nd(ctx: LoweringContext, op: tf.Operation, operands: Operands
                      ) -> list[Instruction]:
    indices, updates = operands[0], operands[1]
    out = ctx.output_shape()
    zeros = ctx.full(0, out)
    depth = indices.shape.dims[-1]
    return [scatter(ctx, zeros, indices, updates, "add", indices.shape.rank - 1, depth)]


@register("TensorScatterUpdate", dtypes=ALL, check=_check_scatter_nd,
          note=_SCATTER_NOTE + "; of repeated indices the last update wins")
@register("TensorScatterAdd", "TensorScatterMax", "TensorScatterMin", dtypes=NUMERIC,
          check=_check_scatter_nd, note=_SCATTER_NOTE)
def _lower_tensor_scatter(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    tensor, indices, updates = operands
    kind = {"TensorScatterAdd": "add", "TensorScatterUpdate": "assign",
            "TensorScatterMax": "maximum", "TensorScatterMin": "minimum"}[op.type]
    depth = indices.shape.dims[-1]
    return [scatter(ctx, tensor, indices, updates, kind, indices.shape.rank - 1, depth)]


# -- reverses and scans -------------------------------------------------------------------------
@register("ReverseV2", dtypes=ALL, static_inputs=(1,),
          note="constant axes")
def _lower_reverse(ctx: LoweringContext, op: tf.Operation, operands: Operands
                   ) -> list[Instruction]:
    x = operands[0]
    axes = sorted({int(a) % max(x.shape.rank, 1) for a in ctx.static_input(1).reshape(-1)})
    if not axes:
        return [x]
    return [ctx.emit("reverse", [x], dimensions=tuple(axes))]


def _check_scan(op: tf.Operation) -> str | None:
    axis = constant_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axis is None or rank is None:
        return None  # marking reports non-constant axes and unknown ranks itself
    if rank == 0 or not -rank <= int(axis) < rank:
        return f"axis {int(axis)} out of range for rank {rank}"
    return None


@register("Cumsum", "Cumprod", dtypes=NUMERIC, static_inputs=(1,),
          check=_check_scan, note="constant axis; exclusive and reverse")
def _lower_scan(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    x = operands[0]
    kind, init = ("add", 0) if op.type == "Cumsum" else ("multiply", 1)
    etype = x.shape.element_type
    return [_scan(ctx, op, x, ctx.module.reduction_computation(kind, etype), init)]


def _scan(ctx: LoweringContext, op: tf.Operation, x: Instruction, reducer: Computation,
          init: Any) -> Instruction:
    # scan_ops.cc: a reduce-window over the whole axis, padded so that output i sees the
    # elements up to i (or from i, reversed); exclusive pads one more and slices it off.
    rank = x.shape.rank
    if rank == 0:
        raise LoweringError(f"{op.type} of a scalar")
    axis = int(ctx.static_input(1)) % rank
    exclusive, reverse = bool(op.get_attr("exclusive")), bool(op.get_attr("reverse"))
    # A reverse scan runs forward over the reversed axis, so that it accumulates from the
    # end as TF's kernel does (a window padded on the right would sum from the start).
    if reverse:
        x = ctx.emit("reverse", [x], dimensions=(axis,))
    n = x.shape.dims[axis]
    pad = n if exclusive else max(n - 1, 0)
    window = Window(tuple(WindowDimension(n if d == axis else 1, 1, pad if d == axis else 0)
                          for d in range(rank)))
    etype = x.shape.element_type
    scanned = ctx.emit("reduce-window", [x, ctx.constant(init, etype)],
                       called_computations=[reducer], window=window)
    if exclusive:
        spec = [(0, d, 1) for d in scanned.shape.dims]
        spec[axis] = (0, n, 1)
        scanned = ctx.emit("slice", [scanned], slice=tuple(spec))
    if reverse:
        scanned = ctx.emit("reverse", [scanned], dimensions=(axis,))
    return scanned


def _log_add_exp(ctx: LoweringContext, etype: str) -> Computation:
    """TF's LogSumExp reducer (scan_ops.h) as a scalar computation:
    hi + log1p(exp(lo - hi)), or hi itself when hi is -inf (so -inf stays -inf)."""
    def build(comp: Computation) -> None:
        scalar = Shape(etype, ())
        a = comp.add_parameter(0, scalar, name="x")
        b = comp.add_parameter(1, scalar, name="y")
        # Eigen's max and min without NaN propagation: a < b ? b : a, b < a ? b : a.
        a_below = comp.create("compare", [a, b], direction="LT")
        b_below = comp.create("compare", [b, a], direction="LT")
        hi = comp.create("select", [a_below, b, a])
        lo = comp.create("select", [b_below, b, a])
        tail = comp.create("log-plus-one", [comp.create("exponential", [
            comp.create("subtract", [lo, hi])])])
        total = comp.create("add", [tail, hi])
        lowest = comp.add_constant(value_range(etype)[0], etype)
        empty = comp.create("compare", [hi, lowest], direction="LT")
        comp.root = comp.create("select", [empty, hi, total])

    return ctx.module.shared_computation(f"log_add_exp_{etype}", build)


@register("CumulativeLogsumexp", dtypes=FLOAT, static_inputs=(1,), check=_check_scan,
          note="constant axis; exclusive and reverse")
def _lower_cumulative_logsumexp(ctx: LoweringContext, op: tf.Operation, operands: Operands
                                ) -> list[Instruction]:
    x = operands[0]
    etype = x.shape.element_type
    return [_scan(ctx, op, x, _log_add_exp(ctx, etype), float("-inf"))]
