"""The CUDA emitter's structure, in pure Python (no GPU, no nvcc): which template each
kernel gets, launch geometry, row groups and their safety rules, literals, and golden
lines of emitted CUDA."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
from gpu_modules import MODULES, TEMPLATE_OF, softmax
from hlo_builders import check_lines

from tfxla_lite.codegen.gpu import emit_module
from tfxla_lite.codegen.gpu.cuda_source import literal
from tfxla_lite.codegen.gpu.kernel_plan import Launch
from tfxla_lite.codegen.gpu.kernels import (
    SPLIT_MAX_CHUNKS,
    row_launch,
    row_team,
    split_plan,
)
from tfxla_lite.codegen.gpu.row_groups import reads_row_local
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape

# The pipeline before row fusion existed: softmax's stages stay separate kernels, which
# the GPU backend merges into a row group itself.
NO_ROW_FUSION = "simplify,constant-folding,cse,simplify,dce,fuse,dce,add-output-copies"


def _kinds(module: HloModule, pipeline: str | None = None) -> list[str]:
    program, _, _ = emit_module(module, pipeline)
    return [t.plan.kind for t in program.thunks]


@pytest.mark.parametrize("name", sorted(TEMPLATE_OF))
def test_gpu_each_kernel_shape_maps_to_its_template(name: str) -> None:
    kinds = _kinds(MODULES[name]())
    assert kinds[-1] == TEMPLATE_OF[name]
    assert len(kinds) == 1 or name.startswith("argmax")  # argmax: an iota kernel first


def test_gpu_float4_variant_only_when_sizes_allow() -> None:
    program, _, _ = emit_module(MODULES["elementwise_vectorized"]())
    (thunk,) = program.thunks
    assert thunk.plan.vectorized and thunk.functions[1].endswith("_v4")
    assert "reinterpret_cast<const float4*>" in program.source
    assert "make_float4(" in program.source
    for name in ("elementwise_odd", "elementwise_f16"):
        program, _, _ = emit_module(MODULES[name]())
        assert not any(t.plan.vectorized for t in program.thunks)
        assert "float4" not in program.body


def test_gpu_row_team_and_launch_geometry() -> None:
    assert row_team(100) == 32 and row_team(512) == 32
    assert row_team(513) == 256 and row_team(16384) == 512
    warp = row_launch(300, 32)
    assert warp.block == (32, 8) and warp.grid(10_000) == 38
    block = row_launch(30, 256)
    assert block.block == (256, 1) and block.grid(10_000) == 30
    # Grid-stride kernels: the grid is capped, never zero.
    assert Launch((256, 1), 10**9, 256).grid(4224) == 4224
    assert Launch((256, 1), 0, 256).grid(4224) == 1


@pytest.mark.parametrize("elements", [1 << 16, 100_003, 1 << 22, 3 << 26])
def test_gpu_split_plan_covers_the_input_in_fixed_chunks(elements: int) -> None:
    chunk, chunks = split_plan(elements)
    assert chunk % 1024 == 0 and chunks <= SPLIT_MAX_CHUNKS
    assert (chunks - 1) * chunk < elements <= chunks * chunk
    assert split_plan(elements) == (chunk, chunks)  # shapes alone decide: deterministic


def test_gpu_row_fusion_kernel_folds_each_reduce_then_the_row() -> None:
    program, _, _ = emit_module(MODULES["softmax"]())
    (thunk,) = program.thunks
    assert thunk.plan.kind == "row-fusion" and thunk.plan.team == 256
    check_lines(program.source,
                r'extern "C" __global__ void __launch_bounds__\(256\) kernel_',
                r"__shared__ float row_value0\[1\];",
                r"__shared__ float row_value1\[1\];",
                r"for \(int row = blockIdx.x; row < 64; row \+= gridDim.x\)",
                r"tl_load_vector<4>\(in0 \+ first\d+\)",  # 1000 floats: groups of 4
                r"reducer_maximum_f32", r"tl_shfl_down", r"__syncthreads\(\);",
                r"row_value0\[0\] = ",
                r"tl_load_vector<4>\(in0 \+ first\d+\)",
                r"expf\(", r"reducer_add_f32",
                r"row_value1\[0\] = ",
                r"tl_load_vector<4>\(in0 \+ first\d+\)",
                r"tl_store_vector<4>\(out0 \+ first\d+, out_vec\d+\);")


def test_gpu_unfused_softmax_stages_merge_into_one_row_group() -> None:
    program, assignment, _ = emit_module(softmax(64, 1000), NO_ROW_FUSION)
    kinds = [t.plan.kind for t in program.thunks]
    assert kinds == ["row-group"], program.plan_text()
    (thunk,) = program.thunks
    assert len(thunk.plan.members) >= 3
    # Later members read earlier ones back: no restrict, no read-only cache on those.
    assert "__restrict__ out" not in program.source
    assert "__syncthreads();" in program.source


def test_gpu_row_locality_rules() -> None:
    from tfxla_lite.hlo.ir import Computation

    module = HloModule("rows")
    comp = module.new_computation("main", entry=True)
    x = comp.add_parameter(0, Shape("f32", (8, 16)))
    r = comp.add_parameter(1, Shape("f32", (8,)))
    along_rows = comp.create("broadcast", [r], shape=x.shape, dimensions=(0,))
    across = comp.create("broadcast", [comp.add_parameter(2, Shape("f32", (16,)))],
                         shape=x.shape, dimensions=(1,))
    transposed = comp.create("transpose", [comp.add_parameter(3, Shape("f32", (16, 8)))],
                             dimensions=(1, 0))
    assert isinstance(comp, Computation)
    assert reads_row_local(along_rows, 0, 8)
    assert not reads_row_local(across, 0, 8)
    assert not reads_row_local(transposed, 0, 8)
    assert reads_row_local(transposed, 0, 1)  # one row: the whole array is the row


def test_gpu_row_group_buffer_sharing_rules() -> None:
    from tfxla_lite.codegen.gpu.row_groups import _buffers_allow
    from tfxla_lite.passes import optimize
    from tfxla_lite.passes.buffer_assignment import BufferSlice

    module = softmax(4, 100)
    optimize(module, NO_ROW_FUSION)
    assert module.entry is not None
    members = [i for i in module.entry.instructions if i.opcode == "fusion"]
    names = [m.name for m in members]

    class Plan:
        """Every member 1600 bytes apart, except `moved`: member name -> its offset."""

        in_place: dict[str, str] = {}

        def __init__(self, moved: dict[str, int]) -> None:
            self.moved = moved

        def slice_of(self, inst: object) -> BufferSlice:
            name = getattr(inst, "name", "")
            if getattr(inst, "opcode", "") == "parameter":
                return BufferSlice("temp", 0, self.moved.get(name, 0), 1600)
            offset = self.moved.get(name, 1600 * (1 + names.index(name)))
            return BufferSlice("temp", 0, offset, 1600)

    assert _buffers_allow(members, Plan({}))
    # The last member reuses the first one's bytes, row for row, after its last reader.
    assert _buffers_allow(members, Plan({names[-1]: 1600}))
    # ... but not shifted by half a buffer: another team may still need those bytes.
    assert not _buffers_allow(members, Plan({names[-1]: 2400}))
    # ... nor the sum over the exponentials, which the divide reads after it.
    assert not _buffers_allow(members, Plan({names[2]: 3200}))
    # A member never writes over a value from outside the group.
    x = module.entry.parameters[0]
    assert not _buffers_allow(members, Plan({x.name: 1600 * 4}))


def test_gpu_reductions_fold_in_a_fixed_tree() -> None:
    """No atomics anywhere: the order of every fold is fixed by the code."""
    for name in ("row_reduce_block", "column_reduce", "reduce_sum_split", "softmax"):
        program, _, _ = emit_module(MODULES[name]())
        assert "atomic" not in program.source
    program, _, _ = emit_module(MODULES["column_reduce"]())
    # 64 columns of f32: 4 per thread, a tile of 128 (`kernels.column_group`).
    check_lines(program.source, r"__shared__ float shared_acc\d+\[8\]\[129\];",
                r"for \(int k = threadIdx.y; k < 1000; k \+= 8\)",
                r"__syncthreads\(\);", r"for \(int s = 0; s < 8; \+\+s\)")


def test_gpu_split_reduction_uses_two_kernels_and_scratch() -> None:
    program, _, _ = emit_module(MODULES["reduce_sum_split"]())
    (thunk,) = program.thunks
    assert thunk.functions == [thunk.plan.name + "_partials", thunk.plan.name]
    assert program.scratch_bytes == thunk.plan.chunks * 8
    assert program.kernel_count == 2


def test_gpu_dot_is_a_library_call_and_its_epilogue_a_kernel() -> None:
    program, _, _ = emit_module(MODULES["dot"]())
    assert program.kernel_names == [] and program.kernel_count == 1
    program, _, _ = emit_module(MODULES["dot_epilogue"]())
    (thunk,) = program.thunks
    assert thunk.plan.kind == "dot-epilogue"
    assert "const float* __restrict__ product" in program.source
    assert "tl_fmax<float>" in program.source


def test_gpu_index_width_follows_the_sizes() -> None:
    program, _, _ = emit_module(MODULES["elementwise_huge"]())
    assert "for (long long i = " in program.source
    program, _, _ = emit_module(MODULES["elementwise_odd"]())
    assert "for (int i = " in program.source


def test_gpu_half_types_compute_in_float_and_round_per_op() -> None:
    program, _, _ = emit_module(MODULES["elementwise_f16"]())
    assert "#include <cuda_fp16.h>" in program.source
    assert "__half2float(__float2half_rn(" in program.source
    assert "out0[i] = __float2half_rn(" in program.source
    program, _, _ = emit_module(MODULES["elementwise_odd"]())
    assert "cuda_fp16.h" not in program.source and "cuda_bf16.h" not in program.source


@pytest.mark.parametrize(("element_type", "value", "text"), [
    ("f32", 1.5, "1.5f"), ("f32", -0.0, "-0.0f"),
    ("f32", float("inf"), "__int_as_float(0x7f800000)"),
    ("f32", float("nan"), "__int_as_float(0x7fc00000)"), ("f64", 0.1, "0.1"),
    ("f16", 0.1, str(np.float32(np.float16(0.1))) + "f"),
    ("s64", -(1 << 63), "(-9223372036854775807LL - 1)"),
    ("u64", (1 << 64) - 1, "18446744073709551615ULL"), ("s32", -(1 << 31), "(-2147483647 - 1)"),
    ("pred", True, "true"), ("u8", 255, "((unsigned char)255u)"),
])
def test_gpu_literals_are_exact(element_type: str, value: object, text: str) -> None:
    assert literal(element_type, value) == text


def test_gpu_package_imports_without_cupy_or_tensorflow() -> None:
    code = ("import sys\nsys.modules['cupy'] = None\nsys.modules['tensorflow'] = None\n"
            "import tfxla_lite.codegen.gpu as gpu\n"
            "assert not gpu.is_available()\n"
            "from tfxla_lite.codegen.gpu import emit_module\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_executable_without_cupy_says_how_to_install() -> None:
    code = ("import sys\nsys.modules['cupy'] = None\n"
            "sys.path.insert(0, %r)\n"
            "from gpu_modules import MODULES\n"
            "from tfxla_lite.codegen.gpu import compile_module\n"
            "try:\n    compile_module(MODULES['dot']())\n"
            "except ImportError as error:\n    assert 'tfxla-lite[gpu]' in str(error)\n"
            "else:\n    raise AssertionError('no ImportError')\n")
    from pathlib import Path

    subprocess.run([sys.executable, "-c", code % str(Path(__file__).parent)], check=True)


@pytest.mark.parametrize("name", ["multi_output_rows_warp", "multi_output_rows_block",
                                  "multi_output_columns"])
def test_gpu_multi_output_fusion_runs_reduction_phases_storing_its_loop(name: str) -> None:
    program, assignment, _ = emit_module(MODULES[name]())
    (thunk,) = program.thunks
    assert thunk.plan.kind == "multi-output"
    assert len(thunk.plan.extra["reduces"]) == 3
    if name == "multi_output_columns":
        # 40 columns, 4 per thread (vector loads): one tile, one block, too few for the
        # 20000 elements of exp(x), which keep their loop kernel.
        assert thunk.functions == [thunk.plan.name + "_reduce", thunk.plan.name]
        assert list(thunk.plan.extra["apart"].values()) == ["its reduction runs on one block"]
    else:  # exp(x), of the reduces' input shape, is stored by the fold: no second kernel
        assert thunk.functions == [thunk.plan.name + "_reduce"]
        assert thunk.plan.extra["loops"] == []
        assert len([n for ns in thunk.plan.extra["phase_loops"].values() for n in ns]) == 1
    # One output pointer per leaf of the tuple, each its own buffer.
    assert len(thunk.plan.outputs) == 4
    slices = {assignment.slice_of(m, index) for m, index in thunk.plan.outputs}
    assert len(slices) == 4
    reduce_kernel = program.source.split(thunk.functions[0] + "(")[1].split('extern "C"')[0]
    # The three sibling reduces fold in one phase: the input is read, and each producer
    # (exp, the square) computed, once per element.
    (phase,) = re.findall(r"// (result .*)", reduce_kernel)
    assert phase.count("result ") == 3
    if name == "multi_output_columns":  # four columns a thread, one vector load
        assert reduce_kernel.count("tl_load_vector<4>(in0 + ") == 1
        assert reduce_kernel.count("in0[") == 1 and reduce_kernel.count("expf(") == 4
    else:  # rows of 300 and 3000 floats: groups of 4, one vector load (`row_vectors`)
        assert reduce_kernel.count("tl_load_vector<4>(in0 + ") == 1
        assert reduce_kernel.count("in0[") == 1  # the element loads of a misaligned in0
        assert reduce_kernel.count("expf(") == 4
    if name == "multi_output_columns":
        assert "const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;" in reduce_kernel
    else:
        assert "tl_shfl_down" in reduce_kernel


def test_gpu_negation_of_a_negative_literal_stays_valid_c() -> None:
    from gpu_modules import finish, new_module

    module, comp = new_module("negative_literal")
    x = comp.add_parameter(0, Shape("f32", (4,)))
    c = comp.create("broadcast", [comp.add_constant(-0.5, "f32")], shape=x.shape,
                    dimensions=())
    finish(comp, [comp.create("add", [x, comp.create("negate", [c])]),
                  comp.create("multiply", [x, comp.create("logistic", [c])])])
    program, _, _ = emit_module(module, "fuse,dce")  # no folding: constants stay in kernels
    assert "-(-0.5f)" in program.body and "--" not in program.body


def test_gpu_kernel_names_are_unique_with_derived_ones() -> None:
    from gpu_modules import finish, new_module

    module, comp = new_module("names")
    x = comp.add_parameter(0, Shape("f32", (64, 256)))
    first = comp.create("tanh", [x], name="a")
    second = comp.create("exponential", [x], name="a_v4")
    finish(comp, [first, second])
    program, _, _ = emit_module(module, "fuse,dce,add-output-copies")  # two kernels
    names = program.kernel_names
    assert len(names) == len(set(names)) and len(names) == 4  # two kernels, two float4 variants
