"""The Keras-suite driver's own logic, without TensorFlow: reading the plugin's phase log into
outcomes, the set difference of the failures, slices, error headlines, and the plugin with
its crash and timeout handling run on small stand-in test files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tfxla_lite import keras_suite as ks
from tfxla_lite.keras_suite_plugin import headline


def _phases(nodeid: str, call: str = "passed", setup: str = "passed",
            message: str = "") -> list[dict]:
    records = [{"nodeid": nodeid, "when": "start"},
               {"nodeid": nodeid, "when": "setup", "outcome": setup, "message": message}]
    if setup == "passed":
        records.append({"nodeid": nodeid, "when": "call", "outcome": call, "message": message})
    records.append({"nodeid": nodeid, "when": "teardown", "outcome": "passed"})
    return records


def test_outcomes_one_per_test_worst_phase_wins() -> None:
    records = (_phases("a::ok") + _phases("a::bad", call="failed", message="ValueError: x")
               + _phases("a::fixture", setup="failed", message="E: setup")
               + _phases("a::skip", setup="skipped", message="no GPU")
               + [{"nodeid": "b_test.py", "when": "collect", "outcome": "failed",
                   "message": "ModuleNotFoundError: No module named 'jax'"},
                  {"nodeid": "a::died", "when": "start"},
                  {"nodeid": "a::died", "when": "crash", "outcome": "crashed",
                   "message": "the test process ended with -11"},
                  {"nodeid": "a::never", "when": "start"},
                  {"when": "session", "tfxla_lite_enabled": True}])
    result = ks.outcomes(records)
    assert {k: o.outcome for k, o in result.items()} == {
        "a::ok": "passed", "a::bad": "failed", "a::fixture": "error", "a::skip": "skipped",
        "b_test.py": "error", "a::died": "crashed"}
    assert result["a::bad"].message == "ValueError: x"
    assert [o.nodeid for o in result.values() if o.failing] == [
        "a::bad", "a::fixture", "b_test.py", "a::died"]


def test_a_teardown_failure_after_a_passing_body_is_an_error() -> None:
    records = _phases("a::t")
    records[-1] = {"nodeid": "a::t", "when": "teardown", "outcome": "failed", "message": "E"}
    assert ks.outcomes(records)["a::t"].outcome == "error"


def _outcome_map(**kinds: str) -> dict[str, ks.Outcome]:
    return {name: ks.Outcome(name, kind) for name, kind in kinds.items()}


def test_compare_keeps_failures_that_pass_or_are_missing_under_plain_tf() -> None:
    flagged = _outcome_map(both="failed", only="failed", only_error="error", ok="passed",
                           skip="skipped", unseen="crashed", plain_skips="failed")
    plain = _outcome_map(both="error", only="passed", only_error="passed",
                         plain_skips="skipped")
    assert [o.nodeid for o in ks.compare(flagged, plain)] == [
        "only", "only_error", "unseen", "plain_skips"]
    assert ks.compare(flagged, {**plain, **_outcome_map(only="failed", only_error="crashed",
                                                         unseen="failed",
                                                         plain_skips="error")}) == []


def test_rerun_targets_each_once_in_order() -> None:
    failures = [ks.Outcome("f.py::b", "failed"), ks.Outcome("f.py", "error"),
                ks.Outcome("f.py::b", "failed")]
    assert ks.rerun_targets(failures) == ["f.py::b", "f.py"]


def test_counts_and_summary() -> None:
    flagged = _outcome_map(a="passed", b="failed", c="skipped", d="error")
    plain = _outcome_map(b="failed", d="passed")
    result = ks.SuiteResult(flagged, plain, ks.compare(flagged, plain))
    assert result.counts() == {"run": 4, "passed": 1, "failed": 2, "skipped": 1,
                               "failed_plain_tf": 1, "tfxla_lite_only": 1}
    assert ks.summary(result).endswith("1 tfxla-lite-only failures")
    assert ks.report_lines(result)[1].strip().startswith("d  [error]")


@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_slices_partition_the_files(n: int) -> None:
    files = [f"keras/src/layers/{d}/{i}_test.py" for d in "abc" for i in range(7)]
    slices = [ks.slice_files(files[::-1], k, n) for k in range(1, n + 1)]
    assert sorted(path for part in slices for path in part) == sorted(files)
    assert sum(map(len, slices)) == len(files)
    assert slices == [ks.slice_files(files, k, n) for k in range(1, n + 1)]


@pytest.mark.parametrize("text", ["0/4", "5/4", "1", "a/b"])
def test_parse_slice_rejects(text: str) -> None:
    with pytest.raises(Exception, match="--slice"):
        ks.parse_slice(text)


def test_discover_selects_folders_and_files(tmp_path: Path) -> None:
    layers = tmp_path / ks.LAYERS
    for name in ["core/dense_test.py", "core/util.py", "rnn/lstm_test.py", "layer_test.py"]:
        (layers / name).parent.mkdir(parents=True, exist_ok=True)
        (layers / name).write_text("")
    prefix = ks.LAYERS + "/"
    assert ks.discover(tmp_path) == [prefix + p for p in
                                     ["core/dense_test.py", "layer_test.py", "rnn/lstm_test.py"]]
    assert ks.discover(tmp_path, ["rnn", "core/dense_test.py"]) == [
        prefix + "core/dense_test.py", prefix + "rnn/lstm_test.py"]
    with pytest.raises(SystemExit):
        ks.discover(tmp_path, ["nonesuch"])


def _write_tree(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def test_discover_names_resolve_in_layers_then_src(tmp_path: Path) -> None:
    src = ks.SRC + "/"
    _write_tree(tmp_path, [src + p for p in [
        "layers/activations/relu_test.py", "activations/activations_test.py",
        "trainers/trainer_test.py", "trainers/data_adapters/array_data_adapter_test.py",
        "trainers/trainer.py", "backend/tensorflow/saved_model_test.py",
        "backend/jax/trainer_test.py"]])
    # A layers folder keeps its name; one only keras/src has is found there.
    assert ks.discover(tmp_path, ["activations"]) == [src + "layers/activations/relu_test.py"]
    assert ks.discover(tmp_path, ["trainers", "backend/tensorflow"]) == [
        src + "backend/tensorflow/saved_model_test.py",
        src + "trainers/data_adapters/array_data_adapter_test.py",
        src + "trainers/trainer_test.py"]
    # Written from site-packages, as node ids read, a name is not looked up in layers.
    assert ks.discover(tmp_path, [src + "activations", "layers/activations"]) == [
        src + "activations/activations_test.py", src + "layers/activations/relu_test.py"]
    for outside in ["../../keras", "../trainers/../../../x", "keras/src/../../y"]:
        with pytest.raises(SystemExit):
            ks.discover(tmp_path, [outside])


def test_discover_models_adds_the_model_folders(tmp_path: Path) -> None:
    src = ks.SRC + "/"
    _write_tree(tmp_path, [src + f"{folder}/x_test.py" for folder in ks.MODEL_FOLDERS]
                + [src + "layers/core/dense_test.py", src + "backend/jax/x_test.py"])
    models = [src + f"{folder}/x_test.py" for folder in sorted(ks.MODEL_FOLDERS)]
    assert ks.discover(tmp_path, models=True) == models
    assert ks.discover(tmp_path, ["core"], models=True) == sorted(
        [src + "layers/core/dense_test.py", *models])
    assert ks.discover(tmp_path) == [src + "layers/core/dense_test.py"]


def test_main_lists_the_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    models = [f"{ks.SRC}/{folder}/x_test.py" for folder in sorted(ks.MODEL_FOLDERS)]
    _write_tree(tmp_path, [*models, ks.LAYERS + "/core/dense_test.py"])
    monkeypatch.setattr(ks, "site_packages_of_keras", lambda: tmp_path)
    assert ks.main(["--list", "trainers"]) == 0
    assert capsys.readouterr().out.split() == [ks.SRC + "/trainers/x_test.py"]
    assert ks.main(["--list", "--models", "--slice", "2/2"]) == 0
    assert capsys.readouterr().out.split() == models[1::2]
    assert ks.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == [ks.LAYERS + "/core/dense_test.py"]


def test_headline_finds_the_op_error_in_graph_execution_errors() -> None:
    message = ("Graph execution error:\n\nDetected at node convolution defined at (most "
               "recent call last):\n  File \"x.py\", line 3, in f\n\n  File \"y.py\", line 9"
               ", in g\n\ninput and filter must have the same depth: 4 vs 2\n\t "
               "[[{{node convolution}}]] [Op:__inference_f_12]")
    assert headline(message) == ("Graph execution error: input and filter must have the "
                                 "same depth: 4 vs 2")
    assert headline("ValueError: bad\nmore") == "ValueError: bad"
    assert headline("") == ""


STAND_IN_TESTS = {
    "good_test.py": "def test_one():\n    pass\n\ndef test_two():\n    assert 1 == 2, 'no'\n",
    "crash_test.py": ("import os\n\ndef test_before():\n    pass\n\n"
                      "def test_dies():\n    os._exit(3)\n\ndef test_after():\n    pass\n"),
    "slow_test.py": "import time\n\ndef test_sleeps():\n    time.sleep(30)\n",
    "import_test.py": "import nonesuch_module_for_this_test\n\ndef test_x():\n    pass\n",
}


def test_run_tests_survives_crashes_and_bounds_time(tmp_path: Path) -> None:
    """The plugin and the driver on stand-in files: a test that kills its process is
    `crashed` and the tests after it still run; a sleeping one fails at the timeout; an
    import error is an `error` of the file."""
    root = tmp_path / "root"
    root.mkdir()
    for name, text in STAND_IN_TESTS.items():
        (root / name).write_text(text)
    result = ks.run_tests(sorted(STAND_IN_TESTS), None, tmp_path / "work", "t", root=root,
                          timeout=2.0, echo=False)
    kinds = {nodeid: o.outcome for nodeid, o in result.items()}
    assert kinds == {"crash_test.py::test_before": "passed",
                     "crash_test.py::test_dies": "crashed",
                     "crash_test.py::test_after": "passed",
                     "good_test.py::test_one": "passed", "good_test.py::test_two": "failed",
                     "import_test.py": "error", "slow_test.py::test_sleeps": "failed"}
    assert "keras-suite-timeout" in result["slow_test.py::test_sleeps"].message
    assert "nonesuch_module_for_this_test" in result["import_test.py"].message
    assert result["good_test.py::test_two"].message.startswith("AssertionError: no")
    assert not ks.enabled_in_every_session(tmp_path / "work" / "t.jsonl")


def test_compile_stats_sum_over_processes(tmp_path: Path) -> None:
    log = tmp_path / "flagged.jsonl"
    log.write_text(
        '{"when": "session", "tfxla_lite_enabled": true, "compile_stats": '
        '{"functions": 2, "clusters_compiled": 3}}\n'
        '{"nodeid": "a::t", "when": "start"}\n'
        '{"when": "session", "tfxla_lite_enabled": true, "compile_stats": '
        '{"functions": 1, "clusters_compiled": 0}}\n')
    assert ks.compile_stats(log) == {"functions": 3, "clusters_compiled": 3}
    assert ks.enabled_in_every_session(log)
    log.write_text(log.read_text() + '{"when": "session", "tfxla_lite_enabled": false}\n')
    assert not ks.enabled_in_every_session(log)
