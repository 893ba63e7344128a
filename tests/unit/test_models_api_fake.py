"""Several models, embeddings and Ollama's API over HTTP, in-process, with fake backends."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from edge_llm.config.tree import load_config
from edge_llm.engine import build_engine
from edge_llm.models.spec import ModelSpec
from edge_llm.server.app import create_app
from edge_llm.server.context import CONTEXT
from edge_llm.server.runtime import build_context, engine_settings

from fakes import FakeBackend, fake_loader, text_script

ClientFactory = Callable[..., Any]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}


@pytest.fixture
async def client_of() -> AsyncIterator[ClientFactory]:
    made: list[tuple[TestClient, Any]] = []

    async def make(*models: str, script: str = "Hello there", **overrides: object) -> TestClient:
        """A server whose default model is ``fake``; ``models`` are more, loaded
        (by a fake loader) when asked for."""
        named = [f"{name}=/nowhere/{name}.gguf" for name in models]
        config = load_config(None, env={}, overrides={"model": named, **overrides})

        def backend_of(spec: ModelSpec) -> FakeBackend:
            return FakeBackend(script=text_script(f"{spec.name} says {script}"))

        backend = FakeBackend(script=text_script(script))
        engine = build_engine(backend, engine_settings(config))
        engine.start(asyncio.get_running_loop())
        loader = fake_loader(config, backend_of)
        ctx = build_context(config, engine, backend, lambda *a, **k: None, loader=loader)
        client = TestClient(TestServer(create_app(ctx)))
        await client.start_server()
        made.append((client, ctx))
        return client

    yield make
    for client, ctx in made:
        await client.close()
        await ctx.pool.drain(0)
        await ctx.pool.unload_all()


async def states(client: TestClient) -> dict[str, str]:
    listing = await (await client.get("/v1/models")).json()
    return {m["id"]: m["state"] for m in listing["data"]}


async def test_a_named_model_loads_on_first_request_and_answers(client_of) -> None:
    client = await client_of("b")
    assert await states(client) == {"fake": "loaded", "b": "unloaded"}
    response = await client.post("/v1/chat/completions", json={**CHAT, "model": "b"})
    body = await response.json()
    assert response.status == 200, body
    assert body["model"] == "b"
    assert body["choices"][0]["message"]["content"] == "b says"
    assert await states(client) == {"fake": "loaded", "b": "loaded"}
    unloaded = await client.post("/models/unload", json={"model": "b"})
    assert (await unloaded.json())["state"] == "unloaded"
    loaded = await client.post("/models/load", json={"model": "b"})
    assert (await loaded.json()) == {"success": True, "model": "b", "state": "loaded"}
    missing = await client.post("/models/load", json={"model": "zz"})
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "model_not_found"


async def test_metrics_are_labelled_by_model_only_when_several_are_served(client_of) -> None:
    one = await client_of()
    await one.post("/v1/chat/completions", json=CHAT)
    text = await (await one.get("/metrics")).text()
    assert "edge_llm_generated_tokens_total 6.0" in text
    two = await client_of("b")
    await two.post("/v1/chat/completions", json={**CHAT, "model": "b"})
    text = await (await two.get("/metrics")).text()
    assert 'edge_llm_generated_tokens_total{model="b"} 6.0' in text
    assert 'edge_llm_generated_tokens_total{model="fake"} 0.0' in text
    assert 'edge_llm_model_loads_total{model="b"} 1.0' in text
    assert 'edge_llm_model_loaded{model="b"} 1.0' in text
    await two.post("/models/unload", json={"model": "b"})
    unloaded = await two.get("/metrics")  # an unloaded model's gauges read zero
    assert unloaded.status == 200
    text = await unloaded.text()
    assert 'edge_llm_model_loaded{model="b"} 0.0' in text
    assert 'edge_llm_kv_cache_tier_bytes{model="b",tier="disk"} 0.0' in text


async def test_debug_streams_keeps_the_default_models_totals_at_the_top(client_of) -> None:
    client = await client_of("b")
    await client.post("/v1/chat/completions", json={**CHAT, "model": "b"})
    document = await (await client.get("/debug/streams")).json()
    assert document["engine_alive"] is True
    assert document["kv_budget_bytes"] == document["models"]["fake"]["kv_budget_bytes"]
    assert set(document["models"]) == {"fake", "b"}
    assert document["models"]["b"]["state"] == "loaded"
    assert [s["model"] for s in document["streams"]] == ["b"]
    await client.post("/models/unload", json={"model": "b"})
    document = await (await client.get("/debug/streams")).json()
    assert document["models"]["b"]["state"] == "unloaded"
    assert document["models"]["b"]["engine_alive"] is False


async def test_openai_embeddings_in_floats_and_base64(client_of) -> None:
    client = await client_of()
    body = {"input": ["abc", "abd"], "encoding_format": "float"}
    floats = await (await client.post("/v1/embeddings", json=body)).json()
    assert [d["index"] for d in floats["data"]] == [0, 1]
    vector = floats["data"][0]["embedding"]
    assert len(vector) == 8
    assert abs(sum(x * x for x in vector) - 1.0) < 1e-6  # normalized
    assert floats["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    encoded = await (
        await client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})
    ).json()
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    assert list(struct.unpack("<8f", raw)) == pytest.approx(vector, abs=1e-6)
    tokens = await (await client.post("/v1/embeddings", json={"input": [101, 102]})).json()
    assert tokens["usage"]["prompt_tokens"] == 2


async def test_embeddings_limits_are_400s_naming_the_limit(client_of) -> None:
    client = await client_of(max_embedding_inputs=2, max_embedding_tokens=8)
    many = await client.post("/v1/embeddings", json={"input": ["a", "b", "c"]})
    assert many.status == 400
    assert (await many.json())["error"]["limit"] == "max_embedding_inputs"
    long = await client.post("/v1/embeddings", json={"input": "x" * 9})
    assert long.status == 400
    error = (await long.json())["error"]
    assert error["limit"] == "max_embedding_tokens"
    assert "input 0 has 9 tokens" in error["message"]
    truncated = await client.post("/api/embed", json={"model": "fake", "input": "x" * 9})
    assert truncated.status == 200  # Ollama's truncate (default true) cuts it
    assert (await truncated.json())["prompt_eval_count"] == 8
    refused = await client.post(
        "/api/embed", json={"model": "fake", "input": "x" * 9, "truncate": False}
    )
    assert refused.status == 400
    assert "max_embedding_tokens" in (await refused.json())["error"]
    bad_id = await client.post("/v1/embeddings", json={"input": [5000]})
    assert bad_id.status == 400


async def test_ollama_chat_streams_ndjson_and_ends_with_timings(client_of) -> None:
    client = await client_of("b")
    body = {"model": "b:latest", "messages": [{"role": "user", "content": "hi"}],
            "options": {"temperature": 0, "num_predict": 6}}  # fmt: skip
    response = await client.post("/api/chat", json=body)
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in (await response.text()).splitlines()]
    assert all(not line["done"] for line in lines[:-1])
    assert "".join(line["message"]["content"] for line in lines) == "b says"
    last = lines[-1]
    assert last["done"] is True
    assert last["done_reason"] == "length"
    assert last["eval_count"] == 6
    assert last["total_duration"] >= last["eval_duration"] > 0
    whole = await (await client.post("/api/chat", json={**body, "stream": False})).json()
    assert whole["message"]["content"] == "b says"


async def test_ollama_generate_and_the_load_and_unload_requests(client_of) -> None:
    client = await client_of("b")
    body = {"model": "b", "prompt": "hi", "stream": False, "options": {"num_predict": 3}}
    whole = await (await client.post("/api/generate", json=body)).json()
    assert whole["response"] == "b s"
    unload = await (await client.post("/api/generate", json={"model": "b", "keep_alive": 0})).json()
    assert unload["done_reason"] == "unload"
    assert (await states(client))["b"] == "unloaded"
    load = await (await client.post("/api/chat", json={"model": "b", "messages": []})).json()
    assert load["done_reason"] == "load"
    ps = await (await client.get("/api/ps")).json()
    assert sorted(m["name"] for m in ps["models"]) == ["b", "fake"]


async def test_ollama_errors_have_ollamas_shape(client_of) -> None:
    client = await client_of()
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ({"model": "nope", "messages": []}, 404, 'model "nope" not found'),
        ({**chat, "options": {"temperature": "hot"}}, 400, "options.temperature"),
        ({**chat, "options": {"repeat_penalty": 0}}, 400, "options.repeat_penalty"),
        ({**chat, "options": {"mirostat": 2}}, 400, "options.mirostat"),
        ({**chat, "format": "yaml"}, 400, "format"),
        ({**chat, "think": True}, 400, "does not support thinking"),
        ({**chat, "keep_alive": "soon"}, 400, "keep_alive"),
        ({"messages": []}, 400, "model"),
    ]
    for body, status, words in cases:
        response = await client.post("/api/chat", json=body)
        error = await response.json()
        assert response.status == status, (body, error)
        assert list(error) == ["error"]
        assert words in error["error"], (body, error)


async def test_ollama_options_and_json_format_reach_sampling(client_of) -> None:
    client = await client_of()
    body = {
        "model": "fake",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "format": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "options": {"temperature": 0.5, "top_k": 7, "seed": 3, "stop": ["x"], "num_thread": 8,
                    "num_predict": 2, "use_mmap": False},
    }  # fmt: skip
    response = await client.post("/api/chat", json=body)
    assert response.status == 200, await response.text()
    backend = client.server.app[CONTEXT].pool.loaded("fake").engine.backend
    params = backend.last_params
    assert (params.temperature, params.top_k, params.seed, params.stop) == (0.5, 7, 3, ("x",))
    assert params.grammar is not None


async def test_num_ctx_bounds_prompt_and_answer(client_of) -> None:
    client = await client_of()
    body = {"model": "fake", "prompt": "0123456789", "raw": True, "stream": False,
            "options": {"num_ctx": 5}}  # fmt: skip
    refused = await client.post("/api/generate", json=body)
    assert refused.status == 400
    assert "num_ctx" in (await refused.json())["error"]
    body["options"] = {"num_ctx": 12, "num_predict": 100}
    clamped = await client.post("/api/generate", json=body)
    assert (await clamped.json())["eval_count"] == 2


async def test_ollama_listings_and_version(client_of) -> None:
    client = await client_of("b")
    tags = await (await client.get("/api/tags")).json()
    assert [m["name"] for m in tags["models"]] == ["fake", "b"]
    assert tags["models"][1]["details"]["format"] == "gguf"
    show = await client.post("/api/show", json={"model": "b"})
    assert show.status == 200
    assert "completion" in (await show.json())["capabilities"]
    version = await (await client.get("/api/version")).json()
    assert version["version"].count(".") == 2
