"""``edge-llm blame ENGINE_LOG CLIENT_LOG``: who is responsible for each stall.

Reads the two JSONL event logs (or OTLP JSON exports of the spans, which carry the
same lines as span events), joins them per request and prints a verdict
(engine, client, transport, unknown or ok) with the evidence lines. Each line's
``source`` field decides which side it belongs to, so a swapped pair or one
combined file works too. Exit status: 0 with a report (verdicts are information,
not failures), 1 when ``--request`` matches nothing, 2 when a log cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from edge_llm.observability.blame import (
    CLIENT,
    ENGINE,
    Thresholds,
    blame,
    render_text,
    report_json,
    select,
    split_sources,
)
from edge_llm.observability.blame.otlp import is_otlp, otlp_event_lines
from edge_llm.observability.events import parse_event_lines

NO_LOG = "-"


class LogError(Exception):
    """A log file cannot be read as an event log."""


@dataclass
class Logs:
    engine: list[dict[str, Any]] = field(default_factory=list)
    client: list[dict[str, Any]] = field(default_factory=list)
    have_engine: bool = False
    have_client: bool = False
    warnings: list[str] = field(default_factory=list)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "blame",
        help="who is responsible for a stall: engine, client or transport",
        description="Join the engine's and the client's event logs by request id and say, "
        "per request, who is responsible for a stall, with the evidence lines. Either log "
        f"may be omitted (or given as '{NO_LOG}'); the report then says what it cannot tell. "
        "A log may also be an OTLP JSON export of the spans (OpenTelemetry), whose span "
        "events carry the same lines.",
        epilog="exit status: 0 report printed, 1 --request matched nothing, 2 a log cannot be read",
    )
    parser.add_argument(
        "engine_pos",
        nargs="?",
        metavar="ENGINE_LOG",
        help="engine event log, or an OTLP JSON export of its spans",
    )
    parser.add_argument("client_pos", nargs="?", metavar="CLIENT_LOG", help="client event log")
    parser.add_argument("--engine-log", help="engine event log (instead of ENGINE_LOG)")
    parser.add_argument("--client-log", help="client event log (instead of CLIENT_LOG)")
    parser.add_argument("--json", action="store_true", help="print JSON with the raw lines")
    parser.add_argument("--request", metavar="ID", help="only this request (id or id prefix)")
    parser.add_argument(
        "--grace-ms",
        type=float,
        default=Thresholds.grace_s * 1000,
        help="time allowed from high watermark to PAUSE, and from PAUSE/CANCEL to the "
        "engine acting on it (default: %(default).0f)",
    )
    parser.add_argument(
        "--lag-ms",
        type=float,
        default=Thresholds.lag_s * 1000,
        help="first-token delay from engine to client counted as a transport problem "
        "(default: %(default).0f)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        engine_path = _choose(args.engine_pos, args.engine_log, "engine")
        client_path = _choose(args.client_pos, args.client_log, "client")
        logs = load_logs(engine_path, client_path)
    except LogError as exc:
        print(f"edge-llm blame: {exc}", file=sys.stderr)
        return 2
    for warning in logs.warnings:
        print(f"edge-llm blame: {warning}", file=sys.stderr)
    thresholds = Thresholds(grace_s=args.grace_ms / 1000, lag_s=args.lag_ms / 1000)
    report = blame(
        logs.engine,
        logs.client,
        have_engine_log=logs.have_engine,
        have_client_log=logs.have_client,
        thresholds=thresholds,
    )
    if args.request:
        report = select(report, args.request)
        if not report.requests:
            print(f"edge-llm blame: no request matches {args.request!r}", file=sys.stderr)
            return 1
    text = json.dumps(report_json(report), indent=2) + "\n" if args.json else render_text(report)
    sys.stdout.write(text)
    return 0


def _choose(positional: str | None, option: str | None, role: str) -> str | None:
    """The path given for ``role``, or None; ``-`` means none."""
    if positional not in (None, NO_LOG) and option not in (None, NO_LOG):
        raise LogError(f"the {role} log is given twice ({positional!r} and --{role}-log)")
    path = option if option not in (None, NO_LOG) else positional
    return None if path in (None, NO_LOG) else path


def load_logs(engine_path: str | None, client_path: str | None) -> Logs:
    """Read both files; each line goes to the side its ``source`` names (the file's
    role if it names none). Raises LogError when no log is given or one is unreadable."""
    if engine_path is None and client_path is None:
        raise LogError("give at least one log: edge-llm blame ENGINE_LOG CLIENT_LOG")
    logs = Logs()
    for path, role in ((engine_path, ENGINE), (client_path, CLIENT)):
        if path is None:
            continue
        events, skipped = read_log(path)
        if skipped:
            logs.warnings.append(f"{path}: skipped {skipped} lines that are not event lines")
        engine, client = split_sources(events, role)
        logs.engine.extend(engine)
        logs.client.extend(client)
    logs.have_engine = engine_path is not None or bool(logs.engine)
    logs.have_client = client_path is not None or bool(logs.client)
    return logs


def read_log(path: str) -> tuple[list[dict[str, Any]], int]:
    """A JSONL event log, or an OTLP JSON export of edge-llm's spans (read as the
    lines their span events carry)."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LogError(f"cannot read {path}: {exc}") from exc
    if is_otlp(text):
        events = otlp_event_lines(text)
        if not events:
            raise LogError(f"{path} is an OTLP export without edge-llm span events")
        return events, 0
    events, skipped = parse_event_lines(text.splitlines())
    if skipped and not events:
        raise LogError(f"{path} is not an event log (no JSON line with an 'event' key)")
    return events, skipped
