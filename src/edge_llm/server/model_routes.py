"""Served models: ``POST /models/load`` and ``/models/unload`` (named as llama-server's
router names them), OpenAI's ``GET /v1/models/{id}`` and ``POST /v1/embeddings``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from edge_llm.errors import InvalidRequest, ModelNotFound
from edge_llm.generation.service import ServedModel
from edge_llm.models.embeddings import EmbeddingInput, EmbeddingResult
from edge_llm.models.pool import ModelPool
from edge_llm.protocol import embeddings as protocol
from edge_llm.protocol.openai import model_object, parse_request
from edge_llm.server.context import context_of
from edge_llm.server.http import read_json


async def retrieve(request: web.Request) -> web.Response:
    """One model as ``GET /v1/models`` lists it (a pulled one, served from now on;
    an upstream's); else 404 ``model_not_found``."""
    ctx = context_of(request)
    asked = request.match_info["id"]
    if (model := ctx.pool.served_name(asked)) is not None:  # any spelling: its served id
        metadata = await ctx.pool.metadata(model)
        arch = metadata.get("general.architecture")
        return web.json_response({
            **model_object(model, ctx.started_at),
            "state": ctx.pool.state(model).value,
            "chat_template": bool(metadata.get("tokenizer.chat_template")),
            "context_length": metadata.get(f"{arch}.context_length"),
        })  # fmt: skip
    for upstream_model, backend in ctx.router.model_entries():
        if upstream_model == asked:
            return web.json_response(model_object(asked, ctx.started_at, owned_by=backend))
    ctx.pool.resolve(asked)  # raises ModelNotFound listing the served ones
    raise ModelNotFound(f"model {asked!r} is not served here", param="model")


async def load(request: web.Request) -> web.Response:
    """``{"model": NAME}``: load it now (it is not held: its keep-alive runs)."""
    ctx = context_of(request)
    name = ctx.pool.resolve(_model_field(await read_json(request, ctx.connection)))
    await ctx.pool.load(name)
    return web.json_response(_state(ctx.pool, name))


async def unload(request: web.Request) -> web.Response:
    """``{"model": NAME}``: unload it; its running streams end (``unloaded``)."""
    ctx = context_of(request)
    name = ctx.pool.resolve(_model_field(await read_json(request, ctx.connection)))
    await ctx.pool.unload(name)
    return web.json_response(_state(ctx.pool, name))


def _model_field(body: Any) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: the name of a served model is required", param="model")
    return model


def _state(pool: ModelPool[ServedModel], name: str) -> dict[str, Any]:
    return {"success": True, "model": name, "state": pool.state(name).value}


async def embeddings(request: web.Request) -> web.Response:
    ctx = context_of(request)
    req = parse_request(protocol.EmbeddingsRequest, await read_json(request, ctx.connection))
    name, result = await embed(ctx.pool, req.model, req.inputs(), truncate=False)
    if req.dimensions is not None and result.vectors and req.dimensions != len(result.vectors[0]):
        raise InvalidRequest(
            f"dimensions: this model's embeddings have {len(result.vectors[0])} "
            f"(they cannot be shortened), got {req.dimensions}",
            param="dimensions",
        )
    body = protocol.embedding_list(name, result.vectors, result.n_tokens, req.encoding_format)
    return web.json_response(body)


async def embed(
    pool: ModelPool[ServedModel], model: str | None, inputs: list[EmbeddingInput], *, truncate: bool
) -> tuple[str, EmbeddingResult]:
    """The served model ``model`` names (loaded if needed, held meanwhile) embeds
    ``inputs``."""
    with await pool.acquire(pool.resolve(model)) as lease:
        return lease.name, await lease.model.embeddings.embed(inputs, truncate=truncate)
