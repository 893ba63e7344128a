"""The prefill probe's thread ends with it (server/runtime.in_passing_thread): an OpenMP
pool left alive in another thread slowed the engine thread's decode by about 30 %."""

import asyncio
import threading

import pytest

from edge_llm.server.runtime import in_passing_thread


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
