"""``edge-llm serve``: run the engine daemon until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys

from edge_llm.cli.port_holder import port_holder
from edge_llm.cli.pull import ProgressLine
from edge_llm.config.tree import (
    ConfigError,
    EngineConfig,
    add_config_flags,
    flag_overrides,
    load_config,
)
from edge_llm.engine import KvBook, ledger_summary, unmap_large_blocks_when_freed
from edge_llm.errors import BackendError
from edge_llm.models.catalog import Catalog, NotPulled
from edge_llm.models.download import NotEnoughDisk
from edge_llm.models.hub import RemoteError
from edge_llm.models.sizing import ModelShape, kv_mb_for
from edge_llm.observability.otel.settings import OtelConfigError
from edge_llm.observability.units import mib
from edge_llm.server.runtime import ListenError, start_server


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run the engine (OpenAI-compatible HTTP + WebSocket)",
        description="Run the engine. Every key of the TOML config is also a flag and an "
        "EDGE_LLM_<KEY> environment variable; flags win over the environment, which wins "
        "over the file.",
    )
    parser.add_argument("--config", help="engine TOML file (docs/configuration.md)")
    add_config_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the Hub client's every request
    try:
        config = load_config(args.config, overrides=flag_overrides(args))
    except ConfigError as exc:
        print(f"edge-llm serve: {exc}", file=sys.stderr)
        return 2
    unmap_large_blocks_when_freed()  # before the first saved state: RSS follows the ledger
    try:
        asyncio.run(_serve(config))
    except NotPulled as exc:
        print(f"edge-llm serve: {exc}", file=sys.stderr)
        return 2
    except (RemoteError, NotEnoughDisk) as exc:
        print(f"edge-llm serve: pulling a model failed: {exc}", file=sys.stderr)
        return 1
    except ListenError as exc:
        print(f"edge-llm serve: {listen_problem(exc)}", file=sys.stderr)
        return 2
    except OtelConfigError as exc:
        print(f"edge-llm serve: {exc}", file=sys.stderr)
        return 2
    except BackendError as exc:
        print(f"edge-llm serve: {exc}", file=sys.stderr)
        return 1
    return 0


def listen_problem(exc: ListenError) -> str:
    """One line: what is wrong with the address, who holds the port, which flag to change."""
    if exc.errno != errno.EADDRINUSE:
        return f"{exc}; check --host and --port"
    holder = port_holder(exc.port)
    by = f" by {holder}" if holder else ""
    other = exc.port + 1 if exc.port < 65535 else exc.port - 1
    return (
        f"port {exc.port} on {exc.host} is already in use{by}; stop it or choose another "
        f'port with --port (make run ARGS="--port {other}")'
    )


def prompt_limit_warning(
    config: EngineConfig, kv: KvBook, shape: ModelShape | None = None
) -> str | None:
    """A warning when ``max_prompt_tokens`` promises prompts that one sequence's share
    of the KV cache cannot hold (they would be refused below the configured limit),
    with the ``max_kv_cache_mb`` that would hold them when the model's ``shape`` is
    known."""
    limit = config.backpressure.max_prompt_tokens
    share = kv.sequence_tokens
    if limit < share:
        return None
    layout = "one slot's share" if kv.per_slot else "the whole KV cache"
    raise_kv = "raise max_kv_cache_mb"
    if shape is not None:
        answer = config.scheduler.default_max_tokens
        need = kv_mb_for(config, limit + answer, shape)
        raise_kv = (
            f"raise max_kv_cache_mb to {need} (a {limit}-token prompt and a {answer}-token "
            "answer)" if need is not None
            else f"the model's context is {shape.trained_tokens} tokens"
        )  # fmt: skip
    return (
        f"edge-llm: warning: max_prompt_tokens {limit} does not fit {layout} "
        f"({share} tokens, prompt and answer together): longer prompts get 400 "
        f"prompt_too_long; {raise_kv}, lower max_sequences, or lower max_prompt_tokens"
    )


def limits_line(config: EngineConfig, kv: KvBook, trained_tokens: int) -> str:
    """The limits a request meets, in one line (they were guesses before it)."""
    bp = config.backpressure
    layout = "a slot's share" if kv.per_slot else "the pool"
    ttft = f"{bp.ttft_timeout_ms / 1000:g} s" if bp.ttft_timeout_ms else "off"
    return (
        f"edge-llm: limits: model context {trained_tokens} tokens, {kv.sequence_tokens} "
        f"per sequence ({layout}), max_prompt_tokens {bp.max_prompt_tokens}, "
        f"ttft_timeout_ms {bp.ttft_timeout_ms} ({ttft})"
    )


def kv_capacity(config: EngineConfig, capacity_tokens: int, capacity_bytes: int) -> str:
    """The KV capacity as ``top`` and the playground show it (``kv_budget_bytes``):
    ``max_kv_cache_mb`` rounded down to the whole blocks of cells llama.cpp allocates."""
    configured = config.backpressure.max_kv_cache_mb
    return (
        f"KV capacity {mib(capacity_bytes)} MiB = {capacity_tokens} tokens, "
        f"from max_kv_cache_mb {configured}"
    )


async def _serve(config: EngineConfig) -> None:
    progress = ProgressLine(sys.stderr)
    config = await Catalog.of(config).resolve_config(config, progress)  # pulled names
    progress.clear()
    server = await start_server(config)
    config = server.ctx.config  # with the keys sized for the model
    pool = server.ctx.pool
    default = pool.loaded(pool.default)
    if default is None:  # loaded at start; unloaded only on request
        raise BackendError("the default model is not loaded")
    kv = default.engine.kv
    capacity = kv_capacity(config, kv.capacity_tokens, kv.capacity_bytes)
    print(f"edge-llm: serving {pool.default} on {server.url} ({capacity})", flush=True)
    print(f"edge-llm: {ledger_summary(default.engine.snapshot()['memory_ledger'])}", flush=True)
    for reason in server.sized.reasons:
        print(f"edge-llm: sized for {pool.default}: {reason}; set it to choose", flush=True)
    info = default.engine.backend.info
    print(limits_line(config, kv, info.n_ctx_train), flush=True)
    shape = ModelShape(info.n_ctx_train, info.kv_bytes_per_token, info.size_bytes)
    warning = prompt_limit_warning(config, kv, shape)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    for name in pool.names[1:]:
        print(f"edge-llm: model {name} ({pool.spec(name).path}): loaded on first request",
              flush=True)  # fmt: skip
    for upstream in server.ctx.router.registry.upstreams:
        state = "healthy" if upstream.healthy else f"unreachable ({upstream.last_error})"
        role = ", fallback" if upstream.config.fallback else ""
        models = ", ".join(upstream.models) or "none listed"
        print(f"edge-llm: upstream {upstream.name} {upstream.config.url}: {state}; "
              f"models: {models}{role}", flush=True)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("edge-llm: draining", flush=True)
    await server.shutdown(config.server.drain_grace_ms / 1000.0)
    print("edge-llm: stopped", flush=True)
