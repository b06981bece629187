"""`GpuExecutable`: a `GpuProgram` compiled by NVRTC and run on CuPy arrays, without TF.

The device end of the GPU backend. CuPy is imported here only, when an executable is
built: the rest of `tfxla_lite.codegen.gpu` runs without it.

- Compile: `cupy.RawModule` (NVRTC) over the program's source, every kernel looked up at
  build so a compile error surfaces here; modules are cached in the process by the
  source's SHA-256 and the device, and CuPy keeps its own disk cache.
- Memory: one device arena per call from CuPy's memory pool, temps at buffer
  assignment's offsets, then scratch (split-reduction partials, epilogue products, dot
  operands `gemm.py` copies); constants are uploaded once, at build.
- Run: the thunks in order on CuPy's current stream: kernel launches, cuBLAS dots
  (`gemm.py`) and cuBLASLt epilogues (`lt_epilogue.py`, `lt_status` says which path).
  Where each thunk's arrays live is worked out at build (`_plan_calls`).

The call convention follows `tfxla_lite.codegen.Executable`: `executable(*arrays)` checks
dtypes and shapes and returns freshly allocated CuPy outputs; `run_checked(cupy, arrays)`
skips those conversions for callers that made them already (the TF launch).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfxla_lite.codegen.gpu import cublaslt
from tfxla_lite.codegen.gpu.compiler import SCRATCH_ALIGNMENT, GpuProgram, Thunk
from tfxla_lite.codegen.gpu.gemm import StridedGemm, dense_operands, plan_gemm, run_gemm
from tfxla_lite.codegen.gpu.kernels import split_scratch
from tfxla_lite.codegen.gpu.sort import sort_scratch_bytes
from tfxla_lite.hlo.ir import HloModule, Instruction
from tfxla_lite.hlo.shape import Shape

BLOCKS_PER_SM = 32
VECTOR_ALIGNMENT = 16
NVRTC_OPTIONS = ("--std=c++17",)

_lock = threading.Lock()
_modules: dict[tuple[str, int], Any] = {}  # (source hash, device id) -> cupy.RawModule


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as error:
        raise ImportError("the GPU backend needs CuPy: pip install 'tfxla-lite[gpu]' "
                          f"(cupy-cuda12x or cupy-cuda13x) ({error})") from error
    return cupy


def include_options(cupy: Any) -> tuple[str, ...]:
    """`-I` for the folder holding cuda_fp16.h and cuda_bf16.h, which NVRTC does not find
    by itself: the CUDA toolkit's include folder, else the pip wheels' (`nvidia/*/include`)."""
    import glob
    import os
    import site

    roots = [cupy.cuda.get_cuda_path(), os.environ.get("CUDA_HOME"),
             os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    candidates = [os.path.join(root, "include") for root in roots if root]
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "*", "include")))
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "cuda_fp16.h")):
            return (f"-I{folder}",)
    return ()


def load_module(program: GpuProgram, cache: bool | None = None) -> tuple[Any, str]:
    """The compiled `cupy.RawModule` of `program` on the current device, and where it came
    from ("nvrtc" or "memory")."""
    cupy = _cupy()
    key = (program.fingerprint(), int(cupy.cuda.Device().id))
    use_cache = cache is not False
    if use_cache:
        with _lock:
            if key in _modules:
                return _modules[key], "memory"
    module = cupy.RawModule(code=program.source,
                            options=NVRTC_OPTIONS + include_options(cupy))
    for name in program.kernel_names:
        module.get_function(name)  # compiles now: errors belong to the build
    if use_cache:
        with _lock:
            _modules[key] = module
    return module, "nvrtc"


@dataclass(eq=False)
class GpuExecutable:
    """A compiled HLO module for one CUDA device."""

    module: HloModule
    assignment: Any
    program: GpuProgram
    parameter_shapes: list[Shape]
    output_shapes: list[Shape]
    temp_bytes: int
    raw_module: Any = field(repr=False)
    device_id: int = 0
    hlo_text: str = ""
    optimized_hlo_text: str = ""
    assignment_text: str = ""
    compiled_from: str = "nvrtc"
    _constants: dict[int, Any] = field(default_factory=dict, repr=False)
    _functions: dict[str, Any] = field(default_factory=dict, repr=False)
    _constant_names: dict[str, int] = field(default_factory=dict, repr=False)
    _grid_cap: int = 0
    _dot_scratch_bytes: int = 0  # epilogue products and dot operand copies (at build)
    _lt_workspace_bytes: int = 0  # cuBLASLt's workspace, when a fusion runs through it
    # Per dot-epilogue thunk (by plan name): how it runs, "cuBLASLt" or why not.
    lt_status: dict[str, str] = field(default_factory=dict)
    # Worked out at build (`_plan_calls`): per thunk, where its arrays live.
    _calls_plan: list[tuple[Any, ...]] | None = field(default=None, repr=False)
    _copies_plan: list[tuple[int, tuple[Any, ...]]] = field(default_factory=list, repr=False)
    _outputs_plan: list[tuple[tuple[int, ...], np.dtype]] | None = field(default=None,
                                                                        repr=False)

    @property
    def kernel_count(self) -> int:
        return self.program.kernel_count

    @property
    def cuda_source(self) -> str:
        return self.program.source

    @property
    def kernel_plan(self) -> str:
        """Each thunk's template, launch shape and why (`inspection.kernel_plan_text`)."""
        from tfxla_lite.codegen.gpu.inspection import kernel_plan_text

        return kernel_plan_text(self.program, self.temp_bytes, f"GPU:{self.device_id}")

    @staticmethod
    def build(module: HloModule, assignment: Any, program: GpuProgram, hlo_text: str = "",
              optimized_hlo_text: str = "", cache: bool | None = None) -> GpuExecutable:
        cupy = _cupy()
        raw_module, source = load_module(program, cache)
        entry = module.entry
        assert entry is not None and entry.root is not None
        root = entry.root
        outputs = list(root.operands) if root.opcode == "tuple" else [root]
        device = cupy.cuda.Device()
        executable = GpuExecutable(
            module=module, assignment=assignment, program=program,
            parameter_shapes=[p.shape for p in entry.parameters],
            output_shapes=[o.shape for o in outputs], temp_bytes=int(assignment.temp_bytes),
            raw_module=raw_module, device_id=int(device.id), hlo_text=hlo_text,
            optimized_hlo_text=optimized_hlo_text, assignment_text=assignment.to_text(),
            compiled_from=source)
        executable._functions = {name: raw_module.get_function(name)
                                 for name in program.kernel_names}
        sm_count = int(device.attributes["MultiProcessorCount"])
        executable._grid_cap = sm_count * BLOCKS_PER_SM
        for inst in entry.instructions:
            if inst.opcode == "constant":
                executable._constant_names[inst.name] = id(inst)
                executable._constants[id(inst)] = cupy.asarray(
                    np.ascontiguousarray(inst.literal))
        # Where each thunk's arrays live and how cuBLAS reads each dot: now, so that a dot
        # cuBLAS cannot take fails the build (and the caller falls back), not a call.
        executable._calls_plan = executable._plan_calls(cupy)
        return executable

    # -- running ---------------------------------------------------------------------------
    def __call__(self, *arrays: Any) -> list[Any]:
        """Run on CuPy (or NumPy) arrays on this executable's device; CuPy outputs."""
        cupy = _cupy()
        if len(arrays) != len(self.parameter_shapes):
            raise ValueError(f"{self.module.name} takes {len(self.parameter_shapes)} "
                             f"arguments, got {len(arrays)}")
        with cupy.cuda.Device(self.device_id):
            inputs = []
            for i, (array, shape) in enumerate(zip(arrays, self.parameter_shapes)):
                array = cupy.asarray(array)
                # ascontiguousarray returns at least one dimension: restore a scalar's.
                array = cupy.ascontiguousarray(array).reshape(array.shape)
                if array.dtype != shape.numpy_dtype or tuple(array.shape) != shape.dims:
                    raise ValueError(f"argument {i} is {array.dtype}{list(array.shape)}, "
                                     f"expected {shape}")
                inputs.append(array)
            return self.run_checked(cupy, inputs)

    def run_checked(self, cupy: Any, inputs: list[Any]) -> list[Any]:
        """Run on CuPy arrays already known to be C-contiguous, of the parameters' dtypes
        and shapes, on this executable's current device (the TF launch checks its tensors
        against the same static shapes, and DLPack hands over dense arrays): `__call__`
        without its per-argument conversions and checks."""
        outputs = [cupy.empty(dims, dtype=dtype) for dims, dtype in self._output_layouts]
        self._run(cupy, inputs, outputs)
        return outputs

    def run_numpy(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Copy NumPy inputs to the device, run, and copy the outputs back."""
        cupy = _cupy()
        return [cupy.asnumpy(o) for o in self(*arrays)]

    # -- what a call does, worked out once per executable --------------------------------
    @property
    def _output_layouts(self) -> list[tuple[tuple[int, ...], np.dtype]]:
        if self._outputs_plan is None:
            self._outputs_plan = [(s.dims, s.numpy_dtype) for s in self.output_shapes]
        return self._outputs_plan

    def _argument(self, inst: Instruction, index: tuple[int, ...] = ()) -> tuple[Any, ...]:
        """Where the array of `inst` (leaf `index`) lives in a call, as a recipe `_run`
        turns into a CuPy array: ("parameter", i), ("output", j), ("in-output", j, dims,
        dtype) for a temp buffer assignment placed in output j, ("constant", array),
        ("temp", offset, dims, dtype) in the arena."""
        buffer = self.assignment.slice_of(inst, index)
        shape = inst.shape.tuple_shapes[index[0]] if index else inst.shape  # type: ignore
        if buffer.kind == "parameter":
            return ("parameter", buffer.index)
        if buffer.kind == "output":
            declared = self.output_shapes[buffer.index]
            if declared.dims == shape.dims and declared.numpy_dtype == shape.numpy_dtype:
                return ("output", buffer.index)
            return ("in-output", buffer.index, shape.dims, shape.numpy_dtype)
        if buffer.kind == "constant":
            return ("constant",
                    self._constants[self._constant_names[_resolve(self.assignment, inst)]])
        return ("temp", buffer.offset, shape.dims, shape.numpy_dtype)

    def _plan_calls(self, cupy: Any = None) -> list[tuple[Any, ...]]:
        """Per thunk: (its arguments' recipes, the dot's operand recipes and output recipe
        or None, the scratch shape it takes or None, the cuBLASLt call and its bias recipe
        or None). Buffer assignment's lookups and the plans' operand lists are walked here
        once, not on every call."""
        entry = self.module.entry
        assert entry is not None and entry.root is not None
        calls = []
        for thunk in self.program.thunks:
            plan = thunk.plan
            args = [self._argument(m, index) for m, index in plan.outputs] + \
                [self._argument(i) for i in plan.inputs]
            dot, scratch, lt = None, None, None
            if plan.kind == "dot":
                (inst,) = plan.members
                gemm = plan_gemm(inst)
                dot = (gemm, self._argument(inst.operand(0)), self._argument(inst.operand(1)),
                       self._argument(inst), self._copy_views(gemm, inst, 0))
            elif plan.kind == "dot-epilogue":
                (inst,) = plan.members
                product = plan.extra["dot"]
                operands = [inst.operand(p.parameter_number) for p in product.operands]
                gemm = plan_gemm(product)
                dot = (gemm, self._argument(operands[0]), self._argument(operands[1]), None,
                       self._copy_views(gemm, product, _aligned(product.shape.byte_size)))
                scratch = product.shape
                lt = self._lt_call(cupy, plan, gemm)
            elif plan.kind == "split-reduction":
                scratch = Shape("u8", (split_scratch(plan)[1],))
            elif sort_scratch_bytes(plan):
                scratch = Shape("u8", (sort_scratch_bytes(plan),))
            calls.append((args, dot, scratch, lt))
        # Outputs living in another buffer (a parameter, a constant): none after the
        # `add-output-copies` pass, but a module compiled without it may have them.
        root = entry.root
        copies = []
        for j, inst in enumerate(root.operands if root.opcode == "tuple" else [root]):
            buffer = self.assignment.slice_of(inst)
            if not (buffer.kind == "output" and buffer.index == j):
                copies.append((j, self._argument(inst)))
        self._copies_plan = copies
        return calls

    def _lt_call(self, cupy: Any, plan: Any, gemm: StridedGemm) -> tuple[Any, Any] | None:
        """The cuBLASLt matmul running dot-epilogue `plan` whole, and its bias recipe; None
        (the reason in `lt_status`) where the plan says no or cuBLASLt is not there."""
        epilogue = plan.extra.get("lt")
        if isinstance(epilogue, str) or epilogue is None:
            self.lt_status[plan.name] = f"cuBLAS + loop kernel: {epilogue}"
            return None
        if gemm.batch * gemm.m * gemm.n * gemm.calls == 0 or gemm.k == 0:
            self.lt_status[plan.name] = "cuBLAS + loop kernel: an empty product"
            return None
        refused = cublaslt.refusal(gemm)
        if refused is not None:
            self.lt_status[plan.name] = f"cuBLAS + loop kernel: {refused}"
            return None
        library, why = cublaslt.library(cupy) if cupy is not None else (None, "no CuPy")
        if library is None:
            self.lt_status[plan.name] = f"cuBLAS + loop kernel: {why}"
            return None
        (inst,) = plan.members
        bias = None if epilogue.bias_operand is None else \
            self._argument(inst.operand(epilogue.bias_operand))
        try:
            matmul = cublaslt.LtMatmul(library, gemm, epilogue, self.device_id)
        except RuntimeError as error:  # a descriptor cuBLASLt refuses: run it unfused
            self.lt_status[plan.name] = f"cuBLAS + loop kernel: {error}"
            return None
        self._lt_workspace_bytes = cublaslt.WORKSPACE_BYTES
        self.lt_status[plan.name] = f"cuBLASLt (CUBLASLT_EPILOGUE_{epilogue.name})"
        return matmul, bias

    # -- running ---------------------------------------------------------------------------
    def _run(self, cupy: Any, inputs: list[Any], outputs: list[Any]) -> None:
        if self._calls_plan is None:
            self._calls_plan = self._plan_calls(cupy)
        scratch_offset = _aligned(self.temp_bytes)
        scratch_bytes = max(self.program.scratch_bytes, self._dot_scratch_bytes)
        workspace_offset = scratch_offset + _aligned(scratch_bytes)
        total = workspace_offset + self._lt_workspace_bytes if self._lt_workspace_bytes \
            else scratch_offset + scratch_bytes
        arena = cupy.empty(total, dtype=np.uint8) if total else None
        temps: dict[tuple[Any, ...], Any] = {}  # one view per temp per call

        def array(recipe: tuple[Any, ...]) -> Any:
            kind = recipe[0]
            if kind == "parameter":
                return inputs[recipe[1]]
            if kind == "output":
                return outputs[recipe[1]]
            if kind == "constant":
                return recipe[1]
            found = temps.get(recipe)
            if found is None:
                if kind == "in-output":
                    # A temp that buffer assignment placed in this output buffer (it dies
                    # before the output is written): its bytes from the buffer's start.
                    found = cupy.ndarray(recipe[2], dtype=recipe[3],
                                         memptr=outputs[recipe[1]].data)
                else:
                    found = _arena_view(cupy, arena, recipe[1], recipe[2], recipe[3])
                temps[recipe] = found
            return found

        for thunk, (recipes, dot, scratch, lt) in zip(self.program.thunks, self._calls_plan):
            args = [array(r) for r in recipes]
            if dot is not None:
                gemm, lhs, rhs, out, copies = dot
                lhs, rhs = array(lhs), array(rhs)
                views = tuple(None if c is None else _arena_view(
                    cupy, arena, scratch_offset + c[0], c[1], c[2]) for c in copies)
                if lt is not None and self._run_lt(cupy, lt, gemm, lhs, rhs, views, args[0],
                                                   array, arena, workspace_offset):
                    continue
            product = None if scratch is None else _arena_view(
                cupy, arena, scratch_offset, scratch.dims, scratch.numpy_dtype)
            if dot is not None:
                run_gemm(cupy, gemm, lhs, rhs, array(out) if out is not None else product,
                         views)
            self._run_thunk(thunk, args, product)
        for j, recipe in self._copies_plan:
            outputs[j][...] = array(recipe)

    def _run_lt(self, cupy: Any, lt: tuple[Any, Any], gemm: StridedGemm, lhs: Any, rhs: Any,
                copies: tuple[Any, Any], out: Any, array: Any, arena: Any,
                workspace_offset: int) -> bool:
        """A dot-epilogue as one cuBLASLt call writing the fusion's output `out`; False
        where cuBLASLt refuses these pointers (nothing but operand copies launched)."""
        matmul, bias = lt
        lhs, rhs = dense_operands(cupy, gemm, lhs, rhs, copies)
        return matmul.run(int(lhs.data.ptr), int(rhs.data.ptr), int(out.data.ptr),
                          None if bias is None else int(array(bias).data.ptr),
                          int((arena.data + workspace_offset).ptr),
                          int(cupy.cuda.get_current_stream().ptr))

    def _copy_views(self, gemm: StridedGemm, dot: Instruction,
                    start: int) -> tuple[Any, Any]:
        """Where in the scratch area (offset, dims, dtype) `run_gemm` copies the operands
        its plan copies: after the dot's own product (`start`), so that the whole call
        stays on the one arena; grows `_dot_scratch_bytes` to hold them."""
        shapes = gemm.copy_shapes(dot.operand(0).shape.dims, dot.operand(1).shape.dims)
        dtype = dot.operand(0).shape.numpy_dtype
        views: list[Any] = []
        for dims in shapes:
            if dims is None:
                views.append(None)
                continue
            views.append((start, dims, dtype))
            start += _aligned(math.prod(dims) * dtype.itemsize)
        self._dot_scratch_bytes = max(self._dot_scratch_bytes, start)
        return views[0], views[1]

    def _run_thunk(self, thunk: Thunk, args: list[Any], scratch: Any) -> None:
        """Launch the kernels of `thunk` (a dot's cuBLAS call has run already)."""
        plan = thunk.plan
        if plan.kind == "dot":
            return
        if plan.kind == "dot-epilogue" or sort_scratch_bytes(plan):
            args.append(scratch)
        assert plan.launch is not None
        block = (plan.launch.block[0], plan.launch.block[1], 1)
        if plan.kind == "multi-output":
            for name in thunk.functions:
                launch = plan.extra["reduce_launch"] if name.endswith("_reduce") \
                    else plan.launch
                self._functions[name]((launch.grid(self._grid_cap),), block, tuple(args))
            return
        if plan.kind == "split-reduction":
            self._functions[thunk.functions[0]](
                (plan.launch.grid(self._grid_cap),), block, (*args, scratch))
            # A block per row folds that row's partials.
            self._functions[thunk.functions[1]]((max(1, min(plan.rows, self._grid_cap)),),
                                                block, (*args, scratch))
            return
        name = thunk.functions[0]
        units = plan.launch.units
        if plan.vectorized and all(a.data.ptr % VECTOR_ALIGNMENT == 0 for a in args):
            name, units = thunk.functions[1], units // 4
        per_block = plan.launch.units_per_block
        grid = max(1, min(-(-units // per_block), self._grid_cap))
        self._functions[name]((grid,), block, tuple(args))


def _aligned(size: int) -> int:
    return -(-size // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT


def _resolve(assignment: Any, inst: Instruction) -> str:
    """The name of the value `inst` stands for (a forwarding name resolves to it)."""
    aliases = getattr(assignment, "aliases", {}) or {}
    return aliases.get(inst.name, inst.name)


def _arena_view(cupy: Any, arena: Any, offset: int, dims: tuple[int, ...],
                dtype: np.dtype) -> Any:
    """A CuPy array of `dims` and `dtype` over the arena's bytes from `offset`."""
    if arena is None or 0 in dims or not dtype.itemsize:
        return cupy.empty(dims, dtype=dtype)
    pointer = arena.data + offset
    return cupy.ndarray(dims, dtype=dtype, memptr=pointer)
