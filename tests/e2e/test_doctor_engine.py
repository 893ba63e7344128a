"""``edge-llm doctor`` against the real engine: healthy, then one mistake at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from helpers import free_port

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
CLEAN_ENV = {
    name: value
    for name, value in os.environ.items()
    if not name.lower().endswith("_proxy") and not name.startswith(("EDGE_LLM_", "OPENAI_"))
}


def doctor(*argv: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """Run ``python -m edge_llm doctor --json`` as a user would."""
    done = subprocess.run(
        [sys.executable, "-m", "edge_llm", "doctor", "--json", "--timeout", "60", *argv],
        capture_output=True,
        text=True,
        env={**CLEAN_ENV, **(env or {})},
        timeout=600,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["status"] for check in report["checks"]}


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["checks"] if c["name"] == name)


def test_healthy_engine_passes(engine_factory: Any) -> None:
    # Generous TTFT thresholds, the doctor's and the engine's: this test is about the
    # checks, not this machine's speed (a loaded machine took the 300-word prompt past
    # the seed's 10 s time-out: the ttft check then warns of a 504).
    engine = engine_factory("--ttft-timeout-ms", "600000")
    code, report = doctor(
        "--base-url", engine.base_url, "--model", MODEL, "--ttft-warn-ms", "600000"
    )
    assert set(statuses(report).values()) == {"pass"}, [
        c for c in report["checks"] if c["status"] != "pass"
    ]
    assert code == 0
    ttft = check(report, "ttft")["details"]
    assert ttft["long_ttft_ms"] > 0
    assert ttft["short_ttft_ms"] > 0


def test_wrong_model_slash_and_dead_proxy(engine_server: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    code, report = doctor(
        "--base-url",
        engine_server.base_url + "/",
        "--model",
        "smollm2-135m",
        "--ttft-warn-ms",
        "600000",
        env={"HTTP_PROXY": dead, "http_proxy": dead},
    )
    assert code == 1
    assert check(report, "base_url")["fix"] == f"set the base URL to {engine_server.base_url}"
    proxy = check(report, "proxy")
    assert proxy["summary"].startswith("local proxy failed")
    assert "NO_PROXY=127.0.0.1" in proxy["fix"]
    model = check(report, "model")
    assert model["status"] == "fail"
    assert model["details"]["closest"] == MODEL
    # The engine is reached directly and with the closest id, so streaming is still checked.
    assert check(report, "stream")["status"] == "pass"
    assert check(report, "chunks")["status"] == "pass"


def test_keys_against_an_engine_that_requires_one(engine_factory: Any) -> None:
    engine = engine_factory("--api-key", "sk-test")
    argv = ("--base-url", engine.base_url, "--model", MODEL, "--ttft-warn-ms", "600000")
    code, report = doctor(*argv, "--api-key", "sk-wrong")
    assert code == 1
    assert "wrong key" in check(report, "auth")["summary"]
    assert check(report, "stream")["status"] == "skip"

    code, report = doctor(*argv, "--api-key", "sk-test ")
    assert code == 1
    assert check(report, "api_key")["status"] == "fail"  # other clients would send the space
    assert check(report, "auth")["status"] == "pass"  # this engine trims it

    code, report = doctor(*argv, env={"EDGE_LLM_API_KEY": "sk-test"})
    assert code == 0
    assert report["settings"]["api_key"]["source"] == "EDGE_LLM_API_KEY"


def test_a_repeat_run_still_measures_a_real_prefill(engine_factory: Any) -> None:
    """The prefix cache must not turn the doctor's prefill check into a cache hit on
    the second run: its measured prompt starts with a tag new to each request."""
    engine = engine_factory("--ttft-timeout-ms", "600000")  # a long prefill on a loaded machine
    argv = ("--base-url", engine.base_url, "--model", MODEL, "--ttft-warn-ms", "600000")
    for _ in range(2):
        prefilled = engine.metric("edge_llm_prompt_tokens_total")
        ttft = check(doctor(*argv)[1], "ttft")
        prefilled = engine.metric("edge_llm_prompt_tokens_total") - prefilled
        details = ttft["details"]
        n_prompt = details["long_prompt_tokens"]
        assert n_prompt > 300, ttft
        # Only the chat template's fixed opening ("<|im_start|>system\n") and
        # perhaps a token of an earlier tag can be shared with an earlier request.
        assert details["long_cached_tokens"] < 0.03 * n_prompt, ttft
        # The same request sent again is the cache hit, reported apart.
        assert details["repeat_cached_tokens"] >= n_prompt - 1, ttft
        # What the engine prefilled says the same, in tokens: the whole uncached prompt
        # once (the doctor's other requests are short), the repeat at most a token.
        long_uncached = n_prompt - details["long_cached_tokens"]
        assert long_uncached <= prefilled < long_uncached + n_prompt // 4, (prefilled, ttft)
