"""Source lines name the user's frame, not one inside pytest, absl or Keras, and the
library frame that made the op for the user (`clustering/registry.py` `source_frames`):
the must-compile error, the report, the HLO metadata and the dumps agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.clustering.mark import format_source

HERE = Path(__file__).name
STRICT = tl.Options(strict_jit_compile=True)


def _line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_line_of" not in line)


def _ops(f, spec: tf.TensorSpec) -> dict[str, tf.Operation]:
    graph = tf.function(f).get_concrete_function(spec).graph
    return {op.type: op for op in graph.get_operations()}


def with_layer(layer: keras.layers.Layer):
    def f(x):
        return tf.linalg.svd(layer(x), compute_uv=False)  # marker: layer call

    return f


def plain(x):
    y = tf.exp(x) * 2.0
    return tf.linalg.svd(y, compute_uv=False)  # marker: plain op


def test_a_keras_layer_op_names_this_file_via_keras() -> None:
    ops = _ops(with_layer(keras.layers.Dense(3)), tf.TensorSpec([2, 4], tf.float32))
    source = format_source(ops["MatMul"])
    line = _line_of("marker: layer call")
    assert re.fullmatch(rf".*{HERE}:{line} \(via keras/src/[\w/]+\.py:\d+\)", source), source


def test_a_plain_op_names_this_file_alone() -> None:
    ops = _ops(plain, tf.TensorSpec([3, 3], tf.float32))
    assert format_source(ops["Exp"]).endswith(f"{HERE}:{_line_of('y = tf.exp(x)')}")
    assert format_source(ops["Svd"]).endswith(f"{HERE}:{_line_of('marker: plain op')}")


def test_error_report_hlo_and_dumps_agree(tmp_path: Path) -> None:
    # Svd has no lowering: it stays in TF with its source; Exp and Mul compile.
    line = _line_of("marker: plain op")
    x = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    with pytest.raises(tl.CompilationError) as info:
        tl.function(plain, jit_compile=True, options=STRICT)(x)
    [offending] = [n for n in info.value.offending if n.op_type == "Svd"]
    assert offending.source.endswith(f"{HERE}:{line}")
    assert f"{HERE}:{line}" in str(info.value.message)
    assert "_pytest" not in str(info.value.message)

    f = tl.function(plain, options=tl.Options(min_cluster_size=1, dump_to=str(tmp_path)))
    np.testing.assert_allclose(f(x).numpy(), tf.function(plain)(x).numpy(), rtol=1e-5)
    report = f.explain(x)
    [node] = [n for n in report.fallbacks if n.op_type == "Svd"]
    assert node.source == offending.source
    hlo = f.experimental_get_compiler_ir(x)(stage="hlo")
    exp_line = _line_of("y = tf.exp(x)")
    assert re.search(rf'op_type="Exp" [^}}]*source_file="[^"]*{HERE}" '
                     rf'source_line={exp_line}', hlo), hlo
    [table] = tmp_path.glob("*.clustering.json")
    rows = json.loads(table.read_text())
    text = json.dumps(rows)
    assert offending.source in text and f"{HERE}:{exp_line}" in text
    assert offending.source in (tmp_path / "report.html").read_text()


def test_the_keras_frame_in_a_must_compile_error() -> None:
    layer = keras.layers.Dense(3)
    x = np.ones((2, 4), np.float32)
    with pytest.raises(tl.CompilationError) as info:
        tl.function(with_layer(layer), jit_compile=True, options=STRICT)(x)
    [node] = [n for n in info.value.offending if n.op_type == "Svd"]
    assert node.source.endswith(f"{HERE}:{_line_of('marker: layer call')}")


@pytest.mark.parametrize("filename, users", [
    ("/venv/lib/python3.11/site-packages/_pytest/python.py", False),
    ("/venv/lib/python3.11/site-packages/absl/testing/parameterized.py", False),
    ("/venv/lib/python3.11/site-packages/keras/src/layers/convolutional/base_conv.py", False),
    ("/venv/lib/python3.11/site-packages/keras/src/layers/convolutional/conv_test.py", True),
    ("/work/project/tests/keras/test_model.py", True),  # a folder named keras is the user's
    ("/work/project/keras/model.py", True),
    ("<frozen runpy>", False),
])
def test_whose_frame_a_file_is(filename: str, users: bool) -> None:
    from tfxla_lite.clustering.registry import _is_installed_file

    assert _is_installed_file(filename) is not users
