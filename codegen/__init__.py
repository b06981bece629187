"""Backends of tfxla-lite: HLO module → `Executable` (CPU through LLVM via llvmlite).

The third stage of the compiler core, after `tfxla_lite.hlo` and `tfxla_lite.passes`:
`compile_module` runs the pass pipeline and buffer assignment, then hands the module
to the CPU backend (`tfxla_lite.codegen.cpu`). Imports no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Collection

from tfxla_lite.codegen.executable import Executable
from tfxla_lite.hlo.ir import HloModule


def compile_module(module: HloModule, pipeline: str | None = None,
                   verify: bool = False, threads: int | None = None,
                   cache: bool | str | None = None, donate: Collection[int] = (),
                   background: bool = False, tiered: bool = False) -> Executable:
    """Optimize `module` in place, assign its buffers and compile it for this CPU.

    `pipeline` is handed to `tfxla_lite.passes.optimize` (None: its default
    pipeline); `verify` runs the HLO verifier on the input and after every pass;
    `threads` is how many threads big kernels use (None: every CPU; 1: serial);
    `cache` chooses the compile caches: True or "on" both, "memory" the process's only,
    False or "off" none (None: the process's `cache` option, both by default;
    `codegen/cache.py`). A module whose lowered text was
    compiled before with the same options, in this process or an earlier one, runs no
    pass and no LLVM (its optimized form and machine code are reused; `module` is then
    left as it was); one whose optimized HLO, buffer assignment and thread count were,
    runs the passes but no LLVM. `donate` names the parameters whose buffers outputs
    may take over (`Executable.donations`). `background`, `tiered` (which takes
    precedence): on a miss LLVM's O3 work goes on in the background, readers waiting for
    it or quick-tier code running until it is swapped in (`codegen/cpu/tiers.py`).
    """
    from tfxla_lite.codegen import cache as stage_cache
    from tfxla_lite.codegen import cpu, module_cache
    from tfxla_lite.codegen.cpu.kernel_cache import constants_digest
    from tfxla_lite.codegen.cpu.parallel import effective_threads
    from tfxla_lite.hlo.verifier import verify as verify_module
    from tfxla_lite.passes import DEFAULT_PIPELINE, assign_buffers, optimize

    hlo_text = module.to_text()
    if verify:
        verify_module(module)
    pipeline = DEFAULT_PIPELINE if pipeline is None else pipeline
    team = effective_threads(threads)
    policy = stage_cache.policy(cache)
    key = module_cache.optimized_key(hlo_text, constants_digest(module), pipeline, donate, team)
    # With `verify` the verifier is asked to check every pass: run them.
    found = (module_cache.executable_from_cache(key, hlo_text, team, policy) if not verify
             else None)
    if found is not None:
        found.optimized_key = key  # the rewrite cache names the compile by it
        return found
    stage_cache.count("pipeline_runs")
    optimize(module, pipeline, verify=verify)
    optimized_hlo_text = module.to_text()
    assignment = assign_buffers(module)
    executable = cpu.compile(module, assignment, hlo_text=hlo_text,
                             optimized_hlo_text=optimized_hlo_text, threads=team,
                             cache=cache, donate=donate, background=background,
                             tiered=tiered)
    if policy.memory or policy.disk:
        module_cache.store(key, module_cache.OptimizedModule(
            optimized_hlo_text, executable.assignment_text, executable.temp_bytes,
            int(assignment.temp_bytes_without_reuse), tuple(executable.donations),
            constants_digest(module),
            tuple((s.element_type, s.dims) for s in executable.parameter_shapes),
            tuple((s.element_type, s.dims) for s in executable.output_shapes),
            module_cache.line_metadata(hlo_text)), policy)
    executable.optimized_key = key
    return executable


__all__ = ["Executable", "compile_module"]
