"""vLLM's gauge names beside the edge_llm_* ones (SPEC section 21): same meaning and
unit, read from the engine's own metrics (fake backend)."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client.parser import text_string_to_metric_families

from conftest import app_engine
from fakes import FakeBackend
from helpers import metric

LONG = "a shared system prompt that the second request finds in the prefix cache. " * 3
CHAT = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 3, "temperature": 0}
VLLM_NAMES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
}


async def _scrape(client) -> str:
    response = await client.get("/metrics")
    assert response.status == 200
    return str(await response.text())


async def test_the_vllm_names_are_exposed_with_vllms_types(client_of) -> None:
    text = await _scrape(await client_of())
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {name: types.get(name) for name in VLLM_NAMES} == VLLM_NAMES
    assert metric(text, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(text, "vllm:prefix_cache_queries_total") == 0.0


async def test_prefix_cache_queries_and_hits_count_prompt_tokens(client_of) -> None:
    client = await client_of()
    first = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    second = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    text = await _scrape(client)
    n_prompt = first["usage"]["prompt_tokens"]
    hits = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert hits > 0
    assert metric(text, "vllm:prefix_cache_queries_total") == 2 * n_prompt
    assert metric(text, "vllm:prefix_cache_hits_total") == hits
    assert metric(text, "vllm:prefix_cache_hits_total") == metric(
        text, "edge_llm_prompt_tokens_cached_total"
    )
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
        assert metric(text, f"vllm:{name}_count") == metric(text, f"edge_llm_{name}_count") > 0
        assert metric(text, f"vllm:{name}_sum") == metric(text, f"edge_llm_{name}_sum")


async def test_running_and_kv_usage_follow_a_live_stream(client_of) -> None:
    backend = FakeBackend()
    backend.gate = threading.Semaphore(1)  # the prefill runs, then decodes wait
    client = await client_of(backend)
    engine = app_engine(client.app)
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status == 200
    try:
        for _ in range(6000):  # until the prefill's cells are counted (a loaded machine)
            text = await _scrape(client)
            if metric(text, "vllm:kv_cache_usage_perc") > 0:
                break
            await asyncio.sleep(0.01)
        assert metric(text, "vllm:num_requests_running") == 1
        assert metric(text, "vllm:num_requests_waiting") == 0
        expected = engine.kv.stats().used_tokens / engine.kv.capacity_tokens
        assert 0 < metric(text, "vllm:kv_cache_usage_perc") == expected <= 1
    finally:
        backend.gate.release(100)
        await response.text()
    assert metric(await _scrape(client), "vllm:num_requests_running") == 0
