"""Identical kernels emitted once (`compiler.KernelMerger`): entry instructions whose
emitted LLVM functions print the same apart from their own names share one kernel,
called from each launch site with that site's buffers; kernels that differ in anything
baked into their code (size, a constant, `noalias`, the in-place variant, the thread
split) stay apart; merged and unmerged executables compute the same bits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from codegen_helpers import as_args
from llvmlite import ir
from tolerances import assert_close

from tfxla_lite.codegen import compile_module
from tfxla_lite.codegen.cpu import compiler
from tfxla_lite.codegen.cpu.emitter import ConstantPool
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.parser import parse_module

WORKLOADS = Path(__file__).resolve().parents[1] / "gpu" / "workload_hlo.json"

# Two identical loop fusions (x*y + y and z*w + w) whose results live in the temp
# arena at different offsets, a third of another size, and a product of the first two.
REPEATED_HLO = """
HloModule repeated

ENTRY main {
  x = f32[96,200]{1,0} parameter(0)
  y = f32[96,200]{1,0} parameter(1)
  z = f32[96,200]{1,0} parameter(2)
  w = f32[96,200]{1,0} parameter(3)
  v = f32[96,100]{1,0} parameter(4)
  xy = f32[96,200]{1,0} multiply(x, y)
  a = f32[96,200]{1,0} add(xy, y)
  zw = f32[96,200]{1,0} multiply(z, w)
  b = f32[96,200]{1,0} add(zw, w)
  vv = f32[96,100]{1,0} multiply(v, v)
  c = f32[96,100]{1,0} add(vv, v)
  d = f32[96,96]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  ROOT t = (f32[96,96]{1,0}, f32[96,100]{1,0}) tuple(d, c)
}
"""

# Two fusions that differ only in a fused constant, and two that are the same (on
# parameters of their own: fusions sharing an operand become one multi-output fusion).
CONSTANTS_HLO = """
HloModule constants

ENTRY main {
  x = f32[300]{0} parameter(0)
  y = f32[300]{0} parameter(1)
  z = f32[300]{0} parameter(2)
  two = f32[] constant(2)
  three = f32[] constant(3)
  b2 = f32[300]{0} broadcast(two), dimensions={}
  b3 = f32[300]{0} broadcast(three), dimensions={}
  p = f32[300]{0} multiply(x, b2)
  q = f32[300]{0} multiply(y, b3)
  r = f32[300]{0} multiply(z, b2)
  ROOT t = (f32[300]{0}, f32[300]{0}, f32[300]{0}) tuple(p, q, r)
}
"""


def _kernel_functions(llvm_ir: str) -> list[str]:
    """The names of the kernel functions an executable's (unoptimized) IR defines."""
    return re.findall(r'^define [^@]*@"?(kernel\.[^"(]*)"?\(', llvm_ir, re.MULTILINE)


def _launches(llvm_ir: str) -> list[str]:
    """The kernels `entry` calls, in order."""
    entry = llvm_ir[llvm_ir.index('define void @"entry"'):]
    entry = entry[:entry.index("\n}")]
    return re.findall(r'call void @"?(kernel\.[^"(]*)"?\(', entry)


@pytest.fixture
def no_merging(monkeypatch: pytest.MonkeyPatch):
    """A context that compiles with every kernel emitted for itself."""

    def keep(self: compiler.KernelMerger, kernel: ir.Function, mark: int) -> ir.Function:
        return kernel

    def patch() -> None:
        monkeypatch.setattr(compiler.KernelMerger, "unique", keep)

    return patch


def test_repeated_fusions_share_one_kernel(no_merging) -> None:
    module = parse_module(REPEATED_HLO)
    args = as_args([p.shape for p in module.entry.parameters], seed=3)
    expected = evaluate(parse_module(REPEATED_HLO), *args)
    executable = compile_module(module, cache=False)
    launches = _launches(executable.llvm_ir)
    kernels = _kernel_functions(executable.llvm_ir)
    assert executable.kernel_count == len(launches) == 4  # a, b, c and the dot
    # a and b: one kernel (range function and launcher), launched twice.
    assert len(set(launches)) == 3
    assert len(kernels) == len(set(kernels))
    actual = executable(*args)
    for n, (got, wanted) in enumerate(zip(actual, expected)):
        assert_close(got, wanted, "MatMul" if n == 0 else "Add", context=f"output {n}")
    # The merged kernel computes each site's own buffers: c (not merged, another
    # size) is exact, and so is the product against the same product unmerged.
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(actual[1], args[4] * args[4] + args[4])
    no_merging()
    unmerged = compile_module(parse_module(REPEATED_HLO), cache=False)
    assert len(set(_launches(unmerged.llvm_ir))) == 4
    assert len(_kernel_functions(unmerged.llvm_ir)) > len(kernels)
    for got, wanted in zip(actual, unmerged(*args)):
        np.testing.assert_array_equal(got, wanted)


def test_kernels_differing_in_a_constant_stay_apart() -> None:
    module = parse_module(CONSTANTS_HLO)
    args = as_args([p.shape for p in module.entry.parameters], seed=5)
    executable = compile_module(module, cache=False)
    launches = _launches(executable.llvm_ir)
    assert len(launches) == 3
    # p (x * 2) and r (z * 2) share a kernel; q (y * 3) has its own.
    assert len(set(launches)) == 2
    x, y, z = args
    for got, wanted in zip(executable(*args), [x * 2, y * 3, z * 2]):
        np.testing.assert_array_equal(got, wanted)


def _fusions(text: str, count: int) -> tuple[list, object]:
    """`count` entry fusions of `text` (parsed, not optimized) and the module."""
    module = parse_module(text)
    fusions = [i for i in module.entry.instructions if i.opcode == "fusion"]
    assert len(fusions) >= count
    return fusions[:count], module


IDENTICAL_FUSIONS_HLO = """
HloModule identical

fused {
  p0 = f32[SIZE_N]{0} parameter(0)
  p1 = f32[SIZE_N]{0} parameter(1)
  ROOT s = f32[SIZE_N]{0} add(p0, p1)
}

fused.1 {
  q0 = f32[SIZE_N]{0} parameter(0)
  q1 = f32[SIZE_N]{0} parameter(1)
  ROOT t = f32[SIZE_N]{0} add(q0, q1)
}

fused.2 {
  r0 = f32[SIZE_M]{0} parameter(0)
  r1 = f32[SIZE_M]{0} parameter(1)
  ROOT u = f32[SIZE_M]{0} add(r0, r1)
}

ENTRY main {
  x = f32[SIZE_N]{0} parameter(0)
  y = f32[SIZE_N]{0} parameter(1)
  z = f32[SIZE_M]{0} parameter(2)
  a = f32[SIZE_N]{0} fusion(x, y), kind=kLoop, calls=fused
  b = f32[SIZE_N]{0} fusion(y, x), kind=kLoop, calls=fused.1
  c = f32[SIZE_M]{0} fusion(z, z), kind=kLoop, calls=fused.2
  ROOT t = (f32[SIZE_N]{0}, f32[SIZE_N]{0}, f32[SIZE_M]{0}) tuple(a, b, c)
}
"""


@pytest.mark.parametrize(
    "first, second, merged",
    [
        # The same instruction structure and emission facts: one kernel.
        ({}, {}, True),
        # Outputs that may alias an operand are not `noalias`.
        ({"noalias_output": True}, {"noalias_output": False}, False),
        # Always in place over operand 0, over operand 1, or with the runtime check.
        ({"in_place_operand": 0, "always_in_place": True},
         {"in_place_operand": 1, "always_in_place": True}, False),
        ({"in_place_operand": 0, "always_in_place": True},
         {"in_place_operand": 0, "always_in_place": False}, False),
        ({"in_place_operand": 0, "always_in_place": True},
         {"in_place_operand": 0, "always_in_place": True}, True),
        # Another team size: another parallel split in the launcher.
        ({"threads": 2}, {"threads": 4}, False),
    ])
def test_merging_compares_every_baked_in_fact(first: dict, second: dict, merged: bool) -> None:
    """Kernels of two structurally identical fusions (other names, other operands),
    emitted with other facts, are merged only when those facts agree."""
    text = IDENTICAL_FUSIONS_HLO.replace("SIZE_N", "70000").replace("SIZE_M", "80000")
    (a, b), hlo = _fusions(text, 2)
    module = ir.Module(name="merging")
    pool = ConstantPool(module)
    merger = compiler.KernelMerger(module)
    kernels = []
    for inst, facts in ((a, first), (b, second)):
        facts = {"noalias_output": True, "threads": 2, **facts}
        mark = merger.mark()
        kernels.append(merger.unique(
            compiler.emit_kernel(module, pool, inst, facts.pop("noalias_output"), **facts),
            mark))
    assert (kernels[0] is kernels[1]) == merged
    assert merger.merged == int(merged)
    defined = [f.name for f in module.functions if not f.is_declaration]
    assert all(name.startswith(compiler.kernel_name(a)) for name in defined) == merged
    # The texts kept for the module split are the functions' texts as they are now
    # (a kernel launched twice became `noinline` after it was printed).
    assert set(merger.texts) == set(defined)
    assert all(merger.texts[f.name] == str(f) for f in module.functions if f.name in defined)
    assert ("noinline" in kernels[0].attributes) == merged


def test_kernels_of_another_size_stay_apart() -> None:
    text = IDENTICAL_FUSIONS_HLO.replace("SIZE_N", "4096").replace("SIZE_M", "4160")
    fusions, _ = _fusions(text, 3)
    module = ir.Module(name="sizes")
    pool = ConstantPool(module)
    merger = compiler.KernelMerger(module)
    kernels = []
    for inst in fusions:
        mark = merger.mark()
        kernels.append(merger.unique(compiler.emit_kernel(module, pool, inst, True, 1), mark))
    assert kernels[0] is kernels[1] and kernels[2] is not kernels[0]
    assert merger.merged == 1


def test_transformer_step_cluster_has_fewer_kernels(no_merging) -> None:
    """The Keras Transformer training step's main cluster (test sizes): fewer kernel
    functions with merging, the same launches, bit-identical outputs, and outputs
    within tolerance of the evaluator."""
    entry = json.loads(WORKLOADS.read_text())["quick.transformer_train_b2.0"]
    args = [np.random.default_rng(0).normal(size=p.shape.dims).astype(p.shape.numpy_dtype)
            for p in parse_module(entry["hlo"]).entry.parameters]
    merged = compile_module(parse_module(entry["hlo"]), cache=False)
    outputs = merged(*args)
    no_merging()
    unmerged = compile_module(parse_module(entry["hlo"]), cache=False)
    assert merged.kernel_count == unmerged.kernel_count
    assert len(_launches(merged.llvm_ir)) == len(_launches(unmerged.llvm_ir))
    assert len(set(_launches(merged.llvm_ir))) < len(set(_launches(unmerged.llvm_ir)))
    assert len(_kernel_functions(merged.llvm_ir)) < len(_kernel_functions(unmerged.llvm_ir))
    for got, wanted in zip(outputs, unmerged(*args)):
        np.testing.assert_array_equal(got, wanted)
    expected = evaluate(parse_module(entry["hlo"]), *args)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    for n, (got, wanted) in enumerate(zip(outputs, expected)):
        assert_close(got, wanted, entry["tolerance"], context=f"output {n}")
