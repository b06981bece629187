"""How a kernel's range function splits its work: `Partition` and its fixed sizes.

Where it sits: `compiler.plan_partition` picks a kernel's partition and
`multi_output.py` its own, both from these definitions; `parallel.py` runs the units.
Held apart from `compiler.py` so that the kernel shapes it imports can use them.
"""

from __future__ import annotations

from dataclasses import dataclass

# Parts of a flat range start at multiples of 64 elements (whole cache lines, whole
# vectors); a split full reduction uses chunks of this many elements, at most 64 of
# them, fixed by the input size alone so that the result never depends on the
# number of threads.
FLAT_ALIGN = 64
SPLIT_CHUNK = 1 << 16
SPLIT_MAX_CHUNKS = 64


@dataclass(frozen=True)
class Partition:
    """How a kernel's range function splits its work: `total` units of `kind`.

    `flat`: elements of a flat loop; `dimension`: the output's dimension `dim`;
    `column`: the operand's dimension `dim` of a column reduction; `columns`: units of
    a column reduction that keeps the minor dimensions (`column_reduction.py`; `chunk`
    chunks of rows, partial results when more than 1); `split`: chunks of `chunk`
    elements of a full reduction, folded into partial results; `rows`: rows of a row
    fusion (`row_kernel.py`). `work` is the
    largest element count the kernel reads or writes (the threshold compares it).
    """

    kind: str
    total: int
    work: int
    dim: int = 0
    chunk: int = 0

    @property
    def align(self) -> int:
        return FLAT_ALIGN if self.kind == "flat" else 1

    @property
    def has_partials(self) -> bool:
        """Whether the range function stores partial results the launcher combines."""
        return self.kind == "split" or (self.kind == "columns" and self.chunk > 1)


