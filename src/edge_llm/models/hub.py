"""Where a source's bytes are: the Hugging Face Hub through ``huggingface_hub``.

The library does what users know it for: ``HF_ENDPOINT`` (the Hub or a mirror),
``HF_TOKEN`` and ``HF_HOME`` (the token saved by ``hf auth login``), the repo's
tree (to pick the file that carries a quant), and the HEAD of ``resolve`` that
tells the commit (``X-Repo-Commit``), the file's sha256 (``X-Linked-Etag``), its
size (``X-Linked-Size``) and where its bytes are (the redirect's ``Location``).
Its downloader is not used: it buffers 10 MiB between writes (a cut loses them)
and does not check the sha256 (see :mod:`edge_llm.models.download`).

Blocking calls: run them in a thread.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2  # huggingface_hub's HTTP client: its transport errors reach us unwrapped
from huggingface_hub import (
    HfApi,
    get_hf_file_metadata,
    get_token,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from edge_llm.models.sources import HubFile, SourceError, UrlFile

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Parts of a multi-file GGUF (llama.cpp's gguf-split): served only as one file.
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class RemoteError(RuntimeError):
    """The Hub (or the URL's host) cannot give the file; the message says why."""


@dataclass(frozen=True)
class RemoteFile:
    """What a download needs: where, how much, which digest, with which headers."""

    url: str  # where the bytes are (after the Hub's redirect)
    source: str  # the URL a user would recognise (the Hub's resolve URL)
    filename: str
    size: int | None
    sha256: str | None  # the Hub's (X-Linked-Etag) or None (a plain URL)
    revision: str | None
    repo: str | None
    headers: dict[str, str]

    @property
    def key(self) -> str:
        """Names the partial download: its digest, else a hash of its URL."""
        return self.sha256 or hashlib.sha256(self.source.encode()).hexdigest()


def resolve(source: HubFile | UrlFile, endpoint: str | None = None) -> RemoteFile:
    """The file ``source`` names. ``endpoint``: the Hub's address (None:
    ``HF_ENDPOINT``, else huggingface.co)."""
    if isinstance(source, UrlFile):
        name = urlsplit(source.url).path.rsplit("/", 1)[-1] or source.name
        return RemoteFile(source.url, source.url, name, None, None, None, None, {})
    endpoint = endpoint or _env_endpoint()
    try:
        filename = source.filename or pick_file(source, endpoint)
        url = hf_hub_url(source.repo, filename, revision=source.revision, endpoint=endpoint)
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as exc:
        raise RemoteError(f"{source.name}: {_first_line(exc)}") from exc
    except EntryNotFoundError as exc:
        raise RemoteError(f"{source.name}: no such file in {source.repo}") from exc
    except (HfHubHTTPError, httpx2.HTTPError, OSError, ValueError) as exc:
        raise RemoteError(f"{source.name}: the Hub did not answer: {_first_line(exc)}") from exc
    etag = (meta.etag or "").lower()
    return RemoteFile(
        url=meta.location,
        source=url,
        filename=filename,
        size=meta.size,
        sha256=etag if _SHA256.match(etag) else None,
        revision=meta.commit_hash,
        repo=source.repo,
        headers=_auth_headers(meta.location, endpoint),
    )


def in_hf_cache(remote: RemoteFile) -> str | None:
    """The file in huggingface_hub's own cache (``HF_HUB_CACHE``, under ``HF_HOME``)
    at the revision the Hub names, when another tool downloaded it already."""
    if remote.repo is None or remote.revision is None:
        return None
    found = try_to_load_from_cache(remote.repo, remote.filename, revision=remote.revision)
    return found if isinstance(found, str) else None


def _env_endpoint() -> str | None:
    """``HF_ENDPOINT`` as it is now (the library reads it once, at import)."""
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def pick_file(source: HubFile, endpoint: str | None) -> str:
    """The repo's GGUF whose name carries ``source.quant`` (case-insensitive), as
    llama-server's ``-hf`` and Ollama pick it; projector files (``mmproj``) aside."""
    api = HfApi(endpoint=endpoint)
    files = [
        entry.path
        for entry in api.list_repo_tree(source.repo, revision=source.revision, recursive=True)
        if entry.path.lower().endswith(".gguf") and "mmproj" not in entry.path.lower()
    ]
    quant = (source.quant or "").lower()
    matches = [f for f in files if _carries(f, quant)]
    if not matches:
        quants = sorted({_quant_of(f) for f in files} - {""}) or ["none"]
        raise RemoteError(
            f"{source.name}: no GGUF in {source.repo} carries {source.quant}; "
            f"its quants: {', '.join(quants)}"
        )
    whole = [f for f in matches if not _SPLIT.search(f)]
    if not whole:
        raise RemoteError(
            f"{source.name}: {source.quant} is split into parts ({matches[0]}, ...): "
            "multi-file GGUFs are not supported; pick another quant"
        )
    return min(whole, key=len)


def _carries(filename: str, quant: str) -> bool:
    """``Qwen2.5-1.5B-Q4_K_M.gguf`` carries ``q4_k_m`` but ``...-IQ4_K_M`` does not."""
    stem = filename.rsplit("/", 1)[-1].lower().removesuffix(".gguf")
    return re.search(rf"(^|[^a-z0-9]){re.escape(quant)}($|[^a-z0-9])", stem) is not None


def _quant_of(filename: str) -> str:
    stem = filename.rsplit("/", 1)[-1].removesuffix(".gguf")
    match = re.search(r"(I?Q\d[A-Z0-9_]*|F16|BF16|F32)$", stem, re.IGNORECASE)
    return match.group(1).upper() if match else ""


def _auth_headers(location: str, endpoint: str | None) -> dict[str, str]:
    """The token goes to the Hub itself only, never to a CDN or another host."""
    hub = urlsplit(endpoint or hf_hub_url("x/y", "z")).netloc
    if urlsplit(location).netloc != hub:
        return {}
    token = get_token()  # HF_TOKEN, else the one `hf auth login` saved under HF_HOME
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_sha256(text: str) -> str:
    digest = text.strip().lower().removeprefix("sha256:")
    if not _SHA256.match(digest):
        raise SourceError(f"{text!r}: a sha256 digest is 64 hex digits")
    return digest


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
