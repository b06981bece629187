"""HLO `while` and `conditional` in the CPU backend: loops and branches that call the
functions of the computations they run.

Each computation a loop or conditional calls (condition, body, branches) is optimized
and planned as an entry of its own and emitted as an internal function with the ABI of
`entry` (`compiler.emit_function`); the caller's function emits the control flow around
the calls, at the buffers its plan gives (`ControlFlowPlan`). A `while` keeps two buffers
per state leaf the body changes and swaps the pointer arrays each iteration (ping-pong:
nothing copied or allocated per iteration); leaves the body passes through or updates in
place (`loop_in_place`) have one buffer. A `conditional` switches on its selector to a
call of the branch's function. A kernel inside a loop takes the thread team only when one
iteration's work is big (`loop_kernel_team`), since the team's dispatch and join are paid
every iteration. docs/architecture.md ("How loops and branches run") walks through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llvmlite import ir

from tfxla_lite.codegen.cpu.emitter import I8, I32, I64, PTR
from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.opcodes import opcodes_in
from tfxla_lite.passes.buffer_assignment import ControlFlowPlan, leaves

OPCODES = frozenset(opcodes_in("control-flow"))

# The smallest work per iteration at which a kernel in a loop uses the thread team: a
# dot's flops, other kernels' elements (`compiler.plan_partition`'s work). A loop of
# one kernel over 20 iterations, 2 threads (libgomp) against 1, compiled HLO, load
# 4.5-5.6 on 2 shared cores: dot + tanh 32x256x256 (4.2e6 flops) 0.91x the serial
# time, 32x512x512 2.53x, 64x1024x1024 (1.3e8) 1.21x, 128x1024x1024 (2.7e8) 1.17x;
# tanh over 256x256 elements 16.8x, 1024x1024 2.10x, 2048x2048 (4.2e6) 1.36x: the
# team's join cost about a millisecond each time. The thresholds sit just past the
# largest sizes measured, so such kernels keep the team on an idle machine, and every
# smaller one runs on the calling thread (the entry's thresholds,
# `dot.PARALLEL_MIN_FLOPS` and `parallel.PARALLEL_MIN_WORK`, are 128 times lower).
LOOP_PARALLEL_MIN_FLOPS = 1 << 29
LOOP_PARALLEL_MIN_WORK = 1 << 23

PointerOf = Callable[[Instruction, tuple[int, ...]], ir.Value]
FunctionOf = Callable[[Computation, Any], ir.Function]


def loop_kernel_team(team: int, work: int, flops: int | None) -> int:
    """The team size of a kernel inside a loop body or condition: `team` when its work
    per iteration pays for a team's dispatch and join each iteration (`flops` for a
    GEMM-shaped dot, else `work` in elements), else 1."""
    if flops is not None:
        return team if flops >= LOOP_PARALLEL_MIN_FLOPS else 1
    return team if work >= LOOP_PARALLEL_MIN_WORK else 1


def emit(builder: ir.IRBuilder, inst: Instruction, plan: ControlFlowPlan,
         pointer_of: PointerOf, temp: ir.Value, function_of: FunctionOf) -> None:
    """Emit `inst` (a while or a conditional) at the builder; `function_of` gives the
    function of a called computation under its plan."""
    if inst.opcode == "while":
        _emit_while(builder, inst, plan, pointer_of, temp, function_of)
    else:
        _emit_conditional(builder, inst, plan, pointer_of, temp, function_of)


def emit_copy(builder: ir.IRBuilder, destination: ir.Value, source: ir.Value, size: int,
              maybe_same: bool = False) -> None:
    """memcpy of `size` bytes; `maybe_same`: skipped at run time when the two pointers
    are the same buffer (a loop state leaf passed as both a parameter and an output)."""
    if not size:
        return
    module = builder.module
    memcpy = module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
    if not maybe_same:
        builder.call(memcpy, [destination, source, I64(size), ir.IntType(1)(0)])
        return
    differ = builder.icmp_unsigned("!=", builder.ptrtoint(destination, I64),
                                   builder.ptrtoint(source, I64))
    with builder.if_then(differ):
        builder.call(memcpy, [destination, source, I64(size), ir.IntType(1)(0)])


def _pointer_array(builder: ir.IRBuilder, pointers: list[ir.Value], name: str) -> ir.Value:
    """An array of `pointers` on the stack (in the function's entry block), filled here."""
    array = _entry_alloca(builder, PTR, name, max(1, len(pointers)))
    for n, pointer in enumerate(pointers):
        builder.store(pointer, builder.gep(array, [I64(n)], inbounds=True, source_etype=PTR))
    return array


def _entry_alloca(builder: ir.IRBuilder, typ: ir.Type, name: str, count: int | None = None
                  ) -> ir.Value:
    """A stack slot made once per call of the function: in its entry block, before the
    block's terminator (an alloca inside a loop would grow the stack every iteration)."""
    entry = builder.function.entry_basic_block
    with builder.goto_block(entry):
        if entry.is_terminated:
            builder.position_before(entry.terminator)
        return builder.alloca(typ, size=None if count is None else I64(count), name=name)


def _temp_at(builder: ir.IRBuilder, temp: ir.Value, offset: int, name: str) -> ir.Value:
    return builder.gep(temp, [I64(offset)], source_etype=I8, name=name)


def _emit_while(builder: ir.IRBuilder, inst: Instruction, plan: ControlFlowPlan,
                pointer_of: PointerOf, temp: ir.Value, function_of: FunctionOf) -> None:
    b = builder
    condition, body = inst.called_computations
    state = leaves(inst.shape)
    init = inst.operand(0)
    own = [pointer_of(inst, index) for index, _ in state]
    sources = [pointer_of(init, index) for index, _ in state]
    single = plan.passthrough | plan.in_place  # one buffer: parameter and output both
    second = [own[n] if n in single else _temp_at(b, temp, plan.scratch[n], "state")
              for n in range(len(state))]
    assert plan.flag is not None
    flag = _temp_at(b, temp, plan.flag, "flag")
    callee_temp = _temp_at(b, temp, plan.callee_temp, "callee.temp")
    condition_function = function_of(condition, plan.computations[condition.name])
    body_function = function_of(body, plan.computations[body.name])
    for n, (_, shape) in enumerate(state):
        if n not in plan.passthrough:  # those are the initial state's own buffers
            emit_copy(b, own[n], sources[n], shape.byte_size)
    first = _pointer_array(b, own, "state.a")
    other = _pointer_array(b, second, "state.b")
    flag_outputs = _pointer_array(b, [flag], "flag.out")
    current = _entry_alloca(b, PTR, "current")
    following = _entry_alloca(b, PTR, "next")
    b.store(first, current)
    b.store(other, following)

    function = b.function
    head = function.append_basic_block(f"{inst.name}.condition")
    loop = function.append_basic_block(f"{inst.name}.body")
    done = function.append_basic_block(f"{inst.name}.done")
    b.branch(head)
    b.position_at_end(head)
    now = b.load(current, typ=PTR)
    b.call(condition_function, [now, flag_outputs, callee_temp])
    go = b.icmp_unsigned("!=", b.load(flag, typ=I8), I8(0))
    b.cbranch(go, loop, done)
    b.position_at_end(loop)
    now = b.load(current, typ=PTR)
    then = b.load(following, typ=PTR)
    b.call(body_function, [now, then, callee_temp])
    b.store(then, current)
    b.store(now, following)
    b.branch(head)
    b.position_at_end(done)
    changed = [n for n in range(len(state)) if n not in single and state[n][1].byte_size]
    if changed:
        odd = b.icmp_unsigned("!=", b.ptrtoint(b.load(current, typ=PTR), I64),
                              b.ptrtoint(first, I64))
        with b.if_then(odd):
            for n in changed:
                emit_copy(b, own[n], second[n], state[n][1].byte_size)


def _emit_conditional(builder: ir.IRBuilder, inst: Instruction, plan: ControlFlowPlan,
                      pointer_of: PointerOf, temp: ir.Value, function_of: FunctionOf) -> None:
    b = builder
    selector, *operands = inst.operands
    branches = inst.called_computations
    callee_temp = _temp_at(b, temp, plan.callee_temp, "callee.temp")
    outputs = _pointer_array(b, [pointer_of(inst, index) for index, _ in leaves(inst.shape)],
                             f"{inst.name}.outputs")
    arguments = [_pointer_array(b, [pointer_of(operand, index)
                                    for index, _ in leaves(operand.shape)],
                                f"{inst.name}.params{n}")
                 for n, operand in enumerate(operands)]
    functions = [function_of(branch, plan.computations[branch.name]) for branch in branches]
    if selector.shape.element_type == "pred":
        chosen = b.select(b.icmp_unsigned("!=", b.load(pointer_of(selector, ()), typ=I8), I8(0)),
                          I32(0), I32(1))
    else:
        index = b.load(pointer_of(selector, ()), typ=I32)
        inside = b.icmp_unsigned("<", index, I32(len(branches)))  # negatives are large
        chosen = b.select(inside, index, I32(len(branches) - 1))
    function = b.function
    done = function.append_basic_block(f"{inst.name}.done")
    blocks = [function.append_basic_block(f"{inst.name}.branch{n}")
              for n in range(len(branches))]
    switch = b.switch(chosen, blocks[-1])
    for n, block in enumerate(blocks[:-1]):
        switch.add_case(I32(n), block)
    for block, branch_function, argument in zip(blocks, functions, arguments):
        b.position_at_end(block)
        b.call(branch_function, [argument, outputs, callee_temp])
        b.branch(done)
    b.position_at_end(done)
