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

DEFAULT_URL = "http://127.0.0.1:8000"
REQUEST_TIMEOUT_S = 5.0
PLAIN_WIDTH = 160  # when stdout is not a terminal


class FetchError(Exception):
    """The engine could not be reached or did not answer as an edge-llm engine."""


@dataclass(frozen=True)
class Endpoint:
    url: str  # the server root, without /v1
    api_key: str | None

    def get(self, path: str) -> bytes:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            hint = " (wrong or missing --api-key?)" if exc.code == 401 else ""
            raise FetchError(f"GET {self.url + path}: HTTP {exc.code}{hint}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FetchError(f"GET {self.url + path}: {exc}") from exc


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live view of the engine's streams and metrics",
        description="Live view of /debug/streams (state, tokens, ring and KV cursors, "
        "pauses) and /metrics (engine totals, tok/s between refreshes).",
    )
    parser.add_argument("--url", default=DEFAULT_URL, help="engine URL (default %(default)s)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("EDGE_LLM_API_KEY"),
        help="API key, when the engine protects its debug endpoints (env EDGE_LLM_API_KEY)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default 1)"
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("edge-llm top: --interval must be positive", file=sys.stderr)
        return 2
    endpoint = Endpoint(server_root(args.url), args.api_key or None)
    console = Console() if sys.stdout.isatty() else Console(width=PLAIN_WIDTH)
    if args.once:
        return _once(endpoint, console)
    with contextlib.suppress(KeyboardInterrupt):
        _live(endpoint, console, args.interval)
    return 0


def server_root(url: str) -> str:
    """``http://host:8000/v1/`` -> ``http://host:8000``: top reads root paths."""
    root = url.strip().rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


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


def _once(endpoint: Endpoint, console: Console) -> int:
    try:
        streams, metrics = fetch(endpoint)
    except FetchError as exc:
        print(f"edge-llm top: {exc}", file=sys.stderr)
        return 1
    console.print(render_frame(streams, metrics, Rates(), title=_title(endpoint)))
    return 0


def _live(endpoint: Endpoint, console: Console, interval: float) -> None:
    before: Sample | None = None
    with Live(console=console, auto_refresh=False, screen=False) as live:
        while True:
            frame, before = next_frame(endpoint, before)
            live.update(frame, refresh=True)
            time.sleep(interval)


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
