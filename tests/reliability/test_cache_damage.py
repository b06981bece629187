"""Disk-cache damage, every entry kind at once: a new process computes correct results
and writes each damaged entry again.

The entry kinds under the cache root: `rewrites/` (a trace's whole rewrite), `optimized/`
(optimized HLO and its buffer assignment), `kernels/` (machine code). Each kind's own
checks, in process, are tests/warm_start/test_rewrite_cache.py and
tests/codegen/test_cache.py, test_cache_parts.py; the op library's (`ops/`) is
tests/runtime/test_op_library_damage.py, whose rebuild takes too long to repeat here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_KINDS = ("rewrites", "optimized", "kernels")
_PROGRAM = """
import numpy as np, tensorflow as tf, tfxla_lite as tl
def f(x):
    return tf.reduce_sum(tf.tanh(x) * 2.0 + tf.exp(-x * x), axis=0)
x = tf.constant(np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6))
want = tf.function(f)(x).numpy()
for jit in (None, True):
    got = tl.function(f, jit_compile=jit, min_cluster_size=1)(x).numpy()
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6), (jit, got, want)
print("OK")
"""


def _damage(path: Path, mode: str, other: Path | None) -> None:
    data = path.read_bytes()
    if mode == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif mode == "garble":
        middle = len(data) // 2
        path.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64])
                         + data[middle + 64:])
    elif mode == "empty":
        path.write_bytes(b"")
    else:  # another entry's bytes under this key: a foreign or stale version
        path.write_bytes(other.read_bytes() if other is not None else b"\x00" * 16)


def _run(root: Path) -> None:
    env = dict(os.environ, TFXLA_LITE_CACHE_DIR=str(root))
    env.pop("TFXLA_LITE_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow
def test_every_entry_kind_damaged_is_recomputed_and_rewritten(cache_root: Path) -> None:
    ops = Path.home() / ".cache" / "tfxla_lite" / "ops"
    if ops.is_dir() and not (cache_root / "ops").exists():
        # The op library of the usual folder: a private one would be rebuilt (minutes).
        (cache_root / "ops").symlink_to(ops)
    _run(cache_root)
    for mode in ("truncate", "garble", "empty", "foreign"):
        damaged: dict[Path, bytes] = {}
        for kind in _KINDS:
            entries = sorted(p for p in (cache_root / kind).rglob("*") if p.is_file())
            assert entries, f"no {kind} entry was written"
            for k, entry in enumerate(entries):
                _damage(entry, mode, entries[k - 1] if len(entries) > 1 else None)
                damaged[entry] = entry.read_bytes()
        _run(cache_root)
        # A rewrite entry holding another trace's whole, valid entry is refused (its key
        # does not fit the trace) but left in place: only damaged bytes must be replaced.
        kept = [str(p.relative_to(cache_root)) for p, data in damaged.items()
                if p.exists() and p.read_bytes() == data
                and not (mode == "foreign" and p.parent.name == "rewrites")]
        assert not kept, f"{mode}: damaged entries left as they were: {kept}"
