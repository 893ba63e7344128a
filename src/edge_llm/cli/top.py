"""``edge-llm top``: a live view of ``/debug/streams`` and ``/metrics``.

Refreshes every ``--interval`` seconds until Ctrl-C; ``--once`` prints one frame and
exits (for scripts). Exit status: 0, or 1 when the engine cannot be reached or
answers with something that is not its debug document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live

from edge_llm.client.address import ServerAddress, add_address_flags, resolve_address
from edge_llm.client.errors import ConfigError
from edge_llm.observability.top_view import (
    Metrics,
    Rates,
    Sample,
    parse_metrics,
    rates_between,
    render_error,
    render_frame,
    sample_of,
)

REQUEST_TIMEOUT_S = 5.0
PLAIN_WIDTH = 160  # when stdout is not a terminal


class FetchError(Exception):
    """The engine could not be reached or did not answer as an edge-llm engine."""


@dataclass(frozen=True)
class Endpoint:
    address: ServerAddress

    @property
    def url(self) -> str:
        return self.address.root  # top reads root paths

    def get(self, path: str) -> bytes:
        request = urllib.request.Request(self.url + path, headers=self.address.headers())
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            hint = " (wrong or missing --api-key?)" if exc.code == 401 else ""
            raise FetchError(f"GET {self.url + path}: HTTP {exc.code}{hint}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FetchError(self.address.unreachable(exc)) from exc


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of the engine's streams and metrics",
        description="Live view of /debug/streams (state, tokens, ring and KV cursors, "
        "pauses) and /metrics (engine totals, tok/s between refreshes).",
    )
    add_address_flags(parser)
    parser.add_argument("--url", dest="base_url", help=argparse.SUPPRESS)  # the old name
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("edge-llm top: --interval must be positive", file=sys.stderr)
        return 2
    try:
        address = resolve_address(base_url=args.base_url, api_key=args.api_key, env=os.environ)
    except ConfigError as exc:
        print(f"edge-llm top: {exc}", file=sys.stderr)
        return 2
    endpoint = Endpoint(address)
    console = Console() if sys.stdout.isatty() else Console(width=PLAIN_WIDTH)
    if args.once:
        return _once(endpoint, console)
    with contextlib.suppress(KeyboardInterrupt):
        return _live(endpoint, console, args.interval)
    return 0


def fetch(endpoint: Endpoint) -> tuple[dict[str, Any], Metrics]:
    """The /debug/streams document and the parsed /metrics. Raises FetchError."""
    try:
        streams = json.loads(endpoint.get("/debug/streams"))
    except ValueError as exc:
        raise FetchError(f"{endpoint.url}/debug/streams is not JSON") from exc
    if not isinstance(streams, dict) or "streams" not in streams:
        raise FetchError(f"{endpoint.url}/debug/streams is not an edge-llm debug document")
    try:
        metrics = parse_metrics(endpoint.get("/metrics").decode("utf-8", "replace"))
    except ValueError:
        metrics = {}  # the frame says "metrics unavailable"
    return streams, metrics


def _first_look(endpoint: Endpoint) -> tuple[dict[str, Any], Metrics] | None:
    """The first fetch; a server that does not answer it is reported in one line."""
    try:
        return fetch(endpoint)
    except FetchError as exc:
        print(f"edge-llm top: {exc}", file=sys.stderr)
        return None


def _once(endpoint: Endpoint, console: Console) -> int:
    look = _first_look(endpoint)
    if look is None:
        return 1
    console.print(render_frame(*look, Rates(), title=_title(endpoint)))
    return 0


def _live(endpoint: Endpoint, console: Console, interval: float) -> int:
    """Refresh until Ctrl-C. No answer to the first look is an error (exit 1, as
    with ``--once``); a server that goes away later is retried on screen."""
    look = _first_look(endpoint)
    if look is None:
        return 1
    before: Sample | None = sample_of(time.monotonic(), *look)
    with Live(console=console, auto_refresh=False, screen=False) as live:
        live.update(render_frame(*look, Rates(), title=_title(endpoint)), refresh=True)
        while True:
            time.sleep(interval)
            frame, before = next_frame(endpoint, before)
            live.update(frame, refresh=True)


def next_frame(endpoint: Endpoint, before: Sample | None) -> tuple[RenderableType, Sample | None]:
    """The frame to show now and the sample the next tok/s is measured from."""
    title = _title(endpoint)
    try:
        streams, metrics = fetch(endpoint)
    except FetchError as exc:
        return render_error(title, f"{exc} (retrying)"), None
    now = sample_of(time.monotonic(), streams, metrics)
    return render_frame(streams, metrics, rates_between(before, now), title=title), now


def _title(endpoint: Endpoint) -> str:
    return f"edge-llm top  {endpoint.url}  {time.strftime('%H:%M:%S')}"
