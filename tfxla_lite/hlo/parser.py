"""XLA's HLO text format, parsed into the IR: the inverse of `printer.py`.

Reads what TF's XLA prints (`experimental_get_compiler_ir(...)(stage='hlo')` and
`stage='optimized_hlo'`, `--xla_dump_to` text files) and what `printer.py` writes,
so HLO can enter the compiler core from a file (the CLI's `opt` and `run-hlo`)
and the printer is checked by round trips. The grammar follows
`xla/hlo/parser/hlo_parser.cc`:

    module      := 'HloModule' name (',' key '=' value)* (table | computation)*
    table       := ('FileNames' | 'FunctionNames' | 'FileLocations' | 'StackFrames') entry*
    computation := ['ENTRY'] name [signature] '{' instruction* '}'
    instruction := ['ROOT'] name '=' shape opcode '(' operands ')' (',' key '=' value)*
    operand     := [shape] name            (long form `f32[2]{0} %x` or short `%x`)
    shape       := type '[' dims ']' [layout] | '(' shape, ... ')'

Where XLA's text carries more than the IR holds, docs/hlo_text.md says what becomes of
each piece: layouts are read and dropped (a `bitcast` between non-default layouts becomes
the row-major transpose, reshape and transpose that read the same bytes), attributes the
IR has no meaning for are kept verbatim as `RawAttribute`s, unknown opcodes parse into
instructions the verifier refuses, and elided constants, exotic element types and
unbounded dynamic dimensions (`f32[?]`) are refused; bounded ones (`f32[<=8]`) are read.

Every malformed input raises `ParseError` (a `ValueError`) with the line, the
column and the offending text under a caret; nothing else escapes the parser.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfxla_lite.hlo.attributes import parse_padding, parse_window
from tfxla_lite.hlo.convolution import parse_dim_labels
from tfxla_lite.hlo.hlo_scanner import INTEGER as _INTEGER
from tfxla_lite.hlo.hlo_scanner import SPACE as _SPACE
from tfxla_lite.hlo.hlo_scanner import ParseError
from tfxla_lite.hlo.hlo_scanner import Scanner as _Scanner
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.printer import RawAttribute
from tfxla_lite.hlo.shape import FLOAT_TYPES, INTEGER_TYPES, Shape, numpy_dtype
from tfxla_lite.hlo.stack_frames import SECTIONS, StackFrameIndex, parse_tables

# Deeper nesting of tuple shapes or literals than this is rejected, not recursed into.
MAX_NESTING = 64
# `fill_elided_constants` allocates zeros for at most this many elements per constant.
MAX_FILLED_ELEMENTS = 1 << 26

_NUMBER = re.compile(r"[-+]?(?:inf|nan(?:\(0x[0-9a-fA-F]+\))?"
                     r"|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_SHAPE_START = re.compile(r"\(|[a-z][a-z0-9]*\[")
_METADATA_WORD = re.compile(r"[^\s}]+")
_INSTRUCTION_START = re.compile(r"(?:ROOT\s+)?%?[A-Za-z_](?:[A-Za-z0-9_.]|-(?!>))*\s*=")
# A layout's memory space (`S(1)`): where a buffer lives, not how its bytes are ordered.
_MEMORY_SPACE = re.compile(r"S\(\d+\)")

_INT_LIST_ATTRIBUTES = frozenset({"dimensions", "lhs_batch_dims", "lhs_contracting_dims",
                                  "rhs_batch_dims", "rhs_contracting_dims", "offset_dims",
                                  "collapsed_slice_dims", "start_index_map", "slice_sizes",
                                  "operand_batching_dims", "start_indices_batching_dims",
                                  "dynamic_slice_sizes", "update_window_dims",
                                  "inserted_window_dims", "scatter_dims_to_operand_dims",
                                  "input_batching_dims", "scatter_indices_batching_dims"})
_INT_ATTRIBUTES = frozenset({"index", "iota_dimension", "index_vector_dim",
                             "feature_group_count", "batch_group_count", "k",
                             "exponent_bits", "mantissa_bits"})
# Attributes naming called computations, in the order `called_computations` keeps them.
_CALLED_ROLES = ("to_apply", "calls", "condition", "body", "true_computation",
                 "false_computation", "branch_computations")
_WORD_ATTRIBUTES = frozenset({"direction", "kind", "transpose_a", "algorithm"})
_BOOL_ATTRIBUTES = frozenset({"is_stable", "largest", "lower", "left_side", "unit_diagonal"})
# Metadata values that are integers; the others keep their text (quoted or not).
_METADATA_INTEGERS = frozenset({"source_line", "source_end_line", "source_column",
                                "source_end_column", "stack_frame_id"})


@dataclass
class _Operand:
    name: str
    shape: Shape | None
    position: int


@dataclass
class _Statement:
    """One instruction as written, before names are resolved."""

    name: str
    position: int
    is_root: bool
    shape: Shape
    layout: tuple[int, ...] | None
    tiling: str  # a layout's physical part after ':' (tiles, element size), memory space out
    opcode: str
    operands: list[_Operand] = field(default_factory=list)
    attributes: dict[str, Any] = field(default_factory=dict)
    called: list[tuple[str, int]] = field(default_factory=list)
    called_roles: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class _ComputationText:
    name: str
    position: int
    is_entry: bool
    statements: list[_Statement]
    attributes: dict[str, str] = field(default_factory=dict)


class _Parser:
    def __init__(self, text: str, fill_elided_constants: bool) -> None:
        self.scanner = _Scanner(text)
        self.text = text
        self.fill_elided_constants = fill_elided_constants

    def error(self, message: str, position: int | None = None) -> ParseError:
        return self.scanner.error(message, position)

    # -- module and computations ---------------------------------------------------------
    def module(self) -> HloModule:
        s = self.scanner
        if s.peek_word() != "HloModule":
            raise self.error("expected 'HloModule' at the start of the module")
        s.name()
        name = s.name("the module name")
        attributes: dict[str, str] = {}
        while s.accept(","):
            at = s.skip()
            key = s.name("a module attribute")
            s.expect("=", f"'=' after module attribute {key}")
            if key in attributes:
                raise self.error(f"module attribute {key} given twice", at)
            attributes[key] = s.raw_value()
        computations = []
        tables = StackFrameIndex()
        sections: set[str] = set()
        while s.skip() < len(self.text):
            if s.peek_word() in SECTIONS:  # before the computations, or after in old dumps
                parse_tables(s, tables, sections)
            else:
                computations.append(self.computation())
        if not computations:
            raise self.error("expected a computation")
        problem = tables.check()
        if problem:
            raise self.error(f"stack-frame tables: {problem}", 0)
        module = _Builder(self.text).build(name, computations)
        module.attributes = attributes
        if sections:
            module.stack_frames = tables
        self.check_frame_ids(computations, tables if sections else None)
        return module

    def check_frame_ids(self, computations: list[_ComputationText],
                        tables: StackFrameIndex | None) -> None:
        """A `stack_frame_id` must name a frame of the module's tables, when it has them."""
        if tables is None:
            return
        for computation in computations:
            for statement in computation.statements:
                frame = statement.metadata.get("stack_frame_id")
                if frame is not None and not 0 <= frame <= len(tables.frames):
                    raise self.error(f"stack_frame_id={frame} is not a frame of the "
                                     f"StackFrames table (1..{len(tables.frames)})",
                                     statement.position)

    def computation(self) -> _ComputationText:
        s = self.scanner
        is_entry = s.peek_word() == "ENTRY"
        if is_entry:
            s.name()
        position = s.skip()
        name = s.name("a computation name")
        if s.accept("("):  # the signature; the parameters' own shapes are what count
            if not s.accept(")"):
                while True:
                    s.name("a parameter name")
                    s.expect(":")
                    self.shape()
                    if s.accept(")"):
                        break
                    s.expect(",", "',' or ')'")
            s.expect("->")
            self.shape()
        s.expect("{")
        statements = []
        while not s.accept("}"):
            if s.skip() >= len(self.text):
                raise self.error(f"expected '}}' closing computation %{name}")
            if statements and not _INSTRUCTION_START.match(self.text, s.pos):
                raise self.error("expected an attribute or the next instruction")
            statements.append(self.instruction())
        if not statements:
            raise self.error(f"computation %{name} has no instructions", position)
        attributes: dict[str, str] = {}
        while s.accept(","):  # e.g. execution_thread="main"
            at = s.skip()
            key = s.name("a computation attribute")
            s.expect("=", f"'=' after computation attribute {key}")
            if key in attributes:
                raise self.error(f"computation attribute {key} given twice", at)
            attributes[key] = s.raw_value()
        return _ComputationText(name, position, is_entry, statements, attributes)

    # -- shapes ----------------------------------------------------------------------------
    def shape(self, depth: int = 0) -> tuple[Shape, tuple[int, ...] | None, str]:
        """A shape and, for arrays, its layout (minor-to-major; None when not written) and
        the layout's tiling text ('' when none)."""
        s = self.scanner
        if depth > MAX_NESTING:
            raise self.error("tuple shapes nest too deeply")
        start = s.skip()
        if s.accept("("):
            elements = []
            if not s.accept(")"):
                while True:
                    elements.append(self.shape(depth + 1)[0])
                    if s.accept(")"):
                        break
                    s.expect(",", "',' or ')' in a tuple shape")
            return Shape.tuple_of(elements), None, ""
        match = s.match(re.compile(r"([a-z][a-z0-9]*)\["))
        if not match:
            raise self.error("expected a shape")
        element_type = match.group(1)
        dims: list[int] = []
        dynamic: list[bool] = []
        if not s.accept("]"):
            while True:
                if s.peek("?"):
                    raise self.error("not supported: unbounded dynamic dimensions")
                dynamic.append(s.accept("<="))
                dims.append(s.integer("a dimension size"))
                if s.accept("]"):
                    break
                s.expect(",", "',' or ']' in a shape")
        if len(dims) > MAX_NESTING:
            raise ParseError(f"rank {len(dims)} is over {MAX_NESTING}", self.text, start)
        layout, tiling = self.layout(len(dims)) if self._layout_follows() else (None, "")
        try:
            shape = Shape(element_type, tuple(dims), None, tuple(dynamic))
        except ValueError as error:
            raise ParseError(f"not supported: {error}", self.text, start) from None
        return shape, layout, tiling

    def _layout_follows(self) -> bool:
        # `{` after a shape opens a layout, unless it opens a computation's body.
        s = self.scanner
        if not s.peek("{"):
            return False
        after = _SPACE.match(self.text, s.pos + 1)
        at = after.end() if after else s.pos + 1
        return at < len(self.text) and (self.text[at].isdigit() or self.text[at] in "}:")

    def layout(self, rank: int) -> tuple[tuple[int, ...] | None, str]:
        """Minor-to-major order, and the physical part after ':' (`T(8,128)(2,1)`,
        `E(4)`, ...) with the memory space `S(n)` taken out."""
        s = self.scanner
        start = s.skip()
        s.expect("{")
        order: list[int] = []
        while not s.peek("}") and not s.peek(":"):
            order.append(s.integer("a layout dimension"))
            if not s.accept(","):
                break
        tiling = ""
        if s.accept(":"):
            depth = 0
            begin = s.pos
            while s.pos < len(self.text) and (depth or self.text[s.pos] != "}"):
                if self.text[s.pos] in "\n{":
                    raise self.error("expected '}' closing a layout", s.pos)
                depth += {"(": 1, ")": -1}.get(self.text[s.pos], 0)
                s.pos += 1
            tiling = _MEMORY_SPACE.sub("", self.text[begin:s.pos]).strip()
        s.expect("}", "'}' closing a layout")
        if rank and sorted(order) != list(range(rank)):
            raise ParseError(f"layout {{{','.join(map(str, order))}}} is not a permutation "
                             f"of {rank} dimensions", self.text, start)
        return (tuple(order) if rank else None), tiling

    # -- instructions ----------------------------------------------------------------------
    def instruction(self) -> _Statement:
        s = self.scanner
        is_root = s.peek_word() == "ROOT"
        if is_root:
            s.name()
        position = s.skip()
        name = s.name("an instruction name")
        s.expect("=")
        shape, layout, tiling = self.shape()
        opcode = s.name("an opcode")
        statement = _Statement(name, position, is_root, shape, layout, tiling, opcode)
        s.expect("(", "'(' after the opcode")
        if opcode == "parameter":
            statement.attributes["parameter_number"] = s.integer("a parameter number")
            s.expect(")")
        elif opcode == "constant":
            statement.attributes["literal"] = self.literal(shape)
            s.expect(")", "')' after the literal")
        elif not s.accept(")"):
            while True:
                statement.operands.append(self.operand())
                if s.accept(")"):
                    break
                s.expect(",", "',' or ')' between operands")
        while s.accept(","):
            self.attribute(statement)
        self.check_called_roles(statement)
        if len(set(statement.called_roles)) > 1:  # e.g. body= before condition=
            order = sorted(range(len(statement.called)),
                           key=lambda n: _CALLED_ROLES.index(statement.called_roles[n]))
            statement.called = [statement.called[n] for n in order]
            statement.called_roles = [statement.called_roles[n] for n in order]
        return statement

    def check_called_roles(self, statement: _Statement) -> None:
        """The IR keeps the called computations without their attribute names, and the
        printer names them by the opcode: so each opcode takes only the combination
        XLA's parser takes for it, the one the printer writes back (a fusion with
        `calls=` and `to_apply=` printed as `calls=%a, %b`, which no parser reads)."""
        roles = set(statement.called_roles)
        if not roles:
            return
        opcode = statement.opcode
        if opcode == "fusion":
            allowed = [{"calls"}]
        elif opcode == "while":
            allowed = [{"condition", "body"}]
        elif opcode == "conditional":
            allowed = [{"true_computation", "false_computation"}, {"branch_computations"}]
        else:
            allowed = [{"to_apply"}]
        if roles not in allowed:
            expected = " or ".join(" and ".join(f"{r}=" for r in _ordered(a)) for a in allowed)
            found = ", ".join(f"{r}=" for r in _ordered(roles))
            raise self.error(f"{opcode} names the computations it calls with {expected}; "
                             f"found {found}", statement.position)

    def operand(self) -> _Operand:
        s = self.scanner
        declared = None
        s.skip()
        if _SHAPE_START.match(self.text, s.pos):
            declared = self.shape()[0]
        position = s.skip()
        return _Operand(s.name("an operand name"), declared, position)

    def attribute(self, statement: _Statement) -> None:
        s = self.scanner
        position = s.skip()
        key = s.name("an attribute name")
        s.expect("=", f"'=' after attribute {key}")
        if key in statement.attributes or (key == "metadata" and statement.metadata) or \
                key in statement.called_roles:
            raise self.error(f"attribute {key} given twice", position)
        if key in _INT_LIST_ATTRIBUTES:
            statement.attributes[key] = self.int_list()
        elif key in _INT_ATTRIBUTES:
            statement.attributes[key] = s.integer(f"an integer for {key}")
        elif key in _WORD_ATTRIBUTES:
            statement.attributes[key] = s.name(f"a value for {key}")
        elif key in _BOOL_ATTRIBUTES:
            at = s.skip()
            word = s.name(f"true or false for {key}")
            if word not in ("true", "false"):
                raise self.error(f"{key} is true or false, got {word}", at)
            statement.attributes[key] = word == "true"
        elif key == "slice":
            statement.attributes[key] = self.slice_spec()
        elif key == "metadata":
            statement.metadata = self.metadata()
        elif key == "padding":
            statement.attributes[key] = self.structured(parse_padding)
        elif key == "window":
            statement.attributes[key] = self.structured(parse_window)
        elif key == "dim_labels":
            statement.attributes[key] = self.structured(parse_dim_labels)
        elif key == "branch_computations":
            s.expect("{", "'{' opening a list of computations")
            while True:
                at = s.skip()
                statement.called.append((s.name("a computation name"), at))
                statement.called_roles.append(key)
                if s.accept("}"):
                    break
                s.expect(",", "',' or '}' in a list of computations")
        elif key in _CALLED_ROLES and (key != "calls" or statement.opcode == "fusion"):
            at = s.skip()
            statement.called.append((s.name("a computation name"), at))
            statement.called_roles.append(key)
        else:
            statement.attributes[key] = RawAttribute(s.raw_value())

    def structured(self, parse: Any) -> Any:
        """An attribute value read as text, then by `parse` (a PaddingConfig or Window)."""
        start = self.scanner.skip()
        try:
            return parse(self.scanner.raw_value())
        except ValueError as error:
            raise ParseError(str(error), self.text, start) from None

    def int_list(self) -> tuple[int, ...]:
        s = self.scanner
        s.expect("{", "'{' opening a list of integers")
        values: list[int] = []
        if not s.accept("}"):
            while True:
                values.append(s.integer())
                if s.accept("}"):
                    break
                s.expect(",", "',' or '}' in a list of integers")
        return tuple(values)

    def slice_spec(self) -> tuple[tuple[int, int, int], ...]:
        s = self.scanner
        s.expect("{", "'{' opening a slice")
        spec = []
        if not s.accept("}"):
            while True:
                s.expect("[", "'[' opening a slice dimension")
                start = s.integer("a slice start")
                s.expect(":")
                limit = s.integer("a slice limit")
                stride = s.integer("a slice stride") if s.accept(":") else 1
                s.expect("]", "']' closing a slice dimension")
                spec.append((start, limit, stride))
                if s.accept("}"):
                    break
                s.expect(",", "',' or '}' in a slice")
        return tuple(spec)

    def metadata(self) -> dict[str, Any]:
        s = self.scanner
        s.expect("{", "'{' opening metadata")
        metadata: dict[str, Any] = {}
        while not s.accept("}"):
            key = s.name("a metadata key")
            s.expect("=")
            quoted = s.peek('"')
            if quoted:
                value: Any = s.string()
            elif s.peek("{"):
                value = s.braced()
            else:
                word = s.match(_METADATA_WORD)
                if not word:
                    raise self.error(f"expected a value for metadata {key}")
                value = word.group(0)
            if key in _METADATA_INTEGERS:
                if not re.fullmatch(r"-?\d+", str(value)):
                    raise self.error(f"{key} must be an integer")
                value = int(value)
            elif not quoted:
                value = RawAttribute(value)  # an unquoted word or {...}: printed as written
            if key in metadata:
                raise self.error(f"metadata {key} given twice")
            metadata[key] = value
        return metadata

    # -- literals --------------------------------------------------------------------------
    def literal(self, shape: Shape) -> np.ndarray:
        s = self.scanner
        start = s.skip()
        if shape.is_tuple:
            raise self.error("tuple-shaped constants are not supported")
        if s.accept("{...}"):
            if not self.fill_elided_constants:
                raise ParseError("the constant's values were elided as {...}; print the "
                                 "module with large constants, or parse with "
                                 "fill_elided_constants=True for zeros", self.text, start)
            if math.prod(shape.dims) > MAX_FILLED_ELEMENTS:
                raise ParseError(f"elided constant of {shape} is too large to fill", self.text,
                                 start)
            array = np.zeros(shape.dims, dtype=shape.numpy_dtype)
        elif shape.rank == 0:
            array = self._array([self.scalar()], shape, start).reshape(())
        else:
            values: list[tuple[str, int]] = []
            self._nested(shape.dims, values, 0)
            array = self._array(values, shape, start).reshape(shape.dims)
        array.setflags(write=False)
        return array

    def scalar(self) -> tuple[str, int]:
        s = self.scanner
        position = s.skip()
        match = s.match(_NUMBER) or s.match(re.compile(r"true|false"))
        if not match:
            raise self.error("expected a number, true or false")
        return match.group(0), position

    def _nested(self, dims: tuple[int, ...], values: list[tuple[str, int]], level: int) -> None:
        s = self.scanner
        start = s.skip()
        s.expect("{", f"'{{' opening dimension {level} of the literal")
        count = 0
        if not s.accept("}"):
            while True:
                if level + 1 < len(dims):
                    self._nested(dims, values, level + 1)
                else:
                    values.append(self.scalar())
                count += 1
                if s.accept("}"):
                    break
                s.expect(",", "',' or '}' in the literal")
        if count != dims[level]:
            raise ParseError(f"literal has {count} elements in dimension {level}, the shape "
                             f"says {dims[level]}", self.text, start)

    def _array(self, values: list[tuple[str, int]], shape: Shape, start: int) -> np.ndarray:
        element_type = shape.element_type
        dtype = numpy_dtype(element_type)
        if element_type == "pred":
            bits = []
            for text, position in values:
                if text not in ("true", "false", "0", "1"):
                    raise ParseError(f"{text!r} is not a pred value", self.text, position)
                bits.append(text in ("true", "1"))
            return np.array(bits, dtype=np.bool_)
        if element_type in FLOAT_TYPES:
            floats = []
            for text, position in values:
                if text in ("true", "false"):
                    raise ParseError(f"{text!r} is not a {element_type} value", self.text,
                                     position)
                value = float(text.split("(")[0])
                floats.append(-abs(value) if text.startswith("-") else value)
            with np.errstate(over="ignore"):
                return np.array(floats, dtype=np.float64).astype(dtype)
        assert element_type in INTEGER_TYPES
        info = np.iinfo(dtype)
        ints = []
        for text, position in values:
            if not _INTEGER.fullmatch(text):
                raise ParseError(f"{text!r} is not an {element_type} value", self.text, position)
            value = int(text)
            if not info.min <= value <= info.max:
                raise ParseError(f"{value} is out of range for {element_type}", self.text,
                                 position)
            ints.append(value)
        return np.array(ints, dtype=dtype)


class _Builder:
    """Resolves names and builds the IR from the parsed statements."""

    def __init__(self, text: str) -> None:
        self.text = text

    def error(self, message: str, position: int) -> ParseError:
        return ParseError(message, self.text, position)

    def build(self, name: str, texts: list[_ComputationText]) -> HloModule:
        module = HloModule(name)
        computations: dict[str, Computation] = {}
        entries = [t for t in texts if t.is_entry]
        if len(entries) > 1:
            raise self.error("more than one ENTRY computation", entries[1].position)
        entry_text = entries[0] if entries else texts[-1]
        for text in texts:
            if text.name in computations:
                raise self.error(f"computation %{text.name} is defined twice", text.position)
            computations[text.name] = module.new_computation(text.name,
                                                             entry=text is entry_text)
            computations[text.name].attributes = dict(text.attributes)
        for text in texts:
            self.fill(computations[text.name], text, computations)
        self.check_call_graph(texts, computations)
        return module

    def check_call_graph(self, texts: list[_ComputationText],
                         computations: dict[str, Computation]) -> None:
        """HLO has no recursion (XLA refuses a computation that calls itself, directly or
        not); the printer's callees-first order would not even be defined for it."""
        state: dict[str, int] = {}  # 1: on the path, 2: done
        for text in texts:
            if text.name in state:
                continue
            stack = [(computations[text.name], _callees(computations[text.name]))]
            state[text.name] = 1
            while stack:
                comp, callees = stack[-1]
                callee = next((c for c in callees if state.get(c.name) != 2), None)
                if callee is None:
                    stack.pop()
                    state[comp.name] = 2
                elif state.get(callee.name) == 1:
                    position = next(t.position for t in texts if t.name == comp.name)
                    raise self.error(f"computation %{comp.name} calls %{callee.name}, which "
                                     f"calls it back (HLO has no recursion)", position)
                else:
                    state[callee.name] = 1
                    stack.append((callee, _callees(callee)))

    def fill(self, comp: Computation, text: _ComputationText,
             computations: dict[str, Computation]) -> None:
        statements: dict[str, _Statement] = {}
        for statement in text.statements:
            if statement.name in statements:
                raise self.error(f"instruction %{statement.name} is defined twice in "
                                 f"%{text.name}", statement.position)
            statements[statement.name] = statement
        roots = [st for st in text.statements if st.is_root]
        if len(roots) > 1:
            raise self.error(f"computation %{text.name} has more than one ROOT",
                             roots[1].position)
        numbers: dict[int, _Statement] = {}
        for statement in text.statements:
            if statement.opcode == "parameter":
                number = statement.attributes["parameter_number"]
                if number in numbers:
                    raise self.error(f"parameter {number} is defined twice", statement.position)
                numbers[number] = statement
        if sorted(numbers) != list(range(len(numbers))):
            raise self.error(f"parameters of %{text.name} are numbered {sorted(numbers)}, "
                             f"not 0..{len(numbers) - 1}", text.position)
        built: dict[str, Instruction] = {}
        layouts: dict[int, _Layout] = {}
        for statement in self.topological_order(text, statements):
            inst = self.instruction(comp, statement, built, layouts, computations)
            built[statement.name] = inst
        root_statement = roots[0] if roots else text.statements[-1]
        comp.root = built[root_statement.name]

    def topological_order(self, text: _ComputationText,
                          statements: dict[str, _Statement]) -> list[_Statement]:
        """Operands before users, text order otherwise (XLA allows uses before definitions)."""
        state: dict[str, int] = {}  # 1: on the stack, 2: placed
        order: list[_Statement] = []
        for first in text.statements:
            if state.get(first.name):
                continue
            stack = [(first, iter(first.operands))]
            state[first.name] = 1
            while stack:
                statement, operands = stack[-1]
                for operand in operands:
                    if operand.name not in statements:
                        raise self.error(f"operand %{operand.name} is not defined in "
                                         f"%{text.name}", operand.position)
                    seen = state.get(operand.name)
                    if seen == 1:
                        raise self.error(f"%{operand.name} depends on itself (a cycle)",
                                         operand.position)
                    if seen is None:
                        child = statements[operand.name]
                        state[child.name] = 1
                        stack.append((child, iter(child.operands)))
                        break
                else:
                    stack.pop()
                    state[statement.name] = 2
                    order.append(statement)
        return order

    def instruction(self, comp: Computation, statement: _Statement,
                    built: dict[str, Instruction], layouts: dict[int, _Layout],
                    computations: dict[str, Computation]) -> Instruction:
        operands = []
        for operand in statement.operands:
            inst = built[operand.name]
            if operand.shape is not None and operand.shape != inst.shape:
                raise self.error(f"operand %{operand.name} is written as {operand.shape} but "
                                 f"is {inst.shape}", operand.position)
            operands.append(inst)
        called = []
        for callee, position in statement.called:
            if callee not in computations:
                raise self.error(f"computation %{callee} is not defined", position)
            called.append(computations[callee])
        if "true_computation" in statement.called_roles and not (
                operands and not operands[0].shape.is_tuple
                and operands[0].shape.element_type == "pred"):
            raise self.error("a conditional with true_computation= takes a pred selector "
                             "first (else branch_computations=)", statement.position)
        if statement.opcode == "fusion":
            for callee_computation in called:
                callee_computation.is_fusion_computation = True
        if statement.opcode == "bitcast" and len(operands) == 1 and not statement.shape.is_tuple \
                and not operands[0].shape.is_tuple:
            source_layout, source_tiling = layouts.get(id(operands[0]), (None, ""))
            if source_tiling or statement.tiling:
                self.check_tiled_bitcast(statement, operands[0], source_layout, source_tiling)
            elif not (_is_default(source_layout) and _is_default(statement.layout)):
                result = self.row_major_bitcast(comp, statement, operands[0], source_layout)
                layouts[id(result)] = (None, "")
                return result
        inst = Instruction(statement.opcode, statement.shape, operands, statement.attributes,
                           called, statement.name, statement.metadata)
        _append(comp, inst)
        layouts[id(inst)] = (statement.layout, statement.tiling)
        return inst

    def check_tiled_bitcast(self, statement: _Statement, operand: Instruction,
                            source_layout: tuple[int, ...] | None, source_tiling: str) -> None:
        """Tiles reorder a buffer's bytes in a way a row-major IR cannot express; a bitcast
        keeps its meaning only when it changes nothing but the memory space."""
        rank = statement.shape.rank
        if operand.shape == statement.shape and source_tiling == statement.tiling and \
                _major_to_minor(source_layout, rank) == _major_to_minor(statement.layout, rank):
            return
        if operand.shape.num_elements <= 1 and statement.shape.num_elements <= 1:
            return  # one element has one order (the shape checks see to the rest)
        raise self.error(f"not supported: bitcast between tiled layouts ({operand.shape} "
                         f"tiled {source_tiling or 'none'} to {statement.shape} tiled "
                         f"{statement.tiling or 'none'}): tiles reorder the bytes, and the IR "
                         f"is row-major", statement.position)

    def row_major_bitcast(self, comp: Computation, statement: _Statement, operand: Instruction,
                          source_layout: tuple[int, ...] | None) -> Instruction:
        """A bitcast between layouts as transposes around a row-major reshape: lay the
        operand out in its physical (major-to-minor) order, regroup the bytes into the
        result's physical dims, then read them back in the result's logical order."""
        shape = statement.shape
        if operand.shape.num_elements != shape.num_elements or \
                operand.shape.element_type != shape.element_type:
            raise self.error(f"bitcast of {operand.shape} cannot give {shape}",
                             statement.position)
        source_order = _major_to_minor(source_layout, operand.shape.rank)
        target_order = _major_to_minor(statement.layout, shape.rank)
        value = operand
        metadata = statement.metadata
        if source_order != tuple(range(operand.shape.rank)):
            dims = tuple(operand.shape.dims[d] for d in source_order)
            value = Instruction("transpose", operand.shape.with_dims(dims), [value],
                                {"dimensions": source_order}, (),
                                f"{statement.name}.physical", metadata)
            _append(comp, value)
        physical = shape.with_dims(tuple(shape.dims[d] for d in target_order))
        back = tuple(target_order.index(d) for d in range(shape.rank))
        if back == tuple(range(shape.rank)):
            result = Instruction("bitcast", shape, [value], {}, (), statement.name, metadata)
            _append(comp, result)
            return result
        value = Instruction("reshape", physical, [value], {}, (), f"{statement.name}.regroup",
                            metadata)
        _append(comp, value)
        result = Instruction("transpose", shape, [value], {"dimensions": back}, (),
                             statement.name, metadata)
        _append(comp, result)
        return result


_Layout = tuple[tuple[int, ...] | None, str]  # minor-to-major order, tiling text


def _callees(comp: Computation) -> Iterator[Computation]:
    return (c for inst in comp.instructions for c in inst.called_computations)


def _ordered(roles: set[str]) -> list[str]:
    return sorted(roles, key=_CALLED_ROLES.index)


def _is_default(layout: tuple[int, ...] | None) -> bool:
    return layout is None or layout == tuple(reversed(range(len(layout))))


def _major_to_minor(layout: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    return tuple(range(rank)) if layout is None else tuple(reversed(layout))


def _append(comp: Computation, inst: Instruction) -> None:
    # `add` places an instruction right after its last operand; the parser keeps the
    # text's order instead (operands are already in, so the end is a valid place).
    comp.add(inst)
    comp.instructions.remove(inst)
    comp.instructions.append(inst)


def parse_module(text: str, fill_elided_constants: bool = False) -> HloModule:
    """Parse HLO text (XLA's or `printer.py`'s) into an `HloModule`.

    Raises `ParseError` for malformed text. The result is not verified: unknown
    opcodes parse, and `tfxla_lite.hlo.verifier.verify` reports them.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_module takes a str, got {type(text).__name__}")
    return _Parser(text, fill_elided_constants).module()
