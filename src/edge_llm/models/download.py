"""One file's bytes into a partial file: resumed with ``Range``, hashed as they come.

Every chunk is written (unbuffered) the moment it arrives, so a cut at any byte
costs only the bytes after it: the next attempt, in this command or the next run,
asks for ``Range: bytes=<length of the partial file>-``. The sha256 is computed
over the partial file's old bytes once, then over each new chunk, so verifying
needs no second pass over a large file. A server that ignores ``Range`` (200
instead of 206) restarts the file from zero rather than appending a second copy.
"""

from __future__ import annotations

import asyncio
import hashlib
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
        with state.path.open("ab", buffering=0) as out:
            async for chunk in response.content.iter_any():
                if total is not None and state.length + len(chunk) > total:
                    raise RemoteError(f"{remote.source}: the server sent more than {total} bytes")
                out.write(chunk)
                state.hasher.update(chunk)
                state.length += len(chunk)
                on_bytes(state.length, total)
        return total is None or state.length >= total


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
