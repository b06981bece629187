"""Every HLO opcode of the table has all its pieces, and every registration names one.

The pieces of an opcode (docs/architecture.md, "Adding an HLO opcode"): its `OpcodeInfo`
(category, arity, shape rule or none for a shape the instruction carries) in
`hlo/opcodes.py`, its NumPy reference in `hlo/evaluator.py`, its CPU emitter and its GPU
element generator, or for a backend an entry with a reason in that backend's list of
opcodes it does not generate. The emitters' own mappings (opcode -> libm symbol, CUDA
function, NumPy function) are checked against the table's categories. Core test:
imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from tfxla_lite.codegen.cpu import UNSUPPORTED_OPCODES, control_flow, elementwise, math
from tfxla_lite.codegen.cpu import streaming as cpu_streaming
from tfxla_lite.codegen.cpu.emitter import EMITTERS, KERNEL_EMITTERS, OWN_KERNELS
from tfxla_lite.codegen.gpu import elemental
from tfxla_lite.codegen.gpu.linalg import LINALG_OPCODES
from tfxla_lite.codegen.gpu.random_bits import RANDOM_OPCODES
from tfxla_lite.codegen.gpu.sort import WHOLE_ROW_OPCODES
from tfxla_lite.hlo import evaluator
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.opcodes import (
    ELEMENTWISE_CATEGORIES,
    OPCODES,
    OpcodeInfo,
    is_identity_on_integers,
    is_transcendental,
    opcodes_in,
)
from tfxla_lite.hlo.shape import Shape

CATEGORIES = ELEMENTWISE_CATEGORIES | {"data-movement", "reduction", "dot", "convolution",
                                       "sort", "linalg", "random", "control-flow", "other"}


@dataclass(frozen=True)
class Registrations:
    """What the table's opcodes are looked up in, each keyed by opcode."""

    opcodes: Mapping[str, OpcodeInfo]
    references: Mapping[str, Any]
    # CPU: element generators, whole-kernel emitters (scatter, dynamic-update-slice),
    # kernels of their own (sort.py, random_bits.py, linalg.py), control flow (loops and
    # branches calling their computations), and the opcodes it does not generate, why.
    cpu_generators: Mapping[str, Any]
    cpu_kernel_bodies: Mapping[str, Any]
    cpu_own_kernels: Mapping[str, Any]
    cpu_control_flow: frozenset[str]
    cpu_unsupported: Mapping[str, str]
    # GPU: element generators, kernels of their own (sort.py, linalg.py,
    # random_bits.py), and the rest with a reason.
    gpu_generators: Mapping[str, Any]
    gpu_whole_rows: frozenset[str]
    gpu_unsupported: Mapping[str, str]


def current() -> Registrations:
    return Registrations(OPCODES, evaluator.REFERENCES, EMITTERS, KERNEL_EMITTERS, OWN_KERNELS,
                         control_flow.OPCODES, UNSUPPORTED_OPCODES, elemental.EMITTERS,
                         WHOLE_ROW_OPCODES | LINALG_OPCODES | RANDOM_OPCODES,
                         elemental.NO_ELEMENT_GENERATOR)


def problems(r: Registrations) -> list[str]:
    """Each missing piece or stray registration, one line each."""
    found = []
    for name, info in r.opcodes.items():
        if info.name != name or info.category not in CATEGORIES:
            found.append(f"{name}: name {info.name!r}, category {info.category!r}")
        if info.shape_rule is not None and not callable(info.shape_rule):
            found.append(f"{name}: no shape rule")  # None: the instruction carries it
        if info.arity is not None and info.arity < 0:
            found.append(f"{name}: arity {info.arity}")
        if name not in r.references:
            found.append(f"{name}: no NumPy reference (hlo/evaluator.py)")
        cpu = [set(r.cpu_generators) | set(r.cpu_own_kernels) | r.cpu_control_flow,
               set(r.cpu_unsupported)]
        if sum(name in s for s in cpu) != 1:
            found.append(f"{name}: not exactly one of a CPU emitter and a reason for none")
        gpu = [set(r.gpu_generators) | r.gpu_whole_rows, set(r.gpu_unsupported)]
        if sum(name in s for s in gpu) != 1:
            found.append(f"{name}: not exactly one of a GPU generator and a reason for none")
    for where, keys in (("evaluator", r.references), ("CPU generators", r.cpu_generators),
                        ("CPU kernel bodies", r.cpu_kernel_bodies),
                        ("CPU own kernels", r.cpu_own_kernels),
                        ("CPU control flow", r.cpu_control_flow),
                        ("CPU unsupported", r.cpu_unsupported),
                        ("GPU generators", r.gpu_generators),
                        ("GPU whole rows", r.gpu_whole_rows),
                        ("GPU unsupported", r.gpu_unsupported)):
        found += [f"{where}: {name} is no opcode of the table" for name in keys
                  if name not in r.opcodes]
    for where, reasons in (("CPU", r.cpu_unsupported), ("GPU", r.gpu_unsupported)):
        found += [f"{where}: no reason for {name}" for name, why in reasons.items()
                  if not why.strip()]
    if set(r.cpu_own_kernels) & set(r.cpu_generators):
        found.append("an opcode with both a CPU kernel of its own and an element generator")
    return found


def test_every_opcode_has_every_piece() -> None:
    assert problems(current()) == []


def _without(mapping: Mapping[str, Any], key: str) -> dict[str, Any]:
    copy = dict(mapping)
    del copy[key]
    return copy


@pytest.mark.parametrize(("field", "key"), [
    ("references", "tanh"), ("references", "scatter"), ("cpu_generators", "add"),
    ("cpu_own_kernels", "sort"), ("cpu_unsupported", "fusion"), ("gpu_generators", "gather"),
    ("gpu_unsupported", "while")])
def test_a_missing_registration_is_found(field: str, key: str) -> None:
    """Plant a bug: the check fails when one registration is deleted (from a copy)."""
    r = current()
    broken = replace(r, **{field: _without(getattr(r, field), key)})
    assert any(line.startswith(f"{key}: ") for line in problems(broken)), field


def test_a_stray_or_incomplete_entry_is_found() -> None:
    r = current()
    no_rule = dict(r.opcodes, tanh=replace(r.opcodes["tanh"], shape_rule="unary"))
    assert "tanh: no shape rule" in problems(replace(r, opcodes=no_rule))
    stray = dict(r.references, atan=r.references["tanh"])
    assert "evaluator: atan is no opcode of the table" in problems(replace(r, references=stray))
    twice = dict(r.gpu_unsupported, add="a reason")
    assert any(p.startswith("add: ") for p in problems(replace(r, gpu_unsupported=twice)))
    assert problems(replace(r, opcodes={**r.opcodes, "atan": r.opcodes["tanh"]}))


def test_emitter_mappings_name_opcodes_of_their_category() -> None:
    unary, binary = set(opcodes_in("unary")), set(opcodes_in("binary"))
    for mapping in (elementwise._FLOAT_INTRINSICS, elementwise._FLOAT_LIBM,
                    math.F32_FUNCTIONS, elemental._FLOAT_UNARY, evaluator._FLOAT_UNARY,
                    evaluator._ANY_TYPE_UNARY):
        assert set(mapping) <= unary, set(mapping) - unary
    for mapping in (elemental._FLOAT_OPERATORS, elemental._INTEGER_WRAPPING,
                    evaluator._FLOAT_BINARY):
        assert set(mapping) <= binary, set(mapping) - binary
    # Polynomials and libm calls make a loop compute-bound; each is a transcendental.
    assert cpu_streaming.COMPUTE_BOUND_OPCODES == \
        {op for op in OPCODES if is_transcendental(op)} - {"sqrt", "rsqrt"}


def test_categories_and_arities() -> None:
    assert len(opcodes_in("unary")) == 23 and len(opcodes_in("binary")) == 15
    for name in opcodes_in("unary"):
        assert OPCODES[name].arity == 1, name
    for name in opcodes_in("binary"):
        assert OPCODES[name].arity == 2, name
    assert [OPCODES[n].arity for n in ("select", "clamp", "compare", "convert", "tuple")] == \
        [3, 3, 2, 1, None]
    assert {n for n, info in OPCODES.items() if info.commutative} == {
        "add", "multiply", "maximum", "minimum", "and", "or", "xor"}
    assert control_flow.OPCODES == {"while", "conditional"}
    assert {n for n, info in OPCODES.items() if info.flat} == {
        "parameter", "constant", "reshape", "bitcast"}
    assert {n for n in OPCODES if is_identity_on_integers(n)} == {
        "floor", "ceil", "round-nearest-afz", "round-nearest-even"}


@pytest.mark.parametrize("opcode", opcodes_in("unary", "binary"))
def test_unary_and_binary_references_compute(opcode: str) -> None:
    """A category registers the evaluator's unary and binary references; each must also
    know its opcode (floats, or integers for the bitwise ones)."""
    for element_type, values in (("f32", np.array([0.5, -2.0], np.float32)),
                                 ("s32", np.array([3, -2], np.int32))):
        module = HloModule(opcode)
        comp = module.new_computation("main", entry=True)
        shape = Shape(element_type, (2,))
        params = [comp.add_parameter(i, shape) for i in range(OPCODES[opcode].arity or 0)]
        comp.root = comp.create(opcode, params)
        try:
            result = evaluator.evaluate(module, *[values] * len(params))
        except (TypeError, NotImplementedError, KeyError):
            continue
        assert np.asarray(result).shape == (2,)
        return
    pytest.fail(f"no NumPy reference computes {opcode}")
