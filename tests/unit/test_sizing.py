"""Defaults that fit the served model: the prompt limit, the KV budget and the TTFT
time-out sized from its shape, explicit values kept, and a warning with a number."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import edge_llm
from edge_llm.cli.serve import prompt_limit_warning
from edge_llm.config.tree import load_config
from edge_llm.models.sizing import ModelShape, fit, kv_mb_for, sequence_tokens, ttft_fit

GIB = 1 << 30
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M: 28 layers, 2 KV heads of 128: 28 KiB a token in f16.
QWEN = ModelShape(trained_tokens=32768, kv_bytes_per_token=28672, weights_bytes=1_117_320_768)


def test_a_large_context_model_gets_a_4096_token_prompt_and_the_kv_that_holds_it() -> None:
    config = load_config(None, env={})
    sized = fit(config, QWEN, available_bytes=8 * GIB)
    assert sized.values["max_prompt_tokens"] == 4096
    kv_mb = sized.values["max_kv_cache_mb"]
    assert sequence_tokens(config, kv_mb, QWEN) >= 4096 + 512  # a prompt and its answer
    assert sequence_tokens(config, kv_mb - 1, QWEN) < 4096 + 512  # the smallest that does
    assert "each of 4 slots holds 4608 tokens at 28 KiB a token" in sized.reasons[1]


def test_little_memory_lowers_the_prompt_limit_not_below_the_seeds() -> None:
    config = load_config(None, env={})
    sized = fit(config, QWEN, available_bytes=QWEN.weights_bytes + 600 * (1 << 20))
    prompt = sized.values["max_prompt_tokens"]
    assert 512 <= prompt < 4096
    assert "what 300 MiB of KV hold" in sized.reasons[0]
    assert sequence_tokens(config, sized.values["max_kv_cache_mb"], QWEN) >= prompt + 512


def test_explicit_values_win() -> None:
    config = load_config(None, env={}, overrides={"max_prompt_tokens": 2048})
    sized = fit(config, QWEN, available_bytes=8 * GIB)
    assert "max_prompt_tokens" not in sized.values
    assert sequence_tokens(config, sized.values["max_kv_cache_mb"], QWEN) >= 2048 + 512
    both = load_config(None, env={}, overrides={"max_prompt_tokens": 600, "max_kv_cache_mb": 300})
    assert fit(both, QWEN, available_bytes=8 * GIB).values == {}
    timed = load_config(None, env={}, overrides={"ttft_timeout_ms": 5000})
    kept = fit(timed, QWEN, available_bytes=8 * GIB)
    ttft_fit(timed, 4096, 150.0, kept)
    assert "ttft_timeout_ms" not in kept.values


def test_the_ttft_timeout_covers_the_prompt_limit_at_the_measured_rate() -> None:
    config = load_config(None, env={})
    sized = fit(config, QWEN, available_bytes=8 * GIB)
    ttft_fit(config, 4096, 150.0, sized)
    assert sized.values["ttft_timeout_ms"] == 41000  # 1.5 x 4096 / 150 = 40.96 s
    fast = fit(config, QWEN, available_bytes=8 * GIB)
    ttft_fit(config, 512, 1000.0, fast)
    assert fast.values["ttft_timeout_ms"] == 10000  # never below the seed's


def test_the_warning_names_the_budget_that_would_hold_the_prompt() -> None:
    config = load_config(None, env={}, overrides={"max_prompt_tokens": 4096})
    kv = SimpleNamespace(sequence_tokens=1536, per_slot=True)
    warning = prompt_limit_warning(config, kv, QWEN)  # type: ignore[arg-type]
    need = kv_mb_for(config, 4096 + 512, QWEN)
    assert need is not None and sequence_tokens(config, need, QWEN) >= 4608
    assert warning is not None
    assert f"raise max_kv_cache_mb to {need} (a 4096-token prompt and a 512-token answer)" in (
        warning
    )
    small = ModelShape(trained_tokens=2048, kv_bytes_per_token=28672, weights_bytes=1)
    assert "the model's context is 2048 tokens" in (
        prompt_limit_warning(config, kv, small) or ""  # type: ignore[arg-type]
    )


def test_the_seeds_toml_keeps_its_values() -> None:
    seed = Path(edge_llm.__file__).parent / "configs" / "engine.toml"
    config = load_config(seed, env={})
    sized = fit(config, QWEN, available_bytes=8 * GIB)
    ttft_fit(config, 512, 10.0, sized)
    assert sized.values == {}
