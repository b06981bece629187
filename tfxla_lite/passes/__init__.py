"""HLO-to-HLO passes, the pipeline that orders them, and buffer assignment.

Sits between the IR (`tfxla_lite.hlo`) and the backends (`tfxla_lite.codegen`):
`optimize(module)` runs the default pipeline in place (call inlining,
simplification, constant folding, CSE, loop-invariant code motion, DCE, fusion,
multi-output fusion, output copies, memory scheduling) on the entry, then on each
computation a `while` or `conditional` calls (`control_flow.py`), then
`assign_buffers(module)` plans the memory codegen and the runtime use (packing
temporaries with `heap_simulator.py`).
Imports `tfxla_lite.hlo` and NumPy only.
"""

from __future__ import annotations

from tfxla_lite.passes.buffer_assignment import BufferAssignment, BufferSlice, assign_buffers
from tfxla_lite.passes.pipeline import DEFAULT_PIPELINE, PASSES, optimize, parse_pipeline

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "BufferAssignment",
    "BufferSlice",
    "assign_buffers",
    "optimize",
    "parse_pipeline",
]
