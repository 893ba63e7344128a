"""The KV prefix cache with the real model: regenerate and the next turn in the
default per-slot layout; in the unified pool (``--kv-unified``) a shared system prompt,
cells shared by live streams and eviction for admission."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from conftest import EngineProcess, start_engine
from helpers import next_frame
from support import cached, chat_body, complete, logged_through, text_of, wait_until

pytestmark = pytest.mark.e2e

ESSAY = (
    "Summarise the following notes about rivers in two sentences. Rivers carry water from "
    "mountains to the sea, shape valleys, feed farms and cities, and move sediment that "
    "builds deltas. People have settled along rivers for thousands of years because they "
    "offer water, food, transport and fertile soil. Floods can destroy homes but also "
    "renew the land. Dams store water and make electricity, yet they change how fish "
    "migrate and how sediment reaches the coast. "
)


POOL = ("--kv-unified", "--max-sequences", "32")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """One engine for this module, so that other tests' cache entries do not interfere."""
    process = start_engine(
        tmp_path_factory.mktemp("cache"), "--max-pause-ms", "600000", "--ttft-timeout-ms", "0"
    )
    yield process
    process.stop()


@pytest.fixture(scope="module")
def pool_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    """The unified pool: prefix cells shared in place between sequences."""
    process = start_engine(
        tmp_path_factory.mktemp("pool"), *POOL, "--max-pause-ms", "600000",
        "--ttft-timeout-ms", "0",
    )  # fmt: skip
    yield process
    process.stop()


def unique(text: str) -> str:
    return f"[{uuid.uuid4().hex[:8]}] {text}"


async def test_regenerate_reuses_the_prompt_and_gives_the_same_first_token(engine) -> None:
    """The default mode promises the first token (the kept logits), not the rest: a
    draft of 8 or more rows is computed in tiles, fewer row by row, and draft lengths
    follow the load (docs/architecture.md; a different 12th token was seen beside two
    busy loops). test_determinism.py checks whole texts in the deterministic mode."""
    body = {**chat_body(unique(ESSAY), max_tokens=24, stream=False), "logprobs": True}
    first = await complete(engine.url, body)
    again = await complete(engine.url, body)
    n_prompt = again["usage"]["prompt_tokens"]
    assert n_prompt > 100
    # The whole prompt: its last token's logits were kept, so nothing is decoded
    # before the first token (engine/kv/first_logits.py).
    assert cached(again) == n_prompt
    assert cached(first) < n_prompt
    first_tokens = [r["choices"][0]["logprobs"]["content"][0] for r in (first, again)]
    assert first_tokens[0] == first_tokens[1]
    logged = await logged_through(engine, again["id"])
    hits = [e for e in logged if e["event"] == "cache_hit" and e["request_id"] == again["id"]]
    assert hits and hits[0]["n_cached_tokens"] == cached(again)
    progress = [
        e for e in logged if e["event"] == "prefill_progress" and e["request_id"] == again["id"]
    ]
    assert progress == [] or all(e["prefill_done"] == n_prompt for e in progress)


async def test_a_sampled_regenerate_from_kept_logits_draws_as_a_decode_would(engine) -> None:
    """With a seed, the first token drawn from the kept logits (through the sampler
    chain over candidates) is the one the first request drew from llama.cpp's own
    logits row; logprobs come with it (the rest of the text is not promised)."""
    body = chat_body(
        unique(ESSAY), max_tokens=12, stream=False, temperature=0.9, seed=7,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    first = await complete(engine.url, body)
    again = await complete(engine.url, body)
    assert cached(again) == again["usage"]["prompt_tokens"]
    tokens = again["choices"][0]["logprobs"]["content"]
    assert tokens[0] == first["choices"][0]["logprobs"]["content"][0]


async def test_in_the_pool_a_request_sharing_only_the_system_prompt_reuses_exactly_it(
    pool_engine: EngineProcess,
) -> None:
    engine = pool_engine
    system = unique("You are a careful assistant who answers about geography. " * 8)
    ask = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Name three long rivers."},
    ]
    other = [ask[0], {"role": "user", "content": "Which ocean is the largest?"}]
    body = chat_body("", max_tokens=4, stream=False)
    first = await complete(engine.url, {**body, "messages": ask})
    second = await complete(engine.url, {**body, "messages": other})
    # A request of the system message alone renders it plus "<|im_start|>assistant\n"
    # (3 tokens). The two prompts above share the system message and "<|im_start|>user"
    # (2 tokens), and the "\n" after it unless the tokenizer merged it with the text.
    alone = await complete(engine.url, {**body, "messages": ask[:1]})
    system_tokens = alone["usage"]["prompt_tokens"] - 3
    assert cached(second) - system_tokens in (2, 3)
    assert cached(second) < first["usage"]["prompt_tokens"]


async def test_in_the_pool_two_live_streams_hold_their_common_prefix_once(
    pool_engine: EngineProcess,
) -> None:
    engine = pool_engine
    prompt = unique(ESSAY)
    url = engine.base_url.replace("http", "ws") + "/stream"
    async with aiohttp.ClientSession() as session:
        first = await session.ws_connect(url)
        await first.send_json({"type": "start", "request": chat_body(prompt, max_tokens=400)})
        await next_frame(first, "delta")
        await first.send_json({"type": "pause"})  # both stay live, holding their cells
        second = await session.ws_connect(url)
        body = chat_body(prompt + " Answer in French.", max_tokens=400)
        await second.send_json({"type": "start", "request": body})
        await next_frame(second, "delta")
        await second.send_json({"type": "pause"})
        snapshot = engine.debug_streams()
        live = [s for s in snapshot["streams"] if s["state"] in ("decoding", "paused")]
        assert len(live) == 2
        shared = max(s["n_cached_tokens"] for s in live)
        assert shared > 100
        held = sum(s["kv_tokens"] for s in live) - shared
        assert snapshot["kv_used_bytes"] == held * snapshot["kv_bytes_per_token"]
        await first.close()
        await second.close()


async def test_in_the_pool_cache_is_evicted_so_a_new_request_fits(tmp_path: Path) -> None:
    """A budget that holds the cache of one request plus one new request: the new
    one is admitted at once by evicting the cache, not queued behind it."""
    small = start_engine(
        tmp_path, *POOL, "--max-kv-cache-mb", "6", "--max-queue", "0", "--ttft-timeout-ms", "0"
    )
    try:
        snapshot = small.debug_streams()
        per_token = snapshot["kv_bytes_per_token"]
        assert snapshot["kv_budget_bytes"] // per_token == 256
        await complete(small.url, chat_body(unique(ESSAY), max_tokens=20, stream=False))
        assert small.debug_streams()["kv_cached_bytes"] > 100 * per_token
        # max_queue 0: without eviction this would be a 503.
        other = await complete(
            small.url,
            chat_body(unique(ESSAY.replace("river", "glacier")), max_tokens=20, stream=False),
        )
        assert other["usage"]["completion_tokens"] > 0
        assert small.metric("edge_llm_kv_cache_evictions_total") > 0
        assert any(e["event"] == "cache_evicted" for e in small.events())
    finally:
        small.stop()


async def test_the_next_turn_continues_the_slot_after_the_earlier_answer(engine) -> None:
    """Every cell of the earlier turn, its answer's included (``engine/kv/slots.py``):
    the next turn prefills only what is new."""
    body = chat_body(unique(ESSAY), max_tokens=24, stream=False)
    await complete(engine.url, body)
    again = await complete(engine.url, body)
    n_prompt = again["usage"]["prompt_tokens"]
    assert cached(again) == n_prompt  # its last token's logits were kept
    # The slot now holds the regenerate's answer: in the default mode it may part from
    # the first answer after its first token (threads or batch shape changed).
    answer = again["choices"][0]["message"]["content"]
    turn = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Now in one word."},
        ],
    }
    result = await complete(engine.url, turn)
    # The answer's last token was sampled, never fed back; the template's end-of-turn
    # tokens around it are new.
    earlier = n_prompt + again["usage"]["completion_tokens"] - 1
    assert earlier - 3 <= cached(result) <= earlier < result["usage"]["prompt_tokens"]


async def test_a_restarted_engine_answers_a_known_prompt_from_its_disk_tier(
    tmp_path: Path,
) -> None:
    cache_dir = str(tmp_path / "kv")
    body = chat_body(unique(ESSAY), max_tokens=160, stream=False)
    flags = ("--cache-dir", cache_dir, "--ttft-timeout-ms", "0", "--deterministic")
    first_engine = start_engine(tmp_path, *flags)
    try:
        first = await complete(first_engine.url, body)
    finally:
        assert first_engine.stop() == 0  # its kept slot goes to the disk tier
    engine = start_engine(tmp_path, *flags)
    try:
        await wait_until(
            lambda: engine.debug_streams()["kv_host_cache_entries"] >= 1,
            what="the disk tier read back",
        )
        again = await complete(engine.url, body)
        assert cached(again) == again["usage"]["prompt_tokens"]  # nothing prefilled
        assert text_of(again) == text_of(first)
        assert engine.metric("edge_llm_prompt_cache_hits_total", tier="disk") == 1
    finally:
        engine.stop()
