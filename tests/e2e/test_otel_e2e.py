"""OpenTelemetry from a real engine to a real OTLP/HTTP receiver (aiohttp on 127.0.0.1,
decoded with ``opentelemetry-proto``): the span of a streamed request is in the caller's
trace with the GenAI attributes, the pause a stalled reader caused is visible in it, and
the three GenAI server histograms arrive with counts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from conftest import EngineProcess, start_engine
from otlp_receiver import OtlpReceiver, attributes
from support import STORY

pytestmark = pytest.mark.e2e

APP_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
APP_SPAN = "00f067aa0ba902b7"
HISTOGRAMS = (
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.server.request.duration",
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def engine(
    receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcess]:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "edge-llm-under-test",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    started = start_engine(tmp_path_factory.mktemp("otel"), env=env)
    yield started
    started.stop()


def stalled_stream(engine: EngineProcess, headers: dict[str, str]) -> socket.socket:
    """A streamed chat request over a socket with a small receive buffer that is not
    read yet, so that its reader stalls for real (TCP backpressure)."""
    host, port = engine.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": STORY}],
            "max_tokens": 300,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n{head}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(120)
    received = b""
    while b"data: [DONE]" not in received:
        data = sock.recv(65536)
        if not data:
            break
        received += data
    sock.close()
    return received


def server_span_of(receiver: OtlpReceiver, request_id: str) -> tuple[dict[str, Any], Span] | None:
    for resource, span in receiver.spans():
        if span.kind == Span.SPAN_KIND_SERVER and request_id in str(span.attributes):
            return resource, span
    return None


def test_a_paused_stream_is_one_span_in_the_callers_trace_and_the_histograms_count(
    engine: EngineProcess, receiver: OtlpReceiver
) -> None:
    traceparent = f"00-{APP_TRACE}-{APP_SPAN}-01"
    sock = stalled_stream(engine, {"traceparent": traceparent})
    request_id = wait_until_sync(lambda: _live_id(engine), "the stream in /debug/streams")
    wait_until_sync(
        lambda: engine.stream(request_id)["pause_cause"] == "socket_full",
        "the stalled reader's stream paused",
    )
    read_to_end(sock)
    resource, span = receiver.wait_for(lambda: server_span_of(receiver, request_id), "the span")
    assert resource["service.name"] == "edge-llm-under-test"
    assert span.trace_id.hex() == APP_TRACE and span.parent_span_id.hex() == APP_SPAN
    found = attributes(span.attributes)
    assert found["gen_ai.operation.name"] == "chat"
    assert found["gen_ai.provider.name"] == "edge_llm"
    assert found["gen_ai.request.model"] == found["gen_ai.response.model"]
    assert found["gen_ai.request.max_tokens"] == 300
    assert found["gen_ai.request.temperature"] == 0.0
    assert found["gen_ai.response.id"] == request_id
    assert found["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
    assert found["gen_ai.usage.input_tokens"] > 0 and found["gen_ai.usage.output_tokens"] > 0
    assert found["edge_llm.pauses"] >= 1
    events = [event.name for event in span.events]
    assert "edge_llm.paused" in events and "edge_llm.resumed" in events
    children = [
        s
        for _, s in receiver.spans()
        if s.trace_id == span.trace_id and s.parent_span_id == span.span_id
    ]
    pauses = [s for s in children if s.name == "paused socket_full"]
    assert pauses and all(s.end_time_unix_nano > s.start_time_unix_nano for s in pauses)
    assert {"queue", "prefill"} <= {s.name for s in children}
    counts = receiver.wait_for(
        lambda: (c := receiver.histogram_counts()) and all(c.get(n) for n in HISTOGRAMS) and c,
        "the three histograms",
    )
    assert all(counts[name] >= 1 for name in HISTOGRAMS)
    assert receiver.histogram_bounds("gen_ai.server.request.duration")[:3] == [0.01, 0.02, 0.04]


def _live_id(engine: EngineProcess) -> str | None:
    streams = [s for s in engine.debug_streams()["streams"] if s["state"] != "done"]
    return str(streams[0]["id"]) if streams else None


def wait_until_sync(found: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen")


def test_edge_llm_chat_traces_and_the_engine_span_is_its_child(
    engine: EngineProcess, receiver: OtlpReceiver
) -> None:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    env.pop("OTEL_SERVICE_NAME", None)
    done = subprocess.run(
        [sys.executable, "-m", "edge_llm", "chat", "--base-url", engine.url,
         "--max-tokens", "6", "--temperature", "0", "Say hi."],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    def pair() -> tuple[Span, Span] | None:
        spans = receiver.spans()
        clients = [s for r, s in spans if r.get("service.name") == "edge-llm-chat"]
        for client in clients:
            for _, server in spans:
                if server.kind == Span.SPAN_KIND_SERVER and server.parent_span_id == client.span_id:
                    return client, server
        return None

    client, server = receiver.wait_for(pair, "the chat CLI's span and the engine's child span")
    assert client.kind == Span.SPAN_KIND_CLIENT and client.trace_id == server.trace_id
    assert "edge_llm.end" in [event.name for event in client.events]
