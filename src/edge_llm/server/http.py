"""Helpers shared by the routes: JSON bodies, error responses by API, socket tuning."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import socket
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from edge_llm.errors import (
    BodyTooLarge,
    EdgeLLMError,
    InvalidRequest,
    Overloaded,
    TooManyConnections,
)
from edge_llm.protocol import anthropic, ollama
from edge_llm.protocol.json_body import decode_json
from edge_llm.server.access_log import mark_error

_DECODE_IN_THREAD_BYTES = 64 * 1024
# Browsers cannot set headers on a WebSocket: the key may come as a subprotocol
# ``edge-llm.key.<base64url(key)>``, offered beside ``edge-llm`` (see ws_route).
_KEY_SUBPROTOCOL = "edge-llm.key."
ANTHROPIC_PATH = "/v1/messages"
OLLAMA_PATH = "/api/"


@dataclass(frozen=True)
class ConnectionSettings:
    socket_send_buffer_bytes: int
    write_buffer_bytes: int
    body_timeout_s: float


def error_response(error: EdgeLLMError, path: str) -> web.Response:
    """``error`` with its status, in the shape of the API ``path`` belongs to:
    Anthropic's (``{"type": "error", "error": {...}}``) under ``/v1/messages``,
    Ollama's (``{"error": "..."}``) under ``/api/``, OpenAI's everywhere else."""
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, TooManyConnections):
        headers["Connection"] = "close"
    body = error_body(error, path)
    return mark_error(web.json_response(body, status=error.status, headers=headers), error)


def error_body(error: EdgeLLMError, path: str) -> dict[str, Any]:
    if is_anthropic_path(path):
        return anthropic.error_body(error)
    if path.startswith(OLLAMA_PATH):
        return ollama.error_body(error.message)
    return error.to_dict()


def is_anthropic_path(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


async def read_json(request: web.Request, settings: ConnectionSettings) -> Any:
    """The request body as JSON, within the body size and time limits; every
    hostile body is a 400 (see :mod:`edge_llm.protocol.json_body`)."""
    try:
        raw = await asyncio.wait_for(request.read(), settings.body_timeout_s)
    except web.HTTPRequestEntityTooLarge as exc:
        raise BodyTooLarge(f"request body larger than {request.client_max_size} bytes") from exc
    except TimeoutError as exc:
        raise InvalidRequest("request body not received in time") from exc
    if len(raw) > _DECODE_IN_THREAD_BYTES:  # a large body must not hold up other streams
        return await asyncio.to_thread(decode_json, raw)
    return decode_json(raw)


def tune_connection(request: web.Request, settings: ConnectionSettings) -> None:
    """Keep what a stalled client can make us buffer small, so a full socket is
    seen within a few dozen tokens (see docs/backpressure.md)."""
    transport = request.transport
    if transport is None:
        return
    if settings.write_buffer_bytes:
        transport.set_write_buffer_limits(high=settings.write_buffer_bytes)
    sock = transport.get_extra_info("socket")
    if settings.socket_send_buffer_bytes and sock is not None:
        with contextlib.suppress(OSError):  # not a TCP socket: keep the kernel default
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, settings.socket_send_buffer_bytes)


def session_of(request: web.Request, user: str | None) -> str | None:
    return request.headers.get("X-Session-Id") or user


def presented_key(request: web.Request) -> str | None:
    """The API key the client sent: Bearer, ``x-api-key`` or the WebSocket subprotocol."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return request.headers.get("x-api-key") or _subprotocol_key(request)


def _subprotocol_key(request: web.Request) -> str | None:
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    for protocol in offered.split(","):
        encoded = protocol.strip()
        if encoded.startswith(_KEY_SUBPROTOCOL):
            return _decode_base64url(encoded.removeprefix(_KEY_SUBPROTOCOL))
    return None


def _decode_base64url(text: str) -> str | None:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        return raw.decode()
    except (binascii.Error, ValueError):
        return None
