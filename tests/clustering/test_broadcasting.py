"""Property-based: `LoweringContext.broadcast_to` agrees with NumPy's broadcasting rules."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import broadcastable_shapes

from tfxla_lite.clustering.registry import LoweringContext
from tfxla_lite.hlo import HloModule, Shape
from tfxla_lite.hlo.evaluator import evaluate


@st.composite
def shape_pairs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    target = draw(st.lists(st.integers(0, 4), max_size=4).map(tuple))
    source = draw(broadcastable_shapes(target, min_side=0, max_side=4))
    # broadcastable_shapes is symmetric; keep the pairs NumPy broadcasts one way.
    if np.broadcast_shapes(source, target) != target:
        source = tuple(1 for _ in source[:len(target)])
    return source, target


@settings(max_examples=60, deadline=None)
@given(shape_pairs())
def test_broadcast_to_matches_numpy(pair: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    source, target = pair
    module = HloModule("broadcast")
    entry = module.new_computation("main", entry=True)
    ctx = LoweringContext(module, entry)
    x = entry.add_parameter(0, Shape("f32", source), "arg0")
    entry.root = entry.create("tuple", [ctx.broadcast_to(x, target)])
    value = np.arange(int(np.prod(source)), dtype=np.float32).reshape(source)
    (result,) = evaluate(module, value)
    np.testing.assert_array_equal(result, np.broadcast_to(value, target))
