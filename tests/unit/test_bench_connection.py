"""bench's HTTP/1.1 client: chunked decoding, framing, errors and socket control."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_llm.bench.connection import ChunkedDecoder, Endpoint, HttpError, fetch, open_request

from helpers import free_port

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Serve = Callable[[Reply], Awaitable[str]]


def chunked(payloads: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads if p)
    return body + b"0\r\n\r\n"


@given(
    st.lists(st.binary(min_size=1, max_size=40), max_size=8),
    st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=40),
)
def test_chunked_decoding_is_split_invariant(payloads: list[bytes], cuts: list[int]) -> None:
    wire = chunked(payloads)
    decoder = ChunkedDecoder()
    out = bytearray()
    position = 0
    for cut in cuts * (len(wire) // sum(cuts) + 1):
        out += decoder.feed(wire[position : position + cut])
        position += cut
        if position >= len(wire):
            break
    assert bytes(out) == b"".join(payloads)
    assert decoder.done


def test_chunk_extensions_and_trailers() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"3;name=x\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n") == b"abc"
    assert decoder.done


@pytest.mark.parametrize("wire", [b"zz\r\n", b"3\r\nabcX\r\n", b"1" * 2000])
def test_malformed_chunking_is_a_protocol_error(wire: bytes) -> None:
    with pytest.raises(HttpError) as info:
        ChunkedDecoder().feed(wire)
    assert info.value.kind == "protocol_error"


def test_endpoint_from_url() -> None:
    endpoint = Endpoint.from_url("http://127.0.0.1:8080/v1/models?x=1")
    assert (endpoint.host, endpoint.port, endpoint.path) == ("127.0.0.1", 8080, "/v1/models?x=1")
    assert endpoint.host_header == "127.0.0.1:8080"
    assert Endpoint.from_url("https://example.com").host_header == "example.com"
    assert Endpoint.from_url("https://example.com").port == 443


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """A raw TCP server whose reply is written by the test; yields its URL."""
    servers: list[asyncio.Server] = []

    async def start(reply: Reply) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reply(reader, writer)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/path"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def writes(*pieces: bytes) -> Reply:
    async def reply(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()

    return reply


async def test_chunked_response_read_as_it_arrives(serve: Serve) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r1\r\n\r\n"
    url = await serve(writes(head + b"5\r\nhello\r\n", b"6\r\n world\r\n0\r\n\r\n"))
    async with await open_request(url) as response:
        assert response.status == 200
        assert response.headers["x-request-id"] == "r1"
        assert await response.read_all() == b"hello world"
        assert await response.read() == b""


async def test_content_length_body(serve: Serve) -> None:
    url = await serve(writes(b'HTTP/1.1 400 Bad Request\r\nContent-Length: 4\r\n\r\n{"a"', b"xx"))
    status, _, body = await fetch(url)
    assert (status, body) == (400, b'{"a"')


async def test_body_until_close(serve: Serve) -> None:
    url = await serve(writes(b"HTTP/1.1 200 OK\r\n\r\nabc", b"def"))
    assert (await fetch(url))[2] == b"abcdef"


async def test_truncated_chunked_body_is_a_read_error(serve: Serve) -> None:
    url = await serve(writes(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel"))
    with pytest.raises(HttpError) as info:
        await fetch(url)
    assert info.value.kind == "read_error"


async def test_not_http_is_a_protocol_error(serve: Serve) -> None:
    url = await serve(writes(b"SSH-2.0-OpenSSH\r\n\r\n"))
    with pytest.raises(HttpError) as info:
        await fetch(url)
    assert info.value.kind == "protocol_error"


async def test_body_larger_than_the_bound(serve: Serve) -> None:
    url = await serve(writes(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100))
    with pytest.raises(HttpError, match="larger than 10"):
        await fetch(url, max_bytes=10)


async def test_refused_connection_is_a_connect_error() -> None:
    port = free_port()
    with pytest.raises(HttpError) as info:
        await fetch(f"http://127.0.0.1:{port}/")
    assert info.value.kind == "connect_error"


async def test_request_line_headers_and_body_are_sent(serve: Serve) -> None:
    seen: list[bytes] = []

    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readexactly(7))
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    url = await serve(reply)
    status, _, _ = await fetch(url, method="POST", headers={"X-A": "1"}, body=b"payload")
    assert status == 204
    assert seen == [b"payload"]


async def test_small_receive_buffer_is_set_before_connect(serve: Serve) -> None:
    url = await serve(writes(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
    response = await open_request(url, rcvbuf=4096)
    try:
        sock = response.writer.get_extra_info("socket")
        # Linux doubles the value for bookkeeping; the default is far larger.
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) <= 2 * 4096
        assert response.queued_bytes() is not None
    finally:
        response.close()
    assert response.queued_bytes() is None
