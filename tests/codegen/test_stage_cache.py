"""The stage cache's mechanism (codegen/cache.py) on its own: one entry format, one
validated read, atomic writes, pruning, and the in-process table with pending keys."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest

from tfxla_lite.codegen import background, cache

ENVIRONMENT = {"tool": "1.0"}


def _stage(environment: dict[str, str] | None = None) -> cache.Stage:
    values = dict(ENVIRONMENT if environment is None else environment)
    return cache.Stage("tests", ".tst", "tfxla-lite-test-1", lambda: values, "rewrite")


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TFXLA_LITE_CACHE_DIR", str(tmp_path))
    return tmp_path / "tests"


def test_a_stored_value_loads_with_its_header(folder: Path) -> None:
    stage = _stage()
    before = cache.stats()
    stage.store_json("k", {"a": [1, 2]})
    assert stage.load_json("k", lambda value: value) == {"a": [1, 2]}
    (path,) = folder.iterdir()
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert {k: header[k] for k in ("stage", "format", "key", "tool")} == {
        "stage": "tests", "format": "tfxla-lite-test-1", "key": "k", "tool": "1.0"}
    assert [s["name"] for s in header["sections"]] == ["payload"]
    after = cache.stats()
    assert (after.rewrite_writes - before.rewrite_writes,
            after.rewrite_hits - before.rewrite_hits) == (1, 1)


@pytest.mark.parametrize("damage", [
    lambda data: data[:-1], lambda data: data + b"x", lambda data: b"",
    lambda data: b"{}\n" + data.split(b"\n", 1)[1],
    lambda data: data.replace(b'"tool": "1.0"', b'"tool": "2.0"'),
], ids=["short", "trailing", "empty", "no-header", "foreign"])
def test_a_bad_entry_is_a_counted_miss_and_removed(folder: Path, damage) -> None:
    stage = _stage()
    stage.store_json("k", [1])
    (path,) = folder.iterdir()
    path.write_bytes(damage(path.read_bytes()))
    before = cache.stats()
    assert stage.load_json("k", lambda value: value) is None
    assert cache.stats().rewrite_rejected == before.rewrite_rejected + 1
    assert not path.exists()


def test_a_payload_the_stage_refuses_is_a_miss(folder: Path) -> None:
    stage = _stage()
    stage.store_json("k", [1])

    def refuse(value: object) -> object:
        raise ValueError("not mine")

    assert stage.load_json("k", refuse) is None
    assert not list(folder.iterdir())


def test_another_environment_looks_elsewhere(folder: Path) -> None:
    _stage().store_json("k", [1])
    assert _stage({"tool": "2.0"}).path("k") != _stage().path("k")
    assert _stage({"tool": "2.0"}).load_json("k", lambda value: value) is None


def test_an_unwritable_folder_is_only_logged(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    before = cache.stats()
    _stage().store("k", [("payload", b"x")], root=blocker)  # a file where the folder goes
    assert cache.stats().rewrite_writes == before.rewrite_writes


def test_old_entries_are_pruned(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "DISK_ENTRIES", 4)
    stage = _stage()
    for n in range(5):
        stage.store_json(str(n), n)
    assert len(list(folder.iterdir())) == 3  # down to 3/4 of the bound


def test_the_memory_table_is_bounded_and_waits_for_a_pending_key() -> None:
    table = cache.MemoryTable("test-table", max_bytes=100, hits="memory_hits", max_entries=2)
    try:
        for key in "abc":
            table.put(key, key.upper(), 10)
        assert (table.get("a"), table.get("c")) == (None, "C")  # the oldest went
        table.put("big", "B", 1000)  # kept alone although over the bound
        assert table.usage() == (1, 1000)
        release = threading.Event()
        job = background.submit(lambda: release.wait(60) and "P",
                                key=table.job_key("pending"))
        waiter = threading.Thread(target=lambda: results.append(table.get("pending")))
        results: list[object] = []
        waiter.start()
        release.set()
        waiter.join(60)
        assert results == ["P"] and job.done()
        assert background.pending(table.job_key("pending")) is None
    finally:
        cache._tables.remove(table)


def test_stats_are_copies() -> None:
    first = cache.stats()
    assert dataclasses.replace(first) == first and first is not cache.stats()
