"""Writes the JAX-printed control-flow modules of this folder (run with JAX, not by the
tests): for each function, `NAME.hlo` (`jax.jit(f).lower(*args).as_text(dialect="hlo")`),
`NAME.optimized.hlo` (XLA's CPU-optimized text, `.compile().as_text()`) and `NAME.npz`
(the inputs `arg0`, `arg1`, ... and JAX's outputs `out0`, `out1`, ...).

    python3 -m venv /tmp/jaxvenv && /tmp/jaxvenv/bin/pip install jax
    /tmp/jaxvenv/bin/python tests/hlo/jax_control_flow/make_texts.py
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

HERE = Path(__file__).parent


def scan_cumulative(xs, h0, w):
    def step(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum()

    return lax.scan(step, h0, xs)


def while_doubling(x, limit):
    def cond(state):
        value, _ = state
        return jnp.all(value < limit)

    def body(state):
        value, count = state
        return value * 2.0, count + 1

    return lax.while_loop(cond, body, (x, jnp.int32(0)))


def fori_polynomial(n, x, coefficients):
    def body(i, acc):
        return acc * x + coefficients[i]

    return lax.fori_loop(0, n, body, jnp.zeros_like(x))


def fori_nested(x):
    def outer(i, acc):
        def inner(j, a):
            return a + jnp.sin(a * (i + j).astype(a.dtype))

        return lax.fori_loop(0, 3, inner, acc) * 0.5

    return lax.fori_loop(0, 4, outer, x)


def cond_branches(p, x, y):
    return lax.cond(p, lambda a, b: (jnp.exp(a), b.sum()), lambda a, b: (a * 2, b.max()), x, y)


def switch_three(i, x):
    return lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * v], x)


def scan_tensor_list(xs):
    """A buffer filled row by row (how TensorLists lower), then read back reversed."""
    def fill(buffer, i):
        return lax.dynamic_update_slice(buffer, (xs[i] * i)[None], (i, 0)), None

    buffer, _ = lax.scan(fill, jnp.zeros_like(xs), jnp.arange(xs.shape[0]))

    def read(total, i):
        row = lax.dynamic_slice(buffer, (xs.shape[0] - 1 - i, 0), (1, xs.shape[1]))
        return total + row[0] * (i + 1), None

    total, _ = lax.scan(read, jnp.zeros(xs.shape[1], xs.dtype), jnp.arange(xs.shape[0]))
    return buffer, total


rng = np.random.default_rng(0)
f32 = np.float32
CASES = {
    "scan_cumulative": (scan_cumulative, [rng.standard_normal((6, 2, 3)).astype(f32),
                                          np.zeros((2, 3), f32),
                                          (rng.standard_normal((3, 3)) * 0.5).astype(f32)]),
    "while_doubling": (while_doubling, [np.array([0.5, 1.5, 3.0], f32), f32(100.0)]),
    "fori_polynomial": (fori_polynomial, [np.int32(4), np.linspace(-1, 1, 5, dtype=f32),
                                          np.array([1, -2, 0.5, 3, 9], f32)]),
    "fori_polynomial_zero_trips": (fori_polynomial, [np.int32(0), np.ones(5, f32),
                                                     np.array([1, -2, 0.5, 3, 9], f32)]),
    "fori_nested": (fori_nested, [np.linspace(0.1, 1, 4, dtype=f32)]),
    "cond_true": (cond_branches, [np.bool_(True), np.array([0, 1, -1], f32),
                                  np.arange(4, dtype=f32)]),
    "cond_false": (cond_branches, [np.bool_(False), np.array([0, 1, -1], f32),
                                   np.arange(4, dtype=f32)]),
    "switch_in_range": (switch_three, [np.int32(1), np.linspace(-2, 2, 6, dtype=f32)]),
    "switch_out_of_range": (switch_three, [np.int32(7), np.linspace(-2, 2, 6, dtype=f32)]),
    "scan_tensor_list": (scan_tensor_list, [rng.standard_normal((5, 3)).astype(f32)]),
}


def main() -> None:
    for name, (function, args) in CASES.items():
        lowered = jax.jit(function).lower(*args)
        (HERE / f"{name}.hlo").write_text(lowered.as_text(dialect="hlo"))
        (HERE / f"{name}.optimized.hlo").write_text(lowered.compile().as_text())
        outputs = jax.tree_util.tree_leaves(jax.jit(function)(*args))
        arrays = {f"arg{n}": np.asarray(a) for n, a in enumerate(args)}
        arrays.update({f"out{n}": np.asarray(o) for n, o in enumerate(outputs)})
        np.savez(HERE / f"{name}.npz", **arrays)
        print(name, [o.shape for o in outputs])


if __name__ == "__main__":
    main()
