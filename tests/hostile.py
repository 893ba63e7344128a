"""Hostile request bodies and WebSocket frames (hypothesis strategies), the raw
clients that can send them, and the checks every answer must pass.

Bodies are built as text by hand, not by ``json.dumps``, so that they can hold
what a well-behaved encoder never writes: lone surrogate escapes, invalid
escapes, duplicate keys, ``NaN`` and ``1e999``, nesting thousands deep, bytes
that are not UTF-8, truncated documents.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from edge_llm.config.tree import load_config
from edge_llm.engine import build_engine
from edge_llm.observability.events import null_sink
from edge_llm.server.app import create_app
from edge_llm.server.runtime import build_context, engine_settings

from fakes import FakeBackend
from helpers import sse_events

# The fields of vLLM, SGLang and llama-server (SPEC section 20) at valid values: the
# fuzzers mutate them with the rest of the bodies.
DIALECT_FIELDS: dict[str, Any] = {
    "ignore_eos": True,
    "min_tokens": 1,
    "top_k": 40,
    "min_p": 0.05,
    "repetition_penalty": 1.1,
    "stop_token_ids": [2],
    "include_stop_str_in_output": True,
    "no_stop_trim": False,
    "skip_special_tokens": False,
    "cache_prompt": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
    "max_completion_tokens": 3,
    "logprobs": False,
}
# Values of every type and range, each set in turn on each dialect field.
HOSTILE_VALUES: list[Any] = [
    None, True, False, -1, 0, 1, 2**64, -(2**63), 1e308, -1e-308, 0.5, "", "x" * 300,
    [], [2**70], [-1], [0.5], ["2"], list(range(100)), {}, {"a": 1},
]  # fmt: skip
# Valid bodies to mutate, per POST path. A route without one is fuzzed from `{}`. The
# OpenAI routes name no model (the served one answers): a model no server has ("any")
# was refused with 404 before anything else, so no unmutated body reached a stream.
BASE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
        "stop": ["\n\n"],
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **DIALECT_FIELDS,
        "continue_final_message": False,
        "add_generation_prompt": True,
    },
    "/v1/completions": {
        "prompt": "Once upon",
        "max_tokens": 3,
        "temperature": 0,
        **DIALECT_FIELDS,
        "repeat_penalty": 1.1,
    },
    "/v1/messages": {
        "model": "claude-any",
        "max_tokens": 3,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "stream": True,
    },
    "/v1/messages/count_tokens": {
        "model": "claude-any",
        "messages": [{"role": "user", "content": "Hi"}],
    },
    "/v1/responses": {"input": "Hi", "max_output_tokens": 16, "stream": True},
    "/v1/responses/{response_id}/cancel": {},  # no body is read: an unknown id, 404
    "/v1/embeddings": {"model": "fake", "input": ["Hi", "there"], "encoding_format": "base64"},
    "/models/load": {"model": "fake"},
    "/models/unload": {"model": "fake"},  # the next request loads it again
    "/api/chat": {
        "model": "fake",
        "messages": [{"role": "user", "content": "Hi"}],
        "options": {"num_predict": 3, "temperature": 0, "stop": ["\n"]},
        "format": {"type": "object"},
        "keep_alive": "5m",
    },
    "/api/generate": {
        "model": "fake",
        "prompt": "Once upon",
        "stream": False,
        "options": {"num_predict": 3},
    },
    "/api/embed": {"model": "fake", "input": ["Hi", "there"], "truncate": True},
    "/api/show": {"model": "fake"},
    # An Ollama library name, refused up front (400): a valid name would reach the Hub, which
    # here is a closed port (tests/conftest.py); tests/e2e/test_pull_e2e.py pulls through a
    # local stand-in of the Hub instead.
    "/api/pull": {"model": "llama3.2", "insecure": False, "stream": True},
}
WS_BASE_FRAME: dict[str, Any] = {"type": "start", "request": BASE_BODIES["/v1/chat/completions"]}
NORMAL_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}


def served_post_paths() -> list[str]:
    """Every POST route of the application, read from its route table: the one
    list of JSON endpoints (a new endpoint is fuzzed without touching the tests)."""
    config = load_config(None, env={})
    backend = FakeBackend()
    engine = build_engine(backend, engine_settings(config))  # never started: only routes are read
    app = create_app(build_context(config, engine, backend, null_sink))
    return sorted({r.resource.canonical for r in app.router.routes() if r.method == "POST"})


_HOLE = "\x00HOLE\x00"
_HOSTILE_NUMBERS = [
    "1e999", "-1e999", "1e-999", "NaN", "Infinity", "-Infinity", "-0", "0.0", "1E+308",
    "4.9e-324", "9" * 5000, "-" + "9" * 41, "18446744073709551616", "9223372036854775808",
    "-9223372036854775809", "2147483648", "1.5", "-1", "0", "1e400", "00", "+1", ".5", "0x10",
]  # fmt: skip
_ESCAPES = [
    "\\ud800", "\\udfff", "\\udbff\\udbff", "\\ud83d\\ude00", "\\u0000", "\\x", "\\u12", "\\",
    "\\\\", '\\"', "\\/", "\\b\\f\\n\\r\\t", "\\uDBFF\\uDFFF", "\\uD800x", "\x01", "\n", "\u2028",
    "\ufeff", "\U0001f600", "中",
]  # fmt: skip
_BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80", b"\x00"]
CONTENT_TYPES = [
    "application/json", "text/plain", None, "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x", "application/json; charset=latin-1", "*/*",
]  # fmt: skip


def _string(pieces: list[str]) -> str:
    return '"' + "".join(pieces) + '"'


safe_text = st.text(st.characters(codec="utf-8"), max_size=20)
hostile_strings = st.one_of(
    safe_text.map(json.dumps),
    st.lists(st.sampled_from(_ESCAPES) | safe_text, max_size=6).map(_string),
    st.integers(1, 300_000).map(lambda n: '"' + "x" * n + '"'),
)
hostile_numbers = st.one_of(
    st.sampled_from(_HOSTILE_NUMBERS),
    st.integers().map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
scalars = st.one_of(
    hostile_strings, hostile_numbers, st.sampled_from(["true", "false", "null", "{}", "[]"])
)


def _nested(depth: int, kind: str) -> str:
    if kind == "array":
        return "[" * depth + "1" + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth  # never closed


deep_values = st.builds(
    _nested, st.integers(1, 100_000), st.sampled_from(["array", "object", "unbalanced"])
)


def _object(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{key}:{value}" for key, value in pairs) + "}"


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    keys = hostile_strings | st.sampled_from(['"role"', '"content"', '"type"', '"model"'])
    objects = st.lists(st.tuples(keys, children), max_size=4).map(_object)
    arrays = st.lists(children, max_size=4).map(lambda items: "[" + ",".join(items) + "]")
    return objects | arrays


hostile_values = st.recursive(scalars, _extend, max_leaves=8) | deep_values


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in a document (the root excluded)."""
    found: list[tuple[Any, ...]] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    for key, item in items:
        found.append((*prefix, key))
        found.extend(_paths(item, (*prefix, key)))
    return found


def _with_hole(document: Any, path: tuple[Any, ...]) -> Any:
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = _HOLE
    return copy


@st.composite
def mutated_documents(draw: st.DrawFn, base: dict[str, Any]) -> str:
    """A valid document with one position replaced by a hostile value (a wrong
    type, a hostile scalar, a deep nest), a hostile key added, or a key repeated."""
    how = draw(st.sampled_from(["replace", "add_key", "duplicate_key", "whole"]))
    if how == "whole" or not base:
        return draw(hostile_values)
    if how == "replace":
        path = draw(st.sampled_from(_paths(base)))
        text = json.dumps(_with_hole(base, path))
        return text.replace(json.dumps(_HOLE), draw(hostile_values), 1)
    key = (
        draw(hostile_strings) if how == "add_key" else json.dumps(draw(st.sampled_from(list(base))))
    )
    return "{" + f"{key}:{draw(hostile_values)}," + json.dumps(base)[1:]


@st.composite
def damaged_bytes(draw: st.DrawFn, text: str) -> bytes:
    """The document as bytes, possibly truncated, with bytes that are not UTF-8,
    or in another encoding."""
    raw = text.encode("utf-8", "surrogatepass")
    how = draw(st.sampled_from(["intact", "intact", "truncate", "bad_bytes", "bom", "utf16"]))
    if how == "truncate" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "bad_bytes":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from(_BAD_BYTES)) + raw[at:]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "utf16":
        return text.encode("utf-16", "surrogatepass")
    return raw


@dataclass(frozen=True)
class HostileRequest:
    body: bytes
    content_type: str | None


def hostile_requests(base: dict[str, Any]) -> st.SearchStrategy[HostileRequest]:
    bodies = mutated_documents(base).flatmap(damaged_bytes)
    return st.builds(HostileRequest, bodies, st.sampled_from(CONTENT_TYPES))


def hostile_frames() -> st.SearchStrategy[bytes]:
    return mutated_documents(WS_BASE_FRAME).flatmap(damaged_bytes)


# -- checks -----------------------------------------------------------------------------------


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def assert_error_shape(path: str, status: int, body: bytes) -> None:
    """The documented error body: OpenAI's ``{"error": {message, type, code,
    param}}``, Anthropic's ``{"type": "error", "error": {type, message}}``, or
    under ``/api/`` Ollama's ``{"error": message}``."""
    document = json.loads(body)
    error = document["error"]
    if path.startswith("/api/"):
        assert list(document) == ["error"] and isinstance(error, str), document
        assert len(body) < 4096, f"{status}: error body of {len(body)} bytes"
        return
    assert isinstance(error["message"], str), document
    assert isinstance(error["type"], str), document
    if is_anthropic(path):
        assert document["type"] == "error", document
    else:
        assert isinstance(error["code"], str), document
        assert "param" in error, document
    assert len(body) < 4096, f"{status}: error body of {len(body)} bytes"


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: bytes


def post_raw(url: str, path: str, request: HostileRequest, *, timeout: float = 60) -> Reply:
    """POST exactly these bytes; read the whole answer (a stream included)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        headers = {"Content-Length": str(len(request.body))}
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        connection.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(request.body)
        response = connection.getresponse()
        body = response.read()
        return Reply(response.status, response.getheader("Content-Type", ""), body)
    finally:
        connection.close()


# Error codes that are the server's own failure: never the answer to a body or frame,
# whether as a status, inside a 200 stream, or in a WebSocket error frame.
SERVER_FAULT_CODES = ("internal_error", "backend_error")


def check_reply(path: str, reply: Reply) -> None:
    """No 5xx, the documented error shape, and a 200 stream that does not end in a
    server fault (SSE and Ollama's NDJSON are read event by event)."""
    assert reply.status < 500, f"{path}: {reply.status} {reply.body[:300]!r}"
    if reply.status >= 400:
        assert_error_shape(path, reply.status, reply.body)
    elif "text/event-stream" in reply.content_type:
        for error in stream_errors(reply.body):
            assert error.get("code") not in SERVER_FAULT_CODES, f"{path}: 200 stream ended {error}"
    elif "application/x-ndjson" in reply.content_type:
        for line in reply.body.splitlines():
            document = json.loads(line)
            # Ollama's error carries no code: any error ends a stream a body began badly
            assert "error" not in document, f"{path}: 200 stream ended {document}"


def stream_errors(body: bytes) -> list[dict[str, Any]]:
    """The error objects of an SSE body, in each API's shape: OpenAI's
    ``data: {"error": {...}}``, Anthropic's ``{"type": "error", "error": {...}}``,
    the Responses API's ``{"type": "error", "code", ...}``."""
    errors = []
    for _, data in sse_events(body):
        if not isinstance(data, dict):
            continue
        if isinstance(data.get("error"), dict):
            errors.append(data["error"])
        elif data.get("type") == "error":
            errors.append(data)
    return errors


# -- a WebSocket client that can send anything ---------------------------------------------

TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10


def ws_frame(payload: bytes, opcode: int = TEXT, *, fin: bool = True) -> bytes:
    """One masked client frame."""
    head = bytes([(0x80 if fin else 0) | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


class RawWebSocket:
    """A WebSocket over a plain socket: frames are sent byte for byte, so a test
    can send invalid UTF-8, or half a frame, and see exactly what comes back."""

    def __init__(self, url: str, path: str = "/v1/stream", *, timeout: float = 60) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        self._buffer = b""
        head = self._read_until(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head[:200]

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self._buffer += data

    def _take(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def send(self, payload: bytes, opcode: int = TEXT) -> None:
        self.sock.sendall(ws_frame(payload, opcode))

    def send_json(self, value: Any) -> None:
        self.send(json.dumps(value).encode())

    def receive(self) -> tuple[int, bytes]:
        """The next frame (opcode, payload); EOFError when the socket closed."""
        first, second = self._take(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._take(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._take(8))[0]
        return first & 0x0F, self._take(size)

    def receive_json(self) -> dict[str, Any]:
        """The next text frame as JSON (pings answered); AssertionError on close."""
        reply = self.receive_json_or_close()
        assert isinstance(reply, dict), f"closed with {reply} instead of a text frame"
        return reply

    def receive_json_or_close(self) -> dict[str, Any] | int:
        """The next text frame as JSON, or the close code if the server closed."""
        while True:
            opcode, payload = self.receive()
            if opcode == PING:
                self.send(payload, PONG)
            elif opcode == TEXT:
                frame: dict[str, Any] = json.loads(payload)
                return frame
            elif opcode == CLOSE:
                return int(struct.unpack("!H", payload[:2])[0]) if len(payload) >= 2 else 1005
            else:
                raise AssertionError(f"opcode {opcode} {payload[:100]!r} instead of a text frame")

    def close(self) -> None:
        self.sock.close()


def finish_ws_stream(ws: RawWebSocket) -> dict[str, Any]:
    """Read frames until ``done`` or ``error`` and return it."""
    while True:
        frame = ws.receive_json()
        if frame["type"] in ("done", "error"):
            return frame


def _skip_late_cancel_answer(ws: RawWebSocket) -> None:
    """After a ``done`` that raced a cancel: the cancel came either while the socket's
    stream still ran (no answer of its own) or after (``no_active_stream``). A pause,
    answered ``no_active_stream`` now, marks where that answer would be."""
    ws.send_json({"type": "pause"})
    while (frame := ws.receive_json())["message"] != "pause without a running stream":
        assert frame["code"] == "no_active_stream", frame


# Close codes that refuse a frame: 1007 not UTF-8, 1009 too big. Never 1011 (server error).
_REFUSING_CLOSE_CODES = (1007, 1009)


def check_ws_frame(url: str, ws: RawWebSocket, frame: bytes, *, then_stream: bool) -> None:
    """Send one hostile frame: the answer is an ``error`` frame in the documented
    shape, a stream (cancelled here), or a close with a refusing code. Then the
    socket (a new one if it was closed) must still answer: with ``then_stream``
    a whole normal stream, else an out-of-order frame's ``error`` (no decode)."""
    try:
        ws.send(frame)
        reply = ws.receive_json_or_close()
        if isinstance(reply, int):
            assert reply in _REFUSING_CLOSE_CODES, f"closed with {reply} after {frame[:200]!r}"
            ws.close()
            ws = RawWebSocket(url)
        elif reply["type"] == "error":
            assert isinstance(reply["code"], str), reply
            assert isinstance(reply["message"], str), reply
            assert reply["code"] not in SERVER_FAULT_CODES, f"{reply} after {frame[:200]!r}"
        else:
            assert reply["type"] == "started", reply
            ws.send_json({"type": "cancel"})
            end = finish_ws_stream(ws)
            assert end.get("code") not in SERVER_FAULT_CODES, f"{end} after {frame[:200]!r}"
            if end["type"] == "done":  # it ended before the cancel took effect
                _skip_late_cancel_answer(ws)
        if then_stream:
            ws.send_json({"type": "start", "request": NORMAL_CHAT})
            assert ws.receive_json()["type"] == "started"
            assert finish_ws_stream(ws)["type"] == "done"
        else:
            ws.send_json({"type": "resume"})
            assert ws.receive_json()["code"] == "no_active_stream"
    finally:
        ws.close()
