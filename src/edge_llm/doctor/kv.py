"""An edge-llm engine's KV cache, from ``/debug/streams``: its capacity and how much
live streams hold (requests that cannot reserve KV get 503 ``kv_budget_exceeded``).
Figures use :func:`edge_llm.observability.units.mib`, as ``top`` and the banner do."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from edge_llm.doctor import api_checks
from edge_llm.doctor.probe import get
from edge_llm.doctor.result import CheckResult, passed, warned
from edge_llm.observability.units import mib

NEARLY_FULL = 0.9


async def check_kv(session: aiohttp.ClientSession, base_url: str, key: str) -> CheckResult | None:
    """None when the server has no edge-llm debug document (another server, or a key
    it does not accept there)."""
    try:
        reply = await get(session, base_url.removesuffix("/v1") + "/debug/streams", key)
        document = json.loads(reply.body)
    except (*api_checks.HTTP_ERRORS, ValueError):
        return None
    return diagnose_kv(document) if reply.status == 200 else None


def diagnose_kv(document: Mapping[str, Any]) -> CheckResult | None:
    used, capacity = _count(document, "kv_used_bytes"), _count(document, "kv_budget_bytes")
    per_token = _count(document, "kv_bytes_per_token")
    if used is None or not capacity or not per_token:
        return None
    tokens = capacity // per_token
    summary = f"KV {mib(used)}/{mib(capacity)} MiB used/capacity ({tokens} tokens of capacity)"
    details = {"kv_used_bytes": used, "kv_capacity_bytes": capacity, "kv_capacity_tokens": tokens}
    if used >= NEARLY_FULL * capacity:
        fix = (
            "requests that cannot reserve prompt + max_tokens get 503 kv_budget_exceeded: "
            "raise max_kv_cache_mb on the server, lower max_tokens, or end idle streams"
        )
        return warned("kv", f"{summary}: nearly full", fix, **details)
    return passed("kv", summary, **details)


def _count(document: Mapping[str, Any], name: str) -> int | None:
    value = document.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
