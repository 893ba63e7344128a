"""A Sequence: one request's generation, its tokens, KV cursor, state and counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edge_llm.engine.speculation.prompt_lookup import PromptLookup
from edge_llm.protocol.sampling import SamplingParams
from edge_llm.protocol.stream_rules import PauseCause, Pauses, StreamState, reported_state

__all__ = ["GenerationRequest", "PauseCause", "Sequence"]


@dataclass
class GenerationRequest:
    """What the protocol layer asks the engine for, already tokenized."""

    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    session: str | None = None
    request_id: str = ""
    priority: int = 0  # its class: lower runs first (``priorities.py``)
    # Set when max_tokens was lowered to fit ("max_tokens_cap", "context" or "kv").
    max_tokens_limited_by: str | None = None
    # False (llama-server's cache_prompt: false): the prompt attaches no cached cells
    # and is computed whole; the cells it computes are kept for later requests.
    reuse_cache: bool = True
    # Its own TTFT time-out (a background response waits its turn behind foreground
    # work): None: the engine's ttft_timeout_ms; 0: none.
    ttft_timeout_s: float | None = None

    def ttft_timeout(self, engine_s: float | None) -> float | None:
        """The TTFT time-out it runs under: its own, else the engine's (None: none)."""
        own = self.ttft_timeout_s
        return engine_s if own is None else own or None


@dataclass
class Sequence:
    """``token_ids`` is the prompt plus every generated token; ``num_computed`` the
    KV cursor (cells holding ``token_ids[:num_computed]``), of which ``num_cached``
    came from the prefix cache at admission instead of being computed."""

    request: GenerationRequest
    id: str
    created_at: float
    state: StreamState = StreamState.QUEUED
    slot: int | None = None  # the llama seq id while its cells are in KV
    kv_reserved_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    cache_tier: str = "device"  # where its cached cells came from (device or host)
    n_generated: int = 0
    last_token: int | None = None
    offloaded: bool = False  # its KV is in host memory, its slot given back
    # Kept logits of its prompt's last token (kv books keep them): with the whole prompt
    # in the cache, its first token needs no decode.
    first_logits: Any = None
    pauses: Pauses = field(default_factory=Pauses)  # why it is held (stream_rules.py)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    cancel_reason: str | None = None
    tokens_while_paused: int = 0
    preemptions: int = 0
    lookup: PromptLookup | None = None  # its prompt-lookup drafts (speculation on)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.request.prompt_tokens)

    def append(self, token: int) -> None:
        """A generated token (its cell is computed when it is fed back)."""
        self.token_ids.append(token)
        self.n_generated += 1
        self.last_token = token

    def require_slot(self) -> int:
        """The slot of an admitted sequence (the scheduler gives one on admission)."""
        if self.slot is None:
            raise RuntimeError(f"sequence {self.id} has no slot: it was never admitted")
        return self.slot

    @property
    def session(self) -> str | None:
        return self.request.session

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def n_prompt(self) -> int:
        return len(self.request.prompt_tokens)

    @property
    def n_prefilled(self) -> int:
        """Prompt tokens in KV, cached ones included."""
        return min(self.num_computed, self.n_prompt)

    @property
    def prefill_remaining(self) -> int:
        return self.n_prompt - self.n_prefilled

    @property
    def kv_tokens(self) -> int:
        """KV cursor: cells this sequence occupies (prompt fed + tokens fed back)."""
        return self.num_computed

    @property
    def paused(self) -> bool:
        return self.pauses.held

    @property
    def pause_causes(self) -> dict[PauseCause, float]:
        return self.pauses.causes

    @property
    def pause_cause(self) -> PauseCause | None:
        return self.pauses.cause

    @property
    def paused_since(self) -> float | None:
        return self.pauses.since

    @property
    def reader_paused_since(self) -> float | None:
        """Since when its reader has held it paused (a preemption does not count, nor a
        detach: resume_grace_ms bounds that)."""
        return self.pauses.reader_since

    @property
    def backpressure(self) -> int:
        """Pause causes held now (the seed's counter for this stream)."""
        return len(self.pauses.causes)

    @property
    def backpressure_peak(self) -> int:
        return self.pauses.peak

    @property
    def preempted(self) -> bool:
        return PauseCause.PREEMPTED in self.pause_causes

    @property
    def detached(self) -> bool:
        """Its connection dropped and it waits to be resumed."""
        return PauseCause.DISCONNECTED in self.pause_causes

    @property
    def runnable(self) -> bool:
        live = self.state in (StreamState.PREFILL, StreamState.DECODING)
        return live and not self.paused and not self.offloaded

    def public_state(self) -> str:
        """State as /debug/streams reports it: preempted, detached, offloaded, then
        paused, win over prefill/decoding (``stream_rules.reported_state``)."""
        return reported_state(self.state, self.pauses, offloaded=self.offloaded)

    def add_pause(self, cause: PauseCause, now: float) -> bool:
        """Returns True when the cause is new (the seed's counter goes +1)."""
        return self.pauses.add(cause, now)

    def remove_pause(self, cause: PauseCause, now: float) -> float | None:
        """Returns the seconds paused for this cause, or None if it was not paused by it."""
        return self.pauses.remove(cause, now)

    def paused_ms(self, now: float) -> float:
        """Wall time spent paused for any cause."""
        return self.pauses.held_ms(now)
