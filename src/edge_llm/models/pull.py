"""A pull: resolve the source, download (resumable), verify, store, name.

The steps report what they do as Ollama's ``/api/pull`` does (``pulling manifest``,
``pulling <digest>`` with ``total`` and ``completed``, ``verifying sha256 digest``,
``writing manifest``, ``success``), so the CLI's progress line and the NDJSON stream
read the same events. The name is written last: a failure at any step (a cut the
retries could not bridge, a digest that does not match, a file that is not a GGUF)
leaves nothing under the name; only a cut download's bytes stay, for the next run.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_llm.models.download import Retry, check_disk, fetch, sha256_of
from edge_llm.models.gguf import FILE_TYPES, GgufError, read_metadata
from edge_llm.models.hub import RemoteError, RemoteFile, in_hf_cache, resolve
from edge_llm.models.sources import Source
from edge_llm.models.store import ModelStore, StoredModel

_LOCK_POLL_S = 0.5


class DigestMismatch(RemoteError):
    """The bytes' sha256 is not the one expected; nothing was stored."""


@dataclass(frozen=True)
class PullStatus:
    """One progress event (Ollama's ``/api/pull`` line)."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if v is not None}


Report = Callable[[PullStatus], None]


class Puller:
    def __init__(
        self,
        store: ModelStore,
        *,
        endpoint: str | None = None,
        retry: Retry | None = None,
        in_use: Callable[[str], bool] | None = None,
    ) -> None:
        """``endpoint``: the Hub's address (None: ``HF_ENDPOINT``, else huggingface.co);
        ``in_use(path)``: a file a running server serves, kept when its name is pulled
        again with other bytes (else deleted unless another name holds it)."""
        self.store = store
        self.endpoint = endpoint
        self.retry = retry or Retry()
        self.in_use = in_use or (lambda _: False)

    async def pull(self, source: Source, report: Report, sha256: str | None = None) -> StoredModel:
        """Pull ``source`` under its name (a Hub source's own, a URL's given one).
        ``sha256``: the digest to insist on (beside or instead of the Hub's)."""
        report(PullStatus("pulling manifest"))
        remote = await asyncio.to_thread(resolve, source, self.endpoint)
        expected = _expected(source.name, remote, sha256)
        current = self.store.find(source.name)
        if current is not None and expected in (current.sha256, None):
            report(PullStatus("success"))  # up to date: nothing to download
            return current
        self.store.ensure()
        with await self._locked(remote.key, source.name, report):
            actual = await self._download(remote, expected, report)
            report(PullStatus("verifying sha256 digest"))
            if expected is not None and actual != expected:
                self.store.partial_path(remote.key).unlink(missing_ok=True)
                raise DigestMismatch(_mismatch(source.name, remote, expected, actual, sha256))
            blob = await asyncio.to_thread(self._adopt, remote, actual)
        report(PullStatus("writing manifest"))
        old = None  # the name's bytes before, deleted unless still served or shared
        if current is not None and current.sha256 != actual and not self.in_use(current.blob):
            old = current.sha256
        model = await asyncio.to_thread(self._name, source.name, remote, actual, blob, old)
        report(PullStatus("success"))
        return model

    async def _download(self, remote: RemoteFile, expected: str | None, report: Report) -> str:
        """The file's sha256, downloading it unless its blob is stored already."""
        digest = f"sha256:{remote.key}"
        if expected is not None and self.store.blob_path(expected).is_file():
            return expected  # another name holds these bytes (verified when stored)
        partial = self.store.partial_path(remote.key)
        have = partial.stat().st_size if partial.exists() else 0
        if remote.size is not None:
            check_disk(self.store.partial, remote.size - have)

        def on_bytes(done: int, total: int | None) -> None:
            report(PullStatus(f"pulling {remote.key[:12]}", digest, total, done))

        if await asyncio.to_thread(_copy_from_hf_cache, remote, partial):
            on_bytes(remote.size or 0, remote.size)  # no byte from the network
            return await asyncio.to_thread(sha256_of, partial)
        return await fetch(remote, partial, on_bytes, self.retry)

    def _name(
        self, name: str, remote: RemoteFile, sha256: str, blob: Path, old: str | None
    ) -> StoredModel:
        """Give ``name`` to the stored file (its manifest, fsynced: off the loop); the
        name's ``old`` bytes go unless another name holds them."""
        model = self.store.write_manifest(_manifest(name, remote, sha256, blob))
        if old is not None:
            self.store.release(old)
        return model

    def _adopt(self, remote: RemoteFile, sha256: str) -> Path:
        """The verified file into the blobs (if not there already); it must be a GGUF."""
        blob = self.store.blob_path(sha256)
        partial = self.store.partial_path(remote.key)
        if not blob.is_file():
            blob = self.store.adopt_blob(partial, sha256)
        partial.unlink(missing_ok=True)
        try:
            read_metadata(blob)
        except GgufError as exc:
            if not any(m.sha256 == sha256 for m in self.store.list()):
                blob.unlink(missing_ok=True)
            raise RemoteError(f"{remote.source} is not a GGUF file: {exc}") from exc
        return blob

    async def _locked(
        self, key: str, name: str, report: Report
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the download's lock (another process or request pulling the same file
        is waited for; its bytes are then resumed or found stored)."""
        path = self.store.partial / f"{key}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return _unlock(fd)
                except BlockingIOError:
                    if not told:
                        report(PullStatus(f"waiting for another pull of {name}"))
                        told = True
                    await asyncio.sleep(_LOCK_POLL_S)
        except BaseException:  # cancelled while waiting (the reader went away)
            os.close(fd)
            raise


@contextlib.contextmanager
def _unlock(fd: int) -> Iterator[None]:
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _copy_from_hf_cache(remote: RemoteFile, partial: Path) -> bool:
    """A file huggingface_hub's cache holds already (as large as the Hub says) becomes
    the partial file: linked when on the same file system, else copied. Verified like
    a download."""
    cached = in_hf_cache(remote)
    if cached is None or os.path.getsize(cached) != remote.size:
        return False
    partial.unlink(missing_ok=True)
    try:
        os.link(cached, partial)
    except OSError:
        shutil.copyfile(cached, partial)
    return True


def _expected(name: str, remote: RemoteFile, given: str | None) -> str | None:
    if given is not None and remote.sha256 is not None and given != remote.sha256:
        raise DigestMismatch(
            f"{name}: --sha256 {given} is not the Hub's sha256 {remote.sha256} "
            f"(X-Linked-Etag) for {remote.source}; nothing was downloaded"
        )
    return given or remote.sha256


def _mismatch(name: str, remote: RemoteFile, expected: str, actual: str, given: str | None) -> str:
    origin = "--sha256" if given else "the Hub's X-Linked-Etag"
    return (
        f"{name}: sha256 mismatch: expected {expected} ({origin}), got {actual} from "
        f"{remote.url}; the download was deleted and nothing is stored under {name}"
    )


def _manifest(name: str, remote: RemoteFile, sha256: str, blob: Path) -> StoredModel:
    metadata = read_metadata(blob)
    arch = str(metadata.get("general.architecture") or "")
    file_type = metadata.get("general.file_type")
    context = metadata.get(f"{arch}.context_length")
    return StoredModel(
        name=name,
        source=remote.source,
        repo=remote.repo,
        filename=remote.filename,
        revision=remote.revision,
        size=blob.stat().st_size,
        sha256=sha256,
        architecture=arch,
        quant=FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else "",
        chat_template=bool(metadata.get("tokenizer.chat_template")),
        context_length=context if isinstance(context, int) else None,
    )
