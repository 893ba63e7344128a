"""A stand-in for the Hugging Face Hub on 127.0.0.1, written from its documented HTTP
behaviour (what ``huggingface_hub`` relies on):

- ``HEAD``/``GET /{repo}/resolve/{revision}/{file}``: for an LFS file a 302 whose
  headers carry ``X-Repo-Commit``, ``X-Linked-Etag`` (the file's sha256, quoted),
  ``X-Linked-Size`` and ``Location`` (the bytes' address on the CDN, another origin:
  a port of its own, so that clients read the metadata from the 302 as from the Hub);
- the CDN: ``GET`` with ``Range: bytes=N-`` answers 206 with ``Content-Range``;
- ``GET /api/models/{repo}`` (``siblings``) and ``/api/models/{repo}/tree/{revision}``
  (``path``, ``size``, ``oid`` and ``lfs.oid`` = sha256);
- an unknown repo or file: 404 with ``X-Error-Code: RepoNotFound`` / ``EntryNotFound``.

Faults for the tests: ``cut_after`` closes the next CDN response after that many
bytes (with ``down_after_cut`` the CDN answers 503 from then on); ``corrupt`` serves
bytes that do not match the advertised sha256; ``hold_at`` holds the next CDN
response after that many bytes (``held`` is set) until ``release`` is set. It records
every CDN request's ``Range`` and counts the bytes it sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_CHUNK = 256 * 1024


@dataclass
class HubFile:
    path: Path
    size: int
    sha256: str


@dataclass
class HubStandIn:
    repos: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    cut_after: int | None = None  # the next CDN response stops after so many bytes
    corrupt: bool = False
    down_after_cut: bool = False  # after the cut, the CDN answers 503 until ``down`` is reset
    down: bool = False
    hold_at: int | None = None  # the next CDN response waits after so many bytes
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    ranges: list[str | None] = field(default_factory=list)
    bytes_sent: int = 0
    url: str = ""
    cdn_url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def add(self, repo: str, filename: str, path: Path) -> HubFile:
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
        entry = HubFile(path, path.stat().st_size, digest.hexdigest())
        self.repos.setdefault(repo, {})[filename] = entry
        return entry

    # -- serving --------------------------------------------------------------------

    def hub_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{owner}/{repo}/resolve/{revision}/{file:.+}", self._resolve)
        app.router.add_get("/api/models/{owner}/{repo}/tree/{revision}", self._tree)
        app.router.add_get("/api/models/{owner}/{repo}", self._info)
        return app

    def cdn_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/cdn/{sha}", self._cdn, allow_head=False)
        return app

    def _entry(self, request: web.Request) -> dict[str, HubFile]:
        repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"},
                                   text="Repository not found")  # fmt: skip
        return self.repos[repo]

    async def _resolve(self, request: web.Request) -> web.Response:
        files = self._entry(request)
        entry = files.get(request.match_info["file"])
        if entry is None:
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"},
                                   text="Entry not found")  # fmt: skip
        return web.Response(status=302, headers={
            "Location": f"{self.cdn_url}/cdn/{entry.sha256}",
            "X-Repo-Commit": COMMIT,
            "X-Linked-Etag": f'"{entry.sha256}"',
            "X-Linked-Size": str(entry.size),
            "ETag": '"0000000000000000000000000000000000000000"',
        })  # fmt: skip

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        entry = next(f for files in self.repos.values() for f in files.values()
                     if f.sha256 == request.match_info["sha"])  # fmt: skip
        asked = request.headers.get("Range")
        self.ranges.append(asked)
        if self.down:
            raise web.HTTPServiceUnavailable()
        start = int(asked.removeprefix("bytes=").split("-")[0]) if asked else 0
        response = web.StreamResponse(status=206 if asked else 200)
        response.content_length = entry.size - start
        if asked:
            response.headers["Content-Range"] = f"bytes {start}-{entry.size - 1}/{entry.size}"
        await response.prepare(request)
        cut, self.cut_after = self.cut_after, None
        hold, self.hold_at = self.hold_at, None
        with entry.path.open("rb") as fh:
            fh.seek(start)
            sent = 0
            while block := fh.read(_CHUNK):
                if cut is not None and sent + len(block) >= cut:
                    block = block[: cut - sent]
                if self.corrupt:
                    block = bytes(b ^ 0xFF for b in block[:1]) + block[1:]
                await response.write(block)
                sent += len(block)
                self.bytes_sent += len(block)
                if cut is not None and sent >= cut:
                    self.down = self.down_after_cut
                    assert request.transport is not None
                    request.transport.close()  # the connection drops mid-file
                    return response
                if hold is not None and sent >= hold:
                    hold = None
                    self.held.set()
                    await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 60)
        await response.write_eof()
        return response

    async def _tree(self, request: web.Request) -> web.Response:
        files = self._entry(request)
        return web.json_response([
            {"type": "file", "oid": "0" * 40, "size": f.size, "path": name,
             "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
            for name, f in files.items()
        ])  # fmt: skip

    async def _info(self, request: web.Request) -> web.Response:
        files = self._entry(request)
        repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
        siblings = [{"rfilename": name} for name in files]
        return web.json_response({"id": repo, "sha": COMMIT, "siblings": siblings})

    # -- running in a thread of its own ----------------------------------------------

    def start(self) -> HubStandIn:
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def run() -> None:
            loop.run_until_complete(self._listen())
            ready.set()
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    async def _listen(self) -> None:
        self.url = await self._site(self.hub_app())
        self.cdn_url = await self._site(self.cdn_app())

    async def _site(self, app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        self._runners.append(runner)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(runner, sock).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def _cleanup(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30)


def tiny_gguf(path: Path, *, padding: int = 3 << 20, template: bool = True) -> Path:
    """A GGUF with metadata and no tensors (``llama``, Q4_K_M, a chat template),
    padded to ``padding`` bytes: what the store reads, not a model that loads."""
    keys: list[tuple[str, int, bytes]] = [
        ("general.architecture", 8, _gguf_string("llama")),
        ("general.file_type", 4, struct.pack("<I", 15)),
        ("llama.context_length", 4, struct.pack("<I", 2048)),
    ]
    if template:
        keys.append(("tokenizer.chat_template", 8, _gguf_string("{{ messages }}")))
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys))
    for key, kind, value in keys:
        body += _gguf_string(key) + struct.pack("<I", kind) + value
    path.write_bytes(body + bytes(range(256)) * ((padding - len(body)) // 256))
    return path


def _gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def main() -> None:
    """``python tests/hub_standin.py OWNER/REPO FILE PATH``: the stand-in in a process of
    its own (a test that measures its own event loop shares no GIL with it); prints
    ``{"url", "cdn", "size", "sha256"}`` as one JSON line, serves until stdin closes."""
    import json
    import sys

    repo, filename, path = sys.argv[1:4]
    hub = HubStandIn()
    entry = hub.add(repo, filename, Path(path))
    hub.start()
    cdn = f"{hub.cdn_url}/cdn/{entry.sha256}"
    print(json.dumps({"url": hub.url, "cdn": cdn, "size": entry.size, "sha256": entry.sha256}),
          flush=True)  # fmt: skip
    sys.stdin.read()
    hub.stop()


if __name__ == "__main__":
    main()
