"""LLVM plumbing of the CPU backend: host target, optimization, JIT, the BLAS library.

The last step of CPU codegen: an `llvmlite.ir` module's text is parsed, verified,
optimized at O3 with loop and SLP vectorization for the host CPU and its features, and
compiled to machine code, a big module in parts on several threads (`compile_parts`,
cut by `module_split.py`) that one engine loads and links (`load_objects`). libm and
libc resolve from the process, the GEMM from NumPy's OpenBLAS and libgomp from the
system (`llvm.add_symbol`). Each pipeline run leaks a little memory inside llvmlite,
so runs are counted (`pipeline_runs`; docs/reliability.md, "Memory").
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import functools
import glob
import os
import threading
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
from llvmlite.binding import ffi
from llvmlite.binding.module import ModuleRef

from tfxla_lite.options import VECTOR_WIDTHS


def target_machine(codegen_level: int = 3, width: str | None = None) -> llvm.TargetMachine:
    """A new target machine for the host (an MCJIT engine takes ownership of its own).
    `codegen_level`: the code generator's optimization level (0: fast instruction
    selection, the quick tier's; 3: everything cached and every engine's). `width`: the
    vectorizer's preferred width (`vector_width`; None: the process's option)."""
    triple, cpu, _ = _host_cpu()
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=target_features(width), opt=codegen_level, codemodel="jitdefault",
        jit=True)


# CPUs whose LLVM tuning prefers 256-bit vectors but that measured faster with 512-bit
# ones (docs/benchmarks.md, "Vector width"); "auto" uses 512 on them, LLVM's tuning
# elsewhere (Zen 4 double-pumps 512-bit operations; other Intel parts are unmeasured).
AUTO_512_CPUS = frozenset({"sapphirerapids", "emeraldrapids"})


def vector_width(preference: str | None = None) -> str:
    """The vector width code is compiled for, "256", "512" or "llvm" (the CPU's own
    tuning): `preference` (None: the process's `prefer_vector_width` option) resolved
    for this CPU. Wider than the CPU's registers is "llvm": the feature is a no-op."""
    if preference is None:
        from tfxla_lite.flags import get_options  # settings layer: no TensorFlow

        preference = get_options().prefer_vector_width
    if preference not in VECTOR_WIDTHS:
        raise ValueError(f"prefer_vector_width must be one of {', '.join(VECTOR_WIDTHS)}, "
                         f"got {preference!r}")
    _, cpu, features = _host_cpu()
    if "+avx512f" not in features.split(","):
        return "llvm"
    if preference == "auto":
        return "512" if cpu in AUTO_512_CPUS else "llvm"
    return preference


def target_features(width: str | None = None) -> str:
    """The host's features with the vector width preference (`vector_width`) applied:
    `prefer-256-bit` is the tuning flag LLVM's loop and SLP vectorizers read; explicit
    vector types in the IR (dot kernels') keep their width either way."""
    _, _, features = _host_cpu()
    resolved = vector_width(width)
    if resolved == "llvm":
        return features
    return features + (",+prefer-256-bit" if resolved == "256" else ",-prefer-256-bit")


@functools.cache
def _host_cpu() -> tuple[str, str, str]:
    """(process triple, CPU name, CPU features) of the host, asked of LLVM once: every
    engine needs a target machine of its own, and a warm start loads one per cluster."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return (llvm.get_process_triple(), llvm.get_host_cpu_name(),
            llvm.get_host_cpu_features().flatten())


def _optimizing_machine() -> llvm.TargetMachine:
    """The target machine the optimizer uses for the process's vector width."""
    return _optimizing_machine_for(vector_width())


@functools.cache
def _optimizing_machine_for(width: str) -> llvm.TargetMachine:
    """The target machine the optimizer uses, kept for the process (no engine owns it)."""
    return target_machine(width=width)


_runs: Counter[int] = Counter()  # pass pipeline runs by speed level
_runs_lock = threading.Lock()


def _count_run(speed_level: int, count: int = 1) -> None:
    with _runs_lock:
        _runs[speed_level] += count


def pipeline_runs() -> dict[int, int]:
    """How many times this process has run LLVM's pass pipeline, by speed level (each
    run leaves llvmlite's instrumentation memory behind: the module docstring)."""
    with _runs_lock:
        return dict(_runs)


@functools.cache
def _host() -> tuple[str, str]:
    """(triple, data layout) of the host, read once and kept as text."""
    machine = _optimizing_machine()
    data = machine.target_data
    return machine.triple, str(data)


def parse_and_verify(text: str) -> llvm.ModuleRef:
    """Parse emitted IR and run LLVM's verifier (llvmlite.ir checks nothing itself)."""
    module = llvm.parse_assembly(text)
    module.verify()
    return module


def optimize(module: llvm.ModuleRef, speed_level: int = 3) -> None:
    """Run LLVM's default O`speed_level` pipeline with loop and SLP vectorization, without
    the loop unroller.

    The unroller fully unrolled every vectorized row loop of a known trip count, which
    multiplied IR size and code generation time with kernels no faster (the vectorizer
    still interleaves 4 vectors an iteration): docs/benchmarks.md, "LLVM's loop
    unroller is off".
    """
    machine = _optimizing_machine()
    module.triple, module.data_layout = _host()
    builder = llvm.create_pass_builder(machine, _tuning_options(speed_level))
    _count_run(speed_level)
    builder.getModulePassManager().run(module, builder)


# Modules with less IR text than this are optimized whole, on the calling thread: the
# parts' own setup (contexts, pass builders, the bitcode round trip) would cost more
# than a second thread saves. Above it, one part per CPU this process may use, at most
# MAX_OPTIMIZER_THREADS.
PARALLEL_IR_BYTES = 32 * 1024
MAX_OPTIMIZER_THREADS = 4


def optimizer_threads() -> int:
    """How many threads may optimize the parts of one module: one per CPU this process
    may use, at most MAX_OPTIMIZER_THREADS."""
    from tfxla_lite.codegen.cpu import parallel  # as bind_runtime does: engine stays light

    return max(1, min(MAX_OPTIMIZER_THREADS, parallel.default_threads()))


@dataclass(frozen=True)
class CompiledParts:
    """The machine code of a module compiled in parts (`compile_parts`): one relocatable
    object per part, and each part's optimized IR as bitcode, from which the optimized
    module's text is linked only when something asks for it (`linked_text`, given the
    functions `module_split` exported between parts)."""

    objects: tuple[bytes, ...]
    bitcode: tuple[bytes, ...]


def compile_parts(texts: list[str], speed_level: int = 3, codegen_level: int = 3,
                  threads: int | None = None) -> CompiledParts:
    """Parse, verify, optimize (as `optimize` does) and compile to machine code each of
    `texts` (the parts of one module, `module_split.py`), one object each, on at most
    `threads` threads (None: one per part; a tiered compile's O3 code uses 1). The first
    part compiles on this thread. `speed_level` is the IR pipeline's level,
    `codegen_level` the code generator's (the quick tier uses 1 and 0).

    Each part has its own context, target machine (`target_machine()`, MCJIT's) and pass
    builder, made under llvmlite's process-wide lock; the part's own work calls LLVM's C
    functions without it, so parts compile in parallel to the same machine code as the
    whole module (docs/architecture.md, section 4; tests/codegen/test_module_split.py).
    """
    contexts = [llvm.create_context() for _ in texts]
    refs: list[Any] = []  # closed in this order: managers and builders, then machines
    jobs = []
    try:
        for text, context in zip(texts, contexts):
            machine = target_machine(codegen_level)
            refs.append(machine)
            builder = llvm.create_pass_builder(machine, _tuning_options(speed_level))
            refs.append(builder)
            manager = builder.getModulePassManager()
            refs.append(manager)
            jobs.append((context, text.encode(), manager, builder, machine))
        _count_run(speed_level, len(jobs))
        workers = len(jobs) if threads is None else max(1, min(threads, len(jobs)))
        if workers == 1:
            results = [_compile_part(*job) for job in jobs]
        else:
            with concurrent.futures.ThreadPoolExecutor(workers - 1) as pool:
                started = [pool.submit(_compile_part, *job) for job in jobs[1:]]
                results = [_compile_part(*jobs[0])] + [f.result() for f in started]
    finally:
        for ref in reversed(refs):
            ref.close()
        for context in contexts:
            context.close()
    return CompiledParts(tuple(obj for _, obj in results),
                         tuple(code for code, _ in results))


def _unlocked(function: Any) -> Any:
    """The C function behind an llvmlite binding, without llvmlite's lock (an llvmlite
    that wraps it otherwise keeps its lock: correct, one part at a time)."""
    return getattr(function, "_cfn", function)


def _compile_part(context: Any, text: bytes, manager: Any, builder: Any,
                  machine: llvm.TargetMachine) -> tuple[bytes, bytes]:
    """(optimized bitcode, object file) of one part's IR `text`, parsed into `context`
    (which nothing else uses); runs on its own thread. The bitcode is written before
    code generation, whose IR passes change the module."""
    lib = ffi.lib
    triple, data_layout = _host()
    with ffi.OutputString() as error:
        module = ModuleRef(_unlocked(lib.LLVMPY_ParseAssembly)(context, text, error), context)
        if error:
            module.close()
            raise RuntimeError(f"LLVM IR parsing error\n{error}")
    try:
        with ffi.OutputString() as error:
            if _unlocked(lib.LLVMPY_VerifyModule)(module, error):
                raise RuntimeError(str(error))
        _unlocked(lib.LLVMPY_SetTarget)(module, ctypes.create_string_buffer(triple.encode()))
        _unlocked(lib.LLVMPY_SetDataLayout)(module,
                                            ctypes.create_string_buffer(data_layout.encode()))
        _unlocked(lib.LLVMPY_RunNewModulePassManager)(manager, module, builder)
        pointer, size = ctypes.c_char_p(None), ctypes.c_size_t(0)
        _unlocked(lib.LLVMPY_WriteBitcodeToString)(module, ctypes.byref(pointer),
                                                  ctypes.byref(size))
        if not pointer:
            raise MemoryError("LLVM wrote no bitcode")
        try:
            bitcode = ctypes.string_at(pointer, size.value)
        finally:
            _unlocked(lib.LLVMPY_DisposeString)(pointer)
        with ffi.OutputString() as error:
            buffer = _unlocked(lib.LLVMPY_TargetMachineEmitToMemory)(machine, module, 1, error)
            if not buffer:
                raise RuntimeError(f"LLVM code generation failed: {error}")
        try:
            return bitcode, ctypes.string_at(_unlocked(lib.LLVMPY_GetBufferStart)(buffer),
                                             _unlocked(lib.LLVMPY_GetBufferSize)(buffer))
        finally:
            _unlocked(lib.LLVMPY_DisposeMemoryBuffer)(buffer)
    finally:
        module.close()


def link_parts(bitcode: Collection[bytes], internal: Collection[str] = (),
               speed_level: int = 3) -> llvm.ModuleRef:
    """The parts' optimized modules linked into one of the global context, where the
    functions named in `internal` (made external only for calls between parts) get
    internal linkage again and are dropped when no call is left (a task whose launch
    LLVM proved dead in `entry`'s part), so the result has the functions the whole
    module's optimization gives. Only its text is used (`linked_text`)."""
    modules = [llvm.parse_bitcode(code) for code in bitcode]
    linked = modules[0]
    for module in modules[1:]:
        linked.link_in(module)
    names = set(internal)
    for function in linked.functions:
        if function.name in names and not function.is_declaration:
            function.linkage = "internal"
    if names:
        manager = llvm.create_new_module_pass_manager()
        manager.add_global_dead_code_eliminate_pass()
        builder = llvm.create_pass_builder(_optimizing_machine(), _tuning_options(speed_level))
        _count_run(speed_level)
        manager.run(linked, builder)
    return linked


def linked_text(bitcode: Collection[bytes], internal: Collection[str] = ()) -> str:
    """The optimized module's text, from its parts' bitcode (`link_parts`)."""
    return str(link_parts(bitcode, internal))


def optimize_parts(texts: list[str], internal: Collection[str] = (),
                   speed_level: int = 3) -> llvm.ModuleRef:
    """`compile_parts`' optimized IR of `texts`, linked into one module (`link_parts`)."""
    return link_parts(compile_parts(texts, speed_level).bitcode, internal, speed_level)


def _tuning_options(speed_level: int) -> llvm.PipelineTuningOptions:
    options = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    options.loop_vectorization = True
    options.slp_vectorization = True
    options.loop_unrolling = False
    return options


def jit(module: llvm.ModuleRef) -> tuple[llvm.ExecutionEngine, bytes]:
    """Compile a whole `module` to machine code with MCJIT; keep the engine alive to run it.

    Also returns the object file MCJIT produced (through its object-cache hook, so the
    code is generated once). The compiler uses `compile_parts` and `load_objects`
    instead; this is for small helper modules (benchmarks' clock).
    """
    engine = llvm.create_mcjit_compiler(module, target_machine())
    objects: list[bytes] = []
    engine.set_object_cache(notify_func=lambda _module, data: objects.append(data))
    engine.finalize_object()
    return engine, (objects[0] if objects else b"")


def load_objects(objects: Collection[bytes], symbols: Collection[str] = ()
                 ) -> llvm.ExecutionEngine:
    """An engine running previously compiled object files (`compile_parts`; the disk
    cache's): relocation only, no code generation. MCJIT's linker resolves each
    object's undefined symbols against the other objects first, then against the
    process and what `llvm.add_symbol` bound (BLAS, the parallel runtime, libm, libc).

    `symbols`: the symbols the objects need from outside them; MCJIT aborts the process
    on one it cannot resolve, so each is checked first (after `bind_runtime`) and a
    missing one raises `LookupError`.
    """
    module = _empty_module()
    engine = llvm.create_mcjit_compiler(module, target_machine())
    # Creating the engine made the process's own symbols searchable.
    missing = [name for name in symbols if not llvm.address_of_symbol(name)]
    if missing:
        raise LookupError(f"unresolved symbols {', '.join(sorted(missing))}")
    for code in objects:
        engine.add_object_file(llvm.ObjectFileRef.from_data(code))
    # The empty module out before finalizing: MCJIT would otherwise set up its whole code
    # generation pipeline for it, most of an engine's load (a warm start loads one
    # engine per cluster); finalizing still relocates the objects, registers
    # their unwind tables and sets their pages' permissions.
    engine.remove_module(module)
    engine.finalize_object()
    return engine


def _empty_module() -> llvm.ModuleRef:
    """The module an engine of loaded objects is created with (MCJIT needs one)."""
    triple, data_layout = _host()
    return llvm.parse_assembly(f'target triple = "{triple}"\n'
                               f'target datalayout = "{data_layout}"\n')


def bind_runtime() -> None:
    """Bind every library routine generated code may call (cached objects skip the
    emitters, which otherwise bind them as they use them)."""
    from tfxla_lite.codegen.cpu import parallel

    half_runtime()
    gemm("f32")
    gemm("f64")
    parallel.openmp_available()


def host_description() -> dict[str, str]:
    """What generated code depends on besides its IR: LLVM, target, CPU and features."""
    major, minor, patch = llvm.llvm_version_info
    triple, data_layout = _host()
    _, cpu, features = _host_cpu()
    return {"llvm": f"{major}.{minor}.{patch}", "triple": triple, "data_layout": data_layout,
            "cpu": cpu, "features": features}


# Half-precision conversions LLVM lowers to compiler-rt calls when the CPU has no
# instruction for them (double to half always); GCC 12's libgcc_s ships them.
_HALF_RUNTIME = ("__truncdfhf2", "__truncsfhf2", "__extendhfsf2", "__extendhfdf2")


@functools.cache
def half_runtime() -> bool:
    """Bind libgcc's half conversions into the JIT; False when they are not available."""
    try:
        library = ctypes.CDLL(ctypes.util.find_library("gcc_s") or "libgcc_s.so.1")
    except OSError:
        return False
    found = True
    for symbol in _HALF_RUNTIME:
        try:
            function = getattr(library, symbol)
        except AttributeError:
            found = False
            continue
        llvm.add_symbol(symbol, ctypes.cast(function, ctypes.c_void_p).value)
    return found


@dataclass(frozen=True)
class Gemm:
    """A CBLAS `?gemm` routine the JIT can call: its symbol and the width of its ints."""

    symbol: str
    int_bits: int


# Symbol name templates of NumPy's OpenBLAS builds, newest first, and their int width.
_GEMM_CANDIDATES = (
    ("scipy_cblas_{p}gemm64_", 64),
    ("cblas_{p}gemm64_", 64),
    ("scipy_cblas_{p}gemm", 32),
    ("cblas_{p}gemm", 32),
)


@functools.cache
def _blas_library() -> ctypes.CDLL | None:
    import numpy

    root = os.path.dirname(os.path.dirname(numpy.__file__))
    patterns = [os.path.join(root, "numpy.libs", "lib*openblas*.so*"),
                os.path.join(os.path.dirname(numpy.__file__), ".dylibs", "lib*openblas*.dylib")]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


@functools.cache
def gemm(element_type: str) -> Gemm | None:
    """The GEMM for f32/f64 from NumPy's OpenBLAS, bound into the JIT; None if absent."""
    prefix = {"f32": "s", "f64": "d"}.get(element_type)
    library = _blas_library()
    if prefix is None or library is None:
        return None
    for template, bits in _GEMM_CANDIDATES:
        symbol = template.format(p=prefix)
        try:
            function = getattr(library, symbol)
        except AttributeError:
            continue
        if bits == 64 and not _is_ilp64(library):
            continue
        llvm.add_symbol(symbol, ctypes.cast(function, ctypes.c_void_p).value)
        _single_threaded(library)
        return Gemm(symbol, bits)
    return None


def _single_threaded(library: ctypes.CDLL) -> None:
    """Keep OpenBLAS to one thread: generated code runs GEMM tiles on its own libgomp
    team (`dot.py`), and OpenBLAS's spinning threads would fight that team and TF's
    for the cores. The setting is the library's, so NumPy's matmul in this process
    runs on one thread too."""
    for name in ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads"):
        setter = getattr(library, name, None)
        if setter is not None:
            setter(ctypes.c_int(1))
            return


def _is_ilp64(library: ctypes.CDLL) -> bool:
    """Whether the library was built with 64-bit BLAS ints (its config string says so)."""
    for name in ("scipy_openblas_get_config64_", "openblas_get_config64_"):
        try:
            get_config = getattr(library, name)
        except AttributeError:
            continue
        get_config.restype = ctypes.c_char_p
        return b"USE64BITINT" in (get_config() or b"")
    return True  # the `64_` suffix is the ILP64 naming convention
