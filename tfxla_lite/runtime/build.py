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
"""

from __future__ import annotations

import contextlib
import hashlib
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
SOURCE_PATH = Path(__file__).with_name("launch_op.cc")
# The TF headers raise hundreds of deprecation warnings that say nothing about our code.
_QUIET_FLAGS = ("-Wno-deprecated-declarations", "-Wno-interference-size")


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


def build_op_library(config: BuildConfig | None = None, *, force: bool = False) -> Path:
    """Returns the path of the compiled op library, compiling it only when not cached."""
    config = config or default_config()
    target = library_path(config)
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.with_suffix(".lock")):
        # Another process may have finished the build while this one waited for the lock.
        if target.exists() and not force:
            return target
        _compile(config, target)
    return target


def _compile(config: BuildConfig, target: Path) -> None:
    fd, temporary_name = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    os.close(fd)
    temporary = Path(temporary_name)
    command = config.command(temporary)
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(
                f"building the TfxlaLiteLaunch op library failed (exit {result.returncode}).\n"
                f"command: {shlex.join(command)}\n{result.stderr.strip()}"
            )
        # mkstemp made the file private; the cached library is for every user of the cache.
        temporary.chmod(0o755)
        os.replace(temporary, target)
    except FileNotFoundError as error:
        raise BuildError(
            f"no C++ compiler {config.compiler!r} (set CXX to one): {error}"
        ) from error
    finally:
        temporary.unlink(missing_ok=True)


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
