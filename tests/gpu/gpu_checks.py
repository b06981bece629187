"""Tolerances and comparisons shared by the GPU tests that run kernels (on a GPU, or on
the CPU emulator): results against the NumPy evaluator."""

from __future__ import annotations

import numpy as np

# Relative and absolute tolerance per float type. libdevice's (or glibc's)
# transcendentals are within a few ulps; f16/bf16 compute in float and round per op, so
# they may differ from an evaluator computing in their own precision by an ulp, and
# their reductions fold in another order (tree) than the evaluator's (sequential).
RTOL = {"f16": 1e-2, "bf16": 4e-2, "f32": 2e-5, "f64": 1e-12}
ATOL = {"f16": 1e-3, "bf16": 1e-2, "f32": 1e-6, "f64": 1e-12}


def element_type(dtype: np.dtype) -> str | None:
    if dtype.name == "bfloat16":
        return "bf16"
    return {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32",
            np.dtype(np.float64): "f64"}.get(dtype)


def assert_matches(actual: list, expected: list, what: str) -> None:
    """Equal dtypes and shapes; integers and bools exact, NaN where NaN, floats close."""
    assert len(actual) == len(expected), what
    for n, (got, wanted) in enumerate(zip(actual, expected, strict=True)):
        got, wanted = np.asarray(got), np.asarray(wanted)
        assert got.dtype == wanted.dtype and got.shape == wanted.shape, (what, n)
        kind = element_type(got.dtype)
        if kind is not None:
            np.testing.assert_allclose(got.astype(np.float64), wanted.astype(np.float64),
                                       rtol=RTOL[kind], atol=ATOL[kind], equal_nan=True,
                                       err_msg=f"{what} output {n}")
        else:
            np.testing.assert_array_equal(got, wanted, err_msg=f"{what} output {n}")


FLOAT_EDGES = (-0.0, 0.0, float("inf"), float("-inf"), float("nan"), 1.5, -2.5, 3.0e38, -1e30,
               65504.0, 70000.0, 2.5, 0.5, -0.5, 1e-8, 2.0**31, -(2.0**63), 255.9)


def edge_arguments(module: object, seed: int = 0) -> list[np.ndarray]:
    """One argument per parameter, holding its type's edge values (NaN, infinities,
    -0.0, values beyond every integer type, integer extremes) among random ones."""
    rng = np.random.default_rng(seed)
    args = []
    for p in module.entry.parameters:  # type: ignore[attr-defined]
        dtype, n = p.shape.numpy_dtype, p.shape.num_elements
        if dtype == np.bool_:
            values = rng.integers(0, 2, size=n).astype(bool)
        elif dtype.kind == "f" or dtype.name == "bfloat16":
            pool = np.concatenate([np.array(FLOAT_EDGES), rng.normal(size=n) * 100])
            with np.errstate(over="ignore"):  # edges beyond f16's range become infinities
                values = rng.permutation(pool[:max(n, len(FLOAT_EDGES))])[:n].astype(dtype)
        else:
            info = np.iinfo(dtype)
            edges = [info.min, info.max, 0, 1, info.max - 1, info.min + 1]
            pool = edges + [int(v) for v in rng.integers(max(info.min, -100), 100, size=n)]
            values = np.array(rng.permutation(np.array(pool, dtype=object))[:n].tolist(),
                              dtype=dtype)
        args.append(values.reshape(p.shape.dims))
    return args
