"""One file's bytes into a partial file: resumed with ``Range``, hashed as they come.

The event loop only reads: each chunk goes, the moment it arrives, to one writer
thread that appends it (unbuffered) and hashes it, so the loop that paces every
stream of the server does no disk write and no sha256 (about a second of CPU per GB).
Reading never waits for the disk unless the writer is ``WRITE_AHEAD_BYTES`` behind,
and every chunk read is written before the attempt ends, so a cut at any byte costs
only the bytes after it: the next attempt, in this command or the next run, asks for
``Range: bytes=<length of the partial file>-``. (Reading as fast as data comes
matters: when the connection breaks, aiohttp drops what it had received but not
handed over.) The sha256 is computed over the partial file's old bytes once, then
over each new chunk, so verifying needs no second pass over a large file. A server
that ignores ``Range`` (200 instead of 206) restarts the file from zero rather than
appending a second copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import queue
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from edge_llm.models.hub import RemoteError, RemoteFile

MIB = 1024 * 1024
_READ_CHUNK = MIB
# Room left free beside the file: a full disk breaks more than the download.
DISK_MARGIN_BYTES = 64 * MIB
# Bytes read but not written yet, at most (then reading waits for the disk).
WRITE_AHEAD_BYTES = 16 * MIB
_REPORT_BYTES = MIB  # progress, and a wake-up of the loop, per MiB written

OnBytes = Callable[[int, "int | None"], None]  # (bytes so far, total or None)


class NotEnoughDisk(OSError):
    """The file would not fit the free space (checked before any byte is written)."""


class _Transient(Exception):
    """A status worth another attempt (429, 5xx)."""


@dataclass(frozen=True)
class Retry:
    """How often a download is resumed after a cut before it gives up, and the pause
    between attempts; any new byte resets the count (a slow link is not a dead one)."""

    attempts: int = 5
    backoff_s: float = 1.0
    connect_timeout_s: float = 30.0
    read_timeout_s: float = 60.0


@dataclass
class _Partial:
    path: Path
    length: int
    hasher: Any  # hashlib's sha256 object

    def restart(self) -> None:
        self.path.write_bytes(b"")
        self.length = 0
        self.hasher = hashlib.sha256()


async def fetch(remote: RemoteFile, partial: Path, on_bytes: OnBytes, retry: Retry) -> str:
    """Download ``remote`` into ``partial`` (resuming it) and return the sha256 of the
    whole file. Raises RemoteError (refused, or still cut after the retries) or
    NotEnoughDisk."""
    state = await asyncio.to_thread(_open_partial, partial, remote.size)
    timeout = aiohttp.ClientTimeout(
        sock_connect=retry.connect_timeout_s, sock_read=retry.read_timeout_s
    )
    left = retry.attempts
    async with aiohttp.ClientSession(timeout=timeout, trust_env=True) as session:
        while True:
            before = state.length
            try:
                if await _attempt(session, remote, state, on_bytes):
                    return str(state.hasher.hexdigest())
                problem = f"the connection ended at byte {state.length}"
            except aiohttp.InvalidURL as exc:
                raise RemoteError(f"{remote.source}: not a URL to download from: {exc}") from exc
            except (aiohttp.ClientError, TimeoutError, _Transient) as exc:
                problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
            left = retry.attempts if state.length > before else left - 1
            if left <= 0:
                raise RemoteError(
                    f"{remote.source}: {problem}; {state.length} bytes are kept and the "
                    "next pull resumes from there"
                )
            await asyncio.sleep(retry.backoff_s)


async def _attempt(
    session: aiohttp.ClientSession, remote: RemoteFile, state: _Partial, on_bytes: OnBytes
) -> bool:
    """One GET from where the partial file ends; True when the file is complete."""
    headers = dict(remote.headers)
    if state.length:
        headers["Range"] = f"bytes={state.length}-"
    async with session.get(remote.url, headers=headers) as response:
        if response.status == 416 and state.length and state.length == remote.size:
            return True  # complete already (a cut after the last byte)
        if response.status not in (200, 206):
            _refuse(remote, response.status)
        if response.status == 200 and state.length:
            await asyncio.to_thread(state.restart)  # Range ignored: from zero
        elif response.status == 206 and not _starts_at(response, state.length):
            raise RemoteError(f"{remote.source}: the server resumed at the wrong byte")
        total = _total(response, state.length) or remote.size
        check_disk(state.path.parent, (total or 0) - state.length)
        on_bytes(state.length, total)
        received = state.length
        async with _Writer(state, lambda: on_bytes(state.length, total)) as writer:
            async for chunk in response.content.iter_any():
                received += len(chunk)
                if total is not None and received > total:
                    raise RemoteError(f"{remote.source}: the server sent more than {total} bytes")
                await writer.put(chunk)
        return total is None or state.length >= total


class _Writer:
    """Appends and hashes a download's chunks in one thread of its own, in order.
    ``put`` waits only while ``WRITE_AHEAD_BYTES`` are not written yet; leaving the
    ``async with`` (however: the end, a cut, a cancel) waits until every chunk put is
    written, so the partial file's length is exactly the bytes received, and no
    thread writes to it once the download's lock is released. The thread alone
    changes ``state`` meanwhile. ``written`` is called on the loop every
    ``_REPORT_BYTES`` written and at the end; the thread wakes the loop for nothing
    else unless ``put`` waits for room."""

    def __init__(self, state: _Partial, written: Callable[[], None]) -> None:
        self._state = state
        self._written = written
        self._loop = asyncio.get_running_loop()
        self._chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._put_bytes = 0  # changed on the loop only
        self._written_bytes = self._reported = 0  # changed by the thread only
        self._waiting = False  # put waits for room (the thread then says when it wrote)
        self._room = asyncio.Event()
        self._done: asyncio.Future[None] | None = None

    async def __aenter__(self) -> _Writer:
        self._done = asyncio.ensure_future(asyncio.to_thread(self._run))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._chunks.put(None)
        try:
            await _unless_cancelled_wait_for(self._finished())
        finally:
            self._written()

    async def put(self, chunk: bytes) -> None:
        """Hand ``chunk`` to the writer; raises the writer's error (the disk's)."""
        done = self._finished()
        if done.done():
            done.result()  # it stopped: its error (it stops early on no other)
        self._put_bytes += len(chunk)
        self._chunks.put(chunk)
        try:
            while not done.done():
                self._room.clear()
                self._waiting = True  # before the check: a write after it wakes us
                if self._put_bytes - self._written_bytes <= WRITE_AHEAD_BYTES:
                    break
                room: asyncio.Future[Any] = asyncio.ensure_future(self._room.wait())
                try:
                    await asyncio.wait([room, done], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    room.cancel()
        finally:
            self._waiting = False

    def _finished(self) -> asyncio.Future[None]:
        assert self._done is not None, "use it in `async with`"
        return self._done

    def _run(self) -> None:
        state = self._state
        with state.path.open("ab", buffering=0) as out:
            while (chunk := self._chunks.get()) is not None:
                out.write(chunk)
                state.hasher.update(chunk)
                state.length += len(chunk)
                self._written_bytes += len(chunk)
                if self._waiting or self._written_bytes - self._reported >= _REPORT_BYTES:
                    self._reported = self._written_bytes
                    self._loop.call_soon_threadsafe(self._wrote)

    def _wrote(self) -> None:
        self._room.set()
        self._written()


async def _unless_cancelled_wait_for(future: asyncio.Future[None]) -> None:
    """Await ``future`` to its end even when cancelled meanwhile (then re-raised)."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # the writer's error: result() raises it below
            break
    if cancelled:
        raise asyncio.CancelledError
    future.result()


def _open_partial(path: Path, size: int | None) -> _Partial:
    """The partial file as far as it goes, with the sha256 of its bytes so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    length = path.stat().st_size
    if size is not None and length > size:  # not this file's: start over
        path.write_bytes(b"")
        length = 0
    return _Partial(path, length, _hasher_of(path))


def _hasher_of(path: Path) -> Any:
    hasher = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_READ_CHUNK):
            hasher.update(block)
    return hasher


def sha256_of(path: Path) -> str:
    """The file's sha256, read in 1 MiB blocks."""
    return str(_hasher_of(path).hexdigest())


def _starts_at(response: aiohttp.ClientResponse, offset: int) -> bool:
    text = response.headers.get("Content-Range", "")  # bytes START-END/TOTAL
    return text.startswith(f"bytes {offset}-")


def _total(response: aiohttp.ClientResponse, offset: int) -> int | None:
    text = response.headers.get("Content-Range", "")
    if response.status == 206 and "/" in text and text.rsplit("/", 1)[1].isdigit():
        return int(text.rsplit("/", 1)[1])
    length = response.content_length
    if length is None:
        return None
    return length + (offset if response.status == 206 else 0)


def check_disk(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if need > 0 and need + DISK_MARGIN_BYTES > free:
        raise NotEnoughDisk(
            f"not enough disk space in {folder}: the download needs {need // MIB} MiB "
            f"more (and {DISK_MARGIN_BYTES // MIB} MiB to spare), {free // MIB} MiB are free"
        )


def _refuse(remote: RemoteFile, status: int) -> None:
    if status == 429 or status >= 500:
        raise _Transient(f"HTTP {status}")
    hint = {401: " (set HF_TOKEN?)", 403: " (gated: accept its terms and set HF_TOKEN)",
            404: " (not found)"}.get(status, "")  # fmt: skip
    raise RemoteError(f"{remote.source}: HTTP {status}{hint}")
