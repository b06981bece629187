"""`Executable.__call__` keeps its temp arena between calls and never shares one
between calls running at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from codegen_helpers import as_args, build
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.shape import Shape

X, W = Shape("f32", (256, 64)), Shape("f32", (64, 64))


def _module():  # type: ignore[no-untyped-def]
    def body(c, ps):  # type: ignore[no-untyped-def]
        def dot(a, b):  # type: ignore[no-untyped-def]
            return c.create("dot", [a, b], lhs_contracting_dims=(1,), rhs_contracting_dims=(0,))
        hidden = c.create("transpose", [c.create("tanh", [dot(ps[0], ps[1])])], dimensions=(1, 0))
        return [dot(c.create("transpose", [hidden], dimensions=(1, 0)), ps[1])]

    return build("two_layers", [X, W], body)


def test_arena_is_kept_and_never_shared() -> None:
    executable = compile_module(_module())
    assert executable.temp_bytes > 0
    arguments = [as_args([X, W], seed=seed, edges=False) for seed in range(8)]
    expected = [evaluate(_module(), *args) for args in arguments]
    executable(*arguments[0])
    assert len(executable._arenas) == 1  # kept for the next call
    first = executable._arenas[0]
    executable(*arguments[0])
    assert len(executable._arenas) == 1 and executable._arenas[0] is first

    def run(n: int) -> list[np.ndarray]:
        return [executable(*arguments[n % 8])[0] for _ in range(10)]

    with ThreadPoolExecutor(max_workers=4) as pool:
        for n, results in enumerate(pool.map(run, range(8))):
            want = expected[n % 8]
            want = want[0] if isinstance(want, tuple) else want
            for result in results:
                assert_close(result, want, "MatMul")
    assert 1 <= len(executable._arenas) <= 4
