"""A model pulled on first use (``pull = "missing"``): one pull per source however it
is spelt (``models/pulling.py``), and a streamed request's answer that says it is
downloading, then loading, before its stream's own events (``generation/pending.py``).
The pull here is a coroutine the test steps through; the e2e test
(tests/e2e/test_pull_e2e.py) pulls from the Hub stand-in into a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from edge_llm.errors import Cancelled, ModelNotFound
from edge_llm.generation.answer import Answer
from edge_llm.generation.events import AnswerEvent, Ended, Failed
from edge_llm.generation.pending import PendingAnswer
from edge_llm.models.pull import PullStatus, Report
from edge_llm.models.pulling import PullFlight, PullFlights
from edge_llm.models.spec import ModelSpec
from edge_llm.protocol import openai
from edge_llm.protocol.stream_events import Ending, Heartbeat
from edge_llm.protocol.ws import StreamProtocol

SOURCE = "hf.co/o/r:Q4_K_M"
SIZE = 10 << 20


class _Hub:
    """A pull that reports the bytes the test lets through, then ends as told."""

    def __init__(self) -> None:
        self.pulls: list[str] = []
        self.steps: asyncio.Queue[int | BaseException | None] = asyncio.Queue()
        self.cancelled = False

    async def pull(self, name: str, report: Report) -> ModelSpec | None:
        self.pulls.append(name)
        report(PullStatus("pulling manifest"))
        try:
            while (step := await self.steps.get()) is not None:
                if isinstance(step, BaseException):
                    raise step
                report(PullStatus("pulling 0123456789ab", "sha256:0123", SIZE, step))
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return ModelSpec(name, "/models/" + name.replace("/", "_"), SIZE, 0)


def _key(name: str) -> str | None:
    """The test's spellings of one source (the catalog's rule: tests/unit/test_model_sources.py)."""
    if ":" not in name:
        return None
    return "hf.co/" + name.removeprefix("hf.co/").split(":")[0] + ":" + name.split(":")[1].upper()


class _Stream(Answer):
    """The stream the request gets once its model is pulled and loaded."""

    def __init__(self) -> None:
        self.id, self.model, self.n_prompt = "chatcmpl-inner", SOURCE, 7
        self.headers = {"X-Request-Id": self.id, "X-Max-Tokens-Clamped": "4"}
        self.told: list[str] = []

    @property
    def backend(self) -> str:
        return "local"

    @property
    def outcome(self) -> Ending | None:
        return None

    async def events(self, new_id: Callable[[], str]) -> AsyncIterator[AnswerEvent]:
        yield Ended("stop", None, {}, "Paris", ())

    def usage(self) -> dict[str, Any]:
        return {"prompt_tokens": 7}

    def stats(self) -> dict[str, Any]:
        return {"ttft_ms": 1.0}

    def pause(self) -> None:
        self.told.append("pause")

    def resume(self) -> None:
        self.told.append("resume")

    def cancel(self, reason: str) -> None:
        self.told.append("cancel " + reason)

    def detach(self) -> None:
        self.told.append("detach")

    def reattach(self, **detail: Any) -> None:
        self.told.append("reattach")

    def close(self) -> None:
        self.told.append("close")


class _Server:
    """The dispatcher's part: the served name once pulled, then the stream (or a refusal)."""

    def __init__(self, refusal: BaseException | None = None) -> None:
        self.stream = _Stream()
        self.started_on: list[str] = []
        self.loading = asyncio.Event()
        self.refusal = refusal

    async def pulled(self, flight: PullFlight) -> str | None:
        spec = await flight.result()
        return None if spec is None else spec.name

    async def start(self, model: str) -> Answer:
        self.started_on.append(model)
        await self.loading.wait()
        if self.refusal is not None:
            raise self.refusal
        return self.stream


def _pending(flight: PullFlight, server: _Server, *, progress: bool = True) -> PendingAnswer:
    return PendingAnswer(
        flight, server.pulled, server.start,
        request_id="chatcmpl-pending", progress=progress, heartbeat_interval_s=60.0,
    )  # fmt: skip


async def _next(events: AsyncIterator[AnswerEvent]) -> AnswerEvent:
    return await asyncio.wait_for(anext(events), 10)


async def test_spellings_of_one_source_asked_at_once_start_one_pull() -> None:
    hub = _Hub()
    flights = PullFlights(hub.pull, _key)
    first = flights.start("o/r:q4_k_m")
    second = flights.start("hf.co/o/r:Q4_K_M")
    assert first is not None and first is second and first.name == SOURCE
    assert flights.start("no-tag") is None and not flights.may_pull("no-tag")
    await hub.steps.put(SIZE)
    await hub.steps.put(None)
    specs = await asyncio.gather(first.result(), second.result())
    assert [s.name for s in specs if s] == [SOURCE, SOURCE]
    assert hub.pulls == [SOURCE]  # one download, under the source's own name
    await asyncio.sleep(0)  # the flight's end is seen: the next ask pulls again
    assert flights.start("o/r:Q4_K_M") is not first


async def test_a_streamed_request_hears_downloading_then_loading_then_its_stream() -> None:
    hub = _Hub()
    flight = PullFlights(hub.pull, _key).start("o/r:q4_k_m")
    assert flight is not None
    server = _Server()
    answer = _pending(flight, server)
    assert (answer.id, answer.model, answer.n_prompt) == ("chatcmpl-pending", SOURCE, 0)
    events = answer.events(lambda: "call")
    first = await _next(events)
    assert isinstance(first, Heartbeat) and first.state == "downloading"
    assert first.download == (0, None)  # the Hub has not said the size yet
    seen = []
    for done in (1 << 20, 2 << 20, 2 << 20 | 5, 6 << 20):  # a step under 1 % tells nothing
        await hub.steps.put(done)
        if done != 2 << 20 | 5:
            beat = await _next(events)
            assert isinstance(beat, Heartbeat) and beat.state == "downloading"
            seen.append(beat.download)
    assert seen == [(1 << 20, SIZE), (2 << 20, SIZE), (6 << 20, SIZE)]
    progress = openai.progress_chunk("chatcmpl-pending", SOURCE, 0, first.progress(), chat=True)
    assert progress["progress"]["download_done"] == 0 and progress["choices"] == []
    assert "download_done" not in Heartbeat("queued", 0, 3).progress()  # only while downloading
    socket = StreamProtocol()  # the WebSocket's heartbeat frame carries the same fields
    socket.on_heartbeat(beat)
    frame = socket.frames_to_send()[-1]
    assert frame["type"] == "heartbeat" and frame["state"] == "downloading"
    assert (frame["download_done"], frame["download_total"]) == (6 << 20, SIZE)
    answer.pause()  # the client pauses before the stream exists: it is told once it runs
    await hub.steps.put(None)
    loading = await _next(events)
    assert isinstance(loading, Heartbeat) and loading.state == "loading"
    assert "download_done" not in loading.progress()
    assert server.started_on == [SOURCE] and not answer.finished
    server.loading.set()
    ended = await _next(events)
    assert isinstance(ended, Ended) and ended.text == "Paris"
    assert server.stream.told == ["pause"]
    assert answer.n_prompt == 7 and answer.headers["X-Max-Tokens-Clamped"] == "4"
    assert answer.usage() == {"prompt_tokens": 7}
    answer.close()
    assert server.stream.told == ["pause", "close"]


async def test_without_progress_no_heartbeat_before_the_interval() -> None:
    hub = _Hub()
    flight = PullFlights(hub.pull, _key).start(SOURCE)
    assert flight is not None
    server = _Server()
    server.loading.set()
    answer = _pending(flight, server, progress=False)
    events = answer.events(lambda: "call")
    for done in (1 << 20, SIZE):
        await hub.steps.put(done)
    await hub.steps.put(None)
    assert isinstance(await _next(events), Ended)  # the 60 s interval never came


async def test_a_cancel_while_downloading_ends_the_answer_not_the_pull() -> None:
    hub = _Hub()
    flights = PullFlights(hub.pull, _key)
    flight = flights.start(SOURCE)
    assert flight is not None
    server = _Server()
    answer = _pending(flight, server)
    events = answer.events(lambda: "call")
    assert isinstance(await _next(events), Heartbeat)
    answer.cancel("client")
    failed = await _next(events)
    assert isinstance(failed, Failed) and isinstance(failed.error, Cancelled)
    assert failed.error.reason == "client" and answer.finished
    answer.close()
    await hub.steps.put(None)  # the pull goes on: the next request finds the model
    spec = await flight.result()
    assert spec is not None and not hub.cancelled and server.started_on == []


async def test_a_failed_pull_or_a_refusal_is_the_answers_failure() -> None:
    hub = _Hub()
    flights = PullFlights(hub.pull, _key)
    flight = flights.start(SOURCE)
    assert flight is not None
    answer = _pending(flight, _Server())
    events = answer.events(lambda: "call")
    assert isinstance(await _next(events), Heartbeat)
    await hub.steps.put(ModelNotFound("model 'o/r:q4_k_m' could not be pulled: 404"))
    failed = await _next(events)
    assert isinstance(failed, Failed) and failed.error.code == "model_not_found"

    refused = _Server(ModelNotFound("nothing loads"))
    refused.loading.set()
    flight = flights.start(SOURCE)
    assert flight is not None
    answer = _pending(flight, refused, progress=False)
    await hub.steps.put(None)
    failed = await _next(answer.events(lambda: "call"))
    assert isinstance(failed, Failed) and failed.error.message == "nothing loads"


async def test_a_close_while_the_model_loads_cancels_the_start() -> None:
    hub = _Hub()
    flight = PullFlights(hub.pull, _key).start(SOURCE)
    assert flight is not None
    server = _Server()
    answer = _pending(flight, server)
    await hub.steps.put(None)
    while not server.started_on:
        await asyncio.sleep(0)
    answer.close()  # the request went away while its model loaded
    server.loading.set()
    for _ in range(5):
        await asyncio.sleep(0)
    failed = await _next(answer.events(lambda: "call"))
    assert isinstance(failed, Failed) and isinstance(failed.error, Cancelled)
    assert server.stream.told == []  # the start was cancelled before it returned a stream
