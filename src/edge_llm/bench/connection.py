"""A minimal HTTP/1.1 client for benchmarking: one request per connection.

Why not aiohttp: bench needs (1) the arrival time of every read, (2) its own socket
with ``SO_RCVBUF`` set *before* connect (Linux sizes the TCP window from it at the
handshake), and (3) bounded userspace buffering, so that a reader that stops reading
really leaves the bytes in the kernel and fills the server's socket. aiohttp can take a
socket factory, but its parser reads ahead into its own buffers and hides read
boundaries. Here the socket is ours, asyncio streams are created on it with a small
buffer limit (the transport stops reading from the kernel once about twice that is
buffered), and the body is de-chunked by a tiny sans-I/O :class:`ChunkedDecoder`.
HTTPS works through ``ssl`` on the same socket, for remote targets.

Only what bench needs: request with a body, status and headers, a body read in
pieces as it arrives (chunked, Content-Length or until close), ``Connection: close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import ssl
import termios
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024
MAX_CHUNK_LINE_BYTES = 1024
READ_SIZE = 64 * 1024
DEFAULT_LIMIT = 64 * 1024
SMALL_LIMIT = 1024
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


class HttpError(Exception):
    """The connection failed or the peer did not speak HTTP/1.1 as expected.

    ``.kind`` is a short stable label used as the error kind in records:
    ``connect_error``, ``read_error`` or ``protocol_error``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ChunkedDecoder:
    """Sans-I/O decoder of ``Transfer-Encoding: chunked``.

    Feed raw body bytes with :meth:`feed`, which returns the payload bytes they
    complete; :attr:`done` turns True after the last (zero-size) chunk and its
    trailers. Raises :class:`HttpError` (``protocol_error``) on a malformed size line.
    """

    def __init__(self) -> None:
        self._line = bytearray()
        self._remaining = 0
        self._state = "size"  # size -> data -> data_crlf -> size ... -> trailer -> done
        self.done = False

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        view = memoryview(data)
        while view and not self.done:
            if self._state == "data":
                take = min(self._remaining, len(view))
                out += view[:take]
                view = view[take:]
                self._remaining -= take
                if self._remaining == 0:
                    self._state = "data_crlf"
            else:
                view = self._feed_line(view)
        return bytes(out)

    def _feed_line(self, view: memoryview) -> memoryview:
        newline = bytes(view).find(b"\n")
        if newline < 0:
            self._line += view
            self._check_line()
            return view[len(view) :]
        self._line += view[:newline]
        self._check_line()
        line = bytes(self._line).rstrip(b"\r")
        self._line.clear()
        self._take_line(line)
        return view[newline + 1 :]

    def _check_line(self) -> None:
        if len(self._line) > MAX_CHUNK_LINE_BYTES:
            raise HttpError("protocol_error", "chunk size line too long")

    def _take_line(self, line: bytes) -> None:
        if self._state == "data_crlf":
            if line:
                raise HttpError("protocol_error", "chunk data not followed by CRLF")
            self._state = "size"
        elif self._state == "size":
            self._remaining = _chunk_size(line)
            self._state = "data" if self._remaining else "trailer"
        elif not line:  # trailer section ends with an empty line
            self.done = True


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    try:
        return int(text, 16)
    except ValueError:
        raise HttpError("protocol_error", f"bad chunk size line {line[:40]!r}") from None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to connect, from a URL: scheme, host, port and the request target path."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError("connect_error", f"not an http(s) URL: {url!r}")
        default_port = 443 if parts.scheme == "https" else 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, parts.port or default_port, path)

    @property
    def host_header(self) -> str:
        default = self.port == (443 if self.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if default else f"{host}:{self.port}"


class Response:
    """An open response: status and headers are read, the body is read with :meth:`read`.

    The caller must :meth:`close` it (or use ``async with``).
    """

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pending: bytes = b"",
    ) -> None:
        self.status = status
        self.headers = headers
        self.reader = reader
        self.writer = writer
        self._pending = pending
        self._chunked: ChunkedDecoder | None = None
        self._remaining: int | None = None
        self._eof = False
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = ChunkedDecoder()
        elif "content-length" in headers:
            self._remaining = _content_length(headers["content-length"])

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def read(self) -> bytes:
        """The next piece of body as it arrives; ``b""`` at the end of the body.

        Raises :class:`HttpError` (``read_error``) when the connection drops before
        the body is complete.
        """
        while not self._eof:
            raw = await self._read_raw()
            if not raw:
                return self._end_of_connection()
            data = self._decode(raw)
            if data:
                return data
        return b""

    async def read_all(self, max_bytes: int = DEFAULT_MAX_BODY_BYTES) -> bytes:
        """The whole remaining body, at most ``max_bytes`` (more is an ``HttpError``)."""
        body = bytearray()
        while piece := await self.read():
            body += piece
            if len(body) > max_bytes:
                raise HttpError("read_error", f"response body larger than {max_bytes} bytes")
        return bytes(body)

    def queued_bytes(self) -> int | None:
        """Bytes waiting in the kernel receive queue (FIONREAD), None if unknown."""
        sock = self.writer.get_extra_info("socket")
        if sock is None or self._eof or sock.fileno() < 0:
            return None
        with contextlib.suppress(OSError):
            buf = bytearray(4)
            fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
            return int.from_bytes(buf, "little", signed=True)
        return None

    def close(self) -> None:
        self._eof = True
        self.writer.close()

    async def _read_raw(self) -> bytes:
        if self._pending:
            raw, self._pending = self._pending, b""
            return raw
        try:
            raw = await self.reader.read(READ_SIZE)
        except (ConnectionError, ssl.SSLError, OSError) as exc:
            raise HttpError("read_error", f"connection failed while reading: {exc}") from exc
        return raw

    def _decode(self, raw: bytes) -> bytes:
        if self._chunked is not None:
            data = self._chunked.feed(raw)
            self._eof = self._chunked.done
            return data
        if self._remaining is not None:
            data = raw[: self._remaining]
            self._remaining -= len(data)
            self._eof = self._remaining == 0
            return data
        return raw

    def _end_of_connection(self) -> bytes:
        self._eof = True
        complete = self._chunked is None and not self._remaining
        if not complete:
            raise HttpError("read_error", "connection closed before the body was complete")
        return b""


def _content_length(value: str) -> int:
    try:
        length = int(value.strip())
    except ValueError:
        raise HttpError("protocol_error", f"bad Content-Length {value!r}") from None
    if length < 0:
        raise HttpError("protocol_error", f"bad Content-Length {value!r}")
    return length


async def open_request(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    rcvbuf: int | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Response:
    """Connect, send one request and read the status line and headers.

    ``rcvbuf`` sets ``SO_RCVBUF`` before connecting; ``limit`` bounds the userspace
    read buffer. Raises :class:`HttpError` (``connect_error`` / ``read_error`` /
    ``protocol_error``). The caller owns the returned :class:`Response`.
    """
    endpoint = Endpoint.from_url(url)
    reader, writer = await _connect(endpoint, rcvbuf, limit)
    try:
        writer.write(_request_bytes(endpoint, method, headers or {}, body))
        await writer.drain()
        status, response_headers, rest = await _read_head(reader)
    except (ConnectionError, ssl.SSLError, OSError) as exc:
        writer.close()
        raise HttpError("read_error", f"connection failed: {exc}") from exc
    except BaseException:  # HttpError, or cancelled by the caller's timeout
        writer.close()
        raise
    return Response(status, response_headers, reader, writer, pending=rest)


async def fetch(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> tuple[int, dict[str, str], bytes]:
    """One complete request: (status, headers, body). Raises :class:`HttpError`."""
    response = await open_request(url, method=method, headers=headers, body=body)
    async with response:
        return response.status, response.headers, await response.read_all(max_bytes)


async def _connect(
    endpoint: Endpoint, rcvbuf: int | None, limit: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise HttpError("connect_error", f"cannot resolve {endpoint.host}: {exc}") from exc
    family, _, proto, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        sock.setblocking(False)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await loop.sock_connect(sock, address)
        tls = ssl.create_default_context() if endpoint.scheme == "https" else None
        return await asyncio.open_connection(
            sock=sock,
            ssl=tls,
            server_hostname=endpoint.host if tls else None,
            limit=limit,
        )
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        where = f"{endpoint.host}:{endpoint.port}"
        raise HttpError("connect_error", f"cannot connect to {where}: {exc}") from exc
    except BaseException:  # cancelled by the caller's timeout
        sock.close()
        raise


def _request_bytes(
    endpoint: Endpoint, method: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    lines = [
        f"{method} {endpoint.path} HTTP/1.1",
        f"Host: {endpoint.host_header}",
        "Connection: close",
        "User-Agent: edge-llm-bench",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    buffer = bytearray()
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise HttpError("protocol_error", "response headers too large")
        piece = await reader.read(READ_SIZE)
        if not piece:
            raise HttpError("read_error", "connection closed before the response headers")
        buffer += piece
    head = bytes(buffer[:end]).decode("latin-1")
    status_line, *header_lines = head.split("\r\n")
    return _status_of(status_line), _headers_of(header_lines), bytes(buffer[end + 4 :])


def _status_of(line: str) -> int:
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError("protocol_error", f"not an HTTP/1.x status line: {line[:80]!r}")
    return int(parts[1])


def _headers_of(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if sep:
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return headers
