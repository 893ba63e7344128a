"""StreamHandle: what a connection holds for one generation."""

from __future__ import annotations

import asyncio
from typing import Any

from edge_llm.engine.sequence import Sequence
from edge_llm.engine.streams.text import IncrementalDetokenizer, StopMatcher
from edge_llm.engine.streams.token_ring import TokenRing
from edge_llm.protocol.stream_rules import Outcome

__all__ = ["Outcome", "StreamHandle"]


class StreamHandle:
    """Shared by the engine thread (writes) and the event loop (reads).

    The engine pushes token text into ``ring`` and sets ``outcome`` last; after
    each step it wakes the loop, which sets the handle's event. The connection
    waits with :meth:`wait_changed`, reads with ``ring.peek``, and reports what
    its socket accepted through ``Engine.consumed``.
    """

    def __init__(self, seq: Sequence, ring: TokenRing, stops: tuple[str, ...]) -> None:
        self.seq = seq
        self.ring = ring
        self.outcome: Outcome | None = None
        self.detokenizer = IncrementalDetokenizer()
        self.stop_matcher = StopMatcher(stops, keep=seq.request.sampling.include_stop_str)
        self.last_token_at: float | None = None
        self._changed = asyncio.Event()
        self._done = asyncio.Event()

    @property
    def id(self) -> str:
        return self.seq.id

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def signal(self) -> None:
        """Event-loop thread only: something changed (tokens, state, outcome)."""
        self._changed.set()
        if self.outcome is not None:
            self._done.set()

    async def wait_done(self) -> None:
        await self._done.wait()

    async def wait_changed(self, timeout: float | None) -> bool:
        """Wait until the engine signals; returns False on timeout."""
        if not self._changed.is_set():
            try:
                # asyncio.timeout, unlike wait_for, creates no task: this runs per token.
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            except TimeoutError:
                return False
        self._changed.clear()
        return True

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage object; ``cached_tokens`` came from the prefix cache."""
        prompt = self.seq.n_prompt
        completion = self.seq.n_generated
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.seq.num_cached},
        }

    def stats(self, now: float) -> dict[str, Any]:
        seq = self.seq
        ttft = None
        if seq.first_token_at is not None:
            ttft = round((seq.first_token_at - seq.created_at) * 1000.0, 3)
        return {
            "ttft_ms": ttft,
            "pauses": seq.pauses.count,
            "paused_ms": round(seq.paused_ms(now), 3),
            "backpressure_peak": seq.backpressure_peak,
            "tokens_while_paused": seq.tokens_while_paused,
        }
