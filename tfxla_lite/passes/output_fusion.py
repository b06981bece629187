"""Output fusion (`output-fusion`): a dot and its elementwise epilogue become one kOutput
fusion.

After `fuse`, as XLA's CPU backend fuses a dot with its consumer: the bias, scale and
activation are applied to a tile of the product while it is in cache (or to each sum in
registers), so the product never makes a round trip through memory. A dot merges when it
has one user, is not the root, and that user is a kLoop fusion or lone elementwise op of
its shape reading it only elementwise (docs/architecture.md, `output-fusion`). Dots
inside fusions are never fused again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction, user_edges
from tfxla_lite.hlo.opcodes import is_elementwise
from tfxla_lite.passes.base import Pass
from tfxla_lite.passes.fusion import fusion_targets


def epilogue_reads_elementwise(consumer: Instruction, dot: Instruction) -> bool:
    """Whether `consumer` reads `dot` only at its own output index, through
    elementwise ops of the dot's dimensions."""
    dims = dot.shape.dims
    if consumer.shape.is_tuple or consumer.shape != dot.shape:
        return False  # the product is stored in the output buffer before the epilogue
    if consumer.opcode != "fusion":
        return is_elementwise(consumer.opcode)
    if consumer.attributes.get("kind") != "kLoop":
        return False
    fused = consumer.fused_computation
    starts = [fused.parameter(n) for n, o in enumerate(consumer.operands) if o is dot]
    return all(is_elementwise(user.opcode) and user.shape.dims == dims
               for _, user in user_edges(starts))


def output_fusion_consumer(dot: Instruction) -> Instruction | None:
    """The consumer `dot` can be merged into, or None."""
    computation = dot.parent
    if dot.opcode != "dot" or computation is None or dot is computation.root:
        return None
    if len(dot.users) != 1:
        return None
    (consumer,) = dot.users
    if not epilogue_reads_elementwise(consumer, dot):
        return None
    return consumer


def _merge(computation: Computation, dot: Instruction, consumer: Instruction) -> Instruction:
    """Replace `consumer` by a kOutput fusion computing `dot` and then `consumer`."""
    module = computation.module
    assert module is not None
    position = {id(inst): n for n, inst in enumerate(computation.instructions)}
    inputs: list[Instruction] = []
    for value in [*dot.operands, *(o for o in consumer.operands if o is not dot)]:
        if all(value is not i for i in inputs):
            inputs.append(value)
    inputs.sort(key=lambda inst: position[id(inst)])  # parameters follow the entry's order

    fused = module.add_computation(Computation("fused_computation"))
    fused.is_fusion_computation = True
    params = [fused.add_parameter(n, v.shape, name=f"param_{n}") for n, v in enumerate(inputs)]
    outer = {id(v): p for v, p in zip(inputs, params)}
    product = fused.add(Instruction("dot", dot.shape, [outer[id(o)] for o in dot.operands],
                                    dot.attributes, dot.called_computations, dot.name,
                                    dot.metadata))
    body = [product]
    if consumer.opcode == "fusion":
        old = consumer.fused_computation
        clones: dict[int, Instruction] = {}
        for n, operand in enumerate(consumer.operands):
            clones[id(old.parameter(n))] = product if operand is dot else outer[id(operand)]
        for inst in old.instructions:
            if inst.opcode == "parameter":
                continue
            clone = Instruction(inst.opcode, inst.shape, [clones[id(o)] for o in inst.operands],
                                inst.attributes, inst.called_computations, inst.name,
                                inst.metadata)
            clones[id(inst)] = fused.add(clone)
            body.append(clone)
        assert old.root is not None
        fused.root = clones[id(old.root)]
    else:
        operands = [product if o is dot else outer[id(o)] for o in consumer.operands]
        fused.root = fused.add(Instruction(consumer.opcode, consumer.shape, operands,
                                           consumer.attributes, consumer.called_computations,
                                           consumer.name, consumer.metadata))
        body.append(fused.root)
    fused.instructions = params + body  # XLA's printing order; already topological

    name = f"dot_{fused.root.opcode}_fusion".replace("-", "_")
    fusion = computation.add(Instruction("fusion", consumer.shape, inputs, {"kind": "kOutput"},
                                         [fused], name, consumer.metadata))
    consumer.replace_all_uses_with(fusion)
    computation.remove(consumer)
    computation.remove(dot)
    if consumer.opcode == "fusion":
        module.remove_computation(consumer.fused_computation)
    return fusion


def fuse_outputs(computation: Computation) -> int:
    """Merge every dot of `computation` with its epilogue; the number of fusions made."""
    merged = 0
    for dot in [inst for inst in computation.instructions if inst.opcode == "dot"]:
        consumer = output_fusion_consumer(dot)
        if consumer is not None:
            _merge(computation, dot, consumer)
            merged += 1
    if merged:
        computation.sort()
    return merged


@dataclass(frozen=True)
class OutputFusion(Pass):
    """Needs: a module that verifies; best after `fuse` (epilogues are kLoop fusions).

    Guarantees: every top-level dot whose only user reads it elementwise (see the
    module docstring) is merged with that user into one `fusion` of kind kOutput
    whose computation holds the dot, reading parameters, and the epilogue; the
    module still verifies and computes the same values.
    """

    name: ClassVar[str] = "output-fusion"

    def run(self, module: HloModule) -> bool:
        merged = 0
        for computation in fusion_targets(module):
            merged += fuse_outputs(computation)
        return merged > 0
