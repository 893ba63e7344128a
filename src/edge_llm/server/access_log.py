"""The access log: one line per request on the ``edge_llm.access`` logger, when it ends.

    chatcmpl-5f0c9a1e… POST /v1/chat/completions 200 ttft_ms=412 tokens=33/64 end=stop backend=local

Fields, in order: the request id (a refused request's is the one its
``X-Request-Id`` header carries, see :func:`request_id`), method and path, status,
``ttft_ms``, ``tokens`` (prompt/generated), ``end`` (how it ended: the finish reason
``stop`` / ``length`` / ``tool_calls``, ``cancelled:REASON``, or the error code) and
``backend`` (``local`` or the upstream's name); a field a request does not have is
``-``. A client that goes away before its answer is complete gets status 499 and
``end=cancelled:disconnect``, as nginx logs it.

:func:`middleware` writes the line when the handler returns, which for a stream is
when the stream has ended. Each route scopes its dispatched answer with
:func:`answering`, which tells the request's record which answer it is (its facts are
read when the line is written);
:func:`mark_error` tags an error response with its code. A WebSocket carries streams
one after the other: each stream gets a line of its own when its :func:`answering`
scope ends (method ``WS``, status 101) and the socket none. Requests to what tools
poll (``/health``, ``/metrics``, ``/debug/streams``, the playground's files) are
logged at DEBUG, the rest at INFO. Off with ``--no-access-log`` (``[server]
access_log``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from edge_llm.errors import Cancelled, EdgeLLMError
from edge_llm.protocol.stream_events import Ending

LOGGER_NAME = "edge_llm.access"
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer was complete
SWITCHING_PROTOCOLS = 101
MAX_PATH_CHARS = 200  # the path is the client's text: bounded in the log
_POLLED_PATHS = frozenset({"/health", "/metrics", "/debug/streams"})
_POLLED_PREFIXES = ("/playground/",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Answer(Protocol):
    """What the line needs of an answer (:class:`edge_llm.generation.dispatch.Answer`)."""

    @property
    def id(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def outcome(self) -> Ending | None: ...

    def usage(self) -> dict[str, Any]: ...

    def stats(self) -> dict[str, Any]: ...


@dataclass
class AccessRecord:
    """What one request's line will say; filled in as the request goes."""

    method: str
    path: str
    status: int | None = None
    error_code: str | None = None
    answer: Answer | None = None
    refusal_id: str | None = None  # the id of a request refused before it had an answer

    def line(self) -> str:
        """The log line; the answer's facts are read now, when it has ended."""
        answer = self.answer
        return " ".join(
            [
                answer.id if answer is not None else self.refusal_id or "-",
                self.method,
                self.path,
                _text(self.status),
                f"ttft_ms={_ttft_ms(answer)}",
                f"tokens={_tokens(answer)}",
                f"end={_end(answer, self.status) or self.error_code or '-'}",
                f"backend={_backend(answer)}",
            ]
        )

    @property
    def polled(self) -> bool:
        return self.path in _POLLED_PATHS or self.path.startswith(_POLLED_PREFIXES)


RECORD = web.RequestKey("edge_llm_access_record", AccessRecord)
ERROR_CODE = web.ResponseKey("edge_llm_error_code", str)


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: the line is written however the handler ends (an accepted
    WebSocket's streams have lines of their own)."""
    record = AccessRecord(request.method, _path(request))
    request[RECORD] = record
    try:
        response = await handler(request)
    except BaseException:
        record.status = CLIENT_CLOSED  # only a broken connection gets past the error middleware
        raise
    else:
        record.status = response.status
        record.error_code = response.get(ERROR_CODE)
        return response
    finally:
        if record.status != SWITCHING_PROTOCOLS:
            _write(record)


@contextmanager
def answering(request: web.Request, answer: Answer) -> Iterator[None]:
    """The scope of one answer to ``request``: its facts go into the request's line,
    or, for a stream on a WebSocket, into a line of its own written when the scope ends."""
    record = request.get(RECORD)
    if record is None:  # an app built without the access log
        yield
        return
    if request.headers.get("Upgrade", "").lower() != "websocket":
        record.answer = answer
        yield
        return
    stream = AccessRecord("WS", record.path, SWITCHING_PROTOCOLS, answer=answer)
    try:
        yield
    finally:
        _write(stream)


def request_id(request: web.Request) -> str:
    """The id of ``request``'s answer, or, for a request refused before it had one
    (400, 401, 413, 429, 503...), a new id in the same form that its line shows too:
    the ``X-Request-Id`` of every response names its log line."""
    record: AccessRecord | None = request.get(RECORD)
    if record is not None and record.answer is not None:
        return record.answer.id
    if record is not None and record.refusal_id is not None:
        return record.refusal_id
    new_id = "chatcmpl-" + uuid.uuid4().hex[:24]
    if record is not None:
        record.refusal_id = new_id
    return new_id


def refused(request: web.Request, error: EdgeLLMError) -> None:
    """A stream a WebSocket asked for and did not get: its line (HTTP requests get
    theirs from the middleware)."""
    record = request.get(RECORD)
    if record is not None:
        _write(AccessRecord("WS", record.path, error.status, error.code))


def mark_error(response: web.Response, error: EdgeLLMError) -> web.Response:
    """Tag an error response with its code, for the line's ``end`` field."""
    response[ERROR_CODE] = error.code
    return response


def _write(record: AccessRecord) -> None:
    logger = logging.getLogger(LOGGER_NAME)
    level = logging.DEBUG if record.polled else logging.INFO
    if logger.isEnabledFor(level):
        logger.log(level, "%s", record.line())


def _path(request: web.Request) -> str:
    path = request.rel_url.raw_path  # as sent (percent-encoded): no control characters
    return path if len(path) <= MAX_PATH_CHARS else path[:MAX_PATH_CHARS] + "…"


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _backend(answer: Answer | None) -> str:
    """``local``, or the upstream's name (the last one tried, after a failover)."""
    return "-" if answer is None else answer.backend


def _ttft_ms(answer: Answer | None) -> str:
    ttft = answer.stats().get("ttft_ms") if answer is not None else None
    return "-" if ttft is None else f"{ttft:.0f}"


def _tokens(answer: Answer | None) -> str:
    if answer is None:
        return "-"
    usage = answer.usage()
    return f"{_text(usage.get('prompt_tokens'))}/{_text(usage.get('completion_tokens'))}"


def _end(answer: Answer | None, status: int | None) -> str | None:
    """How the answer ended; an answer still unfinished when its request ended was
    left by its client (its cancel is under way)."""
    if answer is None:
        return "cancelled:disconnect" if status == CLIENT_CLOSED else None
    outcome = answer.outcome
    if outcome is None:
        return "cancelled:disconnect"
    if isinstance(outcome.error, Cancelled):
        return f"cancelled:{outcome.error.reason}"
    if outcome.error is not None:
        return outcome.error.code
    return outcome.finish_reason or "stop"
