"""LLVM in the background (`cpu.compile(..., background=True)`): the executable comes
back as soon as the IR is emitted, with the same IR, machine code and results as a
compile on the calling thread; every reader of its code waits for LLVM, and LLVM's
error reaches the reader."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
from codegen_helpers import PARTS_HLO
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import compiler, engine, tiers
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

# Another test's compile finishing here would add its objects to the ones compared.
pytestmark = pytest.mark.usefixtures("background_compiles_done")


def _arguments() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((512, 256), dtype=np.float32),
            rng.standard_normal((256, 256), dtype=np.float32) / 16]


def test_a_background_compile_makes_the_same_code_and_bits(monkeypatch) -> None:
    objects: list[tuple[bytes, ...]] = []
    compile_parts = engine.compile_parts

    def keeping(texts: list[str], *rest: Any, **options: Any) -> engine.CompiledParts:
        compiled = compile_parts(texts, *rest, **options)
        objects.append(compiled.objects)
        return compiled

    monkeypatch.setattr(engine, "compile_parts", keeping)
    here = compile_module(parse_module(PARTS_HLO), threads=2, cache=False)
    behind = compile_module(parse_module(PARTS_HLO), threads=2, cache=False, background=True)
    assert isinstance(behind, tiers.BackgroundExecutable)
    assert not isinstance(here, tiers.BackgroundExecutable)
    assert behind.llvm_ir == here.llvm_ir and behind.kernel_count == here.kernel_count
    behind.wait()
    assert behind.ready and len(objects) == 2
    assert objects[1] == objects[0]  # the same object files, byte for byte
    assert behind.llvm_ir_optimized == here.llvm_ir_optimized
    args = _arguments()
    expected = evaluate(parse_module(PARTS_HLO), *args)
    for got, same, reference in zip(behind(*args), here(*args), expected):
        np.testing.assert_array_equal(got, same)
        assert_close(got, np.asarray(reference), "model gradient")


def test_readers_wait_until_llvm_is_done(monkeypatch) -> None:
    release = threading.Event()
    machine_code = compiler._machine_code

    def gated(emitted: compiler.EmittedModule, *rest: Any) -> Any:
        assert release.wait(60)
        return machine_code(emitted, *rest)

    monkeypatch.setattr(compiler, "_machine_code", gated)
    executable = compile_module(parse_module(PARTS_HLO), threads=2, cache=False,
                                background=True)
    # Everything but the code is there while LLVM has not even started.
    assert not executable.ready
    assert executable.kernel_count > 0 and "define" in executable.llvm_ir
    assert executable.temp_bytes >= 0 and executable.output_shapes
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(executable(*_arguments())))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and not got  # the call waits for the code
    release.set()
    reader.join(60)
    assert executable.ready and executable.entry_address
    expected = evaluate(parse_module(PARTS_HLO), *_arguments())
    for value, reference in zip(got[0], expected):
        assert_close(value, np.asarray(reference), "model gradient")


def test_llvms_error_reaches_every_reader(monkeypatch) -> None:
    def failing(texts: list[str], *rest: Any, **options: Any) -> engine.CompiledParts:
        raise RuntimeError("LLVM IR parsing error: made up for the test")

    monkeypatch.setattr(engine, "compile_parts", failing)
    executable = compile_module(parse_module(PARTS_HLO), threads=2, cache=False,
                                background=True)
    with pytest.raises(RuntimeError, match="made up for the test"):
        executable.wait()
    assert executable.ready
    with pytest.raises(RuntimeError, match="made up for the test"):
        _ = executable.entry_address
    with pytest.raises(RuntimeError, match="made up for the test"):
        executable(*_arguments())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_compiles_in_the_background_too() -> None:
    """The parent's background thread does not exist in a forked child: the child gets a
    pool of its own (an inherited executor would queue the job and never run it)."""
    compile_module(parse_module(PARTS_HLO), threads=1, cache=False, background=True).wait()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through its exit status
        try:
            executable = compile_module(parse_module(PARTS_HLO), threads=1, cache=False,
                                        background=True)
            executable.wait()
            os._exit(0 if executable.entry_address else 1)
        finally:
            os._exit(2)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    pytest.fail("the forked child's background compile never finished")
