"""Ahead-of-time libraries from TF functions (`tfxla_lite/aot.py`, `tfxla-lite aot`): a C
program built against the object and header computes what TF does, and functions or
signatures that cannot make a library are refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from aot_c_program import ALLOWED_SHARED, build, run, shared_libraries
from tolerances import assert_close

from tfxla_lite import aot
from tfxla_lite.cli import main as cli_main

_RNG = np.random.default_rng(7)
W1 = (_RNG.standard_normal((784, 64)) * 0.05).astype(np.float32)
B1 = _RNG.standard_normal(64).astype(np.float32)
W2 = (_RNG.standard_normal((64, 10)) * 0.1).astype(np.float32)


def mlp_forward(x):
    """A dense ReLU layer, a softmax over 10 classes and a per-row sum of the features."""
    hidden = tf.nn.relu(tf.matmul(x, tf.constant(W1)) + tf.constant(B1))
    return tf.nn.softmax(tf.matmul(hidden, tf.constant(W2))), tf.reduce_sum(hidden, axis=1)


def test_mlp_forward_in_c_matches_tf(tmp_path):
    library = aot.compile_library(mlp_forward, ["f32[8,784]"])
    assert [str(s) for s in library.output_shapes] == ["f32[8,10]{1,0}", "f32[8]{0}"]
    program = build(library, tmp_path)
    x = _RNG.standard_normal((8, 784)).astype(np.float32)
    x[1, :3] = [np.nan, np.inf, -0.0]
    probabilities, sums = run(program, library, [x])
    want_probabilities, want_sums = (t.numpy() for t in mlp_forward(tf.constant(x)))
    assert_close(probabilities, want_probabilities, "Softmax", "mlp_forward")
    assert_close(sums, want_sums, "Sum", "mlp_forward")
    assert all(any(s.startswith(a) for a in ALLOWED_SHARED) for s in shared_libraries(program))


@pytest.mark.parametrize("dtype,signature", [(tf.float16, "f16[4,33]"),
                                             (tf.bfloat16, "bf16[4,33]")])
def test_two_byte_floats_in_c_match_tf(tmp_path, dtype, signature):
    def scaled_tanh(x, y):
        return tf.tanh(x * y) + tf.reduce_max(x, axis=1, keepdims=True)

    library = aot.compile_library(scaled_tanh, [signature, signature], name="scaled_tanh")
    program = build(library, tmp_path)
    x, y = (tf.cast(_RNG.standard_normal((4, 33)), dtype).numpy() for _ in range(2))
    (got,) = run(program, library, [x, y])
    assert_close(got, scaled_tanh(tf.constant(x), tf.constant(y)).numpy(), "Tanh", signature)


def test_passthrough_empty_and_scalar_results(tmp_path):
    """An argument returned as it is (copied into its result), a 0-sized argument and
    result, a scalar result; an assertion is left out."""
    def edges(x, y):
        tf.debugging.assert_less(tf.reduce_sum(y), 1.0, message="left out, as must-compile does")
        return x, tf.reduce_sum(y), y * 2.0

    library = aot.compile_library(edges, ["f32[3,2]", "f32[0,4]"])
    program = build(library, tmp_path)
    x = np.array([[np.nan, -0.0], [np.inf, 1.5], [-np.inf, 3.0]], np.float32)
    y = np.zeros((0, 4), np.float32)
    got = run(program, library, [x, y])
    want = [t.numpy() for t in edges(tf.constant(x), tf.constant(y))]
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, "Identity", "edges")


def test_cli_writes_object_and_header(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text("import tensorflow as tf\n\n"
                      "def double_sum(x):\n"
                      "    return tf.reduce_sum(x * 2.0, axis=0)\n")
    prefix = tmp_path / "libdouble"
    assert cli_main(["aot", f"{source}:double_sum", "--signature", "f32[5,3]",
                     "-o", str(prefix)]) == 0
    header = (tmp_path / "libdouble.h").read_text()
    assert "int double_sum_run(const void** inputs, void** outputs, void* temp);" in header
    assert "#define DOUBLE_SUM_INPUT0_DIMS {5, 3}" in header
    assert "#define DOUBLE_SUM_OUTPUT0_DIMS {3}" in header
    assert (tmp_path / "libdouble.o").read_bytes()[:4] == b"\x7fELF"
    assert "double_sum_run" in capsys.readouterr().out


def test_signature_mismatch_is_refused(tmp_path, capsys):
    def matmul(a, b):
        return tf.matmul(a, b)

    with pytest.raises(aot.AotError, match=r"cannot be traced with the signature"):
        aot.compile_library(matmul, ["f32[2,3]"])
    with pytest.raises(aot.AotError, match=r"cannot be traced with the signature"):
        aot.compile_library(matmul, ["f32[2,3]", "f32[4,5]"])
    with pytest.raises(aot.AotError, match=r"unknown element type 'float'"):
        aot.compile_library(matmul, ["float[2,3]", "f32[3,5]"])
    with pytest.raises(aot.AotError, match=r"not an element type and dimensions"):
        aot.compile_library(matmul, ["f32(2,3)", "f32[3,5]"])
    hlo = tmp_path / "add.hlo"
    hlo.write_text("HloModule add\nENTRY main {\n  x = f32[3] parameter(0)\n"
                   "  ROOT y = f32[3] add(x, x)\n}\n")
    assert cli_main(["aot", str(hlo), "--signature", "f32[4]", "-o",
                     str(tmp_path / "libadd")]) == 2
    assert "signature mismatch: the module's parameters are (f32[3]), the signature says " \
           "(f32[4])" in capsys.readouterr().err


def test_unsupported_function_is_refused():
    def stringy(x):
        return tf.strings.length(tf.strings.as_string(x))

    with pytest.raises(aot.AotError, match=r"cannot be compiled whole[\s\S]*AsString"):
        aot.compile_library(stringy, ["f32[3]"])

    weights = tf.Variable(tf.ones([3]))

    def with_variable(x):
        return x * weights

    with pytest.raises(aot.AotError, match="captures 1 tensor"):
        aot.compile_library(with_variable, ["f32[3]"])
