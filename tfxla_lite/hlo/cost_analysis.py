"""Cost analysis: flops, transcendentals and bytes accessed, as XLA counts them.

Reads the IR only; reports, the CLI and benchmarks use it to say how much work and
memory traffic a module (or each of its kernels) asks for. The definitions are those
of XLA's `HloCostAnalysis` (`xla/service/hlo_cost_analysis.cc`), opcode by opcode in
docs/inspecting.md, "What cost analysis counts". XLA's optimal seconds is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tfxla_lite.hlo import convolution
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import is_elementwise, is_transcendental
from tfxla_lite.hlo.shape import Shape

FMA_FLOPS = 2
POINTER_BYTES = 8


@dataclass(frozen=True)
class Cost:
    """The cost of one instruction (or a sum of them)."""

    flops: int = 0
    transcendentals: int = 0
    bytes_accessed: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.transcendentals + other.transcendentals,
                    self.bytes_accessed + other.bytes_accessed)

    def scaled(self, factor: int) -> Cost:
        """The compute of `factor` applications; bytes are not scaled (XLA's rule)."""
        return Cost(self.flops * factor, self.transcendentals * factor, 0)


def _elements(shape: Shape) -> int:
    if shape.is_tuple:
        return sum(_elements(s) for s in shape.tuple_shapes or ())
    return shape.num_elements


def _byte_size(shape: Shape) -> int:
    return shape.byte_size


def _default_bytes(inst: Instruction) -> int:
    return _byte_size(inst.shape) + sum(_byte_size(o.shape) for o in inst.operands)


def computation_cost(computation: Computation) -> Cost:
    """The sum over the computation's instructions."""
    total = Cost()
    for inst in computation.instructions:
        total = total + instruction_cost(inst)
    return total


def instruction_cost(inst: Instruction) -> Cost:
    """The cost of one instruction under XLA's definitions (see the module docstring)."""
    opcode = inst.opcode
    if opcode in ("parameter", "constant", "get-tuple-element", "bitcast", "opt-barrier",
                  "get-dimension-size"):
        return Cost()
    if opcode == "tuple":
        return Cost(bytes_accessed=POINTER_BYTES * len(inst.shape.tuple_shapes or ()))
    if opcode == "fusion":
        inner = computation_cost(inst.fused_computation)
        return Cost(inner.flops, inner.transcendentals, _default_bytes(inst))
    if opcode == "call":
        return computation_cost(inst.called_computations[0])
    if opcode == "slice":
        return Cost(bytes_accessed=2 * _byte_size(inst.shape))
    if opcode == "dot":
        lhs = inst.operand(0).shape
        width = math.prod(lhs.dims[d] for d in inst.attributes.get("lhs_contracting_dims", ()))
        return Cost(flops=FMA_FLOPS * _elements(inst.shape) * width,
                    bytes_accessed=_default_bytes(inst))
    if opcode == "convolution":
        flops = convolution.flops(inst.operand(0).shape, inst.operand(1).shape, inst.shape,
                                  inst.attributes)
        return Cost(flops=flops, bytes_accessed=_default_bytes(inst))
    if opcode == "reduce":
        output = inst.shape.tuple_shapes[0] if inst.shape.tuple_shapes else inst.shape
        combinations = inst.operand(0).shape.num_elements - output.num_elements
        per_combination = computation_cost(inst.called_computations[0])
        return per_combination.scaled(combinations) + Cost(bytes_accessed=_default_bytes(inst))
    if opcode == "cholesky":
        n = inst.shape.dims[-1]
        matrices = _elements(inst.shape) // (n * n) if n else 0
        return Cost(flops=FMA_FLOPS * matrices * n**3 // 3, transcendentals=matrices * n,
                    bytes_accessed=_default_bytes(inst))
    if opcode == "triangular-solve":
        k = inst.operand(0).shape.dims[-1]
        return Cost(flops=FMA_FLOPS * _elements(inst.shape) * k // 2,
                    bytes_accessed=_default_bytes(inst))
    if is_elementwise(opcode) and opcode != "copy":
        count = _elements(inst.shape)
        if is_transcendental(opcode):
            return Cost(transcendentals=count, bytes_accessed=_default_bytes(inst))
        return Cost(flops=count, bytes_accessed=_default_bytes(inst))
    return Cost(bytes_accessed=_default_bytes(inst))  # data movement, iota, copy


@dataclass
class CostAnalysis:
    """Per-instruction costs of the entry computation (fusions as one) and their total."""

    module_name: str
    costs: dict[str, Cost] = field(default_factory=dict)  # entry instruction name -> cost

    @property
    def total(self) -> Cost:
        total = Cost()
        for cost in self.costs.values():
            total = total + cost
        return total

    @property
    def flops(self) -> int:
        return self.total.flops

    @property
    def transcendentals(self) -> int:
        return self.total.transcendentals

    @property
    def bytes_accessed(self) -> int:
        return self.total.bytes_accessed

    def to_text(self) -> str:
        """One line per instruction that costs anything, then the total."""
        lines = [f"CostAnalysis of {self.module_name}:",
                 f"  {'instruction':<32} {'flops':>12} {'transcendentals':>16} {'bytes':>12}"]
        for name, cost in self.costs.items():
            if cost != Cost():
                lines.append(f"  %{name:<31} {cost.flops:>12} {cost.transcendentals:>16} "
                             f"{cost.bytes_accessed:>12}")
        total = self.total
        lines.append(f"  {'total':<32} {total.flops:>12} {total.transcendentals:>16} "
                     f"{total.bytes_accessed:>12}")
        return "\n".join(lines) + "\n"


def analyze(module: HloModule) -> CostAnalysis:
    """Cost every instruction of the entry computation; fusions and calls cost as one."""
    if module.entry is None:
        raise ValueError(f"module {module.name} has no entry computation")
    return CostAnalysis(module.name, {inst.name: instruction_cost(inst)
                                      for inst in module.entry.instructions})
