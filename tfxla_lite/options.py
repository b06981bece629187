"""Compiler options: one frozen object, made once and passed down (house habit 10)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Options:
    """How `tfxla_lite.function` clusters and compiles.

    `min_cluster_size` is the smallest cluster worth compiling in auto mode
    (TF's default is 4); must-compile mode uses 1, so that every op compiles.
    `pipeline` is the pass pipeline in its text form (see
    `tfxla_lite.passes.pipeline`); `None` means the default one. `verify` runs
    the HLO verifier after every pass.
    """

    min_cluster_size: int = 4
    max_cluster_size: int | None = None
    pipeline: str | None = None
    verify: bool = False

    def with_changes(self, **changes: object) -> Options:
        return replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_OPTIONS = Options()
