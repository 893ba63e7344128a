"""``edge-llm doctor``: check a base URL, key and model end to end, with a fix for each problem.

Exit code 0 when no check failed (warnings do not fail the run), 1 when one
did, 2 when the client JSON given with ``--config`` cannot be read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from edge_llm.client.address import add_address_flags
from edge_llm.client.errors import ConfigError
from edge_llm.doctor import CheckResult, DoctorSettings, Status, exit_code, resolve, run_checks
from edge_llm.doctor.settings import DEFAULT_TIMEOUT_S
from edge_llm.doctor.static_checks import mask_key

_LABELS = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "SKIP"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="diagnose base URL, key, proxy, model, streaming and TTFT problems",
        description="Run checks in order against an OpenAI-compatible endpoint and print "
        "a fix for each problem. Values come from the flags, EDGE_LLM_BASE_URL / "
        "EDGE_LLM_API_KEY / EDGE_LLM_MODEL, the client JSON, then OPENAI_BASE_URL / "
        "OPENAI_API_KEY / OPENAI_MODEL. Exit code 0 unless a check failed (warnings "
        "do not fail).",
    )
    add_address_flags(parser)
    parser.add_argument("--model", help="the model id to ask for")
    parser.add_argument("--config", help="client JSON with an edge_llm_client object")
    parser.add_argument("--ttft-warn-ms", type=int, help="warn above this TTFT (default: 3000)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds a request may stay silent (default: 20; three times that in total)",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags = {"base_url": args.base_url, "api_key": args.api_key, "model_id": args.model}
    try:
        settings = resolve(
            flags, args.config, os.environ, ttft_warn_ms=args.ttft_warn_ms, timeout_s=args.timeout
        )
    except ConfigError as exc:
        print(f"edge-llm doctor: {exc}", file=sys.stderr)
        return 2
    results = asyncio.run(run_checks(settings, dict(os.environ)))
    code = exit_code(results)
    if args.json:
        print(json.dumps(report(settings, results, code), indent=2))
    else:
        print(render(settings, results, code))
    return code


def report(settings: DoctorSettings, results: list[CheckResult], code: int) -> dict[str, Any]:
    return {
        "ok": code == 0,
        "exit_code": code,
        "settings": {
            "base_url": {"value": settings.base_url.value, "source": settings.base_url.source},
            "api_key": {
                "value": mask_key(settings.api_key.value),
                "source": settings.api_key.source,
            },
            "model": {"value": settings.model.value or None, "source": settings.model.source},
            "ttft_warn_ms": settings.ttft_warn_ms,
        },
        "checks": [result.to_dict() for result in results],
    }


def _shown_model(model: str) -> str:
    return repr(model) if model else "none set (the server's default model)"


def render(settings: DoctorSettings, results: list[CheckResult], code: int) -> str:
    lines = [
        "edge-llm doctor",
        f"  base_url  {settings.base_url.value!r}  (from {settings.base_url.source})",
        f"  api_key   {mask_key(settings.api_key.value)}  (from {settings.api_key.source})",
        f"  model     {_shown_model(settings.model.value)}  (from {settings.model.source})",
        "",
    ]
    width = max(len(result.name) for result in results)
    for result in results:
        lines.append(f"{_LABELS[result.status]}  {result.name:<{width}}  {result.summary}")
        if result.fix and result.status in (Status.FAIL, Status.WARN):
            lines.append(f"{'':6}{'':<{width}}  fix: {result.fix}")
    lines += ["", _tally(results, code)]
    return "\n".join(lines)


def _tally(results: list[CheckResult], code: int) -> str:
    counts = {status: sum(r.status is status for r in results) for status in Status}
    parts = [f"{counts[s]} {s.value}" for s in Status if counts[s]]
    verdict = "no failures" if code == 0 else "problems found"
    return f"{verdict}: {', '.join(parts)} (exit {code})"
