"""Embeddings of one loaded model, beside its engine.

They run on an embeddings context of their own (made from the same loaded weights
on first use, see ``LlamaEmbedder``) and on a thread of their own, one input at a
time: the engine's decode steps never wait for them (``llama_decode`` releases the
GIL) and share the CPU with at most one embedding chunk at a time, on
``embedding_threads`` threads. Requests beyond ``max_queue`` waiting are refused
(503 ``queue_full``). Vectors are L2-normalized, as OpenAI's and Ollama's are.

The context's KV is a line in the model's memory ledger (``engine/kv/ledger.py``),
charged before the context is made: the host prefix tier gives back room for it
first; if the ledger still has none, the request gets 503 ``kv_budget_exceeded``.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from edge_llm.engine import Account, MemoryLedger, context_cells, in_passing_thread
from edge_llm.errors import InvalidRequest, KvBudgetExceeded, QueueFull

EmbeddingInput = str | list[int]


class Embedder(Protocol):
    n_embd: int
    pooling: str

    def embed(self, tokens: Sequence[int]) -> list[float]: ...

    def close(self) -> None: ...


@runtime_checkable
class EmbedderSource(Protocol):
    """A backend that can make an embeddings context (``LlamaBackend.embedder``)."""

    def embedder(self, max_tokens: int, n_threads: int) -> Embedder: ...

    def tokenize(self, text: str, *, add_special: bool) -> list[int]: ...


@dataclass(frozen=True)
class EmbeddingLimits:
    max_inputs: int
    max_tokens: int
    max_waiting: int
    threads: int


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: list[list[float]]
    n_tokens: int


class Embeddings:
    def __init__(
        self,
        backend: Any,
        n_vocab: int,
        limits: EmbeddingLimits,
        ledger: MemoryLedger | None = None,
    ) -> None:
        self._source = backend if isinstance(backend, EmbedderSource) else None
        self._n_vocab = n_vocab
        self.limits = limits
        self._one_at_a_time = asyncio.Lock()  # one embeddings context: one run at a time
        self._running = threading.Lock()  # held by the run in flight; close() waits on it
        self._embedder: Embedder | None = None
        self._waiting = 0
        self._ledger = ledger or MemoryLedger(None)
        info = getattr(backend, "info", None)
        self._kv_bytes_per_token = int(getattr(info, "kv_bytes_per_token", 0))
        self._account: Account | None = None

    @property
    def context_bytes(self) -> int:
        """The KV of its context: ``max_embedding_tokens`` in whole blocks of cells."""
        return context_cells(self.limits.max_tokens) * self._kv_bytes_per_token

    def _charge_context(self) -> None:
        """Before the first embedding: the context's KV into the ledger, or 503."""
        if self._account is not None:
            return
        account = self._ledger.account("embeddings", "embeddings")
        if not account.reserve(self.context_bytes):
            account.close()
            free = self._ledger.free_bytes >> 20
            raise KvBudgetExceeded(
                f"the embeddings context needs {self.context_bytes >> 20} MiB of KV and the "
                f"memory ledger has {free} MiB free of max_kv_cache_mb",
                retry_after_s=2,
            )
        self._account = account

    async def embed(self, inputs: Sequence[EmbeddingInput], *, truncate: bool) -> EmbeddingResult:
        """Vectors of ``inputs`` (texts or token ids), in order; raises InvalidRequest
        naming the limit an input breaks (``truncate``: longer texts are cut to
        ``max_embedding_tokens`` instead, as Ollama's ``truncate`` asks)."""
        self._check_count(len(inputs))
        if self._waiting >= self.limits.max_waiting:
            raise QueueFull(
                f"{self._waiting} embeddings requests already waiting for this model",
                retry_after_s=1,
            )
        self._charge_context()
        self._waiting += 1
        try:
            async with self._one_at_a_time:
                return await in_passing_thread(self._run, list(inputs), truncate)
        finally:
            self._waiting -= 1

    def _check_count(self, count: int) -> None:
        self._source_of()
        if count == 0:
            raise InvalidRequest("input is empty: give at least one text", param="input")
        if count > self.limits.max_inputs:
            raise InvalidRequest(
                f"{count} inputs, more than max_embedding_inputs ({self.limits.max_inputs})",
                param="input",
                limit="max_embedding_inputs",
            )

    def _run(self, inputs: list[EmbeddingInput], truncate: bool) -> EmbeddingResult:
        """In a thread of its own (``in_passing_thread``): tokenize and check all inputs,
        then embed them."""
        with self._running:
            token_lists = [self._tokens(i, value, truncate) for i, value in enumerate(inputs)]
            embedder = self._embedder_made()
            vectors = [_normalized(embedder.embed(tokens)) for tokens in token_lists]
            return EmbeddingResult(vectors, sum(len(tokens) for tokens in token_lists))

    def _source_of(self) -> EmbedderSource:
        if self._source is None:
            raise InvalidRequest("this model's runtime computes no embeddings", param="model")
        return self._source

    def _tokens(self, index: int, value: EmbeddingInput, truncate: bool) -> list[int]:
        if isinstance(value, str):
            tokens = self._source_of().tokenize(value, add_special=True)
        else:
            tokens = value
            bad = next((t for t in tokens if not 0 <= t < self._n_vocab), None)
            if bad is not None:
                raise InvalidRequest(
                    f"input {index}: token id {bad} is not in the vocabulary "
                    f"(0..{self._n_vocab - 1})",
                    param="input",
                )
        limit = self.limits.max_tokens
        if len(tokens) > limit and truncate and isinstance(value, str):
            return tokens[:limit]
        if len(tokens) > limit:
            raise InvalidRequest(
                f"input {index} has {len(tokens)} tokens, more than max_embedding_tokens "
                f"({limit}); nothing is truncated",
                param="input",
                limit="max_embedding_tokens",
            )
        if not tokens:
            raise InvalidRequest(f"input {index} is empty (it has no tokens)", param="input")
        return tokens

    def _embedder_made(self) -> Embedder:
        if self._embedder is None:
            source = self._source_of()
            self._embedder = source.embedder(self.limits.max_tokens, self.limits.threads)
        return self._embedder

    @property
    def n_embd(self) -> int | None:
        """The vectors' length, once the embeddings context exists."""
        return self._embedder.n_embd if self._embedder is not None else None

    def close(self) -> None:
        """Blocking: wait for the batch in flight, free the context (before the model)."""
        with self._running:
            self._close_context()

    def _close_context(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._account is not None:
            self._account.close()
            self._account = None


def _normalized(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector
