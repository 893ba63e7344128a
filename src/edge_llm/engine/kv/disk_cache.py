"""The prefix cache's disk tier (``[engine.cache] cache_dir``): host-tier entries
written through to files, so that a restarted device answers a known prompt without
prefilling it again.

Each entry is one file: a JSON header line (format, the model's fingerprint, the
tokens its cells hold, their prompt length, the payload's size and SHA-256) and the
payload (the saved KV state, then the kept first-token logits as float32). Writes go
through a bounded queue to a thread of their own (a full queue drops the write), to a
temporary name and then renamed; the directory is kept under ``cache_dir_mb``, oldest
first out. At start a thread reads the newest files that fit the host tier back into
it, each checked against its checksum and the model's fingerprint: a corrupt or
foreign file is skipped with a log line, never loaded (a corrupt one is removed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_llm.engine.kv.tier import TierReading

if TYPE_CHECKING:
    from edge_llm.engine.kv.host_cache import HostCache
    from edge_llm.engine.runtime.backend import Backend

FORMAT = "edge-llm-kv/1"
SUFFIX = ".kvc"
MAX_PENDING_WRITES = 16  # beside the slots' entries written at stop
_log = logging.getLogger("edge_llm.cache")


@dataclass(frozen=True)
class DiskEntry:
    tokens: tuple[int, ...]
    n_prompt: int
    state: bytes
    first_logits: Any  # a float32 vector, or None


class DiskCache:
    def __init__(self, directory: Path, capacity_bytes: int, fingerprint: str) -> None:
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self.fingerprint = fingerprint
        self.written = 0
        self.skipped = 0
        self.num_bytes = 0  # the directory's entries, kept by the writer (read anywhere)
        self._queue: queue.Queue[DiskEntry | None] = queue.Queue(MAX_PENDING_WRITES)
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = threading.Thread(target=self._drain, name="kv-disk-writer", daemon=True)
        self._writer.start()
        self.num_bytes = sum(size for _, size in self._files())

    def write(self, entry: DiskEntry) -> None:
        """Queue an entry for writing; dropped when the writer is behind."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            _log.warning("disk cache: writer behind, an entry was not written")

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout=60)

    def load(self, budget_bytes: int, accept: Callable[[DiskEntry, int], bool]) -> None:
        """Hand the newest valid entries to ``accept(entry, size)`` until it refuses
        one or ``budget_bytes`` is reached; skip and log the others."""
        used = 0
        for path, size in sorted(self._files(), key=lambda f: -f[0].stat().st_mtime):
            if used + size > budget_bytes:
                return
            entry = self._read(path)
            if entry is None:
                continue
            if not accept(entry, size):
                return
            used += size

    # -- files ---------------------------------------------------------------------

    def _files(self) -> Iterator[tuple[Path, int]]:
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                yield path, path.stat().st_size
            except OSError:
                continue

    def _drain(self) -> None:
        while (entry := self._queue.get()) is not None:
            try:
                self._store(entry)
            except OSError as exc:
                _log.warning("disk cache: cannot write an entry: %s", exc)

    def _store(self, entry: DiskEntry) -> None:
        logits = (
            b""
            if entry.first_logits is None
            else np.asarray(entry.first_logits, dtype=np.float32).tobytes()
        )
        payload = entry.state + logits
        header = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "n_prompt": entry.n_prompt,
            "tokens": list(entry.tokens),
            "state_bytes": len(entry.state),
            "logits_bytes": len(logits),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        name = hashlib.sha256(json.dumps(header["tokens"]).encode()).hexdigest()[:32]
        path = self.directory / f"{name}{SUFFIX}"
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(json.dumps(header).encode() + b"\n" + payload)
        os.replace(temporary, path)
        self.written += 1
        self._keep_under_capacity()

    def _keep_under_capacity(self) -> None:
        files = sorted(self._files(), key=lambda f: f[0].stat().st_mtime)
        total = sum(size for _, size in files)
        for path, size in files:
            if total <= self.capacity_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
        self.num_bytes = total

    def _read(self, path: Path) -> DiskEntry | None:
        try:
            data = path.read_bytes()
            head, _, payload = data.partition(b"\n")
            header = json.loads(head)
        except (OSError, ValueError) as exc:
            self._skip(path, f"unreadable ({exc})", remove=True)
            return None
        why = self._refusal(header, payload)
        if why is not None:
            self._skip(path, why, remove=why == "checksum mismatch")
            return None
        state_bytes = int(header["state_bytes"])
        logits = payload[state_bytes:]
        return DiskEntry(
            tuple(header["tokens"]),
            int(header["n_prompt"]),
            payload[:state_bytes],
            np.frombuffer(logits, dtype=np.float32).copy() if logits else None,
        )

    def _refusal(self, header: object, payload: bytes) -> str | None:
        """Why a file must not be loaded (None: it may)."""
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            return "not an edge-llm cache entry"
        if header.get("fingerprint") != self.fingerprint:
            return "saved for another model or KV type"
        if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
            return "checksum mismatch"
        return None

    def _skip(self, path: Path, why: str, *, remove: bool) -> None:
        self.skipped += 1
        _log.warning("disk cache: skipped %s: %s", path.name, why)
        if remove:
            path.unlink(missing_ok=True)


@dataclass
class DiskTier:
    """The disk tier as a KV tier (``tier.KvTier``): there is one whether or not
    ``cache_dir`` is set (none: it holds nothing). Not in the memory ledger: files."""

    disk: DiskCache | None

    def read(self) -> TierReading:
        disk = self.disk
        held, skipped = (disk.num_bytes, disk.skipped) if disk is not None else (0, 0)
        return TierReading(
            held={"disk": held},
            debug={"kv_disk_cache_bytes": held, "kv_disk_cache_skipped": skipped},
        )

    def close(self) -> None:
        """Write what is queued (the kept slots too: ``save_kept`` ran first)."""
        if self.disk is not None:
            self.disk.close()


def disk_cache(directory: str | None, capacity_bytes: int, backend: Backend) -> DiskCache | None:
    """The disk tier ``cache_dir`` asks for, for states of this backend (None: none)."""
    if not directory:
        return None
    return DiskCache(Path(directory), capacity_bytes, backend.state_fingerprint)


def read_back(disk: DiskCache, host: HostCache, lock: threading.RLock) -> None:
    """Start a thread reading the newest valid entries into the host tier."""

    def accept(entry: DiskEntry, size: int) -> bool:
        with lock:
            return host.add_saved(entry.tokens, entry.n_prompt, entry.first_logits, entry.state,
                                  "disk")  # fmt: skip

    threading.Thread(
        target=disk.load, args=(host.capacity_bytes, accept), name="kv-disk-loader", daemon=True
    ).start()


def save_kept(
    disk: DiskCache,
    kept: Iterable[tuple[int, tuple[int, ...], int, Any]],
    save_state: Callable[[int], bytes],
) -> None:
    """Write kept slots (``KvSlots.kept``) to the disk tier: the engine has stopped."""
    for slot, tokens, n_prompt, logits in kept:
        disk.write(DiskEntry(tokens, n_prompt, save_state(slot), logits))
