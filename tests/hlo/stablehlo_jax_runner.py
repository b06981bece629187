"""Runs StableHLO text with JAX's MLIR bindings and XLA: the outside consumer of the
StableHLO export's tests (test_stablehlo.py). Runs in a Python that has JAX, never in
the project's own environment:

    python stablehlo_jax_runner.py CASES.npz RESULTS.npz

CASES.npz holds `count`, and per case k `text_k` (the module) and `input_k_i` arrays;
RESULTS.npz gets `output_k_j` arrays, or `error_k` with the message where JAX's parser,
verifier or compiler refused case k. bfloat16 arrays, which .npz files cannot hold, travel
as their uint16 bits with a `bf16_...` flag beside them (`input_k_i` or `output_k_j`).
"""

from __future__ import annotations

import sys

import jax
import ml_dtypes
import numpy as np

jax.config.update("jax_enable_x64", True)

from jax._src import compiler, xla_bridge  # noqa: E402
from jax._src.interpreters import mlir  # noqa: E402
from jax._src.lib import xla_client  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402


def run(text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    context = mlir.make_ir_context()
    module = ir.Module.parse(text, context=context)
    if not module.operation.verify():
        raise ValueError("the module does not verify")
    backend = xla_bridge.get_backend("cpu")
    devices = xla_client.DeviceList(tuple(backend.devices()[:1]))
    executable = compiler.backend_compile_and_load(backend, module, devices,
                                                   xla_client.CompileOptions(), [])
    outputs = executable.execute([jax.device_put(x) for x in inputs])
    return [np.asarray(o) for o in outputs]


def main(cases_path: str, results_path: str) -> None:
    cases = np.load(cases_path)
    results: dict[str, np.ndarray] = {}
    for k in range(int(cases["count"])):
        text = str(cases[f"text_{k}"])
        inputs = []
        while f"input_{k}_{len(inputs)}" in cases:
            key = f"input_{k}_{len(inputs)}"
            value = cases[key]
            inputs.append(value.view(ml_dtypes.bfloat16) if f"bf16_{key}" in cases else value)
        try:
            for j, output in enumerate(run(text, inputs)):
                if output.dtype == ml_dtypes.bfloat16:
                    output = output.view(np.uint16)
                    results[f"bf16_output_{k}_{j}"] = np.array(True)
                results[f"output_{k}_{j}"] = output
        except Exception as error:  # reported per case, the others still run
            results[f"error_{k}"] = np.array(f"{type(error).__name__}: {error}")
    np.savez(results_path, **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
