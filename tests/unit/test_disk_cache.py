"""The prefix cache's disk tier: entries survive a restart, a corrupt or foreign file
is skipped with a log line and never loaded, the directory stays bounded."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from edge_llm.engine import build_engine
from edge_llm.engine.kv.disk_cache import DiskCache, DiskTier
from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.tier import SavedKv, prompt_key
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.settings import EngineSettings

import fakes
from fakes import FakeBackend, drain


def entry(first: int, n: int = 200, state: bytes = b"s" * 1000) -> SavedKv:
    logits = np.arange(8, dtype=np.float32)
    return SavedKv(state, tuple(range(first, first + n)), n - 10, logits)


def written(directory: Path, *entries: SavedKv, capacity: int = 1 << 20) -> DiskCache:
    disk = DiskCache(directory, capacity, "model-a")
    tier = DiskTier(disk)
    for e in entries:
        key = prompt_key(e.tokens)
        assert tier.reserve(key, len(e.state)) and tier.store(key, e)
    disk.close()
    return disk


def load_all(disk: DiskCache) -> list[SavedKv]:
    """Every valid entry, newest first, through the tier's load."""
    tier = DiskTier(disk)
    loaded = [tier.load(key) for key, _ in disk.newest()]
    return [saved for saved in loaded if saved is not None]


def test_entries_come_back_after_a_restart_into_the_host_tier(tmp_path: Path) -> None:
    written(tmp_path, entry(0), entry(1000))
    again = DiskCache(tmp_path, 1 << 20, "model-a")
    loaded = load_all(again)
    assert sorted(e.tokens[0] for e in loaded) == [0, 1000]
    assert loaded[0].state == b"s" * 1000 and loaded[0].n_prompt == 190
    assert list(loaded[0].first_logits) == list(range(8))
    host = HostCache(1 << 20, 1)
    for e in loaded:
        assert host.adopt(e, "disk")
    assert {e.origin for e in host.entries()} == {"disk"}
    assert {e.key for e in host.entries()} == {p.stem for p in tmp_path.glob("*.kvc")}
    assert not host.adopt(SavedKv(b"x", loaded[0].tokens, 190), "disk")  # held already
    again.close()


def test_a_corrupt_or_foreign_file_is_skipped_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written(tmp_path, entry(0), entry(1000))
    first, second = sorted(tmp_path.glob("*.kvc"))
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the payload
    first.write_bytes(bytes(data))
    (tmp_path / "junk.kvc").write_bytes(b"not json\n")
    with caplog.at_level(logging.WARNING, logger="edge_llm.cache"):
        again = DiskCache(tmp_path, 1 << 20, "model-a")
        loaded = load_all(again)
        foreign = DiskCache(tmp_path, 1 << 20, "model-b")
        assert load_all(foreign) == []
    assert [e.tokens[0] for e in loaded] == [second_tokens(second)]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "checksum mismatch" in messages and "unreadable" in messages
    assert "another model" in messages
    assert not first.exists() and second.exists()  # corrupt removed, foreign kept
    again.close()
    foreign.close()


def second_tokens(path: Path) -> int:
    return int(json.loads(path.read_bytes().partition(b"\n")[0])["tokens"][0])


def test_the_directory_keeps_under_its_bound_oldest_out(tmp_path: Path) -> None:
    one = len(entry(0).state) + 2000  # a file: the payload and a header with 200 tokens
    disk = written(tmp_path, entry(0), entry(1000), entry(2000), capacity=2 * one)
    files = list(tmp_path.glob("*.kvc"))
    assert len(files) == 2 and disk.num_bytes <= 2 * one
    assert sorted(second_tokens(f) for f in files) == [1000, 2000]


@pytest.mark.parametrize("per_slot", [True, False])
async def test_at_stop_the_disk_tier_gets_what_the_kv_book_kept(
    tmp_path: Path, per_slot: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine writes ``KvBook.kept()`` at stop, whichever book it holds: the
    per-slot layout's kept slots; the unified pool keeps nothing for the disk."""
    monkeypatch.setattr(fakes, "FAKE_LOGITS", (0.5, 0.25))  # the file holds float32
    engine = build_engine(FakeBackend(per_slot=per_slot), EngineSettings(cache_dir=str(tmp_path)))  # type: ignore[arg-type]
    engine.start(asyncio.get_running_loop())
    try:
        prompt = GenerationRequest(prompt_tokens=list(range(200)), max_tokens=4)
        await drain(engine, engine.submit(prompt))
    finally:
        await asyncio.to_thread(engine.stop)
    files = await asyncio.to_thread(lambda: list(tmp_path.glob("*.kvc")))
    assert bool(files) is per_slot
