"""The prefix cache's disk tier (``[engine.cache] cache_dir``): host-tier entries
written through to files, so that a restarted device answers a known prompt without
prefilling it again. A state tier (``tier.StateTier``): its keys are the prompts'
(``tier.prompt_key``), the host tier's too, so a file is named for the tokens it holds.

Each entry is one file, ``<key>.kvc``: a JSON header line (format, the model's fingerprint, the
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

from edge_llm.engine.kv.tier import SavedKv, TierReading, prompt_key

if TYPE_CHECKING:
    from edge_llm.engine.kv.host_cache import HostCache
    from edge_llm.engine.runtime.backend import Backend

FORMAT = "edge-llm-kv/1"
SUFFIX = ".kvc"
MAX_PENDING_WRITES = 16  # beside the slots' entries written at stop
_log = logging.getLogger("edge_llm.cache")


class DiskCache:
    """The files: written by a thread of its own, read by whoever asks."""

    def __init__(self, directory: Path, capacity_bytes: int, fingerprint: str) -> None:
        self.directory = directory
        self.capacity_bytes = capacity_bytes
        self.fingerprint = fingerprint
        self.written = 0
        self.skipped = 0
        self.num_bytes = 0  # the directory's entries, kept by the writer (read anywhere)
        self._queue: queue.Queue[tuple[str, SavedKv] | None] = queue.Queue(MAX_PENDING_WRITES)
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = threading.Thread(target=self._drain, name="kv-disk-writer", daemon=True)
        self._writer.start()
        self.num_bytes = sum(size for _, size in self._files())

    def write(self, key: str, saved: SavedKv) -> bool:
        """Queue a state for writing as ``key``; dropped (False) when the writer is behind."""
        try:
            self._queue.put_nowait((key, saved))
        except queue.Full:
            _log.warning("disk cache: writer behind, an entry was not written")
            return False
        return True

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout=60)

    def newest(self) -> list[tuple[str, int]]:
        """(key, file size) of every entry, newest first."""
        files = sorted(self._files(), key=lambda f: -f[0].stat().st_mtime)
        return [(path.stem, size) for path, size in files]

    def read(self, key: str) -> SavedKv | None:
        """The entry ``key``, checked; None (and a log line) when missing, corrupt (then
        removed) or foreign."""
        path = self._path(key)
        try:
            data = path.read_bytes()
            head, _, payload = data.partition(b"\n")
            header = json.loads(head)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self._skip(path, f"unreadable ({exc})", remove=True)
            return None
        why = self._refusal(header, payload)
        if why is not None:
            self._skip(path, why, remove=why == "checksum mismatch")
            return None
        state_bytes = int(header["state_bytes"])
        logits = payload[state_bytes:]
        return SavedKv(
            payload[:state_bytes],
            tuple(header["tokens"]),
            int(header["n_prompt"]),
            np.frombuffer(logits, dtype=np.float32).copy() if logits else None,
        )

    def remove(self, key: str) -> int:
        """Delete the entry ``key``; its size (0: there was none)."""
        path = self._path(key)
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            return 0
        self.num_bytes = max(0, self.num_bytes - size)
        return size

    # -- files ---------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def _files(self) -> Iterator[tuple[Path, int]]:
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                yield path, path.stat().st_size
            except OSError:
                continue

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._store(*item)
            except OSError as exc:
                _log.warning("disk cache: cannot write an entry: %s", exc)

    def _store(self, key: str, saved: SavedKv) -> None:
        logits = (
            b""
            if saved.first_logits is None
            else np.asarray(saved.first_logits, dtype=np.float32).tobytes()
        )
        payload = saved.state + logits
        header = {
            "format": FORMAT,
            "fingerprint": self.fingerprint,
            "n_prompt": saved.n_prompt,
            "tokens": list(saved.tokens),
            "state_bytes": len(saved.state),
            "logits_bytes": len(logits),
            "sha256": hashlib.sha256(payload).hexdigest(),
        }
        path = self._path(key)
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
    """The disk tier as a state tier (``tier.StateTier``): there is one whether or not
    ``cache_dir`` is set (none: it holds nothing, reserves nothing). Not in the memory
    ledger: files. Its ``store`` queues the write (the engine never waits on a file),
    its room is made by the writer (oldest files out, past ``cache_dir_mb``)."""

    disk: DiskCache | None
    name = "disk"

    @property
    def enabled(self) -> bool:
        return self.disk is not None

    def read(self) -> TierReading:
        disk = self.disk
        held, skipped = (disk.num_bytes, disk.skipped) if disk is not None else (0, 0)
        return TierReading(
            held={"disk": held},
            debug={"kv_disk_cache_bytes": held, "kv_disk_cache_skipped": skipped},
        )

    def reserve(self, key: str, num_bytes: int) -> bool:
        """Whether a state of ``num_bytes`` fits the directory at all (a larger one
        would push every other entry out, then itself)."""
        return self.disk is not None and num_bytes <= self.disk.capacity_bytes

    def store(self, key: str, saved: SavedKv) -> bool:
        return self.disk is not None and self.disk.write(key, saved)

    def load(self, key: str) -> SavedKv | None:
        return self.disk.read(key) if self.disk is not None else None

    def evict(self, key: str) -> int:
        return self.disk.remove(key) if self.disk is not None else 0

    def close(self) -> None:
        """Write what is queued (the kept slots too: :meth:`save_kept` ran first)."""
        if self.disk is not None:
            self.disk.close()

    def read_back(self, host: HostCache, lock: threading.RLock) -> None:
        """Start a thread loading the newest valid entries into the host tier, as many
        as its room takes."""
        if self.disk is not None:
            threading.Thread(target=self._read_back, args=(self.disk, host, lock),
                             name="kv-disk-loader", daemon=True).start()  # fmt: skip

    def _read_back(self, disk: DiskCache, host: HostCache, lock: threading.RLock) -> None:
        used = 0
        for key, size in disk.newest():
            if used + size > host.capacity_bytes:
                return
            saved = self.load(key)
            if saved is None:
                continue  # skipped, with a log line
            with lock:
                if not host.adopt(saved, "disk"):
                    return
            used += size

    def save_kept(
        self,
        kept: Iterable[tuple[int, tuple[int, ...], int, Any]],
        save_state: Callable[[int], bytes],
    ) -> None:
        """Write kept slots (``KvBook.kept``): the engine has stopped."""
        if self.disk is None:
            return
        for slot, tokens, n_prompt, logits in kept:
            saved = SavedKv(save_state(slot), tokens, n_prompt, logits)
            key = prompt_key(tokens)
            if self.reserve(key, len(saved.state)):
                self.store(key, saved)


def disk_cache(directory: str | None, capacity_bytes: int, backend: Backend) -> DiskCache | None:
    """The disk tier ``cache_dir`` asks for, for states of this backend (None: none)."""
    if not directory:
        return None
    return DiskCache(Path(directory), capacity_bytes, backend.state_fingerprint)
