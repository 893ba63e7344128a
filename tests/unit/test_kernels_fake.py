"""How each row is computed is a function of the request (per-slot layout, the
default): the fake backend records how llama.cpp would compute each cell
(``FakeBackend.kernel``); cells computed the same way give the same numbers, so equal
kernels here are what equal greedy texts are with the real model (tests/e2e). By
default that holds for a cache hit or miss; with ``deterministic`` also beside other
streams and with speculation on or off."""

from __future__ import annotations

import asyncio

from edge_llm.engine.engine import Engine
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.stream import StreamHandle

from fakes import FakeBackend, drain

SCRIPT = tuple(range(10, 400))  # a long answer: the fake never ends it early


def per_slot_backend() -> FakeBackend:
    return FakeBackend(SCRIPT, kv_capacity_tokens=4 * 1000, max_sequences=4, per_slot=True)


def request(prompt: list[int], max_tokens: int = 300) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens)


LONG = list(range(1000, 1150))  # prefilled in tiles
SHORT = list(range(2000, 2030))  # prefilled row by row


async def run(engine: Engine, prompt: list[int], max_tokens: int = 300) -> StreamHandle:
    handle = engine.submit(request(prompt, max_tokens))
    await drain(engine, handle)
    return handle


def kernels(engine: Engine, handle: StreamHandle) -> list[str]:
    backend: FakeBackend = engine.backend  # type: ignore[assignment]
    return backend.kernels(handle.seq.require_slot())


def expected(n_prompt: int, n_cells: int, lone_rows: str = "row") -> list[str]:
    """A prompt's rows but its last in tiles (when there are 64 or more), every other
    cell row by row; past 256 cells a lone stream's decode rows as ``lone_rows``."""
    tiled = n_prompt - 1 if n_prompt - 1 >= 64 else 0
    rows = max(0, min(n_cells, 256) - tiled)
    return ["tile"] * tiled + ["row"] * rows + [lone_rows] * (n_cells - tiled - rows)


async def test_a_lone_stream_computes_its_rows_as_its_length_says(engine_of) -> None:
    engine = engine_of(per_slot_backend(), speculative=False)
    deterministic = engine_of(per_slot_backend(), speculative=False, deterministic=True)
    for prompt in (LONG, SHORT):
        cells = kernels(engine, await run(engine, prompt))
        assert len(cells) > 256  # long enough for llama.cpp's split decode to apply
        assert cells[: len(prompt)] == expected(len(prompt), len(prompt))
        assert "split" in cells[len(prompt) :]  # a lone row past 256 cells
        padded = kernels(deterministic, await run(deterministic, prompt))
        assert padded == expected(len(prompt), len(padded))  # never split


async def test_deterministic_every_cell_is_computed_as_alone_beside_others(engine_of) -> None:
    settings = {"speculative": True, "max_draft_tokens": 4, "deterministic": True}
    alone = engine_of(per_slot_backend(), **settings)
    reference = kernels(alone, await run(alone, LONG))
    engine = engine_of(per_slot_backend(), **settings)
    first = engine.submit(request(SHORT, 200))
    second = engine.submit(request([*SHORT, 7], 250))
    target = engine.submit(request(LONG))
    texts = await asyncio.gather(*(drain(engine, h) for h in (first, second, target)))
    assert all(texts)
    assert kernels(engine, target) == reference
    backend: FakeBackend = engine.backend  # type: ignore[assignment]
    assert set(backend.kernel.values()) <= {"tile", "row"}


async def test_a_regenerate_and_the_next_turn_compute_as_a_miss_would(engine_of) -> None:
    engine = engine_of(per_slot_backend(), speculative=True)
    first = await run(engine, LONG, max_tokens=40)
    again = await run(engine, LONG, max_tokens=40)
    assert again.seq.num_cached == len(LONG)  # whole: its first token from kept logits
    assert kernels(engine, again) == kernels(engine, first)
    turn = [*first.seq.token_ids, *range(3000, 3100)]
    hit = await run(engine, turn, max_tokens=20)
    assert hit.seq.num_cached == len(LONG) - 1  # the earlier prompt, not its answer
    fresh = engine_of(per_slot_backend(), speculative=True)
    miss = await run(fresh, turn, max_tokens=20)
    assert miss.seq.num_cached == 0
    assert kernels(engine, hit) == kernels(fresh, miss)


async def test_speculation_drafts_only_where_a_lone_row_is_computed_as_a_run(engine_of) -> None:
    """Past 256 cells a lone row is split across threads and a drafted run is not:
    without ``deterministic`` drafts stop there, so where they fell cannot change the
    text; with it every row is computed as a run and drafts go on."""
    copying = tuple(range(10, 40)) * 12  # the script repeats itself: drafts are accepted
    for deterministic in (False, True):
        backend = FakeBackend(copying, kv_capacity_tokens=4000, max_sequences=4, per_slot=True)
        engine = engine_of(backend, speculative=True, deterministic=deterministic)
        handle = await run(engine, LONG, max_tokens=300)
        cells = kernels(engine, handle)
        assert backend.drafts, "the copying script was drafted"
        past = cells[256:]
        if deterministic:
            assert "split" not in cells and "row" in past
        else:
            assert past and set(past) == {"split"}
