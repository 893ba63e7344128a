"""What ``edge-llm pull SOURCE`` (and Ollama's ``/api/pull``) may name, parsed and checked.

Sources, with the spellings users bring from Ollama and llama-server::

    hf.co/OWNER/REPO:QUANT       a GGUF of a Hub repo, picked by its quant (Ollama's)
    OWNER/REPO:QUANT             the same (llama-server's ``-hf``)
    hf.co/OWNER/REPO/FILE.gguf   one file of a Hub repo
    http(s)://HOST/.../FILE.gguf any URL, stored under ``--name NAME``

Everything here is checked before anything touches the disk or the network: repo ids
follow the Hub's rules, no path part is ``..`` or empty, no URL carries credentials,
and a name is a short run of safe characters. The store never derives a path from a
name (see :mod:`edge_llm.models.store`), so this is the first of two walls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

HUB_PREFIXES = ("hf.co/", "huggingface.co/")
DEFAULT_QUANT = "Q4_K_M"  # Ollama's pick for a Hub repo named without a quant
_MAX_NAME = 200
# The Hub's repo id parts: letters, digits, '-', '_', '.'; no '--' or '..'; at most 96.
_REPO_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_QUANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_FILE_PART = re.compile(r"^[A-Za-z0-9_.+-]{1,200}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,199}$")


class SourceError(ValueError):
    """A source or name that cannot be pulled; the message says what is wrong."""


@dataclass(frozen=True)
class HubFile:
    """A GGUF of a Hub repo: named by ``filename``, or picked by ``quant``."""

    repo: str  # OWNER/REPO
    quant: str | None = None
    filename: str | None = None
    revision: str = "main"

    @property
    def name(self) -> str:
        """The name it is stored and served under (Ollama's spelling)."""
        tail = f"/{self.filename}" if self.filename else f":{self.quant}"
        return f"hf.co/{self.repo}{tail}"


@dataclass(frozen=True)
class UrlFile:
    """A GGUF at a plain HTTP(S) URL, stored under a name the user gives."""

    url: str
    name: str


Source = HubFile | UrlFile


def parse_source(text: str, name: str | None = None) -> Source:
    """``text`` as a source; ``name`` is required for a URL and replaces a Hub
    source's own name only for a URL (a Hub name says where it came from)."""
    text = text.strip()
    if text.startswith(("http://", "https://")):
        if name is None:
            raise SourceError(f"{text}: a URL needs --name NAME to be stored under")
        return UrlFile(check_url(text), check_name(name))
    if "://" in text:
        raise SourceError(f"{text}: only http(s) URLs and Hugging Face sources can be pulled")
    return parse_hub(text)


def parse_hub(text: str) -> HubFile:
    """``hf.co/OWNER/REPO[:QUANT]``, ``OWNER/REPO:QUANT`` or ``hf.co/OWNER/REPO/FILE.gguf``
    (``:latest`` or no tag: Q4_K_M, as Ollama picks)."""
    hub = text.startswith(HUB_PREFIXES)
    rest = text.split("/", 1)[1] if hub else text
    parts = rest.split("/")
    if len(parts) < 2 or not text.isprintable() or "\\" in text:
        raise SourceError(
            f"{text!r}: expected hf.co/OWNER/REPO:QUANT, OWNER/REPO:QUANT, "
            "hf.co/OWNER/REPO/FILE.gguf or an http(s) URL with --name"
        )
    owner, repo_tag, path = parts[0], parts[1], parts[2:]
    if path:
        return HubFile(_repo(owner, repo_tag, text), filename=_file_path(path, text))
    repo, sep, quant = repo_tag.partition(":")
    if not sep and not hub:
        raise SourceError(f"{text!r}: name the quant (OWNER/REPO:Q4_K_M) or write hf.co/{text}")
    quant = DEFAULT_QUANT if quant in ("", "latest") else quant
    if not _QUANT.match(quant):
        raise SourceError(f"{text!r}: {quant!r} is not a quant name (Q4_K_M, Q8_0, ...)")
    return HubFile(_repo(owner, repo, text), quant=quant.upper())


def _repo(owner: str, repo: str, text: str) -> str:
    for part in (owner, repo):
        if not _REPO_PART.match(part) or ".." in part or "--" in part:
            raise SourceError(f"{text!r}: {part!r} is not a Hugging Face owner or repo name")
    return f"{owner}/{repo}"


def _file_path(parts: list[str], text: str) -> str:
    for part in parts:
        if part in ("", ".", "..") or not _FILE_PART.match(part):
            raise SourceError(f"{text!r}: {part!r} is not a file name in a repo")
    if not parts[-1].lower().endswith(".gguf"):
        raise SourceError(f"{text!r}: only GGUF files (.gguf) can be served")
    return "/".join(parts)


def check_url(url: str) -> str:
    """An http(s) URL with a host, no user:password part and no control characters."""
    if not url.isprintable() or any(c.isspace() for c in url):
        raise SourceError(f"{url!r}: not a URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceError(f"{url!r}: not an http(s) URL")
    if parts.username is not None or parts.password is not None:
        raise SourceError(f"{url!r}: credentials in a URL are refused (use HF_TOKEN)")
    return url


def check_name(name: str) -> str:
    """A name to store a model under: letters, digits and ``_.:/+-``, no empty, ``.``
    or ``..`` part, not starting with ``/``; what Ollama and the Hub name models."""
    if len(name) > _MAX_NAME or not _NAME.match(name):
        raise SourceError(
            f"{name!r}: a model name is letters, digits and '_', '.', ':', '/', '+', '-' "
            f"(at most {_MAX_NAME}), starting with a letter or digit"
        )
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise SourceError(f"{name!r}: a model name has no empty, '.' or '..' part")
    if len(quote(name, safe="")) > _MAX_NAME:  # its manifest's file name, '/' as %2F
        raise SourceError(f"{name!r}: too long for a model name (at most {_MAX_NAME} "
                          "characters, each '/' or ':' counting three)")  # fmt: skip
    return name


def looks_pullable(text: str) -> bool:
    """Whether ``text`` (a ``--model`` value or a request's ``model``) names a Hub
    source rather than a file path or a served name."""
    return text.startswith(HUB_PREFIXES) or (
        text.count("/") == 1 and ":" in text and not text.startswith((".", "/", "~"))
    )
