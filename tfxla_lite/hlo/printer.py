"""XLA's HLO text format, printed from the IR.

The form is the one TF's XLA prints for `experimental_get_compiler_ir(...)
(stage='hlo')`: module header with `entry_computation_layout` (and the header
attributes a parsed module kept), XLA's stack-frame tables when the module has them,
callees first, `ENTRY` last, `%`-names, long-form operands (`f32[2]{0} %x`), `ROOT`,
and attributes (`dimensions={...}`, `to_apply=%c`, `metadata={...}`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the IR prints itself through this module, which only reads it
    from tfxla_lite.hlo.ir import Computation, HloModule, Instruction

# Literals with more elements than this print as `{...}`, as XLA does for big constants.
MAX_PRINTED_LITERAL_ELEMENTS = 64


class RawAttribute(str):
    """An attribute's value text, kept verbatim by the parser (`sharding={...}`,
    `backend_config=...`, `frontend_attributes={...}`) and printed back as is."""


def format_scalar(value: Any, element_type: str) -> str:
    if element_type == "pred":
        return "true" if bool(value) else "false"
    if element_type in ("f16", "bf16", "f32", "f64"):
        v = float(value)
        if np.isnan(v):
            return "nan" if not np.signbit(v) else "-nan"
        if np.isinf(v):
            return "inf" if v > 0 else "-inf"
        digits = {"f64": 17, "f32": 9}.get(element_type, 5)
        text = f"{v:.{digits}g}"
        if v == 0 and np.signbit(v):
            text = "-0"
        return text
    return str(int(value))


def format_literal(array: np.ndarray, element_type: str, print_large: bool = False) -> str:
    if array.ndim == 0:
        return format_scalar(array[()], element_type)
    if array.size > MAX_PRINTED_LITERAL_ELEMENTS and not print_large:
        return "{...}"

    def nested(a: np.ndarray) -> str:
        if a.ndim == 1:
            return "{ " + ", ".join(format_scalar(v, element_type) for v in a) + " }"
        return "{ " + ", ".join(nested(sub) for sub in a) + " }"

    return nested(array)


def _int_list(values: Any) -> str:
    return "{" + ",".join(str(int(v)) for v in values) + "}"


def _format_attribute(key: str, value: Any) -> str:
    if isinstance(value, RawAttribute):
        return f"{key}={value}"
    if key == "slice":
        return "slice={" + ", ".join(f"[{a}:{b}{'' if c == 1 else f':{c}'}]"
                                     for a, b, c in value) + "}"
    if isinstance(value, (tuple, list)):
        return f"{key}={_int_list(value)}"
    if isinstance(value, bool):
        return f"{key}={'true' if value else 'false'}"
    if isinstance(value, str) and key in ("backend_config", "custom_call_target"):
        return f'{key}="{value}"'
    return f"{key}={value}"


# XLA's order of the metadata keys (OpMetadataToString); other keys follow as read.
_METADATA_ORDER = ("op_type", "op_name", "source_file", "source_line", "source_end_line",
                   "source_column", "source_end_column", "profile_type", "deduplicated_name",
                   "preserve_layout", "scheduling_name", "stack_frame_id")


def _format_metadata(metadata: dict[str, Any]) -> str:
    keys = [k for k in _METADATA_ORDER if k in metadata]
    keys += [k for k in metadata if k not in _METADATA_ORDER]
    parts = []
    for key in keys:
        value = metadata[key]
        if value is None or value == "":
            continue
        if isinstance(value, RawAttribute) or isinstance(value, (int, np.integer)):
            parts.append(f"{key}={value}")  # unquoted as read: integers, true, {...}
        else:
            parts.append(f'{key}="{_escape(str(value))}"')
    return "metadata={" + " ".join(parts) + "}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


# Attributes printed inside the parentheses or handled on their own.
_SPECIAL_ATTRIBUTES = {"literal", "parameter_number"}


def instruction_to_text(inst: Instruction, long_operands: bool = True,
                        print_large_constants: bool = False) -> str:
    operands = ", ".join((f"{o.shape} %{o.name}" if long_operands else f"%{o.name}")
                         for o in inst.operands)
    if inst.opcode == "parameter":
        operands = str(inst.parameter_number)
    elif inst.opcode == "constant":
        operands = format_literal(inst.literal, inst.shape.element_type, print_large_constants)
    text = f"%{inst.name} = {inst.shape} {inst.opcode}({operands})"
    extras = []
    for key, value in inst.attributes.items():
        if key not in _SPECIAL_ATTRIBUTES:
            extras.append(_format_attribute(key, value))
    if inst.called_computations:
        extras.extend(_called_attributes(inst))
    if inst.metadata:
        extras.append(_format_metadata(inst.metadata))
    if extras:
        text += ", " + ", ".join(extras)
    return text


def _called_attributes(inst: Instruction) -> list[str]:
    names = [f"%{c.name}" for c in inst.called_computations]
    if inst.opcode == "while" and len(names) == 2:
        return [f"condition={names[0]}", f"body={names[1]}"]
    if inst.opcode == "conditional":
        if inst.operands and inst.operand(0).shape.element_type == "pred" and len(names) == 2:
            return [f"true_computation={names[0]}", f"false_computation={names[1]}"]
        return ["branch_computations={" + ", ".join(names) + "}"]
    key = "calls" if inst.opcode == "fusion" else "to_apply"
    return [f"{key}={', '.join(names)}"]


def computation_to_text(comp: Computation, entry: bool = False, long_operands: bool = True,
                        print_large_constants: bool = False) -> str:
    params = ", ".join(f"{p.name}: {p.shape.to_text(layout=False)}" for p in comp.parameters)
    result = comp.root.shape.to_text(layout=False) if comp.root is not None else "()"
    lines = [f"{'ENTRY ' if entry else ''}%{comp.name} ({params}) -> {result} {{"]
    for inst in comp.instructions:
        prefix = "ROOT " if inst is comp.root else ""
        text = instruction_to_text(inst, long_operands, print_large_constants)
        lines.append(f"  {prefix}{text}")
    lines.append("}" + "".join(f", {k}={v}" for k, v in comp.attributes.items()))
    return "\n".join(lines)


def entry_computation_layout(module: HloModule) -> str:
    entry = module.entry
    assert entry is not None and entry.root is not None
    params = ", ".join(str(p.shape) for p in entry.parameters)
    return f"{{({params})->{entry.root.shape}}}"


def module_to_text(module: HloModule, long_operands: bool = True,
                   print_large_constants: bool = False) -> str:
    """The module in XLA's text format; `print_large_constants` spells out every literal
    (else those over MAX_PRINTED_LITERAL_ELEMENTS print as `{...}`, which the parser
    rejects unless told to fill them)."""
    header = f"HloModule {module.name}"
    layout = (entry_computation_layout(module)
              if module.entry is not None and module.entry.root is not None else None)
    for key, value in module.attributes.items():
        # The IR is row-major: the entry layout is the module's, not the one read.
        if key == "entry_computation_layout":
            value = layout or value
            layout = None
        header += f", {key}={value}"
    if layout is not None:
        header += f", entry_computation_layout={layout}"
    blocks = [header]
    if module.stack_frames is not None:
        tables = module.stack_frames.to_text()
        if tables:
            blocks.append(tables)
    for comp in module.called_computations_in_order():
        blocks.append(computation_to_text(comp, comp is module.entry, long_operands,
                                          print_large_constants))
    return "\n\n".join(blocks) + "\n"
