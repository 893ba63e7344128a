"""The access log of a real ``edge-llm serve``: one line per request, off with a flag."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from conftest import EngineFactory, EngineProcess

pytestmark = pytest.mark.e2e

CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


def chat(engine: EngineProcess) -> tuple[str, dict[str, Any]]:
    request = urllib.request.Request(
        engine.base_url + "/chat/completions",
        data=json.dumps(CHAT).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return response.headers["X-Request-Id"], json.loads(response.read())


def test_each_request_prints_one_access_line(engine_server: EngineProcess) -> None:
    request_id, body = chat(engine_server)
    line = engine_server.wait_for_output(lambda text: request_id in text)
    usage = body["usage"]
    assert " INFO edge_llm.access: " in line
    assert f"{request_id} POST /v1/chat/completions 200 ttft_ms=" in line
    tokens = f"tokens={usage['prompt_tokens']}/{usage['completion_tokens']}"
    ending = f"end={body['choices'][0]['finish_reason']} backend=local"
    assert line.rstrip().endswith(f"{tokens} {ending}")


def test_no_access_log_prints_none(engine_factory: EngineFactory) -> None:
    engine = engine_factory("--no-access-log")
    request_id, _ = chat(engine)
    engine.stop()  # everything printed before "stopped" has been read
    printed = engine.output + [engine.printed.get() for _ in range(engine.printed.qsize())]
    assert any("edge-llm: stopped" in line for line in printed)
    assert not [line for line in printed if "edge_llm.access" in line or request_id in line]
