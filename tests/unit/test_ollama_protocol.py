"""Ollama's requests and objects without I/O; named-model config; GGUF metadata."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from edge_llm.config.tree import ConfigError, load_config
from edge_llm.errors import InvalidRequest
from edge_llm.models.gguf import GgufError, read_metadata
from edge_llm.models.spec import named_specs
from edge_llm.protocol import ollama
from edge_llm.protocol.sampling import SamplingDefaults
from edge_llm.protocol.tools import ToolCall

DEFAULTS = SamplingDefaults(temperature=0.2, top_p=0.9)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, "default"), (0, 0.0), (-1, None), ("-1", None), ("5m", 300.0), ("1h30m", 5400.0),
     ("300ms", 0.3), ("10", 10.0), (2.5, 2.5), ("-1m", None)],
)  # fmt: skip
def test_keep_alive_reads_numbers_and_go_durations(value: object, seconds: object) -> None:
    assert ollama.keep_alive_s(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["soon", "5 m", "m", "1x"])
def test_a_bad_keep_alive_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest, match="keep_alive"):
        ollama.keep_alive_s(value)


def test_options_map_onto_sampling_and_limits() -> None:
    got = ollama.options(
        {"temperature": 0, "top_p": 0.5, "top_k": 40, "seed": 7, "stop": "\n", "num_predict": 9,
         "num_ctx": 64, "num_gpu": 99, "repeat_penalty": 1.2, "presence_penalty": 0.5},
        DEFAULTS, 4096,
    )  # fmt: skip
    s = got.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed, s.stop) == (0.0, 0.5, 40, 7, ("\n",))
    assert s.presence_penalty == 0.5
    assert s.repetition_penalty == 1.2
    assert (got.max_tokens, got.num_ctx) == (9, 64)
    empty = ollama.options(None, DEFAULTS, 4096)
    assert (empty.sampling.temperature, empty.sampling.top_p, empty.max_tokens) == (0.2, 0.9, None)
    assert ollama.options({"num_predict": -2}, DEFAULTS, 4096).max_tokens == 4096
    assert ollama.ignored_options({"num_gpu": 1, "temperature": 1}) == ["num_gpu"]


@pytest.mark.parametrize(
    ("given", "field"),
    [({"temperature": "hot"}, "temperature"), ({"temperature": 3}, "temperature"),
     ({"top_k": 1.5}, "top_k"), ({"num_predict": 0}, "num_predict"),
     ({"mirostat": 2}, "mirostat"), ({"typical_p": 0.5}, "typical_p"),
     ({"stop": [1]}, "stop"), ({"seed": True}, "seed"), ({"num_ctx": 1}, "num_ctx")],
)  # fmt: skip
def test_bad_or_unsupported_options_name_the_option(given: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        ollama.options(given, DEFAULTS, 4096)
    assert refused.value.param == f"options.{field}"


def test_tool_history_becomes_the_chat_completions_shape() -> None:
    req = ollama.parse(ollama.ChatRequest, {
        "model": "m", "unknown_field": 1,
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
    })  # fmt: skip
    turns = req.template_messages()
    call = turns[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert turns[2] == {"role": "tool", "content": "sunny", "name": "get_weather"}
    setup = req.tool_setup()
    assert setup is not None
    assert [tool.name for tool in setup.tools] == ["get_weather"]


@pytest.mark.parametrize(
    ("extra", "words"),
    [({"messages": [{"role": "user", "images": ["aGk="]}]}, "vision"),
     ({"think": True}, "thinking"), ({"logprobs": True}, "logprobs"),
     ({"format": "xml"}, "format")],
)  # fmt: skip
def test_what_this_engine_does_not_do_is_refused(extra: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        ollama.parse(ollama.ChatRequest, {"model": "m", "messages": [], **extra})


def test_the_final_object_carries_calls_with_object_arguments() -> None:
    timings = ollama.Timings(2.0, 0.5, 10, 0.25, 4, 1.25)
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    body = ollama.final("m", chat=True, text="", done_reason="stop", timings=timings,
                        calls=[call])  # fmt: skip
    assert body["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert body["total_duration"] == 2_000_000_000
    assert body["eval_count"] == 4
    assert body["created_at"].endswith("000Z")


def test_named_models_from_flags_tables_and_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "engine.toml"
    toml.write_text('[models.small]\npath = "/m/small.gguf"\ntemperature = 0.1\n'
                    "keep_alive_ms = 60000\nmax_kv_cache_mb = 16\n")  # fmt: skip
    config = load_config(
        toml, env={"EDGE_LLM_MODELS": "other=/m/other.gguf"}, overrides={"model": ["/m/d.gguf"]}
    )
    assert config.model.model_path == "/m/d.gguf"
    specs = {s.name: s for s in named_specs(config)}
    assert specs["small"].sampling == {"temperature": 0.1}
    assert specs["small"].keep_alive_s == 60.0
    assert specs["small"].kv_budget_bytes == 16 * 1024 * 1024
    assert specs["other"].keep_alive_s is None  # keep_alive_ms -1: stays loaded
    with pytest.raises(ConfigError, match=r"models\.small\.nope"):
        toml.write_text('[models.small]\npath = "x"\nnope = 1\n')
        load_config(toml, env={})
    with pytest.raises(ConfigError, match="NAME=PATH"):
        load_config(None, env={}, overrides={"model": ["x="]})


def _gguf(path: Path, items: list[tuple[str, int, bytes]]) -> None:
    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    body = b"".join(text(k) + struct.pack("<I", kind) + value for k, kind, value in items)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(items)) + body)


def test_gguf_metadata_is_read_with_arrays_skipped(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    words = struct.pack("<IQ", 8, 2) + b"".join(
        struct.pack("<Q", len(w)) + w for w in (b"a", b"bc")
    )
    arch = struct.pack("<Q", 5) + b"llama"
    _gguf(path, [("general.architecture", 8, arch), ("tokenizer.ggml.tokens", 9, words),
                 ("llama.context_length", 4, struct.pack("<I", 8192)),
                 ("general.file_type", 4, struct.pack("<I", 3))])  # fmt: skip
    assert read_metadata(path) == {
        "general.architecture": "llama",
        "llama.context_length": 8192,
        "general.file_type": 3,
    }
    path.write_bytes(b"GGUF" + b"\x03")
    with pytest.raises(GgufError):
        read_metadata(path)
