"""Quantized KV cache: what q8_0 and q4_0 cost in quality and speed, and what they buy
in room, measured against f16 with the same model, threads and budget.

Usage::

    .venv/bin/python benchmarks/kv_quant.py [--tokens 128] [--json out.json] [--publish]

For each ``kv_cache_type`` (one backend at a time, the per-slot layout ``make run``
serves):

- greedy agreement with f16 over a fixed set of prompts: tokens until the first
  divergence (median), and the share of answers identical for ``--tokens`` tokens;
- the mean log-probability the model gives a fixed reference text, teacher-forced
  (``LlamaBackend.log_likelihood``), and its perplexity;
- decode tokens/s of one stream (greedy, ``--tokens`` tokens after each prompt) and
  prefill tokens/s of a ~500-token prompt, best of ``--repeats``;
- the KV capacity of ``--kv-mb`` (tokens) and how many 1,024-token sequences it holds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from machine import noise, own_pids, snapshot
from output import add_output_flags, header, write_outputs
from rich.console import Console

from edge_llm.bench.prompts import long_text
from edge_llm.bench.publish import rich_table, table_data
from edge_llm.engine.runtime.backend import BatchItem
from edge_llm.engine.runtime.llama_backend import KV_TYPES, LlamaBackend
from edge_llm.protocol.sampling import SamplingParams

PROMPTS = (
    "Write a very long story about a dragon and a knight.",
    "Explain how bread rises, step by step, in detail.",
    "List twenty animals that live in the sea and describe each one.",
    "Write a long letter to a friend about a journey through the mountains.",
    "Describe how a lighthouse keeper spends a stormy night.",
    "Summarise the history of the bicycle in a few paragraphs.",
)
REFERENCE = long_text(7, 20)  # about 400 tokens of plain prose
SEQUENCE_TOKENS = 1024


@dataclass
class TypeFigures:
    kv_cache_type: str
    kv_bytes_per_token: int
    capacity_tokens: int
    sequences_of_1024: int
    mean_logprob: float
    perplexity: float
    decode_tok_s: float
    prefill_tok_s: float
    answers: list[list[int]] = field(default_factory=list, repr=False)
    first_divergence: list[int | None] = field(default_factory=list)
    identical_share: float | None = None


def backend(kv_type: str, kv_mb: int, threads: int) -> LlamaBackend:
    return LlamaBackend(
        None, kv_budget_bytes=kv_mb << 20, max_sequences=4, max_batch_tokens=512,
        n_threads=threads, kv_unified=False, kv_cache_type=kv_type,
    )  # fmt: skip


def greedy(b: LlamaBackend, prompt: list[int], n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens after ``prompt`` in slot 0; (tokens, decode seconds)."""
    b.truncate(0, 0)
    b.start_sequence("bench", SamplingParams())
    b.decode_runs([BatchItem(0, prompt[:-1], 0, False, "bench")])
    token, pos, out = prompt[-1], len(prompt) - 1, []
    began = time.perf_counter()
    for _ in range(n):
        token = b.decode_runs([BatchItem(0, [token], pos, True, "bench")])[0][0].token
        out.append(token)
        pos += 1
    took = time.perf_counter() - began
    b.end_sequence("bench")
    return out, took


def prefill_rate(b: LlamaBackend, prompt: list[int], repeats: int) -> float:
    best = float("inf")
    b.start_sequence("bench", SamplingParams())
    for _ in range(repeats):
        b.truncate(0, 0)
        began = time.perf_counter()
        b.decode_runs([BatchItem(0, prompt, 0, False, "bench")])
        best = min(best, time.perf_counter() - began)
    b.truncate(0, 0)
    b.end_sequence("bench")
    return len(prompt) / best


def measure(kv_type: str, args: argparse.Namespace) -> TypeFigures:
    b = backend(kv_type, args.kv_mb, args.threads)
    try:
        prompts = [b.tokenize(b.render_chat([{"role": "user", "content": p}]), add_special=True)
                   for p in PROMPTS]  # fmt: skip
        runs = [greedy(b, p, args.tokens) for p in prompts]
        scores = b.log_likelihood(b.tokenize(REFERENCE, add_special=True), slot=1)
        long_prompt = b.tokenize(long_text(3, 26), add_special=True)
        mean = statistics.fmean(scores)
        return TypeFigures(
            kv_type, b.info.kv_bytes_per_token, b.kv_capacity_tokens,
            b.kv_capacity_tokens // SEQUENCE_TOKENS, mean, 2.718281828 ** -mean,
            decode_tok_s=max(len(t) / s for t, s in runs),
            prefill_tok_s=prefill_rate(b, long_prompt, args.repeats),
            answers=[t for t, _ in runs],
        )  # fmt: skip
    finally:
        b.close()


def compare(figures: list[TypeFigures]) -> None:
    reference = figures[0].answers
    for fig in figures:
        fig.first_divergence = [
            _divergence(a, r) for a, r in zip(fig.answers, reference, strict=True)
        ]
        fig.identical_share = sum(d is None for d in fig.first_divergence) / len(reference)


def _divergence(answer: list[int], reference: list[int]) -> int | None:
    return next((i for i, (a, r) in enumerate(zip(answer, reference, strict=True)) if a != r), None)


COLUMNS = (
    "KV type", "bytes/token", "tokens in budget", "1,024-token sequences", "identical answers",
    "first divergence (median token)", "mean log-prob (vs f16)", "perplexity",
    "decode tok/s (vs f16)", "prefill tok/s (vs f16)",
)  # fmt: skip


def table(figures: list[TypeFigures], f16: TypeFigures) -> dict[str, Any]:
    rows = []
    for fig in figures:
        diverged = [d for d in fig.first_divergence if d is not None]
        median = statistics.median(diverged) if diverged else "-"
        logprob = fig.mean_logprob / f16.mean_logprob - 1
        decode, prefill = fig.decode_tok_s / f16.decode_tok_s, fig.prefill_tok_s / f16.prefill_tok_s
        rows.append([
            fig.kv_cache_type, str(fig.kv_bytes_per_token), str(fig.capacity_tokens),
            str(fig.sequences_of_1024), f"{fig.identical_share:.0%}", str(median),
            f"{fig.mean_logprob:.4f} ({logprob:+.2%})", f"{fig.perplexity:.3f}",
            f"{fig.decode_tok_s:.1f} ({decode:.2f}x)", f"{fig.prefill_tok_s:.0f} ({prefill:.2f}x)",
        ])  # fmt: skip
    return table_data("KV cell types against f16", COLUMNS, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    add_output_flags(parser)
    args = parser.parse_args(argv)
    started, start = datetime.now(UTC), snapshot()
    figures = [measure(kv_type, args) for kv_type in KV_TYPES]
    compare(figures)
    machine = noise(start, snapshot(), own_pids())
    result = table(figures, figures[0])
    Console(width=200).print(rich_table(result))
    for line in machine.lines():
        print(line)
    notes = [
        f"SmolLM2-135M, {args.threads} threads, a {args.kv_mb} MiB budget, the per-slot "
        f"layout; {args.tokens} greedy tokens after each of {len(PROMPTS)} prompts; "
        f"speeds best of the prompts (decode) and of {args.repeats} runs (prefill)."
    ]
    raw = {
        "types": [{k: v for k, v in asdict(f).items() if k != "answers"} for f in figures],
        "tokens": args.tokens,
        "threads": args.threads,
        "kv_mb": args.kv_mb,
    }
    title = "Quantized KV cache against f16"
    write_outputs(args, header("kv_quant", title, started, machine, notes), [result], raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
