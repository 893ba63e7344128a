"""POST /v1/messages with the real model, through the official anthropic SDK unchanged.

The SDK appends ``/v1/messages`` to its base URL, so it gets the engine's root
URL (what ``ANTHROPIC_BASE_URL`` holds for Claude Code), not ``…/v1``. The
model ids sent are not the served one on purpose: any id is accepted.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import anthropic
import pytest

from edge_llm.protocol.sse import SSEParser

from support import anthropic_sdk, served_model

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "Name the capital of France."}]
FOREIGN_MODEL = "claude-sonnet-4-5"  # what Claude Code sends unless ANTHROPIC_MODEL is set
# This SDK version has no temperature parameter; it is still sent as a body field.
GREEDY = {"temperature": 0}


def test_sdk_non_streaming_and_streaming(engine_server: Any) -> None:
    with anthropic_sdk(engine_server) as client:
        reply = client.messages.create(
            model=FOREIGN_MODEL, max_tokens=24, extra_body=GREEDY, messages=QUESTION
        )
        assert reply.type == "message"
        assert reply.role == "assistant"
        assert reply.model == served_model(engine_server)
        assert reply.id.startswith("msg_")
        text = "".join(block.text for block in reply.content if block.type == "text")
        assert "Paris" in text
        assert reply.stop_reason in ("end_turn", "max_tokens")
        assert reply.usage.input_tokens > 0
        assert 0 < reply.usage.output_tokens <= 24

        with client.messages.stream(
            model=FOREIGN_MODEL, max_tokens=24, extra_body=GREEDY, messages=QUESTION
        ) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert kinds[:2] == ["message_start", "content_block_start"]
        assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert "content_block_delta" in kinds
        assert final.content[0].type == "text"
        assert final.content[0].text == text  # the same greedy answer either way
        assert final.stop_reason == reply.stop_reason
        assert final.usage.output_tokens == reply.usage.output_tokens


def raw_events(url: str, body: dict[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    request = urllib.request.Request(
        url + "/v1/messages",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"},
    )
    parser = SSEParser()
    with urllib.request.urlopen(request, timeout=120) as response:
        content_type = response.headers["Content-Type"]
        events = parser.feed(response.read()) + parser.close()
    return content_type, [(e.event or "", json.loads(e.data)) for e in events]


def test_raw_event_sequence(engine_server: Any) -> None:
    body = {"model": "x", "max_tokens": 8, "temperature": 0, "messages": QUESTION, "stream": True}
    content_type, events = raw_events(engine_server.url, body)
    assert content_type.startswith("text/event-stream")
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    middle = set(names[3:-3])
    assert middle <= {"content_block_delta", "ping"}
    assert "content_block_delta" in middle
    assert all(payload["type"] == name for name, payload in events)
    deltas = [p["delta"] for n, p in events if n == "content_block_delta"]
    assert all(delta["type"] == "text_delta" for delta in deltas)
    assert events[-2][1]["usage"]["output_tokens"] >= len(deltas)


def test_max_tokens_and_stop_sequences(engine_server: Any) -> None:
    with anthropic_sdk(engine_server) as client:
        short = client.messages.create(
            model="m", max_tokens=3, extra_body=GREEDY, messages=QUESTION
        )
        assert short.stop_reason == "max_tokens"
        assert short.usage.output_tokens == 3

        full = client.messages.create(
            model="m", max_tokens=24, extra_body=GREEDY, messages=QUESTION
        )
        text = full.content[0].text
        assert "Paris" in text
        stopped = client.messages.create(
            model="m",
            max_tokens=24,
            extra_body=GREEDY,
            messages=QUESTION,
            stop_sequences=["Paris", "zzzz-never"],
        )
        assert stopped.stop_reason == "stop_sequence"
        assert stopped.stop_sequence == "Paris"
        assert "".join(b.text for b in stopped.content) == text[: text.index("Paris")]


def test_invalid_requests_get_anthropic_errors(engine_server: Any) -> None:
    with anthropic_sdk(engine_server) as client:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="m", max_tokens=0, messages=QUESTION)
        assert isinstance(info.value.body, dict)
        assert info.value.body["type"] == "error"
        assert info.value.body["error"]["type"] == "invalid_request_error"
        assert info.value.body["error"]["param"] == "max_tokens"
        image = {"type": "image", "source": {"type": "url", "url": "http://example.com/x.png"}}
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": [image]}]
            )
        assert "'image' is not supported" in str(info.value)


def test_superseded_stream_ends_with_an_error_event(engine_server: Any) -> None:
    with anthropic_sdk(engine_server) as client:
        counting = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
        session = {"X-Session-Id": "e2e-anthropic-supersede"}
        with client.messages.stream(
            model="m", max_tokens=32, extra_body=GREEDY, messages=counting, extra_headers=session
        ) as stream:
            events = iter(stream)
            while next(events).type != "content_block_delta":
                pass
            # The same session again: the engine cancels the first stream (superseded).
            client.messages.create(
                model="m", max_tokens=1, extra_body=GREEDY, messages=counting, extra_headers=session
            )
            with pytest.raises(anthropic.APIStatusError) as info:
                for _ in events:
                    pass
        assert isinstance(info.value.body, dict)
        assert info.value.body["error"]["code"] == "cancelled"
        assert info.value.body["error"]["reason"] == "superseded"


def test_api_key_as_x_api_key_or_bearer(engine_factory: Any) -> None:
    engine = engine_factory("--api-key", "sk-test")
    for options in ({"api_key": "sk-test"}, {"auth_token": "sk-test", "api_key": None}):
        with anthropic_sdk(engine, **options) as client:
            reply = client.messages.create(model="m", max_tokens=2, messages=QUESTION)
        assert reply.usage.output_tokens > 0
    wrong = anthropic_sdk(engine, api_key="sk-wrong")
    with wrong as client, pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="m", max_tokens=2, messages=QUESTION)
