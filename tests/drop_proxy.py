"""A TCP proxy on 127.0.0.1 that resets connections at random points: the network
a resumable stream must survive (tests of resumable streams, e2e and the SDK's)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct


class DropProxy:
    """A TCP proxy on 127.0.0.1 that resets each connection (RST both ways) once the
    server has sent a random number of bytes through it (past the response head).
    ``silent``: the connection goes quiet there instead, open both ways and passing
    nothing more (a phone that walked out of Wi-Fi), until the proxy closes."""

    def __init__(
        self,
        target_port: int,
        seed: int,
        cut: tuple[int, int],
        *,
        silent: bool = False,
        server_side_buffer: int = 0,
    ) -> None:
        """``server_side_buffer``: SO_RCVBUF of the proxy's sockets to the server (0:
        the kernel's), so that a silent connection fills up after a few KiB."""
        self.target_port = target_port
        self.random = random.Random(seed)
        self.cut = cut
        self.silent = silent
        self.server_side_buffer = server_side_buffer
        self.resets = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def reset_all(self) -> None:
        """Reset every open connection now (a drop at a moment the test chooses)."""
        for writers in list(self.connections):
            _reset(*writers)
            self.resets += 1

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self.tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(sock=await self._to_server())
        up = asyncio.create_task(_pipe(client_r, server_w))
        serving = asyncio.current_task()
        assert serving is not None
        self.tasks |= {up, serving}
        self.connections.add(writers := (client_w, server_w))
        try:
            await self._down(server_r, client_w, self.random.randrange(*self.cut))
            if self.silent:
                up.cancel()  # nothing passes either way; close() ends the wait
                server_w.transport.pause_reading()  # asyncio would buffer 128 KiB more
                await asyncio.Event().wait()
        except ConnectionError:
            pass
        finally:
            up.cancel()
            self.tasks -= {up, serving}
            self.connections.discard(writers)
            _reset(client_w, server_w)

    async def _to_server(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if self.server_side_buffer:  # before connecting: it sets the window offered
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.server_side_buffer)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.target_port))
        return sock

    async def _down(
        self, server_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, budget: int
    ) -> None:
        """Pass the server's bytes on until ``budget`` of them went through."""
        while data := await server_r.read(4096):
            client_w.write(data[:budget])
            await client_w.drain()
            if len(data) >= budget:
                self.resets += 1
                return
            budget -= len(data)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()


def _reset(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        if writer.transport.is_closing():
            continue
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
