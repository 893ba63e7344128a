"""One KV figure everywhere: the serve banner, ``top``, ``doctor`` (and the playground,
whose ``mib()`` applies the same rounding: tests/e2e/test_playground.py)."""

from __future__ import annotations

import io

from rich.console import Console

from edge_llm.cli.serve import kv_capacity
from edge_llm.config.tree import load_config
from edge_llm.doctor.kv import diagnose_kv
from edge_llm.engine.kv.unified import KvCache
from edge_llm.observability.top_view import Rates, engine_line
from edge_llm.observability.units import MIB, mib

BYTES_PER_TOKEN = 23040  # SmolLM2-135M, f16 KV
CAPACITY_TOKENS = 11520  # 256 MiB rounded down to whole 256-cell blocks


def test_mib_rounds_once_and_a_half_up() -> None:
    assert mib(CAPACITY_TOKENS * BYTES_PER_TOKEN) == "253.1"
    assert mib(256 * MIB) == "256.0"
    assert mib(512 * BYTES_PER_TOKEN) == "11.3"  # exactly 11.25: up, as JavaScript rounds
    assert mib(0) == "0.0"


def test_banner_top_and_doctor_show_the_same_capacity() -> None:
    kv = KvCache(CAPACITY_TOKENS, BYTES_PER_TOKEN, num_seq_ids=4)
    document = {
        "kv_used_bytes": 100 * BYTES_PER_TOKEN,
        "kv_budget_bytes": kv.capacity_bytes,
        "kv_bytes_per_token": BYTES_PER_TOKEN,
        "streams": [],
    }
    banner = kv_capacity(load_config(None, env={}), kv.capacity_tokens, kv.capacity_bytes)
    assert banner == "KV capacity 253.1 MiB = 11520 tokens, from max_kv_cache_mb 256"
    out = io.StringIO()
    Console(file=out, width=200).print(engine_line(document, {}, Rates()))
    assert "2.2/253.1 MiB used/capacity" in out.getvalue()
    doctor = diagnose_kv(document)
    assert doctor is not None
    assert doctor.summary == "KV 2.2/253.1 MiB used/capacity (11520 tokens of capacity)"
    assert doctor.status.value == "pass"


def test_doctor_warns_when_the_kv_cache_is_nearly_full() -> None:
    document = {"kv_used_bytes": 95, "kv_budget_bytes": 100, "kv_bytes_per_token": 1}
    result = diagnose_kv(document)
    assert result is not None and result.status.value == "warn"
    assert result.fix is not None and "max_kv_cache_mb" in result.fix


def test_doctor_says_nothing_about_kv_for_other_servers() -> None:
    assert diagnose_kv({"hello": "world"}) is None
