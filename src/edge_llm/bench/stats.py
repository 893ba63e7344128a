"""Summaries of request records: distributions with linear-interpolation percentiles.

Failed requests are counted (by error kind) and never enter a latency figure. Output
tok/s and request/s divide by the wall time the target was being measured (the sum of
its batches' durations), not by the whole run's, since targets take turns.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edge_llm.bench.record import RequestRecord

PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks
    (numpy's default): rank ``q/100 * (n-1)`` in the sorted values.

    Raises ValueError for an empty sequence or ``q`` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = q / 100.0 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    fraction = rank - low
    return ordered[low] + (ordered[high] - ordered[low]) * fraction


@dataclass(frozen=True, slots=True)
class Distribution:
    """n, mean, p50, p90, p99, min and max of some values (same unit as the values)."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        """None for no values."""
        if not values:
            return None
        p50, p90, p99 = (percentile(values, q) for q in PERCENTILES)
        return cls(
            n=len(values),
            mean=math.fsum(values) / len(values),
            p50=p50,
            p90=p90,
            p99=p99,
            min=min(values),
            max=max(values),
        )


METRICS = ("ttfr", "ttft", "itl", "tpot", "e2el", "decode_rate")


@dataclass(frozen=True, slots=True)
class Summary:
    """One target at one concurrency level. Latencies in seconds, rates per second."""

    target: str
    concurrency: int
    n_requests: int
    n_ok: int
    n_failed: int
    errors: dict[str, int]
    duration_s: float
    output_tokens: int
    output_tokens_from_usage: bool
    output_tok_s: float | None
    request_s: float | None
    ttfr: Distribution | None
    ttft: Distribution | None
    itl: Distribution | None
    tpot: Distribution | None
    e2el: Distribution | None
    decode_rate: Distribution | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def metric(self, name: str) -> Distribution | None:
        """The distribution named in :data:`METRICS`."""
        if name not in METRICS:
            raise KeyError(name)
        value: Distribution | None = getattr(self, name)
        return value


def summarize(
    target: str, concurrency: int, records: Iterable[RequestRecord], duration_s: float
) -> Summary:
    """Summarise one target's records at one concurrency level."""
    records = list(records)
    ok = [r for r in records if r.ok]
    errors = Counter(r.error_kind for r in records if r.error_kind is not None)
    output_tokens = sum(r.n_output_tokens for r in ok)
    return Summary(
        target=target,
        concurrency=concurrency,
        n_requests=len(records),
        n_ok=len(ok),
        n_failed=len(records) - len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        output_tokens=output_tokens,
        output_tokens_from_usage=bool(ok) and all(r.tokens_from_usage for r in ok),
        output_tok_s=output_tokens / duration_s if duration_s > 0 else None,
        request_s=len(ok) / duration_s if duration_s > 0 else None,
        ttfr=Distribution.of(_present(r.ttfr for r in ok)),
        ttft=Distribution.of(_present(r.ttft for r in ok)),
        itl=Distribution.of([gap for r in ok for gap in r.itls()]),
        tpot=Distribution.of(_present(r.tpot for r in ok)),
        e2el=Distribution.of(_present(r.e2el for r in ok)),
        decode_rate=Distribution.of(_present(r.decode_rate for r in ok)),
    )


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]
