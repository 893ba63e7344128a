"""The real Claude Code and Codex CLIs against the engine with the embedded model.

What a user meets: in a configuration that fits the 135M model's context each
CLI completes a round trip and prints an answer; with its full default prompt
each gets the engine's 400 ``prompt_too_long`` and shows that message verbatim.
The request shapes each CLI really sends are captured by a local capture server
and compared with the recorded fixtures in ``tests/data/agents`` (refreshed with
``EDGE_LLM_REFRESH_AGENT_FIXTURES=1`` when the pinned versions change); the
recorded full-size requests must pass the engine's validation, so that only the
token limit refuses them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from edge_llm.protocol import anthropic

from agent_clis import (
    REFRESH_ENV,
    SHORT_SYSTEM,
    capture_server,
    claude_env,
    cli_path,
    cli_version,
    codex_env,
    codex_small_prompt_args,
    fixture_path,
    load_fixture,
    run_cli,
    save_fixture,
    shape,
)
from conftest import EngineProcess, start_engine
from support import logged_since

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CLAUDE_DEFAULT = "claude-code-default"
CODEX_DEFAULT = "codex-default"
CODEX_EXEC = ("exec", "--skip-git-repo-check", "--color", "never")
PROMPT_TOO_LONG = re.compile(
    r"prompt has (\d+) tokens, more than (?:max_prompt_tokens|the model's context leaves "
    r"room for) \((\d+)\): shorten the prompt \(nothing is truncated\)"
)


@pytest.fixture(scope="module")
def greedy_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """The seed's engine whose default temperature is 0. Claude Code sends none, and at
    the default 0.2 the model sometimes rambles until the context is full; Claude Code
    then asks it to go on, in a prompt past the 512-token limit (seen in a full run)."""
    engine = start_engine(
        tmp_path_factory.mktemp("greedy"), "--max-pause-ms", "600000", "--default-temperature", "0"
    )
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def roomy_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """An engine whose prompt limit is raised past the model's context (8,192), so
    that only the context can refuse a prompt."""
    engine = start_engine(
        tmp_path_factory.mktemp("roomy"),
        "--max-prompt-tokens", "16384",
        "--max-sequences", "1",  # one slot holding the whole KV budget: past the context
        "--ttft-timeout-ms", "120000",  # a 500-token prefill on a loaded machine
    )  # fmt: skip
    yield engine
    engine.stop()


def workdir(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    cwd = home / "work"
    cwd.mkdir(parents=True)
    return home, cwd


def check_against_fixture(name: str, request: dict[str, Any]) -> None:
    """Record the capture when asked to (or when there is none yet), else check
    that the CLI still sends what the fixture holds."""
    if os.environ.get(REFRESH_ENV) or not fixture_path(name).exists():
        save_fixture(name, request)
        return
    recorded = load_fixture(name)
    assert cli_version(request["headers"]) == cli_version(recorded["headers"]), (
        f"the CLI version changed: refresh the fixtures with {REFRESH_ENV}=1"
    )
    assert shape(request["body"]) == shape(recorded["body"])


async def post_json(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


def assert_only_the_token_limit_refuses(status: int, payload: dict[str, Any]) -> None:
    assert status == 400, payload
    error = payload["error"]
    assert error["code"] == "prompt_too_long", error
    assert error["n_prompt_tokens"] > error["max_prompt_tokens"]


def test_a_missing_cli_skips_here_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-cli CLI unavailable"):
        cli_path("no-such-cli")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        cli_path("no-such-cli")


# -- Claude Code --------------------------------------------------------------------------


async def test_claude_code_default_request_is_recorded(tmp_path: Path) -> None:
    claude = cli_path("claude")
    home, cwd = workdir(tmp_path)
    async with capture_server() as capture:
        run = await run_cli(claude, ["-p", "Say hello."], claude_env(home, capture.url), cwd)
    assert run.returncode != 0
    assert "capture server: request recorded" in run.output  # API errors reach the user
    request = capture.first("/v1/messages")
    body = request["body"]
    assert body["thinking"]["type"] in ("adaptive", "enabled", "disabled")
    assert any(message["role"] == "system" for message in body["messages"])
    anthropic.parse_request(body)  # validation passes
    check_against_fixture(CLAUDE_DEFAULT, request)


async def test_recorded_claude_code_request_is_refused_only_for_its_length(
    engine_server: Any,
) -> None:
    body = load_fixture(CLAUDE_DEFAULT)["body"]
    status, payload = await post_json(engine_server.url + "/v1/messages", body)
    assert_only_the_token_limit_refuses(status, payload)
    assert payload["type"] == "error"


async def test_claude_code_round_trip_on_the_embedded_model(
    greedy_engine: EngineProcess, tmp_path: Path
) -> None:
    """Print mode without tools fits SmolLM2's context and the seed's 512-token
    prompt limit; Claude Code's max_tokens of 32000 is granted what fits."""
    claude = cli_path("claude")
    home, cwd = workdir(tmp_path)
    before = len(greedy_engine.events())
    args = ["-p", "Say hello.", "--bare", "--tools", "", "--system-prompt", SHORT_SYSTEM]
    run = await run_cli(claude, args, claude_env(home, greedy_engine.url), cwd)
    assert run.returncode == 0, run.output
    assert run.stdout.strip(), run.output
    events = await logged_since(greedy_engine, before)
    clamped = [e for e in events if e["event"] == "max_tokens_clamped"]
    assert clamped and clamped[0]["requested"] == 32000, clamped
    admitted = [e for e in events if e["event"] == "admitted"]
    assert len(admitted) == 1, admitted  # one call, retries off
    report = {"answer": run.stdout.strip(), "n_prompt_tokens": admitted[0]["n_prompt_tokens"]}
    print(json.dumps({"claude_code": report, "clamped": clamped[0]}))


async def test_claude_code_shows_prompt_too_long_verbatim(
    engine_server: Any, tmp_path: Path
) -> None:
    claude = cli_path("claude")
    home, cwd = workdir(tmp_path)
    run = await run_cli(claude, ["-p", "Say hello."], claude_env(home, engine_server.url), cwd)
    assert run.returncode != 0
    found = PROMPT_TOO_LONG.search(run.output)
    assert found, run.output
    assert int(found[1]) > int(found[2]) == 512
    print(json.dumps({"claude_code_error": run.output.strip()}))


# -- Codex ----------------------------------------------------------------------------------


async def test_codex_default_request_is_recorded(tmp_path: Path) -> None:
    codex = cli_path("codex")
    home, cwd = workdir(tmp_path)
    async with capture_server() as capture:
        args = [*CODEX_EXEC, "Say hello."]
        run = await run_cli(codex, args, codex_env(home, capture.url), cwd)
    assert run.returncode != 0
    assert "capture server: request recorded" in run.output
    request = capture.first("/v1/responses")
    body = request["body"]
    for name in ("reasoning", "include", "prompt_cache_key", "client_metadata", "tools"):
        assert name in body, name
    assert body["store"] is False
    assert {item.get("role") for item in body["input"]} >= {"developer", "user"}
    check_against_fixture(CODEX_DEFAULT, request)


async def test_recorded_codex_request_is_refused_only_for_its_length(
    roomy_engine: EngineProcess,
) -> None:
    body = load_fixture(CODEX_DEFAULT)["body"]
    status, payload = await post_json(roomy_engine.base_url + "/responses", body)
    assert_only_the_token_limit_refuses(status, payload)
    assert payload["error"]["max_prompt_tokens"] == 8191  # the context, not the setting


async def test_codex_round_trip_on_the_embedded_model(
    roomy_engine: EngineProcess, tmp_path: Path
) -> None:
    """Codex with its prompt shrunk to fit (short instructions, no shell, patch,
    web, skills or environment sections) answers through /v1/responses."""
    codex = cli_path("codex")
    home, cwd = workdir(tmp_path)
    args = [*CODEX_EXEC, *codex_small_prompt_args(home), "Say hello."]
    before = len(roomy_engine.events())
    run = await run_cli(codex, args, codex_env(home, roomy_engine.url), cwd)
    assert run.returncode == 0, run.output
    assert run.stdout.strip(), run.output
    admitted = [e for e in await logged_since(roomy_engine, before) if e["event"] == "admitted"]
    assert len(admitted) == 1, admitted  # one call, retries off
    report = {"answer": run.stdout.strip(), "n_prompt_tokens": admitted[0]["n_prompt_tokens"]}
    print(json.dumps({"codex": report}))


async def test_codex_shows_prompt_too_long_verbatim(
    roomy_engine: EngineProcess, tmp_path: Path
) -> None:
    codex = cli_path("codex")
    home, cwd = workdir(tmp_path)
    args = [*CODEX_EXEC, "Say hello."]
    run = await run_cli(codex, args, codex_env(home, roomy_engine.url), cwd)
    assert run.returncode != 0
    found = PROMPT_TOO_LONG.search(run.output)
    assert found, run.output
    assert int(found[1]) > int(found[2]) == 8191
    print(json.dumps({"codex_error": run.output.strip()[-400:]}))
