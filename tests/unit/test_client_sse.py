"""Chunk decoding of the client SDK (the bytes are parsed by protocol/sse.py), and the SSE
cases of tests/data/sse_cases.json that the JavaScript client's tests run too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edge_llm.client.errors import (
    ClientError,
    EventTooLargeError,
    MalformedChunkError,
    ServerStreamError,
)
from edge_llm.client.sse import SSEEvent, SSEParser, parse_chunk, read_events


def test_read_events_maps_an_oversized_event_to_the_clients_error() -> None:
    parser = SSEParser(max_event_bytes=10)
    assert read_events(parser, b"data: 12345\n\n") == [SSEEvent(None, "12345")]
    with pytest.raises(EventTooLargeError) as info:
        read_events(parser, b"data: 12345\ndata: 67890\n")
    assert info.value.code == "event_too_large"


def test_read_events_flushes_the_last_event_at_end_of_stream() -> None:
    parser = SSEParser()
    assert read_events(parser, b"data: tail") == []
    assert read_events(parser, b"") == [SSEEvent(None, "tail")]


# --- parse_chunk ---------------------------------------------------------------------


def chunk_event(obj: object) -> SSEEvent:
    return SSEEvent(None, json.dumps(obj))


def test_parse_chunk_content_and_id() -> None:
    chunk = parse_chunk(
        chunk_event({"id": "r1", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})
    )
    assert chunk is not None
    assert (chunk.id, chunk.content, chunk.role, chunk.finish_reason) == ("r1", "Hi", None, None)


def test_parse_chunk_role_only_first_chunk_has_no_content() -> None:
    chunk = parse_chunk(
        chunk_event({"id": "r", "choices": [{"delta": {"role": "assistant", "content": ""}}]})
    )
    assert chunk is not None
    assert chunk.content == ""
    assert chunk.role == "assistant"


def test_parse_chunk_usage_chunk_with_empty_or_missing_choices() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    for body in ({"choices": [], "usage": usage}, {"usage": usage}, {"choices": None}):
        chunk = parse_chunk(chunk_event(body))
        assert chunk is not None
        assert chunk.content == ""
    chunk = parse_chunk(chunk_event({"choices": [], "usage": usage}))
    assert chunk is not None
    assert chunk.usage == usage


def test_parse_chunk_finish_reason_and_legacy_text() -> None:
    chunk = parse_chunk(chunk_event({"choices": [{"text": "x", "finish_reason": "stop"}]}))
    assert chunk is not None
    assert (chunk.content, chunk.finish_reason) == ("x", "stop")


def test_parse_chunk_done_is_none() -> None:
    assert parse_chunk(SSEEvent(None, "[DONE]")) is None


def test_parse_chunk_error_in_200_stream_raises_typed_error() -> None:
    event = chunk_event({"error": {"message": "boom", "type": "server_error", "code": "kv_x"}})
    with pytest.raises(ServerStreamError) as info:
        parse_chunk(event)
    assert info.value.code == "server_error"
    assert info.value.server_code == "kv_x"
    assert "boom" in str(info.value)


def test_parse_chunk_error_as_bare_string() -> None:
    with pytest.raises(ServerStreamError, match="overloaded"):
        parse_chunk(chunk_event({"error": "overloaded"}))


@pytest.mark.parametrize("data", ["not json", "[1, 2]", '"text"'])
def test_parse_chunk_non_object_raises_malformed(data: str) -> None:
    with pytest.raises(MalformedChunkError):
        parse_chunk(SSEEvent(None, data))


# --- the cases shared with the JavaScript client ----------------------------------------

CASES = json.loads((Path(__file__).parents[1] / "data" / "sse_cases.json").read_text("utf-8"))


def read_bytes(read: str | dict[str, str]) -> bytes:
    return bytes.fromhex(read["hex"]) if isinstance(read, dict) else read.encode()


@pytest.mark.parametrize("case", CASES["parser"], ids=[c["name"] for c in CASES["parser"]])
def test_shared_sse_case(case: dict[str, Any]) -> None:
    bounds = {k: case[k] for k in ("max_line_bytes", "max_event_bytes") if k in case}
    parser = SSEParser(**bounds)
    events: list[SSEEvent] = []
    try:
        for read in case["reads"]:
            events += read_events(parser, read_bytes(read))
        events += read_events(parser, b"")
    except ClientError as exc:
        assert exc.code == case.get("error"), exc
        return
    assert "error" not in case, f"expected {case['error']}, got {events}"
    assert [{"event": e.event, "data": e.data, "id": e.id} for e in events] == case["events"]
    assert parser.comments == case.get("comments", 0)
    assert parser.retry_ms == case.get("retry_ms")


@pytest.mark.parametrize("case", CASES["chunks"], ids=[c["name"] for c in CASES["chunks"]])
def test_shared_chunk_case(case: dict[str, Any]) -> None:
    try:
        chunk = parse_chunk(SSEEvent(None, case["data"]))
    except ClientError as exc:
        assert exc.code == case.get("error"), exc
        if "server_code" in case:
            assert exc.server_code == case["server_code"]
        return
    assert "error" not in case
    got = None
    if chunk is not None:
        got = {"id": chunk.id, "content": chunk.content, "finish_reason": chunk.finish_reason,
               "usage": chunk.usage}  # fmt: skip
    assert got == case["chunk"]
