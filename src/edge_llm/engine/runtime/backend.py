"""The interface between the engine and a model runtime.

The engine thread is the only caller of :meth:`Backend.decode`, the sampler
life cycle (``start_sequence``/``end_sequence``) and the KV operations
(``copy_prefix``, ``truncate``, ``save_state``, ``load_state``); ``tokenize``,
``render_chat`` and the read-only vocabulary helpers may be called from any
thread.

A *slot* is a llama.cpp sequence id: the cells a sequence sees in KV. Samplers are
keyed by the sequence's own key instead, so a sequence restored into another slot
keeps its sampler state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from edge_llm.protocol.sampling import SamplingParams, TokenLogprob


@dataclass(frozen=True)
class Sampled:
    """One sampled token; ``logprob`` only when the sequence asked for logprobs;
    ``logits``: a copy of the raw logits it was sampled from, when asked
    (``BatchItem.keep_logits``)."""

    token: int
    logprob: TokenLogprob | None = None
    logits: Any = field(default=None, compare=False, repr=False)


@dataclass
class BatchItem:
    """Tokens of one sequence for one decode step.

    ``sample`` asks for a token to be sampled from the logits of the last one before the pad,
    with the sampler started for ``sampler`` (the sequence's key). The last
    ``n_draft`` tokens are a speculative draft: logits are computed for them and
    the token before them, and sampling goes on while it agrees with the draft.
    ``keep_logits``: return a copy of the logits the first token came from. The last
    ``n_pad`` tokens (after the draft) are computed but have no logits.
    """

    slot: int
    tokens: Sequence[int]
    start_pos: int
    sample: bool
    sampler: str = ""
    n_draft: int = 0
    keep_logits: bool = False
    n_pad: int = 0


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    path: str
    n_ctx_train: int
    kv_bytes_per_token: int
    n_vocab: int
    architecture: str = ""
    size_bytes: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    # The model's recommended sampling from its GGUF (temperature, top_p, top_k, min_p).
    recommended_sampling: dict[str, float] = field(default_factory=dict)


class Backend(Protocol):
    info: ModelInfo
    kv_capacity_tokens: int
    kv_sequence_tokens: int  # most cells one sequence may hold
    max_sequences: int
    num_seq_ids: int  # slots: running sequences plus cached prefixes (unified pool)
    kv_cache_type: str  # f16, q8_0 or q4_0
    state_fingerprint: str  # what a saved state depends on: only such states load
    template_has_tools: bool  # the chat template renders ``tools`` itself
    n_threads: int  # llama.cpp threads decoding now

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        """Token ids of ``text``; special tokens in the text are parsed."""
        ...

    def render_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        """The model's own chat template applied, ending with the assistant turn;
        ``tools`` (Chat Completions' shape) only when ``template_has_tools``."""
        ...

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        """The bytes a token stands for (may be part of a UTF-8 character);
        ``special``: a control token's text too (else it is empty)."""
        ...

    def is_end_of_generation(self, token: int) -> bool: ...

    def start_sequence(self, key: str, params: SamplingParams) -> None:
        """Create the sampler of sequence ``key``."""
        ...

    def end_sequence(self, key: str) -> None:
        """Free the sampler of sequence ``key``."""
        ...

    def decode(self, items: Sequence[BatchItem]) -> list[Sampled]:
        """Run one ``llama_decode`` over all items; return the sampled tokens of
        the items with ``sample`` set, in order. Raises :class:`BackendError`."""
        ...

    def decode_runs(
        self, items: Sequence[BatchItem], drafting: Callable[[str], bool] | None = None
    ) -> list[list[Sampled]]:
        """As :meth:`decode`, with drafts verified: for each item with ``sample``
        set, the accepted run (``speculative.verify``): one token per accepted
        draft token plus the token sampled where the draft ended or diverged.
        ``drafting(sampler key)`` is asked before each token after the first; False
        ends the run there."""
        ...

    def sample_from(self, key: str, logits: Any) -> Sampled:
        """A token for sequence ``key`` from logits kept earlier (``keep_logits``),
        with its sampler, as if they had just been decoded; ``logits`` is not changed."""
        ...

    def json_schema_grammar(self, schema: dict[str, Any] | None) -> str:
        """GBNF (root rule ``root``) for JSON text valid against ``schema``; None
        means any JSON object. Raises ``InvalidRequest`` for a schema it cannot
        convert (the caller names its own field). Any thread."""
        ...

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Let slot ``dst`` see the first ``n_tokens`` cells of ``src`` (shared)."""
        ...

    def truncate(self, slot: int, start: int) -> None:
        """Drop the slot's cells from position ``start`` on (0: all of them)."""
        ...

    def state_size(self, slot: int) -> int:
        """Bytes :meth:`save_state` would return now."""
        ...

    def save_state(self, slot: int) -> bytes:
        """The slot's KV cells, to restore later with :meth:`load_state`."""
        ...

    def load_state(self, slot: int, state: bytes) -> None:
        """Restore a saved state into an empty slot. Raises :class:`BackendError`."""
        ...

    def set_threads(self, n_threads: int) -> None:
        """Decode and prefill on ``n_threads`` threads from the next decode on."""
        ...

    def close(self) -> None: ...


def fingerprint(model_path: str, kv_cache_type: str, runtime_version: str) -> str:
    """What a saved state depends on: the model file, the KV type, the runtime."""
    path = Path(model_path)
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        digest.update(fh.read(1 << 20))
    digest.update(f"{path.stat().st_size}|{kv_cache_type}|{runtime_version}".encode())
    return digest.hexdigest()[:32]


KV_CELL_BLOCK = 256  # llama.cpp allocates a context's cells in blocks of 256


def context_tokens(
    budget_bytes: int, bytes_per_token: int, n_ctx_train: int, max_sequences: int, unified: bool
) -> int:
    """The cells llama.cpp allocates for a KV context of ``budget_bytes`` (as
    ``LlamaBackend`` sizes it, so that the pool can reserve them before a load): the
    budget rounded down to whole blocks of 256 cells per KV stream (one, or one per
    slot), at most the trained context per sequence; with one stream at least one
    block; 0 when a slot's part is under one block."""
    tokens = budget_bytes // bytes_per_token
    if n_ctx_train > 0:
        tokens = min(tokens, n_ctx_train * max_sequences)
    if unified:
        return max(KV_CELL_BLOCK, tokens - tokens % KV_CELL_BLOCK)
    per_slot = tokens // max_sequences
    return (per_slot - per_slot % KV_CELL_BLOCK) * max_sequences
