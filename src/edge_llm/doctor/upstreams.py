"""An edge-llm with upstreams reports their health in ``GET /health``: one that
cannot be reached is flagged (its models fail, or fall back to the others)."""

from __future__ import annotations

import json

import aiohttp

from edge_llm.doctor import api_checks
from edge_llm.doctor.probe import get
from edge_llm.doctor.result import CheckResult, passed, warned


async def check_upstreams(
    session: aiohttp.ClientSession, base_url: str, key: str
) -> CheckResult | None:
    """None when the server reports no upstreams (not an edge-llm, or none set)."""
    root = base_url.removesuffix("/v1")
    try:
        reply = await get(session, root + "/health", key)
        upstreams = json.loads(reply.body)["upstreams"]
        states = [(str(u["name"]), bool(u["healthy"]), u.get("error")) for u in upstreams]
    except (*api_checks.HTTP_ERRORS, ValueError, KeyError, TypeError):
        return None
    down = [f"{name} ({error or 'no answer'})" for name, healthy, error in states if not healthy]
    if not down:
        return passed("upstreams", f"{len(states)} upstream(s) healthy", upstreams=upstreams)
    return warned(
        "upstreams",
        f"upstream unreachable: {'; '.join(down)}",
        "start that server or fix its [upstream.NAME] url / api_key in the engine's config; "
        "until then its models fail over to other upstreams or get 503 upstream_unavailable",
        upstreams=upstreams,
    )
