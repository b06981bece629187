"""Element generators of the GPU backend: HLO instruction + output index → CUDA C expression.

As in the CPU backend (and XLA's elemental emitter), every instruction a kernel computes
has a generator that, given the index of one element of its result, writes the C
statements computing that element from its operands' elements and returns the name of
the variable holding it. A kernel template (`templates.py`) asks the root's generator for
the elements its threads own; fused producers are computed inline at whatever index their
consumer needs. `EMITTERS` holds one generator per opcode (this file: the elementwise
ones; `data_movement.py`: the rest).

Semantics match the CPU backend and `tfxla_lite.hlo.evaluator`: floats use CUDA's math
library (libdevice) in their own precision, f16/bf16 in float rounded after every op;
comparisons are ordered except NE; maximum/minimum propagate NaN; integer division never
traps; float → integer conversion saturates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tfxla_lite.codegen.gpu.cuda_source import (
    HALF_TYPES,
    INTEGER_BITS,
    SIGNED_OF,
    SIGNED_TYPES,
    UNSIGNED_OF,
    Writer,
    compute_type,
    identifier,
    integer_limits,
    is_float,
    literal,
    load,
    round_half,
    storage_type,
)
from tfxla_lite.hlo.ir import Computation, Instruction, widened_reduce_op
from tfxla_lite.hlo.opcodes import is_identity_on_integers, opcodes_in


class Index:
    """The index of one element of an array of `dims`: linear, multi-dimensional, or both.

    Components are C expressions of the kernel's index type; the missing form is
    computed on demand (once) by `get_linear` / `get_multi`.
    """

    def __init__(self, dims: tuple[int, ...], multi: list[str] | None = None,
                 linear: str | None = None) -> None:
        assert multi is not None or linear is not None or not dims
        self.dims = tuple(dims)
        self.multi = list(multi) if multi is not None else None
        self.linear = linear if linear is not None else ("0" if not dims else None)
        # The cache key is the form given, not one derived later: a derived form would
        # change the key halfway through a kernel body and miss values computed before.
        self._key: tuple[str, ...] = ("linear", self.linear) if self.linear is not None \
            else ("multi", *(multi or []))
        # The scopes a derived form was declared in (None: given, valid everywhere); a
        # form declared inside a branch that has closed is computed again.
        self._linear_scope: object = None
        self._multi_scope: object = None

    @staticmethod
    def scalar() -> Index:
        return Index((), [], "0")

    def key(self) -> tuple[str, ...]:
        if not self.dims:
            return ("scalar",)
        return self._key

    def get_linear(self, ctx: KernelContext) -> str:
        if self.linear is not None and not ctx.in_scope(self._linear_scope):
            self.linear = None
        if self.linear is None:
            self._linear_scope = ctx.current_scope()
            assert self.multi is not None
            terms = []
            stride = 1
            for value, size in reversed(list(zip(self.multi, self.dims))):
                if size != 1:
                    terms.append(value if stride == 1 else f"{value} * {stride}")
                stride *= size
            # Inline, as `get_multi`: an operand bound per row may never read it.
            self.linear = f"({' + '.join(reversed(terms)) or '0'})"
        return self.linear

    def get_multi(self, ctx: KernelContext) -> list[str]:
        if self.multi is not None and not ctx.in_scope(self._multi_scope):
            self.multi = None
        if self.multi is None:
            self._multi_scope = ctx.current_scope()
            assert self.linear is not None
            if 0 in self.dims:
                # An empty array has no element to index (the code never runs): dividing
                # by its zero strides would only draw nvcc's division-by-zero diagnostics.
                self.multi = ["0"] * len(self.dims)
                return self.multi
            multi = []
            stride = 1
            strides = []
            for size in reversed(self.dims):
                strides.append(stride)
                stride *= size
            strides.reverse()
            for d, (size, step) in enumerate(zip(self.dims, strides)):
                if size == 1:
                    multi.append("0")
                    continue
                # Inline (the CUDA compiler shares the divisions): a declared variable
                # for a dimension nobody reads would draw an unused-variable warning.
                expression = self.linear if step == 1 else f"{self.linear} / {step}"
                if d > 0:
                    expression = f"{expression} % {size}"
                multi.append(f"({expression})")
            self.multi = multi
        return self.multi


Generator = Callable[["KernelContext", Instruction, Index], str]
EMITTERS: dict[str, Generator] = {}

# The opcodes with no element generator here, and why (sort and topk are kernels of their
# own, `sort.py`); the error naming one says it.
NO_ELEMENT_GENERATOR: dict[str, str] = {
    **dict.fromkeys(("tuple", "get-tuple-element"), "names for buffers, no computation"),
    "fusion": "a kernel (kernels.py); nested fusions are not supported",
    **dict.fromkeys(("while", "conditional", "call"),
                    "GPU: not supported, the CPU backend compiles it"),
}


def register(*opcodes: str) -> Callable[[Generator], Generator]:
    def decorate(generator: Generator) -> Generator:
        for opcode in opcodes:
            EMITTERS[opcode] = generator
        return generator

    return decorate


class KernelContext:
    """The state of one kernel body being written.

    `buffers` maps instructions read from memory (fusion parameters, a kernel's entry
    operands) to the C pointer holding them; `bound` maps instructions to C expressions
    already computed (a reducer's arguments, the lanes of a vector load). Values are
    cached per (instruction, index) in nested scopes: a value computed inside a branch
    is forgotten when the branch closes.
    """

    def __init__(self, writer: Writer, buffers: dict[int, str], index_type: str = "long long",
                 tables: ModuleTables | None = None) -> None:
        self.writer = writer
        self.buffers = dict(buffers)
        self.bound: dict[int, str] = {}
        # Pointer -> the C condition of its 16-byte alignment ("": proven), for the row
        # kernels' vector loads (`row_vectors.pointer_alignment`); empty: no vector loads.
        self.aligned: dict[str, str] = {}
        self.index_type = index_type
        self.tables = tables if tables is not None else ModuleTables()
        self._scopes: list[dict[tuple[object, ...], str]] = [{}]

    # -- statements ------------------------------------------------------------------------
    def bind(self, expression: str, c_type: str, stem: str = "v") -> str:
        """Declare a `const` variable holding `expression`; its name."""
        if _is_atom(expression):
            return expression
        name = self.writer.fresh(stem)
        self.writer.line(f"const {c_type} {name} = {expression};")
        return name

    def current_scope(self) -> object:
        return self._scopes[-1]

    def in_scope(self, scope: object) -> bool:
        """Whether names declared in `scope` are visible here (None: always)."""
        return scope is None or any(scope is s for s in self._scopes)

    @contextmanager
    def scope(self) -> Iterator[None]:
        self._scopes.append({})
        try:
            yield
        finally:
            self._scopes.pop()

    def branch_value(self, condition: str, c_type: str, on_true: Callable[[], str],
                     on_false: Callable[[], str]) -> str:
        """A value computed by only one of two branches (reads the other must not do)."""
        w = self.writer
        name = w.fresh("b")
        w.line(f"{c_type} {name};")
        w.open(f"if ({condition})")
        with self.scope():
            w.line(f"{name} = {on_true()};")
        w.depth -= 1
        w.open("} else")
        with self.scope():
            w.line(f"{name} = {on_false()};")
        w.close()
        return name

    def known(self, inst: Instruction, linear: str, expression: str) -> None:
        """Make `expression` the value of `inst` at linear index `linear` in this scope
        (a lane of a vector load), so that reads of it there do not load again."""
        self._scopes[-1][(id(inst), "linear", linear)] = expression

    # -- values ----------------------------------------------------------------------------
    def value(self, inst: Instruction, index: Index) -> str:
        """A C expression of `inst`'s element at `index`, in its compute type."""
        if id(inst) in self.bound:
            return self.bound[id(inst)]
        key = (id(inst), *(index.key() if inst.shape.dims else ("scalar",)))
        for scope in reversed(self._scopes):
            if key in scope:
                return scope[key]
        element_type = inst.shape.element_type
        if id(inst) in self.buffers:
            linear = index.get_linear(self) if inst.shape.dims else "0"
            expression = load(element_type, self.buffers[id(inst)], linear)
        else:
            try:
                generator = EMITTERS[inst.opcode]
            except KeyError:
                why = NO_ELEMENT_GENERATOR.get(inst.opcode)
                raise NotImplementedError(f"GPU backend: no element generator for {inst.opcode}"
                                          f" (%{inst.name})" + (f": {why}" if why else "")) \
                    from None
            expression = generator(self, inst, index)
        result = self.bind(expression, compute_type(element_type))
        self._scopes[-1][key] = result
        return result

    def apply(self, computation: Computation, args: list[str], widened: bool = False) -> str:
        """A scalar computation (a reducer) applied to `args`: a call of its device function;
        `widened`: its f32 twin, which does not round to f16/bf16 (`accumulates_in_f32`)."""
        return f"{self.tables.function_of(computation, widened)}({', '.join(args)})"

    def fold(self, reduce: Instruction, args: list[str]) -> str:
        """One step of `reduce`'s fold: its reducer applied to (accumulator, value), in f32
        for a sum or product of 2-byte floats."""
        return self.apply(reduce.called_computations[0], args, accumulates_in_f32(reduce))

    def reduced(self, reduce: Instruction, value: str) -> str:
        """The final value of `reduce`'s fold, rounded once to a 2-byte float's precision
        when it accumulated in f32 (otherwise already rounded at every step)."""
        if not accumulates_in_f32(reduce):
            return value
        return round_half(reduce.shape.element_type, value)

    def apply_tuple(self, computation: Computation, args: list[str]) -> list[str]:
        """A reducer returning a tuple of scalars (a variadic reduce's) applied to `args`:
        declares one variable per result, filled by its device function."""
        name = self.tables.tuple_function_of(computation)
        root = computation.root
        assert root is not None and root.shape.tuple_shapes is not None
        results = []
        for shape in root.shape.tuple_shapes:
            result = self.writer.fresh("r")
            self.writer.line(f"{compute_type(shape.element_type)} {result};")
            results.append(result)
        self.writer.line(f"{name}({', '.join(args + ['&' + r for r in results])});")
        return results


# How a constant array's elements are stored in the module (as bits, so that every value,
# NaN payloads included, survives exactly) and read back.
_CONSTANT_BITS = {"f16": ("unsigned short", "uint16", "__half2float(__ushort_as_half({}))"),
                  "bf16": ("unsigned short", "uint16",
                           "__bfloat162float(__ushort_as_bfloat16({}))"),
                  "f32": ("unsigned int", "uint32", "__int_as_float((int){})"),
                  "f64": ("unsigned long long", "uint64",
                          "__longlong_as_double((long long){})")}


class ModuleTables:
    """What kernels of one module share: device functions of the scalar computations they
    apply (reduce's `to_apply`) and `__device__` arrays of the constants they read."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self.definitions: list[str] = []
        self._constants: dict[int, str] = {}

    def constant_array(self, inst: Instruction) -> tuple[str, str]:
        """The array holding constant `inst` and the read pattern of one element (`{}`:
        the subscripted array)."""
        element_type = inst.shape.element_type
        if element_type in _CONSTANT_BITS:
            c_type, view, read = _CONSTANT_BITS[element_type]
            values = [f"{v}u" for v in inst.literal.reshape(-1).view(view).tolist()]
        else:
            c_type, read = storage_type(element_type), "{}"
            values = [literal(element_type, v) for v in inst.literal.reshape(-1).tolist()]
        if id(inst) not in self._constants:
            name = f"constant_{len(self._constants)}_{identifier(inst.name)}"
            body = ", ".join(values) or "0"
            self.definitions.append(f"static __device__ const {c_type} {name}"
                                    f"[{max(1, len(values))}] = {{{body}}};\n")
            self._constants[id(inst)] = name
        return self._constants[id(inst)], read

    def tuple_function_of(self, computation: Computation) -> str:
        """`void f(params..., results*...)` of a reducer whose root is a tuple of scalars."""
        key = -id(computation)  # apart from `function_of`'s entries
        if key in self._names:
            return self._names[key]
        root = computation.root
        assert root is not None
        if root.opcode != "tuple" or any(o.shape.is_tuple for o in root.operands):
            raise NotImplementedError(f"GPU backend: reducer {computation.name} returns a "
                                      f"tuple not built by a `tuple` of scalars")
        name = f"reducer_{identifier(computation.name)}"
        writer = Writer(indent=1)
        ctx = KernelContext(writer, {}, "int", self)
        params = computation.parameters
        for n, param in enumerate(params):
            ctx.bound[id(param)] = f"p{n}"
        results = [ctx.value(o, Index.scalar()) for o in root.operands]
        for n, result in enumerate(results):
            writer.line(f"*r{n} = {result};")
        signature = ", ".join(
            [f"{compute_type(p.shape.element_type)} p{n}" for n, p in enumerate(params)]
            + [f"{compute_type(o.shape.element_type)}* r{n}"
               for n, o in enumerate(root.operands)])
        self.definitions.append(f"__device__ __forceinline__ void {name}({signature}) {{\n"
                                + writer.text() + "}\n")
        self._names[key] = name
        return name

    def function_of(self, computation: Computation, widened: bool = False) -> str:
        """The device function of scalar computation `computation`; `widened`: a version
        computing 2-byte floats in f32 without rounding (for `accumulates_in_f32` reduces;
        `reducer_<name>_f32`)."""
        key = (id(computation), widened)
        if key in self._names:
            return self._names[key]
        root = computation.root
        assert root is not None
        if root.shape.is_tuple:
            raise NotImplementedError(f"GPU backend: variadic reducer {computation.name}")
        name = f"reducer_{identifier(computation.name)}" + ("_f32" if widened else "")
        writer = Writer(indent=1)
        ctx = KernelContext(writer, {}, "int", self)
        params = computation.parameters
        for n, param in enumerate(params):
            ctx.bound[id(param)] = f"p{n}"
        if widened:  # add or multiply of the two parameters (accumulates_in_f32)
            result = f"p0 {'+' if root.opcode == 'add' else '*'} p1"
            if root.operand(0) is params[1]:
                result = f"p1 {'+' if root.opcode == 'add' else '*'} p0"
        else:
            result = ctx.value(root, Index.scalar())
        signature = ", ".join(f"{compute_type(p.shape.element_type)} p{n}"
                              for n, p in enumerate(params))
        result_type = compute_type(root.shape.element_type)
        self.definitions.append(
            f"__device__ __forceinline__ {result_type} {name}({signature}) {{\n"
            + writer.text() + f"  return {result};\n}}\n")
        self._names[key] = name
        return name


def accumulates_in_f32(reduce: Instruction) -> bool:
    """Whether `reduce` is a 2-byte float sum or product that accumulates in f32 and
    rounds once at the end (`widened_reduce_op`, the CPU backend's and the evaluator's
    rule too)."""
    return widened_reduce_op(reduce) is not None


def _is_atom(expression: str) -> bool:
    """An identifier or a plain number: binding it to a variable gains nothing."""
    text = expression.lstrip("-")
    return text.replace("_", "a").replace(".", "0").isalnum() and not text[:2] == "0x"


def _element_type(inst: Instruction) -> str:
    return inst.operand(0).shape.element_type


def _unsupported(inst: Instruction, element_type: str) -> NotImplementedError:
    return NotImplementedError(f"GPU backend: {inst.opcode} of {element_type} (%{inst.name})")


def _math(element_type: str, name: str) -> str:
    """CUDA's math function `name` for the compute type (`expf` for float)."""
    return name if element_type == "f64" else name + "f"


# -- unary ---------------------------------------------------------------------------------

_FLOAT_UNARY = {"exponential": "exp", "exponential-minus-one": "expm1", "log": "log",
                "log-plus-one": "log1p", "tanh": "tanh", "sqrt": "sqrt", "rsqrt": "rsqrt",
                "cbrt": "cbrt", "erf": "erf", "floor": "floor", "ceil": "ceil",
                "round-nearest-afz": "round", "round-nearest-even": "rint", "sine": "sin",
                "cosine": "cos", "tan": "tan", "abs": "fabs"}


@register(*opcodes_in("unary"))
def emit_unary(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    x = ctx.value(inst.operand(0), index)
    element_type = _element_type(inst)
    opcode = inst.opcode
    if opcode == "copy":
        return x
    if is_float(element_type):
        ct = compute_type(element_type)
        if opcode == "is-finite":
            return f"isfinite({x})"
        if opcode == "negate":
            return f"-({x})"  # parenthesized: x may be a negative literal
        if opcode == "sign":
            return f"tl_fsign<{ct}>({x})"
        if opcode == "logistic":
            one = literal("f64" if ct == "double" else "f32", 1.0)
            expression = f"{one} / ({one} + {_math(element_type, 'exp')}(-({x})))"
        elif opcode in _FLOAT_UNARY:
            expression = f"{_math(element_type, _FLOAT_UNARY[opcode])}({x})"
        else:
            raise _unsupported(inst, element_type)
        return round_half(element_type, expression)
    return _integer_unary(inst, x, element_type)


def _integer_unary(inst: Instruction, x: str, element_type: str) -> str:
    opcode = inst.opcode
    ct = storage_type(element_type)
    if opcode == "not":
        return f"!{x}" if element_type == "pred" else f"({ct})(~{x})"
    if element_type == "pred" or opcode == "is-finite":
        raise _unsupported(inst, element_type)
    if is_identity_on_integers(opcode):
        return x
    signed = element_type in SIGNED_TYPES
    wide = _wide_unsigned(element_type)
    if opcode == "negate":
        return f"({ct})(({wide})0 - ({wide}){x})"
    if opcode == "abs":
        return f"({x} < 0 ? ({ct})(({wide})0 - ({wide}){x}) : {x})" if signed else x
    if opcode == "sign":
        return f"({ct})(({x} > 0) - ({x} < 0))" if signed else f"({ct})({x} != 0)"
    raise _unsupported(inst, element_type)


def _wide_unsigned(element_type: str) -> str:
    """The unsigned type integer arithmetic of `element_type` runs in (no signed overflow,
    no promotion to `int`)."""
    return "unsigned long long" if INTEGER_BITS[element_type] == 64 else "unsigned int"


# -- binary --------------------------------------------------------------------------------

_FLOAT_OPERATORS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
_INTEGER_WRAPPING = {"add": "+", "subtract": "-", "multiply": "*"}


@register(*opcodes_in("binary"))
def emit_binary(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    x = ctx.value(inst.operand(0), index)
    y = ctx.value(inst.operand(1), index)
    return binary_op(inst.opcode, _element_type(inst), x, y, inst)


def binary_op(opcode: str, element_type: str, x: str, y: str,
              inst: Instruction | None = None) -> str:
    """`opcode(x, y)` on two compute-type values of `element_type` (shared with `dot`)."""
    if is_float(element_type):
        ct = compute_type(element_type)
        if opcode in _FLOAT_OPERATORS:
            expression = f"{x} {_FLOAT_OPERATORS[opcode]} {y}"
        elif opcode in ("maximum", "minimum"):
            return f"tl_f{opcode[:3]}<{ct}>({x}, {y})"  # exact: no rounding needed
        elif opcode in ("power", "remainder", "atan2"):
            name = {"power": "pow", "remainder": "fmod", "atan2": "atan2"}[opcode]
            expression = f"{_math(element_type, name)}({x}, {y})"
        else:
            raise _binary_unsupported(opcode, element_type, inst)
        return round_half(element_type, expression)
    ct = storage_type(element_type)
    if opcode in ("and", "or", "xor"):
        if element_type == "pred":
            return {"and": f"({x} && {y})", "or": f"({x} || {y})", "xor": f"({x} != {y})"}[opcode]
        return f"({ct})({x} {dict(zip(('and', 'or', 'xor'), '&|^'))[opcode]} {y})"
    if opcode in ("maximum", "minimum"):
        return f"tl_{opcode[:3]}<{ct}>({x}, {y})"
    if element_type == "pred":
        raise _binary_unsupported(opcode, element_type, inst)
    signed = element_type in SIGNED_TYPES
    wide = _wide_unsigned(element_type)
    if opcode in _INTEGER_WRAPPING:
        return f"({ct})(({wide}){x} {_INTEGER_WRAPPING[opcode]} ({wide}){y})"
    if opcode in ("divide", "remainder"):
        if signed:
            lowest, _ = integer_limits(element_type)
            name = "tl_sdiv" if opcode == "divide" else "tl_srem"
            return f"{name}<{ct}>({x}, {y}, {lowest})"
        return f"tl_u{opcode[:3]}<{ct}>({x}, {y})"
    unsigned = UNSIGNED_OF.get(element_type, ct)
    bits = INTEGER_BITS[element_type]
    if opcode.startswith("shift"):
        if opcode == "shift-right-arithmetic":
            signed_type = SIGNED_OF.get(element_type, ct)
            return f"tl_shr_arithmetic<{ct}, {unsigned}, {signed_type}>({x}, {y}, {bits})"
        name = "tl_shl" if opcode == "shift-left" else "tl_shr_logical"
        return f"{name}<{ct}, {unsigned}>({x}, {y}, {bits})"
    if opcode == "power":
        return f"tl_ipow<{ct}, {unsigned}, {'true' if signed else 'false'}>({x}, {y})"
    raise _binary_unsupported(opcode, element_type, inst)


def _binary_unsupported(opcode: str, element_type: str,
                        inst: Instruction | None) -> NotImplementedError:
    where = f" (%{inst.name})" if inst is not None else ""
    return NotImplementedError(f"GPU backend: {opcode} of {element_type}{where}")


# -- compare, select, clamp, convert -------------------------------------------------------

_DIRECTIONS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


@register("compare")
def emit_compare(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    # C's float comparisons are IEEE's: ordered (false on NaN) except !=, as XLA's.
    x = ctx.value(inst.operand(0), index)
    y = ctx.value(inst.operand(1), index)
    return f"({x} {_DIRECTIONS[inst.attributes['direction']]} {y})"


@register("select")
def emit_select(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    predicate, on_true, on_false = (ctx.value(o, index) for o in inst.operands)
    return f"({predicate} ? {on_true} : {on_false})"


@register("clamp")
def emit_clamp(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    low_inst, x_inst, high_inst = inst.operands
    x = ctx.value(x_inst, index)
    low = ctx.value(low_inst, index if low_inst.shape.dims else Index.scalar())
    high = ctx.value(high_inst, index if high_inst.shape.dims else Index.scalar())
    element_type = x_inst.shape.element_type
    # XLA: min(max(x, low), high), NaN-propagating.
    return binary_op("minimum", element_type, binary_op("maximum", element_type, x, low, inst),
                     high, inst)


@register("convert")
def emit_convert(ctx: KernelContext, inst: Instruction, index: Index) -> str:
    x = ctx.value(inst.operand(0), index)
    return convert(x, _element_type(inst), inst.shape.element_type)


def convert(x: str, source: str, target: str) -> str:
    """A compute-type value of `source` converted to the compute type of `target`."""
    if source == target:
        return x
    if target == "pred":
        return f"({x} != 0)"  # NaN is true
    target_type = compute_type(target)
    if is_float(source) and not is_float(target):
        lowest, highest = integer_limits(target)
        return f"tl_f2i<{target_type}>((double){x}, {lowest}, {highest})"
    if target in HALF_TYPES:
        # Round once, from the source's own value (no double rounding through float).
        half = "half" if target == "f16" else "bfloat16"
        if source == "f64":
            return f"__{half}2float(__double2{half}({x}))"
        return round_half(target, f"(float){x}")
    return f"({target_type}){x}"
