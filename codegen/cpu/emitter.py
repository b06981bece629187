"""The core of the CPU backend: element types, indices, loops and the emitter registry.

Codegen follows XLA's elemental IR emitter: every HLO instruction that a kernel
computes (rather than reads from a buffer) has an *element generator*, a function
that, given the multi-dimensional index of one element of its result, emits the
LLVM IR that computes that element from its operands' elements. A kernel is a loop
nest over its output's index space that asks the root's generator for each element;
fused producers are thereby computed inline, at whatever index their consumer needs.

`EMITTERS` maps each HLO opcode to its generator (docs/conventions.md, habit 2: one registration
per opcode); `elementwise.py`, `data_movement.py`, `reduction.py` and `dot.py` fill
it. `KernelContext` holds the state of one kernel function being emitted;
`new_kernel_function` makes a kernel's function and its context (every kernel shape:
`compiler.py`, `multi_output.py`, `sort.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
from llvmlite import ir

from tfxla_lite.hlo.ir import Computation, Instruction
from tfxla_lite.hlo.shape import FLOAT_TYPES, SIGNED_TYPES, Shape, numpy_dtype

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
VOID = ir.VoidType()
PTR = ir.PointerType()
# The exported function of the ABI (`tfxla_lite.codegen.executable`).
ENTRY_NAME = "entry"

# bf16 lives in registers as an f32 that is always a bf16 value (every computed bf16
# element is rounded, `round_bf16`), and in memory as its 16 high bits.
_FLOAT_IR_TYPES: dict[str, ir.Type] = {"f16": ir.HalfType(), "bf16": ir.FloatType(),
                                       "f32": ir.FloatType(), "f64": ir.DoubleType()}
_INT_BITS = {"s8": 8, "s16": 16, "s32": 32, "s64": 64, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def is_float(element_type: str) -> bool:
    return element_type in FLOAT_TYPES


def is_signed(element_type: str) -> bool:
    return element_type in SIGNED_TYPES


def int_bits(element_type: str) -> int:
    return _INT_BITS[element_type]


def value_type(element_type: str) -> ir.Type:
    """The LLVM type of one element in registers (pred is i1)."""
    if element_type == "pred":
        return I1
    if element_type in _FLOAT_IR_TYPES:
        return _FLOAT_IR_TYPES[element_type]
    if element_type in _INT_BITS:
        return ir.IntType(_INT_BITS[element_type])
    raise NotImplementedError(f"CPU backend: element type {element_type} is not supported")


def storage_type(element_type: str) -> ir.Type:
    """The LLVM type of one element in memory (pred is a byte, as NumPy's bool; bf16 the
    16 high bits of an f32)."""
    if element_type == "bf16":
        return ir.IntType(16)
    return I8 if element_type == "pred" else value_type(element_type)


def bf16_bits(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The bf16 nearest an f32 (ties to even), as i16; a NaN stays a (quiet) NaN."""
    bits = builder.bitcast(x, I32)
    lsb = builder.and_(builder.lshr(bits, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = builder.add(bits, builder.add(ir.Constant(I32, 0x7FFF), lsb))
    quiet_nan = builder.or_(bits, ir.Constant(I32, 0x400000))
    is_nan = builder.fcmp_unordered("uno", x, x)
    chosen = builder.select(is_nan, quiet_nan, rounded)
    return builder.trunc(builder.lshr(chosen, ir.Constant(I32, 16)), ir.IntType(16))


def bf16_value(builder: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 of bf16 `bits` (i16): exact."""
    wide = builder.shl(builder.zext(bits, I32), ir.Constant(I32, 16))
    return builder.bitcast(wide, ir.FloatType())


def round_bf16(builder: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """An f32 rounded to the nearest bf16 value, still as an f32."""
    return bf16_value(builder, bf16_bits(builder, x))


def constant(element_type: str, value: Any) -> ir.Constant:
    """An LLVM constant of `element_type`; float values go through NumPy to round right."""
    typ = value_type(element_type)
    if element_type == "pred":
        return ir.Constant(typ, int(bool(value)))
    if is_float(element_type):
        # llvmlite prints floats as the double's hex; round to the type first.
        if element_type == "bf16":
            return ir.Constant(typ, float(np.asarray(value).astype(numpy_dtype("bf16"))))
        dtype = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[element_type]
        return ir.Constant(typ, float(dtype(value)))
    bits = int_bits(element_type)
    return ir.Constant(typ, int(value) & ((1 << bits) - 1))


def i64(value: int) -> ir.Constant:
    return ir.Constant(I64, int(value))


def minimum(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """The smaller of two signed integers (a tile's or a range's clamped end)."""
    return builder.select(builder.icmp_signed("<", x, y), x, y)


def declare(module: ir.Module, name: str, signature: ir.FunctionType) -> ir.Function:
    """The module's function `name` (a library call, an intrinsic), declared once."""
    existing = module.globals.get(name)
    return existing if existing is not None else ir.Function(module, signature, name=name)


def row_major_strides(dims: tuple[int, ...]) -> list[int]:
    strides = [1] * len(dims)
    for d in range(len(dims) - 2, -1, -1):
        strides[d] = strides[d + 1] * dims[d + 1]
    return strides


def row_major_index(builder: ir.IRBuilder, flat: ir.Value, dims: tuple[int, ...]
                    ) -> list[ir.Value]:
    """The row-major multi-index of `flat` in `dims` (every dimension, a size of 1 too)."""
    strides = row_major_strides(dims)
    parts = []
    for d, stride in enumerate(strides):
        part = flat if d == 0 else builder.urem(flat, i64(strides[d - 1]))
        parts.append(part if stride == 1 else builder.udiv(part, i64(stride)))
    return parts


def zeroed_row(ctx: KernelContext, count: int) -> ir.Value:
    """A stack row of `count` f32 zeros: what a pointer into the padding reads."""
    zeros = ctx.alloca(ir.FloatType(), name="conv.zeros", count=count)
    memset = ctx.module.declare_intrinsic("llvm.memset", [PTR, I64])
    ctx.builder.call(memset, [zeros, ir.Constant(ir.IntType(8), 0), i64(4 * count),
                              ir.Constant(I1, 0)])
    return zeros


class Index:
    """The index of one element of an array of `dims`: multi-dimensional, linear, or both.

    The missing form is derived on demand and kept only for the basic block it was
    derived in, so that a form derived in a branch never leaks to code the branch does
    not dominate, while the reads of one index in one block (every operand of a fused
    expression) share it: recomputing it for each made a fused kernel's IR much longer
    for LLVM to parse and clean up (GVN merged the repeats anyway). A reshape keeps the
    linear form: row-major reshapes preserve it.
    """

    __slots__ = ("dims", "linear", "multi", "_derived")

    def __init__(self, dims: tuple[int, ...], multi: list[ir.Value] | None = None,
                 linear: ir.Value | None = None) -> None:
        self.dims = tuple(dims)
        self.multi = multi
        self.linear = linear
        # (block, form): the missing form, derived in that block.
        self._derived: tuple[ir.Block, Any] | None = None
        if not self.dims and multi is None:
            self.multi = []
            if linear is None:
                self.linear = i64(0)

    @staticmethod
    def scalar() -> Index:
        return Index((), [], i64(0))

    def get_multi(self, builder: ir.IRBuilder) -> list[ir.Value]:
        if self.multi is not None:
            return self.multi
        if self._derived is not None and self._derived[0] is builder.block:
            return list(self._derived[1])  # a copy: callers may edit theirs
        assert self.linear is not None
        multi = []
        strides = row_major_strides(self.dims)
        for d, size in enumerate(self.dims):
            if size == 1:
                multi.append(i64(0))
                continue
            value = self.linear
            if d > 0:
                value = builder.urem(value, i64(strides[d - 1]))
            if strides[d] != 1:
                value = builder.udiv(value, i64(strides[d]))
            multi.append(value)
        self._derived = (builder.block, list(multi))
        return multi

    def get_linear(self, builder: ir.IRBuilder) -> ir.Value:
        if self.linear is not None:
            return self.linear
        if self._derived is not None and self._derived[0] is builder.block:
            return self._derived[1]
        assert self.multi is not None
        linear: ir.Value = i64(0)
        for value, stride, size in zip(self.multi, row_major_strides(self.dims), self.dims):
            if size == 1:
                continue
            term = value if stride == 1 else builder.mul(value, i64(stride), flags=["nuw", "nsw"])
            linear = term if isinstance(linear, ir.Constant) else builder.add(
                linear, term, flags=["nuw", "nsw"])
        self._derived = (builder.block, linear)
        return linear


# (dimension, begin, end): a loop nest that runs one dimension over part of its range.
Restriction = tuple[int, ir.Value, ir.Value]

# An element generator: the value of `inst` at `index`, emitted at the builder's position.
ElementGenerator = Callable[["KernelContext", Instruction, Index], ir.Value]

EMITTERS: dict[str, ElementGenerator] = {}

# A whole-kernel emitter: the body of a kernel whose root is `inst`, writing `output`
# itself (in any order), for ops whose elements are cheaper computed together than each
# on its own (scatter: each update read once, instead of once per output element).
KernelEmitter = Callable[["KernelContext", Instruction, ir.Value], None]

KERNEL_EMITTERS: dict[str, KernelEmitter] = {}

# A kernel of its own: the launcher `void kernel(outputs..., inputs...)` of an entry
# instruction that no loop over its output elements computes (`compiler.py` calls it with
# the module, its constant pool, the instruction and the threads it may use).
OwnKernel = Callable[[ir.Module, "ConstantPool", Instruction, int], ir.Function]

OWN_KERNELS: dict[str, OwnKernel] = {}

_Emitter = TypeVar("_Emitter")


def _registrar(table: dict[str, _Emitter],
               what: str) -> Callable[..., Callable[[_Emitter], _Emitter]]:
    """The decorator `@name(*opcodes)` that enters a function in `table` once per opcode."""
    def register(*opcodes: str) -> Callable[[_Emitter], _Emitter]:
        def decorate(fn: _Emitter) -> _Emitter:
            for opcode in opcodes:
                if opcode in table:
                    raise ValueError(f"two CPU {what} for {opcode}")
                table[opcode] = fn
            return fn

        return decorate

    return register


register = _registrar(EMITTERS, "emitters")
register_kernel = _registrar(KERNEL_EMITTERS, "kernel emitters")
register_own_kernel = _registrar(OWN_KERNELS, "kernels")


class ConstantPool:
    """Read-only globals holding constant literals, one per distinct literal."""

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self._globals: dict[tuple[str, tuple[int, ...], bytes], ir.GlobalVariable] = {}

    def global_for(self, literal: np.ndarray, element_type: str) -> ir.GlobalVariable:
        array = np.ascontiguousarray(literal)
        if element_type == "pred":
            array = array.astype(np.uint8)
        data = array.tobytes()
        key = (element_type, tuple(array.shape), data)
        if key not in self._globals:
            typ = ir.ArrayType(I8, max(len(data), 1))
            gv = ir.GlobalVariable(self.module, typ, name=f"constant.{len(self._globals)}")
            gv.global_constant = True
            gv.linkage = "internal"
            gv.unnamed_addr = True
            gv.align = 64
            gv.initializer = ir.Constant(typ, bytearray(data or b"\0"))
            self._globals[key] = gv
        return self._globals[key]


class KernelContext:
    """The state of one kernel function being emitted.

    `buffers` maps instructions whose values the kernel reads from memory (the fused
    computation's parameters, or an unfused op's operands) to their pointers;
    `scalars` binds the parameters of a scalar computation (a reducer) to values.
    Generated values are memoized per (instruction, index object) in scopes that
    follow the control flow: a loop body or a branch opens a scope, so a value is
    reused only where it dominates.
    """

    def __init__(self, function: ir.Function, pool: ConstantPool,
                 buffers: dict[int, ir.Value]) -> None:
        self.function = function
        self.module: ir.Module = function.module
        self.pool = pool
        self.buffers = buffers
        self.scalars: dict[int, ir.Value] = {}
        # Parameters of a `call`ed computation -> the caller's operands (calls.py).
        self.forwarded: dict[int, Instruction] = {}
        # Stack slots go in a block of their own, so that two builders never share one.
        self._allocas = function.append_basic_block("allocas")
        start = function.append_basic_block("start")
        self._alloca_builder = ir.IRBuilder(self._allocas)
        self._alloca_branch = self._alloca_builder.branch(start)
        self.builder = ir.IRBuilder(start)
        self._scopes: list[dict[tuple[int, int], tuple[ir.Value, Index]]] = [{}]

    # -- values ----------------------------------------------------------------------------
    def value(self, inst: Instruction, index: Index) -> ir.Value:
        """The element of `inst` at `index`, memoized where it dominates."""
        if id(inst) in self.scalars:
            return self.scalars[id(inst)]
        if id(inst) in self.forwarded:
            return self.value(self.forwarded[id(inst)], index)
        key = (id(inst), id(index))
        for scope in reversed(self._scopes):
            if key in scope:
                return scope[key][0]
        if id(inst) in self.buffers:
            result = self.load(self.buffers[id(inst)], inst.shape, index)
        else:
            generator = EMITTERS.get(inst.opcode)
            if generator is None:
                raise NotImplementedError(
                    f"CPU backend: no emitter for opcode '{inst.opcode}' (%{inst.name})")
            result = generator(self, inst, index)
            if inst.shape.element_type == "bf16":  # computed in f32: round once per op
                result = round_bf16(self.builder, result)
        self._scopes[-1][key] = (result, index)
        return result

    def apply_computation(self, computation: Computation, args: list[ir.Value]) -> ir.Value:
        """Emit a scalar computation (a reducer) applied to `args`, inline."""
        assert computation.root is not None
        saved = dict(self.scalars)
        for param, arg in zip(computation.parameters, args):
            self.scalars[id(param)] = arg
        with self.scope():
            result = self.value(computation.root, Index.scalar())
        self.scalars = saved
        return result

    @contextmanager
    def scope(self) -> Iterator[None]:
        self._scopes.append({})
        try:
            yield
        finally:
            self._scopes.pop()

    # -- memory ----------------------------------------------------------------------------
    def element_pointer(self, base: ir.Value, shape: Shape, index: Index) -> ir.Value:
        linear = index.get_linear(self.builder)
        return self.builder.gep(base, [linear], inbounds=True,
                                source_etype=storage_type(shape.element_type))

    def load(self, base: ir.Value, shape: Shape, index: Index) -> ir.Value:
        typ = storage_type(shape.element_type)
        value = self.builder.load(self.element_pointer(base, shape, index), typ=typ)
        if shape.element_type == "pred":
            value = self.builder.icmp_unsigned("!=", value, ir.Constant(I8, 0))
        elif shape.element_type == "bf16":
            value = bf16_value(self.builder, value)
        return value

    def store(self, value: ir.Value, base: ir.Value, shape: Shape, index: Index) -> None:
        if shape.element_type == "pred":
            value = self.builder.zext(value, I8)
        elif shape.element_type == "bf16":
            value = bf16_bits(self.builder, value)
        self.builder.store(value, self.element_pointer(base, shape, index))

    def alloca(self, typ: ir.Type, name: str = "", count: int | None = None) -> ir.Value:
        """A stack slot (of `count` elements) in the entry block, where SROA promotes
        single slots to registers."""
        self._alloca_builder.position_before(self._alloca_branch)
        size = None if count is None else i64(count)
        return self._alloca_builder.alloca(typ, size=size, name=name)

    # -- control flow ----------------------------------------------------------------------
    @contextmanager
    def loop(self, stop: int | ir.Value, name: str = "i", start: int | ir.Value = 0
             ) -> Iterator[ir.Value]:
        """`for i in range(start, stop)`, an i64 induction variable; opens a value scope."""
        builder = self.builder
        stop_value = i64(stop) if isinstance(stop, int) else stop
        start_value = i64(start) if isinstance(start, int) else start
        preheader = builder.block
        header = self.function.append_basic_block(f"{name}.header")
        body = self.function.append_basic_block(f"{name}.body")
        exit_block = self.function.append_basic_block(f"{name}.exit")
        builder.branch(header)
        builder.position_at_end(header)
        counter = builder.phi(I64, name=name)
        counter.add_incoming(start_value, preheader)
        builder.cbranch(builder.icmp_signed("<", counter, stop_value), body, exit_block)
        builder.position_at_end(body)
        with self.scope():
            yield counter
        following = builder.add(counter, i64(1), name=f"{name}.next", flags=["nuw", "nsw"])
        counter.add_incoming(following, builder.block)
        builder.branch(header)
        builder.position_at_end(exit_block)

    @contextmanager
    def loop_nest(self, dims: tuple[int, ...], name: str = "i",
                  restrict: Restriction | None = None) -> Iterator[list[ir.Value]]:
        """Nested loops over `dims`, the last innermost (contiguous in row-major);
        `restrict` = (d, begin, end) runs dimension d over [begin, end) only."""
        with _nest(self, list(dims), name, [], restrict) as multi:
            yield multi

    def branch_value(self, condition: ir.Value, on_true: Callable[[], ir.Value],
                     on_false: Callable[[], ir.Value], name: str = "branch") -> ir.Value:
        """`condition ? on_true() : on_false()`, each side emitted only on its branch."""
        builder = self.builder
        true_block = self.function.append_basic_block(f"{name}.true")
        false_block = self.function.append_basic_block(f"{name}.false")
        merge = self.function.append_basic_block(f"{name}.merge")
        builder.cbranch(condition, true_block, false_block)
        builder.position_at_end(true_block)
        with self.scope():
            true_value = on_true()
        true_end = builder.block
        builder.branch(merge)
        builder.position_at_end(false_block)
        with self.scope():
            false_value = on_false()
        false_end = builder.block
        builder.branch(merge)
        builder.position_at_end(merge)
        phi = builder.phi(true_value.type, name=name)
        phi.add_incoming(true_value, true_end)
        phi.add_incoming(false_value, false_end)
        return phi

    def call_intrinsic(self, name: str, args: list[ir.Value], types: list[ir.Type] | None = None
                       ) -> ir.Value:
        """Call `llvm.<name>` overloaded on `types` (default: the first argument's type);
        the result has type `types[0]`."""
        overloads = types if types is not None else [args[0].type]
        symbol = f"llvm.{name}." + ".".join(_mangle(t) for t in overloads)
        fn = self.module.globals.get(symbol)
        if fn is None:
            signature = ir.FunctionType(overloads[0], [a.type for a in args])
            fn = ir.Function(self.module, signature, name=symbol)
        return self.builder.call(fn, args)

    def call_libm(self, name: str, args: list[ir.Value]) -> ir.Value:
        """Call a C math function (`tanhf` / `tanh`) that the JIT resolves from the process."""
        typ = args[0].type
        widened = typ == ir.HalfType()
        if widened:  # libm has no half functions: compute in float and round back.
            args = [self.builder.fpext(a, ir.FloatType()) for a in args]
            typ = ir.FloatType()
        symbol = name + ("f" if typ == ir.FloatType() else "")
        fn = self.module.globals.get(symbol)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(typ, [typ] * len(args)), name=symbol)
        result = self.builder.call(fn, args)
        return self.builder.fptrunc(result, ir.HalfType()) if widened else result


def _mangle(typ: ir.Type) -> str:
    if isinstance(typ, ir.IntType):
        return f"i{typ.width}"
    return {"half": "f16", "float": "f32", "double": "f64"}[str(typ)]


@contextmanager
def _nest(ctx: KernelContext, dims: list[int], name: str, outer: list[ir.Value],
          restrict: Restriction | None) -> Iterator[list[ir.Value]]:
    if len(outer) == len(dims):
        yield list(outer)
        return
    d = len(outer)
    start: int | ir.Value = 0
    stop: int | ir.Value = dims[d]
    if restrict is not None and restrict[0] == d:
        start, stop = restrict[1], restrict[2]
    elif dims[d] == 1:  # no loop for a unit dimension
        with _nest(ctx, dims, name, outer + [i64(0)], restrict) as multi:
            yield multi
        return
    with ctx.loop(stop, name=f"{name}{d}", start=start) as counter, \
            _nest(ctx, dims, name, outer + [counter], restrict) as multi:
        yield multi


def kernel_name(inst: Instruction) -> str:
    """The LLVM name of entry instruction `inst`'s kernel."""
    return "kernel." + re.sub(r"[^A-Za-z0-9_.]", "_", inst.name)


def new_kernel_function(module: ir.Module, pool: ConstantPool, inst: Instruction, name: str,
                        output_count: int, extra: list[ir.Type]
                        ) -> tuple[KernelContext, list[ir.Value], list[ir.Value]]:
    """A function `void name(out..., in..., *extra)` with `output_count` outputs (left for
    the caller to name and mark) and one input per operand of `inst`, and a context
    whose buffers are those inputs; its outputs and inputs."""
    count = output_count + len(inst.operands)
    signature = ir.FunctionType(VOID, [PTR] * count + extra)
    function = ir.Function(module, signature, name=name)
    function.linkage = "internal"
    function.attributes.add("nounwind")
    outputs, inputs = list(function.args[:output_count]), list(function.args[output_count:count])
    for arg in inputs:
        arg.name = "input"
        arg.attributes.add("captures(none)")  # LLVM infers readonly itself
    if inst.opcode == "fusion":
        params = inst.fused_computation.parameters
        buffers = {id(p): arg for p, arg in zip(params, inputs)}
    else:
        buffers = {id(o): arg for o, arg in zip(inst.operands, inputs)}
    return KernelContext(function, pool, buffers), outputs, inputs
