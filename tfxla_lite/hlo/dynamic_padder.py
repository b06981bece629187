"""Bounded dynamic dimensions (`f32[<=8]`): what the evaluator and compiled code support.

Where it sits: in the HLO core, beside the evaluator (which asks `check_evaluable` before
running an instruction with a dynamic shape) and before the pass pipeline (`pad_dynamic`
makes a module static for the backends, as XLA's `dynamic_padder.cc` does).

XLA's semantics: a dynamic dimension has a bound, which sizes the buffer, and a size
at run time, set by `set-dimension-size` and read by `get-dimension-size`. Elements
past the size are padding: elementwise ops compute them and nobody reads them; a
reduction over a dynamic dimension folds the first `size` elements only (XLA's padder
sets the padding to the init value first); a broadcast takes its operand's dynamic
dimensions along. Anything else over a dynamic dimension (reshape, transpose, slice,
dot, ...) is refused here with a "not supported" error naming
the instruction, rather than computed over the padding.

`pad_dynamic` rewrites the entry computation in place: each dynamic dimension's size
becomes an s32 value (the `set-dimension-size` operand, as XLA keeps it: not clamped),
`set-dimension-size` becomes its operand, `get-dimension-size` of a dynamic dimension
that value, reductions mask their padding, and every shape becomes static. A result
with a dynamic dimension needs its sizes beside it: with `sizes_as_outputs` they are
appended to the entry's results and `DynamicResults.unpad` cuts the compiled outputs
to size; without, such a module is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tfxla_lite.hlo.ir import Computation, HloModule, Instruction
from tfxla_lite.hlo.opcodes import ELEMENTWISE_CATEGORIES, OPCODES
from tfxla_lite.hlo.shape import Shape

# Opcodes that pass values (and their dynamic sizes) through unchanged.
_PASS_THROUGH = frozenset({"tuple", "get-tuple-element", "opt-barrier"})
# What the evaluator and the padder compute over a dynamic dimension.
DYNAMIC_OPCODES = frozenset({"parameter", "reduce", "broadcast", "get-dimension-size",
                             "set-dimension-size"}) | _PASS_THROUGH


class DynamicShapeError(NotImplementedError):
    """An instruction over a dynamic dimension that is not supported."""


def _supported(opcode: str) -> bool:
    info = OPCODES.get(opcode)
    return opcode in DYNAMIC_OPCODES or (info is not None
                                         and info.category in ELEMENTWISE_CATEGORIES)


def _unsupported(inst: Instruction, why: str = "") -> DynamicShapeError:
    return DynamicShapeError(f"not supported: {inst.opcode} over a dynamic dimension "
                             f"(%{inst.name}{': ' + why if why else ''})")


def check_evaluable(inst: Instruction, operands: Sequence[Any]) -> list[Any]:
    """The operands the evaluator's reference of `inst` takes, or an error for what it
    cannot compute with XLA's semantics: an opcode other than the supported ones with a
    dynamic operand or result, or elementwise operands whose dynamic sizes differ (XLA
    leaves that undefined). An elementwise op reads its operands at the result's
    indices, as XLA's evaluator does: a static operand is cut to the dynamic size."""
    if not _supported(inst.opcode):
        raise _unsupported(inst)
    if OPCODES[inst.opcode].category not in ELEMENTWISE_CATEGORIES:
        return list(operands)
    sizes: dict[int, set[int]] = {}
    for operand, value in zip(inst.operands, operands, strict=True):
        for dim in range(np.ndim(value)):
            if operand.shape.is_dynamic_dimension(dim):
                sizes.setdefault(dim, set()).add(np.shape(value)[dim])
    if any(len(found) > 1 for found in sizes.values()):
        raise ValueError(f"%{inst.name}: operands of dynamic sizes "
                         f"{sorted(tuple(np.shape(v)) for v in operands)} differ")
    cut = tuple(slice(0, min(sizes[d])) if d in sizes else slice(None)
                for d in range(inst.shape.rank if not inst.shape.is_tuple else 0))
    return [np.asarray(v)[cut] if np.ndim(v) else v for v in operands]


def has_dynamic_shapes(module: HloModule) -> bool:
    return any(inst.shape.is_dynamic for comp in module.computations
               for inst in comp.instructions)


@dataclass(frozen=True)
class DynamicResults:
    """Which appended results hold the sizes of the entry's dynamic result dimensions.

    `leaves` is the number of the original results (tuple leaves, in order); `sizes`
    maps (leaf, dimension) to the position of its size among the compiled outputs, and
    `bounds` (leaf, dimension) to the bound."""

    leaves: int
    sizes: dict[tuple[int, int], int]
    bounds: dict[tuple[int, int], int]

    def unpad(self, outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The original results, each dynamic dimension cut to its size (clamped to
        [0, bound]: the buffer holds no more)."""
        results = [np.asarray(o) for o in outputs[:self.leaves]]
        for (leaf, dim), position in self.sizes.items():
            size = min(max(int(np.asarray(outputs[position])), 0), self.bounds[leaf, dim])
            index = (slice(None),) * dim + (slice(0, size),)
            results[leaf] = results[leaf][index]
        return results


# The size values of one instruction: (tuple index, dimension) -> s32 scalar instruction.
_Sizes = dict[tuple[tuple[int, ...], int], Instruction]


def pad_dynamic(module: HloModule, sizes_as_outputs: bool = False) -> DynamicResults | None:
    """Make `module` static in place with XLA's semantics (see the module docstring).
    Returns None when it had no dynamic shape (the module is untouched), else where the
    result sizes went (empty when the results are static)."""
    if not has_dynamic_shapes(module):
        return None
    entry = module.entry
    assert entry is not None
    for comp in module.computations:
        if comp is not entry and any(i.shape.is_dynamic for i in comp.instructions):
            inst = next(i for i in comp.instructions if i.shape.is_dynamic)
            raise _unsupported(inst, f"in called computation %{comp.name}")
    original_root = entry.root
    assert original_root is not None
    sizes: dict[int, _Sizes] = {}
    # (instruction, its replacement): applied last, so that sizes stay keyed by the
    # instructions the users name.
    replaced: list[tuple[Instruction, Instruction]] = []
    for inst in list(entry.instructions):
        if not inst.shape.is_dynamic and not any(o.shape.is_dynamic for o in inst.operands):
            continue
        sizes[id(inst)] = _rewrite(entry, inst, sizes, replaced)
    results = _results(entry, original_root.shape, sizes.get(id(original_root), {}),
                       sizes_as_outputs)
    for inst, new in reversed(replaced):  # last first: a replacement may be replaced
        inst.replace_all_uses_with(new)
        entry.remove(inst)
    for inst in entry.instructions:
        inst.shape = inst.shape.static()
    entry.sort()
    return results


def _rewrite(comp: Computation, inst: Instruction, sizes: dict[int, _Sizes],
             replaced: list[tuple[Instruction, Instruction]]) -> _Sizes:
    """The size values of `inst`'s dynamic dimensions, rewriting `inst` where its
    compiled form differs from its static one."""
    def of(operand: Instruction) -> _Sizes:
        return sizes.get(id(operand), {})

    opcode = inst.opcode
    if opcode == "parameter":
        raise _unsupported(inst, "an entry parameter's size does not come with its arguments")
    if opcode == "set-dimension-size":
        (dim,) = inst.dimensions
        if not inst.shape.is_dynamic_dimension(dim):  # printed static: `n` unread
            if inst.operand(0).shape.is_dynamic_dimension(dim):
                raise _unsupported(inst, "making a dynamic dimension static")
            replaced.append((inst, inst.operand(0)))
            return dict(of(inst.operand(0)))
        size = inst.operand(1)
        if size.shape.element_type != "s32":
            size = comp.create("convert", [size], shape=Shape("s32", ()))
        found = {key: value for key, value in of(inst.operand(0)).items() if key[1] != dim}
        found[(), dim] = size
        replaced.append((inst, inst.operand(0)))
        return found
    if opcode == "get-dimension-size":
        (dim,) = inst.dimensions
        if inst.operand(0).shape.is_dynamic_dimension(dim):
            replaced.append((inst, _size(of(inst.operand(0)), (), dim, inst)))
        return {}
    if opcode == "tuple":
        return {((i, *index), dim): value for i, operand in enumerate(inst.operands)
                for (index, dim), value in of(operand).items()}
    if opcode == "get-tuple-element":
        n = int(inst.attributes["index"])
        return {(index[1:], dim): value for (index, dim), value in of(inst.operand(0)).items()
                if index and index[0] == n}
    if opcode == "opt-barrier":
        return dict(of(inst.operand(0)))
    if opcode == "reduce":
        return _reduce(comp, inst, of)
    if opcode == "broadcast":  # the operand's padding broadcasts into the result's
        return {((), inst.dimensions[i]): value
                for ((_, i), value) in of(inst.operand(0)).items()}
    if not _supported(opcode):
        raise _unsupported(inst)
    # Elementwise: each dynamic dimension's size from the first operand that has it.
    found: _Sizes = {}
    for dim in range(inst.shape.rank):
        if inst.shape.is_dynamic_dimension(dim):
            for operand in inst.operands:
                if ((), dim) in of(operand):
                    found[(), dim] = of(operand)[(), dim]
                    break
    return found


def _reduce(comp: Computation, inst: Instruction, of: Any) -> _Sizes:
    """Pad each input's dynamic reduced dimensions with its init value, as XLA's padder
    does: select(iota < size, x, init)."""
    n = len(inst.operands) // 2
    reduced = set(inst.dimensions)
    sources = [of(inst.operand(i)) for i in range(n)]
    for i, source in enumerate(sources):
        x, init = inst.operand(i), inst.operand(n + i)
        static = x.shape.static()
        masked = x
        for dim in sorted(d for d in reduced if ((), d) in source):
            iota = comp.create("iota", shape=static.with_element_type("s32"), iota_dimension=dim)
            bound = comp.create("broadcast", [source[(), dim]], shape=iota.shape, dimensions=())
            inside = comp.create("compare", [iota, bound], shape=static.with_element_type("pred"),
                                 direction="LT")
            fill = comp.create("broadcast", [init], shape=static, dimensions=())
            masked = comp.create("select", [inside, masked, fill], shape=static)
        if masked is not x:
            inst.replace_operand(i, masked)
    kept = [d for d in range(inst.operand(0).shape.rank) if d not in reduced]
    found: _Sizes = {}
    for position, dim in enumerate(kept):
        for source in sources:
            if ((), dim) in source:
                found[(), position] = source[(), dim]
                break
    if inst.shape.is_tuple:
        return {((i,), dim): value for i in range(n) for (_, dim), value in found.items()}
    return found


def _size(found: _Sizes, path: tuple[int, ...], dim: int, inst: Instruction) -> Instruction:
    try:
        return found[path, dim]
    except KeyError:
        raise _unsupported(inst, f"no size known for dimension {dim}") from None


def _results(comp: Computation, shape: Shape, found: _Sizes,
             sizes_as_outputs: bool) -> DynamicResults:
    """Append the sizes of the root's dynamic dimensions (of the original root's
    `shape`; the root now is its static replacement) to the entry's results."""
    root = comp.root
    assert root is not None
    paths = _leaf_paths(shape)
    if not shape.is_dynamic:
        return DynamicResults(len(paths), {}, {})
    if not sizes_as_outputs:
        raise DynamicShapeError(f"not supported: the entry's result %{root.name} has a "
                                f"dynamic dimension ({shape})")
    leaves = [root] if not shape.is_tuple else [_element(comp, root, path) for path in paths]
    positions: dict[tuple[int, int], int] = {}
    bounds: dict[tuple[int, int], int] = {}
    extra: list[Instruction] = []
    for leaf, path in enumerate(paths):
        leaf_shape = _shape_at(shape, path)
        for dim in range(leaf_shape.rank):
            if leaf_shape.is_dynamic_dimension(dim):
                positions[leaf, dim] = len(paths) + len(extra)
                bounds[leaf, dim] = leaf_shape.dims[dim]
                extra.append(_size(found, path, dim, root))
    tuple_root = comp.create("tuple", leaves + extra, shape=Shape.tuple_of(
        [leaf.shape.static() for leaf in leaves] + [e.shape for e in extra]))
    comp.root = tuple_root
    return DynamicResults(len(paths), positions, bounds)


def _leaf_paths(shape: Shape, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    if not shape.is_tuple:
        return [prefix]
    return [p for i, s in enumerate(shape.tuple_shapes or ()) for p in _leaf_paths(s, (*prefix, i))]


def _shape_at(shape: Shape, path: tuple[int, ...]) -> Shape:
    for i in path:
        shape = (shape.tuple_shapes or ())[i]
    return shape


def _element(comp: Computation, root: Instruction, path: tuple[int, ...]) -> Instruction:
    value = root
    for i in path:
        value = comp.create("get-tuple-element", [value],
                            shape=(value.shape.tuple_shapes or ())[i], index=i)
    return value
