"""Lowering rules of TF's resource-variable ops: reads, assigns, gathers, scatters and the
`ResourceApply*` optimizer updates.

Registered into `registry.OP_RULES` on import. A cluster takes each variable's handle
as an input (the launch op passes the variable's buffer); `LoweringContext.variables`
holds each variable's value so far, in the cluster's topological order, and each
variable's last written value (`written_variables`) is an extra output the launch op
stores back or the kernel wrote in place (docs/architecture.md, "Variables in
clusters"). Update formulas are TF's CPU kernels' (`training_ops.cc`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfxla_lite.clustering.registry import (
    ALL,
    FLOAT,
    NUMERIC,
    LoweringContext,
    LoweringError,
    element_type,
    register,
    static_dims,
    variable_spec,
)
from tfxla_lite.clustering.rules_indexing import gather, scatter
from tfxla_lite.hlo import Instruction

if TYPE_CHECKING:
    import tensorflow as tf

Operands = list[Any]
_RESOURCE = frozenset({"resource"})

# The ResourceApply* ops: which inputs are variables (the first is the one applied to).
APPLY_VARIABLES: dict[str, int] = {
    "ResourceApplyGradientDescent": 1, "ResourceApplyMomentum": 2,
    "ResourceApplyKerasMomentum": 2, "ResourceApplyAdam": 3, "ResourceApplyRMSProp": 3,
    "ResourceApplyAdagrad": 2, "ResourceApplyAdagradV2": 2,
}
_SCATTERS = {"ResourceScatterAdd": "add", "ResourceScatterSub": "subtract",
             "ResourceScatterMul": "multiply", "ResourceScatterDiv": "divide",
             "ResourceScatterMin": "minimum", "ResourceScatterMax": "maximum",
             "ResourceScatterUpdate": "assign"}
_ASSIGNS = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")
# Ops that write a variable, with how many of their leading inputs are written handles.
WRITES: dict[str, int] = {**{t: 1 for t in _ASSIGNS}, **{t: 1 for t in _SCATTERS},
                          **APPLY_VARIABLES}
VARIABLE_OPS = frozenset({"ReadVariableOp", "ResourceGather", *WRITES})


def written_variables(graph: tf.Graph, op_names: Sequence[str]) -> list[str]:
    """The resource handles (tensor names) the ops write, in order of first write: the
    executable's extra outputs, after the cluster's own."""
    written: list[str] = []
    for name in op_names:
        op = graph.get_operation_by_name(name)
        for handle in op.inputs[:WRITES.get(op.type, 0)]:
            if handle.name not in written:
                written.append(handle.name)
    return written


def _device_kind(device: str) -> str | None:
    """'CPU' for '/job:localhost/replica:0/task:0/device:CPU:0', None for ''."""
    for part in device.upper().split("/"):
        if part.startswith("DEVICE:"):
            part = part[len("DEVICE:"):]
        if part.startswith(("CPU:", "GPU:", "TPU:")):
            return part.split(":")[0]
    return None


def check_variables(op: tf.Operation, dtypes: frozenset[str]) -> str | None:
    """Why the variables of `op` cannot compile: unknown dtype or shape, a dtype outside
    `dtypes`, a variable on another device than the op's or off the CPU (the launch op
    binds CPU variables), or a handle made inside a function it cannot see through (a
    handle must come from outside every cluster: a captured variable or an argument)."""
    for handle in op.inputs:
        if handle.dtype.base_dtype.name != "resource":
            continue
        where = handle.op.device
        if _device_kind(where) not in (None, "CPU") or (where and op.device
                                                        and where != op.device):
            return f"variable {handle.name} is on device {where}"
        spec = variable_spec(handle)
        if spec is None:
            return f"variable {handle.name}: dtype or shape not known statically"
        if spec[0].name not in dtypes:
            return f"variable {handle.name} has dtype {spec[0].name}"
        if handle.op.type not in ("Placeholder", "VarHandleOp"):
            return f"variable handle {handle.name} comes from a {handle.op.type}"
    return None


def _value(ctx: LoweringContext, op: tf.Operation, operands: Operands, index: int
           ) -> Instruction:
    """The current value of the variable at input `index`."""
    return ctx.variables.get(op.inputs[index].name, operands[index])


def _store(ctx: LoweringContext, op: tf.Operation, index: int, value: Instruction) -> None:
    handle = op.inputs[index]
    spec = variable_spec(handle)
    assert spec is not None  # checked when marking
    if value.shape.dims != spec[1] or value.shape.element_type != element_type(spec[0]):
        raise LoweringError(f"{op.name} writes {value.shape} into variable {handle.name} of "
                            f"{spec[0].name}{list(spec[1])}")
    ctx.variables[handle.name] = value


def _check_read(op: tf.Operation) -> str | None:
    return check_variables(op, ALL)


@register("ReadVariableOp", dtypes=ALL | _RESOURCE, check=_check_read,
          note="a captured variable of static shape: reads its buffer without a copy")
def _lower_read(ctx: LoweringContext, op: tf.Operation, operands: Operands
                ) -> list[Instruction]:
    return [_value(ctx, op, operands, 0)]


def _check_assign(op: tf.Operation) -> str | None:
    reason = check_variables(op, ALL if op.type == "AssignVariableOp" else NUMERIC)
    if reason is None and static_dims(op.inputs[1]) != variable_spec(op.inputs[0])[1]:
        return "the value's shape is not the variable's"
    return reason


@register(*_ASSIGNS, dtypes=ALL | _RESOURCE, check=_check_assign,
          note="the variable's new value is an output of the launch, written in place when "
               "no other tensor holds the old buffer")
def _lower_assign(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
    value = operands[1]
    if op.type != "AssignVariableOp":
        old = _value(ctx, op, operands, 0)
        value = ctx.emit("add" if op.type == "AssignAddVariableOp" else "subtract",
                         [old, value])
    _store(ctx, op, 0, value)
    return []


def _check_gather(op: tf.Operation) -> str | None:
    reason = check_variables(op, ALL)
    if reason is None and (op.inputs[1].shape.rank is None
                           or not 0 <= op.get_attr("batch_dims") <= op.inputs[1].shape.rank):
        return "indices of unknown rank, or batch_dims out of range"
    return reason


@register("ResourceGather", dtypes=ALL | _RESOURCE, check=_check_gather,
          note="an index out of range is clamped, as GatherV2's")
def _lower_resource_gather(ctx: LoweringContext, op: tf.Operation, operands: Operands
                           ) -> list[Instruction]:
    batch_dims = int(op.get_attr("batch_dims"))
    return [gather(ctx, _value(ctx, op, operands, 0), operands[1], batch_dims, batch_dims)]


def _check_scatter(op: tf.Operation) -> str | None:
    dtypes = FLOAT if op.type == "ResourceScatterDiv" else (
        ALL if op.type == "ResourceScatterUpdate" else NUMERIC)
    reason = check_variables(op, dtypes)
    if reason is not None:
        return reason
    indices, updates = static_dims(op.inputs[1]), static_dims(op.inputs[2])
    spec = variable_spec(op.inputs[0])
    if indices is None or updates is None or not spec[1]:
        return "indices and updates need static shapes, the variable a rank of at least 1"
    if updates and updates != indices + spec[1][1:]:
        return f"updates of shape {list(updates)} for indices {list(indices)}"
    return None


@register(*_SCATTERS, dtypes=ALL | _RESOURCE, check=_check_scatter,
          note="an index out of range drops its update (TF's CPU kernel raises); of repeated "
               "indices of ResourceScatterUpdate the last update wins")
def _lower_resource_scatter(ctx: LoweringContext, op: tf.Operation, operands: Operands
                            ) -> list[Instruction]:
    old = _value(ctx, op, operands, 0)
    indices, updates = operands[1], operands[2]
    dims = indices.shape.dims + old.shape.dims[1:]
    updates = ctx.broadcast_to(updates, dims)  # a scalar update applies to every row
    _store(ctx, op, 0, scatter(ctx, old, indices, updates, _SCATTERS[op.type],
                               indices.shape.rank, 1))
    return []


# -- ResourceApply*: TF's training_ops.cc formulas -------------------------------------------
def _check_apply(op: tf.Operation) -> str | None:
    reason = check_variables(op, FLOAT)
    if reason is not None:
        return reason
    dims = variable_spec(op.inputs[0])[1]
    for handle in op.inputs[1:APPLY_VARIABLES[op.type]]:
        if variable_spec(handle)[1] != dims:
            return f"slot variable {handle.name} has another shape than {op.inputs[0].name}"
    for t in op.inputs[APPLY_VARIABLES[op.type]:]:
        if static_dims(t) not in ((), dims):
            return f"input {t.name} is neither a scalar nor of the variable's shape"
    if op.type == "ResourceApplyAdagrad" and not op.get_attr("update_slots"):
        return "update_slots=False"
    return None


class _Apply:
    """Element-wise arithmetic on the values of one ResourceApply* op, scalars broadcast
    to the variable's shape."""

    def __init__(self, ctx: LoweringContext, op: tf.Operation, operands: Operands) -> None:
        self.ctx, self.op = ctx, op
        count = APPLY_VARIABLES[op.type]
        self.values = [_value(ctx, op, operands, i) for i in range(count)]
        self.shape = self.values[0].shape
        self.inputs = [ctx.broadcast_to(x, self.shape.dims) for x in operands[count:]]

    def __call__(self, opcode: str, *xs: Instruction | float) -> Instruction:
        return self.ctx.emit(opcode, [self._operand(x) for x in xs])

    def _operand(self, x: Instruction | float) -> Instruction:
        if isinstance(x, Instruction):
            return x
        return self.ctx.full(x, self.shape)

    def store(self, *values: Instruction) -> list[Instruction]:
        for index, value in enumerate(values):
            _store(self.ctx, self.op, index, value)
        return []


def _apply_rule(op_type: str) -> Callable[[Callable[[_Apply], list[Instruction]]], Any]:
    def decorate(update: Callable[[_Apply], list[Instruction]]) -> Any:
        def lower(ctx: LoweringContext, op: tf.Operation, operands: Operands
                  ) -> list[Instruction]:
            return update(_Apply(ctx, op, operands))

        register(op_type, dtypes=FLOAT | _RESOURCE, check=_check_apply,
                 note="TF's CPU kernel's formula")(lower)
        return update

    return decorate


@_apply_rule("ResourceApplyGradientDescent")
def _gradient_descent(a: _Apply) -> list[Instruction]:
    (var,), (alpha, delta) = a.values, a.inputs
    return a.store(a("subtract", var, a("multiply", delta, alpha)))


@_apply_rule("ResourceApplyMomentum")
def _momentum(a: _Apply) -> list[Instruction]:
    (var, accum), (lr, grad, momentum) = a.values, a.inputs
    accum = a("add", a("multiply", accum, momentum), grad)
    if a.op.get_attr("use_nesterov"):
        step = a("add", a("multiply", grad, lr), a("multiply", a("multiply", accum, momentum),
                                                   lr))
    else:
        step = a("multiply", accum, lr)
    return a.store(a("subtract", var, step), accum)


@_apply_rule("ResourceApplyKerasMomentum")
def _keras_momentum(a: _Apply) -> list[Instruction]:
    (var, accum), (lr, grad, momentum) = a.values, a.inputs
    accum = a("subtract", a("multiply", accum, momentum), a("multiply", grad, lr))
    if a.op.get_attr("use_nesterov"):
        step = a("subtract", a("multiply", accum, momentum), a("multiply", grad, lr))
    else:
        step = accum
    return a.store(a("add", var, step), accum)


@_apply_rule("ResourceApplyAdam")
def _adam(a: _Apply) -> list[Instruction]:
    (var, m, v), (beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad) = \
        a.values, a.inputs
    alpha = a("divide", a("multiply", lr, a("sqrt", a("subtract", 1.0, beta2_power))),
              a("subtract", 1.0, beta1_power))
    m = a("add", m, a("multiply", a("subtract", grad, m), a("subtract", 1.0, beta1)))
    v = a("add", v, a("multiply", a("subtract", a("multiply", grad, grad), v),
                      a("subtract", 1.0, beta2)))
    if a.op.get_attr("use_nesterov"):
        direction = a("add", a("multiply", grad, a("subtract", 1.0, beta1)),
                      a("multiply", beta1, m))
    else:
        direction = m
    step = a("divide", a("multiply", direction, alpha), a("add", a("sqrt", v), epsilon))
    return a.store(a("subtract", var, step), m, v)


@_apply_rule("ResourceApplyRMSProp")
def _rms_prop(a: _Apply) -> list[Instruction]:
    (var, ms, mom), (lr, rho, momentum, epsilon, grad) = a.values, a.inputs
    ms = a("add", ms, a("multiply", a("subtract", a("multiply", grad, grad), ms),
                        a("subtract", 1.0, rho)))
    mom = a("add", a("multiply", mom, momentum),
            a("divide", a("multiply", grad, lr), a("sqrt", a("add", ms, epsilon))))
    return a.store(a("subtract", var, mom), ms, mom)


@_apply_rule("ResourceApplyAdagrad")
def _adagrad(a: _Apply) -> list[Instruction]:
    (var, accum), (lr, grad) = a.values, a.inputs
    accum = a("add", accum, a("multiply", grad, grad))
    return a.store(a("subtract", var, a("multiply", a("multiply", grad, lr),
                                        a("rsqrt", accum))), accum)


@_apply_rule("ResourceApplyAdagradV2")
def _adagrad_v2(a: _Apply) -> list[Instruction]:
    (var, accum), (lr, epsilon, grad) = a.values, a.inputs
    if a.op.get_attr("update_slots"):
        accum = a("add", accum, a("multiply", grad, grad))
    step = a("divide", a("multiply", grad, lr), a("add", a("sqrt", accum), epsilon))
    return a.store(a("subtract", var, step), accum)
