"""Lowering rules of TF's block rearrangements: SpaceToBatchND and BatchToSpaceND,
SpaceToDepth and DepthToSpace.

Registered into `registry.OP_RULES` on import; pure data movement, each op the other's
gradient (TF builds dilated convolutions from the first pair). BatchToSpaceND and the
depth pair are reshape, transpose, reshape (and a crop `slice`), as tf2xla lowers them;
SpaceToBatchND is the `pad` then one strided `slice` per block offset, concatenated
along the batch, which the fused loop reads without the index arithmetic a pad inside
the reshapes would cost. Block shapes, paddings and crops must be constants.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from tfxla_lite.clustering.registry import (
    ALL,
    NUMERIC,
    LoweringContext,
    LoweringError,
    attribute,
    constant_value,
    register,
)
from tfxla_lite.hlo import Instruction
from tfxla_lite.hlo.attributes import PaddingConfig

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]


def _blocks_and_edges(op: tf.Operation) -> tuple[np.ndarray, np.ndarray] | str:
    """(block_shape [M], paddings or crops [M, 2]) as int64, or why they cannot compile."""
    block = constant_value(op.inputs[1])
    edges = constant_value(op.inputs[2])
    if block is None:
        return "input 1 (block_shape) must be a constant"
    if edges is None:
        return "input 2 (paddings or crops) must be a constant"
    block = block.astype(np.int64).reshape(-1)
    count = block.size
    if edges.shape != (count, 2):
        return f"input 2 has shape {list(edges.shape)}, not [{count}, 2]"
    edges = edges.astype(np.int64)
    rank = op.inputs[0].shape.rank
    if rank is not None and rank < 1 + count:
        return f"input of rank {rank} has fewer than 1 + {count} dimensions"
    if (block < 1).any():
        return f"block_shape {block.tolist()} has an element below 1"
    if (edges < 0).any():
        return f"negative paddings or crops {edges.tolist()}"
    return block, edges


def _check_space_to_batch(op: tf.Operation) -> str | None:
    found = _blocks_and_edges(op)
    if isinstance(found, str):
        return found
    block, paddings = found
    dims = op.inputs[0].shape.as_list() if op.inputs[0].shape.rank is not None else None
    if dims is None:
        return None
    for i, size in enumerate(dims[1:1 + block.size]):
        if size is not None and (size + paddings[i].sum()) % block[i]:
            return (f"padded dimension {i + 1} ({size} + {paddings[i].tolist()}) is not a "
                    f"multiple of block {block[i]}")
    return None


def _check_batch_to_space(op: tf.Operation) -> str | None:
    found = _blocks_and_edges(op)
    if isinstance(found, str):
        return found
    block, crops = found
    dims = op.inputs[0].shape.as_list() if op.inputs[0].shape.rank is not None else None
    if dims is None:
        return None
    if dims[0] is not None and dims[0] % int(np.prod(block)):
        return f"batch {dims[0]} is not a multiple of the {int(np.prod(block))} blocks"
    for i, size in enumerate(dims[1:1 + block.size]):
        if size is not None and crops[i].sum() > size * block[i]:
            return f"crops {crops[i].tolist()} exceed dimension {i + 1} ({size * block[i]})"
    return None


def _pad(ctx: LoweringContext, x: Instruction, paddings: np.ndarray) -> Instruction:
    """`x` with zeros before and after dims 1..M (the spatial ones)."""
    if not paddings.any():
        return x
    config = [(0, 0)] * x.shape.rank
    for i, (low, high) in enumerate(paddings):
        config[1 + i] = (int(low), int(high))
    return ctx.emit("pad", [x, ctx.constant(0, x.shape.element_type)],
                    padding=PaddingConfig.of(*config))


@register("SpaceToBatchND", dtypes=NUMERIC, static_inputs=(1, 2), check=_check_space_to_batch,
          note="constant block_shape and paddings")
def _lower_space_to_batch(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    found = _blocks_and_edges(op)
    if isinstance(found, str):
        raise LoweringError(found)
    block, paddings = found
    x = _pad(ctx, operands[0], paddings)
    # Output batch (k0, ..., k(M-1), n) is the strided slice of the padded input starting
    # at block offset k: one slice per offset, concatenated in that order.
    pieces = []
    for offsets in itertools.product(*(range(int(b)) for b in block)):
        spec = [(0, size, 1) for size in x.shape.dims]
        for i, (k, b) in enumerate(zip(offsets, block)):
            size = x.shape.dims[1 + i]  # a 0-size dim has no offset k > 0: start at 0
            spec[1 + i] = (min(k, size), size, int(b))
        pieces.append(ctx.emit("slice", [x], slice=tuple(spec)))
    if len(pieces) == 1:
        return pieces
    return [ctx.emit("concatenate", pieces, dimensions=(0,))]


@register("BatchToSpaceND", dtypes=NUMERIC, static_inputs=(1, 2), check=_check_batch_to_space,
          note="constant block_shape and crops")
def _lower_batch_to_space(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    found = _blocks_and_edges(op)
    if isinstance(found, str):
        raise LoweringError(found)
    block, crops = found
    count = block.size
    x = operands[0]
    batch, spatial = x.shape.dims[0], x.shape.dims[1:1 + count]
    rest = x.shape.dims[1 + count:]
    blocks = [int(b) for b in block]
    # [b0, ..., b(M-1), batch / prod(b), s0, ..., s(M-1), rest...]
    x = ctx.reshape(x, blocks + [batch // int(np.prod(block))] + list(spatial) + list(rest))
    # [batch / prod(b), s0, b0, ..., s(M-1), b(M-1), rest...]
    perm = [count]
    for i in range(count):
        perm += [count + 1 + i, i]
    perm += list(range(1 + 2 * count, 1 + 2 * count + len(rest)))
    x = _transpose(ctx, x, perm)
    uncropped = [x.shape.dims[0]] + [s * b for s, b in zip(spatial, blocks)] + list(rest)
    x = ctx.reshape(x, uncropped)
    if crops.any():
        spec = [(0, size, 1) for size in uncropped]
        for i, (low, high) in enumerate(crops):
            spec[1 + i] = (int(low), uncropped[1 + i] - int(high), 1)
        x = ctx.emit("slice", [x], slice=tuple(spec))
    return [x]


def _transpose(ctx: LoweringContext, x: Instruction, perm: list[int]) -> Instruction:
    if perm == sorted(perm):
        return x
    return ctx.emit("transpose", [x], dimensions=tuple(perm))


# -- depth ---------------------------------------------------------------------------------------
def _check_depth(op: tf.Operation) -> str | None:
    """4-D, NHWC or NCHW (TF's CPU kernels take NHWC only; XLA both), block >= 2."""
    layout = attribute(op, "data_format", "NHWC")
    if layout not in ("NHWC", "NCHW"):
        return f"data_format {layout}"
    if op.inputs[0].shape.rank != 4:
        return f"input of rank {op.inputs[0].shape.rank}, not 4"
    block = int(op.get_attr("block_size"))
    if block < 2:
        return f"block_size {block} below 2"
    dims = op.inputs[0].shape.as_list()
    spatial = dims[1:3] if layout == "NHWC" else dims[2:4]
    depth = dims[3] if layout == "NHWC" else dims[1]
    if op.type == "SpaceToDepth" and any(d is not None and d % block for d in spatial):
        return f"height and width {spatial} not multiples of block_size {block}"
    if op.type == "DepthToSpace" and depth is not None and depth % (block * block):
        return f"depth {depth} not a multiple of block_size² {block * block}"
    return None


@register("SpaceToDepth", dtypes=ALL, check=_check_depth, note="NHWC or NCHW")
def _lower_space_to_depth(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    x, block = operands[0], int(op.get_attr("block_size"))
    if attribute(op, "data_format", "NHWC") == "NHWC":
        n, h, w, c = x.shape.dims
        # [n, h/b, b (row offset), w/b, b (column offset), c] → offsets before the depth
        x = ctx.reshape(x, (n, h // block, block, w // block, block, c))
        x = _transpose(ctx, x, [0, 1, 3, 2, 4, 5])
    else:
        n, c, h, w = x.shape.dims
        # [n, c, h/b, b, w/b, b] → [n, row offset, column offset, c, h/b, w/b]
        x = ctx.reshape(x, (n, c, h // block, block, w // block, block))
        x = _transpose(ctx, x, [0, 3, 5, 1, 2, 4])
    return [ctx.reshape(x, ctx.output_shape().dims)]


@register("DepthToSpace", dtypes=ALL, check=_check_depth, note="NHWC or NCHW")
def _lower_depth_to_space(ctx: LoweringContext, op: tf.Operation, operands: Operands
                          ) -> list[Instruction]:
    x, block = operands[0], int(op.get_attr("block_size"))
    if attribute(op, "data_format", "NHWC") == "NHWC":
        n, h, w, c = x.shape.dims
        # [n, h, w, row offset, column offset, c'] → [n, h, row offset, w, column offset, c']
        x = ctx.reshape(x, (n, h, w, block, block, c // (block * block)))
        x = _transpose(ctx, x, [0, 1, 3, 2, 4, 5])
    else:
        n, c, h, w = x.shape.dims
        # [n, row offset, column offset, c', h, w] → [n, c', h, row offset, w, column offset]
        x = ctx.reshape(x, (n, block, block, c // (block * block), h, w))
        x = _transpose(ctx, x, [0, 3, 4, 1, 5, 2])
    return [ctx.reshape(x, ctx.output_shape().dims)]
