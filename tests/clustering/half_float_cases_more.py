"""The 2-byte-float audit's cases for resource variables, control flow, TensorLists,
resize, space/batch/depth and Bitcast (the rest are in half_float_cases.py).

Variable cases use variables made once per dtype and shape outside the traced function
(`_var`), and assign every variable from the case's inputs first, so that TF's run, the
evaluator's and the compiled one start from the same state. Control-flow cases build
While/If/Case (and their stateless forms) with the raw ops, whose function attributes
are concrete functions; TensorList cases chain the list ops without a loop.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from half_float_cases import Case, arrays
from tf_harness import over_shapes

raw = tf.raw_ops
_VARIABLES: dict[tuple[str, tuple[int, ...], int], tf.Variable] = {}


def _var(dtype: Any, shape: tuple[int, ...], slot: int = 0) -> tf.Variable:
    """The variable of `dtype` and `shape` for slot `slot`, made on first use (tf.function
    creates no variable while it traces)."""
    key = (tf.as_dtype(dtype).name, tuple(shape), slot)
    if key not in _VARIABLES:
        _VARIABLES[key] = tf.Variable(tf.zeros(shape, dtype))
    return _VARIABLES[key]


def _held(*values: Any) -> list[tf.Variable]:
    """Variables assigned `values` (one each, by dtype and shape)."""
    held = [_var(v.dtype, tuple(v.shape), slot) for slot, v in enumerate(values)]
    for variable, value in zip(held, values):
        variable.assign(value)
    return held


def _assigns(x: Any, y: Any) -> list[Any]:
    (v,) = _held(x)
    first = v.read_value()
    v.assign_add(y)
    added = v.read_value()
    v.assign_sub(x)
    return [first, added, v.read_value()]


_ROWS = tf.constant([1, 3, 0])


def _gather(x: Any) -> list[Any]:
    (v,) = _held(x)
    return [v.sparse_read(_ROWS), v.sparse_read(tf.constant([], tf.int32))]


def _scatter(op_type: str) -> Any:
    def fn(x: Any, u: Any) -> Any:
        (v,) = _held(x)
        getattr(raw, op_type)(resource=v.handle, indices=_ROWS, updates=u)
        return v.read_value()

    return fn


def _apply(op_type: str) -> Any:
    """The optimizer update on variables assigned from the inputs (var, then its slots
    from positive inputs), with the gradient last; returns every variable after it."""

    def fn(*xs: Any) -> list[Any]:
        *values, grad = xs
        held = _held(*values)
        dtype = grad.dtype
        c = {name: tf.constant(value, dtype) for name, value in (
            ("lr", 0.125), ("momentum", 0.875), ("beta1", 0.875), ("beta2", 0.96875),
            ("beta1_power", 0.5), ("beta2_power", 0.75), ("epsilon", 0.0625),
            ("rho", 0.875))}
        handles = [v.handle for v in held]
        if op_type == "ResourceApplyGradientDescent":
            raw.ResourceApplyGradientDescent(var=handles[0], alpha=c["lr"], delta=grad)
        elif op_type in ("ResourceApplyMomentum", "ResourceApplyKerasMomentum"):
            getattr(raw, op_type)(var=handles[0], accum=handles[1], lr=c["lr"], grad=grad,
                                  momentum=c["momentum"], use_nesterov=True)
        elif op_type == "ResourceApplyAdam":
            raw.ResourceApplyAdam(var=handles[0], m=handles[1], v=handles[2],
                                  beta1_power=c["beta1_power"],
                                  beta2_power=c["beta2_power"], lr=c["lr"],
                                  beta1=c["beta1"], beta2=c["beta2"], epsilon=c["epsilon"],
                                  grad=grad)
        elif op_type == "ResourceApplyRMSProp":
            raw.ResourceApplyRMSProp(var=handles[0], ms=handles[1], mom=handles[2],
                                     lr=c["lr"], rho=c["rho"], momentum=c["momentum"],
                                     epsilon=c["epsilon"], grad=grad)
        elif op_type == "ResourceApplyAdagrad":
            raw.ResourceApplyAdagrad(var=handles[0], accum=handles[1], lr=c["lr"], grad=grad)
        else:
            raw.ResourceApplyAdagradV2(var=handles[0], accum=handles[1], lr=c["lr"],
                                       epsilon=c["epsilon"], grad=grad)
        return [v.read_value() for v in held]

    return fn


_SLOTS = {"ResourceApplyGradientDescent": 0, "ResourceApplyMomentum": 1,
          "ResourceApplyKerasMomentum": 1, "ResourceApplyAdam": 2, "ResourceApplyRMSProp": 2,
          "ResourceApplyAdagrad": 1, "ResourceApplyAdagradV2": 1}


def _apply_case(op_type: str) -> Case:
    slots = _SLOTS[op_type]
    return Case(op_type, _apply(op_type),
                arrays([[(3, 4)] * (slots + 2)], "x" + "p" * slots + "x"))


# -- control flow ------------------------------------------------------------------------------
def _spec(x: Any) -> tf.TensorSpec:
    return tf.TensorSpec(x.shape, x.dtype)


def _loop(op_type: str) -> Any:
    def fn(x: Any) -> Any:
        counter = tf.TensorSpec([], tf.int32)
        cond = tf.function(lambda i, a: i < 3).get_concrete_function(counter, _spec(x))
        body = tf.function(lambda i, a: (i + 1, a * 1.5 - 0.25)).get_concrete_function(
            counter, _spec(x))
        return getattr(raw, op_type)(input=[tf.constant(0), x], cond=cond, body=body,
                                     output_shapes=[[], x.shape])[1]

    return fn


def _branches(x: Any) -> list[Any]:
    return [tf.function(f).get_concrete_function(_spec(x))
            for f in (lambda a: a * 2.0, lambda a: tf.exp(a) - 1.0, lambda a: -a)]


def _if(op_type: str) -> Any:
    def fn(x: Any, y: Any) -> list[Any]:
        # x's sum is NaN (false), y's finite sum may take either branch.
        return [getattr(raw, op_type)(cond=tf.reduce_sum(v) > 0, input=[v], Tout=[v.dtype],
                                      then_branch=_branches(v)[0],
                                      else_branch=_branches(v)[1],
                                      output_shapes=[v.shape])[0]
                for v in (x, y)]

    return fn


def _case(op_type: str) -> Any:
    def fn(*xs: Any) -> list[Any]:
        # 7 and -1 are out of range: TF runs the last branch.
        return [getattr(raw, op_type)(branch_index=tf.constant(i), input=[x], Tout=[x.dtype],
                                      branches=_branches(x), output_shapes=[x.shape])[0]
                for x in xs for i in (0, 1, 7, -1)]

    return fn


def _lists(x: Any) -> list[Any]:
    """Every TensorList op on the rows of `x` (4, 3)."""
    dtype, shape = x.dtype, tf.constant([3])
    full = raw.TensorListFromTensor(tensor=x, element_shape=shape)
    full = raw.TensorListSetItem(input_handle=full, index=2, item=x[0] * 2.0)
    read = raw.TensorListGetItem(input_handle=full, index=1, element_shape=shape,
                                 element_dtype=dtype)
    stacked = raw.TensorListStack(input_handle=full, element_shape=shape, element_dtype=dtype,
                                  num_elements=4)
    reserved = raw.TensorListReserve(element_shape=shape, num_elements=2, element_dtype=dtype)
    reserved = raw.TensorListSetItem(input_handle=reserved, index=0, item=-x[3])
    reserved = raw.TensorListSetItem(input_handle=reserved, index=1, item=x[2])
    grown = raw.EmptyTensorList(element_shape=shape, max_num_elements=3, element_dtype=dtype)
    grown = raw.TensorListPushBack(input_handle=grown, tensor=x[1])
    grown = raw.TensorListPushBack(input_handle=grown, tensor=x[0] + 1.0)
    grown, popped = raw.TensorListPopBack(input_handle=grown, element_shape=shape,
                                          element_dtype=dtype)
    length = raw.TensorListLength(input_handle=grown)
    element = raw.TensorListElementShape(input_handle=full, shape_type=tf.int32)
    return [read - 1.0, stacked * 1.0,
            raw.TensorListStack(input_handle=reserved, element_shape=shape,
                                element_dtype=dtype, num_elements=2) + 0.0,
            popped * 3.0, length + 1, element + 1]


_LIST_OPS = ("EmptyTensorList", "TensorListElementShape", "TensorListFromTensor",
             "TensorListGetItem", "TensorListLength", "TensorListPopBack",
             "TensorListPushBack", "TensorListReserve", "TensorListSetItem", "TensorListStack")


# -- resize, space, bitcast --------------------------------------------------------------------
_IMAGES = arrays([[(2, 3, 4, 2)], [(1, 1, 1, 3)], [(0, 2, 2, 1)]], "x")


def _resize(op_type: str, **attrs: Any) -> Any:
    def fn(*images: Any) -> list[Any]:
        return [getattr(raw, op_type)(images=x, size=size, **attrs)
                for x in images for size in ([5, 7], [2, 3], [1, 1])]

    return fn


def _resize_grads(op_type: str) -> Any:
    def fn(g: Any, image: Any = None) -> list[Any]:
        if op_type == "ResizeBilinearGrad":  # TF takes float32 gradients for any image
            return [raw.ResizeBilinearGrad(grads=tf.cast(g, tf.float32), original_image=image,
                                           half_pixel_centers=centers)
                    for centers in (True, False)]
        return [raw.ResizeNearestNeighborGrad(grads=g, size=[3, 4], half_pixel_centers=centers)
                for centers in (True, False)]

    return fn


def _space(x: Any, y: Any) -> list[Any]:
    return [raw.SpaceToBatchND(input=x, block_shape=[2, 2], paddings=[[0, 0], [1, 1]]),
            raw.SpaceToBatchND(input=y, block_shape=[1, 2], paddings=[[0, 0], [0, 0]])]


def _batch(x: Any, y: Any) -> list[Any]:
    return [raw.BatchToSpaceND(input=x, block_shape=[2, 2], crops=[[0, 0], [1, 1]]),
            raw.BatchToSpaceND(input=y, block_shape=[1, 2], crops=[[0, 0], [0, 0]])]


def _bitcasts(x: Any) -> list[Any]:
    # The other 2-byte float, and to int32 over a last dim of 2 and back; each with a
    # neighbour to cluster with.
    other = tf.float16 if x.dtype == tf.bfloat16 else tf.bfloat16
    wide = raw.Bitcast(input=tf.reshape(-x, (-1, 2)), type=tf.int32) + 1
    return [-raw.Bitcast(input=-x, type=other), wide,
            -raw.Bitcast(input=wide, type=x.dtype)]


CASES = [
    Case("ReadVariableOp", lambda *xs: [v.read_value() for v in _held(*xs)],
         arrays([[(3, 4)], [(0, 2)]], "x")),
    Case("AssignVariableOp", lambda x: _held(x)[0].read_value(), arrays([[(1,)]], "x")),
    *[Case(op, over_shapes(_assigns, 2), arrays([[(3, 4), (3, 4)], [(0,), (0,)], [(), ()]], "xx"))
      for op in ("AssignAddVariableOp", "AssignSubVariableOp")],
    Case("ResourceGather", _gather, arrays([[(5, 3)]], "x")),
    # TF refuses a zero divisor.
    *[Case(op, _scatter(op), arrays([[(5, 4), (3, 4)]], "xp" if op.endswith("Div") else "xx"))
      for op in ("ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
                 "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
                 "ResourceScatterUpdate")],
    *[_apply_case(op) for op in _SLOTS],
    *[Case(op, _loop(op), arrays([[(3, 4)]], "x")) for op in ("While", "StatelessWhile")],
    # A branch computes exp(x) - 1.
    *[Case(op, _if(op), arrays([[(2, 3), (1,)]], "xf"), compare_as="Exp")
      for op in ("If", "StatelessIf")],
    *[Case(op, _case(op), arrays([[(2, 0, 3)], [(4,)]], "x"), compare_as="Exp")
      for op in ("Case", "StatelessCase")],
    *[Case(op, _lists, arrays([[(4, 3)]], "x")) for op in _LIST_OPS],
    Case("ResizeBilinear", _resize("ResizeBilinear", half_pixel_centers=True), _IMAGES),
    Case("ResizeBicubic", _resize("ResizeBicubic", half_pixel_centers=True), _IMAGES),
    Case("ResizeNearestNeighbor", _resize("ResizeNearestNeighbor", half_pixel_centers=True),
         _IMAGES),
    Case("ResizeBilinearGrad", _resize_grads("ResizeBilinearGrad"),
         arrays([[(2, 5, 7, 2), (2, 3, 4, 2)]], "xx")),
    Case("ResizeNearestNeighborGrad", _resize_grads("ResizeNearestNeighborGrad"),
         arrays([[(2, 5, 7, 2)]], "x")),
    Case("SpaceToBatchND", _space, arrays([[(2, 4, 2, 3), (1, 2, 0)]], "xx")),
    Case("BatchToSpaceND", _batch, arrays([[(8, 2, 3, 1), (2, 1, 0)]], "xx")),
    Case("SpaceToDepth", over_shapes(lambda x: raw.SpaceToDepth(input=x, block_size=2), 1),
         arrays([[(2, 4, 6, 3)], [(1, 2, 2, 0)]], "x")),
    Case("DepthToSpace", over_shapes(lambda x: raw.DepthToSpace(input=x, block_size=2), 1),
         arrays([[(2, 2, 3, 8)], [(0, 1, 1, 4)]], "x")),
    Case("Bitcast", _bitcasts, arrays([[(3, 4)]], "x")),
]
