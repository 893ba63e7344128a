"""Pulled models on disk: content-addressed blobs and one small manifest per name.

Layout under the store's root (``models_dir``, by default ``~/.cache/edge-llm/models``)::

    blobs/sha256-<hex>          a verified GGUF, named by its digest
    manifests/<quoted name>.json what the name is: source, revision, size, sha256,
                                architecture, quant, chat template
    partial/<key>.part          a download under way (resumed from its length)

A name exists exactly when its manifest does. A pull writes the blob first (renamed
into place only once its sha256 matched), then the manifest (written to a temporary
file, flushed, renamed): a cut at any moment leaves either the old state or the new
one, never a truncated file under a name. Paths come from digests and from names
percent-encoded into one file name, never from a name's parts, so no name can reach
outside the root.
"""

from __future__ import annotations

import builtins  # ModelStore.list shadows list in its body
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from edge_llm.models.sources import SourceError, check_name, looks_pullable, parse_hub

MANIFEST_VERSION = 1
_NAMING_S = 600.0  # a blob younger than this may be a pull's not named yet


@dataclass(frozen=True)
class StoredModel:
    """One pulled model, as its manifest says."""

    name: str
    source: str  # the URL it was downloaded from (the Hub's resolve URL for Hub files)
    repo: str | None  # OWNER/REPO for Hub files
    filename: str
    revision: str | None  # the Hub commit the file came from
    size: int
    sha256: str
    architecture: str
    quant: str
    chat_template: bool
    context_length: int | None = None
    pulled_at: float = field(default_factory=time.time)
    blob: str = ""  # set by the store: the blob's path
    measured: dict[str, float] = field(default_factory=dict)  # e.g. prefill tokens/s

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body.pop("blob")
        return {"version": MANIFEST_VERSION, **body}


def default_root() -> Path:
    """``$XDG_CACHE_HOME/edge-llm/models``, else ``~/.cache/edge-llm/models``."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "edge-llm" / "models"


class ModelStore:
    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root else default_root()
        self.blobs = self.root / "blobs"
        self.manifests = self.root / "manifests"
        self.partial = self.root / "partial"

    def ensure(self) -> None:
        for folder in (self.blobs, self.manifests, self.partial):
            folder.mkdir(parents=True, exist_ok=True)

    # -- reading ----------------------------------------------------------------------

    def find(self, name: str) -> StoredModel | None:
        """The model pulled under ``name`` (or under its canonical spelling:
        ``owner/repo:q4_k_m`` is ``hf.co/owner/repo:Q4_K_M``); None if not pulled."""
        for candidate in self.spellings(name):
            try:
                manifest = self._manifest_path(candidate)
                if manifest.is_file():
                    return self._read(manifest)
            except OSError:  # a name longer than a file name may be: never stored
                continue
        return None

    @staticmethod
    def spellings(name: str) -> list[str]:
        """``name`` and the canonical name of the source it spells, if any."""
        spellings = [name]
        if looks_pullable(name):
            with contextlib.suppress(SourceError):
                spellings.append(parse_hub(name).name)
        return spellings

    def by_blob(self, path: str) -> StoredModel | None:
        """The model whose file ``path`` is (the first name holding it); None for a
        file outside the store."""
        if Path(path).parent.resolve() != self.blobs.resolve():
            return None
        return next((m for m in self.list() if Path(m.blob).name == Path(path).name), None)

    def list(self) -> list[StoredModel]:
        """Every pulled model, by name."""
        if not self.manifests.is_dir():
            return []
        found = [self._read(path) for path in sorted(self.manifests.glob("*.json"))]
        return sorted((m for m in found if m is not None), key=lambda m: m.name)

    def _read(self, path: Path) -> StoredModel | None:
        """A manifest whose blob is there; None for a foreign or broken one."""
        try:
            body = json.loads(path.read_text())
            body.pop("version", None)
            model = StoredModel(**body)
        except (OSError, ValueError, TypeError):
            return None
        blob = self.blob_path(model.sha256)
        if unquote(path.stem) != model.name or not blob.is_file():
            return None
        return StoredModel(**{**asdict(model), "blob": str(blob)})

    # -- writing ----------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return self.blobs / f"sha256-{sha256}"

    def partial_path(self, key: str) -> Path:
        """Where a download keyed ``key`` (a digest or a hash of its URL) grows."""
        if not key.isalnum():
            raise ValueError(f"not a download key: {key!r}")
        return self.partial / f"{key}.part"

    def adopt_blob(self, partial: Path, sha256: str) -> Path:
        """Move a verified download into place under its digest."""
        blob = self.blob_path(sha256)
        _fsync(partial)
        os.replace(partial, blob)
        _fsync_dir(self.blobs)
        return blob

    def write_manifest(self, model: StoredModel) -> StoredModel:
        """Give the name to ``model`` (its blob is in place): atomically."""
        check_name(model.name)
        target = self._manifest_path(model.name)
        temp = target.with_suffix(".tmp")
        temp.write_text(json.dumps(model.to_json(), indent=1))
        _fsync(temp)
        os.replace(temp, target)
        _fsync_dir(self.manifests)
        return StoredModel(**{**asdict(model), "blob": str(self.blob_path(model.sha256))})

    def remove(self, name: str) -> StoredModel | None:
        """Forget ``name``; its blob goes too unless another name holds it."""
        model = self.find(name)
        if model is None:
            return None
        self._manifest_path(model.name).unlink(missing_ok=True)
        self.release(model.sha256)
        return model

    def release(self, sha256: str) -> None:
        """Delete the blob unless a name still holds it (after a name was removed or
        given other bytes: a re-pull of a file the Hub changed)."""
        if not any(other.sha256 == sha256 for other in self.list()):
            self.blob_path(sha256).unlink(missing_ok=True)

    def release_file(self, path: str) -> None:
        """:meth:`release` the blob at ``path`` (a file outside the store stays)."""
        blob = Path(path)
        if blob.parent.resolve() == self.blobs.resolve() and blob.name.startswith("sha256-"):
            with contextlib.suppress(ValueError):  # not a digest: not a blob of ours
                self.release(blob.name.removeprefix("sha256-"))

    def orphans(self, naming_s: float = _NAMING_S) -> builtins.list[Path]:
        """Files no name holds: downloads abandoned for good (``partial/*.part`` whose
        pull is not running: its lock is free) and blobs no manifest names (a name
        given other bytes while a server still served the old ones). A blob moved in
        within ``naming_s`` is not one: its pull may be writing its name."""
        named = {Path(m.blob).name for m in self.list()}
        blobs = sorted(self.blobs.glob("sha256-*")) if self.blobs.is_dir() else []
        parts = sorted(self.partial.glob("*.part")) if self.partial.is_dir() else []
        settled = time.time() - naming_s
        unnamed = [b for b in blobs if b.name not in named and _changed_at(b) < settled]
        return unnamed + [p for p in parts if not _pulling(p)]

    def sweep(self, naming_s: float = _NAMING_S) -> builtins.list[tuple[Path, int]]:
        """Delete :meth:`orphans` (a download that starts meanwhile keeps its file);
        the files deleted and their sizes."""
        swept = []
        for path in self.orphans(naming_s):
            with contextlib.suppress(OSError), _unless_pulling(path) as free:
                if free:
                    size = path.stat().st_size
                    path.unlink()
                    swept.append((path, size))
        return swept

    def _manifest_path(self, name: str) -> Path:
        return self.manifests / (quote(name, safe="") + ".json")


def _changed_at(path: Path) -> float:
    """When ``path`` was last written or renamed (a blob's move into place)."""
    try:
        return path.stat().st_ctime
    except FileNotFoundError:
        return time.time()


def _pulling(part: Path) -> bool:
    with _unless_pulling(part) as free:
        return not free


@contextlib.contextmanager
def _unless_pulling(path: Path) -> Iterator[bool]:
    """Whether ``path`` is free to delete (held for the block): a blob always; a
    partial download while its lock is ours (a pull in any process holds it)."""
    if path.suffix != ".part":
        yield True
        return
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR)
    except FileNotFoundError:
        yield True
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        yield False
        return
    try:
        yield True
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system syncs directories
        _fsync(path)
