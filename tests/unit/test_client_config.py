"""Client configuration: the seed JSON verbatim, clear errors, normalisation, env."""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from edge_llm.client.address import normalise_api_key, normalise_base_url
from edge_llm.client.config import ClientConfig, load_client_config
from edge_llm.client.errors import ConfigError

SEED = json.loads(resources.files("edge_llm").joinpath("configs/client.json").read_text())


def write(tmp_path: Path, section: dict[str, Any]) -> Path:
    path = tmp_path / "client.json"
    path.write_text(json.dumps({"edge_llm_client": section}))
    return path


def test_seed_json_loads_verbatim() -> None:
    path = resources.files("edge_llm").joinpath("configs/client.json")
    config = load_client_config(str(path), env={})
    assert config.base_url == "http://127.0.0.1:8000/v1"
    assert config.api_key == "sk-local"
    assert config.model_id == "SmolLM2-135M-Instruct"  # the seed JSON names it
    assert config.stream is True
    assert (config.ttft_warn_ms, config.ttft_hard_timeout_ms) == (3000, 10000)
    assert config.chunk_interval_ms == 50
    assert (config.render_queue_high_watermark, config.render_queue_low_watermark) == (0.8, 0.3)
    assert (config.max_prompt_tokens, config.socket_send_buffer_bytes) == (512, 4096)
    assert config.retry.max_attempts == 2
    assert config.retry.backoff_ms == 500
    assert config.retry.retry_on == ("ttft_timeout", "socket_eagain")


def test_defaults_are_the_seed_values_but_the_model() -> None:
    seed = load_client_config(
        str(resources.files("edge_llm").joinpath("configs/client.json")), env={}
    )
    # No model unless one is set: the server's default answers, whatever its id.
    assert load_client_config(env={}) == seed.model_copy(update={"model_id": None})


@pytest.mark.parametrize("missing", ["base_url", "model_id"])
def test_missing_required_key_is_named(tmp_path: Path, missing: str) -> None:
    section = dict(SEED["edge_llm_client"])
    del section[missing]
    with pytest.raises(ConfigError, match=f"edge_llm_client.{missing}") as info:
        load_client_config(write(tmp_path, section), env={})
    assert info.value.field == missing


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ttft_warn_ms", "3s"),
        ("ttft_hard_timeout_ms", -1),
        ("render_queue_high_watermark", 1.5),
        ("stream", "yes"),
        ("socket_send_buffer_bytes", 4096.5),
    ],
)
def test_bad_value_is_named(tmp_path: Path, field: str, value: object) -> None:
    section = {**SEED["edge_llm_client"], field: value}
    with pytest.raises(ConfigError, match=f"edge_llm_client.{field}") as info:
        load_client_config(write(tmp_path, section), env={})
    assert info.value.field == field
    assert info.value.code == "config_error"


def test_unknown_key_and_unknown_retry_cause_are_named(tmp_path: Path) -> None:
    section = {**SEED["edge_llm_client"], "ttft_warn": 1}
    with pytest.raises(ConfigError, match=r"edge_llm_client\.ttft_warn: unknown key"):
        load_client_config(write(tmp_path, section), env={})
    section = {**SEED["edge_llm_client"], "retry": {"retry_on": ["ttft_timout"]}}
    with pytest.raises(ConfigError, match="ttft_timout") as info:
        load_client_config(write(tmp_path, section), env={})
    assert info.value.field == "retry.retry_on"


def test_watermarks_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="render_queue_low_watermark must be below"):
        load_client_config(env={}, overrides={"render_queue_low_watermark": 0.9})


def test_not_json_and_missing_top_level_key(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_client_config(path, env={})
    path.write_text(json.dumps(SEED["edge_llm_client"]))
    with pytest.raises(ConfigError, match="edge_llm_client"):
        load_client_config(path, env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load_client_config(tmp_path / "absent.json", env={})


@pytest.mark.parametrize(
    "url",
    [
        "http://h:8000",
        "http://h:8000/",
        "http://h:8000/v1",
        "http://h:8000/v1/",
        "http://h:8000/v1/v1",
        "http://h:8000/v1/v1/",
        " http://h:8000/v1 ",
    ],
)
def test_base_url_normalised(url: str) -> None:
    assert normalise_base_url(url)[0] == "http://h:8000/v1"


def test_base_url_with_other_path_is_kept() -> None:
    url, notes = normalise_base_url("https://api.example.com/openai/v1")
    assert (url, notes) == ("https://api.example.com/openai/v1", [])
    assert normalise_base_url("https://x.example/api/")[0] == "https://x.example/api"


@pytest.mark.parametrize("url", ["ftp://h/v1", "h:8000/v1", "http://h/v1?x=1"])
def test_bad_base_url_is_an_error(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        normalise_base_url(url)
    assert info.value.field == "base_url"


def test_key_whitespace_trimmed_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    section = {**SEED["edge_llm_client"], "api_key": " sk-local\n", "base_url": "http://h/v1/"}
    with caplog.at_level(logging.WARNING, logger="edge_llm.client.config"):
        config = load_client_config(write(tmp_path, section), env={})
    assert config.api_key == "sk-local"
    assert config.base_url == "http://h/v1"
    assert "api_key had leading/trailing whitespace" in caplog.text
    assert "trailing slash" in caplog.text


def test_bearer_prefix_removed() -> None:
    assert normalise_api_key("Bearer sk-1")[0] == "sk-1"
    assert ClientConfig(api_key="  sk-2 ").api_key == "sk-2"


def test_env_overrides_file_and_flags_override_env(tmp_path: Path) -> None:
    path = write(tmp_path, SEED["edge_llm_client"])
    env = {
        "EDGE_LLM_BASE_URL": "http://env:1",
        "EDGE_LLM_API_KEY": "sk-env",
        "EDGE_LLM_MODEL": "env-model",
        "OPENAI_API_KEY": "sk-openai",
    }
    config = load_client_config(path, env=env)
    assert (config.base_url, config.api_key, config.model_id) == (
        "http://env:1/v1",
        "sk-env",
        "env-model",
    )
    config = load_client_config(path, env=env, overrides={"model_id": "flag", "api_key": None})
    assert (config.model_id, config.api_key) == ("flag", "sk-env")


def test_openai_env_is_only_a_fallback(tmp_path: Path) -> None:
    env = {"OPENAI_BASE_URL": "https://api.example.com/v1", "OPENAI_API_KEY": "sk-o"}
    config = load_client_config(env=env)
    assert (config.base_url, config.api_key) == ("https://api.example.com/v1", "sk-o")
    # A value from the file wins over the fallback.
    config = load_client_config(write(tmp_path, SEED["edge_llm_client"]), env=env)
    assert (config.base_url, config.api_key) == ("http://127.0.0.1:8000/v1", "sk-local")


def test_derived_urls_and_marks() -> None:
    config = ClientConfig(base_url="https://h.example/v1", render_queue_capacity=10)
    assert config.chat_url == "https://h.example/v1/chat/completions"
    assert config.ws_url == "wss://h.example/v1/stream"
    assert (config.high_mark, config.low_mark) == (8, 3)
