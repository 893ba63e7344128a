"""The engine configuration: the seed's TOML verbatim, env and flags, clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from edge_llm.config.tree import ConfigError, add_config_flags, flag_overrides, load_config

SEED_TOML = """
[engine.backpressure]
max_kv_cache_mb = 256
max_prompt_tokens = 512
pause_on_socket_full = true
resume_threshold = 0.3
cancel_release_kv = true
ttft_timeout_ms = 10000
[engine.stream]
chunk_size_tokens = 1
flush_interval_ms = 20
heartbeat_interval_ms = 1000
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(text)
    return path


def test_seed_toml_loads_verbatim(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SEED_TOML), env={})
    assert config.backpressure.max_kv_cache_mb == 256
    assert config.backpressure.resume_threshold == 0.3
    assert config.stream.heartbeat_interval_ms == 1000
    assert config.server.host == "127.0.0.1"


def test_shipped_seed_config_is_the_seed() -> None:
    shipped = Path(__file__).parents[2] / "src/edge_llm/configs/engine.toml"
    assert load_config(shipped, env={}) == load_config(None, env={})


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine.backpressure]\nmax_kv_cache = 3\n")
    with pytest.raises(ConfigError, match=r"engine\.backpressure\.max_kv_cache"):
        load_config(path, env={})


def test_bad_value_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine.backpressure]\nresume_threshold = 1.5\n")
    with pytest.raises(ConfigError, match="resume_threshold"):
        load_config(path, env={})


def test_env_overrides_file_and_flags_override_env(tmp_path: Path) -> None:
    path = write(tmp_path, SEED_TOML)
    env = {"EDGE_LLM_MAX_KV_CACHE_MB": "128", "EDGE_LLM_PAUSE_ON_SOCKET_FULL": "false"}
    config = load_config(path, env=env)
    assert config.backpressure.max_kv_cache_mb == 128
    assert config.backpressure.pause_on_socket_full is False
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(["--max-kv-cache-mb", "64", "--api-key", "k1", "--api-key", "k2"])
    config = load_config(path, env=env, overrides=flag_overrides(args))
    assert config.backpressure.max_kv_cache_mb == 64
    assert config.server.api_key == ["k1", "k2"]


def test_bad_env_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="ttft_timeout_ms"):
        load_config(None, env={"EDGE_LLM_TTFT_TIMEOUT_MS": "soon"})


def test_the_cache_table_loads_from_toml_env_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text("[engine.cache]\nprefix_cache = false\nhost_offload_mb = 64\n")
    config = load_config(path, env={"EDGE_LLM_OFFLOAD_PAUSED_AFTER_MS": "250"})
    assert (config.cache.prefix_cache, config.cache.host_offload_mb) == (False, 64)
    assert config.cache.offload_paused_after_ms == 250
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = flag_overrides(parser.parse_args(["--prefix-cache", "--host-offload-mb", "0"]))
    config = load_config(path, env={}, overrides=flags)
    assert (config.cache.prefix_cache, config.cache.host_offload_mb) == (True, 0)


# -- errors name the key's full path and where the value came from ----------------------


def test_a_bad_env_value_names_the_variable_and_the_full_key() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"EDGE_LLM_MAX_KV_CACHE_MB": "abc"})
    message = str(caught.value)
    assert "engine.backpressure.max_kv_cache_mb" in message
    assert "(from environment variable EDGE_LLM_MAX_KV_CACHE_MB)" in message
    assert "(got 'abc')" in message


def test_a_bad_bool_from_the_env_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"engine\.cache\.prefix_cache \(from environment "):
        load_config(None, env={"EDGE_LLM_PREFIX_CACHE": "maybe"})


def test_a_bad_file_value_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 70000\n")
    with pytest.raises(ConfigError, match=rf"server\.port \(from file {path}\)"):
        load_config(path, env={})


def test_a_bad_flag_value_names_the_flag() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = flag_overrides(parser.parse_args(["--model", "x.gguf", "--n-threads", "0"]))
    with pytest.raises(ConfigError, match=r"engine\.n_threads \(from flag --n-threads\)"):
        load_config(None, env={}, overrides=flags)


def test_the_value_that_wins_is_the_one_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine.backpressure]\nmax_prompt_tokens = 0\n")
    with pytest.raises(ConfigError, match="from environment variable EDGE_LLM_MAX_PROMPT"):
        load_config(path, env={"EDGE_LLM_MAX_PROMPT_TOKENS": "-1"})


def test_an_unknown_key_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[engine.cache]\nnope = 1\n")
    with pytest.raises(ConfigError, match=rf"config file {path}: .*'engine\.cache\.nope'"):
        load_config(path, env={})


def test_a_bad_upstream_names_its_table_and_source(tmp_path: Path) -> None:
    path = write(tmp_path, '[upstream.lan]\nurl = "ftp://x"\n')
    with pytest.raises(ConfigError, match=rf"upstream\.lan\.url \(from file {path}\)"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=r"upstream\.b\.url \(from environment variable "):
        load_config(None, env={"EDGE_LLM_UPSTREAM": "b=ftp://q"})
