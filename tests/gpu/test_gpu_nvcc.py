"""The generated CUDA of every kernel compiles with nvcc to PTX for sm_80 and sm_90, with
no error and no warning (`--Werror all-warnings`): the hand-written modules of
`gpu_modules.py` (every opcode × element type, every template; with `hlo_builders`'
fusion showcase) and the TF-printed corpus of `tests/corpus` (both stages).

No GPU is needed. To stay fast, the fast tests put all programs into one translation
unit per architecture (`nvcc.batch_source`: each program in a namespace of its own) and
run the two architectures' nvcc side by side; the `slow` test compiles every program
alone, exactly as NVRTC would get it (`extern "C"` kernels, its own prelude).
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from gpu_corpus import corpus_inputs
from gpu_modules import MODULES

from tfxla_lite.codegen.gpu import emit_module
from tfxla_lite.codegen.gpu.nvcc import DEFAULT_ARCHES, batch_source, check_ptx, find_nvcc

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit)")

# Corpus cases the GPU backend does not compile yet, and why (checked both ways).
GPU_GAPS: dict[str, str] = {}


def _programs() -> dict[str, str]:
    bodies = {}
    for name, build in MODULES.items():
        program, _, _ = emit_module(build(), verify=True)
        assert program.kernel_names or all(t.plan.kind == "dot" for t in program.thunks), name
        bodies[name] = program.body
    return bodies


def _compile_everywhere(bodies: dict[str, str]) -> None:
    source = batch_source(bodies, {"f16", "bf16"})
    with ThreadPoolExecutor(len(DEFAULT_ARCHES)) as pool:
        results = list(pool.map(lambda arch: (arch, check_ptx({"batch": source}, arch)),
                                DEFAULT_ARCHES))
    for arch, result in results:
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"
        ptx = result.ptx["batch"]
        assert f".target {arch}" in ptx
        # Every kernel is in the PTX (a C++ name, mangled within its program's namespace).
        for number, (name, body) in enumerate(bodies.items()):
            namespace = f"program_{number}"
            for kernel in _kernel_names(body):
                mangled = f"_ZN{len(namespace)}{namespace}{len(kernel)}{kernel}E"
                assert f".entry {mangled}" in ptx, (name, kernel)


def test_gpu_hand_written_modules_compile_with_nvcc() -> None:
    bodies = _programs()
    assert len(bodies) == len(MODULES)
    _compile_everywhere(bodies)


def _corpus_programs() -> tuple[dict[str, str], dict[str, str]]:
    tf = pytest.importorskip("tensorflow")
    from tf_functions import CASES

    from tfxla_lite.hlo.parser import parse_module

    bodies, failures = {}, {}
    for case in CASES:
        inputs = corpus_inputs(case)
        function = tf.function(case.fn, jit_compile=True)
        for stage in ("hlo", "optimized_hlo"):
            text = function.experimental_get_compiler_ir(*inputs)(stage=stage)
            try:
                program, _, _ = emit_module(parse_module(text), verify=True)
            except NotImplementedError as error:
                failures[case.name] = str(error)
                continue
            bodies[f"{case.name}.{stage}"] = program.body
    return bodies, failures


def test_gpu_tf_corpus_compiles_with_nvcc() -> None:
    bodies, failures = _corpus_programs()
    assert set(failures) == set(GPU_GAPS), failures
    assert len(bodies) >= 40
    _compile_everywhere(bodies)


@pytest.mark.slow
def test_gpu_every_program_compiles_alone_with_nvcc() -> None:
    """Each program as NVRTC gets it, one translation unit each (minutes, not seconds)."""
    sources = {}
    for name, build in MODULES.items():
        program, _, _ = emit_module(build(), verify=True)
        sources[name] = program.source
    try:
        corpus, _ = _corpus_programs()
    except pytest.skip.Exception:
        corpus = {}
    from tfxla_lite.codegen.gpu.cuda_source import prelude

    for name, body in corpus.items():
        sources[name] = prelude({"f16", "bf16"}) + "\n" + body
    for arch in DEFAULT_ARCHES:
        result = check_ptx(sources, arch, timeout=1800)
        assert result.ok, f"nvcc -arch={arch}:\n{result.output[:8000]}"
        assert set(result.ptx) == set(sources)
        for name, source in sources.items():
            for kernel in _kernel_names(source):
                assert f".entry {kernel}(" in result.ptx[name], (name, kernel)


def _kernel_names(source: str) -> list[str]:
    return re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(', source)
