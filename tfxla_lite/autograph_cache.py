"""AutoGraph's conversions kept on disk, so that a warm process does not convert again.

AutoGraph's conversion costs tens of ms per function and TF keeps it only in the
process. While tfxla-lite traces (`conversions_cached`), AutoGraph's transpiler looks
here first; a hit loads the stored generated source as AutoGraph's loader does and puts
its factory into TF's in-process cache. It uses TF's private AutoGraph internals: where
this TF lacks one the cache stays off (`AVAILABLE`), and any failure of its own steps
hands the conversion back to TF unchanged. Key, what is never cached and why, trust:
docs/benchmarks.md, "The compile caches".
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tensorflow as tf

from tfxla_lite import flags
from tfxla_lite.codegen import cache as stage_cache

try:  # TF's private AutoGraph modules: another TF may lay them out otherwise
    from tensorflow.python.autograph.impl import api as ag_api
    from tensorflow.python.autograph.lang import directives
    from tensorflow.python.autograph.pyct import inspect_utils, loader, origin_info, transpiler

    # Read by value (module docstring): AutoGraph's `converters/directives.py`.
    _DIRECTIVES = (directives.set_loop_options, directives.set_element_type)
    _TRANSPILER_PARTS = ("transform_function", "get_caching_key", "get_extra_locals",
                         "_cache", "_cache_lock")
    AVAILABLE = (all(hasattr(ag_api._TRANSPILER, part) for part in _TRANSPILER_PARTS)
                 and hasattr(transpiler._PythonFnFactory, "instantiate"))
except (ImportError, AttributeError):
    AVAILABLE = False

logger = logging.getLogger("tfxla_lite")
_active = threading.local()
_install_lock = threading.Lock()
_original: Any = None  # the transpiler's own transform_function, once installed


@contextlib.contextmanager
def conversions_cached(enabled: bool = True, cache: str | None = None) -> Iterator[None]:
    """AutoGraph conversions in this block (this thread) read and write the disk cache;
    nothing when `enabled` is False, the disk caches are off (`cache`, the `cache`
    option; None: the process's), the `autograph_cache` option is off, or this TF's
    AutoGraph does not have the internals the cache relies on (`AVAILABLE`)."""
    if (not enabled or not AVAILABLE or not stage_cache.policy(cache).disk
            or not flags.switch("autograph_cache")):
        yield
        return
    _install()
    depth = getattr(_active, "depth", 0)
    _active.depth = depth + 1
    try:
        yield
    finally:
        _active.depth = depth


def _install() -> None:
    """Put `_transform_function` in front of the transpiler's own, once per process.
    Outside `conversions_cached` it only calls through."""
    global _original
    with _install_lock:
        if _original is not None:
            return
        _original = ag_api._TRANSPILER.transform_function
        ag_api._TRANSPILER.transform_function = _transform_function


def _transform_function(fn: Any, user_context: Any) -> Any:
    if getattr(_active, "depth", 0) == 0 or not _cacheable(fn):
        return _original(fn, user_context)
    converter = ag_api._TRANSPILER
    try:
        subkey = converter.get_caching_key(user_context)
        if converter._cache.has(fn, subkey):  # TF's in-process cache: its own fast path
            return _original(fn, user_context)
        key = conversion_key(fn, subkey)
        factory = _load(key, fn)
        if factory is not None:
            with converter._cache_lock:
                if not converter._cache.has(fn, subkey):
                    converter._cache[fn][subkey] = factory
    except Exception as error:  # noqa: BLE001 - no source to read, or TF's internals moved:
        # the conversion goes TF's own way (which reports a missing source itself).
        logger.debug("tfxla-lite: AutoGraph cache skips %s: %s", fn, error)
        return _original(fn, user_context)
    result = _original(fn, user_context)  # a hit: TF's fast path instantiates it
    if factory is None:
        _store(key, converter, fn, subkey)
    return result


def _cacheable(fn: Any) -> bool:
    return inspect.isfunction(fn) and not inspect_utils.islambda(fn)


# -- the key -------------------------------------------------------------------------------

def conversion_key(fn: Any, subkey: Any) -> str:
    """The key of `fn`'s conversion with options `subkey` (a `ConversionOptions`).
    Raises OSError when the source cannot be read, TypeError for an uncacheable one."""
    source = _source(fn)
    namespace = inspect_utils.getnamespace(fn)
    directive_ids = {id(d) for d in _DIRECTIVES}
    names = [d.__name__ for d in _DIRECTIVES] + [
        name for name, value in namespace.items()
        if id(value) in directive_ids and isinstance(name, str)]
    if any(name in source for name in names):
        raise TypeError("uses an AutoGraph directive, which AutoGraph resolves by value")
    code = fn.__code__
    parts = {
        "source": source, "file": code.co_filename, "line": code.co_firstlineno,
        "name": fn.__name__, "code_name": code.co_name, "freevars": list(code.co_freevars),
        "future": list(inspect_utils.getfutureimports(fn)),
        "namespace": sorted(namespace),
        "options": _options_text(subkey),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _source(fn: Any) -> str:
    """`fn`'s source as AutoGraph reads it (`inspect_utils.getimmediatesource`: the
    definition's block, `__wrapped__` ignored), without its walk over every loaded module
    (milliseconds with TF loaded; it only refreshes linecache for `functools.wraps` oddities);
    `linecache.checkcache` still re-reads a file edited since it was read. Given the
    function, not its code object: `inspect.getmodule` then finds the module by
    `__module__` instead of resolving the real path of every loaded module's file
    (hundreds of ms once per process with TF loaded)."""
    lines, first = inspect.findsource(fn)
    return "".join(inspect.getblock(lines[first:]))


def _options_text(options: Any) -> str:
    recursive, user_requested, internal, features = options.as_tuple()
    return json.dumps([bool(recursive), bool(user_requested), bool(internal),
                       sorted(str(f) for f in features)])


def environment() -> dict[str, str]:
    """Everything besides the key that an entry must have been written with."""
    return {"tensorflow": tf.__version__, "python": ".".join(map(str, sys.version_info[:3]))}


STAGE = stage_cache.Stage("autograph", ".tla", "tfxla-lite-autograph-2", environment,
                          "autograph")


def _load(key: str, fn: Any) -> transpiler._PythonFnFactory | None:
    """The factory stored for `key`, loaded, or None (a miss: absent, or not trusted and
    removed)."""
    return STAGE.load_json(key, lambda entry: _factory_from(entry, fn))


def _factory_from(entry: dict[str, Any], fn: Any) -> transpiler._PythonFnFactory:
    """AutoGraph's factory for `fn`, from an entry: what `_PythonFnFactory.create` makes,
    without the AST work (the source is loaded as AutoGraph's `loader.load_ast` does)."""
    name, outer_name, source = entry["name"], entry["outer_factory"], entry["source"]
    if not all(isinstance(v, str) for v in (name, outer_name, source)):
        raise ValueError("name, factory and source must be strings")
    factory = transpiler._PythonFnFactory(name, fn.__code__.co_freevars,
                                          ag_api._TRANSPILER.get_extra_locals())
    module, filename = loader.load_source(source, delete_on_exit=True)
    outer_factory = getattr(module, outer_name)
    factory._unbound_factory = outer_factory()
    factory.module = module
    factory.source_map = {
        origin_info.LineLocation(filename, int(line)): origin_info.OriginInfo(
            origin_info.Location(str(file), int(lineno), int(col)), str(function),
            str(text), None if comment is None else str(comment))
        for line, file, lineno, col, function, text, comment in entry["source_map"]}
    return factory


def _store(key: str, converter: Any, fn: Any, subkey: Any) -> None:
    """Write the conversion of `fn` that `converter` (the transpiler) just made and keeps
    in its cache; anything unexpected (no such entry, a factory not made by `create`) is
    only logged: never the user's conversion's fault."""
    try:
        factory = converter._cache[fn][subkey]
        module = factory.module
        entry = {
            "name": factory._name,
            "outer_factory": factory._unbound_factory.__qualname__.split(".")[0],
            "source": Path(module.__file__).read_text(encoding="utf-8"),
            "source_map": [
                [where.lineno, origin.loc.filename, origin.loc.lineno, origin.loc.col_offset,
                 origin.function_name, origin.source_code_line, origin.comment]
                for where, origin in (factory.source_map or {}).items()],
        }
        if not hasattr(module, entry["outer_factory"]):
            raise ValueError(f"no factory {entry['outer_factory']!r} in the generated module")
    except Exception as error:  # noqa: BLE001 - see the docstring
        logger.debug("tfxla-lite: could not store AutoGraph conversion of %s: %s", fn, error)
        return
    STAGE.store_json(key, entry)
