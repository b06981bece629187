"""CPU element generator of `call`: the callee's root computed inline at the index asked.

The `call-inliner` pass removes calls before codegen in the default pipeline; this
generator serves modules compiled as written (and any call a pipeline leaves). While
the callee is emitted, its parameters forward to the call's operands
(`KernelContext.forwarded`), and its values live in a scope of their own, so two calls
of one computation at the same index never share a memoized value.
"""

from __future__ import annotations

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import Index, KernelContext, register
from tfxla_lite.hlo.ir import Instruction


@register("call")
def emit_call(ctx: KernelContext, inst: Instruction, index: Index) -> ir.Value:
    callee = inst.called_computations[0]
    assert callee.root is not None
    saved = dict(ctx.forwarded)
    ctx.forwarded.update({id(p): o for p, o in zip(callee.parameters, inst.operands)})
    try:
        with ctx.scope():
            return ctx.value(callee.root, index)
    finally:
        ctx.forwarded = saved
