"""``edge-llm doctor`` against small local servers that misbehave in one way each.

Each server runs on 127.0.0.1 port 0 in a thread with its own event loop; the
doctor runs through its CLI entry (``run``) and its ``--json`` report is read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from edge_llm.cli import doctor

from helpers import free_port

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-good"
ENV_NAMES = (
    "EDGE_LLM_BASE_URL",
    "EDGE_LLM_API_KEY",
    "EDGE_LLM_MODEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


# -- a fake OpenAI-compatible server ------------------------------------------------


@dataclass
class Behaviour:
    """How the fake server answers ``POST /v1/chat/completions``."""

    mode: str = "ok"  # ok, json, text_plain, empty, non_json, no_choices, empty_choices, no_done
    key: str | None = KEY
    models: tuple[str, ...] = (MODEL,)
    long_prompt_delay_s: float = 0.0  # the server's prefill cost for long prompts
    max_prompt_chars: int | None = None  # longer prompts get 400 prompt_too_long
    prompts: list[int] = field(default_factory=list)  # prompt lengths seen
    prompt_cache: bool = False  # a repeated request skips the delay and reports cached tokens
    seen: set[str] = field(default_factory=set)  # requests' messages, for the prompt cache


def sse_chunk(content: str | None, **extra: Any) -> bytes:
    obj: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "model": MODEL}
    if content is not None:
        obj["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    obj.update(extra)
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM_BODIES = {
    "ok": sse_chunk("Hello") + sse_chunk(" there") + b"data: [DONE]\n\n",
    "text_plain": sse_chunk("Hello") + b"data: [DONE]\n\n",
    "empty": b": ping\n\n",
    "non_json": sse_chunk("Hello") + b"data: not json at all\n\n" + b"data: [DONE]\n\n",
    "no_choices": sse_chunk("Hello") + sse_chunk(None) + b"data: [DONE]\n\n",
    "empty_choices": sse_chunk("Hello") + sse_chunk(None, choices=[]) + b"data: [DONE]\n\n",
    "no_done": sse_chunk("Hello") + sse_chunk(" there"),
}


def error(status: int, message: str, code: str, **extra: Any) -> web.Response:
    body = {"error": {"message": message, "type": "x", "code": code, **extra}}
    return web.json_response(body, status=status)


def fake_app(behaviour: Behaviour) -> web.Application:
    def authorised(request: web.Request) -> bool:
        if behaviour.key is None:
            return True
        return request.headers.get("Authorization") == f"Bearer {behaviour.key}"

    async def models(request: web.Request) -> web.Response:
        if not authorised(request):
            return error(401, "invalid api key", "invalid_api_key")
        return web.json_response({"object": "list", "data": [{"id": m} for m in behaviour.models]})

    async def chat(request: web.Request) -> web.StreamResponse:
        if not authorised(request):
            return error(401, "invalid api key", "invalid_api_key")
        body = await request.json()
        if body.get("model") not in behaviour.models:
            return error(404, f"model {body.get('model')!r} not found", "model_not_found")
        prompt = body["messages"][-1]["content"]
        behaviour.prompts.append(len(prompt))
        limit = behaviour.max_prompt_chars
        if limit is not None and len(prompt) > limit:
            n_tokens = len(prompt) // 4
            return error(
                400,
                "too long",
                "prompt_too_long",
                n_prompt_tokens=n_tokens,
                max_prompt_tokens=limit // 4,
            )
        return await answer(request, body, prompt)

    async def answer(request: web.Request, body: dict[str, Any], prompt: str) -> web.StreamResponse:
        if behaviour.mode == "json":
            message = {"role": "assistant", "content": "Hello"}
            return web.json_response(
                {"object": "chat.completion", "choices": [{"message": message}]}
            )
        messages = json.dumps(body["messages"])
        cached = behaviour.prompt_cache and messages in behaviour.seen
        behaviour.seen.add(messages)
        if len(prompt) > 200 and behaviour.long_prompt_delay_s and not cached:
            await asyncio.sleep(behaviour.long_prompt_delay_s)  # the prefill it models
        content_type = "text/plain" if behaviour.mode == "text_plain" else "text/event-stream"
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        payload = STREAM_BODIES[behaviour.mode]
        if body.get("stream_options", {}).get("include_usage"):
            n_prompt = len(messages) // 4
            details = {"cached_tokens": n_prompt - 1 if cached else 0}
            usage = {"prompt_tokens": n_prompt, "prompt_tokens_details": details}
            payload = payload.replace(
                b"data: [DONE]", sse_chunk(None, usage=usage) + b"data: [DONE]"
            )
        await response.write(payload)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def failing_proxy_app() -> web.Application:
    """A proxy that accepts connections but cannot reach anything."""

    async def bad_gateway(request: web.Request) -> web.Response:
        return web.Response(status=502, text="upstream unreachable")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", bad_gateway)
    return app


class ThreadServer:
    """An aiohttp app served on 127.0.0.1:0 by a thread with its own loop."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> ThreadServer:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("test server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _call(self, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        asyncio.run_coroutine_threadsafe(factory(), self.loop).result(timeout=30)


Serve = Callable[[web.Application], ThreadServer]
Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def serve() -> Iterator[Serve]:
    started: list[ThreadServer] = []

    def start(app: web.Application) -> ThreadServer:
        server = ThreadServer(app).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__()


# -- running the doctor ------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    report: dict[str, Any]

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.report["checks"] if c["name"] == name)

    def status(self, name: str) -> str:
        return str(self.check(name)["status"])

    def statuses(self) -> dict[str, str]:
        return {c["name"]: c["status"] for c in self.report["checks"]}


def run_doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> Outcome:
    parser = argparse.ArgumentParser()
    doctor.register(parser.add_subparsers())
    args = parser.parse_args(["doctor", "--json", "--timeout", "10", *argv])
    code = doctor.run(args)
    return Outcome(code, json.loads(capsys.readouterr().out))


def against(server: ThreadServer, *argv: str, key: str = KEY, model: str = MODEL) -> list[str]:
    return ["--base-url", server.url + "/v1", "--api-key", key, "--model", model, *argv]


ALL_PASS = {
    "base_url": "pass",
    "reachable": "pass",
    "proxy": "pass",
    "api_key": "pass",
    "auth": "pass",
    "model": "pass",
    "stream": "pass",
    "chunks": "pass",
    "ttft": "pass",
}


# -- the checks, one misbehaviour each ----------------------------------------------


def test_healthy_server_passes_everything(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    outcome = run_doctor(capsys, *against(server))
    assert outcome.statuses() == ALL_PASS
    assert outcome.code == 0
    assert list(outcome.statuses()) == list(ALL_PASS)  # the documented order


def test_text_report(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    parser = argparse.ArgumentParser()
    doctor.register(parser.add_subparsers())
    args = parser.parse_args(["doctor", *against(server, key=" sk-good")])
    assert doctor.run(args) == 1
    text = capsys.readouterr().out
    assert "FAIL  api_key" in text
    assert "fix: use the key without them" in text
    assert text.rstrip().endswith("(exit 1)")


def test_wrong_key_is_a_401_diagnosis(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    outcome = run_doctor(capsys, *against(server, key="sk-wrong"))
    assert outcome.code == 1
    assert outcome.status("api_key") == "pass"
    assert outcome.status("auth") == "fail"
    assert "wrong key" in outcome.check("auth")["summary"]
    assert outcome.status("stream") == "skip"


def test_whitespace_in_key_is_told_from_a_wrong_key(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    outcome = run_doctor(capsys, *against(server, key=" sk-good"))
    assert outcome.code == 1
    assert outcome.status("api_key") == "fail"
    auth = outcome.check("auth")
    assert auth["status"] == "fail"
    assert "whitespace" in auth["summary"]
    assert "wrong key" not in auth["summary"]


def test_missing_key(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    outcome = run_doctor(capsys, *against(server, key=""))
    assert outcome.status("api_key") == "warn"
    assert "requires an API key" in outcome.check("auth")["summary"]
    assert outcome.code == 1


def test_server_without_auth_is_reported(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(key=None)))
    outcome = run_doctor(capsys, *against(server))
    assert "checks no key" in outcome.check("auth")["summary"]
    assert outcome.code == 0


def test_wrong_model_lists_valid_ids_and_closest(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(models=(MODEL, "gemma-3-270m"))))
    outcome = run_doctor(capsys, *against(server, model="smollm2-135m"))
    model = outcome.check("model")
    assert model["status"] == "fail"
    assert f"valid ids: {MODEL}, gemma-3-270m" in model["summary"]
    assert model["details"]["closest"] == MODEL
    assert f"--model {MODEL}" in model["fix"]
    assert outcome.status("stream") == "pass"  # the rest ran with the closest id
    assert outcome.code == 1


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("json", 'ignored "stream": true'),
        ("text_plain", "'text/plain'"),
        ("empty", "no content chunk"),
        ("no_done", "[DONE]"),
    ],
)
def test_200_without_a_usable_stream(serve: Serve, capsys: Capsys, mode: str, says: str) -> None:
    server = serve(fake_app(Behaviour(mode=mode)))
    outcome = run_doctor(capsys, *against(server))
    stream = outcome.check("stream")
    assert stream["status"] == "fail"
    assert says in stream["summary"]
    assert stream["fix"]
    assert outcome.status("ttft") == "skip"
    assert outcome.code == 1


def test_non_json_data_lines(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(mode="non_json")))
    outcome = run_doctor(capsys, *against(server))
    assert outcome.status("stream") == "pass"
    chunks = outcome.check("chunks")
    assert chunks["status"] == "fail"
    assert "not json at all" in chunks["summary"]
    assert outcome.code == 1


def test_chunks_without_choices(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(mode="no_choices")))
    outcome = run_doctor(capsys, *against(server))
    chunks = outcome.check("chunks")
    assert chunks["status"] == "fail"
    assert "choices[0]" in chunks["summary"]
    assert outcome.code == 1


def test_empty_choices_only_warn(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(mode="empty_choices")))
    outcome = run_doctor(capsys, *against(server))
    assert outcome.status("chunks") == "warn"
    assert outcome.code == 0


def test_slow_long_prompt_warns_without_failing(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour(long_prompt_delay_s=0.2)))
    outcome = run_doctor(capsys, *against(server, "--ttft-warn-ms", "50"))
    ttft = outcome.check("ttft")
    assert ttft["status"] == "warn"
    assert "above ttft_warn_ms (50 ms)" in ttft["summary"]
    assert ttft["details"]["long_ttft_ms"] >= 200
    assert outcome.code == 0


def test_long_prompt_shrinks_to_the_servers_limit(serve: Serve, capsys: Capsys) -> None:
    behaviour = Behaviour(max_prompt_chars=800)
    server = serve(fake_app(behaviour))
    outcome = run_doctor(capsys, *against(server))
    ttft = outcome.check("ttft")
    assert ttft["status"] == "pass"
    assert ttft["details"]["words"] < 300
    assert behaviour.prompts[-1] <= 800


def test_a_repeat_run_measures_a_real_prefill_and_reports_the_cache_apart(
    serve: Serve, capsys: Capsys
) -> None:
    server = serve(fake_app(Behaviour(long_prompt_delay_s=0.2, prompt_cache=True)))
    runs = [run_doctor(capsys, *against(server)).check("ttft") for _ in range(2)]
    for ttft in runs:
        details = ttft["details"]
        assert details["long_ttft_ms"] >= 200  # the modelled prefill, not a cache hit
        assert details["long_cached_tokens"] == 0
        assert details["repeat_cached_tokens"] == details["long_prompt_tokens"] - 1
        assert details["repeat_ttft_ms"] is not None
    assert "0 from the prompt cache" in runs[1]["summary"]
    assert "the same request again" in runs[1]["summary"]


# -- network and proxies -----------------------------------------------------------


def test_connection_refused(capsys: Capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    outcome = run_doctor(capsys, "--base-url", url, "--api-key", KEY, "--model", MODEL)
    reach = outcome.check("reachable")
    assert reach["status"] == "fail"
    assert reach["details"]["kind"] == "refused"
    assert "edge-llm serve" in reach["fix"]
    assert outcome.status("auth") == "skip"
    assert outcome.code == 1


def test_dns_failure(capsys: Capsys) -> None:
    outcome = run_doctor(capsys, "--base-url", "http://doctor-test.invalid:8000/v1")
    reach = outcome.check("reachable")
    assert reach["status"] == "fail"
    assert reach["details"]["kind"] == "dns"
    assert outcome.code == 1


def test_dead_local_proxy(serve: Serve, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    server = serve(fake_app(Behaviour()))
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HTTPS_PROXY", dead)
    monkeypatch.setenv("HTTP_PROXY", dead)
    outcome = run_doctor(capsys, *against(server))
    check = outcome.check("proxy")
    assert check["status"] == "fail"
    assert check["summary"].startswith("local proxy failed: HTTP_PROXY=")
    assert "NO_PROXY=127.0.0.1" in check["fix"]
    assert "do not add a proxy" in check["fix"]
    # every other check went direct and passed
    assert {k: v for k, v in outcome.statuses().items() if k != "proxy"} == {
        k: v for k, v in ALL_PASS.items() if k != "proxy"
    }
    assert outcome.code == 1


def test_proxy_exempted_by_no_proxy(
    serve: Serve, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(fake_app(Behaviour()))
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    outcome = run_doctor(capsys, *against(server))
    assert outcome.status("proxy") == "pass"
    assert "no_proxy exempts" in outcome.check("proxy")["summary"]
    assert outcome.code == 0


def test_proxy_that_cannot_reach_the_engine(
    serve: Serve, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(fake_app(Behaviour()))
    gateway = serve(failing_proxy_app())
    monkeypatch.setenv("http_proxy", gateway.url)
    outcome = run_doctor(capsys, *against(server))
    check = outcome.check("proxy")
    assert check["status"] == "fail"
    assert "HTTP 502 from the proxy" in check["summary"]
    assert outcome.code == 1


def test_working_proxy_passes(
    serve: Serve, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(fake_app(Behaviour()))
    # The fake server itself answers absolute-form requests, as a forwarding proxy would.
    monkeypatch.setenv("http_proxy", server.url)
    outcome = run_doctor(capsys, *against(server))
    assert outcome.status("proxy") == "pass"
    assert outcome.code == 0


# -- URL and settings --------------------------------------------------------------


def test_trailing_slash_fails_but_the_rest_runs(serve: Serve, capsys: Capsys) -> None:
    server = serve(fake_app(Behaviour()))
    argv = ["--base-url", server.url + "/v1/", "--api-key", KEY, "--model", MODEL]
    outcome = run_doctor(capsys, *argv)
    assert outcome.status("base_url") == "fail"
    assert outcome.check("base_url")["fix"] == f"set the base URL to {server.url}/v1"
    assert outcome.status("stream") == "pass"
    assert outcome.code == 1


def test_unusable_url_skips_the_network(capsys: Capsys) -> None:
    outcome = run_doctor(capsys, "--base-url", "localhost:8000/v1")
    assert outcome.status("base_url") == "fail"
    assert outcome.status("reachable") == "skip"
    assert outcome.code == 1


def test_values_come_from_the_client_json_and_env(
    serve: Serve, capsys: Capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = serve(fake_app(Behaviour()))
    config = tmp_path / "client.json"
    section = {"base_url": server.url + "/v1", "api_key": "sk-wrong", "model_id": MODEL}
    config.write_text(json.dumps({"edge_llm_client": section}), encoding="utf-8")
    monkeypatch.setenv("EDGE_LLM_API_KEY", KEY)
    outcome = run_doctor(capsys, "--config", str(config))
    assert outcome.report["settings"]["base_url"]["source"] == str(config)
    assert outcome.report["settings"]["api_key"]["source"] == "EDGE_LLM_API_KEY"
    assert KEY not in json.dumps(outcome.report)  # the key is masked
    assert outcome.code == 0


def test_unreadable_config_is_exit_2(capsys: Capsys, tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    parser = argparse.ArgumentParser()
    doctor.register(parser.add_subparsers())
    assert doctor.run(parser.parse_args(["doctor", "--config", str(missing)])) == 2
    assert "cannot read client config" in capsys.readouterr().err
