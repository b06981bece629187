"""An HloModule printed as StableHLO: MLIR text in the `stablehlo` dialect, for other tools.

Beside `printer.py`, one of the ways out of the IR (the CLI's `export-stablehlo`, the
'stablehlo' stage of `experimental_get_compiler_ir`). Every op is in MLIR's generic form,
which any parser of the dialect reads; tuples are flattened, called computations become
regions or are inlined, constants are hex literals (NaN payloads survive). What each
opcode becomes, and what raises `StableHloError`: docs/hlo_text.md, "StableHLO out".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from tfxla_lite.hlo.bit_ops import reduce_precision_bits
from tfxla_lite.hlo.convolution import group_counts
from tfxla_lite.hlo.dynamic_padder import has_dynamic_shapes
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import opcodes_in
from tfxla_lite.hlo.random_bits import algorithm_of
from tfxla_lite.hlo.shape import FLOAT_TYPES, SIGNED_TYPES, Shape


class StableHloError(ValueError):
    """An HLO module, or one of its opcodes, that the StableHLO export cannot write."""


# HLO opcodes that are one StableHLO op of the same operands (element-wise, mostly); erf
# is CHLO's (`_erf`) and copy forwards its operand.
_SAME_OPERANDS = {
    **{name: name.replace("-", "_") for name in (
        *opcodes_in("unary", "binary"), "select", "clamp", "convert", "bitcast-convert")
       if name not in ("erf", "copy")},
    "reshape": "reshape", "bitcast": "reshape",
}
_RNG_ALGORITHMS = {"rng_default": "DEFAULT", "rng_philox": "PHILOX",
                   "rng_three_fry": "THREE_FRY"}


def element_type(name: str) -> str:
    if name == "pred":
        return "i1"
    if name in FLOAT_TYPES:
        return name
    return ("i" if name in SIGNED_TYPES else "ui") + name[1:]


def leaves(shape: Shape) -> list[Shape]:
    """The arrays of `shape`, tuples flattened depth first."""
    if shape.tuple_shapes is None:
        return [shape]
    return [leaf for element in shape.tuple_shapes for leaf in leaves(element)]


def tensor_type(shape: Shape) -> str:
    if shape.is_tuple:
        raise StableHloError(f"a tuple {shape} where StableHLO takes a tensor")
    dims = "".join(f"{d}x" for d in shape.dims)
    return f"tensor<{dims}{element_type(shape.element_type)}>"


def _i64_array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if len(values) else "") \
        + ">"


def _list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def _bool(value: Any) -> str:
    return "true" if bool(value) else "false"


def dense_literal(array: np.ndarray, shape: Shape) -> str:
    """`dense<...> : tensor<...>` holding `array` exactly."""
    typ = tensor_type(shape)
    array = np.ascontiguousarray(array)
    if shape.element_type == "pred":
        flat = ", ".join(_bool(v) for v in array.reshape(-1))
        if array.size == 1:
            return f"dense<{flat}> : {typ}"
        if array.size == 0:
            return f"dense<> : {typ}"
        return f"dense<{_nested(array)}> : {typ}"
    if array.size == 0:
        return f"dense<> : {typ}"
    data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
    chunks = np.frombuffer(data, np.uint8).reshape(array.size, array.itemsize)
    if (chunks == chunks[0]).all():
        data = data[:array.itemsize]  # a splat: one element's bytes
    return f'dense<"0x{data.hex().upper()}"> : {typ}'


def _nested(array: np.ndarray) -> str:
    if array.ndim == 0:
        return _bool(array)
    return "[" + ", ".join(_nested(a) for a in array) + "]"


class _Writer:
    """Names values and writes ops; one per module, so names are unique in it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"%v{self.count}"

    def op(self, indent: str, name: str, operands: Sequence[str], operand_types: Sequence[str],
           result_types: Sequence[str], properties: str = "", regions: Sequence[str] = ()
           ) -> list[str]:
        """Write one op in generic form; its result names (one per result type)."""
        if result_types:
            base = self.fresh()
            results = [base] if len(result_types) == 1 else \
                [f"{base}#{k}" for k in range(len(result_types))]
            head = base if len(result_types) == 1 else f"{base}:{len(result_types)}"
            prefix = f"{head} = "
        else:
            results, prefix = [], ""
        props = f" <{{{properties}}}>" if properties else ""
        region_text = f" ({', '.join(regions)})" if regions else ""
        produced = result_types[0] if len(result_types) == 1 else \
            f"({', '.join(result_types)})"
        self.lines.append(f'{indent}{prefix}"{name}"({", ".join(operands)}){props}'
                          f"{region_text} : ({', '.join(operand_types)}) -> {produced}")
        return results


class _Exporter:
    def __init__(self) -> None:
        self.writer = _Writer()

    # -- computations -------------------------------------------------------------------
    def body(self, computation: Computation, parameter_values: list[list[str]], indent: str
             ) -> list[str]:
        """Write `computation`'s instructions with its parameters bound to the given flat
        values; the flat values of its root."""
        values: dict[int, list[str]] = {}
        for inst in computation.instructions:
            if inst.opcode == "parameter":
                values[id(inst)] = parameter_values[inst.parameter_number]
            else:
                values[id(inst)] = self.instruction(inst, [values[id(o)] for o in inst.operands],
                                                    indent)
        assert computation.root is not None
        return values[id(computation.root)]

    def region(self, computation: Computation, indent: str,
               outer: list[list[str]] | None = None) -> str:
        """`{ ^bb0(args): ... stablehlo.return }` of `computation`: its parameters are the
        block's arguments, or, with `outer`, values from the enclosing region (if/case
        branches take no arguments)."""
        saved = self.writer.lines
        self.writer.lines = []
        inner = indent + "  "
        header = ""
        if outer is None:
            parameters: list[list[str]] = []
            arguments = []
            for parameter in sorted(computation.parameters, key=lambda p: p.parameter_number):
                names = []
                for leaf in leaves(parameter.shape):
                    name = self.writer.fresh()
                    names.append(name)
                    arguments.append(f"{name}: {tensor_type(leaf)}")
                parameters.append(names)
            header = f"{indent}^bb0({', '.join(arguments)}):\n"
        else:
            parameters = outer
        results = self.body(computation, parameters, inner)
        assert computation.root is not None
        types = [tensor_type(leaf) for leaf in leaves(computation.root.shape)]
        self.writer.op(inner, "stablehlo.return", results, types, [])
        text = "{\n" + header + "\n".join(self.writer.lines) + f"\n{indent}}}"
        self.writer.lines = saved
        return text

    # -- instructions -------------------------------------------------------------------
    def instruction(self, inst: Instruction, operands: list[list[str]], indent: str
                    ) -> list[str]:
        opcode = inst.opcode
        if opcode == "tuple":
            return [name for values in operands for name in values]
        if opcode == "get-tuple-element":
            assert inst.operand(0).shape.tuple_shapes is not None
            elements = inst.operand(0).shape.tuple_shapes
            start = sum(len(leaves(s)) for s in elements[:inst.attributes["index"]])
            return operands[0][start:start + len(leaves(inst.shape))]
        if opcode in ("copy", "set-dimension-size"):
            return operands[0]
        if opcode in ("call", "fusion"):
            return self.body(inst.called_computations[0], operands, indent)
        flat = [name for values in operands for name in values]
        operand_types = [tensor_type(leaf) for o in inst.operands for leaf in leaves(o.shape)]
        result_types = [tensor_type(leaf) for leaf in leaves(inst.shape)]

        def emit(name: str, properties: str = "", regions: Sequence[str] = (),
                 values: Sequence[str] = flat, types: Sequence[str] = operand_types
                 ) -> list[str]:
            return self.writer.op(indent, name, values, types, result_types, properties,
                                  regions)

        if opcode in _SAME_OPERANDS:
            return emit("stablehlo." + _SAME_OPERANDS[opcode])
        method = getattr(self, "_" + opcode.replace("-", "_"), None)
        if method is None:
            raise StableHloError(f"not supported in StableHLO export: {opcode} (%{inst.name})")
        return method(inst, emit, indent, flat)

    def _erf(self, inst: Instruction, emit: Any, indent: str,
             flat: list[str]) -> list[str]:
        return emit("chlo.erf")

    def _constant(self, inst: Instruction, emit: Any, indent: str,
                  flat: list[str]) -> list[str]:
        return emit("stablehlo.constant", f"value = {dense_literal(inst.literal, inst.shape)}")

    def _iota(self, inst: Instruction, emit: Any, indent: str,
              flat: list[str]) -> list[str]:
        return emit("stablehlo.iota", f"iota_dimension = {inst.attributes['iota_dimension']} : "
                                      "i64")

    def _compare(self, inst: Instruction, emit: Any, indent: str,
                 flat: list[str]) -> list[str]:
        operand_type = inst.operand(0).shape.element_type
        kind = ("TOTALORDER" if inst.attributes.get("type") == "TOTALORDER" else "FLOAT") \
            if operand_type in FLOAT_TYPES else \
            ("SIGNED" if operand_type in SIGNED_TYPES else "UNSIGNED")
        return emit("stablehlo.compare",
                    f"compare_type = #stablehlo<comparison_type {kind}>, comparison_direction = "
                    f"#stablehlo<comparison_direction {inst.attributes['direction']}>")

    def _broadcast(self, inst: Instruction, emit: Any, indent: str,
                   flat: list[str]) -> list[str]:
        return emit("stablehlo.broadcast_in_dim",
                    f"broadcast_dimensions = {_i64_array(inst.dimensions)}")

    def _transpose(self, inst: Instruction, emit: Any, indent: str,
                   flat: list[str]) -> list[str]:
        return emit("stablehlo.transpose", f"permutation = {_i64_array(inst.dimensions)}")

    def _reverse(self, inst: Instruction, emit: Any, indent: str,
                 flat: list[str]) -> list[str]:
        return emit("stablehlo.reverse", f"dimensions = {_i64_array(inst.dimensions)}")

    def _slice(self, inst: Instruction, emit: Any, indent: str,
               flat: list[str]) -> list[str]:
        spec = inst.attributes["slice"]
        return emit("stablehlo.slice", f"limit_indices = {_i64_array([s[1] for s in spec])}, "
                                       f"start_indices = {_i64_array([s[0] for s in spec])}, "
                                       f"strides = {_i64_array([s[2] for s in spec])}")

    def _concatenate(self, inst: Instruction, emit: Any, indent: str,
                     flat: list[str]) -> list[str]:
        return emit("stablehlo.concatenate", f"dimension = {inst.dimensions[0]} : i64")

    def _pad(self, inst: Instruction, emit: Any, indent: str,
             flat: list[str]) -> list[str]:
        config = inst.attributes["padding"].dimensions
        return emit("stablehlo.pad",
                    f"edge_padding_high = {_i64_array([d.high for d in config])}, "
                    f"edge_padding_low = {_i64_array([d.low for d in config])}, "
                    f"interior_padding = {_i64_array([d.interior for d in config])}")

    def _dynamic_slice(self, inst: Instruction, emit: Any, indent: str,
                       flat: list[str]) -> list[str]:
        return emit("stablehlo.dynamic_slice",
                    f"slice_sizes = {_i64_array(inst.attributes['dynamic_slice_sizes'])}")

    def _dynamic_update_slice(self, inst: Instruction, emit: Any, indent: str,
                              flat: list[str]) -> list[str]:
        return emit("stablehlo.dynamic_update_slice")

    def _dot(self, inst: Instruction, emit: Any, indent: str,
             flat: list[str]) -> list[str]:
        a = inst.attributes
        fields = [f"{side}_{kind}_dimensions = {_list(a.get(f'{side}_{key}_dims', ()))}"
                  for side in ("lhs", "rhs") for kind, key in (("batching", "batch"),
                                                                ("contracting", "contracting"))]
        order = [fields[0], fields[2], fields[1], fields[3]]
        return emit("stablehlo.dot_general",
                    f"dot_dimension_numbers = #stablehlo.dot<{', '.join(order)}>")

    def _reduce(self, inst: Instruction, emit: Any, indent: str,
                flat: list[str]) -> list[str]:
        return emit("stablehlo.reduce", f"dimensions = {_i64_array(inst.dimensions)}",
                    [self.region(inst.called_computations[0], indent)])

    def _reduce_window(self, inst: Instruction, emit: Any, indent: str,
                       flat: list[str]) -> list[str]:
        window = inst.attributes["window"].dimensions
        padding = ", ".join(f"[{d.padding_low}, {d.padding_high}]" for d in window)
        return emit("stablehlo.reduce_window",
                    f"base_dilations = {_i64_array([d.base_dilation for d in window])}, "
                    f"padding = dense<[{padding}]> : tensor<{len(window)}x2xi64>, "
                    f"window_dilations = {_i64_array([d.window_dilation for d in window])}, "
                    f"window_dimensions = {_i64_array([d.size for d in window])}, "
                    f"window_strides = {_i64_array([d.stride for d in window])}",
                    [self.region(inst.called_computations[0], indent)])

    def _gather(self, inst: Instruction, emit: Any, indent: str,
                flat: list[str]) -> list[str]:
        a = inst.attributes
        fields = [f"{key} = {_list(a[key])}" for key in (
            "offset_dims", "collapsed_slice_dims", "start_index_map") if len(a[key])]
        fields.append(f"index_vector_dim = {a['index_vector_dim']}")
        return emit("stablehlo.gather",
                    f"dimension_numbers = #stablehlo.gather<{', '.join(fields)}>, "
                    f"indices_are_sorted = false, slice_sizes = {_i64_array(a['slice_sizes'])}")

    def _scatter(self, inst: Instruction, emit: Any, indent: str,
                 flat: list[str]) -> list[str]:
        a = inst.attributes
        fields = [f"{key} = {_list(a[key])}" for key in (
            "update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims")
            if len(a[key])]
        fields.append(f"index_vector_dim = {a['index_vector_dim']}")
        return emit("stablehlo.scatter",
                    "indices_are_sorted = false, scatter_dimension_numbers = "
                    f"#stablehlo.scatter<{', '.join(fields)}>, unique_indices = false",
                    [self.region(inst.called_computations[0], indent)])

    def _sort(self, inst: Instruction, emit: Any, indent: str,
              flat: list[str]) -> list[str]:
        return emit("stablehlo.sort",
                    f"dimension = {inst.dimensions[0]} : i64, "
                    f"is_stable = {_bool(inst.attributes.get('is_stable', False))}",
                    [self.region(inst.called_computations[0], indent)])

    def _topk(self, inst: Instruction, emit: Any, indent: str,
              flat: list[str]) -> list[str]:
        if not inst.attributes.get("largest", True):
            raise StableHloError("not supported in StableHLO export: topk with largest=false "
                                 f"(%{inst.name}; chlo.top_k takes the largest)")
        return emit("chlo.top_k", f"k = {int(inst.attributes['k'])} : i64")

    def _convolution(self, inst: Instruction, emit: Any, indent: str,
                     flat: list[str]) -> list[str]:
        d = inst.attributes["dim_labels"]
        window = inst.attributes["window"].dimensions
        rank = inst.shape.rank

        def labels(batch: int, feature: int, spatial: Sequence[int], names: str) -> str:
            out = [""] * rank
            out[batch], out[feature] = names[0], names[1]
            for k, s in enumerate(spatial):
                out[s] = str(k)
            return "[" + ", ".join(out) + "]"

        numbers = (labels(d.input_batch, d.input_feature, d.input_spatial, "bf") + "x"
                   + labels(d.kernel_input_feature, d.kernel_output_feature, d.kernel_spatial,
                            "io") + "->"
                   + labels(d.output_batch, d.output_feature, d.output_spatial, "bf"))
        feature_groups, batch_groups = group_counts(inst.attributes)
        padding = ", ".join(f"[{w.padding_low}, {w.padding_high}]" for w in window)
        reversal = ""
        if any(w.window_reversal for w in window):
            reversal = ", window_reversal = array<i1: " + ", ".join(
                _bool(w.window_reversal) for w in window) + ">"
        spatial = len(window)
        padding_attribute = f"dense<[{padding}]> : tensor<{spatial}x2xi64>" if spatial else \
            "dense<> : tensor<0x2xi64>"
        return emit("stablehlo.convolution",
                    f"batch_group_count = {batch_groups} : i64, dimension_numbers = "
                    f"#stablehlo.conv<{numbers}>, feature_group_count = {feature_groups} : i64,"
                    f" lhs_dilation = {_i64_array([w.base_dilation for w in window])}, "
                    f"padding = {padding_attribute}, "
                    f"rhs_dilation = {_i64_array([w.window_dilation for w in window])}"
                    f"{reversal}, window_strides = {_i64_array([w.stride for w in window])}")

    def _while(self, inst: Instruction, emit: Any, indent: str,
               flat: list[str]) -> list[str]:
        condition, body = inst.called_computations
        return emit("stablehlo.while", "",
                    [self.region(condition, indent), self.region(body, indent)])

    def _conditional(self, inst: Instruction, emit: Any, indent: str,
                     flat: list[str]) -> list[str]:
        selector = inst.operand(0)
        branches = []
        for k, branch in enumerate(inst.called_computations):
            operand = inst.operand(k + 1)
            start = sum(len(leaves(o.shape)) for o in inst.operands[:k + 1])
            names = flat[start:start + len(leaves(operand.shape))]
            branches.append(self.region(branch, indent, outer=[names]))
        selector_name = flat[:1]
        selector_type = [tensor_type(selector.shape)]
        if selector.shape.element_type == "pred":  # if: the true branch first, as HLO's
            return emit("stablehlo.if", "", branches, selector_name, selector_type)
        return emit("stablehlo.case", "", branches, selector_name, selector_type)

    def _cholesky(self, inst: Instruction, emit: Any, indent: str,
                  flat: list[str]) -> list[str]:
        return emit("stablehlo.cholesky", f"lower = {_bool(inst.attributes.get('lower'))}")

    def _triangular_solve(self, inst: Instruction, emit: Any, indent: str,
                          flat: list[str]) -> list[str]:
        a = inst.attributes
        return emit("stablehlo.triangular_solve",
                    f"left_side = {_bool(a.get('left_side'))}, lower = {_bool(a.get('lower'))}, "
                    f"transpose_a = #stablehlo<transpose "
                    f"{a.get('transpose_a', 'NO_TRANSPOSE')}>, "
                    f"unit_diagonal = {_bool(a.get('unit_diagonal'))}")

    def _rng_bit_generator(self, inst: Instruction, emit: Any, indent: str,
                           flat: list[str]) -> list[str]:
        algorithm_of(inst.attributes)  # checks it
        name = _RNG_ALGORITHMS[str(inst.attributes.get("algorithm", "rng_default"))]
        return emit("stablehlo.rng_bit_generator",
                    f"rng_algorithm = #stablehlo<rng_algorithm {name}>")

    def _reduce_precision(self, inst: Instruction, emit: Any, indent: str,
                          flat: list[str]) -> list[str]:
        exponent, mantissa = reduce_precision_bits(inst.attributes)
        return emit("stablehlo.reduce_precision",
                    f"exponent_bits = {exponent} : i32, mantissa_bits = {mantissa} : i32")

    def _get_dimension_size(self, inst: Instruction, emit: Any, indent: str,
                            flat: list[str]) -> list[str]:
        return emit("stablehlo.get_dimension_size", f"dimension = {inst.dimensions[0]} : i64")

    def _opt_barrier(self, inst: Instruction, emit: Any, indent: str,
                     flat: list[str]) -> list[str]:
        return emit("stablehlo.optimization_barrier")


def _symbol(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$.]*", name) else \
        '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def module_to_stablehlo(module: HloModule) -> str:
    """`module`'s entry computation as a StableHLO module with one public `@main`."""
    entry = module.entry
    if entry is None or entry.root is None:
        raise StableHloError(f"module {module.name} has no entry computation")
    if has_dynamic_shapes(module):  # bounded types (`#stablehlo.bounds`) are not written
        raise StableHloError(f"not supported: dynamic dimensions in module {module.name}")
    exporter = _Exporter()
    writer = exporter.writer
    arguments, parameters = [], []
    for parameter in sorted(entry.parameters, key=lambda p: p.parameter_number):
        names = []
        for leaf in leaves(parameter.shape):
            names.append(f"%arg{len(arguments)}")
            arguments.append(f"{names[-1]}: {tensor_type(leaf)}")
        parameters.append(names)
    results = exporter.body(entry, parameters, "    ")
    result_types = [tensor_type(leaf) for leaf in leaves(entry.root.shape)]
    writer.op("    ", "func.return", results, result_types, [])
    body = "\n".join(writer.lines)
    return (f"module @{_symbol(module.name)} {{\n"
            f"  func.func public @main({', '.join(arguments)}) -> "
            f"({', '.join(result_types)}) {{\n{body}\n  }}\n}}\n")
