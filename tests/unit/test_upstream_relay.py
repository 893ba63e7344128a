"""Upstream relay against small aiohttp servers on 127.0.0.1 standing in for an
upstream (the real engines are in tests/e2e/test_upstream.py): failover only
before content, errors passed on, CANCEL closing the connection, config."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from edge_llm.config.tree import ConfigError, load_config
from edge_llm.config.upstream import UpstreamConfig
from edge_llm.errors import UpstreamFailure, UpstreamRejected, UpstreamUnavailable
from edge_llm.generation.pump import read_relayed
from edge_llm.models.store import ModelStore, StoredModel
from edge_llm.protocol import anthropic, responses
from edge_llm.protocol.sse import SSEParser
from edge_llm.protocol.stream_events import Finished
from edge_llm.protocol.tools import ArgumentsOut, CallStarted, TextOut, ToolCall
from edge_llm.server.context import CONTEXT
from edge_llm.server.openai_answer import _Merged
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.stream import StreamSettings, UpstreamChunk, UpstreamStream
from edge_llm.upstream.translate import (
    ChatChunkReader,
    messages_chat_body,
    responses_chat_body,
    usage_counts,
)

from helpers import delta_text, free_port, next_frame

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _chunk(text: str, finish: str | None = None, *, chat: bool = True) -> bytes:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    return _data({"id": "x", "choices": [choice]})


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _call_chunks(name: str, pieces: list[str]) -> list[bytes]:
    """A streamed tool call: id and name first, then the arguments in pieces."""
    start = {"index": 0, "id": "call_up1", "type": "function",
             "function": {"name": name, "arguments": ""}}  # fmt: skip
    deltas = [start] + [{"index": 0, "function": {"arguments": p}} for p in pieces]
    choices = [{"index": 0, "delta": {"tool_calls": [d]}, "finish_reason": None} for d in deltas]
    return [_data({"id": "x", "choices": [c]}) for c in choices]


class FakeUpstream:
    """Streams ``texts`` (then ``tool_call``'s chunks), a usage chunk and [DONE]
    for chat and text completions; ``break_after`` drops the connection after
    that many chunks; ``status`` answers an error instead; before each chunk whose
    index is in ``hold_before`` it waits until the test sets ``go``."""

    # vLLM sends null prompt_tokens_details
    USAGE: ClassVar[dict[str, Any]] = {
        "prompt_tokens": 7,
        "completion_tokens": 5,
        "total_tokens": 12,
        "prompt_tokens_details": None,
    }

    def __init__(
        self,
        texts: list[str],
        *,
        break_after: int | None = None,
        status: int = 200,
        tool_call: tuple[str, list[str]] | None = None,
        hold_before: tuple[int, ...] = (),
    ) -> None:
        self.texts = texts
        self.break_after = break_after
        self.status = status
        self.tool_call = tool_call
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.closed_by_client = asyncio.Event()
        self.hold_before = hold_before
        self.go = asyncio.Event()
        self.written_all = asyncio.Event()  # the last chunk is written
        self.server = TestServer(self._app())

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def _chunks(self, chat: bool) -> list[bytes]:
        chunks = [_chunk(text, chat=chat) for text in self.texts]
        finish = "stop"
        if self.tool_call is not None:
            chunks += _call_chunks(*self.tool_call)
            finish = "tool_calls"
        usage = _data({"id": "x", "choices": [], "usage": self.USAGE})
        return [*chunks, _chunk("", finish, chat=chat) + usage + b"data: [DONE]\n\n"]

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        self.paths.append(request.path)
        if self.status != 200:
            error = {"error": {"message": "too long", "code": "prompt_too_long"}}
            return web.json_response(error, status=self.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for n, chunk in enumerate(self._chunks(request.path.endswith("/chat/completions"))):
                if n == self.break_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if n in self.hold_before:
                    await self.go.wait()
                    self.go.clear()
                await response.write(chunk)
                await asyncio.sleep(0.01)
            self.written_all.set()
        except (ConnectionResetError, asyncio.CancelledError):
            self.closed_by_client.set()
            raise
        return response


@pytest.fixture
async def servers() -> AsyncIterator[Callable[..., Awaitable[FakeUpstream]]]:
    started: list[FakeUpstream] = []

    async def start(texts: list[str], **kwargs: Any) -> FakeUpstream:
        fake = FakeUpstream(texts, **kwargs)
        await fake.server.start_server()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        await fake.server.close()


@pytest.fixture
async def registry() -> AsyncIterator[UpstreamRegistry]:
    reg = UpstreamRegistry({}, health_interval_s=60.0, connect_timeout_s=2.0)
    yield reg
    await reg.close()


def _upstream(name: str, url: str) -> Upstream:
    return Upstream(name, UpstreamConfig(url=url, models=["m"]))


def _stream(registry: UpstreamRegistry, *candidates: Upstream, **settings: Any) -> UpstreamStream:
    stream = UpstreamStream(
        stream_id="s1",
        path="/v1/chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        candidates=candidates,
        registry=registry,
        settings=StreamSettings(heartbeat_interval_s=0.5, **settings),
        client_model="m",
        session=None,
        metrics=BackendMetrics(CollectorRegistry(), "local", [c.name for c in candidates]),
        events=lambda *a, **k: None,
    )
    stream.start()
    return stream


async def _drain(stream: UpstreamStream) -> tuple[str, Finished]:
    text = []
    async for event in read_relayed(stream):
        if isinstance(event, UpstreamChunk):
            text.append(event.text)
        elif isinstance(event, Finished):
            return "".join(text), event
    raise AssertionError("no Finished event")


async def test_refused_connection_fails_over_to_the_next(servers, registry) -> None:
    good = await servers(["a", "b"])
    dead = _upstream("dead", f"http://127.0.0.1:{free_port()}")
    stream = _stream(registry, dead, _upstream("good", good.url))
    text, finished = await asyncio.wait_for(_drain(stream), 30)
    assert text == "ab"
    assert finished.outcome.error is None and finished.outcome.finish_reason == "stop"
    assert stream.relay.backend == "good"
    assert stream.relay.progress.failovers == ["dead"]
    assert dead.healthy is False and dead.last_error
    assert good.requests[0]["stream"] is True


async def test_break_before_content_fails_over_without_duplicates(servers, registry) -> None:
    broken = await servers(["never"], break_after=0)
    good = await servers(["one", " two"])
    stream = _stream(registry, _upstream("broken", broken.url), _upstream("good", good.url))
    text, _ = await asyncio.wait_for(_drain(stream), 30)
    assert text == "one two"
    assert stream.relay.progress.failovers == ["broken"]


async def test_break_after_content_ends_with_an_error_and_no_retry(servers, registry) -> None:
    broken = await servers(["one", " two", " three"], break_after=2)
    other = await servers(["never"])
    first = _upstream("broken", broken.url)
    stream = _stream(registry, first, _upstream("other", other.url))
    text, finished = await asyncio.wait_for(_drain(stream), 30)
    assert text == "one two"
    assert isinstance(finished.outcome.error, UpstreamFailure)
    assert other.requests == []
    assert first.healthy is False


async def test_upstream_4xx_reaches_the_client_with_its_code(servers, registry) -> None:
    refusing = await servers([], status=400)
    other = await servers(["never"])
    stream = _stream(registry, _upstream("r", refusing.url), _upstream("o", other.url))
    _, finished = await asyncio.wait_for(_drain(stream), 30)
    error = finished.outcome.error
    assert isinstance(error, UpstreamRejected)
    assert (error.status, error.code) == (400, "prompt_too_long")
    assert other.requests == []


async def test_busy_upstream_is_skipped_but_stays_healthy(servers, registry) -> None:
    busy = await servers([], status=503)
    good = await servers(["ok"])
    first = _upstream("busy", busy.url)
    stream = _stream(registry, first, _upstream("good", good.url))
    text, _ = await asyncio.wait_for(_drain(stream), 30)
    assert text == "ok"
    assert first.healthy is True


async def test_no_upstream_left_is_503(registry) -> None:
    dead = _upstream("dead", f"http://127.0.0.1:{free_port()}")
    _, finished = await asyncio.wait_for(_drain(_stream(registry, dead)), 30)
    assert isinstance(finished.outcome.error, UpstreamUnavailable)
    assert finished.outcome.error.status == 503


async def test_streams_opened_together_keep_the_upstreams_max_concurrency(
    servers, registry
) -> None:
    """Four streams started together to an upstream of max_concurrency 2 (it holds its
    answers): two are sent, two end at once with 503 upstream_unavailable. Found on the
    relay path (issue 59): the room was read at routing and counted only after the
    connect's await, so requests arriving together were all sent."""
    held = await servers(["a"], hold_before=(0,))
    upstream = Upstream("up", UpstreamConfig(url=held.url, models=["m"], max_concurrency=2))
    drains = [asyncio.create_task(_drain(_stream(registry, upstream))) for _ in range(4)]
    refused, waiting = await asyncio.wait(drains, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    while len(refused) < 2 and waiting:
        more, waiting = await asyncio.wait(waiting, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert more, f"{len(refused)} of 4 ended; {upstream.num_open} open upstream"
        refused |= more
    assert len(refused) == 2 and upstream.num_open == 2
    for task in refused:
        error = task.result()[1].outcome.error
        assert isinstance(error, UpstreamUnavailable) and error.status == 503
    answered: set[asyncio.Task[tuple[str, Finished]]] = set()
    while waiting:  # the fake lets one held answer go per set()
        held.go.set()
        done, waiting = await asyncio.wait(waiting, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert done, "a held answer did not end"
        answered |= done
    assert [task.result()[0] for task in answered] == ["a", "a"]
    assert len(held.requests) == 2


async def test_cancel_closes_the_upstream_connection(servers, registry) -> None:
    slow = await servers([f" {n}" for n in range(2000)])
    stream = _stream(registry, _upstream("slow", slow.url))
    async for event in read_relayed(stream):
        if isinstance(event, UpstreamChunk) and event.has_content:
            break
    stream.cancel("client")
    await asyncio.wait_for(slow.closed_by_client.wait(), 10)
    assert stream.relay.state == "cancelled"


async def test_pause_stops_reading_until_resume(servers, registry) -> None:
    """A PAUSE lets the read in flight finish (one chunk here) and no other: the
    source writes everything, and nothing more is read until RESUME."""
    source = await servers([f" {n}" for n in range(40)], hold_before=(1, 2))
    stream = _stream(registry, _upstream("s", source.url))
    events = read_relayed(stream)
    async for event in events:
        if isinstance(event, UpstreamChunk) and event.has_content:
            break  # the reader waits in a read: the source holds the next chunk
    stream.pause()
    received = stream.relay.progress.n_received
    source.go.set()  # one chunk for the read in flight
    async for event in events:
        if isinstance(event, UpstreamChunk) and event.has_content:
            break  # delivered while paused: it was read before the pause took hold
    assert stream.relay.progress.n_received == received + 1
    source.go.set()  # then all the rest
    await asyncio.wait_for(source.written_all.wait(), 30)
    assert stream.relay.progress.n_received == received + 1
    assert stream.relay.state == "paused"
    stream.resume()
    async for event in events:
        if isinstance(event, Finished):
            break
    assert stream.relay.progress.n_content == 40
    assert stream.relay.pauses.count >= 1  # the client pause (a full buffer may add one)


async def test_ttft_timeout_closes_a_silent_upstream(registry) -> None:
    async def silent(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(60)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/chat/completions", silent)
    server = TestServer(app)
    await server.start_server()
    try:
        url = str(server.make_url("")).rstrip("/")
        stream = _stream(registry, _upstream("silent", url), ttft_timeout_s=0.3)
        _, finished = await asyncio.wait_for(_drain(stream), 30)
    finally:
        await server.close()
    assert finished.outcome.error is not None
    assert finished.outcome.error.code == "ttft_timeout"


def test_merged_chunks_make_one_completion() -> None:
    merged = _Merged()
    call = {"index": 0, "id": "c1", "function": {"name": "get", "arguments": '{"a"'}}
    merged.add({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]})
    more = {"index": 0, "function": {"arguments": ": 1}"}}
    merged.add({"choices": [{"index": 0, "delta": {"tool_calls": [more]}}]})
    merged.add({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    body = merged.completion("id1", "m", {"completion_tokens": 3})
    message = body["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "get", "arguments": '{"a": 1}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_config_tables_flags_and_environment(tmp_path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text(
        '[upstream.vllm]\nurl = "http://10.0.0.5:8000/v1/"\napi_key = "k"\n'
        'models = ["Qwen/Qwen2.5-7B-Instruct"]\nmax_concurrency = 64\nfallback = true\n',
        encoding="utf-8",
    )
    config = load_config(
        path,
        env={"EDGE_LLM_UPSTREAM": "lan=http://192.168.1.9:8080"},
        overrides={"upstream": ["vllm=http://10.0.0.6:8000"]},
    )
    vllm, lan = config.upstream["vllm"], config.upstream["lan"]
    assert vllm.url == "http://10.0.0.6:8000" and vllm.fallback and vllm.max_concurrency == 64
    assert vllm.models == ["Qwen/Qwen2.5-7B-Instruct"] and vllm.api_key == "k"
    assert lan.url == "http://192.168.1.9:8080" and not lan.fallback


@pytest.mark.parametrize(
    ("toml", "flag", "message"),
    [
        ('[upstream.a]\nurl = "http://x"\nretries = 3\n', None, "upstream.a.retries"),
        ("[upstream.a]\nfallback = true\n", None, "url"),
        ('[upstream.a]\nurl = "ftp://x"\n', None, "http(s)://"),
        ("", "no-equals-sign", "NAME=URL"),
        ("", "local=http://x", "not 'local'"),
    ],
)
def test_config_errors_name_the_problem(tmp_path, toml: str, flag: str | None, message: str):
    path = tmp_path / "engine.toml"
    path.write_text(toml, encoding="utf-8")
    overrides = {"upstream": [flag]} if flag else {}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(path, env={}, overrides=overrides)


# -- routing through the app (fake local backend) -----------------------------------------


@pytest.fixture
def front_of(client_of) -> Callable[..., Awaitable[TestClient]]:
    """The server over the fake backend, configured from ``path`` and keys."""

    async def make(path: Path | None = None, **overrides: object) -> TestClient:
        client: TestClient = await client_of(config_path=path, **overrides)
        return client

    return make


def _body(content: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def test_a_refused_prompt_falls_back_only_to_a_healthy_upstream(
    servers, front_of, tmp_path: Path
) -> None:
    fallback = await servers(["from", " upstream"])
    long_prompt = "word " * 40
    plain = await front_of(max_prompt_tokens=8, upstream=[f"big={fallback.url}"])
    no_fallback = await plain.post("/v1/chat/completions", json=_body(long_prompt))
    assert no_fallback.status == 400  # fallback is off unless configured
    assert (await no_fallback.json())["error"]["code"] == "prompt_too_long"

    path = tmp_path / "engine.toml"
    path.write_text(f'[upstream.big]\nurl = "{fallback.url}"\nfallback = true\n', "utf-8")
    client = await front_of(path, max_prompt_tokens=8)
    served = await client.post("/v1/chat/completions", json=_body(long_prompt))
    assert served.status == 200
    completion = await served.json()
    assert completion["choices"][0]["message"]["content"] == "from upstream"
    assert completion["model"] == "fake"  # the client asked for the local model
    assert fallback.requests[-1]["model"] == "m"  # the upstream was asked for its own
    client.server.app[CONTEXT].router.registry.upstreams[0].healthy = False
    refused = await client.post("/v1/chat/completions", json=_body(long_prompt))
    assert refused.status == 400
    assert (await refused.json())["error"]["code"] == "prompt_too_long"


async def test_a_fallback_names_the_model_the_request_spelt_an_alias_of(
    servers, front_of, tmp_path: Path
) -> None:
    """A request naming a pulled model by another of its names (a spelling of its
    source) that the device refuses is relayed as that model, as a local answer
    names it (before: the default model's name)."""
    fallback = await servers(["from", " upstream"])
    store = ModelStore(tmp_path / "store")
    store.ensure()
    blob = store.blob_path("ab" * 32)
    blob.write_bytes(b"GGUF")
    store.write_manifest(StoredModel(
        "hf.co/o/r:Q4_K_M", "http://127.0.0.1:9/x.gguf", "o/r", "r-Q4_K_M.gguf", "c", 4,
        "ab" * 32, "llama", "Q4_K_M", True,
    ))  # fmt: skip
    path = tmp_path / "engine.toml"
    path.write_text(
        f'[models.b]\npath = "{blob}"\n[upstream.big]\nurl = "{fallback.url}"\nfallback = true\n',
        "utf-8",
    )
    client = await front_of(path, max_prompt_tokens=8, models_dir=str(store.root))
    served = await client.post("/v1/chat/completions", json=_body("word " * 40, model="o/r:q4_k_m"))
    assert served.status == 200, await served.text()
    completion = await served.json()
    assert completion["choices"][0]["message"]["content"] == "from upstream"
    assert completion["model"] == "b"  # the served model the spelling names


async def test_models_lists_upstream_models_and_unknown_is_404(servers, front_of) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    listing = await (await client.get("/v1/models")).json()
    assert [(m["id"], m["owned_by"]) for m in listing["data"]] == [
        ("fake", "edge-llm"),
        ("m", "u"),
    ]
    missing = await client.post("/v1/chat/completions", json=_body("hi", model="nope"))
    assert missing.status == 404
    assert (await missing.json())["error"]["available"] == ["fake", "m"]
    streams = await (await client.get("/debug/streams")).json()
    assert streams["upstreams"][0]["name"] == "u"


# -- Responses, Messages and text completions over an upstream ---------------------------

TOOL = {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


def _sse_events(raw: str) -> list[tuple[str | None, Any]]:
    events = SSEParser().feed(raw.encode())
    return [(e.event, None if e.data == "[DONE]" else json.loads(e.data)) for e in events]


def _runs(names: list[str | None]) -> list[str | None]:
    """Event names with repeats folded (a run of deltas is one entry)."""
    return [name for n, name in enumerate(names) if n == 0 or names[n - 1] != name]


async def _stream_of(client: TestClient, stream_id: str) -> dict[str, Any]:
    streams = (await (await client.get("/debug/streams")).json())["streams"]
    return next(s for s in streams if s["id"] == stream_id)


async def test_responses_streamed_through_an_upstream(servers, front_of) -> None:
    fake = await servers(["Hello", ",", " world"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "m", "input": "hi", "instructions": "Be brief.", "stream": True,
            "max_output_tokens": 20, "temperature": 0, "tools": [{"type": "function", **TOOL}],
            "tool_choice": "auto", "text": {"format": {"type": "json_object"}}}  # fmt: skip
    response = await client.post("/v1/responses", json=body)
    assert response.status == 200
    events = _sse_events(await response.text())
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert _runs([name for name, _ in events]) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [d["delta"] for name, d in events if name == "response.output_text.delta"]
    assert deltas == ["Hello", ",", " world"]
    final = events[-1][1]["response"]
    assert final["model"] == "m" and final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Hello, world"
    assert final["usage"]["input_tokens"] == 7 and final["usage"]["output_tokens"] == 5
    (sent,) = fake.requests
    assert fake.paths == ["/v1/chat/completions"]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert (sent["model"], sent["max_tokens"], sent["temperature"]) == ("m", 20, 0)
    assert sent["tools"] == [{"type": "function", "function": TOOL}]
    assert sent["tool_choice"] == "auto"
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    stream = await _stream_of(client, response.headers["X-Request-Id"])
    assert (stream["backend"], stream["state"]) == ("u", "done")


async def test_responses_not_streamed_with_a_call_and_a_stored_conversation(
    servers, front_of
) -> None:
    fake = await servers(["Checking."], tool_call=("get_weather", ['{"city":', ' "Paris"}']))
    client = await front_of(upstream=[f"u={fake.url}"])
    tools = [{"type": "function", **TOOL}]
    body = {"model": "m", "input": "Weather in Paris?", "tools": tools}
    first = await (await client.post("/v1/responses", json=body)).json()
    assert first["status"] == "completed" and first["model"] == "m"
    message, call = first["output"]
    assert message["content"][0]["text"] == "Checking."
    assert (call["type"], call["name"], call["call_id"]) == (
        "function_call",
        "get_weather",
        "call_up1",
    )
    assert call["arguments"] == '{"city": "Paris"}'
    output = {"type": "function_call_output", "call_id": "call_up1", "output": "sunny"}
    follow_up = {"model": "m", "input": [output], "previous_response_id": first["id"]}
    second = await client.post("/v1/responses", json=follow_up)
    assert second.status == 200
    assert fake.requests[1]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_up1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_up1", "content": "sunny"},
    ]  # fmt: skip


async def test_messages_streamed_through_an_upstream(servers, front_of) -> None:
    fake = await servers(["Hello", ",", " world"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "m", "max_tokens": 30, "stream": True, "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["END"],
            "top_k": 5, "metadata": {"user_id": "user-ann"}}  # fmt: skip
    response = await client.post("/v1/messages", json=body, headers={"X-Session-Id": "ann"})
    assert response.status == 200
    events = _sse_events(await response.text())
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]  # later pings: heartbeats of a slow stream
    assert _runs([name for name in names if name != "ping"]) == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["model"] == "m"
    text = [d["delta"]["text"] for name, d in events if name == "content_block_delta"]
    assert text == ["Hello", ",", " world"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"] == {"input_tokens": 7, "output_tokens": 5}
    (sent,) = fake.requests
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert (sent["max_tokens"], sent["stop"], sent["top_k"], sent["user"]) == (
        30,
        ["END"],
        5,
        "ann",
    )
    stream = await _stream_of(client, response.headers["X-Request-Id"])
    assert stream["backend"] == "u"


async def test_messages_not_streamed_with_a_tool_use(servers, front_of) -> None:
    fake = await servers(["Let me see."], tool_call=("get_weather", ['{"city": ', '"Oslo"}']))
    client = await front_of(upstream=[f"u={fake.url}"])
    tool = {"name": "get_weather", "input_schema": TOOL["parameters"]}
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    body = {"model": "m", "max_tokens": 30, "tools": [tool], "tool_choice": choice,
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]}  # fmt: skip
    response = await client.post("/v1/messages", json=body)
    assert response.status == 200
    message = await response.json()
    assert message["model"] == "m" and message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {"type": "text", "text": "Let me see."},
        {"type": "tool_use", "id": "call_up1", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert message["usage"]["input_tokens"] == 7
    (sent,) = fake.requests
    assert sent["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": TOOL["parameters"]}}]  # fmt: skip
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False


async def test_messages_prefill_cannot_be_relayed(servers, front_of) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]
    response = await client.post(
        "/v1/messages", json={"model": "m", "max_tokens": 5, "messages": turns}
    )
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    assert "prefill" in error["message"]
    assert fake.requests == []


async def test_messages_with_another_model_id_still_run_locally(servers, front_of) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "claude-x", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    response = await client.post("/v1/messages", json=body)
    assert response.status == 200
    assert (await response.json())["model"] == "fake"
    assert fake.requests == []


async def _post_fallback(client: TestClient, endpoint: str, prompt: str) -> Any:
    bodies = {
        "/v1/responses": {"input": prompt, "max_output_tokens": 4},
        "/v1/messages": {"model": "fake", "max_tokens": 4,
                         "messages": [{"role": "user", "content": prompt}]},
    }  # fmt: skip
    return await client.post(endpoint, json=bodies[endpoint])


@pytest.mark.parametrize("endpoint", ["/v1/responses", "/v1/messages"])
async def test_a_refused_prompt_falls_back_for_responses_and_messages(
    servers, front_of, tmp_path: Path, endpoint: str
) -> None:
    fallback = await servers(["from", " upstream"])
    long_prompt = "word " * 40
    plain = await front_of(max_prompt_tokens=8, upstream=[f"big={fallback.url}"])
    refused = await _post_fallback(plain, endpoint, long_prompt)
    assert refused.status == 400  # no fallback configured: the device's refusal
    assert (await refused.json())["error"]["code"] == "prompt_too_long"

    path = tmp_path / "engine.toml"
    path.write_text(f'[upstream.big]\nurl = "{fallback.url}"\nfallback = true\n', "utf-8")
    client = await front_of(path, max_prompt_tokens=8)
    served = await _post_fallback(client, endpoint, long_prompt)
    assert served.status == 200
    answer = await served.json()
    assert answer["model"] == "fake"  # the client asked for the local model
    text = (
        answer["output"][0]["content"][0]["text"]
        if "output" in answer
        else answer["content"][0]["text"]
    )
    assert text == "from upstream"
    assert fallback.requests[-1]["model"] == "m"
    assert fallback.requests[-1]["messages"][-1]["content"] == long_prompt
    stream = await _stream_of(client, served.headers["X-Request-Id"])
    assert stream["backend"] == "big"
    metrics = await (await client.get("/metrics")).text()
    assert 'backend_requests_total{backend="big",route="fallback_prompt_too_long"} 1.0' in metrics


@pytest.mark.parametrize(
    ("endpoint", "body", "marker"),
    [
        ("/v1/responses", {"input": "hi"}, b"response.output_text.delta"),
        ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
         b"content_block_delta"),
    ],
)  # fmt: skip
async def test_disconnect_closes_the_upstream_request(
    servers, front_of, endpoint: str, body: dict[str, Any], marker: bytes
) -> None:
    slow = await servers([f" {n}" for n in range(2000)])
    client = await front_of(upstream=[f"u={slow.url}"])
    response = await client.post(endpoint, json={**body, "model": "m", "stream": True})
    await asyncio.wait_for(response.content.readuntil(marker), 30)
    stream_id = response.headers["X-Request-Id"]
    response.close()  # the client goes away mid-stream
    await asyncio.wait_for(slow.closed_by_client.wait(), 30)
    stream = await _stream_of(client, stream_id)
    assert (stream["state"], stream["cancel_reason"]) == ("cancelled", "disconnect")
    assert stream["n_generated"] < 2000


@pytest.mark.parametrize("supersede", [True, False])
async def test_a_relayed_stream_is_superseded_only_with_supersede_sessions(
    servers, front_of, supersede: bool
) -> None:
    held = await servers([" a", " b"], hold_before=(1,))  # " b" waits for the test
    client = await front_of(upstream=[f"u={held.url}"], supersede_sessions=supersede)
    headers = {"X-Session-Id": "s1"}
    relayed = await client.post(
        "/v1/chat/completions", json=_body("hi", model="m", stream=True), headers=headers
    )
    await asyncio.wait_for(relayed.content.readuntil(b'" a"'), 30)
    newer = await client.post("/v1/chat/completions", json=_body("hi"), headers=headers)
    assert newer.status == 200  # the same session, on the local model
    held.go.set()
    rest = await asyncio.wait_for(relayed.content.read(), 30)
    stream = await _stream_of(client, relayed.headers["X-Request-Id"])
    if supersede:
        assert stream["cancel_reason"] == "superseded"
        assert b"superseded" in rest
    else:
        assert stream["cancel_reason"] is None
        assert b'" b"' in rest and rest.endswith(b"data: [DONE]\n\n")


async def test_a_relayed_request_carries_the_priority_the_server_resolved(
    servers, front_of
) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"], key_priority=["sk-batch=7"])
    asks = [
        ({"X-Priority": "5"}, {}),  # the header's class
        ({"Authorization": "Bearer sk-batch"}, {}),  # the API key's default
        ({"X-Priority": "5"}, {"priority": -2}),  # the body's own wins, as sent
        ({}, {}),  # nothing resolved: no field an upstream may refuse
    ]
    for headers, fields in asks:
        body = _body("hi", model="m", **fields)
        response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status == 200
    messages = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    answered = await client.post("/v1/messages", json=messages, headers={"X-Priority": "3"})
    assert answered.status == 200
    sent = [request.get("priority") for request in fake.requests]
    assert sent == [5, 7, -2, None, 3]


async def test_the_callers_trace_context_reaches_the_upstream_as_sent(servers, front_of) -> None:
    """Tracing off: the caller's ``traceparent`` and ``tracestate`` are passed on, so
    the upstream's spans join the caller's trace."""
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
             "tracestate": "vendor=1"}  # fmt: skip
    for headers in (trace, {}):
        response = await client.post(
            "/v1/chat/completions", json=_body("hi", model="m"), headers=headers
        )
        assert response.status == 200
    sent, untraced = fake.headers
    assert {name: sent.get(name) for name in trace} == trace
    assert "traceparent" not in untraced and "tracestate" not in untraced


async def test_responses_upstream_break_ends_with_error_and_failed(servers, front_of) -> None:
    broken = await servers(["one", " two", " three"], break_after=2)
    client = await front_of(upstream=[f"u={broken.url}"])
    response = await client.post(
        "/v1/responses", json={"model": "m", "input": "hi", "stream": True}
    )
    events = _sse_events(await response.text())
    names = [name for name, _ in events]
    assert names[-2:] == ["error", "response.failed"]
    assert "response.completed" not in names
    assert events[-2][1]["code"] == "upstream_error"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["content"][0]["text"] == "one two"


@pytest.mark.parametrize("endpoint", ["/v1/responses", "/v1/messages"])
async def test_an_upstream_4xx_before_any_byte_is_a_plain_error(
    servers, front_of, endpoint: str
) -> None:
    refusing = await servers([], status=400)
    client = await front_of(upstream=[f"u={refusing.url}"])
    body = {"model": "m", "stream": True, "input": "hi", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    for unused in ("messages", "max_tokens") if endpoint == "/v1/responses" else ("input",):
        del body[unused]
    response = await client.post(endpoint, json=body)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["code"] == "prompt_too_long" and "upstream 'u'" in error["message"]


async def test_responses_bad_tool_choice_is_refused_before_the_upstream(servers, front_of) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "m", "input": "hi", "tool_choice": "required"}
    response = await client.post("/v1/responses", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "tool_choice"
    assert fake.requests == []


@pytest.mark.parametrize("stream", [True, False])
async def test_text_completions_through_an_upstream(servers, front_of, stream: bool) -> None:
    fake = await servers(["Once", " upon", " a time"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "m", "prompt": "Tell me", "max_tokens": 5, "stream": stream}
    response = await client.post("/v1/completions", json=body)
    assert response.status == 200
    assert fake.paths == ["/v1/completions"] and fake.requests[0]["prompt"] == "Tell me"
    if stream:
        events = _sse_events(await response.text())
        assert events[-1] == (None, None)  # [DONE]
        chunks = [data for _, data in events[:-1]]
        assert {c["id"] for c in chunks} == {response.headers["X-Request-Id"]}
        assert "".join(c["choices"][0]["text"] for c in chunks) == "Once upon a time"
        assert {c["model"] for c in chunks} == {"m"}
    else:
        whole = await response.json()
        assert whole["object"] == "text_completion" and whole["model"] == "m"
        assert whole["choices"][0]["text"] == "Once upon a time"
        assert whole["usage"]["completion_tokens"] == 5


# -- one dispatch for every route ----------------------------------------------------------

LOCAL_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/messages": {"model": "fake", "max_tokens": 2,
                     "messages": [{"role": "user", "content": "hi"}]},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
}  # fmt: skip


async def _over_websocket(
    client: TestClient, request: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The text of one stream started on ``/v1/stream``, and its last frame."""
    async with client.ws_connect("/v1/stream") as ws:
        await ws.send_json({"type": "start", "request": request})
        frames: list[dict[str, Any]] = []
        last = await next_frame(ws, "done", "error", seen=frames, timeout=30)
        return delta_text(frames), last


@pytest.mark.parametrize("endpoint", [*LOCAL_BODIES, "/v1/stream"])
async def test_every_route_asks_the_router_once(
    servers, front_of, monkeypatch: pytest.MonkeyPatch, endpoint: str
) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    router = client.server.app[CONTEXT].router
    asked: list[str | None] = []
    decide = router.upstreams_for

    def counting(model: str | None, **kwargs: Any) -> Any:
        asked.append(model)
        return decide(model, **kwargs)

    monkeypatch.setattr(router, "upstreams_for", counting)
    if endpoint == "/v1/stream":
        _, last = await _over_websocket(client, LOCAL_BODIES["/v1/chat/completions"])
        assert last["type"] == "done"
    else:
        response = await client.post(endpoint, json=LOCAL_BODIES[endpoint])
        assert response.status == 200
    assert len(asked) == 1
    assert fake.requests == []  # the local model ran locally


async def test_the_websocket_and_text_completions_fall_back_too(
    servers, front_of, tmp_path: Path
) -> None:
    fallback = await servers(["from", " upstream"])
    path = tmp_path / "engine.toml"
    path.write_text(f'[upstream.big]\nurl = "{fallback.url}"\nfallback = true\n', "utf-8")
    client = await front_of(path, max_prompt_tokens=8)
    long_prompt = "word " * 40
    text, done = await _over_websocket(client, _body(long_prompt))
    assert (text, done["type"], done["stats"]["backend"]) == ("from upstream", "done", "big")
    assert fallback.paths == ["/v1/chat/completions"]
    response = await client.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 4})
    assert response.status == 200
    assert (await response.json())["choices"][0]["text"] == "from upstream"
    assert fallback.paths[-1] == "/v1/completions"


async def test_a_websocket_closed_mid_relay_cancels_the_upstream_once(servers, front_of) -> None:
    slow = await servers([f" {n}" for n in range(2000)])
    client = await front_of(upstream=[f"u={slow.url}"])
    ws = await client.ws_connect("/v1/stream")
    await ws.send_json({"type": "start", "request": _body("hi", model="m")})
    started = await next_frame(ws, "started", timeout=30)
    await next_frame(ws, "delta", timeout=30)
    await ws.close()  # the client goes away mid-stream
    await asyncio.wait_for(slow.closed_by_client.wait(), 30)
    streams = (await (await client.get("/debug/streams")).json())["streams"]
    mine = [s for s in streams if s["id"] == started["id"]]
    assert len(mine) == 1  # closed once, listed once
    assert (mine[0]["state"], mine[0]["cancel_reason"]) == ("cancelled", "disconnect")


async def test_a_prefill_keeps_the_devices_refusal_when_falling_back(
    servers, front_of, tmp_path: Path
) -> None:
    fallback = await servers(["x"])
    path = tmp_path / "engine.toml"
    path.write_text(f'[upstream.big]\nurl = "{fallback.url}"\nfallback = true\n', "utf-8")
    client = await front_of(path, max_prompt_tokens=8)
    turns = [{"role": "user", "content": "word " * 40}, {"role": "assistant", "content": "Sure,"}]
    response = await client.post(
        "/v1/messages", json={"model": "fake", "max_tokens": 4, "messages": turns}
    )
    assert response.status == 400
    error = (await response.json())["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "prompt_too_long")
    assert fallback.requests == []


def test_formats_and_tool_choices_map_to_chat() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "point", "schema": schema, "strict": True}
    req = responses.parse({"model": "m", "input": "x", "text": {"format": fmt}})
    assert responses_chat_body(req, [])["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "point", "schema": schema, "strict": True},
    }
    tool = {"name": "get_weather", "input_schema": TOOL["parameters"]}
    messages = anthropic.parse_request(
        {
            "model": "m",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [tool],
            "tool_choice": {"type": "any"},
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
    )
    body = messages_chat_body(messages, None)
    assert body["tool_choice"] == "required" and "parallel_tool_calls" not in body
    assert body["response_format"]["json_schema"] == {"name": "response", "schema": schema}


def test_chat_chunks_read_as_parser_events() -> None:
    reader = ChatChunkReader(lambda: "generated")
    call = {"index": 0, "function": {"name": "f", "arguments": '{"a"'}}
    delta = {"role": "assistant", "content": "Hi", "tool_calls": [call]}
    events = reader.feed({"choices": [{"index": 0, "delta": delta}]})
    assert events == [TextOut("Hi"), CallStarted(0, "generated", "f"), ArgumentsOut(0, '{"a"')]
    more = {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}
    assert reader.feed({"choices": [{"index": 0, "delta": more}]}) == [ArgumentsOut(0, ": 1}")]
    assert reader.feed({"choices": [], "usage": {}}) == []
    assert reader.calls == [ToolCall("generated", "f", '{"a": 1}')] and reader.text == "Hi"
    odd = {"choices": [{"delta": {"content": 3, "tool_calls": 5}, "stop_reason": 2}]}
    assert reader.feed(odd) == [] and reader.stop_sequence is None  # a broken upstream: skipped
    assert usage_counts([1])["total_tokens"] == 0
    assert usage_counts({"prompt_tokens": 3, "prompt_tokens_details": None}) == {
        "prompt_tokens": 3,
        "completion_tokens": 0,
        "total_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_an_upstream_model_id_is_relayed_never_pulled(
    servers, front_of, tmp_path: Path
) -> None:
    """With ``pull = "missing"`` a Hub-like id (``OWNER/REPO:TAG``) an upstream serves
    goes to that upstream; pulling it (from the tests' closed Hub port) would be a 404."""
    fake = await servers(["from", " upstream"])
    path = tmp_path / "engine.toml"
    path.write_text(f'[upstream.u]\nurl = "{fake.url}"\nmodels = ["o/r:Q4_K_M"]\n', "utf-8")
    client = await front_of(path, pull="missing", models_dir=str(tmp_path / "store"))
    reply = await client.post("/v1/chat/completions", json=_body("hi", model="o/r:Q4_K_M"))
    assert reply.status == 200, await reply.text()
    assert (await reply.json())["choices"][0]["message"]["content"] == "from upstream"
