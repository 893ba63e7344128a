"""llama.cpp work outside the engine thread (the prefill probe, embeddings) runs in a
thread that ends with it (in_passing_thread): an OpenMP pool left alive in another
thread slowed the engine thread's decode by about 30 %."""

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from edge_llm.engine import in_passing_thread
from edge_llm.models.embeddings import EmbeddingLimits, Embeddings

from fakes import FakeBackend, FakeEmbedder


def test_runs_in_a_thread_of_its_own_that_has_ended_when_awaited() -> None:
    seen: list[threading.Thread] = []

    def probe(a: int, b: int) -> int:
        seen.append(threading.current_thread())
        return a + b

    async def main() -> int:
        result = await in_passing_thread(probe, 2, 3)
        assert seen[0] is not threading.current_thread()
        assert not seen[0].is_alive()
        return result

    assert asyncio.run(main()) == 5


def test_executor_threads_live_on_which_is_why_it_is_not_used() -> None:
    seen: list[threading.Thread] = []

    async def main() -> None:
        await asyncio.to_thread(lambda: seen.append(threading.current_thread()))
        assert seen[0].is_alive()  # asyncio's executor keeps its thread (and its pool)

    asyncio.run(main())


def test_an_error_reaches_the_awaiting_task() -> None:
    def probe() -> None:
        raise RuntimeError("probe failed")

    with pytest.raises(RuntimeError, match="probe failed"):
        asyncio.run(in_passing_thread(probe))


def test_embeddings_run_in_threads_that_end() -> None:
    backend = FakeBackend()
    limits = EmbeddingLimits(max_inputs=4, max_tokens=64, max_waiting=4, threads=1)
    embeddings = Embeddings(backend, 1000, limits)
    seen: list[threading.Thread] = []
    backend.embedder = recording(backend.embedder, seen)  # type: ignore[method-assign]

    async def main() -> None:
        for _ in range(2):
            result = await embeddings.embed(["hello", "world"], truncate=False)
            assert len(result.vectors) == 2
        # between requests no thread of theirs lives on (an executor's would, with its pool)
        assert seen and not any(thread.is_alive() for thread in seen)
        embeddings.close()

    asyncio.run(main())


def recording(make: Callable[..., FakeEmbedder], seen: list[threading.Thread]) -> Any:
    """The fake embedder, whose embed notes the thread it ran in."""

    def made(*args: Any) -> FakeEmbedder:
        embedder = make(*args)
        embed = embedder.embed

        def noted(tokens: Sequence[int]) -> list[float]:
            seen.append(threading.current_thread())
            return embed(tokens)

        embedder.embed = noted  # type: ignore[method-assign]
        return embedder

    return made
