"""Lowering rules for TF's functional control flow and TensorLists: HLO `while`/`conditional`.

Registered into `registry.OP_RULES` on import. `While`/`StatelessWhile` become one HLO
`while`, `If`/`StatelessIf` and `Case`/`StatelessCase` one `conditional`, when every op of
the functions they call lowers too: the rule's check turns each FunctionDef into a graph
(`body_graphs.function_graph`, with the op's own input shapes) and lowers it
op by op through the same registry (`lower_function`), recursively for nested loops;
any op that does not lower keeps the control-flow op in TF, where
`tfxla_lite/control_flow.py` compiles its bodies one by one. A loop's state is
a tuple of fixed shapes: a body that changes a loop variable's shape is refused.
`maximum_iterations` needs nothing here: while_v2 builds it into the condition.

TensorLists are lowered as TF's XLA bridge lowers them (tf2xla's tensor_list_ops.cc):
an HLO tuple (buffer T[N, element dims...], s32 length) of a static element shape and
capacity N, known at compile time from the op that makes the list (`list_shape`):
`TensorListReserve`'s size, `EmptyTensorList`'s `max_num_elements` (while_v2's
accumulators for a gradient loop use the forward loop's trip count), the tensor of
`TensorListFromTensor`. A list of unknown element shape takes it from a later read of the
list (`TensorListStack`, `GetItem`). A variant value never crosses a cluster's boundary
(`clustering/cluster.py` keeps such producers out of their consumers' clusters).

A backend that lists `while` or `conditional` among its unsupported opcodes keeps every
control-flow op in TF (`backend_refusal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.control_flow_ops import CASE_OPS, FUNCTIONAL_OPS, IF_OPS, WHILE_OPS
from tfxla_lite.clustering.registry import (
    ALL,
    OP_RULES,
    LoweringContext,
    LoweringError,
    constant_value,
    element_type,
    register,
    static_dims,
    tensor_shape,
)
from tfxla_lite.hlo import Computation, HloModule, Instruction, Shape, numpy_dtype

if TYPE_CHECKING:
    import tensorflow as tf

_DTYPES = ALL | {"variant"}
# A loop's or branch's arguments may be variable handles too (`_check_variables`).
_FUNCTIONAL_DTYPES = _DTYPES | {"resource"}
# Op types whose output 0 is the TensorList of their input 0, of the same shape.
_SAME_LIST = frozenset({"TensorListSetItem", "TensorListPushBack", "TensorListPopBack",
                        "Identity"})
_LENGTH = Shape("s32", ())

# Per function graph built here: its variant placeholders' list shapes, by op name.
_PARAMETER_LISTS: weakref.WeakKeyDictionary[Any, dict[str, Shape]] = (
    weakref.WeakKeyDictionary())
# Per graph: the refusal (or None) of each control-flow op's bodies, by op name.
_REFUSALS: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def backend_refusal() -> str | None:
    """Why the CPU backend cannot run HLO control flow yet, or None when it can (or when
    `lowering_only` says the HLO is only evaluated)."""
    from tfxla_lite.codegen.cpu import UNSUPPORTED_OPCODES

    if _LOWERING_ONLY:
        return None
    for opcode in ("while", "conditional"):
        if opcode in UNSUPPORTED_OPCODES:
            return f"the CPU backend does not compile HLO {opcode} yet"
    return None


_LOWERING_ONLY: list[bool] = []


@contextlib.contextmanager
def lowering_only() -> Iterator[None]:
    """Accept control flow whatever the backend compiles: for checks of the lowered HLO
    with the evaluator (tests), which runs `while` and `conditional`."""
    _LOWERING_ONLY.append(True)
    try:
        yield
    finally:
        _LOWERING_ONLY.pop()


# -- TensorList shapes ---------------------------------------------------------------------
def list_shape(tensor: tf.Tensor, _depth: int = 0) -> Shape | None:
    """The HLO tuple shape (buffer, length) of TensorList `tensor`, or None when its
    element shape, dtype or capacity is not known at compile time."""
    if tensor.dtype.base_dtype.name != "variant" or _depth > 64:
        return None
    op = tensor.op
    if (op.type in _SAME_LIST or op.type in ("ZerosLike", "AddN")) and tensor.value_index == 0:
        return list_shape(op.inputs[0], _depth + 1)
    if op.type in WHILE_OPS:
        return list_shape(op.inputs[tensor.value_index], _depth + 1)
    if op.type == "Placeholder":
        return _PARAMETER_LISTS.get(op.graph, {}).get(op.name)
    try:
        etype = element_type(op.get_attr("element_dtype"))
    except (ValueError, LoweringError):
        return None
    if op.type == "TensorListFromTensor":
        dims = static_dims(op.inputs[0])
        return None if not dims else _list(etype, dims[0], dims[1:])
    if op.type not in ("TensorListReserve", "EmptyTensorList"):
        return None
    size = _list_size(op.inputs[1])
    if size is None:
        return None
    if op.type == "EmptyTensorList" and size > 1 and _invariant_accumulator(tensor):
        size = 1
    element = _element_dims(op.inputs[0])
    if element is None:
        element = _element_dims_from_reads(tensor)
    if element is None:
        element = _element_dims_from_writes(tensor)
    return None if element is None else _list(etype, size, element)


def _list_size(size: tf.Tensor) -> int | None:
    """A list's capacity: a constant, or the length of a full list (a gradient reserves
    one like the list it flows back through)."""
    value = constant_value(size)
    if value is None:
        value = _popped(size)
    if value is not None:
        return int(value) if value.size == 1 and int(value) >= 0 else None
    if size.op.type == "TensorListLength" and _full(size.op.inputs[0]):
        shape = list_shape(size.op.inputs[0])
        return None if shape is None else shape.tuple_shapes[0].dims[0]  # type: ignore[index]
    return None


def _list(etype: str, size: int, element: Sequence[int]) -> Shape:
    return Shape.tuple_of([Shape(etype, (size, *element)), _LENGTH])


def _element_dims(shape: tf.Tensor) -> tuple[int, ...] | None:
    """The element dims an `element_shape` input gives, when fully known."""
    if shape.op.type == "TensorListElementShape":
        source = list_shape(shape.op.inputs[0])
        if source is None:
            return _handle_element_dims(shape.op.inputs[0])
        return source.tuple_shapes[0].dims[1:]  # type: ignore[index]
    value = constant_value(shape)
    if value is None:
        value = _popped(shape)
    if value is None or value.ndim != 1 or (value < 0).any():
        return None  # -1 (scalar): unknown rank; a -1 inside: an unknown dimension
    return tuple(int(d) for d in value)


def _element_dims_from_reads(tensor: tf.Tensor, _depth: int = 0) -> tuple[int, ...] | None:
    """The element dims of list `tensor` as a later read sees them (tf.map_fn's result
    list is reserved without a shape and stacked after its loop)."""
    if _depth > 16:
        return None
    if not _depth and not tensor.consumers():
        return ()  # nothing reads it (Keras makes one so): any shape will do
    for consumer in tensor.consumers():
        if consumer.type == "TensorListStack":
            dims = static_dims(consumer.outputs[0])
            if dims:
                return dims[1:]
            found = _element_dims(consumer.inputs[1])
        elif consumer.type in ("TensorListGetItem", "TensorListPopBack"):
            found = static_dims(consumer.outputs[0 if consumer.type.endswith("Item") else 1])
        elif consumer.type in ("TensorListSetItem", "TensorListPushBack", "Identity"):
            found = _element_dims_from_reads(consumer.outputs[0], _depth + 1)
        elif consumer.type in WHILE_OPS:
            index = [t.name for t in consumer.inputs].index(tensor.name)
            found = _element_dims_from_reads(consumer.outputs[index], _depth + 1)
        else:
            found = None
        if found is not None:
            return found
    return None


def _handle_element_dims(tensor: tf.Tensor) -> tuple[int, ...] | None:
    """The static element dims TensorList `tensor`'s handle data gives, else None."""
    from tensorflow.python.ops import handle_data_util

    try:
        data = handle_data_util.get_resource_handle_data(tensor)
    except Exception:  # noqa: BLE001 - an eager or foreign tensor: no handle data
        return None
    return _static_dims_of(data)


def _static_dims_of(data: Any) -> tuple[int, ...] | None:
    """The static dims of a handle's one (shape, type), else None."""
    if not data.is_set or len(data.shape_and_type) != 1:
        return None
    shape = data.shape_and_type[0].shape
    if shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        return None
    return tuple(int(d.size) for d in shape.dim)


def _element_dims_from_writes(tensor: tf.Tensor, _depth: int = 0) -> tuple[int, ...] | None:
    """The element dims of list `tensor` as what is written to it has them, in a loop's
    body too (a Keras RNN's outputs and while_v2's accumulators are made with an unknown
    batch dimension, which the items written have once the input shapes are known)."""
    if _depth > 16:
        return None
    for consumer in tensor.consumers():
        found = None
        if consumer.type in ("TensorListSetItem", "TensorListPushBack"):
            found = static_dims(consumer.inputs[-1])
            if found is None:
                found = _element_dims_from_writes(consumer.outputs[0], _depth + 1)
        elif consumer.type == "Identity":
            found = _element_dims_from_writes(consumer.outputs[0], _depth + 1)
        elif consumer.type in WHILE_OPS and (id(consumer.graph), consumer.name) not in _BUILDING:
            try:
                body = _function_graphs(consumer)[1]
            except Exception:  # noqa: BLE001 - a body TF cannot rebuild: no such knowledge
                continue
            index = [t.name for t in consumer.inputs].index(tensor.name)
            found = _element_dims_from_writes(body.inputs[index], _depth + 1)
        if found is not None:
            return found
    return None


def _check_list(op: tf.Operation) -> str | None:
    for tensor in [*op.inputs[:1], *op.outputs[:1]]:
        if tensor.dtype.base_dtype.name == "variant" and list_shape(tensor) is None:
            if waits_for_shapes(op):
                return None  # dynamic marking: known once the input shapes are
            return (f"TensorList {tensor.name}: element shape or size not known at compile "
                    f"time")
    if op.type == "TensorListSetItem" and op.get_attr("resize_if_index_out_of_bounds"):
        return "TensorListSetItem that resizes its list"
    return None


_LIST_MAKERS = frozenset({"TensorListReserve", "EmptyTensorList"})


def _partly_known(tensor: tf.Tensor) -> bool:
    """A tensor of known rank with an unknown dimension (a Keras batch)."""
    shape = tensor.shape
    return (tensor.dtype.base_dtype.name not in ("variant", "resource")
            and shape.rank is not None and not shape.is_fully_defined())


def waits_for_shapes(op: tf.Operation, _depth: int = 0) -> bool:
    """Whether `op` (a TensorList op or a loop) reads or writes a tensor of known rank and
    an unknown dimension, or makes a list that such an op writes: dynamic marking then
    defers its check to each concrete input shape, when the element shapes are known
    (static marking refuses those tensors before any check)."""
    if _depth > 16:
        return False
    if op.graph in _WAITING or any(_partly_known(t) for t in op.inputs):
        return True
    if op.type not in WHILE_OPS and any(_partly_known(t) for t in op.outputs):
        return True
    if op.type not in _LIST_MAKERS and not (op.type in _SAME_LIST and _depth):
        return False
    return any(waits_for_shapes(c, _depth + 1) for c in op.outputs[0].consumers()
               if c.type in WHILE_OPS or c.type in _SAME_LIST)


def _element_output_dims(op: tf.Operation, index: int) -> tuple[int, ...] | None:
    shape = list_shape(op.inputs[0])
    if shape is None:
        return None
    buffer = shape.tuple_shapes[0]  # type: ignore[index]
    if op.type == "TensorListStack":
        return buffer.dims
    if op.type == "TensorListElementShape":
        return (len(buffer.dims) - 1,)
    if op.type == "TensorListLength":
        return ()
    return buffer.dims[1:] if index == (1 if op.type == "TensorListPopBack" else 0) else ()


# -- TensorList rules -----------------------------------------------------------------------
def _parts(ctx: LoweringContext, handle: Instruction) -> tuple[Instruction, Instruction]:
    return (ctx.emit("get-tuple-element", [handle], index=0),
            ctx.emit("get-tuple-element", [handle], index=1))


def _made(ctx: LoweringContext, op: tf.Operation, length: Any,
          buffer: Instruction | None = None) -> Instruction:
    shape = list_shape(op.outputs[0])
    if shape is None:
        raise LoweringError(f"TensorList {op.outputs[0].name}: shape not known")
    buffer_shape = shape.tuple_shapes[0]  # type: ignore[index]
    if buffer is None:
        buffer = ctx.full(0, buffer_shape)
    count = ctx.constant(length, "s32") if isinstance(length, int) else length
    return ctx.emit("tuple", [buffer, count])


def _starts(ctx: LoweringContext, index: Instruction, rank: int) -> list[Instruction]:
    zero = ctx.constant(0, index.shape.element_type)
    return [index] + [zero] * (rank - 1)


def _read(ctx: LoweringContext, buffer: Instruction, index: Instruction) -> Instruction:
    dims = buffer.shape.dims
    item = ctx.emit("dynamic-slice", [buffer, *_starts(ctx, index, len(dims))],
                    dynamic_slice_sizes=(1, *dims[1:]))
    return ctx.reshape(item, dims[1:])


def _write(ctx: LoweringContext, buffer: Instruction, index: Instruction, item: Instruction
           ) -> Instruction:
    dims = buffer.shape.dims
    if item.shape.dims != dims[1:] or item.shape.element_type != buffer.shape.element_type:
        raise LoweringError(f"{ctx.op.name if ctx.op else 'TensorList'}: item {item.shape} "
                            f"does not fit a list of {buffer.shape}")
    update = ctx.reshape(item, (1, *dims[1:]))
    return ctx.emit("dynamic-update-slice", [buffer, update, *_starts(ctx, index, len(dims))])


_LIST = {"dtypes": _DTYPES, "check": _check_list,
         "note": "(buffer, length) of a static element shape and capacity, inside one cluster"}


@register("TensorListReserve", unused_inputs=(0, 1), **_LIST)
def _reserve(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    shape = list_shape(op.outputs[0])  # its shape and size are known (_check_list)
    return [_made(ctx, op, shape.tuple_shapes[0].dims[0] if shape else 0)]  # type: ignore[index]


@register("EmptyTensorList", static_inputs=(0, 1), **_LIST)
def _empty(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    return [_made(ctx, op, 0)]


@register("TensorListFromTensor", unused_inputs=(1,), **_LIST)
def _from_tensor(ctx: LoweringContext, op: tf.Operation, operands: list[Any]
                 ) -> list[Instruction]:
    tensor = operands[0]
    return [_made(ctx, op, tensor.shape.dims[0], tensor)]


@register("TensorListSetItem", **_LIST)
def _set_item(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    handle, index, item = operands
    buffer, length = _parts(ctx, handle)
    return [ctx.emit("tuple", [_write(ctx, buffer, index, item), length])]


@register("TensorListGetItem", unused_inputs=(2,), output_dims=_element_output_dims, **_LIST)
def _get_item(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    buffer, _ = _parts(ctx, operands[0])
    return [_read(ctx, buffer, operands[1])]


@register("TensorListPushBack", **_LIST)
def _push_back(ctx: LoweringContext, op: tf.Operation, operands: list[Any]
               ) -> list[Instruction]:
    buffer, length = _parts(ctx, operands[0])
    grown = ctx.emit("add", [length, ctx.constant(1, "s32")])
    return [ctx.emit("tuple", [_write(ctx, buffer, length, operands[1]), grown])]


@register("TensorListPopBack", unused_inputs=(1,), output_dims=_element_output_dims, **_LIST)
def _pop_back(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    buffer, length = _parts(ctx, operands[0])
    last = ctx.emit("subtract", [length, ctx.constant(1, "s32")])
    return [ctx.emit("tuple", [buffer, last]), _read(ctx, buffer, last)]


@register("TensorListStack", unused_inputs=(1,), output_dims=_element_output_dims, **_LIST)
def _stack(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    # TF stacks the list's `length` elements; a static result shape means all N of them.
    buffer, _ = _parts(ctx, operands[0])
    return [buffer]


@register("TensorListElementShape", output_dims=_element_output_dims, **_LIST)
def _element_shape(ctx: LoweringContext, op: tf.Operation, operands: list[Any]
                   ) -> list[Instruction]:
    buffer, _ = _parts(ctx, operands[0])
    etype = element_type(op.get_attr("shape_type"))
    return [ctx.constant(list(buffer.shape.dims[1:]), etype)]


@register("TensorListLength", output_dims=_element_output_dims, **_LIST)
def _length(ctx: LoweringContext, op: tf.Operation, operands: list[Any]) -> list[Instruction]:
    return [_parts(ctx, operands[0])[1]]


def _full(tensor: tf.Tensor, _depth: int = 0) -> bool:
    """Whether TensorList `tensor` holds as many elements as its capacity: made so
    (TensorListFromTensor, TensorListReserve), perhaps passed unchanged through loops."""
    op = tensor.op
    if _depth > 32:
        return False
    if op.type in ("TensorListFromTensor", "TensorListReserve"):
        return True
    if op.type == "Placeholder":
        return op.name in _FULL_PARAMETERS.get(op.graph, set())
    if op.type in ("Identity", "TensorListSetItem") or (
            op.type in WHILE_OPS and _loop_keeps(op, tensor.value_index)):
        return _full(op.inputs[tensor.value_index if op.type in WHILE_OPS else 0],
                     _depth + 1)
    return False


def _loop_keeps(op: tf.Operation, index: int) -> bool:
    from tfxla_lite.clustering import body_graphs

    (call, *_) = body_graphs.op_calls(op, _library(op.graph))
    return bool(call.invariant) and call.invariant[index]


def zeros_list_refusal(op: tf.Operation) -> str | None:
    """Why ZerosLike of a TensorList cannot lower: its list's length is not known to be
    its capacity (the zeros list has the list's length), or its shape is not known."""
    if list_shape(op.inputs[0]) is None:
        if waits_for_shapes(op.inputs[0].op):
            return None  # dynamic marking: known once the input shapes are
        return f"TensorList {op.inputs[0].name}: element shape or size not known"
    if not _full(op.inputs[0]):
        return f"TensorList {op.inputs[0].name} may hold fewer elements than its capacity"
    return None


def zeros_list(ctx: LoweringContext, op: tf.Operation) -> Instruction:
    """ZerosLike of a full TensorList (`zeros_list_refusal`): zeros, as many as it holds."""
    shape = list_shape(op.inputs[0])
    if shape is None or zeros_list_refusal(op) is not None:
        raise LoweringError(f"ZerosLike {op.name}: {zeros_list_refusal(op)}")
    buffer = shape.tuple_shapes[0]  # type: ignore[index]
    return ctx.emit("tuple", [ctx.full(0, buffer), ctx.constant(buffer.dims[0], "s32")])


def add_lists(ctx: LoweringContext, lists: Sequence[Instruction]) -> Instruction:
    """AddN of TensorLists (a gradient's sum for a list used twice): element by element,
    of the first list's length (TF requires them equal)."""
    total, length = _parts(ctx, lists[0])
    for handle in lists[1:]:
        total = ctx.emit("add", [total, _parts(ctx, handle)[0]])
    return ctx.emit("tuple", [total, length])


def variable_dims(handle: tf.Tensor) -> tuple[int, ...] | None:
    from tensorflow.python.ops import handle_data_util

    data = handle_data_util.get_resource_handle_data(handle)
    while not data.is_set and handle.op.type in (*WHILE_OPS, "Identity"):
        # A loop returns its handles unchanged (`_check_variables`); an imported While
        # keeps no handle data on its outputs.
        handle = handle.op.inputs[handle.value_index if handle.op.type in WHILE_OPS else 0]
        data = handle_data_util.get_resource_handle_data(handle)
    return _static_dims_of(data)


def _check_variable_shape(op: tf.Operation) -> str | None:
    if variable_dims(op.inputs[0]) is None:
        return f"variable {op.inputs[0].name}: shape not known statically"
    return None


def _variable_shape_dims(op: tf.Operation, index: int) -> tuple[int, ...] | None:
    dims = variable_dims(op.inputs[0])
    return None if dims is None else (len(dims),)


@register("VariableShape", dtypes=frozenset({"int32", "int64", "resource"}),
          unused_inputs=(0,), check=_check_variable_shape, output_dims=_variable_shape_dims,
          note="a variable of static shape (a loop gradient's zeros for it)")
def _variable_shape(ctx: LoweringContext, op: tf.Operation, operands: list[Any]
                    ) -> list[Instruction]:
    dims = variable_dims(op.inputs[0])
    if dims is None:
        raise LoweringError(f"variable {op.inputs[0].name}: shape not known statically")
    return [ctx.constant(list(dims), element_type(op.outputs[0].dtype))]


# -- function bodies -------------------------------------------------------------------------
def _library(graph: tf.Graph) -> dict[str, Any]:
    """The FunctionDefs `graph` knows, by name (as the rewrite exports them)."""
    known = _LIBRARIES.get(graph)
    if known is None:
        known = {f.signature.name: f
                 for f in graph.as_graph_def(add_shapes=True).library.function}
        _LIBRARIES[graph] = known
    return known


_LIBRARIES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _body_graphs(op: tf.Operation, arguments: Sequence[Shape]) -> list[tf.Graph]:
    """The graphs of `op`'s functions (cond and body; the branches), with placeholders of
    the op's input shapes and TensorList arguments of the given list shapes."""
    graphs = _function_graphs(op)
    start = 0 if op.type in WHILE_OPS else 1
    invariant = _invariant_arguments(op)
    for graph in graphs:
        _PARAMETER_LISTS[graph] = {
            t.op.name: shape for t, shape in zip(graph.inputs, arguments) if shape.is_tuple}
        _FULL_PARAMETERS[graph] = {
            t.op.name for k, (t, source) in enumerate(zip(graph.inputs, op.inputs[start:]))
            if source.dtype.base_dtype.name == "variant" and _full(source) and invariant[k]}
        _POPPED[graph] = {t.op.name: value for t, source in zip(graph.inputs, op.inputs[start:])
                          if (value := _pushed_value(source)) is not None}
    return graphs


def _function_graphs(op: tf.Operation) -> list[tf.Graph]:
    """The graphs of `op`'s functions with placeholders of the op's input shapes, built
    once per op (the checks, list shapes and the lowering share them)."""
    from tfxla_lite.clustering import body_graphs
    from tfxla_lite.clustering.inline import inline_function_calls

    known = _BODY_GRAPHS.setdefault(op.graph, {})
    if op.name not in known:
        if (id(op.graph), op.name) in _BUILDING:
            # Asked again while its own lists' shapes are being found: what the body
            # pushes is not known yet. Building it again here would recurse through every
            # loop that feeds it, once per list argument (and clear the mark too early).
            raise LoweringError(f"the functions of {op.name} are being built")
        library = _library(op.graph)
        graphs = []
        _BUILDING.add((id(op.graph), op.name))
        try:
            lists = _known_lists(op)
            for call in body_graphs.op_calls(op, library, exact_shapes=True):
                if call.function not in library:
                    raise LoweringError(f"function {call.function} of {op.name} not found")
                graph = body_graphs.function_graph(library, dataclasses.replace(call, **lists))
                graphs.append(inline_function_calls(graph) or graph)
        finally:
            _BUILDING.discard((id(op.graph), op.name))
        known[op.name] = graphs
    return known[op.name]


# The control-flow ops whose function graphs are being built (a list's shape found from
# what a loop writes to it must not ask for the loop being built).
_BUILDING: set[tuple[int, str]] = set()


def _known_lists(op: tf.Operation) -> dict[str, tuple[Any, ...]]:
    """What is known of `op`'s TensorList arguments beyond their handle data, as
    `BodyCall` fields: static element shapes, lists of one known value (popped as a
    constant), lists of shape-determined values (a forward loop's accumulated shapes,
    which dynamic marking value-keys)."""
    from tensorflow.python.framework import dtypes

    from tfxla_lite.clustering.mark import shape_determined

    start = 0 if op.type in WHILE_OPS else 1
    elements: list[Any] = []
    popped: list[Any] = []
    shape_list: list[bool] = []
    for source in op.inputs[start:]:
        element = value = None
        determined = False
        if source.dtype.base_dtype.name == "variant":
            shape = list_shape(source)
            if shape is not None:
                buffer = shape.tuple_shapes[0]  # type: ignore[index]
                elements_dtype = dtypes.as_dtype(numpy_dtype(buffer.element_type))
                element = (elements_dtype, tuple(buffer.dims[1:]))
            value = _pushed_value(source)
            item = _pushed_source_item(source)
            determined = item is not None and shape_determined(item)
        elements.append(element)
        popped.append(value)
        shape_list.append(determined)
    fields: dict[str, tuple[Any, ...]] = {}
    if any(e is not None for e in elements):
        fields["element_shapes"] = tuple(elements)
    if any(v is not None for v in popped):
        fields["popped"] = tuple(popped)
    if any(shape_list):
        fields["shape_list"] = tuple(shape_list)
    return fields


def _pushed_source_item(source: tf.Tensor) -> tf.Tensor | None:
    """What the loop that outputs TensorList `source` pushes onto it, or None."""
    op, index = source.op, source.value_index
    while op.type == "Identity" and op.inputs:
        op, index = op.inputs[0].op, op.inputs[0].value_index
    return _pushed_item(op, index) if op.type in WHILE_OPS else None


def _invariant_arguments(op: tf.Operation) -> list[bool]:
    """Per argument of `op`'s functions: the same in every call (a loop variable its
    body returns unchanged; every branch argument)."""
    from tfxla_lite.clustering import body_graphs

    start = 0 if op.type in WHILE_OPS else 1
    if op.type not in WHILE_OPS:
        return [True] * (len(op.inputs) - start)
    (call, *_) = body_graphs.op_calls(op, _library(op.graph))
    return list(call.invariant)


# Per graph: the graphs of its control-flow ops' functions, by op name.
_BODY_GRAPHS: weakref.WeakKeyDictionary[Any, dict[str, list[Any]]] = (
    weakref.WeakKeyDictionary())
# Per function graph: its TensorList placeholders whose lists are full (`_full`).
_FULL_PARAMETERS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
# Per function graph: its TensorList placeholders whose every element is one known value:
# a forward loop's accumulators of a list's element shape or length, which its gradient
# loop pops to reserve a list like it (what it pops is then known at compile time).
_POPPED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _pushed_item(op: tf.Operation, index: int) -> tf.Tensor | None:
    """What the body of While `op` pushes onto its loop variable `index` (a TensorList
    it returns as `TensorListPushBack(argument, item)`), or None."""
    try:
        body = _function_graphs(op)[1]
    except Exception:  # noqa: BLE001 - a body TF cannot rebuild: no such knowledge
        return None
    pushed = body.outputs[index].op
    while pushed.type == "Identity" and pushed.inputs:
        pushed = pushed.inputs[0].op
    if pushed.type != "TensorListPushBack" or pushed.inputs[0].op.name != \
            body.inputs[index].op.name:
        return None
    return pushed.inputs[1]


def _invariant_accumulator(tensor: tf.Tensor) -> bool:
    """Whether `tensor` (an EmptyTensorList) only accumulates one loop-invariant value:
    while_v2 pushes a variable's value each iteration when the forward body reads it
    (the LSTM's weights), and the gradient loop pops it back. All its elements being
    equal, a buffer of one element holds the list (pushes and pops clamp to it)."""
    consumers = tensor.consumers()
    if len(consumers) != 1 or consumers[0].type not in WHILE_OPS:
        return False
    loop = consumers[0]
    index = [t.name for t in loop.inputs].index(tensor.name)
    item = _pushed_item(loop, index)
    if item is None or not all(reader.type in WHILE_OPS
                               for reader in loop.outputs[index].consumers()):
        return False
    invariant = _invariant_arguments(loop)
    body = _function_graphs(loop)[1]
    parameters = {t.op.name: k for k, t in enumerate(body.inputs)}
    source = item.op
    while source.type == "Identity" and source.inputs:
        source = source.inputs[0].op
    if source.type == "ReadVariableOp":
        source = source.inputs[0].op
    if source.type == "Placeholder" and source.name in parameters:
        return invariant[parameters[source.name]]
    return False


def _pushed_value(source: tf.Tensor) -> Any:
    """The one value every element of TensorList `source` has, when it is a While's
    output that the loop's body pushes a compile-time value onto, else None."""
    import numpy as np

    op, index = source.op, source.value_index
    while op.type == "Identity" and op.inputs:
        op, index = op.inputs[0].op, op.inputs[0].value_index
    if op.type not in WHILE_OPS or source.dtype.base_dtype.name != "variant":
        return None
    value = _pushed_item(op, index)
    if value is None:
        return None
    if value.op.type == "TensorListElementShape":
        dims = _element_dims(value)
        return None if dims is None else np.array(dims, value.dtype.as_numpy_dtype)
    if value.op.type == "TensorListLength":
        size = _list_size(value)
        return None if size is None else np.array(size, value.dtype.as_numpy_dtype)
    return constant_value(value)


def _popped(tensor: tf.Tensor) -> Any:
    """The compile-time value of a TensorListPopBack's element, when its list's every
    element is one known value (`_POPPED`)."""
    op = tensor.op
    if op.type != "TensorListPopBack" or tensor.value_index != 1:
        return None
    source = op.inputs[0].op
    while source.type in ("TensorListPopBack", "Identity") and source.inputs:
        source = source.inputs[0].op
    return _POPPED.get(source.graph, {}).get(source.name)


def _needed_ops(graph: tf.Graph, outputs: Iterable[tf.Tensor]) -> list[tf.Operation]:
    """The ops `outputs` depend on (data edges), in topological order."""
    order: list[tf.Operation] = []
    seen: set[str] = set()
    stack: list[tuple[tf.Operation, bool]] = [(t.op, False) for t in outputs]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            continue
        if op.name in seen:
            continue
        seen.add(op.name)
        stack.append((op, True))
        stack.extend((t.op, False) for t in op.inputs if t.op.name not in seen)
    return order


def body_refusal(graph: tf.Graph, dynamic: bool = False) -> str | None:
    """Why a function graph's ops cannot all lower, or None: every op its outputs need
    must be compilable, and no op it runs for its effects alone may be stateful.
    `dynamic`: marked as dynamic marking marks (known ranks; a loop with an unknown batch
    dimension, checked again when compiled for each input shape)."""
    from tfxla_lite.clustering.mark import MarkOptions, why_not_compilable

    needed = _needed_ops(graph, graph.outputs)
    names = {op.name for op in needed}
    inputs = {t.op.name for t in graph.inputs}
    for op in graph.get_operations():
        if op.name in inputs or op.type in ("NoOp", "Const") or _passes_handle(op):
            continue
        if op.name not in names:
            if op.op_def.is_stateful:
                return f"{op.type} {op.name} runs for its effect"
            continue
        reason = why_not_compilable(op, MarkOptions(dynamic_shapes=dynamic))
        if reason is not None:
            return f"{op.type} {op.name}: {reason}"
    return None


def _passes_handle(op: tf.Operation) -> bool:
    """An Identity of a variable handle: a loop returns its variables so
    (`_check_variables` allows nothing else of them)."""
    return op.type == "Identity" and op.outputs[0].dtype.base_dtype.name == "resource"


def lower_function(module: HloModule, graph: tf.Graph, arguments: Sequence[Shape],
                   name: str, predicate: bool = False) -> Computation:
    """`graph` (a function's graph) as a computation of one tuple parameter of
    `arguments`; its root is the tuple of the graph's outputs, or, with `predicate`, its
    one output, a scalar pred (a While's condition)."""
    from tfxla_lite.clustering.lower import lower_ops

    computation = Computation(name)
    parameter = computation.add_parameter(0, Shape.tuple_of(list(arguments)), "state")
    ctx = LoweringContext(module, computation)
    values: dict[str, Instruction] = {}
    for k, tensor in enumerate(graph.inputs):
        values[tensor.name] = computation.create("get-tuple-element", [parameter], index=k)
    inputs = {t.op.name for t in graph.inputs}
    operations = [op for op in _needed_ops(graph, graph.outputs) if op.name not in inputs]
    outputs = lower_ops(ctx, operations, values, list(graph.outputs), name)
    if predicate:
        if len(outputs) != 1 or outputs[0].shape != Shape("pred", ()):
            raise LoweringError(f"{name}: a loop condition must give one scalar bool")
        computation.root = outputs[0]
    else:
        computation.root = computation.create("tuple", outputs)
    module.add_computation(computation)
    return computation


def _argument_shapes(op: tf.Operation, start: int) -> list[Shape]:
    """The HLO shapes of the op's function arguments: a TensorList's tuple, a variable's
    value (rules_variables.py passes a handle's value as the cluster's parameter)."""
    shapes = []
    for tensor in op.inputs[start:]:
        if tensor.dtype.base_dtype.name == "variant":
            shape = list_shape(tensor)
            if shape is None:
                raise LoweringError(f"TensorList {tensor.name}: shape not known")
        else:
            shape = tensor_shape(tensor)
        shapes.append(shape)
    return shapes


def _check_variables(op: tf.Operation, graphs: Sequence[tf.Graph]) -> None:
    """A variable handle a loop or branch is given must reach its functions unchanged
    and only be read there: its value is the computation's parameter, fixed for the
    whole loop, and a write inside would be lost."""
    from tfxla_lite.clustering import body_graphs

    start = 0 if op.type in WHILE_OPS else 1
    handles = [k for k, t in enumerate(op.inputs[start:]) if t.dtype.base_dtype.name
               == "resource"]
    if not handles:
        return
    if op.type in WHILE_OPS:
        (call, *_) = body_graphs.op_calls(op, _library(op.graph))
        if not all(call.invariant[k] for k in handles):
            raise LoweringError(f"{op.name} changes a variable handle it loops over")
    for graph in graphs:
        returned = {t.name for t in graph.outputs}
        for k in handles:
            for reader in graph.inputs[k].consumers():
                if reader.type != "ReadVariableOp" and reader.type not in FUNCTIONAL_OPS \
                        and not (reader.type == "Identity"
                                 and reader.outputs[0].name in returned):
                    raise LoweringError(f"{reader.type} {reader.name} uses variable "
                                        f"{op.inputs[start + k].name} inside {op.name}")


def _check_control_flow(op: tf.Operation) -> str | None:
    """Lower `op`'s functions into a scratch module: the reason one does not lower."""
    refusals = _REFUSALS.setdefault(op.graph, {})
    if op.name not in refusals:
        refusals[op.name] = _refusal(op)
    return refusals[op.name]


def _refusal(op: tf.Operation) -> str | None:
    backend = backend_refusal()
    if backend is not None:
        return backend
    if not _LOWERING_ONLY:
        from tfxla_lite.runtime.gpu_launch import placed_gpu

        if placed_gpu(op.device) is not None:  # TF runs it on a GPU: so would its cluster
            return "the GPU backend does not compile HLO while or conditional"
    if waits_for_shapes(op):
        return _dynamic_refusal(op)
    try:
        _lower_control_flow(LoweringContext(HloModule("check"), Computation("check")), op,
                            None)
    except LoweringError as error:
        return f"its functions do not lower: {error}"
    except Exception as error:  # noqa: BLE001 - a body TF cannot rebuild stays as it is
        return f"its functions do not lower: {type(error).__name__}: {error}"
    return None


def _dynamic_refusal(op: tf.Operation) -> str | None:
    """The check of a loop or branch with an unknown dimension (dynamic marking): its
    functions' ops compile once the input shapes are known, their TensorLists shaped then.
    The cluster that takes it lowers it whole for each concrete input signature
    (`tfxla_lite/dynamic.py`), as XLA compiles a loop per shape."""
    import tensorflow as tf

    if op.type in WHILE_OPS:
        # A shape invariant looser than its input's shape lets the state change shape.
        invariants = [tf.TensorShape(s) for s in op.get_attr("output_shapes")]
        if any(i.rank != t.shape.rank or (i.rank is not None and i.as_list() != t.shape.as_list())
               for t, i in zip(op.inputs, invariants)):
            return "the loop state may change shape (a shape invariant looser than its input)"
    try:
        graphs = _function_graphs(op)
        _check_variables(op, graphs)
    except LoweringError as error:
        return f"its functions do not lower: {error}"
    except Exception as error:  # noqa: BLE001 - a body TF cannot rebuild stays as it is
        return f"its functions do not lower: {type(error).__name__}: {error}"
    for graph in graphs:
        _WAITING.add(graph)
        reason = body_refusal(graph, dynamic=True)
        if reason is not None:
            return f"its functions do not lower: {reason}"
    return None


# Function graphs of loops and branches that dynamic marking checks: their TensorLists
# are shaped when the loop compiles for concrete input shapes.
_WAITING: weakref.WeakSet[Any] = weakref.WeakSet()


def _lower_control_flow(ctx: LoweringContext, op: tf.Operation,
                        operands: list[Instruction] | None) -> list[Instruction]:
    """The HLO of `op`; with `operands` None, only its computations (the check)."""
    start = 0 if op.type in WHILE_OPS else 1
    arguments = ([o.shape for o in operands[start:]] if operands is not None
                 else _argument_shapes(op, start))
    graphs = _body_graphs(op, arguments)
    _check_variables(op, graphs)
    for graph in graphs:
        reason = body_refusal(graph)
        if reason is not None:
            raise LoweringError(reason)
    module = ctx.module
    if op.type in WHILE_OPS:
        cond_graph, body_graph = graphs
        condition = lower_function(module, cond_graph, arguments, f"{_stem(op)}_cond", True)
        body = lower_function(module, body_graph, arguments, f"{_stem(op)}_body")
        state = body.root.shape  # type: ignore[union-attr]
        if state != Shape.tuple_of(list(arguments)):
            raise LoweringError(f"the loop state changes shape: {Shape.tuple_of(arguments)} "
                                f"-> {state}")
        if operands is None:
            return []
        loop = ctx.emit("while", [ctx.emit("tuple", operands)],
                        called_computations=[condition, body])
        return [ctx.emit("get-tuple-element", [loop], index=k) for k in range(len(operands))]
    branches = [lower_function(module, g, arguments, f"{_stem(op)}_branch{k}")
                for k, g in enumerate(graphs)]
    results = {b.root.shape for b in branches}  # type: ignore[union-attr]
    if len(results) != 1:
        raise LoweringError(f"{op.name}: branches give different shapes "
                            f"{sorted(map(str, results))}")
    selector = op.inputs[0]
    if static_dims(selector) != () or selector.dtype.base_dtype.name not in (
            "bool" if op.type in IF_OPS else "int32",):
        raise LoweringError(f"{op.name}: the branch selector must be a scalar "
                            f"{'bool' if op.type in IF_OPS else 'int32'}")
    if operands is None:
        return []
    state = ctx.emit("tuple", operands[1:])
    (shape,) = results
    chosen = ctx.emit("conditional", [operands[0], *[state] * len(branches)], shape=shape,
                      called_computations=branches)
    return [ctx.emit("get-tuple-element", [chosen], index=k) for k in range(len(op.outputs))]


def _stem(op: tf.Operation) -> str:
    """A computation name for `op`'s functions (HLO names take no slashes)."""
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in op.name)


def _control_flow_dims(op: tf.Operation, index: int) -> tuple[int, ...] | None:
    if op.type in WHILE_OPS:  # a loop variable keeps its shape
        return static_dims(op.inputs[index])
    return None


@register(*WHILE_OPS, *IF_OPS, *CASE_OPS, dtypes=_FUNCTIONAL_DTYPES, check=_check_control_flow,
          output_dims=_control_flow_dims,
          note="HLO while/conditional, when every op of its functions lowers and loop "
               "variables keep their shapes")
def _control_flow(ctx: LoweringContext, op: tf.Operation, operands: list[Any]
                  ) -> list[Instruction]:
    return _lower_control_flow(ctx, op, operands)


__all__ = ["OP_RULES", "backend_refusal", "body_refusal", "list_shape", "lower_function",
           "variable_dims"]
