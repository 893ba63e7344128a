"""Upstream relay against small aiohttp servers on 127.0.0.1 standing in for an
upstream (the real engines are in tests/e2e/test_upstream.py): failover only
before content, errors passed on, CANCEL closing the connection, config."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from edge_llm.config import ConfigError, load_config
from edge_llm.engine.engine import Engine
from edge_llm.errors import UpstreamFailure, UpstreamRejected, UpstreamUnavailable
from edge_llm.server.app import create_app
from edge_llm.server.context import CONTEXT
from edge_llm.server.pump import Finished
from edge_llm.server.runtime import build_context, engine_settings
from edge_llm.server.upstream_routes import _Merged
from edge_llm.upstream.config import UpstreamConfig
from edge_llm.upstream.metrics import BackendMetrics
from edge_llm.upstream.registry import Upstream, UpstreamRegistry
from edge_llm.upstream.stream import StreamSettings, UpstreamChunk, UpstreamStream

from fakes import FakeBackend

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


class FakeUpstream:
    """Streams ``texts`` then [DONE]; ``break_after`` drops the connection after
    that many chunks; ``status`` answers an error instead."""

    def __init__(
        self, texts: list[str], *, break_after: int | None = None, status: int = 200
    ) -> None:
        self.texts = texts
        self.break_after = break_after
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.closed_by_client = asyncio.Event()
        self.server = TestServer(self._app())

    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        if self.status != 200:
            error = {"error": {"message": "too long", "code": "prompt_too_long"}}
            return web.json_response(error, status=self.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for n, text in enumerate(self.texts):
                if n == self.break_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                await response.write(_chunk(text))
                await asyncio.sleep(0.01)
            await response.write(_chunk("", "stop") + b"data: [DONE]\n\n")
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


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    async for event in stream.events():
        if isinstance(event, UpstreamChunk):
            text.append(event.text)
        elif isinstance(event, Finished):
            return "".join(text), event
    raise AssertionError("no Finished event")


async def test_refused_connection_fails_over_to_the_next(servers, registry) -> None:
    good = await servers(["a", "b"])
    dead = _upstream("dead", f"http://127.0.0.1:{_closed_port()}")
    stream = _stream(registry, dead, _upstream("good", good.url))
    text, finished = await asyncio.wait_for(_drain(stream), 30)
    assert text == "ab"
    assert finished.outcome.error is None and finished.outcome.finish_reason == "stop"
    assert stream.backend == "good"
    assert stream.progress.failovers == ["dead"]
    assert dead.healthy is False and dead.last_error
    assert good.requests[0]["stream"] is True


async def test_break_before_content_fails_over_without_duplicates(servers, registry) -> None:
    broken = await servers(["never"], break_after=0)
    good = await servers(["one", " two"])
    stream = _stream(registry, _upstream("broken", broken.url), _upstream("good", good.url))
    text, _ = await asyncio.wait_for(_drain(stream), 30)
    assert text == "one two"
    assert stream.progress.failovers == ["broken"]


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
    dead = _upstream("dead", f"http://127.0.0.1:{_closed_port()}")
    _, finished = await asyncio.wait_for(_drain(_stream(registry, dead)), 30)
    assert isinstance(finished.outcome.error, UpstreamUnavailable)
    assert finished.outcome.error.status == 503


async def test_cancel_closes_the_upstream_connection(servers, registry) -> None:
    slow = await servers([f" {n}" for n in range(2000)])
    stream = _stream(registry, _upstream("slow", slow.url))
    async for event in stream.events():
        if isinstance(event, UpstreamChunk) and event.has_content:
            break
    stream.cancel("client")
    await asyncio.wait_for(slow.closed_by_client.wait(), 10)
    assert stream.state == "cancelled"


async def test_pause_stops_reading_until_resume(servers, registry) -> None:
    source = await servers([f" {n}" for n in range(40)])
    stream = _stream(registry, _upstream("s", source.url))
    events = stream.events()
    async for event in events:
        if isinstance(event, UpstreamChunk) and event.has_content:
            break
    stream.pause()
    await asyncio.sleep(0.3)  # the source goes on writing; nothing more is read
    received = stream.progress.n_received
    await asyncio.sleep(0.3)
    assert stream.progress.n_received == received
    assert stream.state == "paused"
    stream.resume()
    async for event in events:
        if isinstance(event, Finished):
            break
    assert stream.progress.n_content == 40
    assert stream.progress.pauses >= 1  # the client pause (a full buffer may add one)


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
async def front_of() -> AsyncIterator[Callable[..., Awaitable[TestClient]]]:
    made: list[tuple[TestClient, Engine, UpstreamRegistry]] = []

    async def make(path: Path | None = None, **overrides: object) -> TestClient:
        config = load_config(path, env={}, overrides=overrides)
        backend = FakeBackend()
        engine = Engine(backend, engine_settings(config))
        engine.start(asyncio.get_running_loop())
        ctx = build_context(config, engine, backend, lambda *a, **k: None)
        await ctx.router.registry.start()
        client = TestClient(TestServer(create_app(ctx)))
        await client.start_server()
        made.append((client, engine, ctx.router.registry))
        return client

    yield make
    for client, engine, reg in made:
        await client.close()
        await reg.close()
        await asyncio.to_thread(engine.stop)


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


async def test_responses_api_names_the_upstream_it_cannot_relay_to(servers, front_of) -> None:
    fake = await servers(["x"])
    client = await front_of(upstream=[f"u={fake.url}"])
    body = {"model": "m", "input": "hi"}
    refused = await client.post("/v1/responses", json=body)
    assert refused.status == 400
    error = (await refused.json())["error"]
    assert error["param"] == "model" and "upstream 'u'" in error["message"]
    assert fake.requests == []
