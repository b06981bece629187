"""O3 machine code of an emitted module: its parts compiled (one object each) and loaded.

Where it sits: `compiler._machine_code` calls it on the calling thread and
`tiers.o3_tier` on the background thread, so that neither imports the other for it.
"""

from __future__ import annotations

from typing import Any

from tfxla_lite.codegen.cpu import engine, kernel_cache
from tfxla_lite.codegen.cpu.emitter import ENTRY_NAME


def o3_machine_code(emitted: Any, threads: int | None = None) -> kernel_cache.CompiledCode:
    """`emitted`'s parts (a `compiler.EmittedModule`) optimized, compiled and loaded on at
    most `threads` threads (`engine.compile_parts`); not counted (the caller counts)."""
    split = emitted.split
    parts = engine.compile_parts(split.parts, threads=threads)
    execution_engine = engine.load_objects(parts.objects)
    address = execution_engine.get_function_address(ENTRY_NAME)
    return kernel_cache.CompiledCode(
        execution_engine, address, emitted.kernel_count, split.text,
        kernel_cache.optimized_text(parts.bitcode, split.exported), parts.objects,
        parts.bitcode, split.exported)
