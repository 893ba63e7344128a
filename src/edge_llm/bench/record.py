"""One benchmark request's measurements, and the metrics derived from them.

Definitions (docs/design.md, after vLLM's ``bench serve``), all relative to the request's
start (just before connecting):

- TTFR: first ``data:`` event (any chunk, e.g. the role-only one);
- TTFT: first chunk with content;
- ITL: the gaps between consecutive content chunks;
- E2EL: the last content chunk;
- TPOT: (E2EL - TTFT) / (N_out - 1);
- decode rate: (N_out - 1) / (t_last - t_first content chunk).

``N_out`` is ``usage.completion_tokens`` when the endpoint sent usage
(``stream_options.include_usage``), otherwise the number of content chunks.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    """Everything measured for one request. Times are seconds.

    ``started_at`` is relative to the start of the whole run; every other time is
    relative to ``started_at``. ``chunk_times`` holds the arrival time of each content
    chunk. A failed request has ``error_kind`` set and is never used for latency.
    """

    target: str
    concurrency: int
    index: int
    prompt_id: str
    started_at: float = 0.0
    status: int | None = None
    stream_id: str | None = None
    ttfr: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    ended_at: float | None = None
    error_kind: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_times)

    @property
    def n_output_tokens(self) -> int:
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.n_chunks

    @property
    def tokens_from_usage(self) -> bool:
        return self.completion_tokens is not None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None

    @property
    def e2el(self) -> float | None:
        return self.chunk_times[-1] if self.chunk_times else None

    def itls(self) -> list[float]:
        times = self.chunk_times
        return [later - earlier for earlier, later in itertools.pairwise(times)]

    @property
    def tpot(self) -> float | None:
        ttft, e2el, n_out = self.ttft, self.e2el, self.n_output_tokens
        if ttft is None or e2el is None or n_out < 2:
            return None
        return (e2el - ttft) / (n_out - 1)

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first content chunk; None with < 2 chunks."""
        if self.n_chunks < 2 or self.n_output_tokens < 2:
            return None
        span = self.chunk_times[-1] - self.chunk_times[0]
        return (self.n_output_tokens - 1) / span if span > 0 else None

    def fail(self, kind: str, message: str) -> None:
        """Mark the request failed (the first failure wins)."""
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message

    def to_json(self) -> dict[str, Any]:
        """Raw measurements plus the derived per-request metrics, JSON-safe."""
        data = asdict(self)
        data.update(
            ok=self.ok,
            n_chunks=self.n_chunks,
            n_output_tokens=self.n_output_tokens,
            output_tokens_from="usage" if self.tokens_from_usage else "chunks",
            ttft=self.ttft,
            e2el=self.e2el,
            tpot=self.tpot,
            decode_rate=self.decode_rate,
        )
        return data
