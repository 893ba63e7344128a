"""Two real models (SmolLM2 135M and Gemma 3 270M) in one process: switching within
a memory budget, single-flight loads, and real clients no one here wrote: the
official ``ollama`` package and the ``openai`` SDK's embeddings."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import ollama
import openai
import psutil
import pytest

from conftest import EngineProcess, start_engine
from support import STORY, RawSseClient, RssSampler, gemma_path, logged_through, wait_until

pytestmark = pytest.mark.e2e

MIB = 1024 * 1024


def two_model_flags(*extra: str) -> list[str]:
    """The embedded SmolLM2 as ``smol`` (the default model) and Gemma in one memory
    ledger of 80 MiB, 40 of it each (a model's share: its KV context, host tiers and
    embeddings context); first tokens may take a minute on a loaded machine."""
    return ["--model-id", "smol", "--model", f"gemma={gemma_path()}",
            "--max-kv-cache-mb", "80", "--ttft-timeout-ms", "60000", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    engine = start_engine(tmp_path_factory.mktemp("models"), *two_model_flags())
    yield engine
    engine.stop()


def post(engine: EngineProcess, path: str, body: dict[str, object]) -> dict[str, object]:
    import urllib.request

    request = urllib.request.Request(
        engine.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, object] = json.loads(response.read())
        return result


def states(engine: EngineProcess) -> dict[str, str]:
    return {m["id"]: m["state"] for m in engine.get_json("/v1/models")["data"]}


def loads(engine: EngineProcess, name: str) -> float:
    found = re.search(rf'^edge_llm_model_loads_total\{{model="{name}"\}} (\S+)$',
                      engine.metrics_text(), re.M)  # fmt: skip
    assert found, "edge_llm_model_loads_total missing"
    return float(found.group(1))


def test_switching_models_that_do_not_fit_together_stays_in_the_budget(tmp_path: Path) -> None:
    # Counted: SmolLM2 about 198 MiB, Gemma about 402 MiB (weights, 40 MiB KV, reserve):
    # each fits 420, both do not (measured resident: about 136 and 320 MiB).
    budget_mb = 420
    engine = start_engine(tmp_path, *two_model_flags("--max-model-memory-mb", str(budget_mb)))
    try:
        post(engine, "/models/unload", {"model": "smol"})
        base = psutil.Process(engine.proc.pid).memory_info().rss
        # Completions: Gemma 3 270M is a base model, without the chat template chat needs.
        text = {"prompt": "Hello", "max_tokens": 8, "temperature": 0}
        with RssSampler(engine.proc.pid, period_s=0.01) as rss:
            for model in ("gemma", "smol", "gemma", "smol"):
                answer = post(engine, "/v1/completions", {**text, "model": model})
                assert answer["model"] == model
                other = "smol" if model == "gemma" else "gemma"
                assert states(engine) == {model: "loaded", other: "unloaded"}
        assert rss.peak - base <= budget_mb * MIB, (
            f"{(rss.peak - base) / MIB:.0f} MiB over the process without models"
        )
        document = engine.debug_streams()
        assert document["model_memory_used_bytes"] <= budget_mb * MIB
        logged = asyncio.run(logged_through(engine, str(answer["id"])))
        unloads = [e for e in logged if e["event"] == "model_unloaded"]
        assert [e["reason"] for e in unloads] == ["request", "memory", "memory", "memory"]
    finally:
        engine.stop()
    while not engine.printed.empty():
        engine.output.append(engine.printed.get())
    assert not re.search(r"(GET|POST) \S+ 5\d\d ", "".join(engine.output)), "a 5xx answer"


async def test_concurrent_first_requests_load_the_model_once(two_models) -> None:
    engine = two_models
    post(engine, "/models/unload", {"model": "gemma"})
    before = loads(engine, "gemma")
    body = {"model": "gemma", "prompt": "Hi", "max_tokens": 4, "temperature": 0}
    async with aiohttp.ClientSession() as session:

        async def ask() -> int:
            async with session.post(engine.base_url + "/completions", json=body) as reply:
                await reply.read()
                return reply.status

        statuses = await asyncio.gather(*(ask() for _ in range(5)))
    assert statuses == [200] * 5
    assert loads(engine, "gemma") == before + 1

    def gemma_loads() -> list[dict[str, object]]:
        return [e for e in engine.events_of("model_loading") if e["model"] == "gemma"]

    await wait_until(lambda: len(gemma_loads()) >= before + 1, what="the model_loading line")
    assert len(gemma_loads()) == before + 1


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_the_ollama_client_works_unchanged(two_models) -> None:
    with ollama.Client(host=two_models.url, timeout=120) as client:
        ollama_calls(client)


def ollama_calls(client: ollama.Client) -> None:
    assert [m.model for m in client.list().models] == ["smol", "gemma"]
    gemma = client.show("gemma")
    assert gemma.details is not None and gemma.details.family == "gemma3"
    assert gemma.details.quantization_level == "Q4_K_M"
    assert "gemma3.context_length" in (gemma.modelinfo or {})
    parts = list(client.chat(
        model="smol", messages=[{"role": "user", "content": "Name the capital of France."}],
        stream=True, options={"temperature": 0, "num_predict": 16},
    ))  # fmt: skip
    assert "Paris" in "".join(p.message.content or "" for p in parts)
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert (parts[-1].eval_count or 0) >= len(parts) - 1  # each chunk has a token or more
    assert all(not p.done for p in parts[:-1])
    made = client.generate(model="gemma", prompt="The capital of France is",
                           options={"temperature": 0, "num_predict": 6})  # fmt: skip
    assert made.done and made.eval_count == 6
    assert made.prompt_eval_count and made.prompt_eval_count > 3
    running = {m.model for m in client.ps().models}
    assert running == {"smol", "gemma"}
    vectors = client.embed(model="gemma", input=["a cat sat", "a kitten rested", "stock prices"])
    cat, kitten, stock = vectors.embeddings
    assert cosine(cat, kitten) > cosine(cat, stock)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404


@pytest.mark.parametrize("model", ["smol", "gemma"])
def test_openai_sdk_embeddings_from_either_model(two_models, model: str) -> None:
    with openai.OpenAI(base_url=two_models.base_url, api_key="unused", max_retries=0) as client:
        embedding_calls(client, model)


def embedding_calls(client: openai.OpenAI, model: str) -> None:
    texts = ["The cat sat on the mat.", "A kitten rested on the rug.", "Markets fell."]
    packed = client.embeddings.create(model=model, input=texts)  # the SDK asks for base64
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    a, b, c = (d.embedding for d in packed.data)
    assert cosine(a, b) > cosine(a, c)
    assert floats.data[0].embedding == pytest.approx(a, abs=1e-6)
    assert packed.usage.prompt_tokens > 10
    with pytest.raises(openai.BadRequestError, match="max_embedding_tokens"):
        client.embeddings.create(model=model, input="word " * 600)


def test_a_slow_ndjson_reader_is_paused_like_an_sse_one(two_models) -> None:
    engine = two_models
    body = {"model": "smol", "messages": [{"role": "user", "content": STORY}],
            "options": {"temperature": 0, "num_predict": 300}}  # fmt: skip
    slow = RawSseClient(engine.url, body, path="/api/chat")
    try:
        stream_id = slow.request_id()
        stalled = asyncio.run(wait_until(
            lambda: (s := engine.stream(stream_id))["state"] == "paused" and s,
            what="the unread NDJSON stream to pause",
        ))  # fmt: skip
        assert stalled["pause_cause"] == "socket_full"
        assert stalled["model"] == "smol"
        other = {**body, "stream": False, "options": {"temperature": 0, "num_predict": 16}}
        assert post(engine, "/api/chat", other)["eval_count"] == 16  # the engine ran on
        assert engine.stream(stream_id)["n_generated"] == stalled["n_generated"]
        slow.read_until(b'"done": true')
    finally:
        slow.close()
    final = engine.stream(stream_id)
    assert final["state"] == "done"
    assert final["pauses"] >= 1


def refusal(engine: EngineProcess, path: str, body: dict[str, object]) -> tuple[int, str, str]:
    """(status, error code, Retry-After) of a request expected to be refused."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        engine.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raise AssertionError(f"answered {response.status}, not refused")
    except urllib.error.HTTPError as refused:
        code = json.loads(refused.read())["error"]["code"]
        return refused.code, code, refused.headers.get("Retry-After", "")


LEDGER_CAP_MB = 80


async def test_both_models_kv_stays_in_one_ledger_and_a_load_past_it_is_refused(
    tmp_path: Path,
) -> None:
    """One cap (80 MiB) for both models' KV: first shared by default (40 each; both
    loaded, with their KV and embeddings contexts), then with Gemma's own budget at the
    whole cap:
    while SmolLM2 is busy Gemma's KV context cannot fit and its request gets 503
    kv_budget_exceeded with Retry-After, nothing loaded; once SmolLM2 is idle it is
    unloaded for Gemma."""
    cap = LEDGER_CAP_MB * MIB
    engine = start_engine(tmp_path, *two_model_flags())
    try:
        for model in ("smol", "gemma"):
            answer = post(engine, "/v1/completions",
                          {"model": model, "prompt": STORY, "max_tokens": 8})  # fmt: skip
            assert answer["model"] == model
            post(engine, "/v1/embeddings", {"model": model, "input": ["a cat", "a dog"]})
        assert states(engine) == {"smol": "loaded", "gemma": "loaded"}
        ledger = engine.debug_streams()["memory_ledger"]  # the default model's view
        assert ledger["cap_bytes"] == cap and ledger["embeddings_bytes"] > 0
        assert ledger["other_models_bytes"] > 20 * MIB  # Gemma's KV context and more
        assert ledger["total_bytes"] <= cap
        assert engine.metric("edge_llm_memory_ledger_bytes", line="total", model="smol") <= cap
        assert engine.metric("edge_llm_memory_ledger_bytes", line="other_models", model="smol") > 0
    finally:
        engine.stop()

    toml = tmp_path / "gemma.toml"
    toml.write_text(f'[models.gemma]\npath = "{gemma_path()}"\n'
                    f"max_kv_cache_mb = {LEDGER_CAP_MB}\n")  # fmt: skip
    engine = start_engine(tmp_path, "--model-id", "smol", "--config", str(toml),
                          "--max-kv-cache-mb", str(LEDGER_CAP_MB),
                          "--ttft-timeout-ms", "60000")  # fmt: skip
    try:  # SmolLM2 holds 22.5 MiB of KV context and 11.25 of embeddings context
        post(engine, "/v1/embeddings", {"model": "smol", "input": ["a cat", "a dog"]})
        body = {"model": "smol", "messages": [{"role": "user", "content": STORY}],
                "max_tokens": 300, "temperature": 0, "stream": True}  # fmt: skip
        slow = RawSseClient(engine.url, body)  # holds SmolLM2: it cannot be unloaded
        try:
            slow.request_id()  # the answer began: SmolLM2 is leased
            gemma = {"model": "gemma", "prompt": "Hello", "max_tokens": 4}  # 54 MiB of KV
            status, code, retry_after = refusal(engine, "/v1/completions", gemma)
            assert (status, code) == (503, "kv_budget_exceeded") and int(retry_after) >= 1
            assert states(engine) == {"smol": "loaded", "gemma": "unloaded"}
            assert engine.debug_streams()["memory_ledger"]["total_bytes"] <= cap
        finally:
            slow.close()
        await wait_until(lambda: engine.debug_streams()["models"]["smol"]["requests"] == 0,
                         what="SmolLM2 to be idle")  # fmt: skip
        assert post(engine, "/v1/completions", gemma)["model"] == "gemma"
        assert states(engine) == {"smol": "unloaded", "gemma": "loaded"}
        unloads = engine.events_of("model_unloaded")
        assert [(e["model"], e["reason"]) for e in unloads] == [("smol", "memory")]
    finally:
        engine.stop()
