"""``edge-llm pull SOURCE``, ``edge-llm list``, ``edge-llm rm NAME``: the model store.

``pull`` shows its progress on a terminal (bytes, rate, time left) and stays quiet
otherwise; its last line names what was stored. A cut is resumed by itself a few
times, and the next ``pull`` of the same source resumes from the bytes kept.
``rm --orphans`` deletes the files no name holds (downloads given up, a name's old
bytes a server kept); ``list`` says on stderr when there are some.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING, TextIO

from edge_llm.config.tree import ConfigError, load_config
from edge_llm.models.sources import SourceError, parse_source
from edge_llm.models.store import ModelStore, StoredModel, default_root

if TYPE_CHECKING:
    from edge_llm.models.pull import PullStatus

MIB = 1024 * 1024
_REDRAW_S = 0.1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pull = subparsers.add_parser(
        "pull",
        help="download a GGUF model by name (Hugging Face Hub or a URL), resumable and verified",
        description="Download a GGUF into the model store (sha256-verified, resumable). "
        "SOURCE: hf.co/OWNER/REPO:QUANT, OWNER/REPO:QUANT, hf.co/OWNER/REPO/FILE.gguf, or an "
        "http(s) URL with --name. HF_ENDPOINT, HF_TOKEN and HF_HOME apply.",
    )
    pull.add_argument("source", metavar="SOURCE")
    pull.add_argument("--name", help="the name to store a URL's file under")
    pull.add_argument("--sha256", help="the file's expected sha256 (64 hex digits)")
    _store_flags(pull)
    pull.set_defaults(func=run_pull)
    listing = subparsers.add_parser("list", help="the pulled models")
    _store_flags(listing)
    listing.set_defaults(func=run_list)
    remove = subparsers.add_parser(
        "rm",
        help="remove a pulled model",
        description="Remove a pulled model (its file too unless another name holds it); "
        "--orphans: delete the files no name holds (partial downloads no pull is "
        "running, a name's old bytes).",
    )
    which = remove.add_mutually_exclusive_group(required=True)
    which.add_argument("name", metavar="NAME", nargs="?")
    which.add_argument(
        "--orphans", action="store_true", help="delete the files no name holds instead"
    )
    _store_flags(remove)
    remove.set_defaults(func=run_rm)


def _store_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="engine TOML file (for its models_dir)")
    parser.add_argument(
        "--models-dir",
        help=f"the model store [EDGE_LLM_MODELS_DIR] (default: {default_root()})",
    )


def store_of(args: argparse.Namespace) -> ModelStore:
    """The store ``serve`` would read: flag, environment, TOML, default."""
    overrides = {"models_dir": args.models_dir} if args.models_dir else {}
    return ModelStore(load_config(args.config, overrides=overrides).model.models_dir)


def run_pull(args: argparse.Namespace) -> int:
    # The Hub client and the downloader: imported by the command that uses them.
    from edge_llm.models.download import NotEnoughDisk  # noqa: PLC0415
    from edge_llm.models.hub import RemoteError, check_sha256  # noqa: PLC0415
    from edge_llm.models.pull import Puller  # noqa: PLC0415

    try:
        source = parse_source(args.source, args.name)
        sha256 = check_sha256(args.sha256) if args.sha256 else None
        store = store_of(args)
    except (SourceError, ConfigError) as exc:
        print(f"edge-llm pull: {exc}", file=sys.stderr)
        return 2
    progress = ProgressLine(sys.stderr)
    try:
        model = asyncio.run(Puller(store).pull(source, progress, sha256))
    except (RemoteError, NotEnoughDisk, OSError) as exc:
        progress.clear()
        print(f"edge-llm pull: {exc}", file=sys.stderr)
        return 1
    progress.clear()
    print(f"pulled {model.name} ({describe(model)}) sha256:{model.sha256}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    store = store_of(args)
    models = store.list()
    rows = [("NAME", "SIZE", "QUANT", "ARCH", "SOURCE")]
    rows += [(m.name, f"{m.size / MIB:.0f} MiB", m.quant, m.architecture, m.source) for m in models]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
              + "  " + row[4])  # fmt: skip
    if orphans := store.orphans():
        size = sum(p.stat().st_size for p in orphans if p.exists())
        print(f"{len(orphans)} file(s) no name holds, {size / MIB:.0f} MiB "
              "(edge-llm rm --orphans deletes them)", file=sys.stderr)  # fmt: skip
    return 0


def run_rm(args: argparse.Namespace) -> int:
    store = store_of(args)
    if args.orphans:
        swept = store.sweep()
        size = sum(n for _, n in swept)
        print(f"deleted {len(swept)} file(s) no name held, {size / MIB:.0f} MiB")
        return 0
    removed = store.remove(args.name)
    if removed is None:
        print(f"edge-llm rm: {args.name!r} is not pulled (see edge-llm list)", file=sys.stderr)
        return 1
    print(f"removed {removed.name}")
    return 0


def describe(model: StoredModel) -> str:
    template = "chat template" if model.chat_template else "no chat template"
    return f"{model.size / MIB:.1f} MiB, {model.architecture} {model.quant}, {template}"


class ProgressLine:
    """A pull's events as one redrawn line on a terminal: nothing when not a terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._first: tuple[float, int] | None = None  # when and where this run began
        self._drawn = 0.0
        self._width = 0

    def __call__(self, event: PullStatus) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if event.completed is None:
            self._draw(event.status)
            return
        if self._first is None:
            self._first = (now, event.completed)
        done = event.completed == event.total
        if now - self._drawn >= _REDRAW_S or done:
            self._draw(self._bytes_line(event, now))

    def _bytes_line(self, event: PullStatus, now: float) -> str:
        start_t, start_bytes = self._first or (now, 0)
        got = event.completed or 0
        rate = (got - start_bytes) / max(now - start_t, 1e-3)
        line = f"{event.status}  {got / MIB:.1f}"
        if event.total:
            line += f"/{event.total / MIB:.1f} MiB {100 * got // event.total}%"
        else:
            line += " MiB"
        line += f"  {rate / MIB:.1f} MiB/s"
        if event.total and rate > 0:
            line += f"  {_clock((event.total - got) / rate)} left"
        return line

    def _draw(self, text: str) -> None:
        self._drawn = time.monotonic()
        self.out.write("\r" + text.ljust(self._width))
        self._width = len(text)
        self.out.flush()

    def clear(self) -> None:
        if self.tty and self._width:
            self.out.write("\r" + " " * self._width + "\r")
            self.out.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
