"""`--dump_to`: XLA-style file names and contents per compiled cluster, the clustering
decisions per trace (pbtxt before and after marking, the table), dynamic clusters
dumping per shape, stdout for `--dump_hlo_as_text` alone, and I/O errors that only warn.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format

import tfxla_lite as tl
from tfxla_lite import dump
from tfxla_lite.driver import build_program
from tfxla_lite.hlo import parse_module
from tfxla_lite.runtime import loader

MODULE_FILE = re.compile(r"^module_(\d{4})\.(.+)\.(before_optimizations\.txt|"
                         r"after_optimizations\.txt|buffer-assignment\.txt|ir-no-opt\.ll|"
                         r"ir-with-opt\.ll)$")
SUFFIXES = {"before_optimizations.txt", "after_optimizations.txt", "buffer-assignment.txt",
            "ir-no-opt.ll", "ir-with-opt.ll"}


def mixed(x, y):  # noqa: ANN001, ANN201
    a = tf.exp(x) * y + 1.0
    text = tf.strings.as_string(tf.reduce_sum(a, axis=1))  # no lowering: stays in TF
    return tf.nn.softmax(a) @ tf.transpose(y), text


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    return x, x[::-1].copy()


def _compiled_dump(directory: Path) -> tl.Function:
    f = tl.function(mixed, options=tl.Options(dump_to=str(directory), min_cluster_size=1))
    got, _ = f(*_inputs())
    want, _ = tf.function(mixed)(*_inputs())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    return f


def _module_files(directory: Path) -> dict[str, dict[str, Path]]:
    """{module prefix: {suffix: path}} of every module_NNNN.* file."""
    modules: dict[str, dict[str, Path]] = {}
    for path in directory.iterdir():
        match = MODULE_FILE.match(path.name)
        if match:
            modules.setdefault(f"module_{match[1]}.{match[2]}", {})[match[3]] = path
    return modules


def test_cluster_files_are_named_like_xla_and_parse(tmp_path: Path) -> None:
    _compiled_dump(tmp_path)
    modules = _module_files(tmp_path)
    assert len(modules) == 1
    (prefix, files), = modules.items()
    assert set(files) == SUFFIXES
    assert prefix.endswith("_cluster_0") and "__inference_mixed_" in prefix
    before = parse_module(files["before_optimizations.txt"].read_text())
    after = parse_module(files["after_optimizations.txt"].read_text())
    assert not any(i.opcode == "fusion" for i in before.entry.instructions)
    assert any(i.opcode == "fusion" for i in after.entry.instructions)
    assignment = files["buffer-assignment.txt"].read_text()
    assert assignment.startswith("BufferAssignment:") and "total temp bytes" in assignment
    for suffix in ("ir-no-opt.ll", "ir-with-opt.ll"):
        llvm.parse_assembly(files[suffix].read_text()).verify()


def test_module_numbers_count_up_across_the_process(tmp_path: Path) -> None:
    _compiled_dump(tmp_path / "a")
    _compiled_dump(tmp_path / "b")
    (first,), (second,) = _module_files(tmp_path / "a"), _module_files(tmp_path / "b")
    assert int(second[7:11]) > int(first[7:11])


def test_clustering_decisions_per_trace(tmp_path: Path) -> None:
    f = _compiled_dump(tmp_path)
    report = f.explain(*_inputs())
    stem = dump.file_stem(report.function_name)
    table = json.loads((tmp_path / f"{stem}.clustering.json").read_text())
    graph = f._tracer.get_concrete_function(*_inputs()).graph
    names = [op.name for op in graph.get_operations()]
    assert [node["name"] for node in table["nodes"]] == names
    by_name = {node["name"]: node for node in table["nodes"]}
    for node in table["nodes"]:
        assert (node["cluster"] is None) != (node["reason"] is None), node
        assert node["source"] and re.search(r"test_dump_files\.py:\d+$", node["source"]), node
    assert by_name["Exp"]["cluster"] == "cluster_0"
    assert by_name["AsString"]["reason"] == "op type AsString has no lowering"
    assert table["clusters"][0]["compiled"] and table["clusters"][0]["kernel_count"] >= 1

    text = (tmp_path / f"{stem}.clustering.txt").read_text()
    for name in names:
        assert re.search(rf"^{re.escape(name)} ", text, re.MULTILINE), name
    assert "TF: op type AsString has no lowering" in text

    before = text_format.Parse((tmp_path / f"{stem}.before_marking.pbtxt").read_text(),
                               tf.compat.v1.GraphDef())
    after = text_format.Parse((tmp_path / f"{stem}.after_marking.pbtxt").read_text(),
                              tf.compat.v1.GraphDef())
    assert [n.name for n in before.node] == [n.name for n in after.node] == names
    assert not any(dump.CLUSTER_ATTR in n.attr for n in before.node)
    marked = {n.name: n.attr[dump.CLUSTER_ATTR].s.decode() for n in after.node
              if dump.CLUSTER_ATTR in n.attr}
    assert marked == {name: node["cluster"] for name, node in by_name.items()
                      if node["cluster"] is not None}


def test_dynamic_cluster_dumps_each_shape_as_it_compiles(tmp_path: Path) -> None:
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def center(x):  # noqa: ANN001, ANN202
        y = tf.tanh(x) * 2.0
        return y - tf.reduce_mean(y, axis=1, keepdims=True)

    options = tl.Options(dump_to=str(tmp_path), min_cluster_size=1)
    program = build_program(center.get_concrete_function(), None, options, dynamic=True)
    try:
        assert len(program.dynamic_clusters) == 1
        assert not _module_files(tmp_path)  # nothing compiled before the first run
        for rows in (3, 5, 3):
            x = np.ones((rows, 4), np.float32)
            np.testing.assert_allclose(program.run(x).numpy(), center(x).numpy(), atol=1e-6)
        modules = _module_files(tmp_path)
        assert len(modules) == 2 and all(set(files) == SUFFIXES for files in modules.values())
        shapes = sorted(parse_module(files["before_optimizations.txt"].read_text())
                        .entry.parameters[0].shape.dims for files in modules.values())
        assert shapes == [(3, 4), (5, 4)]
        page = (tmp_path / "report.html").read_text()
        assert "cluster_0 ([3, 4])" in page and "cluster_0 ([5, 4])" in page
    finally:
        for dynamic_cluster in program.dynamic_clusters:
            loader.unregister(dynamic_cluster.key)


def test_dump_hlo_as_text_alone_prints_to_stdout(capsys: pytest.CaptureFixture) -> None:
    f = tl.function(mixed, options=tl.Options(dump_hlo_as_text=True, min_cluster_size=1))
    f(*_inputs())
    out = capsys.readouterr().out
    names = re.findall(r"^\*\*\* Begin (\S+) \*\*\*$", out, re.MULTILINE)
    assert [n.split(".")[-2] for n in names] == ["before_optimizations", "after_optimizations"]
    body = out.split(f"*** Begin {names[1]} ***\n")[1].split(f"\n*** End {names[1]} ***")[0]
    assert any(i.opcode == "fusion" for i in parse_module(body).entry.instructions)


def test_io_errors_warn_and_the_program_runs(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger="tfxla_lite"):
        f = tl.function(mixed, options=tl.Options(dump_to=str(blocker), min_cluster_size=1))
        f(*_inputs())
        f(*(v[:2] for v in _inputs()))  # a second trace: no second warning
    warnings = [r.getMessage() for r in caplog.records if "cannot write dumps" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker) in warnings[0]
    assert f.explain(*_inputs()).compiled_clusters
    assert blocker.read_text() == "not a directory"


def test_no_dumps_without_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tl.function(mixed, options=tl.Options(min_cluster_size=1))(*_inputs())
    assert not any(tmp_path.iterdir())


def test_control_inputs_are_listed_sorted() -> None:
    """A node's control inputs have no order, and TF adds automatic ones in an order that
    changes from trace to trace: the dump lists them sorted, so dumps compare across runs."""
    from tfxla_lite.report import ClusteringReport

    graph = tf.Graph()
    with graph.as_default():
        first = tf.constant(1.0, name="zeta")
        second = tf.constant(2.0, name="alpha")
        third = tf.constant(3.0, name="mu")
        data = tf.constant(4.0, name="data")
        with tf.control_dependencies([first, third, second]):
            tf.identity(data, name="joined")
    assert [c.name for c in graph.get_operation_by_name("joined").control_inputs] != [
        "alpha", "mu", "zeta"]  # TF's own order is not the sorted one here
    nodes = {n.name: n for n in dump.trace_nodes(graph, ClusteringReport("f", None))}
    assert nodes["joined"].control_inputs == ["alpha", "mu", "zeta"]
