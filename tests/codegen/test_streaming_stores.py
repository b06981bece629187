"""Streaming (non-temporal) stores (`codegen/cpu/streaming.py`): the cost rule, the
emitted IR and assembly, and results against the evaluator when the rule is forced on
small arrays (odd sizes, outputs not on a 64-byte boundary, every element width, in
place), so that the tests stay fast."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from codegen_helpers import as_args, build
from test_row_kernel import layer_norm, normalize, softmax
from tolerances import assert_close

from tfxla_lite.codegen import Executable, compile_module
from tfxla_lite.codegen.cpu import engine, streaming
from tfxla_lite.hlo.evaluator import evaluate
from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.shape import Shape


@pytest.fixture
def stream_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose last-level cache holds nothing: every streamable kernel streams."""
    monkeypatch.setattr(streaming, "last_level_cache_bytes", lambda: 0)


def _compile(module: HloModule, threads: int = 2, **kwargs: object) -> Executable:
    return compile_module(module, cache=False, threads=threads, **kwargs)  # type: ignore[arg-type]


def _run(executable: Executable, args: list[np.ndarray], shift: int = 0,
         in_place: bool = False) -> list[np.ndarray]:
    """Call entry with every output `shift` bytes past a 64-byte boundary (or, with
    `in_place`, each donated output in its parameter's own buffer)."""
    inputs = [np.array(a, copy=True) for a in args]
    outputs, keep = [], []
    for shape in executable.output_shapes:
        raw = np.empty(shape.byte_size + 64 + shift, np.uint8)
        start = -raw.ctypes.data % 64 + shift
        keep.append(raw)
        outputs.append(raw[start:start + shape.byte_size].view(shape.numpy_dtype)
                       .reshape(shape.dims))
    if in_place:
        for j, i in executable.donations:
            outputs[j] = inputs[i]
    params = (ctypes.c_void_p * max(1, len(inputs)))(*[a.ctypes.data for a in inputs])
    results = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
    temp = np.empty(executable.temp_bytes + 64, np.uint8)
    executable._entry(ctypes.addressof(params), ctypes.addressof(results),
                      temp.ctypes.data + (-temp.ctypes.data % 64))
    return [np.array(o) for o in outputs]


def _expected(module: HloModule, args: list[np.ndarray]) -> list[np.ndarray]:
    result = evaluate(module, *args)
    return list(result) if isinstance(result, tuple) else [result]


def _streams(executable: Executable) -> int:
    return executable.llvm_ir_optimized.count("!nontemporal")


def _scaled_sum(element: str, size: int) -> tuple[HloModule, list[Shape]]:
    """x * y + x: one flat loop kernel."""
    shape = Shape(element, (size,))

    def body(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("add", [c.create("multiply", [p[0], p[1]]), p[0]])]

    return build(f"scaled_sum_{element}_{size}", [shape, shape], body), [shape, shape]


# Sizes: below one line, a partial line, a block and a bit, several parallel parts.
SIZES = [1, 15, 17, 1025, 70001]


@pytest.mark.parametrize("element", ["f32", "f64", "f16", "bf16", "s32", "s8", "u16", "s64"])
@pytest.mark.parametrize("size", SIZES)
def test_flat_kernels_stream_every_width(stream_everything: None, element: str,
                                         size: int) -> None:
    module, shapes = _scaled_sum(element, size)
    args = as_args(shapes, edges=False)
    expected = _expected(module, args)
    executable = _compile(module)
    # (A kernel of fewer elements than a line has no whole line: LLVM drops the loop.)
    if shapes[0].byte_size >= 128:
        assert _streams(executable) >= 1
    for shift in (0, 2 if element in ("f16", "bf16", "u16") else 8 if element in ("f64", "s64")
                  else 1 if element == "s8" else 4):
        (actual,) = _run(executable, args, shift)
        assert_close(actual, expected[0], "Mul", context=f"shift {shift}")


def test_comparison_output_streams_bytes(stream_everything: None) -> None:
    shape = Shape("f32", (4099,))
    module = build("less", [shape, shape],
                   lambda c, p: [c.create("compare", [p[0], p[1]], direction="LT")])
    args = as_args([shape, shape], edges=False)
    executable = _compile(module)
    assert _streams(executable) >= 1
    for shift in (0, 3):
        (actual,) = _run(executable, args, shift)
        np.testing.assert_array_equal(actual, args[0] < args[1])


def test_output_not_aligned_to_its_element_stays_ordinary(stream_everything: None) -> None:
    """An f32 output one byte past a line boundary: every element is stored ordinarily."""
    module, shapes = _scaled_sum("f32", 1000)
    args = as_args(shapes, edges=False)
    (actual,) = _run(_compile(module), args, shift=1)
    assert_close(actual, _expected(module, args)[0], "Mul")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width, element", [(3, 1024, "f32"), (67, 97, "f32"),
                                                  (130, 1031, "f32"), (5, 5, "f32"),
                                                  (67, 33, "f64"), (40, 257, "bf16"),
                                                  (40, 257, "f16"), (3, 2048, "f32"),
                                                  (5, 1100, "f64")])
def test_row_fusions_stream_their_rows(stream_everything: None, rows: int, width: int,
                                       element: str, threads: int) -> None:
    x = Shape(element, (rows, width))
    affine = Shape(element, (width,))
    cases = [("softmax", [x], lambda c, p: [softmax(c, p[0])], "Softmax"),
             ("layer_norm", [x, affine, affine], lambda c, p: [layer_norm(c, *p)], "Mean")]
    for name, shapes, body, op_type in cases:
        args = as_args(shapes, edges=False)
        expected = _expected(build(name, shapes, body), args)
        executable = _compile(build(name, shapes, body), threads=threads)
        # Rows under MIN_RUN_BYTES keep ordinary stores.
        wide = width * x.byte_size // x.num_elements >= streaming.MIN_RUN_BYTES
        assert (_streams(executable) >= 1) == wide, name
        for shift in (0, 4):
            (actual,) = _run(executable, args, shift)
            assert_close(actual, expected[0], op_type, context=f"{name} shift {shift}")


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_streamed_rows_divide_exactly_by_special_row_values(stream_everything: None,
                                                            dtype: str) -> None:
    # x / sum(x) streamed: a tiny or huge row sum keeps the exact quotients (the scalar
    # loop inside the fill), a zero, infinite or NaN one multiplies by 1/d and gives
    # x / d's bits all the same; each row bit for bit the evaluator's.
    shape = Shape(dtype, (8, 1024))
    module = build("normalize", [shape], lambda comp, p: normalize(comp, p[0]))
    dtype_np = np.float32 if dtype == "f32" else np.float64
    info = np.finfo(dtype_np)
    steps = np.arange(1, 1025, dtype=dtype_np)  # integers: any summation order is exact
    x = np.abs(as_args([shape], seed=5, edges=False)[0]) + 0.5
    x[1] = steps * info.tiny * dtype_np(2.0 ** -22)  # d about 2^-22 * 2^19 tiny: denormal
    x[2] = steps * dtype_np(2.0 ** (info.maxexp - 20))  # d about 2^(emax - 1): 1/d denormal
    x[3] = 0.0  # d = 0: 0/0
    x[4, 0] = np.inf  # d = inf
    x[5, 7] = np.nan
    x[6] = info.max / 8  # d overflows to inf
    executable = _compile(module)
    assert _streams(executable) >= 1
    expected = _expected(module, [x])[0]
    for shift in (0, 4):
        (actual,) = _run(executable, [x], shift)
        np.testing.assert_array_equal(actual[1:7], expected[1:7])
        assert_close(actual, expected, "divide", context=f"shift {shift}")


def test_in_place_kernels_stream_over_their_operand(stream_everything: None) -> None:
    x = Shape("f32", (96, 130))

    def sum_times(c: Computation, p: list[Instruction]) -> list[Instruction]:
        return [c.create("multiply", [c.create("add", [p[0], p[1]]), p[1]])]

    cases = [("add_multiply", [x, x], sum_times, "Mul"),
             ("softmax", [x], lambda c, p: [softmax(c, p[0])], "Softmax")]
    for name, shapes, body, op_type in cases:
        args = as_args(shapes, edges=False)
        expected = _expected(build(name, shapes, body), args)
        executable = _compile(build(name, shapes, body), donate=range(len(shapes)))
        assert executable.donations == ((0, 0),)
        assert _streams(executable) >= 2  # the in-place variant streams too
        (actual,) = _run(executable, args, in_place=True)
        assert_close(actual, expected[0], op_type, context=name)


def test_reused_temp_buffer_streams(stream_everything: None) -> None:
    """Unfused elementwise kernels whose temps the plan writes in place
    (`compiler._reused_operand`): abs over negate's buffer, add over abs's."""
    x = Shape("f32", (70001,))

    def chain(c: Computation, p: list[Instruction]) -> list[Instruction]:
        first = c.create("negate", [p[0]])
        second = c.create("add", [c.create("abs", [first]), p[1]])
        reducer = c.module.reduction_computation("add", "f32")
        return [c.create("reduce", [second, c.add_constant(0.0, "f32")], dimensions=(0,),
                         called_computations=[reducer])]

    args = as_args([x, x], edges=False)
    expected = _expected(build("chain", [x, x], chain), args)
    executable = compile_module(build("chain", [x, x], chain), pipeline="", cache=False,
                                threads=2)
    assert executable.assignment_text.count("in place of") == 2
    assert executable.llvm_ir.count(".in_place") >= 2 and _streams(executable) >= 3
    (actual,) = _run(executable, args)
    assert_close(actual, expected[0], "Sum")


def test_rule_follows_the_bytes_and_the_cache() -> None:
    module, _ = _scaled_sum("f32", 1 << 20)  # 12 MiB moved
    kernel = next(i for i in module.entry.instructions if i.opcode == "add")
    assert streaming.kernel_bytes(kernel) == 3 * 4 << 20
    assert streaming.should_stream(kernel, cache_bytes=8 << 20)
    assert streaming.should_stream(kernel, cache_bytes=12 << 20)
    assert not streaming.should_stream(kernel, cache_bytes=13 << 20)
    assert not streaming.should_stream(kernel, cache_bytes=32 << 20)
    assert streaming.last_level_cache_bytes() > 0


def test_rule_leaves_compute_bound_loops_to_ordinary_stores() -> None:
    """A loop kernel computing erf keeps ordinary stores; a row fusion computing exp
    streams."""
    x = Shape("f32", (1 << 20,))
    module = build("erf", [x], lambda c, p: [c.create("multiply", [
        p[0], c.create("erf", [p[0]])])])
    compile_module(module, cache=False, threads=1)  # fuses erf and multiply
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert not streaming.should_stream(fusion, cache_bytes=1 << 20)
    rows = Shape("f32", (256, 1024))
    module = build("softmax", [rows], lambda c, p: [softmax(c, p[0])])
    compile_module(module, cache=False, threads=1)
    fusion = next(i for i in module.entry.instructions if i.opcode == "fusion")
    assert streaming.should_stream(fusion, row_fusion=True, cache_bytes=1 << 20)
    assert not streaming.should_stream(fusion, row_fusion=True, cache_bytes=4 << 20)


def test_small_kernels_keep_ordinary_stores() -> None:
    module, shapes = _scaled_sum("f32", 4099)
    executable = _compile(module)
    assert _streams(executable) == 0
    assert "sfence" not in executable.llvm_ir_optimized


def test_assembly_has_aligned_vector_streaming_stores(stream_everything: None) -> None:
    """Whole-vector streaming stores and the fence; never a scalar `movntss`/`movntsd`
    (SSE4A's, which LLVM may pick for stores it cannot widen)."""
    x = Shape("f32", (67, 97))
    for module in (_scaled_sum("f32", 4099)[0],
                   build("softmax", [x], lambda c, p: [softmax(c, p[0])])):
        executable = _compile(module)
        machine = engine.target_machine()
        assembly = machine.emit_assembly(engine.parse_and_verify(executable.llvm_ir_optimized))
        assert not re.search(r"\bv?movnts[sd]\b", assembly)
        if streaming._is_x86():
            assert "sfence" in assembly
            stores = re.findall(r"\bv?movnt(?:ps|pd|dq)\s+%([xyz]mm)\d+", assembly)
            assert stores, "no vector streaming store"
            if "+avx512f" in engine.host_description().get("features", ""):
                assert set(stores) == {"zmm"}


def test_bf16_row_fusions_without_streaming() -> None:
    """Row fusions folding a bf16 input row (16-bit words in memory, f32 in registers);
    they read it as f32 values at f32 offsets before, with NaN rows past the middle."""
    x = Shape("bf16", (40, 257))
    args = as_args([x], edges=False)
    expected = _expected(build("softmax", [x], lambda c, p: [softmax(c, p[0])]), args)
    executable = _compile(build("softmax", [x], lambda c, p: [softmax(c, p[0])]))
    assert _streams(executable) == 0
    (actual,) = _run(executable, args)
    assert_close(actual, expected[0], "Softmax")


def _bias_add(rows: tuple[int, ...], width: int, element: str = "f32"
              ) -> tuple[HloModule, list[Shape]]:
    """x + broadcast(b) over the last dimension: a `dimension` kernel (not flat)."""
    x, bias = Shape(element, (*rows, width)), Shape(element, (width,))

    def body(c: Computation, p: list[Instruction]) -> list[Instruction]:
        wide = c.create("broadcast", [p[1]], dimensions=(len(rows),), shape=x)
        return [c.create("add", [p[0], wide])]

    return build(f"bias_add_{len(rows)}_{width}", [x, bias], body), [x, bias]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, width, element", [
    ((300,), 1031, "f32"), ((2, 70), 257, "f32"), ((1,), 70001, "f32"), ((90,), 130, "f64"),
    ((130,), 300, "bf16"), ((70,), 1000, "s8")])
def test_dimension_kernels_stream_their_rows(stream_everything: None, rows: tuple[int, ...],
                                             width: int, element: str, threads: int) -> None:
    """Broadcasting kernels, split over their first dimension (or, for a [1, N] output,
    over the last) and streamed a row at a time."""
    module, shapes = _bias_add(rows, width, element)
    args = as_args(shapes, edges=False)
    expected = _expected(module, args)
    executable = _compile(module, threads=threads)
    assert _streams(executable) >= 1
    for shift in (0, 8 if element == "f64" else 4 if element != "s8" else 3):
        (actual,) = _run(executable, args, shift)
        assert_close(actual, expected[0], "AddV2", context=f"shift {shift}")


def test_narrow_rows_keep_ordinary_stores(stream_everything: None) -> None:
    """Rows under `MIN_RUN_BYTES` (63 floats) are not worth streaming; 64 floats are."""
    for width, streams in ((63, False), (64, True)):
        module, shapes = _bias_add((3000,), width)
        executable = _compile(module)
        assert (_streams(executable) > 0) == streams, width
        args = as_args(shapes, edges=False)
        (actual,) = _run(executable, args)
        assert_close(actual, _expected(module, args)[0], "AddV2")


def _ordinary_and_streamed(monkeypatch: pytest.MonkeyPatch, module: HloModule,
                           threads: int = 2) -> tuple[Executable, Executable]:
    """`module` compiled with ordinary stores (a host cache larger than any kernel) and
    with streaming stores (a host cache of 0 bytes)."""
    monkeypatch.setattr(streaming, "last_level_cache_bytes", lambda: 1 << 60)
    ordinary = _compile(module, threads=threads)
    monkeypatch.setattr(streaming, "last_level_cache_bytes", lambda: 0)
    streamed = _compile(module, threads=threads)
    assert _streams(ordinary) == 0 and _streams(streamed) >= 1
    return ordinary, streamed


@pytest.mark.parametrize("dtype, width", [("f32", 1024), ("f64", 512), ("f32", 2048)])
def test_streamed_softmax_rows_store_quotients_from_registers(monkeypatch: pytest.MonkeyPatch,
                                                              dtype: str, width: int) -> None:
    # A streamed row whose root is x * (1/d) of a row buffer (softmax's exponentials) is
    # stored a line at a time from registers (`row_kernel._stream_scaled_lines`): no block
    # buffer, no masked store. Same arithmetic as the ordinary kernel: the same bits, on
    # an output on a line and off it (the row scaled in place, its partial lines copied),
    # exact rows included.
    shape = Shape(dtype, (12, width))
    module = build("softmax", [shape], lambda comp, p: [softmax(comp, p[0])])
    ordinary, streamed = _ordinary_and_streamed(monkeypatch, module)
    assert "stream.scale" in streamed.llvm_ir  # (rows off the line grid: scaled in place)
    assert "stream.block" not in streamed.llvm_ir and "masked.store" not in streamed.llvm_ir
    (x,) = as_args([shape], seed=9, edges=False)
    x[1, 5] = np.nan
    x[2] = -np.inf  # NaN row
    x[3] -= x[3].max()  # max 0: the exact zero scan
    x[4] = np.float32(80.0) if dtype == "f32" else 700.0  # large exponentials
    expected = _expected(module, [x])[0]
    for shift in (0, 1, 4, 16):  # (1: not aligned to the element, nothing streamed)
        (reference,) = _run(ordinary, [x], shift)
        (actual,) = _run(streamed, [x], shift)
        np.testing.assert_array_equal(actual, reference, err_msg=f"shift {shift}")
        assert_close(actual, expected, "Softmax", context=f"shift {shift}")


def test_streamed_quotients_of_exact_rows_match_the_ordinary_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # e = exp(x - max(x) + y), e / sum(e): rows whose sum is tiny or huge keep the exact
    # quotients (the scalar loop), the rest stream from registers. Bit for bit the
    # ordinary kernel's.
    shape = Shape("f32", (6, 1024))

    def body(comp: Computation, p: list[Instruction]) -> list[Instruction]:
        x = p[0]
        peak = comp.module.reduction_computation("maximum", "f32")
        top = comp.create("reduce", [x, comp.add_constant(float("-inf"), "f32")],
                          called_computations=[peak], dimensions=(1,))
        shifted = comp.create("subtract", [x, comp.create("broadcast", [top], shape=shape,
                                                          dimensions=(0,))])
        e = comp.create("exponential", [comp.create("add", [shifted, p[1]])])
        return [normalize(comp, e)]

    module = build("shifted_softmax", [shape, shape], body)
    x, y = as_args([shape, shape], seed=4, edges=False)
    y[:] = 0.0
    y[1] = -100.0  # sum below 2^-126 (1024 e^-100 at most): 1/d overflows
    x[2], y[2] = 1.0, 85.0  # sum 1024 e^85, about 2^133: 1/d denormal
    ordinary, streamed = _ordinary_and_streamed(monkeypatch, module)
    assert "stream.block" not in streamed.llvm_ir
    expected = _expected(module, [x, y])[0]
    for shift in (0, 4):
        (reference,) = _run(ordinary, [x, y], shift)
        (actual,) = _run(streamed, [x, y], shift)
        np.testing.assert_array_equal(actual, reference, err_msg=f"shift {shift}")
        assert_close(actual, expected, "Softmax", context=f"shift {shift}")


@pytest.mark.parametrize("dtype, width", [("f32", 1024), ("f64", 512), ("f32", 2048),
                                          ("f16", 1024), ("bf16", 512)])
def test_rows_of_whole_lines_stream_without_partial_lines(monkeypatch: pytest.MonkeyPatch,
                                                          dtype: str, width: int) -> None:
    # Layer norm rows of whole lines: each block's whole lines streamed, the partial
    # lines of a row off the line grid copied with memcpy (`streaming._emit_whole_lines`);
    # no masked store is emitted. The fill computes what the ordinary kernel stores.
    x, affine = Shape(dtype, (10, width)), Shape(dtype, (width,))
    module = build("layer_norm", [x, affine, affine], lambda c, p: [layer_norm(c, *p)])
    ordinary, streamed = _ordinary_and_streamed(monkeypatch, module, threads=1)
    assert "masked.store" not in streamed.llvm_ir
    args = as_args([x, affine, affine], seed=2, edges=False)
    expected = _expected(module, args)[0]
    for shift in (0, 1, 4 if dtype in ("f32", "f64") else 2):
        (reference,) = _run(ordinary, args, shift)
        (actual,) = _run(streamed, args, shift)
        np.testing.assert_array_equal(actual, reference, err_msg=f"shift {shift}")
        assert_close(actual, expected, "Mean", context=f"shift {shift}")


def test_in_place_softmax_rows_of_whole_lines(stream_everything: None) -> None:
    # A donated softmax input overwritten by its streamed rows (quotients from registers,
    # `_stream_scaled_lines`): every row is read into its buffers before it is stored.
    x = Shape("f32", (40, 1024))
    module = build("softmax", [x], lambda c, p: [softmax(c, p[0])])
    args = as_args([x], edges=False)
    expected = _expected(module, args)
    executable = _compile(build("softmax", [x], lambda c, p: [softmax(c, p[0])]), donate=[0])
    assert executable.donations == ((0, 0),) and "stream.block" not in executable.llvm_ir
    (actual,) = _run(executable, args, in_place=True)
    assert_close(actual, expected[0], "Softmax")
