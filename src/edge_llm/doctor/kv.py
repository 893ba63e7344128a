"""An edge-llm engine's KV cache, from ``/debug/streams``: its capacity and how much
live streams hold (requests that cannot reserve KV get 503 ``kv_budget_exceeded``),
and whether its memory ledger (the weights of every served model beside
``max_kv_cache_mb``, which bounds every model's KV tiers on a CPU) fits the machine's
memory. Figures use :func:`edge_llm.observability.units.mib`, as ``top`` and the
banner do."""

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
# Beside the weights and the ledger's cap: the Python runtime, its libraries and
# llama.cpp's compute buffers (the goal of issue 48: at most 200 MiB).
RUNTIME_BYTES = 200 * 1024 * 1024


async def check_kv(session: aiohttp.ClientSession, base_url: str, key: str) -> CheckResult | None:
    """None when the server has no edge-llm debug document (another server, or a key
    it does not accept there)."""
    document = await _debug_document(session, base_url, key)
    return diagnose_kv(document) if document is not None else None


async def check_memory(
    session: aiohttp.ClientSession, base_url: str, key: str
) -> CheckResult | None:
    """The memory ledger against the machine (None: not an edge-llm engine)."""
    document = await _debug_document(session, base_url, key)
    return diagnose_memory(document) if document is not None else None


async def _debug_document(
    session: aiohttp.ClientSession, base_url: str, key: str
) -> Mapping[str, Any] | None:
    try:
        reply = await get(session, base_url.removesuffix("/v1") + "/debug/streams", key)
        document = json.loads(reply.body)
    except (*api_checks.HTTP_ERRORS, ValueError):
        return None
    return document if reply.status == 200 and isinstance(document, dict) else None


def diagnose_memory(document: Mapping[str, Any]) -> CheckResult | None:
    """Warn when weights + the ledger's cap + the runtime cannot fit the machine:
    the caps promise memory the device does not have."""
    ledger = document.get("memory_ledger")
    if not isinstance(ledger, dict):
        return None
    cap, weights = _count(ledger, "cap_bytes"), _count(ledger, "weights_bytes") or 0
    machine, total = _count(ledger, "machine_bytes"), _count(ledger, "total_bytes") or 0
    if cap is None:
        return passed("memory", f"KV tiers {mib(total)} MiB, no common cap (kept apart)")
    served = _served_weights(document)
    weights = max(weights, sum(served))
    need = weights + cap + RUNTIME_BYTES
    of_models = f" of {len(served)} models" if len(served) > 1 else ""
    summary = (
        f"memory ledger {mib(total)}/{mib(cap)} MiB (max_kv_cache_mb, every KV tier of every "
        f"model); weights{of_models} {mib(weights)} + cap + about {mib(RUNTIME_BYTES)} of "
        f"runtime = {mib(need)} MiB"
    )
    details = {"ledger_cap_bytes": cap, "need_bytes": need, "machine_bytes": machine}
    if machine is not None and need > machine:
        fix = (
            f"the machine has {mib(machine)} MiB: lower max_kv_cache_mb on the server (or "
            "serve a smaller model) so that the process cannot be killed for memory"
        )
        return warned("memory", f"{summary}: more than the machine's {mib(machine)}", fix,
                      **details)  # fmt: skip
    of_machine = f" of the machine's {mib(machine)}" if machine is not None else ""
    return passed("memory", summary + of_machine, **details)


def _served_weights(document: Mapping[str, Any]) -> list[int]:
    """The weights of every model the server may load (``models``): they may all be
    loaded at once beside the one KV cap."""
    models = document.get("models")
    if not isinstance(models, dict):
        return []
    counts = (_count(m, "weights_bytes") for m in models.values() if isinstance(m, dict))
    return [count for count in counts if count is not None]


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
