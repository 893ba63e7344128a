"""``edge-llm serve``: run the engine daemon until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys

from edge_llm.cli.port_holder import port_holder
from edge_llm.config.tree import (
    ConfigError,
    EngineConfig,
    add_config_flags,
    flag_overrides,
    load_config,
)
from edge_llm.engine.kv.book import KvBook
from edge_llm.engine.kv.ledger import ledger_summary
from edge_llm.engine.runtime.heap import unmap_large_blocks_when_freed
from edge_llm.errors import BackendError
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
    try:
        config = load_config(args.config, overrides=flag_overrides(args))
    except ConfigError as exc:
        print(f"edge-llm serve: {exc}", file=sys.stderr)
        return 2
    unmap_large_blocks_when_freed()  # before the first saved state: RSS follows the ledger
    try:
        asyncio.run(_serve(config))
    except ListenError as exc:
        print(f"edge-llm serve: {listen_problem(exc)}", file=sys.stderr)
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


def prompt_limit_warning(config: EngineConfig, kv: KvBook) -> str | None:
    """A warning when ``max_prompt_tokens`` promises prompts that one sequence's share
    of the KV cache cannot hold (they would be refused below the configured limit)."""
    limit = config.backpressure.max_prompt_tokens
    share = kv.sequence_tokens
    if limit < share:
        return None
    layout = "one slot's share" if kv.per_slot else "the whole KV cache"
    return (
        f"edge-llm: warning: max_prompt_tokens {limit} does not fit {layout} "
        f"({share} tokens, prompt and answer together): longer prompts get 400 "
        "prompt_too_long; raise max_kv_cache_mb, lower max_sequences, or lower "
        "max_prompt_tokens"
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
    server = await start_server(config)
    pool = server.ctx.pool
    default = pool.loaded(pool.default)
    if default is None:  # loaded at start; unloaded only on request
        raise BackendError("the default model is not loaded")
    kv = default.engine.kv
    capacity = kv_capacity(config, kv.capacity_tokens, kv.capacity_bytes)
    print(f"edge-llm: serving {pool.default} on {server.url} ({capacity})", flush=True)
    print(f"edge-llm: {ledger_summary(default.engine.snapshot()['memory_ledger'])}", flush=True)
    warning = prompt_limit_warning(config, kv)
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
