"""``edge-llm chat``, the SDK and ``doctor`` name a model only when the user set one:
a server started with ``--model-id smol`` answers them (a default id would be 404),
and the documented base URL without ``/v1`` is taken without a warning."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_client_chat_cli import Start, run_chat, serve_in_thread, sse_app

from edge_llm.cli.doctor import render
from edge_llm.client import ClientConfig, StreamClient
from edge_llm.client.address import normalise_base_url
from edge_llm.doctor import api_checks
from edge_llm.doctor.probe import Reply
from edge_llm.doctor.result import Status
from edge_llm.doctor.settings import resolve

__all__ = ["serve_in_thread"]  # the fixture, used by name

QUESTION = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def no_model_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EDGE_LLM_MODEL", "OPENAI_MODEL", "EDGE_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_chat_without_model_sends_none_and_warns_of_nothing(
    serve_in_thread: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda _: ["Hello"], bodies))
    root = url.removesuffix("/v1")  # the form --help documents: with or without /v1
    assert run_chat("--base-url", root, "hi") == 0
    captured = capsys.readouterr()
    assert captured.out == "Hello\n"
    assert "model" not in bodies[0]
    assert captured.err == ""
    assert run_chat("--base-url", root, "--model", "smol", "hi") == 0
    assert bodies[1]["model"] == "smol"


async def test_the_sdk_sends_a_model_only_when_configured(serve_in_thread: Start) -> None:
    bodies: list[dict[str, Any]] = []
    url = serve_in_thread(sse_app(lambda _: ["ok"], bodies))
    async with StreamClient(ClientConfig(base_url=url, api_key="")) as client:
        assert (await client.complete(QUESTION)).text == "ok"
    async with StreamClient(ClientConfig(base_url=url, api_key="", model_id="smol")) as client:
        await client.complete(QUESTION)
    assert "model" not in bodies[0]
    assert bodies[1]["model"] == "smol"


def test_a_base_url_without_a_path_gets_v1_silently() -> None:
    assert normalise_base_url("http://127.0.0.1:8000") == ("http://127.0.0.1:8000/v1", [])
    assert normalise_base_url("http://127.0.0.1:8000/v1/")[1] == [
        "base_url had a trailing slash; removed"
    ]


def test_doctor_with_no_model_set_checks_what_the_server_serves() -> None:
    settings = resolve({}, None, env={})
    assert (settings.model.value, settings.model.source) == ("", "default")
    listing = json.dumps({"object": "list", "data": [{"id": "smol"}, {"id": "gemma"}]})
    outcome = api_checks.diagnose_models(Reply(200, "application/json", listing.encode()), "", "U")
    assert outcome.result.status is Status.PASS
    assert outcome.result.summary.startswith("no model set: requests name none")
    assert "served: smol, gemma" in outcome.result.summary
    assert outcome.model == "smol"  # the stream checks ask the first listed model
    assert "model     none set (the server's default model)  (from default)" in render(
        settings, [outcome.result], 0
    )
