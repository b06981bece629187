"""Split an emitted LLVM module into parts that LLVM can optimize on several threads.

Between kernel emission (`compiler.py`) and `engine.compile_parts` (one LLVM context,
thread and object file per part; one engine links them). Optimizing one big module is
the longest step of a cold compile, and LLVM works function by function, so cutting
between parallel kernels' tasks (functions whose address is taken, never inlined) keeps
each function's machine code the same. Units are packed by IR size; a function called
across parts is exported there and made internal again when linked; constants are
copied into each part that reads them. `apart` sets functions into a last part of their
own (the quick tier's O3 blocks, `tiers.py`). docs/architecture.md, section 4.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

from llvmlite import ir

# A global's name where IR text uses it: `@"quoted name"` or `@bare.name`.
_GLOBAL_REFERENCE = re.compile(r'@(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._][-a-zA-Z$._0-9]*))')
# The same, not called (no argument list follows): the function's address is taken.
_ADDRESS_TAKEN = re.compile(
    r'@(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._][-a-zA-Z$._0-9]*))(?![-a-zA-Z$._0-9(])')


# A cut whose largest part holds more than this share of the IR is not made: the
# threads would save less than a quarter of the optimization's time, and the parts'
# own cost (contexts, the bitcode link, a thread's start) takes most of that.
MAX_LARGEST_SHARE = 0.75
# Units are packed by IR size plus this much per unit: LLVM's time is not proportional
# to IR text, and each task's loops cost the vectorizer and the code generator about as
# much as 6 KB of `entry`'s straight-line launches (docs/benchmarks.md, "Big modules in
# parts").
UNIT_BYTES = 6 * 1024


@dataclass(frozen=True)
class SplitModule:
    """A module's IR text whole (what `str(module)` gives) and cut into parts (one part,
    the whole text, when it is not cut)."""

    text: str
    parts: list[str]
    # Functions that were internal and are external in the parts, for the calls
    # between parts; internal again once the parts' IR is linked (`engine.link_parts`).
    exported: frozenset[str] = frozenset()
    # Whether the last part holds the functions set apart (`split_module`'s `apart`).
    apart: bool = False


def split_module(module: ir.Module, entry_name: str, parts: int,
                 min_bytes: int = 0, printed: dict[str, str] | None = None,
                 apart: Collection[str] = ()) -> SplitModule:
    """`module`'s text, and the same cut into at most `parts` modules. It is not cut
    when `parts` < 2, when its text is shorter than `min_bytes`, when it has a single
    unit, when one part would hold most of it (`MAX_LARGEST_SHARE`), or when one of
    its global variables is not an internal constant (it would need one definition
    and declarations). `printed`: globals' texts already printed (not changed since).

    `apart`: functions (other than the entry) defined in a part of their own, the last,
    added to the cut above (or to the whole module when it is not cut); `apart` in the
    result says whether that was done (not when none is defined, nor when a global
    variable keeps the module whole)."""
    functions = {f.name: f for f in module.functions if not f.is_declaration}
    printed = printed or {}
    texts = {name: printed.get(name) or str(value) for name, value in module.globals.items()}
    header = [f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
              f'target datalayout = "{module.data_layout}"', ""]
    types = [t.get_declaration() for t in module.get_identified_types().values()]
    # Metadata (branch weights) as `llvmlite.ir.Module` prints it; unused nodes are harmless.
    metadata = [f"!{key} = !{{ {', '.join(o.get_reference() for o in value.operands)} }}"
                for key, value in module.namedmetadata.items()]
    metadata += [str(node) for node in module.metadata]
    whole = "\n".join(header + types + list(texts.values()) + metadata)
    variables = [g for g in module.globals.values() if isinstance(g, ir.GlobalVariable)]
    set_apart = sorted(n for n in apart if n in functions and n != entry_name)
    if entry_name not in functions or any(g.linkage not in ("internal", "private")
                                          for g in variables):
        return SplitModule(whole, [whole])
    cut = parts >= 2 and len(whole) >= min_bytes
    if not cut and not set_apart:
        return SplitModule(whole, [whole])
    references = {name: _names(_GLOBAL_REFERENCE, texts[name], module.globals)
                  for name in functions}
    rest = {name: f for name, f in functions.items() if name not in set_apart}
    taken = set().union(*(_names(_ADDRESS_TAKEN, texts[n], rest) for n in rest))
    units = _units(entry_name, rest, references, taken - {entry_name})
    bins = _packed(units, parts, texts, 0) if cut and len(units) >= 2 else None
    if bins is not None:
        bins = _packed(units, parts, texts, UNIT_BYTES) or bins
    if bins is None:
        if not set_apart:
            return SplitModule(whole, [whole])
        bins = [[name for unit in units for name in unit]]
    if set_apart:
        bins.append(set_apart)
    owner = {name: number for number, names in enumerate(bins) for name in names}
    exported = {name for caller, called in references.items() for name in called
                if name in functions and owner[name] != owner[caller]}
    body = header + types
    return SplitModule(whole, [
        "\n".join(body + _part_lines(module, set(names), texts, references, exported)
                  + metadata) for names in bins], frozenset(exported), bool(set_apart))


def _packed(units: list[list[str]], parts: int, texts: dict[str, str],
            unit_bytes: int) -> list[list[str]] | None:
    """`units` packed into at most `parts` bins by IR size plus `unit_bytes` each,
    largest first, each into the smallest bin so far; None when one bin would hold
    most of that (`MAX_LARGEST_SHARE`). Whether to cut is decided by size alone (the
    caller packs with 0 first), how to cut with `UNIT_BYTES`."""
    bins: list[list[str]] = [[] for _ in range(min(parts, len(units)))]
    sizes = [0] * len(bins)
    for unit in sorted(units, key=lambda u: -sum(len(texts[n]) for n in u)):
        smallest = sizes.index(min(sizes))
        bins[smallest] += unit
        sizes[smallest] += sum(len(texts[n]) for n in unit) + unit_bytes
    if max(sizes) > MAX_LARGEST_SHARE * sum(sizes):
        return None
    return bins


def _names(pattern: re.Pattern[str], text: str, known: Collection[str]) -> set[str]:
    """The names among `known` that `pattern` finds in IR text `text`."""
    return {quoted or bare for quoted, bare in pattern.findall(text)} & set(known)


def _units(entry_name: str, functions: dict[str, ir.Function],
           references: dict[str, set[str]], roots: set[str]) -> list[list[str]]:
    """Every defined function in one unit: each root (a task) with the functions it
    reaches that no earlier root reached, then `entry` with all the rest."""
    owned: set[str] = set()
    units = []
    for root in (name for name in functions if name in roots):
        if root in owned:
            continue
        unit = [root]
        owned.add(root)
        for name in unit:  # grows as it goes: a breadth-first walk
            for called in sorted(references[name]):
                if called in functions and called != entry_name and called not in owned:
                    owned.add(called)
                    unit.append(called)
        units.append(unit)
    units.append([entry_name] + [n for n in functions if n != entry_name and n not in owned])
    return units


def _part_lines(module: ir.Module, defined: set[str], texts: dict[str, str],
                references: dict[str, set[str]], exported: set[str]) -> list[str]:
    """The globals of a part defining `defined`: those functions (external when another
    part calls them), declarations of the other functions they name, and copies of the
    constants they read."""
    needed = set().union(*(references[n] for n in defined))
    scratch = ir.Module(name="declarations")
    lines = []
    for name, value in module.globals.items():
        if isinstance(value, ir.Function) and not value.is_declaration:
            if name in defined:
                text = texts[name]
                if name in exported:
                    text = text.replace("define internal ", "define ", 1)
                lines.append(text)
            elif name in needed:
                lines.append(str(ir.Function(scratch, value.ftype, name=name)))
        elif name in needed:  # a declared function, a constant
            lines.append(texts[name])
    return lines


__all__ = ["SplitModule", "split_module"]
