"""Ahead-of-time libraries: an HLO module as a relocatable object file and a C header.

Beside `compiler.py`, for code that runs without Python, TensorFlow or the op library
(as `tfcompile` makes): the same passes, buffer assignment and emitters as a JIT
compile, but every symbol internal except a checking `<name>_run`, parallel regions
serial or through libgomp's `GOMP_parallel`, position-independent code for the host CPU,
and every undefined symbol resolved in libc, libm, libgcc, libgomp or the BLAS (else an
`AotError`; `AotLibrary.libraries` names what to link). `tfxla_lite/aot.py` is the
TF-facing front; this file imports no TensorFlow. docs/aot.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite import ir

from tfxla_lite.codegen.cpu import engine, parallel
from tfxla_lite.codegen.cpu.compiler import KernelMerger, emit_function
from tfxla_lite.codegen.cpu.emitter import ENTRY_NAME, I32, I64, PTR, VOID, ConstantPool
from tfxla_lite.codegen.cpu.kernel_cache import object_symbols
from tfxla_lite.codegen.executable import TEMP_ALIGNMENT
from tfxla_lite.hlo.ir import HloModule
from tfxla_lite.hlo.shape import Shape
from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize
from tfxla_lite.passes.buffer_assignment import leaves

PARALLEL_MODES = ("serial", "openmp")
# What `<name>_run` returns.
RUN_OK = 0
RUN_NULL_ARRAY = 1  # inputs or outputs is NULL while the function has some
RUN_BAD_TEMP = 2  # temp is NULL or not TEMP_ALIGNMENT-aligned while the arena is needed

# C type of each element type in the header; 2-byte floats travel as their bits.
_C_TYPES = {
    "pred": "uint8_t", "s8": "int8_t", "s16": "int16_t", "s32": "int32_t", "s64": "int64_t",
    "u8": "uint8_t", "u16": "uint16_t", "u32": "uint32_t", "u64": "uint64_t",
    "f16": "uint16_t", "bf16": "uint16_t", "f32": "float", "f64": "double",
}
# Libraries searched for the object's undefined symbols, in this order, and how to link each.
_LINK_FLAGS = {"libc": "", "libm": "-lm", "libgcc": "", "libgomp": "-fopenmp",
               "openblas": "(the OpenBLAS that defines it: NumPy's libscipy_openblas64_)"}


class AotError(ValueError):
    """A module that cannot become an ahead-of-time library, and why."""


@dataclass(frozen=True)
class AotLibrary:
    """An object file and its C header: `<name>_run` and the sizes its caller needs."""

    name: str
    module_name: str
    object_code: bytes  # a relocatable ELF object for the host
    parameter_shapes: tuple[Shape, ...]
    output_shapes: tuple[Shape, ...]
    temp_bytes: int
    parallel: str  # "serial" or "openmp"
    threads: int
    # Undefined symbols of the object and the library each comes from.
    symbols: tuple[tuple[str, str], ...]

    @property
    def libraries(self) -> tuple[str, ...]:
        """The libraries the object needs at link time, each once ("libc", "libm", ...)."""
        return tuple(dict.fromkeys(library for _, library in self.symbols))

    @property
    def header(self) -> str:
        """The C header (`header_text`)."""
        return header_text(self)

    def write(self, prefix: str) -> tuple[str, str]:
        """Write `<prefix>.o` and `<prefix>.h`; returns their paths."""
        object_path, header_path = prefix + ".o", prefix + ".h"
        with open(object_path, "wb") as handle:
            handle.write(self.object_code)
        with open(header_path, "w", encoding="utf-8") as handle:
            handle.write(self.header)
        return object_path, header_path


def compile_library(module: HloModule, name: str, parallel_mode: str = "serial",
                    threads: int | None = None, pipeline: str | None = None,
                    verify: bool = True) -> AotLibrary:
    """Optimize `module` in place and compile it to an object exporting `<name>_run`.

    `parallel_mode`: "serial" (one thread, no runtime needed) or "openmp" (big kernels on
    libgomp's team, cut into parts for `threads` threads; None: this machine's CPUs).
    `pipeline` as `tfxla_lite.passes.optimize` takes it (None: the default); `verify`
    runs the HLO verifier before and after every pass.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise AotError(f"library name {name!r} is not a C identifier")
    if parallel_mode not in PARALLEL_MODES:
        raise AotError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got "
                       f"{parallel_mode!r}")
    entry = module.entry
    if entry is None or entry.root is None:
        raise AotError(f"module {module.name} has no entry computation")
    for param in entry.parameters:
        if param.shape.is_tuple:
            raise AotError(f"parameter %{param.name} has the tuple shape {param.shape}: a "
                           "library takes arrays only")
    team = 1 if parallel_mode == "serial" else (
        parallel.default_threads() if threads is None else threads)
    if team < 1:
        raise AotError(f"thread count must be at least 1, got {threads}")
    optimize(module, DEFAULT_PIPELINE if pipeline is None else pipeline, verify=verify)
    assignment = assign_buffers(module)
    parameter_shapes = tuple(p.shape for p in entry.parameters)
    output_shapes = tuple(shape for _, shape in leaves(entry.root.shape))
    temp_bytes = int(assignment.temp_bytes)

    llvm_module = ir.Module(name=module.name)
    emit_function(llvm_module, ConstantPool(llvm_module), KernelMerger(llvm_module), entry,
                  assignment, team, ENTRY_NAME)
    _define_parallel_runtime(llvm_module, parallel_mode)
    run_name = f"{name}_run"
    _emit_run(llvm_module, run_name, len(parameter_shapes), len(output_shapes), temp_bytes)
    object_code = _object_code(str(llvm_module), run_name)
    symbols = tuple((symbol, _library_of(symbol)) for symbol in undefined_symbols(object_code))
    return AotLibrary(name, module.name, object_code, parameter_shapes, output_shapes,
                      temp_bytes, parallel_mode, team, symbols)


def _define_parallel_runtime(module: ir.Module, mode: str) -> None:
    """Give the kernels' `tfxla_lite_parallel(task, data, threads, flags)` a body in the
    object: libgomp's GOMP_parallel (same signature) or, serial, one call of the task,
    which claims every part of the range itself (`parallel._task`)."""
    function = module.globals.get(parallel.RUNTIME_SYMBOL)
    if not isinstance(function, ir.Function):
        return  # no kernel asked for a team
    function.linkage = "internal"
    task, data, _, flags = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    if mode == "openmp":
        gomp = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I32, I32]),
                           name="GOMP_parallel")
        # 0 threads: libgomp's default team, which the library's user sets.
        builder.call(gomp, [task, data, ir.Constant(I32, 0), flags])
    else:  # a typed pointer only so that llvmlite knows the callee's signature
        builder.call(builder.bitcast(task, ir.FunctionType(VOID, [PTR]).as_pointer()), [data])
    builder.ret_void()


def _emit_run(module: ir.Module, run_name: str, inputs: int, outputs: int,
              temp_bytes: int) -> None:
    """`int <run_name>(const void** inputs, void** outputs, void* temp)`: the argument
    checks the header documents, then `entry`."""
    function = ir.Function(module, ir.FunctionType(I32, [PTR, PTR, PTR]), name=run_name)
    function.attributes.add("nounwind")
    inputs_arg, outputs_arg, temp_arg = function.args
    builder = ir.IRBuilder(function.append_basic_block("entry"))
    null = ir.Constant(PTR, None)

    def fail_if(condition: ir.Value, code: int) -> None:
        with builder.if_then(condition, likely=False):
            builder.ret(ir.Constant(I32, code))

    if inputs:
        fail_if(builder.icmp_unsigned("==", inputs_arg, null), RUN_NULL_ARRAY)
    if outputs:
        fail_if(builder.icmp_unsigned("==", outputs_arg, null), RUN_NULL_ARRAY)
    if temp_bytes:
        address = builder.ptrtoint(temp_arg, I64)
        misaligned = builder.icmp_unsigned(
            "!=", builder.and_(address, I64(TEMP_ALIGNMENT - 1)), I64(0))
        fail_if(builder.or_(builder.icmp_unsigned("==", temp_arg, null), misaligned),
                RUN_BAD_TEMP)
    builder.call(module.globals[ENTRY_NAME], [inputs_arg, outputs_arg, temp_arg])
    builder.ret(ir.Constant(I32, RUN_OK))


def _object_code(text: str, run_name: str) -> bytes:
    """Verify, internalize everything but `run_name`, optimize at O3 and emit the object."""
    module = engine.parse_and_verify(text)
    for value in [*module.functions, *module.global_variables]:
        if not value.is_declaration and value.name != run_name:
            value.linkage = "internal"
    engine.optimize(module)
    host = engine.host_description()
    machine = llvm.Target.from_triple(host["triple"]).create_target_machine(
        cpu=host["cpu"], features=engine.target_features(), opt=3, reloc="pic",
        codemodel="default")
    return machine.emit_object(module)


# -- undefined symbols ------------------------------------------------------------------------

def undefined_symbols(object_code: bytes) -> list[str]:
    """The names of an ELF64 little-endian object's undefined global symbols, sorted."""
    if object_code[:4] != b"\x7fELF" or object_code[4] != 2 or object_code[5] != 1:
        raise AotError("the object is not a 64-bit little-endian ELF file: libraries are "
                       "built for Linux hosts only")
    return object_symbols(object_code)[1]


@functools.cache
def _system_library(name: str) -> ctypes.CDLL | None:
    path = {"libc": ctypes.util.find_library("c"), "libm": ctypes.util.find_library("m"),
            "libgcc": ctypes.util.find_library("gcc_s") or "libgcc_s.so.1",
            "libgomp": ctypes.util.find_library("gomp") or "libgomp.so.1"}[name]
    try:
        return ctypes.CDLL(path) if path else None
    except OSError:
        return None


def _library_of(symbol: str) -> str:
    """Which library defines `symbol` (`_LINK_FLAGS`' names); AotError for none."""
    blas = {gemm.symbol for gemm in (engine.gemm("f32"), engine.gemm("f64")) if gemm}
    if symbol in blas:
        return "openblas"
    for name in ("libc", "libm", "libgcc", "libgomp"):
        library = _system_library(name)
        if library is not None and hasattr(library, symbol):
            return name
    raise AotError(f"the object needs {symbol}, which none of libc, libm, libgcc, libgomp "
                   "or the BLAS defines")


# -- the header -------------------------------------------------------------------------------

def header_text(library: AotLibrary) -> str:
    """The C header of `library`: the run function, every argument's and result's type,
    shape and size, the temp arena's size and alignment, and how to link."""
    name, upper = library.name, library.name.upper()
    guard = f"TFXLA_LITE_AOT_{upper}_H_"
    links = " ".join(flag for flag in (_LINK_FLAGS[lib] for lib in library.libraries) if flag)
    needs = ", ".join(f"{symbol} ({lib})" for symbol, lib in library.symbols) or "nothing"
    host = engine.host_description()
    threads = ("one thread (serial)" if library.parallel == "serial" else
               "libgomp's team (OMP_NUM_THREADS), big kernels cut for "
               f"{library.threads} threads")
    lines = [
        f"/* {name}: an ahead-of-time library made by tfxla-lite from HLO module "
        f"{library.module_name}.",
        " *",
        f" *   int {name}_run(const void** inputs, void** outputs, void* temp);",
        " *",
        " * inputs[i] points to argument i and outputs[j] to result j (below), dense",
        " * row-major, aligned to their element size; results must not overlap arguments.",
        f" * temp points to {library.temp_bytes} bytes of scratch ({upper}_TEMP_BYTES), "
        f"aligned to {TEMP_ALIGNMENT}",
        f" * bytes ({upper}_TEMP_ALIGNMENT), or may be NULL when that size is 0; its contents",
        " * need not be kept between calls. The function keeps no state: threads may call",
        " * it at once with their own buffers and arenas. It returns 0, or",
        f" * {RUN_NULL_ARRAY} when inputs or outputs is NULL, {RUN_BAD_TEMP} when temp is "
        "NULL or misaligned.",
        " * f16 and bf16 values travel as their 16-bit patterns (uint16_t).",
        " *",
        f" * Runs on {threads}. Compiled for this machine's CPU and its features:",
        f" * {host['cpu']}, {host['triple']}.",
        f" * Link: cc main.c THIS_OBJECT.o {links}".rstrip(),
        f" * Undefined symbols of the object: {needs}.",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        f"#define {upper}_NUM_INPUTS {len(library.parameter_shapes)}",
        f"#define {upper}_NUM_OUTPUTS {len(library.output_shapes)}",
        f"#define {upper}_TEMP_BYTES {library.temp_bytes}",
        f"#define {upper}_TEMP_ALIGNMENT {TEMP_ALIGNMENT}",
        "/* Bytes of every argument and result, in order (array initializers). */",
        f"#define {upper}_INPUT_BYTES "
        f"{_initializer(s.byte_size for s in library.parameter_shapes)}",
        f"#define {upper}_OUTPUT_BYTES "
        f"{_initializer(s.byte_size for s in library.output_shapes)}",
        "",
    ]
    for kind, shapes in (("INPUT", library.parameter_shapes), ("OUTPUT", library.output_shapes)):
        for number, shape in enumerate(shapes):
            prefix = f"{upper}_{kind}{number}"
            lines += [
                f"/* {kind.lower()} {number}: {shape.to_text(layout=False)} */",
                f"typedef {_C_TYPES[shape.element_type]} {name}_{kind.lower()}{number}_t;",
                f'#define {prefix}_DTYPE "{shape.element_type}"',
                f"#define {prefix}_RANK {len(shape.dims)}",
                f"#define {prefix}_DIMS {_initializer(shape.dims)}",
                f"#define {prefix}_ELEMENTS {shape.num_elements}",
                f"#define {prefix}_BYTES {shape.byte_size}",
                "",
            ]
    lines += [
        f"int {name}_run(const void** inputs, void** outputs, void* temp);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif  /* {guard} */",
        "",
    ]
    return "\n".join(lines)


def _initializer(values: Iterable[int]) -> str:
    items = ", ".join(str(v) for v in values)
    return "{" + (items or "0") + "}"


def link_flags(library: AotLibrary) -> list[str]:
    """The compiler driver's flags for the system libraries `library` needs (not BLAS)."""
    return [flag for flag in (_LINK_FLAGS[lib] for lib in library.libraries)
            if flag.startswith("-")]

