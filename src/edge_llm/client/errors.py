"""Errors the client SDK raises, each with a stable ``.code`` string.

    ClientError                         client_error
    ├── ConfigError                     config_error (.field names the bad key)
    ├── TransportError                  (the connection misbehaved)
    │   ├── ConnectError                connect_error (refused, DNS, unreachable)
    │   ├── SocketEagainError           socket_eagain (EAGAIN surfaced from the socket)
    │   ├── ReadError                   read_error (dropped or truncated mid-stream)
    │   └── StreamTimeoutError          (a deadline passed)
    │       ├── TtftTimeoutError        ttft_timeout (no first token in ttft_hard_timeout_ms)
    │       └── DeadConnectionError     dead_connection (no byte for N heartbeat intervals)
    ├── HTTPStatusError                 http_status (.status, .server_code from the error body)
    │   └── OverloadedError             overloaded (503; .retry_after_s from Retry-After)
    ├── ServerStreamError               server_error (an error inside a 200 stream or a WS
    │                                   ``error`` frame; .server_code is the server's code)
    └── ProtocolError                   (the server's bytes do not follow the protocol)
        ├── NotStreamingError           not_streaming (wrong Content-Type: no stream applied)
        ├── MalformedChunkError         malformed_chunk (data that is not a JSON object)
        └── EventTooLargeError          event_too_large (a line or event over the bound)

Callers catch :class:`ClientError` for "the stream failed" and read ``.code``
(and ``.server_code`` where present) to decide what to tell the user; the
retry policy matches ``retry_on`` entries against the same codes.
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base of every error the client raises; ``.code`` is a stable identifier."""

    code = "client_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def server_code(self) -> str | None:
        """The code the server gave, when the error came from the server."""
        return None


class ConfigError(ClientError, ValueError):
    """The client configuration is invalid; ``.field`` names the key (dotted path)."""

    code = "config_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TransportError(ClientError):
    """The connection to the server failed or misbehaved."""

    code = "transport_error"


class ConnectError(TransportError):
    """The connection could not be opened (refused, unreachable, name not found)."""

    code = "connect_error"


class SocketEagainError(TransportError):
    """The socket reported EAGAIN/EWOULDBLOCK where the transport could not absorb it."""

    code = "socket_eagain"


class ReadError(TransportError):
    """The connection dropped or the stream ended before it was complete."""

    code = "read_error"


class StreamTimeoutError(TransportError):
    """A client-side deadline passed; ``.elapsed_ms`` says how long was waited."""

    code = "timeout"

    def __init__(self, message: str, *, elapsed_ms: float) -> None:
        super().__init__(message)
        self.elapsed_ms = elapsed_ms


class TtftTimeoutError(StreamTimeoutError):
    """No first content token within ``ttft_hard_timeout_ms``; the stream was cancelled."""

    code = "ttft_timeout"


class DeadConnectionError(StreamTimeoutError):
    """No byte (data or heartbeat) for several heartbeat intervals: the peer is gone."""

    code = "dead_connection"


class HTTPStatusError(ClientError):
    """The server answered with a non-200 status before any stream started.

    ``.status`` is the HTTP status; ``.server_code`` and ``.error`` come from an
    OpenAI-shaped body ``{"error": {...}}`` when there was one.
    """

    code = "http_status"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        server_code: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self._server_code = server_code
        self.error = error or {}

    @property
    def server_code(self) -> str | None:
        return self._server_code


class OverloadedError(HTTPStatusError):
    """503: the server is full; retry after ``.retry_after_s`` seconds (None if not given)."""

    code = "overloaded"

    def __init__(
        self,
        message: str,
        *,
        status: int = 503,
        server_code: str | None = None,
        error: dict[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, status=status, server_code=server_code, error=error)
        self.retry_after_s = retry_after_s


class ServerStreamError(ClientError):
    """The server reported an error after the stream started (SSE ``{"error": ...}``
    inside a 200 response, or a WebSocket ``error`` frame)."""

    code = "server_error"

    def __init__(
        self, message: str, *, server_code: str | None, error: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self._server_code = server_code
        self.error = error or {}

    @property
    def server_code(self) -> str | None:
        return self._server_code

    @classmethod
    def from_payload(cls, payload: object) -> ServerStreamError:
        """Build from the value of an ``"error"`` key (an object or a bare string)."""
        if isinstance(payload, dict):
            message = str(payload.get("message") or "server error")
            code = payload.get("code") or payload.get("type")
            return cls(message, server_code=None if code is None else str(code), error=payload)
        return cls(str(payload), server_code=None, error={"message": str(payload)})


class ProtocolError(ClientError):
    """The server's bytes do not follow the streaming protocol."""

    code = "protocol_error"


class NotStreamingError(ProtocolError):
    """The response is not an event stream (wrong Content-Type): the server did not stream."""

    code = "not_streaming"


class MalformedChunkError(ProtocolError):
    """An SSE data field that should hold a JSON object does not."""

    code = "malformed_chunk"


class EventTooLargeError(ProtocolError):
    """A line or event is larger than the parser's bound; the stream is abandoned."""

    code = "event_too_large"
