"""The HLO parser under byte and line mutations of printed modules: it parses or raises
`ParseError`, nothing else, and never hangs. tests/hlo/test_parser.py fuzzes token-level
edits of hand-written texts; these start from what the printer writes for real lowered
TF graphs and damage them as a file is damaged (bytes, whole lines)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfxla_lite.clustering import cluster_graph, lower_cluster
from tfxla_lite.hlo.parser import ParseError, parse_module
from tfxla_lite.hlo.printer import module_to_text


def _printed(fn, *specs: tf.TensorSpec) -> list[str]:
    graph = tf.function(fn).get_concrete_function(*specs).graph
    return [module_to_text(lower_cluster(graph, cluster), print_large_constants=True)
            for cluster in cluster_graph(graph, min_cluster_size=1).clusters]


def _corpus() -> list[str]:
    f32 = tf.float32
    texts = _printed(lambda x, w: tf.nn.softmax(tf.matmul(x, w) + 1.0),
                     tf.TensorSpec([4, 8], f32), tf.TensorSpec([8, 3], f32))
    texts += _printed(lambda x: tf.reduce_max(tf.cumsum(tf.abs(x), axis=1), axis=0)
                      * tf.cast(tf.argmax(x, axis=1), f32)[0], tf.TensorSpec([3, 5], f32))
    texts += _printed(lambda x, i: tf.gather(tf.transpose(x), i)[::-1, 1:],
                      tf.TensorSpec([4, 6], f32), tf.TensorSpec([3], tf.int32))
    return texts


_CORPUS = _corpus()


@st.composite
def _damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_CORPUS)).encode())
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("byte", "flip", "line-drop", "line-dup", "line-swap",
                                     "truncate")))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "byte" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        else:
            lines = bytes(data).split(b"\n")
            n, m = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            if kind == "line-drop":
                del lines[n]
            elif kind == "line-dup":
                lines.insert(m, lines[n])
            else:
                lines[n], lines[m] = lines[m], lines[n]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(_damaged())
def test_damaged_printed_modules_parse_or_raise_parse_error(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        module = parse_module(text, fill_elided_constants=True)
    except ParseError:
        return
    # What parses prints and parses again.
    parse_module(module_to_text(module, print_large_constants=True))


def test_the_corpus_parses() -> None:
    """The mutations start from texts the parser accepts (else only ParseError is seen)."""
    assert len(_CORPUS) >= 3
    for text in _CORPUS:
        assert np.asarray(parse_module(text).entry.instructions).size
