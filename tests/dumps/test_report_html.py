"""report.html: the layered layout, the page's contents, and the page in headless
Chromium (scripts run without errors, the screenshot is not blank), for a
`tfxla_lite.function` with `dump_to` and for an unmodified script under
`TFXLA_LITE_FLAGS`. The browser tests skip when no Chromium is installed
(scripts/test.sh installs Debian's `chromium` when it runs as root with apt-get).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tfxla_lite as tl
from tfxla_lite.report_html.layout import layered_layout

SCRIPTS = Path(__file__).parents[1] / "flags" / "scripts"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser",
                                                  "google-chrome") if shutil.which(name)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: apt-get install chromium (scripts/test.sh does it "
                             "when run as root)")
WINDOW = (1400, 1000)


def small(x, y):  # noqa: ANN001, ANN201
    a = tf.nn.relu(x @ y + 1.0)
    # exp(a) @ y^T is a temp of the arena, so the page draws a buffer timeline.
    b = tf.exp(a) @ tf.transpose(y)
    return tf.reduce_sum(b * 0.5, axis=1), tf.strings.as_string(a)


# -- layout ----------------------------------------------------------------------------
def test_layers_follow_edges_and_cycles_are_broken() -> None:
    nodes = ["a", "b", "c", "d", "e"]
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("d", "b"), ("e", "e")]
    placement = layered_layout(nodes, edges)
    assert placement["a"].layer == 0 and placement["e"].layer == 0
    assert placement["a"].layer < placement["b"].layer < placement["c"].layer
    assert placement["c"].layer < placement["d"].layer
    for layer in {p.layer for p in placement.values()}:
        positions = sorted(p.position for p in placement.values() if p.layer == layer)
        assert positions == list(range(len(positions)))


# -- the page --------------------------------------------------------------------------
def _dump_small(directory: Path) -> None:
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    y = np.linspace(1, -1, 18, dtype=np.float32).reshape(6, 3)
    f = tl.function(small, options=tl.Options(dump_to=str(directory), min_cluster_size=1))
    f(x, y)


def test_page_is_self_contained_and_shows_every_part(tmp_path: Path) -> None:
    _dump_small(tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert page.count("<svg") == 3  # TF graph, fusion graph, buffer timeline
    assert 'class="node tf clustered"' in page and 'class="node tf fallback"' in page
    assert "op type AsString has no lowering" in page  # the reason, on hover and in legend
    assert "test_report_html.py:" in page  # source lines
    for part in ("compile", "flops", "transcendentals", "bytes accessed", "saved by reuse",
                 "before optimizations", "after optimizations"):
        assert part in page, part


# -- headless Chromium -----------------------------------------------------------------
def _chromium(page: Path, profile: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
               "--enable-logging=stderr", "--v=0", *arguments, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          check=False)


def _png_summary(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the filtered scanlines) of an 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunk = data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        offset += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    channels = {2: 3, 6: 4, 0: 1, 4: 2}[color]
    pixels = zlib.decompress(idat)
    assert depth == 8 and len(pixels) == height * (1 + width * channels)
    return width, height, len(set(pixels))


def _check_in_browser(directory: Path, tmp_path: Path, name: str) -> None:
    page = directory / "report.html"
    dom = _chromium(page, tmp_path / f"profile-{name}", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    errors = [line for line in dom.stderr.splitlines()
              if "Uncaught" in line or ("CONSOLE" in line and "rror" in line)]
    assert not errors, errors
    assert not re.search(r'<html[^>]*data-report-error=', dom.stdout), dom.stdout[:500]
    ready = re.search(r'data-report-ready="(\d+)"', dom.stdout)
    assert ready and int(ready.group(1)) >= 1, dom.stdout[-2000:]  # a TF graph was drawn

    screenshot = tmp_path / f"{name}.png"
    shot = _chromium(page, tmp_path / f"profile-{name}",
                     f"--screenshot={screenshot}", "--window-size={},{}".format(*WINDOW))
    assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-3000:]
    width, height, distinct = _png_summary(screenshot)
    assert (width, height) == WINDOW
    assert distinct > 40 and screenshot.stat().st_size > 20_000  # not a blank page


@needs_chromium
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    _dump_small(tmp_path / "dump")
    _check_in_browser(tmp_path / "dump", tmp_path, "function")


@needs_chromium
def test_zero_code_script_writes_dumps_and_report(tmp_path: Path) -> None:
    directory = tmp_path / "dump"
    environment = {k: v for k, v in os.environ.items() if k != "TFXLA_LITE_FLAGS"}
    environment["TF_CPP_MIN_LOG_LEVEL"] = "2"
    environment["TFXLA_LITE_FLAGS"] = f"--auto_jit=2 --min_cluster_size=1 --dump_to={directory}"
    result = subprocess.run([sys.executable, str(SCRIPTS / "variable_step.py")],
                            capture_output=True, text=True, env=environment, timeout=240,
                            cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    names = sorted(p.name for p in directory.iterdir())
    assert any(n.endswith(".before_optimizations.txt") and "step" in n for n in names), names
    assert any(n.endswith(".ir-with-opt.ll") for n in names)
    assert any(n.endswith(".clustering.json") and "step" in n for n in names), names
    assert any(n.endswith(".after_marking.pbtxt") for n in names)
    assert "cannot write dumps" not in result.stderr
    page = (directory / "report.html").read_text()
    assert "variable_step.py:" in page and "step" in page
    _check_in_browser(directory, tmp_path, "zero_code")
