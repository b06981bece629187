"""Property-based checks (hypothesis): random broadcasts, transposes and reductions of
random shapes, including size-0 and size-1 dimensions, compiled and compared."""

from __future__ import annotations

import numpy as np
from codegen_helpers import build, check
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfxla_lite.hlo.shape import Shape

# Rank >= 1: the evaluator mishandles a rank-0 transpose (reported to its owner).
_dims = st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=3)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dims=_dims, data=st.data())
def test_broadcast_transpose_reduce(dims: list[int], data: st.DataObject) -> None:
    rank = len(dims)
    kept = sorted(data.draw(st.sets(st.integers(0, max(rank - 1, 0)), max_size=rank))
                  if rank else [])
    operand = Shape("f32", tuple(dims[d] for d in kept))
    out = Shape("f32", tuple(dims))
    permutation = tuple(data.draw(st.permutations(range(rank))))
    reduced = tuple(sorted(data.draw(st.sets(st.integers(0, max(rank - 1, 0)), max_size=rank))
                           if rank else []))

    def body(c, ps):  # type: ignore[no-untyped-def]
        wide = c.create("broadcast", [ps[0]], shape=out, dimensions=tuple(kept))
        summed = c.create("add", [wide, ps[1]])
        moved = c.create("transpose", [summed], dimensions=permutation)
        reducer = c.module.reduction_computation("add", "f32")
        total = c.create("reduce", [c.create("multiply", [summed, summed]),
                                    c.add_constant(0.0, "f32")],
                         dimensions=reduced, called_computations=[reducer])
        return [moved, total]

    rng = np.random.default_rng(len(dims))
    args = [rng.uniform(-2, 2, operand.dims).astype(np.float32),
            rng.uniform(-2, 2, out.dims).astype(np.float32)]
    check(build("property", [operand, out], body), args, "reduce")
