"""Background responses with the real model, through the official openai SDK unchanged:
poll, a stream dropped and resumed with ``starting_after``, cancel, another key, and
the 404 after the retention period (one server, two keys, a short retention); one
queued behind foreground work past ttft_timeout_ms still answers (a server of one slot)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from conftest import EngineProcess, start_engine
from support import STORY

pytestmark = pytest.mark.e2e

RETENTION_MS = 3000
TTFT_MS = 1500
KEY, OTHER_KEY = "key-one", "key-two"
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    engine = start_engine(
        tmp_path_factory.mktemp("background"),
        "--background-retention-ms", str(RETENTION_MS),
        "--api-key", KEY, "--api-key", OTHER_KEY,
    )  # fmt: skip
    yield engine
    engine.stop()


def sdk(engine: EngineProcess, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.base_url, api_key=key, max_retries=0)


def debug_streams(engine: EngineProcess) -> dict[str, Any]:
    request = urllib.request.Request(
        engine.url + "/debug/streams", headers={"Authorization": f"Bearer {KEY}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def until_ended(client: openai.OpenAI, response_id: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        time.sleep(0.05)
    raise AssertionError(f"{response_id} still {response.status}")


def test_background_poll(server: EngineProcess) -> None:
    with sdk(server) as client:
        created = client.responses.create(
            input="Name the capital of France.", background=True, temperature=0,
            max_output_tokens=24,
        )  # fmt: skip
        assert created.status in ("queued", "in_progress") and created.background
        done = until_ended(client, created.id)
    assert done.status == "completed"
    assert "Paris" in done.output_text
    assert done.usage is not None and done.usage.output_tokens > 0


def test_background_stream_dropped_and_resumed_after_a_sequence_number(
    server: EngineProcess,
) -> None:
    with sdk(server) as client:
        stream = client.responses.create(
            input=STORY, background=True, stream=True, temperature=0, max_output_tokens=60
        )
        first = []
        for event in stream:
            first.append(event)
            if len(first) == 8:
                break
        stream.close()  # the connection drops; the response runs on
        response_id = first[0].response.id
        after = first[-1].sequence_number
        rest = list(client.responses.retrieve(response_id, stream=True, starting_after=after))
        final = client.responses.retrieve(response_id)
    events = first + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.incomplete"  # 60 tokens of a long story
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.status == "incomplete" and final.usage is not None
    assert final.usage.output_tokens == 60
    assert deltas == final.output_text and len(final.output_text) > 20


def test_background_cancel_frees_the_kv(server: EngineProcess) -> None:
    with sdk(server) as client:
        created = client.responses.create(
            input=STORY, background=True, temperature=0, max_output_tokens=400
        )
        deadline = time.monotonic() + DEADLINE_S
        while client.responses.retrieve(created.id).status == "queued":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        cancelled = client.responses.cancel(created.id)
        assert cancelled.status == "cancelled"
        while debug_streams(server)["kv_used_bytes"]:
            assert time.monotonic() < deadline, "the cancelled response kept its KV"
            time.sleep(0.02)
        again = client.responses.retrieve(created.id)
        assert again.status == "cancelled"
        assert again.usage is None or again.usage.output_tokens < 400
    with sdk(server, OTHER_KEY) as other, pytest.raises(openai.NotFoundError):
        other.responses.retrieve(created.id)  # another key never sees it


def test_background_404_after_retention(server: EngineProcess) -> None:
    with sdk(server) as client:
        created = client.responses.create(input="Hi.", background=True, max_output_tokens=4)
        until_ended(client, created.id)
        ended = time.monotonic()
        deadline = ended + DEADLINE_S
        with pytest.raises(openai.NotFoundError) as missing:
            while time.monotonic() < deadline:
                client.responses.retrieve(created.id)
                time.sleep(0.1)
    assert time.monotonic() - ended >= RETENTION_MS / 1000 * 0.9
    assert "background_retention_ms" in str(missing.value)


def test_background_waits_its_turn_past_the_ttft_time_out(tmp_path: Path) -> None:
    """One slot, held by a foreground stream: a foreground request queued behind it
    fails at ttft_timeout_ms (504); a background one waits (background_ttft_timeout_ms
    is 0: none) and completes once the slot is free."""
    engine = start_engine(tmp_path, "--max-sequences", "1", "--ttft-timeout-ms", str(TTFT_MS))
    try:
        with sdk(engine) as client:
            holding, stop = threading.Event(), threading.Event()
            reader = threading.Thread(target=_hold_the_slot, args=(client, holding, stop))
            reader.start()
            try:
                assert holding.wait(DEADLINE_S)
                created = client.responses.create(
                    input="Name the capital of France.", background=True, temperature=0,
                    max_output_tokens=24,
                )  # fmt: skip
                with pytest.raises(openai.APIStatusError) as timed_out:
                    client.responses.create(input="Name the capital of Italy.", max_output_tokens=8)
                assert timed_out.value.status_code == 504 and "ttft_timeout" in str(timed_out.value)
                waiting = client.responses.retrieve(created.id)
                assert waiting.status == "queued"  # past ttft_timeout_ms, still waiting its turn
            finally:
                stop.set()
                reader.join(DEADLINE_S)
            done = until_ended(client, created.id)
        assert done.status == "completed" and "Paris" in done.output_text
    finally:
        engine.stop()


def _hold_the_slot(client: openai.OpenAI, holding: threading.Event, stop: threading.Event) -> None:
    """A long foreground stream, read as fast as it comes (never paused) until ``stop``."""
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": STORY}],
        stream=True, max_tokens=2000, extra_body={"ignore_eos": True},
    )  # fmt: skip
    with stream:
        for _ in stream:
            holding.set()
            if stop.is_set():
                break
