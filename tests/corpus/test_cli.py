"""The `tfxla-lite opt` and `run-hlo` commands on HLO text files: output and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfxla_lite import cli
from tfxla_lite.hlo import evaluator
from tfxla_lite.hlo.parser import parse_module

# As TF's XLA prints stage='hlo': long-form operands, metadata, a to_apply callee.
SOFTMAX_HLO = """\
HloModule a_inference_softmax_6__.1, entry_computation_layout={(f32[4,16]{1,0})->f32[4,16]{1,0}}

%max_f32 (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %maximum = f32[] maximum(f32[] %x, f32[] %y)
}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (arg0.1: f32[4,16]) -> f32[4,16] {
  %arg0.1 = f32[4,16]{1,0} parameter(0), parameter_replication={false}, \
metadata={op_name="XLA_Args"}
  %ninf = f32[] constant(-inf)
  %row_max = f32[4]{0} reduce(f32[4,16]{1,0} %arg0.1, f32[] %ninf), dimensions={1}, \
to_apply=%max_f32, metadata={op_type="Softmax" op_name="Softmax"}
  %b_max = f32[4,16]{1,0} broadcast(f32[4]{0} %row_max), dimensions={0}
  %shifted = f32[4,16]{1,0} subtract(f32[4,16]{1,0} %arg0.1, f32[4,16]{1,0} %b_max)
  %exp = f32[4,16]{1,0} exponential(f32[4,16]{1,0} %shifted)
  %zero = f32[] constant(0)
  %total = f32[4]{0} reduce(f32[4,16]{1,0} %exp, f32[] %zero), dimensions={1}, \
to_apply=%add_f32
  %b_total = f32[4,16]{1,0} broadcast(f32[4]{0} %total), dimensions={0}
  ROOT %out = f32[4,16]{1,0} divide(f32[4,16]{1,0} %exp, f32[4,16]{1,0} %b_total)
}
"""

POPCNT_HLO = """HloModule m
ENTRY e {
  p = s32[2,2]{1,0} parameter(0)
  ROOT q = s32[2,2]{1,0} popcnt(p)
}
"""


@pytest.fixture
def softmax_file(tmp_path: Path) -> Path:
    path = tmp_path / "softmax.hlo"
    path.write_text(SOFTMAX_HLO)
    return path


def test_opt_prints_the_optimized_module_and_buffer_assignment(
        softmax_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["opt", str(softmax_file), "-p", "dce,fuse,dce,assign-buffers"]) == 0
    out = capsys.readouterr().out
    module_text, assignment = out.split("\nBufferAssignment:", 1)
    module = parse_module(module_text)
    entry = module.entry
    assert entry is not None
    assert any(inst.opcode == "fusion" for inst in entry.instructions)
    assert "temp arena" in assignment


def test_opt_with_default_pipeline_output_parses(softmax_file: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["opt", str(softmax_file)]) == 0
    parse_module(capsys.readouterr().out)


@pytest.mark.parametrize("pipeline,message", [
    ("dce,no-such-pass", "unknown pass 'no-such-pass'"),
    ("assign-buffers,dce", "assign-buffers must come last"),
])
def test_opt_rejects_bad_pipelines(softmax_file: Path, capsys: pytest.CaptureFixture[str],
                                   pipeline: str, message: str) -> None:
    assert cli.main(["opt", str(softmax_file), "-p", pipeline]) == cli.EXIT_ERROR
    assert message in capsys.readouterr().err


def test_run_hlo_check_matches_the_evaluator(softmax_file: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run-hlo", str(softmax_file), "--check", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "output 0: f32[4,16]" in out
    assert "match the evaluator" in out


def test_run_hlo_reports_a_mismatch(softmax_file: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    real = evaluator.evaluate
    monkeypatch.setattr(evaluator, "evaluate", lambda module, *args: real(module, *args) + 1)
    assert cli.main(["run-hlo", str(softmax_file), "--check"]) == cli.EXIT_MISMATCH
    assert "MISMATCH" in capsys.readouterr().out


def test_run_hlo_reports_parse_errors_with_position(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.hlo"
    path.write_text(SOFTMAX_HLO.replace("%arg0.1, f32[] %ninf)", "%arg0.1, f32[] %ninf"))
    assert cli.main(["run-hlo", str(path)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{path}:line 18, column" in err and "^" in err


def test_run_hlo_names_an_unsupported_opcode(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "popcnt.hlo"
    path.write_text(POPCNT_HLO)
    assert cli.main(["run-hlo", str(path), "--check"]) == cli.EXIT_ERROR
    assert "unknown opcode 'popcnt'" in capsys.readouterr().err


def test_random_inputs_by_element_type() -> None:
    module = parse_module("""HloModule m
ENTRY e {
  a = f32[50]{0} parameter(0)
  b = s32[50]{0} parameter(1)
  c = pred[50]{0} parameter(2)
  d = u8[50]{0} parameter(3)
  ROOT t = (f32[50]{0}, s32[50]{0}, pred[50]{0}, u8[50]{0}) tuple(a, b, c, d)
}""")
    a, b, c, d = cli.random_inputs(module, seed=1)
    assert a.dtype == np.float32 and abs(float(a.mean())) < 1
    assert b.dtype == np.int32 and b.min() >= -5 and b.max() <= 5
    assert c.dtype == np.bool_ and 0 < c.sum() < 50
    assert d.dtype == np.uint8 and d.max() <= 10
    again = cli.random_inputs(module, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip((a, b, c, d), again))


def test_module_entry_point_reads_stdin() -> None:
    result = subprocess.run([sys.executable, "-m", "tfxla_lite.cli", "opt", "-", "-p", "dce"],
                            input=SOFTMAX_HLO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "ENTRY %main" in result.stdout


def test_demo_and_build_op_still_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    import tfxla_lite.demo
    import tfxla_lite.runtime.build

    calls = []
    monkeypatch.setattr(tfxla_lite.demo, "main", lambda argv: calls.append(("demo", argv)) or 0)
    monkeypatch.setattr(tfxla_lite.runtime.build, "main",
                        lambda argv: calls.append(("build-op", argv)) or 0)
    assert cli.main(["demo", "gelu", "--no-hlo"]) == 0
    assert cli.main(["build-op", "--force"]) == 0
    assert calls == [("demo", ["gelu", "--no-hlo"]), ("build-op", ["--force"])]
