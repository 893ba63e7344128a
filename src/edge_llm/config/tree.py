"""Engine configuration: one tree, loaded from TOML, environment and CLI flags.

Longer than the other modules because every key is here with its description,
from which the flags, the environment variables and docs/configuration.md are made.

Precedence, lowest first: field defaults (the seed's values), the TOML file,
``EDGE_LLM_<KEY>`` environment variables, command-line flags. Every key name is
unique across sections, so each has one flag (``--max-kv-cache-mb``) and one
environment variable (``EDGE_LLM_MAX_KV_CACHE_MB``).
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo

from edge_llm.config.models import ModelEntryConfig, check_model_name, parse_model_flag
from edge_llm.config.priority import MAX_PRIORITY, MIN_PRIORITY, PRIORITY_ROUTES, priority_map
from edge_llm.config.upstream import UpstreamConfig, check_name, parse_upstream_flag

ENV_PREFIX = "EDGE_LLM_"
# The contract's serve flag --model names a GGUF path, or NAME=PATH (docs/design.md §3):
# it is its own repeatable flag (_MODELS), so model_path has only --model-path.
_FLAG_ALIASES: dict[str, tuple[str, ...]] = {}
# A field's default as the reference states it, where the value itself depends on the
# machine or is None (read by edge_llm.config.reference).
DOC_DEFAULT = "doc_default"


class ConfigError(ValueError):
    """A configuration value is unknown or invalid; the message names the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class BackpressureConfig(_Section):
    max_kv_cache_mb: int = Field(
        256,
        ge=1,
        description="Memory for every KV tier together (MiB): the KV context of all sequences "
        "(allocated once at start: the cap less the other tiers' share, at most a quarter), "
        "the host cache, offloaded streams and the embeddings context, of every loaded model "
        "(several models share it: each gets an equal part unless [models.NAME] sets its own)",
    )
    max_prompt_tokens: int = Field(
        512,
        ge=1,
        description="Longer prompts get 400 prompt_too_long with both counts; nothing is "
        "truncated. Raise it (and max_kv_cache_mb) for long prompts, up to the model's context",
    )
    pause_on_socket_full: bool = Field(
        True,
        description="Pause a sequence whose outbound ring is full (false: it keeps generating "
        "and its ring holds up to max_tokens tokens)",
    )
    resume_threshold: float = Field(
        0.3,
        gt=0.0,
        lt=1.0,
        description="Resume a paused sequence when its ring drains to this fraction",
    )
    cancel_release_kv: bool = Field(
        True,
        description="Free a cancelled stream's own KV cells at once (disconnect, timeout); its "
        "prompt prefix stays as evictable cache (false: all its cells stay as cache)",
    )
    ttft_timeout_ms: int = Field(
        10000,
        ge=0,
        description="No first token by then: cancel, free KV, ttft_timeout (0 disables)",
    )
    max_pause_ms: int = Field(
        60000,
        ge=0,
        description="A stream paused longer (either cause) is cancelled, its KV freed (0: never)",
    )
    outbound_buffer_tokens: int = Field(
        32, ge=2, le=65536, description="Capacity of each stream's outbound ring (tokens)"
    )


class StreamConfig(_Section):
    chunk_size_tokens: int = Field(1, ge=1, le=1024, description="Tokens per emitted chunk")
    flush_interval_ms: int = Field(
        20, ge=0, description="Longest time a partial chunk is held (ms)"
    )
    heartbeat_interval_ms: int = Field(
        1000,
        ge=10,
        description="Heartbeat period while no token flows: queued, prefill, paused (ms)",
    )
    resume_grace_ms: int = Field(
        30000,
        ge=0,
        description="A resumable stream whose connection drops waits this long to be resumed "
        "(paused, cause disconnected, KV kept), then is cancelled (resume_timeout); 0 turns "
        "resuming off",
    )
    max_detached_streams: int = Field(
        16,
        ge=0,
        description="Most resumable streams waiting detached at once (each keeps its KV); "
        "a drop beyond it cancels the stream as without resuming",
    )
    resume_buffer_events: int = Field(
        512,
        ge=1,
        le=65536,
        description="Events of a resumable stream kept for replay after a drop (at most 1 MiB); "
        "a resume from further back gets 409 resume_gap",
    )
    background_retention_ms: int = Field(
        600000,
        ge=0,
        description="A background response (Responses API, background: true) can be read, "
        "streamed again and cancelled for this long after it ended; then 404",
    )
    max_background_responses: int = Field(
        32,
        ge=1,
        le=4096,
        description="Background responses kept at once, running or ended (each keeps up to "
        "2 MiB of events); the oldest ended one is forgotten first, and with every one "
        "running a new one gets 503 queue_full",
    )
    background_ttft_timeout_ms: int = Field(
        0,
        ge=0,
        description="A background response's own TTFT time-out, in place of ttft_timeout_ms: "
        "in the lowest class it waits its turn behind foreground work this long for its "
        "first token, then ttft_timeout (0: as long as it takes; cancel ends it)",
    )


class SchedulerConfig(_Section):
    max_sequences: int = Field(
        4,
        ge=1,
        le=256,
        description="Sequences decoding at once, paused ones included (llama n_seq_max); "
        "with kv_unified = false each gets max_kv_cache_mb / max_sequences",
    )
    prefill_chunk_tokens: int = Field(
        512,
        ge=8,
        le=4096,
        description="Most prompt tokens prefilled in one step: a lone prompt prefills in "
        "batches this large",
    )
    itl_target_ms: int = Field(
        100,
        ge=0,
        description="While streams decode or other prompts wait, a step prefills only as many "
        "prompt tokens as keep it near this long (a step may take twice a decode step; a "
        "chunk decoded apart gets the tokens that cost as much as its call); a prompt "
        "waiting half its ttft_timeout_ms gets whole batches (0: always prefill_chunk_tokens)",
    )
    kv_unified: bool = Field(
        False,
        description="One KV pool shared by all sequences (one may use all of it, prefixes "
        "shared in place); false: each slot its own share, and attention scans only its own "
        "cells (what deterministic needs)",
    )
    max_queue: int = Field(
        16, ge=0, description="Requests waiting for a slot or KV; beyond: 503 queue_full"
    )
    default_max_tokens: int = Field(512, ge=1, description="max_tokens when a request gives none")
    max_tokens_cap: int = Field(
        4096, ge=1, description="Largest max_tokens granted (larger requests are clamped)"
    )
    default_temperature: float = Field(
        0.2,
        ge=0.0,
        le=2.0,
        description="temperature when a request gives none and the model's GGUF recommends "
        "none (general.sampling.temp); SmolLM2's recommended value",
    )
    default_top_p: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="top_p when a request gives none and the GGUF recommends none",
    )
    deadline_admission: bool = Field(
        False,
        description="Predict a new request's TTFT from the prompts ahead of it and answer 503 "
        "queue_full with Retry-After at once when it would miss ttft_timeout_ms",
    )
    deterministic: bool = Field(
        False,
        description="A request's greedy text (or seeded sample) is a function of the request "
        "alone: not of the cache tiers, drafts, other streams, pauses, offloads or the thread "
        "count (llama.cpp's invariant kernels, scripts/patches/: a repacked weight type's "
        "rows are computed as lone rows, so a model of Q4_0 weights prefills slower); needs "
        "kv_unified = false",
    )
    max_preemptions: int = Field(
        3,
        ge=0,
        description="Times one stream may be paused and offloaded for a more urgent "
        "request (0: never preempt)",
    )
    supersede_sessions: bool = Field(
        True,
        description="A new request with a session's X-Session-Id or user cancels its running "
        "one (superseded); false: they run side by side",
    )

    @model_validator(mode="after")
    def _deterministic_needs_slots(self) -> SchedulerConfig:
        if self.deterministic and self.kv_unified:
            raise ValueError("deterministic = true needs kv_unified = false (per-slot KV)")
        return self


class CacheConfig(_Section):
    kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(
        "f16",
        description="How KV cells are stored: f16, or quantized (q8_0 about half the bytes, "
        "q4_0 about a quarter: more tokens in the same max_kv_cache_mb)",
    )
    prefix_cache: bool = Field(
        True,
        description="Reuse KV of prompt prefixes already computed: a regenerate, a shared "
        "system prompt, earlier turns",
    )
    cache_dir: str | None = Field(
        None,
        description="A directory for the prefix cache's disk tier: host-tier entries are "
        "written there too and read back at start, so a restarted device answers a known "
        "prompt without prefilling it (checksummed; a corrupt or foreign file is skipped)",
    )
    cache_dir_mb: int = Field(
        1024, ge=1, description="Most the disk tier keeps (MiB; oldest entries out first)"
    )
    host_cache_mb: int = Field(
        256,
        ge=0,
        description="Host memory for the prefix cache's entries that left their slot "
        "(per-slot layout; MiB; 0: none): a cap inside max_kv_cache_mb, not an addition; "
        "it gives its room back first",
    )
    host_offload_mb: int = Field(
        512,
        ge=0,
        description="Host memory for the KV of offloaded paused streams (MiB): a cap inside "
        "max_kv_cache_mb, not an addition; when full the oldest offloaded stream is "
        "cancelled (pause_timeout); 0: no offload",
    )
    offload_paused_after_ms: int = Field(
        1000,
        ge=0,
        description="A stream paused this long while others wait for KV is saved to host "
        "memory and its cells freed",
    )


class SpeculativeConfig(_Section):
    speculative: Literal["prompt_lookup", "off"] = Field(
        "prompt_lookup",
        description="prompt_lookup: draft tokens from n-gram matches in the sequence's own "
        "prompt and output, verified in the same decode step; off: none",
    )
    max_draft_tokens: int = Field(
        8,
        ge=1,
        le=32,
        description="Most draft tokens verified per sequence and step (the draft length adapts "
        "below it; 32 pays on copy-heavy work)",
    )


class ModelConfig(_Section):
    model_path: str | None = Field(
        None,
        description="GGUF file of the default model (also --model PATH); any llama.cpp "
        "model (one without a chat template, a base model, serves completions only)",
        json_schema_extra={DOC_DEFAULT: "the embedded SmolLM2-135M-Instruct"},
    )
    model_id: str | None = Field(
        None,
        description="Model id served by /v1/models; a request may name it or leave model out",
        json_schema_extra={DOC_DEFAULT: "the file name up to its first dot"},
    )
    models_dir: str | None = Field(
        None,
        description="The store of pulled models (edge-llm pull, Ollama's /api/pull): "
        "--model and a request's model name them",
        json_schema_extra={DOC_DEFAULT: "$XDG_CACHE_HOME/edge-llm/models (~/.cache/...)"},
    )
    pull: Literal["never", "missing"] = Field(
        "never",
        description="missing: a Hub model not pulled yet is pulled when --model or [models.NAME] "
        "path names it (at start) or a request's model does (the request waits for it); "
        "never: the start stops naming the edge-llm pull command, a request gets 404",
    )
    n_threads: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        description="llama.cpp threads for decode and prefill",
        json_schema_extra={DOC_DEFAULT: "the CPU count"},
    )
    adaptive_threads: bool = Field(
        True,
        description="Decode on fewer threads while other processes keep the cores busy "
        "(counted from the run queue before the first step after idle, then measured from "
        "the threads' run-queue delay; Linux); with deterministic the text does not change",
    )
    verbose: bool = Field(False, description="Let llama.cpp log to stderr (silenced otherwise)")
    min_available_mb: int = Field(
        0,
        ge=0,
        description="Device memory floor (cgroup room or MemAvailable): under it the engine "
        "refuses requests (503 memory_pressure), drops its host cache and cancels paused "
        "streams (0: not watched)",
    )
    max_model_memory_mb: int = Field(
        0,
        ge=0,
        description="Memory for all loaded models together (weights, KV budget and a reserve "
        "each, MiB): loading one more first unloads the least recently used idle model, else "
        "503 model_memory (0: no limit)",
    )
    keep_alive_ms: int = Field(
        -1,
        ge=-1,
        description="Unload a model idle this long (-1: keep it loaded; 0: as soon as idle); "
        "[models.NAME] and Ollama's keep_alive set it per model",
    )
    max_embedding_inputs: int = Field(
        64, ge=1, le=2048, description="Most inputs in one embeddings request (more: 400)"
    )
    max_embedding_tokens: int = Field(
        512, ge=8, le=32768, description="Most tokens in one embeddings input (more: 400)"
    )
    embedding_threads: int = Field(
        1,
        ge=1,
        description="llama.cpp threads of each model's embeddings context (its own thread "
        "beside the decode thread)",
    )


class ServerConfig(_Section):
    host: str = Field(
        "127.0.0.1",
        description="Bind address; a non-loopback address without an API key logs a warning",
    )
    port: int = Field(8000, ge=0, le=65535, description="Bind port (0: any free port, printed)")
    api_key: list[str] = Field(
        default_factory=list, description="Require one of these keys (repeatable)"
    )
    event_log: str | None = Field(None, description="Engine JSONL event log file")
    log_prompts: bool = Field(False, description="Include prompt text in the event log")
    socket_send_buffer_bytes: int = Field(
        4096, ge=0, description="SO_SNDBUF of accepted sockets (0: kernel default)"
    )
    write_buffer_bytes: int = Field(
        4096, ge=0, description="Userspace bytes queued per connection before its stream stalls"
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Larger bodies get 413")
    max_messages: int = Field(256, ge=1, description="Most messages in one request (more: 400)")
    max_ws_frame_bytes: int = Field(
        1 << 20, ge=1024, description="Larger WebSocket frames close the socket (1009)"
    )
    max_connections: int = Field(
        512, ge=1, description="Concurrent connections; beyond: 503 too_many_connections"
    )
    body_timeout_ms: int = Field(
        10000,
        ge=100,
        description="Time allowed for a request head or body, and idle time between requests; "
        "a WebSocket silent this long between streams is pinged and closed (1008) if "
        "nothing comes back within as long",
    )
    drain_grace_ms: int = Field(
        5000,
        ge=0,
        description="On SIGTERM, time running streams get before cancelled/shutdown",
    )
    cors_allow_origin: list[str] = Field(
        default_factory=list, description="Browser origins allowed by CORS (default: none)"
    )
    protect_debug: bool = Field(
        True, description="With an API key set, /metrics and /debug/streams need it too"
    )
    playground: bool = Field(
        True, description="Serve the playground page at / (--no-playground: 404)"
    )
    access_log: bool = Field(
        True, description="One line per request on the edge_llm.access logger, when it ends"
    )
    upstream_health_interval_ms: int = Field(
        5000,
        ge=100,
        description="Period of each upstream's health check (GET /v1/models, which also "
        "learns its model ids)",
    )
    upstream_connect_timeout_ms: int = Field(
        3000,
        ge=10,
        description="Time allowed to open a TCP connection to an upstream (then the next is tried)",
    )
    upstream_receive_buffer_bytes: int = Field(
        16384,
        ge=0,
        description="SO_RCVBUF of upstream connections: what a paused stream lets the "
        "upstream send before TCP stops it (0: kernel default, autotuned to MBs)",
    )
    route_priority: list[str] = Field(
        default_factory=list,
        examples=[["/v1/completions=5"]],
        description="Default priority per route, PATH=N (repeatable; lower runs first, "
        f"{MIN_PRIORITY}..{MAX_PRIORITY}; a request's field or X-Priority header wins)",
    )
    key_priority: list[str] = Field(
        default_factory=list,
        examples=[["sk-batch=5"]],
        description="Default priority per API key, KEY=N (repeatable; with api_key set, "
        "KEY one of them; wins over route_priority)",
    )

    @field_validator(
        "api_key", "cors_allow_origin", "route_priority", "key_priority", mode="before"
    )
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("route_priority")
    @classmethod
    def _known_routes(cls, entries: list[str]) -> list[str]:
        for path in priority_map(entries, "PATH"):
            if path not in PRIORITY_ROUTES:
                raise ValueError(
                    f"{path!r} is not a route that generates ({', '.join(PRIORITY_ROUTES)})"
                )
        return entries

    @model_validator(mode="after")
    def _keys_are_accepted(self) -> ServerConfig:
        """With keys required, a default for a key that is refused is a mistake; without,
        a presented key is unchecked and its default worth what a body field is."""
        for key in priority_map(self.key_priority, "KEY"):
            if self.api_key and key not in self.api_key:
                raise ValueError(f"key {key!r} is not one of api_key")
        return self

    def route_priorities(self) -> dict[str, int]:
        return priority_map(self.route_priority, "PATH")

    def key_priorities(self) -> dict[str, int]:
        return priority_map(self.key_priority, "KEY")


class EngineConfig(_Section):
    """The ``[engine]`` table and its sub-tables, plus ``[server]``."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    backpressure: BackpressureConfig = Field(default_factory=BackpressureConfig)
    stream: StreamConfig = Field(default_factory=StreamConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    # [upstream.NAME] tables and --upstream NAME=URL (see edge_llm.upstream).
    upstream: dict[str, UpstreamConfig] = Field(default_factory=dict)
    # [models.NAME] tables and --model NAME=PATH (see edge_llm.models).
    models: dict[str, ModelEntryConfig] = Field(default_factory=dict)


_SECTIONS: dict[str, type[_Section]] = {
    "model": ModelConfig,
    "backpressure": BackpressureConfig,
    "stream": StreamConfig,
    "scheduler": SchedulerConfig,
    "cache": CacheConfig,
    "speculative": SpeculativeConfig,
    "server": ServerConfig,
}


def sections() -> dict[str, type[BaseModel]]:
    """Each section's model by name (``backpressure``, ``server``, ...), in file order."""
    return dict(_SECTIONS)


def toml_table(section: str) -> str:
    """The TOML table that holds a section's keys: model keys sit directly in ``[engine]``."""
    if section == "model":
        return "engine"
    return section if section == "server" else f"engine.{section}"


def _keys() -> Iterator[tuple[str, str]]:
    """(section, key) for every leaf key."""
    for section, model in _SECTIONS.items():
        for key in model.model_fields:
            yield section, key


def _section_of(key: str) -> str:
    for section, name in _keys():
        if name == key:
            return section
    raise ConfigError(f"unknown configuration key {key!r}")


def toml_path(key: str) -> str:
    """Where ``key`` sits in the TOML file: ``engine.backpressure.max_kv_cache_mb``,
    ``engine.model_path`` (model keys sit in ``[engine]``), ``server.port``."""
    section = _section_of(key)
    if section == "model":
        return f"engine.{key}"
    return f"{section}.{key}" if section == "server" else f"engine.{section}.{key}"


def flags_of(key: str) -> list[str]:
    return ["--" + key.replace("_", "-"), *_FLAG_ALIASES.get(key, ())]


def env_of(key: str) -> str:
    return ENV_PREFIX + key.upper()


def where_to_set(key: str) -> str:
    """Every way to set ``key``, for messages that tell a user which knob to turn."""
    table, _, name = toml_path(key).rpartition(".")
    return f"flag {flags_of(key)[0]}, env {env_of(key)}, or {name} in [{table}] of the TOML"


def _toml_to_tree(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Map the TOML layout onto sections, naming any unknown key in full."""
    tree: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    tree[_UPSTREAM] = {}
    tree[_MODELS] = {}
    for top, value in data.items():
        if top == _UPSTREAM and isinstance(value, dict):
            _merge_named(_UPSTREAM, value, tree[_UPSTREAM], UpstreamConfig)
        elif top == _MODELS and isinstance(value, dict):
            _merge_named(_MODELS, value, tree[_MODELS], ModelEntryConfig)
        elif top == "server" and isinstance(value, dict):
            _merge_table("server", value, tree, "server")
        elif top == "engine" and isinstance(value, dict):
            _merge_engine(value, tree)
        else:
            raise ConfigError(f"unknown configuration table or key {top!r}")
    return tree


_UPSTREAM = "upstream"
_MODELS = "models"
# The flag and environment variable of named models (EDGE_LLM_MODEL is the chat client's).
_MODEL_FLAG = "model"
_MODELS_ENV = ENV_PREFIX + "MODELS"


def _merge_named(
    kind: str, tables: Mapping[str, Any], into: dict[str, Any], model: type[BaseModel]
) -> None:
    """``[kind.NAME]`` tables (``upstream``, ``models``): each a table of ``model``'s
    keys under a valid name."""
    check, required = (check_name, "url") if kind == _UPSTREAM else (check_model_name, "path")
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{kind}.{name} must be a table with at least '{required}'")
        try:
            check(name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        unknown = set(table) - set(model.model_fields)
        if unknown:
            raise ConfigError(f"unknown configuration key '{kind}.{name}.{sorted(unknown)[0]}'")
        into[name] = dict(table)


def _add_model_flags(
    values: list[str], tree: dict[str, dict[str, Any]], sources: dict[str, str], source: str
) -> None:
    """``NAME=PATH`` items: a named model (or a new path for one the file names);
    a bare ``PATH``: the default model (``model_path``)."""
    for text in values:
        try:
            name, path = parse_model_flag(text)
        except ValueError as exc:
            raise ConfigError(f"{exc} (from {source})") from exc
        if name is None:
            tree["model"]["model_path"] = path
            sources["model_path"] = source
        else:
            tree[_MODELS][name] = {**tree[_MODELS].get(name, {}), "path": path}
            sources[f"{_MODELS}.{name}"] = source


def _add_upstream_flags(
    values: list[str], upstreams: dict[str, Any], sources: dict[str, str], source: str
) -> None:
    """``NAME=URL`` items: a new upstream, or a new url for one the file names."""
    for text in values:
        try:
            name, url = parse_upstream_flag(text)
        except ValueError as exc:
            raise ConfigError(f"{exc} (from {source})") from exc
        upstreams[name] = {**upstreams.get(name, {}), "url": url}
        sources[f"{_UPSTREAM}.{name}"] = source


def _merge_engine(engine: Mapping[str, Any], tree: dict[str, dict[str, Any]]) -> None:
    for name, value in engine.items():
        if name in _SECTIONS and name not in ("model", "server"):
            if not isinstance(value, dict):
                raise ConfigError(f"engine.{name} must be a table")
            _merge_table(name, value, tree, f"engine.{name}")
        elif name in ModelConfig.model_fields:
            tree["model"][name] = value
        else:
            raise ConfigError(f"unknown configuration key 'engine.{name}'")


def _merge_table(
    section: str, table: Mapping[str, Any], tree: dict[str, dict[str, Any]], path: str
) -> None:
    fields = _SECTIONS[section].model_fields
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"unknown configuration key '{path}.{key}'")
        tree[section][key] = value


def _build(tree: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str]) -> EngineConfig:
    sections: dict[str, Any] = {
        name: _validated(_SECTIONS[name], tree[name], name, sources) for name in _SECTIONS
    }
    sections[_UPSTREAM] = {
        name: _validated(UpstreamConfig, values, f"{_UPSTREAM}.{name}", sources)
        for name, values in tree[_UPSTREAM].items()
    }
    sections[_MODELS] = {
        name: _validated(ModelEntryConfig, values, f"{_MODELS}.{name}", sources)
        for name, values in tree[_MODELS].items()
    }
    return EngineConfig.model_validate(sections)


def _validated(
    model: type[BaseModel], values: Mapping[str, Any], where: str, sources: Mapping[str, str]
) -> Any:
    try:
        return model(**values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, where, sources)) from exc


def _describe(exc: ValidationError, where: str, sources: Mapping[str, str]) -> str:
    """Each error with its key's TOML path and where its value came from."""
    parts = []
    for error in exc.errors():
        key = str(error["loc"][0]) if error["loc"] else ""
        upstream = where.startswith((f"{_UPSTREAM}.", f"{_MODELS}."))
        path = f"{where}.{key}" if upstream or not key else toml_path(key)
        source = sources.get(where if upstream else key, "the defaults")
        if not key and not upstream:  # a rule across keys: name those that were set
            given = [k for k in error.get("input") or {} if k in sources]
            path = ", ".join(toml_path(k) for k in given) or f"engine.{where}"
            source = ", ".join(sources[k] for k in given) or source
        message = error["msg"].removeprefix("Value error, ")
        got = repr(error.get("input"))
        parts.append(
            f"{path} (from {source}): {message}" + ("" if got in message else f" (got {got})")
        )
    return "invalid configuration: " + "; ".join(parts)


def load_toml(path: str | Path) -> dict[str, dict[str, Any]]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    try:
        return _toml_to_tree(data)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc


def _env_overrides(env: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    known = {key for _, key in _keys()}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key in known:
            yield _section_of(key), key, value


def _coerce_text(section: str, key: str, text: str) -> object:
    """Turn an environment string into the field's type; lists split on commas."""
    annotation = _SECTIONS[section].model_fields[key].annotation
    if get_origin(annotation) is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    if annotation is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        source = f"environment variable {env_of(key)}"
        raise ConfigError(f"{toml_path(key)} (from {source}): expected true or false, got {text!r}")
    return text


def load_config(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> EngineConfig:
    """Build the configuration.

    ``overrides`` maps key names (``max_kv_cache_mb``) to values already typed,
    as the CLI produces them. Raises :class:`ConfigError` naming the bad key.
    """
    tree: dict[str, dict[str, Any]] = {name: {} for name in [*_SECTIONS, _UPSTREAM, _MODELS]}
    sources: dict[str, str] = {}  # key (or upstream.NAME) -> where its value came from
    if path is not None:
        tree = load_toml(path)
        sources.update(_file_sources(tree, f"file {path}"))
    environment = os.environ if env is None else env
    for section, key, text in _env_overrides(environment):
        tree[section][key] = _coerce_text(section, key, text)
        sources[key] = f"environment variable {env_of(key)}"
    env_upstreams = [t.strip() for t in environment.get(env_of(_UPSTREAM), "").split(",")]
    env_source = f"environment variable {env_of(_UPSTREAM)}"
    _add_upstream_flags([t for t in env_upstreams if t], tree[_UPSTREAM], sources, env_source)
    env_models = [t.strip() for t in environment.get(_MODELS_ENV, "").split(",")]
    env_source = f"environment variable {_MODELS_ENV}"
    _add_model_flags([t for t in env_models if t], tree, sources, env_source)
    for key, value in (overrides or {}).items():
        if key == _UPSTREAM:
            given = list(value) if isinstance(value, list) else []
            _add_upstream_flags(given, tree[_UPSTREAM], sources, "flag --upstream")
        elif key == _MODEL_FLAG:
            given = list(value) if isinstance(value, list) else []
            _add_model_flags(given, tree, sources, "flag --model")
        else:
            tree[_section_of(key)][key] = value
            sources[key] = "flag " + " / ".join(flags_of(key))
    return _build(tree, sources)


def _file_sources(tree: Mapping[str, Mapping[str, Any]], source: str) -> dict[str, str]:
    named = (_UPSTREAM, _MODELS)
    sources = {key: source for name, values in tree.items() if name not in named for key in values}
    for table in named:
        sources.update({f"{table}.{name}": source for name in tree[table]})
    return sources


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one ``--flag`` per configuration key; unset flags stay ``None``."""
    for section, key in _keys():
        field = _SECTIONS[section].model_fields[key]
        flags = flags_of(key)
        help_text = f"{_with_default(field)} [{env_of(key)}]"
        if field.annotation is bool:
            parser.add_argument(
                *flags, dest=key, action=argparse.BooleanOptionalAction, help=help_text
            )
        elif get_origin(field.annotation) is list:
            parser.add_argument(*flags, dest=key, action="append", help=help_text)
        else:
            parser.add_argument(*flags, dest=key, type=_flag_type(field.annotation), help=help_text)
    parser.add_argument(
        "--upstream",
        dest=_UPSTREAM,
        action="append",
        metavar="NAME=URL",
        help="An OpenAI-compatible engine behind this one (repeatable; more keys in "
        f"[upstream.NAME] tables) [{ENV_PREFIX}UPSTREAM, comma-separated]",
    )
    parser.add_argument(
        "--model",
        dest=_MODEL_FLAG,
        action="append",
        metavar="[NAME=]PATH",
        help="A GGUF model: NAME=PATH serves it as NAME beside the default model "
        "(repeatable; more keys in [models.NAME] tables); a bare PATH is the default "
        "model (model_path) "
        f"[{_MODELS_ENV}, comma-separated]",
    )


def _with_default(field: FieldInfo) -> str:
    """The description and, unless it already says it, `` (default: X)``: flags stay
    None when not given (so they override nothing), so argparse cannot show it."""
    text = field.description or ""
    if "(default" in text:
        return text
    shown = documented_default(field)
    if shown is None:
        shown = show_default(field.get_default(call_default_factory=True))
    return f"{text} (default: {shown})".replace("%", "%%")


def documented_default(field: FieldInfo) -> str | None:
    """The default as help and docs state it where the value would mislead (None for
    "the embedded model", this machine's CPU count); None when the value says it."""
    extra = field.json_schema_extra
    return str(extra[DOC_DEFAULT]) if isinstance(extra, dict) and DOC_DEFAULT in extra else None


def show_default(value: object, metavar: object = None) -> str:
    """How help texts show a default (every command's, not only serve's): ``300.0``
    as ``300``, ``(128, 1024)`` as ``128-1024`` for a LOW-HIGH option, ``(1,)`` as
    ``1``; booleans, None and lists as the TOML config reads."""
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        separator = "-" if metavar == "LOW-HIGH" else ","
        return separator.join(show_default(item) for item in value) or "none"
    return str(value)


def _flag_type(annotation: object) -> type:
    for candidate in (int, float):
        if annotation is candidate or candidate in get_args(annotation):
            return candidate
    return str


def flag_overrides(namespace: argparse.Namespace) -> dict[str, object]:
    """The configuration keys that were given on the command line."""
    keys = [key for _, key in _keys()] + [_UPSTREAM, _MODEL_FLAG]
    return {
        key: getattr(namespace, key) for key in keys if getattr(namespace, key, None) is not None
    }
