"""`GpuExecutable`: a `GpuProgram` compiled by NVRTC and run on CuPy arrays, without TF.

The device end of the GPU backend. CuPy is imported here only, when an executable is
built: the rest of `tfxla_lite.codegen.gpu` runs without it.

- Compile: `cupy.RawModule` (NVRTC) over the program's source; every kernel function is
  looked up at build time, so a compile error surfaces here (and a caller can fall back).
  Modules are cached in the process by the source's SHA-256 and the device (the source
  holds every shape and attribute the code depends on); CuPy keeps its own disk cache
  of compiled binaries (`~/.cupy/kernel_cache`).
- Memory: the buffer plan maps onto one device arena per call, taken from CuPy's memory
  pool: `temp_bytes` of temps at the offsets buffer assignment chose, then the scratch
  area (split-reduction partials, cuBLAS products for epilogues). Parameters and outputs
  are the caller's arrays; constants of the entry are uploaded once, at build.
- Run: the thunks in order on CuPy's current stream: kernel launches (grid-stride, so
  the grid is capped at 32 blocks per multiprocessor; a `float4` variant when every
  pointer is 16-byte aligned) and dots through `cupy.matmul` (cuBLAS).

The call convention follows `tfxla_lite.codegen.Executable`: `executable(*arrays)` checks
dtypes and shapes and returns freshly allocated outputs (CuPy arrays; NumPy inputs are
copied to the device first).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tfxla_lite.codegen.gpu.compiler import SCRATCH_ALIGNMENT, GpuProgram, Thunk
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

    @property
    def kernel_count(self) -> int:
        return self.program.kernel_count

    @property
    def cuda_source(self) -> str:
        return self.program.source

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
            outputs = [cupy.empty(s.dims, dtype=s.numpy_dtype) for s in self.output_shapes]
            self._run(cupy, inputs, outputs)
            return outputs

    def run_numpy(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Copy NumPy inputs to the device, run, and copy the outputs back."""
        cupy = _cupy()
        return [cupy.asnumpy(o) for o in self(*arrays)]

    def _run(self, cupy: Any, inputs: list[Any], outputs: list[Any]) -> None:
        scratch_offset = -(-self.temp_bytes // SCRATCH_ALIGNMENT) * SCRATCH_ALIGNMENT
        scratch_bytes = max(self.program.scratch_bytes, self._product_bytes())
        arena = cupy.empty(scratch_offset + scratch_bytes, dtype=np.uint8) \
            if scratch_offset + scratch_bytes else None
        entry = self.module.entry
        assert entry is not None

        def view(inst: Instruction, index: tuple[int, ...] = ()) -> Any:
            """The array of `inst` (leaf `index` of a tuple-shaped one)."""
            buffer = self.assignment.slice_of(inst, index)
            shape = inst.shape.tuple_shapes[index[0]] if index else inst.shape  # type: ignore
            if buffer.kind == "parameter":
                return inputs[buffer.index]
            if buffer.kind == "output":
                out = outputs[buffer.index]
                if out.shape == shape.dims and out.dtype == shape.numpy_dtype:
                    return out
                # A temp that buffer assignment placed in this output buffer (it dies
                # before the output is written): its bytes from the buffer's start.
                return cupy.ndarray(shape.dims, dtype=shape.numpy_dtype, memptr=out.data)
            if buffer.kind == "constant":
                return self._constants[self._constant_names[_resolve(self.assignment, inst)]]
            return _arena_view(cupy, arena, buffer.offset, shape)

        def scratch(shape: Shape) -> Any:
            return _arena_view(cupy, arena, scratch_offset, shape)

        for thunk in self.program.thunks:
            self._run_thunk(cupy, thunk, view, scratch)
        # Outputs living in another buffer (a parameter, a constant): none after the
        # `add-output-copies` pass, but a module compiled without it may have them.
        root = entry.root
        assert root is not None
        for j, inst in enumerate(root.operands if root.opcode == "tuple" else [root]):
            buffer = self.assignment.slice_of(inst)
            if not (buffer.kind == "output" and buffer.index == j):
                outputs[j][...] = view(inst)

    def _product_bytes(self) -> int:
        return max((t.plan.extra["dot"].shape.byte_size for t in self.program.thunks
                    if t.plan.kind == "dot-epilogue"), default=0)

    def _run_thunk(self, cupy: Any, thunk: Thunk, view: Any, scratch: Any) -> None:
        plan = thunk.plan
        args = [view(m, index) for m, index in plan.outputs] + [view(i) for i in plan.inputs]
        if plan.kind == "dot":
            (inst,) = plan.members
            run_dot(cupy, inst, view(inst.operand(0)), view(inst.operand(1)), view(inst))
            return
        if plan.kind == "dot-epilogue":
            (inst,) = plan.members
            dot = plan.extra["dot"]
            product = scratch(dot.shape)
            operands = [inst.operand(p.parameter_number) for p in dot.operands]
            run_dot(cupy, dot, view(operands[0]), view(operands[1]), product)
            args.append(product)
        assert plan.launch is not None
        block = (plan.launch.block[0], plan.launch.block[1], 1)
        if plan.kind == "multi-output":
            for name in thunk.functions:
                launch = plan.extra["reduce_launch"] if name.endswith("_reduce") \
                    else plan.launch
                self._functions[name]((launch.grid(self._grid_cap),), block, tuple(args))
            return
        if plan.kind == "split-reduction":
            partials = scratch(Shape("f64", (plan.chunks,)))
            self._functions[thunk.functions[0]](
                (plan.launch.grid(self._grid_cap),), block, (*args, partials))
            self._functions[thunk.functions[1]]((1,), block, (*args, partials))
            return
        name = thunk.functions[0]
        units = plan.launch.units
        if plan.vectorized and all(a.data.ptr % VECTOR_ALIGNMENT == 0 for a in args):
            name, units = thunk.functions[1], units // 4
        per_block = plan.launch.units_per_block
        grid = max(1, min(-(-units // per_block), self._grid_cap))
        self._functions[name]((grid,), block, tuple(args))


def _resolve(assignment: Any, inst: Instruction) -> str:
    """The name of the value `inst` stands for (a forwarding name resolves to it)."""
    aliases = getattr(assignment, "aliases", {}) or {}
    return aliases.get(inst.name, inst.name)


def _arena_view(cupy: Any, arena: Any, offset: int, shape: Shape) -> Any:
    """A CuPy array of `shape` over the arena's bytes from `offset`."""
    if shape.byte_size == 0 or arena is None:
        return cupy.empty(shape.dims, dtype=shape.numpy_dtype)
    pointer = arena.data + offset
    return cupy.ndarray(shape.dims, dtype=shape.numpy_dtype, memptr=pointer)


def run_dot(cupy: Any, dot: Instruction, lhs: Any, rhs: Any, out: Any) -> None:
    """`out = dot(lhs, rhs)` through `cupy.matmul` (cuBLAS): each operand transposed to
    (batch, free, contracting) order and flattened to a batch of matrices."""
    attrs = dot.attributes
    lb, rb = list(attrs.get("lhs_batch_dims", ())), list(attrs.get("rhs_batch_dims", ()))
    lc, rc = list(attrs.get("lhs_contracting_dims", ())), list(attrs.get("rhs_contracting_dims",
                                                                         ()))
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]

    def size(array: Any, dims: list[int]) -> int:
        return int(np.prod([array.shape[d] for d in dims], dtype=np.int64))

    batch = size(lhs, lb)
    m, k, n = size(lhs, lf), size(lhs, lc), size(rhs, rf)
    a = lhs.transpose(lb + lf + lc).reshape(batch, m, k)
    b = rhs.transpose(rb + rc + rf).reshape(batch, k, n)
    target = out.reshape(batch, m, n)
    cupy.matmul(a, b, out=target)
