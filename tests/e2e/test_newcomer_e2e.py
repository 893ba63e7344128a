"""A newcomer's first mistakes against the real server: a second ``serve`` on a
taken port, chat on a base model without a chat template (Gemma 3 270M), and
``edge-llm chat`` against a server whose model was renamed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from support import gemma_path

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Hello"}]
_FOREIGN_ENV = ("EDGE_LLM_", "OPENAI_")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}


def test_a_second_serve_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "edge_llm", "serve", "--port", str(port)],
            capture_output=True, text=True, timeout=120, env=clean_env(), check=False,
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line, no traceback
    assert proc.stderr.startswith(f"edge-llm serve: port {port} on 127.0.0.1 is already in use")
    assert f"(pid {os.getpid()})" in proc.stderr  # who holds it: this test
    assert "--port" in proc.stderr


@pytest.fixture(scope="module")
def smol_and_gemma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    flags = ["--model-id", "smol", "--model", f"gemma={gemma_path()}",
             "--max-kv-cache-mb", "80", "--ttft-timeout-ms", "60000"]  # fmt: skip
    engine = start_engine(tmp_path_factory.mktemp("newcomer"), *flags, env=clean_env())
    yield engine
    engine.stop()


def post(engine: EngineProcess, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        engine.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_chat_on_a_model_without_a_template_is_refused_naming_completions(
    smol_and_gemma: EngineProcess,
) -> None:
    engine = smol_and_gemma
    listed = {m["id"]: m["chat_template"] for m in engine.get_json("/v1/models")["data"]}
    assert listed == {"smol": True, "gemma": False}
    status, body = post(engine, "/v1/chat/completions",
                        {"model": "gemma", "messages": HELLO, "max_tokens": 8})  # fmt: skip
    assert status == 400, body
    assert body["error"]["code"] == "no_chat_template"
    assert body["error"]["param"] == "messages"
    assert "/v1/completions" in body["error"]["message"]
    warning = engine.wait_for_output(lambda line: "has no chat template" in line)
    assert "WARNING" in warning and "model gemma" in warning
    status, body = post(engine, "/api/chat",
                        {"model": "gemma", "messages": HELLO, "stream": False})  # fmt: skip
    assert status == 400, body
    assert "/api/generate" in body["error"]
    status, body = post(engine, "/v1/completions", {"model": "gemma", "prompt": "Hello",
                                                    "max_tokens": 8, "temperature": 0})  # fmt: skip
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8
    status, body = post(engine, "/v1/chat/completions",
                        {"model": "smol", "messages": HELLO, "max_tokens": 4})  # fmt: skip
    assert status == 200, body


async def test_every_chat_dialect_refuses_a_model_without_a_template(
    smol_and_gemma: EngineProcess,
) -> None:
    engine = smol_and_gemma
    status, body = post(engine, "/v1/messages",
                        {"model": "gemma", "messages": HELLO, "max_tokens": 8})  # fmt: skip
    assert status == 400, body
    assert "/v1/completions" in body["error"]["message"]
    status, body = post(engine, "/v1/responses", {"model": "gemma", "input": "Hello"})
    assert status == 400, body
    assert body["error"]["code"] == "no_chat_template"
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(engine.url.replace("http", "ws") + "/v1/stream") as ws:
            start = {"model": "gemma", "messages": HELLO, "max_tokens": 8}
            await ws.send_json({"type": "start", "request": start})
            frame = await ws.receive_json(timeout=120)
            assert frame["type"] == "error" and frame["code"] == "no_chat_template", frame
            await ws.send_json({"type": "start", "request": {**start, "model": "smol"}})
            assert (await ws.receive_json(timeout=120))["type"] == "started"  # still usable


def test_api_show_says_which_model_has_no_template(smol_and_gemma: EngineProcess) -> None:
    status, gemma = post(smol_and_gemma, "/api/show", {"model": "gemma"})
    assert status == 200
    assert gemma["template"] == ""
    assert gemma["capabilities"] == ["completion"]
    assert "no chat template" in gemma["modelfile"]
    status, smol = post(smol_and_gemma, "/api/show", {"model": "smol"})
    assert smol["template"] and "tools" in smol["capabilities"]
    assert "no chat template" not in smol["modelfile"]


def test_chat_cli_answers_from_a_renamed_model_without_model_or_v1(
    smol_and_gemma: EngineProcess,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_llm", "chat", "--base-url", smol_and_gemma.url,
         "--max-tokens", "16", "--temperature", "0", "Name the capital of France."],
        capture_output=True, text=True, timeout=240, env=clean_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert proc.stderr == ""  # no model_not_found, no "base_url had no path" warning


def test_doctor_without_a_model_passes_against_a_renamed_model(
    smol_and_gemma: EngineProcess,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_llm", "doctor", "--base-url", smol_and_gemma.url],
        capture_output=True, text=True, timeout=240, env=clean_env(), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model     none set (the server's default model)  (from default)" in proc.stdout
    assert "PASS  model      no model set: requests name none" in proc.stdout
    assert "served: smol, gemma" in proc.stdout
