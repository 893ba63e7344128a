"""Ollama's model management on the same port: ``POST /api/pull`` and
``DELETE /api/delete`` over the model store (:mod:`edge_llm.models.store`).

``/api/pull`` takes Hub sources only (``hf.co/OWNER/REPO:QUANT`` and the other
spellings of ``edge-llm pull``): never a URL, so a client cannot make the server
fetch what it likes, and every name is checked before anything is written. Its
NDJSON lines are the pull's own events (``pulling manifest``, ``pulling <digest>``
with ``total`` and ``completed``, ``verifying sha256 digest``, ``writing manifest``,
``success``); byte counts that arrive while a line is being written are merged into
the next one, so a slow reader holds one pending line, not one per chunk. A reader
that goes away cancels the pull; its bytes are kept and the next pull resumes them.
A model pulled here is served at once (``/api/tags``, ``/v1/models``, requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

from aiohttp import web

from edge_llm.errors import EdgeLLMError, InvalidRequest, ModelNotFound
from edge_llm.models.hub import RemoteError
from edge_llm.models.pull import DigestMismatch, Puller, PullStatus
from edge_llm.models.sources import HubFile, SourceError, parse_hub
from edge_llm.models.spec import pulled_spec
from edge_llm.models.store import ModelStore, StoredModel
from edge_llm.server.context import ServerContext, context_of
from edge_llm.server.http import read_json

NDJSON = "application/x-ndjson"
_PENDING_LINES = 64  # status lines waiting for a slow reader (byte counts merge)


class PullFailed(EdgeLLMError):
    status = 502
    code = "pull_failed"


class NoDiskRoom(EdgeLLMError):
    status = 507
    code = "insufficient_storage"


async def pull(request: web.Request) -> web.StreamResponse:
    ctx = context_of(request)
    body = await read_json(request, ctx.connection)
    source = _hub_source(_model_field(body))
    stream = body.get("stream", True) is not False
    relay = _Relay()
    task = asyncio.create_task(_puller(ctx).pull(source, relay))
    try:
        if not stream:
            await _pulled(ctx, await _outcome(task))
            return web.json_response({"status": "success"})
        return await _stream(request, ctx, task, relay)
    finally:
        task.cancel()  # the reader went away: the bytes so far stay for the next pull
        with contextlib.suppress(BaseException):
            await task


async def delete(request: web.Request) -> web.Response:
    ctx = context_of(request)
    name = _model_field(await read_json(request, ctx.connection))
    store = _store(ctx)
    stored = store.find(name)
    if stored is None:
        raise ModelNotFound(f'model "{name}" not found', param="model")
    # The slot serving the file (one, whatever it was asked by) is a pulled one unless
    # it is the default model or a name the configuration gives.
    holders = [n for n in ctx.pool.names if ctx.pool.spec(n).path == stored.blob]
    pulled = {m.name for m in store.list() if m.blob == stored.blob}
    configured = [n for n in holders if n not in pulled or n == ctx.pool.default]
    if configured:  # the configuration serves this file: deleting it would break that
        raise InvalidRequest(
            f"{stored.name} is served as {configured[0]!r} by this server's configuration "
            "(--model); stop serving it there first",
            param="model",
        )
    for holder in holders:  # its other names are served again when asked for
        await ctx.pool.forget(holder)
    await asyncio.to_thread(store.remove, stored.name)
    return web.Response(status=200)


def _model_field(body: Any) -> str:
    model = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: the name of a model is required", param="model")
    return model


def _hub_source(model: str) -> HubFile:
    if "://" in model:
        raise InvalidRequest(
            f"model: {model!r}: /api/pull takes Hugging Face sources (hf.co/OWNER/REPO:QUANT), "
            "not URLs; pull a URL with `edge-llm pull URL --name NAME`",
            param="model",
        )
    try:
        return parse_hub(model.strip())
    except SourceError as exc:
        raise InvalidRequest(f"model: {exc}", param="model") from exc


def _store(ctx: ServerContext) -> ModelStore:
    return ModelStore(ctx.config.model.models_dir)


def _puller(ctx: ServerContext) -> Puller:
    return Puller(_store(ctx), in_use=lambda path: path in _served_files(ctx))


def _served_files(ctx: ServerContext) -> set[str | None]:
    return {ctx.pool.spec(name).path for name in ctx.pool.names}


async def _pulled(ctx: ServerContext, stored: StoredModel) -> None:
    """Serve the model just pulled. A name pulled again with other bytes (the Hub
    changed the file) is served from the new file from now on, and its old file goes
    once nothing serves it; the configuration's models (the default one) keep their
    file until a restart."""
    if stored.name == ctx.pool.default or stored.name in ctx.config.models:
        return
    before = _served_files(ctx)
    await ctx.pool.replace(pulled_spec(ctx.config, stored.name, stored.blob))
    store = _store(ctx)
    for path in before - _served_files(ctx):
        if path is not None:
            await asyncio.to_thread(store.release_file, path)


async def _outcome(task: asyncio.Task[StoredModel]) -> StoredModel:
    """The pull's model, or its failure as the error the client gets."""
    try:
        return await task
    except (DigestMismatch, RemoteError) as exc:
        raise PullFailed(str(exc)) from exc
    except OSError as exc:  # NotEnoughDisk, or the store cannot be written
        raise NoDiskRoom(f"the model store cannot take it: {exc}") from exc
    except SourceError as exc:
        raise InvalidRequest(str(exc), param="model") from exc


async def _stream(
    request: web.Request, ctx: ServerContext, task: asyncio.Task[StoredModel], relay: _Relay
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    while True:
        waker = asyncio.ensure_future(relay.wake.wait())
        await asyncio.wait({task, waker}, return_when=asyncio.FIRST_COMPLETED)
        waker.cancel()
        relay.wake.clear()
        if task.done():
            break
        while relay.pending:
            await response.write(_line(relay.pending.popleft().to_json()))
    error = None
    try:  # served before its "success" goes out: a client's next request finds it
        await _pulled(ctx, await _outcome(task))
    except EdgeLLMError as exc:
        error = exc.message
    while relay.pending:
        await response.write(_line(relay.pending.popleft().to_json()))
    if error is not None:
        await response.write(_line({"error": error}))
    await response.write_eof()
    return response


class _Relay:
    """The pull's events for one reader: bounded, byte counts merged while they wait."""

    def __init__(self) -> None:
        self.pending: deque[PullStatus] = deque(maxlen=_PENDING_LINES)
        self.wake = asyncio.Event()

    def __call__(self, event: PullStatus) -> None:
        last = self.pending[-1] if self.pending else None
        if last is not None and last.completed is not None and last.status == event.status:
            self.pending[-1] = event
        else:
            self.pending.append(event)
        self.wake.set()


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"
