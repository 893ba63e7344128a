"""What a second row costs a lone stream's decode step: the price of
``deterministic = true`` (a pad row, computed and dropped) and the reason speculation
must be accepted often to pay on a CPU.

Usage::

    .venv/bin/python benchmarks/decode_rows.py [--contexts 100,600] [--steps 40]

One backend (the per-slot layout ``make run`` serves), one stream: after a prompt of
each context length, blocks of ``--steps`` decode steps alternate between one row and
one row plus a pad row (no logits), each step's cells dropped back, so every block
decodes at the same context. Steps per second, best and median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from machine import noise, own_pids, snapshot

from edge_llm.bench.prompts import long_text
from edge_llm.engine.backend import BatchItem
from edge_llm.engine.llama_backend import LlamaBackend
from edge_llm.protocol.sampling import SamplingParams


def block(backend: LlamaBackend, prompt: list[int], context: int, pad: int, steps: int) -> float:
    token, pos = prompt[context], context
    began = time.perf_counter()
    for _ in range(steps):
        item = BatchItem(0, [token] * (1 + pad), pos, True, "bench", n_pad=pad)
        token = backend.decode_runs([item])[0][0].token
        backend.truncate(0, pos + 1)
        pos += 1
    rate = steps / (time.perf_counter() - began)
    backend.truncate(0, context)
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--contexts", default="100,600")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    backend = LlamaBackend(
        None, kv_budget_bytes=256 << 20, max_sequences=4, max_batch_tokens=1024,
        n_threads=args.threads, kv_unified=False,
    )  # fmt: skip
    prompt = backend.tokenize(long_text(11, 60), add_special=True)
    backend.start_sequence("bench", SamplingParams())
    start = snapshot()
    print("| context (cells) | 1 row: steps/s best (median) | 2 rows | ratio |")
    print("|---|---|---|---|")
    for context in (int(c) for c in args.contexts.split(",")):
        backend.truncate(0, 0)
        backend.decode_runs([BatchItem(0, prompt[:context], 0, False, "bench")])
        rates: dict[int, list[float]] = {0: [], 1: []}
        for _ in range(args.repeats):
            for pad in (0, 1):
                rates[pad].append(block(backend, prompt, context, pad, args.steps))
        one, two = max(rates[0]), max(rates[1])
        print(
            f"| {context} | {one:.1f} ({statistics.median(rates[0]):.1f}) "
            f"| {two:.1f} ({statistics.median(rates[1]):.1f}) | {two / one:.2f} |"
        )
    for line in noise(start, snapshot(), own_pids()).lines():
        print(line)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
