"""The memory ledger: every KV tier under one cap (engine/kv/ledger.py), alone and in an
engine over the fake backend whose every tier is filled."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from edge_llm.engine.kv.host_cache import HostCache
from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.kv.ledger import (
    MemoryLedger,
    context_cells,
    device_share_bytes,
    kv_bytes_per_token,
    ledger_summary,
    try_giver,
)
from edge_llm.engine.kv.tier import SavedKv
from edge_llm.engine.runtime.backend import context_tokens
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.errors import KvBudgetExceeded
from edge_llm.models.embeddings import EmbeddingLimits, Embeddings

from fakes import FakeBackend, drain

MIB = 1 << 20


def test_the_device_keeps_the_cap_less_the_host_tiers_share() -> None:
    assert device_share_bytes(256 * MIB, 256 * MIB, 512 * MIB) == 192 * MIB
    assert device_share_bytes(256 * MIB, 8 * MIB, 0) == 248 * MIB
    assert device_share_bytes(256 * MIB, 0, 0) == 256 * MIB  # no host tiers: all of it
    embeddings = 512 * 23040  # SmolLM2's embeddings context: 11.25 MiB
    assert device_share_bytes(256 * MIB, 256 * MIB, 512 * MIB, embeddings) == 192 * MIB
    assert device_share_bytes(256 * MIB, 0, 0, embeddings) == 256 * MIB - embeddings
    assert device_share_bytes(8 * MIB, 0, 0, embeddings) == 6 * MIB  # a quarter at most


def test_the_cells_of_a_kv_context_as_llama_cpp_allocates_them() -> None:
    smol = 23040  # bytes a token, f16
    assert context_tokens(30 * MIB, smol, 8192, 4, False) == 1024  # 341 a slot: 256
    assert context_tokens(30 * MIB, smol, 8192, 4, True) == 1280  # one stream: 1,365
    assert context_tokens(60 * MIB, 18432, 32768, 4, False) == 3072  # Gemma: 768 a slot
    assert context_tokens(MIB, smol, 8192, 4, True) == 256  # one block at least
    assert context_tokens(MIB, smol, 8192, 4, False) == 0  # a slot's part under a block
    assert context_tokens(1 << 40, smol, 2048, 4, False) == 4 * 2048  # the trained context


def test_a_tokens_kv_from_gguf_metadata_as_llama_cpp_sizes_it() -> None:
    smol = {
        "general.architecture": "llama", "llama.block_count": 30,
        "llama.embedding_length": 576, "llama.attention.head_count": 9,
        "llama.attention.head_count_kv": 3,
    }  # fmt: skip
    sizes = [kv_bytes_per_token(smol, kind) for kind in ("f16", "q8_0", "q4_0")]
    assert sizes == [23040, 12240, 6480]  # what docs/memory.md and the backend say
    gemma = {
        "general.architecture": "gemma3", "gemma3.block_count": 18,
        "gemma3.embedding_length": 640, "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 1, "gemma3.attention.key_length": 256,
        "gemma3.attention.value_length": 256,
    }  # fmt: skip
    assert kv_bytes_per_token(gemma, "f16") == 18432
    assert kv_bytes_per_token({"general.architecture": "llama"}, "f16") is None
    assert context_cells(512) == 512 and context_cells(513) == 768


def test_a_host_tier_takes_only_what_the_ledger_has_free() -> None:
    ledger = MemoryLedger(10_000)
    ledger.account("device", "device").charge(5_000)
    cache = HostCache(1 * MIB, 10, ledger)  # its own cap is far above the ledger's
    first = cache.reserve_prompt(list(range(100)), 100, None)  # 100 * 26 + 4096 = 6,696: too big
    assert first is None
    assert cache.reserve_prompt(list(range(-1, -3, -1)), 2, None) is not None  # 4,148 bytes fit
    assert ledger.used_bytes <= 10_000
    assert cache.reserve_prompt(list(range(2, 4)), 2, None) is not None  # the older entry goes
    assert len(cache) == 1 and cache.evictions == 1
    assert ledger.used_bytes <= 10_000


def test_the_host_cache_gives_back_first_and_nothing_passes_the_cap() -> None:
    ledger = MemoryLedger(20_000)
    cache = HostCache(1 * MIB, 10, ledger)
    store = HostOffload(1 * MIB, ledger)
    for i in range(4):
        assert cache.reserve_prompt([i] * 10, 10, None) is not None  # 4,356 bytes each
    assert ledger.free_bytes == 20_000 - 4 * 4356
    assert store.reserve("stream", 9_000)  # the cache's two oldest entries go for it
    assert len(cache) == 2 and ledger.used_bytes <= 20_000
    assert not store.fits(20_000 - 9_000 + 1)  # past the cap even with the cache empty
    assert not store.reserve("another", 20_000 - 9_000 + 1)
    assert len(cache) == 2 and "another" not in store  # a refused one evicts nothing
    store.store("stream", SavedKv(b"x" * 8_000))  # the save ran: its room shrinks to the state
    assert store.num_bytes == 8_000 and ledger.used_bytes <= 20_000


def test_an_entry_a_pending_load_will_read_is_never_given_back() -> None:
    ledger = MemoryLedger(10_000)
    cache = HostCache(1 * MIB, 10, ledger)
    entry = cache.reserve_prompt([1] * 10, 10, None)
    assert entry is not None
    cache.store(entry.key, SavedKv(b"x" * 100))
    cache.touch(entry.key, loading=True)  # an admission decided to load it
    assert cache.give_back() == 0
    assert cache.load(entry.key) == SavedKv(b"x" * 100, (1,) * 10, 10)  # the load ran
    assert cache.give_back() == 100


def test_an_offload_store_alone_keeps_its_own_cap() -> None:
    store = HostOffload(1_000)  # a ledger of its own, no common cap: as before
    assert store.fits(1_000) and not store.fits(1_001)
    store.store("a", SavedKv(b"x" * 600))
    assert not store.fits(401) and store.could_ever_hold(1_000)


def test_the_summary_line_names_every_line_against_the_cap() -> None:
    fields = {
        "cap_bytes": 256 * MIB, "total_bytes": 200 * MIB, "weights_bytes": 94 * MIB,
        "embeddings_bytes": 12 * MIB, "reserve_bytes": 0,
        "tiers": [
            {"label": "KV context", "bytes": 180 * MIB, "detail": {"live": 0, "cached": MIB}},
            {"label": "host cache", "bytes": 8 * MIB, "detail": {"cap": 256 * MIB}},
            {"label": "offload", "bytes": 0, "detail": {"cap": 512 * MIB}},
        ],
    }  # fmt: skip
    line = ledger_summary(fields)
    assert "KV context 180.0 (live 0.0, cached 1.0)" in line
    assert "host cache 8.0 (cap 256.0) + offload 0.0 (cap 512.0) + embeddings 12.0" in line
    assert "= 200.0 MiB of 256.0 MiB cap; weights 94.0 MiB" in line


# -- an engine whose every tier is filled --------------------------------------------------

# The fake's saved states take about 8 bytes a cell, a host entry reserves
# bytes_per_token + 16 a cell (and a header) before its save: 8,178 for a prompt.
BYTES_PER_TOKEN = 10
CAPACITY = 1024  # cells: four slots of 256
DEVICE = CAPACITY * BYTES_PER_TOKEN
ROOM = 12_000  # the ledger's room beside the KV context: a few host entries
EMBEDDING_TOKENS = 1024  # its context (10,240 bytes) needs what the host tier holds
PROMPT = 150  # over MIN_SAVED_CELLS: a vacated slot is saved to the host tier


def prompt_request(first: int, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=[first, *range(1000, 1000 + PROMPT - 1)], max_tokens=max_tokens
    )


def capped_engine(engine_of, backend: FakeBackend, peaks: list[int]):
    engine = engine_of(
        backend, memory_cap_bytes=DEVICE + ROOM, host_cache_bytes=MIB,
        host_offload_bytes=MIB, offload_paused_after_s=0.0,
    )  # fmt: skip
    backend.after_sampling = lambda: peaks.append(engine.ledger.used_bytes)
    return engine


async def test_every_tier_filled_stays_under_the_cap(engine_of) -> None:
    backend = FakeBackend(
        kv_capacity_tokens=CAPACITY, per_slot=True, kv_bytes_per_token=BYTES_PER_TOKEN
    )
    peaks: list[int] = []
    engine = capped_engine(engine_of, backend, peaks)
    assert engine.device.account.num_bytes == DEVICE
    for i in range(8):  # distinct prompts one after another: slot 0 is vacated each time
        await drain(engine, engine.submit(prompt_request(i)))
    cache = engine.host_cache
    assert cache.evictions > 0 and len(cache) >= 1  # the host tier filled its room
    assert cache.num_bytes <= ROOM
    # Four streams paused hold every slot; a fifth waits: one is offloaded for it.
    paused = [engine.submit(prompt_request(100 + i, max_tokens=40)) for i in range(4)]
    for handle in paused:
        while handle.seq.n_generated < 2:
            assert await handle.wait_changed(10.0)
        engine.pause(handle)
    waiting = engine.submit(prompt_request(200))
    assert await drain(engine, waiting)
    assert engine.metrics.kv_offloads._value.get() >= 1
    # The embeddings context takes its share; the host tier gives it back.
    limits = EmbeddingLimits(max_inputs=4, max_tokens=EMBEDDING_TOKENS, max_waiting=4, threads=1)
    embeddings = Embeddings(backend, 1000, limits, engine.ledger)
    assert embeddings.context_bytes == EMBEDDING_TOKENS * BYTES_PER_TOKEN
    with engine._lock:
        assert engine.ledger.used_bytes + embeddings.context_bytes > DEVICE + ROOM
    await embeddings.embed(["hello"], truncate=False)
    kinds = engine.snapshot()["memory_ledger"]
    assert kinds["embeddings_bytes"] == embeddings.context_bytes
    assert kinds["total_bytes"] <= kinds["cap_bytes"] == DEVICE + ROOM
    for handle in paused:
        engine.resume(handle)
        await drain(engine, handle)
    embeddings.close()
    assert peaks and max(peaks) <= DEVICE + ROOM
    assert engine.ledger.used_bytes <= DEVICE + ROOM


async def test_no_room_for_the_embeddings_context_is_a_503(engine_of) -> None:
    backend = FakeBackend(
        kv_capacity_tokens=CAPACITY, per_slot=True, kv_bytes_per_token=BYTES_PER_TOKEN
    )
    engine = engine_of(backend, memory_cap_bytes=DEVICE + 1000)
    limits = EmbeddingLimits(max_inputs=4, max_tokens=256, max_waiting=4, threads=1)
    embeddings = Embeddings(backend, 1000, limits, engine.ledger)
    with pytest.raises(KvBudgetExceeded) as refused:
        await embeddings.embed(["hello"], truncate=False)
    assert refused.value.retry_after_s is not None
    assert not backend.embedders  # nothing was allocated
    assert engine.ledger.used_bytes == DEVICE


async def test_without_room_a_paused_stream_is_not_offloaded(engine_of) -> None:
    """A ledger the KV context fills: an offload would pass the cap, so the waiting
    request waits for a slot instead."""
    backend = FakeBackend(
        kv_capacity_tokens=CAPACITY, per_slot=True, kv_bytes_per_token=BYTES_PER_TOKEN
    )
    engine = engine_of(
        backend, memory_cap_bytes=DEVICE, offload_paused_after_s=0.0, max_pause_s=None
    )
    paused = [engine.submit(prompt_request(i, max_tokens=40)) for i in range(4)]
    for handle in paused:
        while handle.seq.n_generated < 2:
            assert await handle.wait_changed(10.0)
        engine.pause(handle)
    waiting = engine.submit(prompt_request(9))
    await asyncio.sleep(0.2)  # several idle wake-ups: any offload would have run
    assert waiting.seq.public_state() == "queued"
    assert engine.host_offload.num_bytes == 0 and engine.metrics.kv_offloads._value.get() == 0
    engine.resume(paused[0])
    await drain(engine, paused[0])
    assert await drain(engine, waiting)  # it got the slot the finished stream left
    for handle in paused[1:]:
        engine.resume(handle)
        await drain(engine, handle)


def test_an_engine_whose_kv_context_passes_the_cap_does_not_start() -> None:
    from edge_llm.engine import EngineSettings, build_engine
    from edge_llm.errors import BackendError

    backend = FakeBackend(
        kv_capacity_tokens=CAPACITY, per_slot=True, kv_bytes_per_token=BYTES_PER_TOKEN
    )
    with pytest.raises(BackendError, match="does not fit max_kv_cache_mb"):
        build_engine(backend, EngineSettings(memory_cap_bytes=DEVICE - 1))  # type: ignore[arg-type]


def test_a_giver_whose_engine_lock_stays_held_gives_nothing() -> None:
    lock = threading.RLock()
    give = try_giver(lock, lambda: 100)
    assert give() == 100  # free, or held by this very thread
    with lock:
        assert give() == 100
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    assert give() == 0  # another thread keeps it past the bounded wait
    release.set()
    holder.join(10)
    assert give() == 100


# -- several models, one ledger ------------------------------------------------------------


def test_every_models_lines_count_against_one_cap() -> None:
    ledger = MemoryLedger(30_000)
    smol, gemma = ledger.for_model("smol"), ledger.for_model("gemma")
    smol.account("device", "device").charge(10_000)
    cache = HostCache(1 * MIB, 10, smol)  # smol's host tier: whatever is free
    for i in range(4):
        assert cache.reserve_prompt([i] * 10, 10, None) is not None  # 4,356 bytes each
    assert ledger.used_bytes == smol.used_bytes == gemma.used_bytes == 10_000 + 4 * 4356
    assert smol.own_bytes == 10_000 + 4 * 4356 and gemma.own_bytes == 0
    device = gemma.account("device", "device")
    assert device.reserve(12_000)  # smol's host tier gives back for gemma's KV context
    assert len(cache) == 1 and ledger.used_bytes <= 30_000
    assert gemma.line("device") is device and smol.by_kind() == {
        "device": 10_000, "host_cache": 4356,
    }  # fmt: skip
    assert not gemma.account("embeddings", "embeddings").reserve(30_000 - 22_000 + 1)
    assert ledger.by_model() == {"smol": 14_356, "gemma": 12_000}
    gemma.close_model()  # unloaded: its lines leave, the room is back
    assert gemma.line("device") is None and ledger.used_bytes == 14_356


def test_a_reserved_line_resizes_to_what_was_allocated() -> None:
    ledger = MemoryLedger(10_000)
    line = ledger.account("device", "device")
    assert line.reserve(8_000)  # an upper bound, before the load
    assert line.resize(7_680) and ledger.used_bytes == 7_680  # whole blocks: less
    assert not line.resize(10_001) and line.num_bytes == 7_680  # past the cap: unchanged
    assert line.resize(10_000) and ledger.free_bytes == 0


def named_backend(name: str) -> FakeBackend:
    backend = FakeBackend(
        kv_capacity_tokens=CAPACITY, per_slot=True, kv_bytes_per_token=BYTES_PER_TOKEN
    )
    backend.info = dataclasses.replace(backend.info, model_id=name)
    return backend


async def test_a_second_models_kv_context_is_carved_from_the_same_cap() -> None:
    """One cap for two engines: the first one's host tier fills the room beside its KV
    context; the second's KV context takes it back; a third does not fit at all."""
    from edge_llm.engine import EngineSettings, build_engine
    from edge_llm.errors import BackendError

    cap = 2 * DEVICE + 4_000  # room for a host entry or two beside one KV context
    ledger = MemoryLedger(cap)
    settings = EngineSettings(memory_cap_bytes=cap, host_cache_bytes=MIB)  # type: ignore[arg-type]
    first = build_engine(named_backend("first"), settings, ledger=ledger)
    first.start(asyncio.get_running_loop())
    try:
        for i in range(8):  # slot 0 vacated each time: its prompt goes to the host tier
            await drain(first, first.submit(prompt_request(i)))
        assert first.host_cache.num_bytes > cap - 2 * DEVICE  # more than the second leaves
        second = build_engine(named_backend("second"), settings, ledger=ledger)
        assert ledger.used_bytes <= cap and first.host_cache.evictions > 0
        assert second.device.account.num_bytes == DEVICE and second.device.account.model == "second"
        fields = second.snapshot()["memory_ledger"]
        assert fields["other_models_bytes"] == first.ledger.own_bytes > DEVICE
        assert fields["total_bytes"] == ledger.used_bytes <= fields["cap_bytes"] == cap
        assert "+ other models" in ledger_summary(fields)
        with pytest.raises(BackendError, match="does not fit max_kv_cache_mb"):
            build_engine(named_backend("third"), settings, ledger=ledger)
        assert ledger.used_bytes <= cap and set(ledger.by_model()) == {"first", "second"}
        second.stop()  # its lines leave: the first model's host tier may use the room
        assert set(ledger.by_model()) == {"first"}
    finally:
        first.stop()
