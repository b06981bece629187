"""The HLO IR, its text format, verifier and NumPy reference evaluator.

Imports NumPy only: this package, `tfxla_lite.passes` and `tfxla_lite.codegen`
form the compiler core, usable and tested without TensorFlow.
"""

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import OPCODES, ShapeError, infer_shape
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.shape import Shape, element_type_of, numpy_dtype

__all__ = [
    "OPCODES",
    "ParseError",
    "Computation",
    "HloModule",
    "Instruction",
    "Shape",
    "ShapeError",
    "element_type_of",
    "infer_shape",
    "numpy_dtype",
    "parse_module",
]
