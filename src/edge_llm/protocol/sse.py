"""Server-sent events: the encoding the server writes, and a byte-level parser (sans I/O).

Encoding: :func:`encode_data` (one ``data:`` line), :func:`encode_event` (a named
event, as Anthropic's Messages API uses them), :data:`PING` and :data:`DONE`.

Parsing: feed the bytes of each read as they arrive with :meth:`SSEParser.feed`; it
returns the events completed by those bytes. At end of stream call
:meth:`SSEParser.close` to flush a last event whose blank line never came. The
parser follows the WHATWG event-stream rules:

- lines end in CRLF, LF or CR; a CR that ends one read may be half of a CRLF whose
  LF starts the next read (the LF is then skipped, not taken as an empty line);
- lines are split as bytes and decoded only when complete, so a UTF-8 character
  split across reads is decoded whole; invalid UTF-8 becomes U+FFFD; a leading
  byte-order mark is dropped;
- ``:`` starts a comment (``: ping`` heartbeats), counted in :attr:`SSEParser.comments`;
- ``data:`` with or without one space; several ``data`` lines join with ``\\n``;
- a blank line dispatches the event; an event with no ``data`` is not dispatched;
- ``id`` persists across events (the "last event ID"); ``id`` containing NUL is ignored.

Memory is bounded: a line longer than ``max_line_bytes`` or an event whose data
exceeds ``max_event_bytes`` raises :class:`EventTooLarge`. The client SDK, the
upstream relay, ``doctor`` and ``bench`` all read streams with this one parser;
each maps :class:`EventTooLarge` to its own error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PING = b": ping\n\n"
DONE = b"data: [DONE]\n\n"
DONE_SENTINEL = "[DONE]"


def encode_data(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event; JSON never contains a raw newline, so one line suffices."""
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


def encode_event(event: str, payload: dict[str, Any]) -> bytes:
    """A named event, as Anthropic's Messages API uses them."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {data}\n\n".encode()


def split_events(data: bytes) -> list[bytes]:
    """The events in ``data`` as this server encodes them (each ends with its blank
    line; JSON holds no raw newline), comments (``: ping``) included."""
    return [part + b"\n\n" for part in data.split(b"\n\n") if part]


def is_comment(event: bytes) -> bool:
    return event.startswith(b":")


def event_id(stream_id: str, n: int) -> str:
    """The ``id`` of a resumable stream's ``n``-th event: ``<stream_id>.<n>``."""
    return f"{stream_id}.{n}"


def with_id(event: bytes, event_id_: str) -> bytes:
    """``event`` with an ``id:`` line (what a client sends back as ``Last-Event-ID``)."""
    return b"id: " + event_id_.encode() + b"\n" + event


def parse_event_id(text: str) -> tuple[str, int] | None:
    """``(stream_id, n)`` of an id :func:`event_id` made; None when it is not one."""
    stream_id, dot, number = text.strip().rpartition(".")
    if not dot or not stream_id or not number.isdigit() or len(number) > 18:
        return None
    return stream_id, int(number)


class EventTooLarge(ValueError):
    """A line or event is larger than the parser's bound; the stream must be abandoned."""

    code = "event_too_large"


DEFAULT_MAX_LINE_BYTES = 1 << 20
DEFAULT_MAX_EVENT_BYTES = 4 << 20

_EOL = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: ``event`` is the ``event:`` field (None if absent),
    ``data`` the joined ``data:`` lines, ``id`` the last event ID seen (None if none)."""

    event: str | None
    data: str
    id: str | None = None


class SSEParser:
    """Turns a byte stream into :class:`SSEEvent` objects, one read at a time.

    The caller must pass every read to :meth:`feed` in order, and call
    :meth:`close` once at end of stream. Not thread-safe; one parser per stream.
    """

    def __init__(
        self,
        *,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    ) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.comments = 0
        self.retry_ms: int | None = None
        self._partial = bytearray()
        self._skip_lf = False
        self._first_line = True
        self._data: list[str] = []
        self._data_bytes = 0
        self._event_type: str | None = None
        self._last_id: str | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume one read; return the events it completed (possibly none).

        Raises :class:`EventTooLarge` when a line or event exceeds the bounds.
        """
        if self._skip_lf and data:
            self._skip_lf = False
            if data.startswith(b"\n"):
                data = data[1:]
        events: list[SSEEvent] = []
        start = 0
        for match in _EOL.finditer(data):
            self._partial += data[start : match.start()]
            self._check_line_size()
            start = match.end()
            self._skip_lf = match.group() == b"\r" and start == len(data)
            event = self._take_line()
            if event is not None:
                events.append(event)
        self._partial += data[start:]
        self._check_line_size()
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: flush a pending line and a last event lacking its blank line."""
        events: list[SSEEvent] = []
        if self._partial:
            event = self._take_line()
            if event is not None:
                events.append(event)
        event = self._dispatch()
        if event is not None:
            events.append(event)
        return events

    def _check_line_size(self) -> None:
        if len(self._partial) > self.max_line_bytes:
            raise EventTooLarge(f"SSE line longer than {self.max_line_bytes} bytes")

    def _take_line(self) -> SSEEvent | None:
        line = self._partial.decode("utf-8", errors="replace")
        self._partial.clear()
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            return self._dispatch()
        self._process_field(line)
        return None

    def _process_field(self, line: str) -> None:
        if line.startswith(":"):
            self.comments += 1
            return
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._append_data(value)
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)

    def _append_data(self, value: str) -> None:
        self._data_bytes += len(value) + 1
        if self._data_bytes > self.max_event_bytes:
            raise EventTooLarge(f"SSE event data larger than {self.max_event_bytes} bytes")
        self._data.append(value)

    def _dispatch(self) -> SSEEvent | None:
        event_type, self._event_type = self._event_type, None
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data.clear()
        self._data_bytes = 0
        return SSEEvent(event=event_type or None, data=data, id=self._last_id)
