"""Client SDK: streams chat completions from edge-llm or any OpenAI-compatible server.

Render-queue watermarks with PAUSE/RESUME (WebSocket) or TCP backpressure (SSE),
TTFT warning and hard timeout with cancel, retry with backoff, heartbeat-based
dead-connection detection, a byte-level SSE parser, and a JSONL event log.
See :mod:`edge_llm.client.stream_client` for usage.
"""

from edge_llm.client.config import ClientConfig, RetryConfig, load_client_config
from edge_llm.client.errors import (
    ClientError,
    ConfigError,
    ConnectError,
    DeadConnectionError,
    EventTooLargeError,
    HTTPStatusError,
    MalformedChunkError,
    NotStreamingError,
    OverloadedError,
    ProtocolError,
    ReadError,
    ServerStreamError,
    SocketEagainError,
    StreamTimeoutError,
    TransportError,
    TtftTimeoutError,
)
from edge_llm.client.render_queue import RenderQueue, Watermark
from edge_llm.client.result import Heartbeat, StreamResult
from edge_llm.client.retry import RetryDecision, RetryPolicy
from edge_llm.client.sse import ChatChunk, SSEEvent, SSEParser, parse_chunk
from edge_llm.client.stream import ChatStream
from edge_llm.client.stream_client import StreamClient

__all__ = [
    "ChatChunk",
    "ChatStream",
    "ClientConfig",
    "ClientError",
    "ConfigError",
    "ConnectError",
    "DeadConnectionError",
    "EventTooLargeError",
    "HTTPStatusError",
    "Heartbeat",
    "MalformedChunkError",
    "NotStreamingError",
    "OverloadedError",
    "ProtocolError",
    "ReadError",
    "RenderQueue",
    "RetryConfig",
    "RetryDecision",
    "RetryPolicy",
    "SSEEvent",
    "SSEParser",
    "ServerStreamError",
    "SocketEagainError",
    "StreamClient",
    "StreamResult",
    "StreamTimeoutError",
    "TransportError",
    "TtftTimeoutError",
    "Watermark",
    "load_client_config",
    "parse_chunk",
]
