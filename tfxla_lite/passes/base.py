"""The base every HLO-to-HLO pass derives from.

A pass is a small frozen dataclass (its fields are its options) with a
kebab-case `name`, the one `tfxla_lite.passes.pipeline` spells it by, and a
`run(module) -> bool` that rewrites the module in place and says whether it
changed anything. Each pass's docstring says what it needs and what it
guarantees; every pass leaves a module that `tfxla_lite.hlo.verifier.verify`
accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tfxla_lite.hlo.ir import HloModule


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str] = ""

    def run(self, module: HloModule) -> bool:
        """Rewrite `module` in place; True when anything changed."""
        raise NotImplementedError
