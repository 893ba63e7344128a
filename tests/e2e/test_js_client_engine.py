"""`@edge-llm/client` (clients/js) against the real engine, from a fresh Node project
that installed the packed package: a renderer that waits for the high watermark holds
the stream (WS PAUSE, SSE reading stopped) and gets every token once; a 1 ms TTFT
time-out cancels (WS CANCEL, SSE DELETE of the resumable stream) and the engine frees
the stream; a stream resumes through connection drops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from drop_proxy import DropProxy
from e2e.support import complete, served_model, wait_until
from js_client import PACKAGE, check, node_flags, run

from conftest import EngineProcess, start_engine

pytestmark = pytest.mark.e2e
SCENARIOS = PACKAGE / "test" / "e2e" / "scenarios.mjs"
STORY = [{"role": "user", "content": "Write a long story about a dragon who learns to bake."}]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new Node project with the package installed from its packed folder."""
    root = tmp_path_factory.mktemp("js-project")
    packed = check(run("npm", "pack", "--silent", "--pack-destination", str(root)))
    tarball = root / packed.strip().splitlines()[-1]
    (root / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    check(run("npm", "install", "--no-audit", "--no-fund", "--offline", str(tarball), cwd=root))
    (root / "scenarios.mjs").write_text(SCENARIOS.read_text("utf-8"))
    yield root


@pytest.fixture(scope="module")
def exact_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """A ``deterministic`` engine: a stream's text is compared with another run's, which
    the default mode does not promise (a near-tie may break another way under another
    thread count, batch shape or draft)."""
    engine = start_engine(
        tmp_path_factory.mktemp("exact-engine"), "--deterministic", "--max-pause-ms", "600000"
    )
    yield engine
    engine.stop()


async def scenario(project: Path, name: str, **args: Any) -> dict[str, Any]:
    """Run one scenario in node (off the loop, which may serve a proxy meanwhile)."""
    argv = ("node", *node_flags(), "scenarios.mjs", name, json.dumps(args))
    result = await asyncio.to_thread(run, *argv, cwd=project, timeout=280)
    return dict(json.loads(check(result).strip().splitlines()[-1]))


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_renderer_that_waits_for_the_high_mark_holds_the_stream_and_gets_every_token_once(
    project: Path, exact_engine: EngineProcess, transport: str
) -> None:
    out = await scenario(
        project, "slow", base_url=exact_engine.base_url, model_id=served_model(exact_engine),
        transport=transport, max_tokens=40, capacity=8,
    )  # fmt: skip
    assert out["text"] == out["reference"]
    assert out["n_tokens"] == 40
    assert out["pauses"] >= 1
    # The hold starts on the token that reached the high mark, not later.
    assert out["queue_at_pause"] and set(out["queue_at_pause"]) == {out["high_mark"]}
    if transport == "ws":
        assert {"pause_sent", "resume_sent", "server_paused"} <= set(out["events"])
        stats = out["server_stats"]
        assert stats["pauses"] == out["pauses"]
        assert stats["tokens_while_paused"] <= stats["pauses"]  # <= 1 token after each PAUSE
    else:
        assert {"read_paused", "read_resumed"} <= set(out["events"])


@pytest.mark.parametrize(("transport", "method"), [("ws", "frame"), ("sse", "delete")])
async def test_a_1ms_hard_timeout_cancels_and_the_engine_frees_the_stream(
    project: Path, engine_server: EngineProcess, transport: str, method: str
) -> None:
    session = f"js-ttft-1ms-{transport}"
    out = await scenario(
        project, "ttft", base_url=engine_server.base_url,
        model_id=served_model(engine_server), session=session, transport=transport,
    )  # fmt: skip
    assert out == {"error": "ttft_timeout", "typed": True, "cancels": [["ttft_timeout", method]]}

    def ended() -> list[dict[str, Any]]:
        streams = engine_server.debug_streams()["streams"]
        return [s for s in streams if s["session"] == session and s["state"] == "cancelled"]

    # Over SSE a resumable stream only detached (KV kept for resume_grace_ms) until the
    # client sent DELETE /v1/streams/{id}.
    stream = (await wait_until(ended, what="the engine cancels the stream"))[0]
    assert stream["cancel_reason"] == "client"
    assert stream["kv_tokens"] == 0
    if transport == "ws":  # the CANCEL frame follows the start frame at once
        assert not engine_server.events_of("first_token", stream["id"])


@pytest.mark.parametrize("transport", ["ws", "sse"])
async def test_a_stream_resumes_through_dropped_connections(
    project: Path, exact_engine: EngineProcess, transport: str
) -> None:
    body = {"messages": STORY, "max_tokens": 60, "temperature": 0, "ignore_eos": True}
    reference = (await complete(exact_engine.url, body))["choices"][0]["message"]["content"]
    proxy = DropProxy(int(exact_engine.url.rsplit(":", 1)[1]), seed=64, cut=(400, 1200))
    url = await proxy.start()
    try:
        out = await scenario(
            project, "drop", base_url=url + "/v1", model_id=served_model(exact_engine),
            transport=transport, max_tokens=60,
        )  # fmt: skip
    finally:
        await proxy.close()
    assert proxy.resets >= 1
    assert out["resumes"] >= 1
    assert out["attempts"] == 1
    assert out["text"] == reference
    assert len(exact_engine.events_of("admitted", out["request_id"])) == 1
