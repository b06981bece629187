"""LLVM plumbing of the CPU backend: host target, optimization, JIT, the BLAS library.

The last step of CPU codegen: the text of an `llvmlite.ir` module is parsed and
verified, optimized with the new pass manager at O3 with loop and SLP vectorization
for the host CPU (its features included, so AVX-512 hosts get wide vectors), and
compiled by MCJIT. The JIT resolves libm (f64 `tanh`, `erf`, ...) and libc (`memcpy`)
from the process; the GEMM routines come from the OpenBLAS that NumPy ships, and
libgomp's entry points (`parallel.py`) from the system, loaded with ctypes and bound
by name with `llvm.add_symbol`. A big module is optimized in parts on several threads
(`optimize_parts`, cut by `module_split.py`) and linked back before MCJIT.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import functools
import glob
import os
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
from llvmlite.binding import ffi


def target_machine() -> llvm.TargetMachine:
    """A new target machine for the host (an MCJIT engine takes ownership of its own)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    features = llvm.get_host_cpu_features().flatten()
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=features,
                                        opt=3, codemodel="jitdefault", jit=True)


@functools.cache
def _optimizing_machine() -> llvm.TargetMachine:
    """The target machine the optimizer uses, kept for the process (no engine owns it)."""
    return target_machine()


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

    The unroller fully unrolled every vectorized row loop of a known trip count (a
    [128,512] bias-add-relu: 8 iterations of 4 interleaved 16-lane vectors, then
    multiversioned for aliasing) and made the Keras MLP step's IR 7x larger: 1.19 MB
    instead of 164 KB, 1.07 s of MCJIT code generation instead of 0.09 s, 2.4 s of its
    first call instead of 0.35 s. Kernels run no slower without it (interleaved
    medians: the MLP step, MLP, MLP inference, attention, GELU, reduce_sum and layer
    norm within 2%, softmax 4096x1024 8% faster): the vectorizer still interleaves 4
    vectors per iteration.
    """
    machine = _optimizing_machine()
    module.triple, module.data_layout = _host()
    builder = llvm.create_pass_builder(machine, _tuning_options(speed_level))
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


def optimize_parts(texts: list[str], internal: Collection[str] = (),
                   speed_level: int = 3) -> llvm.ModuleRef:
    """Parse, verify and optimize each of `texts` (the parts of one module,
    `module_split.py`) as `optimize` does, on one thread per part, and link the
    results into one module of the global context, where the functions named in
    `internal` (made external only for calls between parts) get internal linkage
    again and are dropped when no call is left (a task whose launch LLVM proved dead
    in `entry`'s part), so the result has the functions the whole module would.

    llvmlite serializes every call into LLVM behind one process-wide lock, which keeps
    its threads from ever running LLVM at once. LLVM itself allows it for modules in
    different contexts, each with its own target machine and pass builder, as its
    parallel code generators do: each part gets those, all made under the lock on this
    thread, and only the pass pipeline's run is called without the lock (ctypes
    releases the GIL for it); this thread runs the first part's.
    """
    if len(texts) == 1:
        module = parse_and_verify(texts[0])
        optimize(module, speed_level)
        return module
    triple, data_layout = _host()
    contexts = [llvm.create_context() for _ in texts]
    jobs: list[tuple[Any, llvm.ModuleRef, Any]] = []
    try:
        for text, context in zip(texts, contexts):
            module = llvm.parse_assembly(text, context=context)
            jobs.append((None, module, None))
            module.verify()
            module.triple, module.data_layout = triple, data_layout
            builder = llvm.create_pass_builder(target_machine(), _tuning_options(speed_level))
            jobs[-1] = (builder.getModulePassManager(), module, builder)
        # The C function without llvmlite's lock (an llvmlite that wraps it otherwise
        # keeps its lock: correct, one part at a time).
        locked = ffi.lib.LLVMPY_RunNewModulePassManager
        run = getattr(locked, "_cfn", locked)
        with concurrent.futures.ThreadPoolExecutor(len(jobs) - 1) as pool:
            started = [pool.submit(run, *job) for job in jobs[1:]]
            run(*jobs[0])
            for future in started:
                future.result()
        bitcode = [module.as_bitcode() for _, module, _ in jobs]
    finally:
        for manager, module, builder in jobs:
            for ref in (manager, builder, module):
                if ref is not None:
                    ref.close()
        for context in contexts:
            context.close()
    linked = llvm.parse_bitcode(bitcode[0])
    for code in bitcode[1:]:
        linked.link_in(llvm.parse_bitcode(code))
    names = set(internal)
    for function in linked.functions:
        if function.name in names and not function.is_declaration:
            function.linkage = "internal"
    if names:
        manager = llvm.create_new_module_pass_manager()
        manager.add_global_dead_code_eliminate_pass()
        builder = llvm.create_pass_builder(_optimizing_machine(), _tuning_options(speed_level))
        manager.run(linked, builder)
    return linked


def _tuning_options(speed_level: int) -> llvm.PipelineTuningOptions:
    options = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    options.loop_vectorization = True
    options.slp_vectorization = True
    options.loop_unrolling = False
    return options


def jit(module: llvm.ModuleRef) -> tuple[llvm.ExecutionEngine, bytes]:
    """Compile `module` to machine code in this process; keep the engine alive to run it.

    Also returns the object file MCJIT produced (through its object-cache hook, so the
    code is generated once), which `codegen/cache.py` stores and `load_object` loads.
    """
    engine = llvm.create_mcjit_compiler(module, target_machine())
    objects: list[bytes] = []
    engine.set_object_cache(notify_func=lambda _module, data: objects.append(data))
    engine.finalize_object()
    return engine, (objects[0] if objects else b"")


def load_object(object_code: bytes, symbols: list[str]) -> llvm.ExecutionEngine:
    """An engine running a previously compiled object file: relocation only, no codegen.

    `symbols` are the object's external symbols (BLAS, libgomp, libm, libc); MCJIT
    aborts the process on one it cannot resolve, so each is checked first (after
    `bind_runtime`) and a missing one raises `LookupError`.
    """
    triple, data_layout = _host()
    host = llvm.parse_assembly(f'target triple = "{triple}"\n'
                               f'target datalayout = "{data_layout}"\n')
    # Creating the engine makes the process's own symbols searchable.
    engine = llvm.create_mcjit_compiler(host, target_machine())
    missing = [name for name in symbols if not llvm.address_of_symbol(name)]
    if missing:
        raise LookupError(f"unresolved symbols {', '.join(missing)}")
    engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
    engine.finalize_object()
    return engine


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
    return {"llvm": f"{major}.{minor}.{patch}", "triple": triple, "data_layout": data_layout,
            "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten()}


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
