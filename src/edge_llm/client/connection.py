"""HTTP session with small socket buffers, and mapping of wire failures to errors.

Reading of ``socket_send_buffer_bytes``: the seed's knob bounds the bytes that
may sit between the engine's ``send()`` and the client's renderer. On the client
side that path is the client socket's receive buffer, so the value is applied as
``SO_RCVBUF`` (and ``SO_SNDBUF``, for the request direction) on every socket, set
in the socket factory *before* ``connect()`` so the TCP window is negotiated
small; aiohttp's own read buffer (``read_bufsize``) is sized the same. When the
client stops reading (render queue above its high watermark) the kernel buffers
fill within a few KB and the server's writes block (EAGAIN) — real TCP
backpressure rather than an OS buffer silently absorbing megabytes. Linux
doubles the value for bookkeeping and enforces a small minimum. ``0`` leaves
the kernel defaults (autotuned, up to MBs).
"""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType, SocketFactoryType

from edge_llm.client.config import ClientConfig
from edge_llm.client.errors import (
    ClientError,
    ConnectError,
    HTTPStatusError,
    OverloadedError,
    ReadError,
    SocketEagainError,
)

MAX_ERROR_BODY_BYTES = 64 * 1024
MIN_READ_BUFSIZE = 1024
EAGAIN_ERRNOS = frozenset({errno.EAGAIN, errno.EWOULDBLOCK})


def socket_factory(buffer_bytes: int) -> SocketFactoryType:
    """A factory for aiohttp's connector making sockets with ``SO_RCVBUF`` and
    ``SO_SNDBUF`` set to ``buffer_bytes`` before they connect (0: kernel default)."""

    def make(addr_info: AddrInfoType) -> socket.socket:
        family, kind, proto, _, _ = addr_info
        sock = socket.socket(family=family, type=kind, proto=proto)
        if buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        return sock

    return make


def open_session(config: ClientConfig) -> aiohttp.ClientSession:
    """A session for the client's requests; the caller must close it (in a loop)."""
    connector = aiohttp.TCPConnector(socket_factory=socket_factory(config.socket_send_buffer_bytes))
    read_bufsize = 2**16
    if config.socket_send_buffer_bytes > 0:
        read_bufsize = max(MIN_READ_BUFSIZE, config.socket_send_buffer_bytes)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout_ms / 1000, sock_read=None
        ),
        read_bufsize=read_bufsize,
        trust_env=config.trust_env,
    )


def request_headers(
    config: ClientConfig, *, client_request_id: str, session_id: str | None = None
) -> dict[str, str]:
    """Headers of a streaming request (no Authorization when the key is empty)."""
    headers = {"Accept": "text/event-stream", "X-Client-Request-Id": client_request_id}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    if session_id:
        headers["X-Session-Id"] = session_id
    return headers


def _is_eagain(exc: BaseException) -> bool:
    os_error = getattr(exc, "os_error", exc)
    return isinstance(os_error, OSError) and os_error.errno in EAGAIN_ERRNOS


def transport_error(exc: BaseException, *, url: str) -> ClientError:
    """The client error for an aiohttp or socket failure while talking to ``url``."""
    if _is_eagain(exc):
        return SocketEagainError(f"socket would block (EAGAIN) talking to {url}: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error)
        return ConnectError(f"cannot connect to {exc.host}:{exc.port} ({url}): {reason}")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectError(f"timed out connecting to {url}")
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return _handshake_error(exc, url)
    return ReadError(f"connection to {url} failed mid-stream: {exc or type(exc).__name__}")


def _handshake_error(exc: aiohttp.WSServerHandshakeError, url: str) -> ClientError:
    if exc.status == 503:
        return OverloadedError(
            f"HTTP 503 at {url}: {exc.message}", retry_after_s=retry_after(exc.headers or {})
        )
    hint = " (the server has no WebSocket stream endpoint; use SSE)" if exc.status == 404 else ""
    return HTTPStatusError(f"HTTP {exc.status} at {url}: {exc.message}{hint}", status=exc.status)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), if any."""
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def status_error(status: int, headers: Mapping[str, str], body: bytes, *, url: str) -> ClientError:
    """The error for a non-200 answer whose (bounded) body is ``body``."""
    error = _error_object(body)
    message = str(error.get("message") or body[:200].decode("utf-8", "replace").strip())
    code = error.get("code")
    server_code = None if code is None else str(code)
    text = f"HTTP {status} from {url}: {message or 'no message'}"
    if server_code:
        text += f" [{server_code}]"
    if status == 503:
        return OverloadedError(
            text, server_code=server_code, error=error, retry_after_s=retry_after(headers)
        )
    return HTTPStatusError(text, status=status, server_code=server_code, error=error)


def _error_object(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    error = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    return {}


async def read_bounded(content: aiohttp.StreamReader, limit: int = MAX_ERROR_BODY_BYTES) -> bytes:
    """Read a response body up to ``limit`` bytes (the rest is left unread)."""
    out = bytearray()
    while len(out) < limit:
        data = await content.read(limit - len(out))
        if not data:
            break
        out += data
    return bytes(out)
