"""Builds the TfxlaLiteLaunch op library (launch_op.cc) against the running TensorFlow.

Where it sits: `loader.load_ops()` calls `build_op_library()` on first use; the README's
set-up step runs `python -m tfxla_lite.runtime.build` to pay the ~10 s compile up front.

The library must be compiled against the very TensorFlow that loads it (C++ ABI), so it
is built here, not at pip install time (pip's isolated build environment may hold another
TF). It lands in a cache folder keyed by the TF version and a hash of everything that goes
into the build (source, compiler, flags):

    $TFXLA_LITE_CACHE_DIR/ops/<tf version>-<hash>/tfxla_lite_ops.so
    (TFXLA_LITE_CACHE_DIR defaults to $XDG_CACHE_HOME/tfxla_lite, else ~/.cache/tfxla_lite)

Concurrent builders are safe: a file lock lets one process compile while the others wait,
and the compiler writes to a private temporary name that is renamed into place, so a
reader never sees a half-written library.

A cached library is loaded only after it passes a check: the build records its size and
SHA-256 in a build-complete marker (`tfxla_lite_ops.so.complete`), written after the
library's rename, and `build_op_library` compares the file against it. A truncated,
garbled or emptied library (or one without a marker: an interrupted build, a cache from
before the marker existed) is rebuilt, never handed to `dlopen`, where it would kill
the process (SIGBUS, SIGSEGV) or load without the op.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tfxla_lite.cache_dir import cache_root

try:
    import fcntl
except ImportError:  # pragma: no cover - no flock on this platform; the rename still protects
    fcntl = None

LIBRARY_NAME = "tfxla_lite_ops.so"
# Next to the library: {"size": bytes, "sha256": hex digest} of what the build wrote.
MARKER_SUFFIX = ".complete"
SOURCE_PATH = Path(__file__).with_name("launch_op.cc")
# The TF headers raise hundreds of deprecation warnings that say nothing about our code.
_QUIET_FLAGS = ("-Wno-deprecated-declarations", "-Wno-interference-size")


logger = logging.getLogger("tfxla_lite")


class BuildError(RuntimeError):
    """The C++ compiler failed; the message holds its command line and stderr."""


@dataclass(frozen=True)
class BuildConfig:
    """Everything a build depends on; its `digest` names the cache folder."""

    source: Path
    compiler: str
    tf_version: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]

    @property
    def digest(self) -> str:
        hasher = hashlib.sha256()
        hasher.update(self.source.read_bytes())
        for part in (self.compiler, self.tf_version, *self.compile_flags, *self.link_flags):
            hasher.update(b"\0" + part.encode())
        return hasher.hexdigest()[:16]

    def command(self, output: Path) -> list[str]:
        return [
            *shlex.split(self.compiler),
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-O2",
            *_QUIET_FLAGS,
            str(self.source),
            "-o",
            str(output),
            *self.compile_flags,
            *self.link_flags,
        ]


def default_config(source: Path | None = None) -> BuildConfig:
    """The build for the TensorFlow imported in this process; CXX overrides g++."""
    import tensorflow as tf

    return BuildConfig(
        source=Path(source) if source is not None else SOURCE_PATH,
        compiler=os.environ.get("CXX", "g++"),
        tf_version=tf.__version__,
        compile_flags=tuple(tf.sysconfig.get_compile_flags()),
        link_flags=tuple(tf.sysconfig.get_link_flags()),
    )


def library_path(config: BuildConfig | None = None) -> Path:
    """Where the library for `config` is (or will be) cached."""
    config = config or default_config()
    return cache_root() / "ops" / f"{config.tf_version}-{config.digest}" / LIBRARY_NAME


def marker_path(library: Path) -> Path:
    """The build-complete marker of the library at `library`."""
    return library.with_name(library.name + MARKER_SUFFIX)


def library_problem(library: Path) -> str | None:
    """Why the library at `library` must not be loaded, or None when it matches the size
    and SHA-256 its build recorded. Reads the whole file (a few hundred KB), once per
    process: a damaged library is found before `dlopen`, not by a crash."""
    if not library.is_file():
        return "it is not built"
    try:
        record = json.loads(marker_path(library).read_text())
        size, digest = record["size"], record["sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return "it has no valid build-complete marker (an interrupted or older build)"
    try:
        data = library.read_bytes()
    except OSError as error:
        return f"it cannot be read ({error})"
    if len(data) != size:
        return f"it is {len(data)} bytes where its build wrote {size}"
    if hashlib.sha256(data).hexdigest() != digest:
        return "its SHA-256 differs from what its build wrote"
    return None


def build_op_library(config: BuildConfig | None = None, *, force: bool = False) -> Path:
    """Returns the path of the compiled op library, compiling it only when no cached
    library passes `library_problem`'s check; the path returned has passed it."""
    config = config or default_config()
    target = library_path(config)
    if not force and library_problem(target) is None:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.with_suffix(".lock")):
        # Another process may have finished the build while this one waited for the lock.
        problem = library_problem(target)
        if problem is None and not force:
            return target
        if target.exists() and problem is not None:
            logger.warning("tfxla-lite: the cached op library %s failed its check (%s); "
                           "rebuilding it", target, problem)
        _build(config, target)
    problem = library_problem(target)
    if problem is not None:  # changed under us after the build: never load it
        raise BuildError(f"the op library {target} failed its check right after its "
                         f"build ({problem})")
    return target


def _build(config: BuildConfig, target: Path) -> None:
    """Compile into a private name, then rename it over `target` and write its marker.
    The old marker goes first, so that no reader ever pairs it with the new file; between
    the rename and the new marker a reader sees no marker and waits for the lock."""
    fd, temporary_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    os.close(fd)
    temporary = Path(temporary_name)
    marker = marker_path(target)
    try:
        _compile(config, temporary)
        # mkstemp made the file private; the cached library is for every user of the cache.
        temporary.chmod(0o755)
        data = temporary.read_bytes()
        record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        marker.unlink(missing_ok=True)
        os.replace(temporary, target)
        _write_atomically(marker, json.dumps(record))
    finally:
        temporary.unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    fd, temporary_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                          dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary_name, 0o644)
        os.replace(temporary_name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary_name)


def _compile(config: BuildConfig, output: Path) -> None:
    """Run the compiler, writing the library to `output`; raises BuildError."""
    command = config.command(output)
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError as error:
        raise BuildError(
            f"no C++ compiler {config.compiler!r} (set CXX to one): {error}"
        ) from error
    if result.returncode != 0:
        raise BuildError(
            f"building the TfxlaLiteLaunch op library failed (exit {result.returncode}).\n"
            f"command: {shlex.join(command)}\n{result.stderr.strip()}"
        )


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def main(argv: list[str] | None = None) -> int:
    """`python -m tfxla_lite.runtime.build [--force]`: builds and prints the library path."""
    args = sys.argv[1:] if argv is None else argv
    force = "--force" in args
    try:
        path = build_op_library(force=force)
    except BuildError as error:
        print(error, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
