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
import hashlib, json
from tfxla_lite import rewrite_cache
environment = json.dumps(rewrite_cache.environment(), sort_keys=True).encode()
print("OK", hashlib.sha256(environment).hexdigest())
"""


def _damage(path: Path, mode: str, other: bytes | None) -> None:
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
        path.write_bytes(other if other is not None else b"\x00" * 16)


def _run(root: Path) -> str:
    """Run `_PROGRAM` in a new process on the cache folder `root`; the digest of the
    environment its entries were checked against (sources, versions, host)."""
    env = dict(os.environ, TFXLA_LITE_CACHE_DIR=str(root))
    env.pop("TFXLA_LITE_CACHE", None)
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
    return done.stdout.split("OK", 1)[1].split()[0]


@pytest.mark.slow
def test_every_entry_kind_damaged_is_recomputed_and_rewritten(cache_root: Path) -> None:
    ops = Path.home() / ".cache" / "tfxla_lite" / "ops"
    if ops.is_dir() and not (cache_root / "ops").exists():
        # The op library of the usual folder: a private one would be rebuilt (minutes).
        (cache_root / "ops").symlink_to(ops)
    environment = _run(cache_root)
    for mode in ("truncate", "garble", "empty", "foreign"):
        damaged: dict[Path, bytes] = {}
        for kind in _KINDS:
            entries = sorted(p for p in (cache_root / kind).rglob("*") if p.is_file())
            assert entries, f"no {kind} entry was written"
            # Foreign bytes come from the entries as they were, so that each entry gets
            # another's whole, valid entry (never its own back, after a rotation).
            originals = [entry.read_bytes() for entry in entries]
            for k, entry in enumerate(entries):
                _damage(entry, mode, originals[k - 1] if len(entries) > 1 else None)
                assert entry.read_bytes() != originals[k], f"{mode} left {entry} as it was"
                damaged[entry] = entry.read_bytes()
        if _run(cache_root) != environment:
            # Entries are filed under their environment: after a source edit the new
            # process writes new files beside the damaged ones, and nothing can be judged.
            pytest.skip("tfxla-lite's sources changed while the test ran")
        kept = [str(p.relative_to(cache_root)) for p, data in damaged.items()
                if p.exists() and p.read_bytes() == data]
        assert not kept, f"{mode}: damaged entries left as they were: {kept}"
