"""The patched llama.cpp products are bitwise llama.cpp's own (scripts/patches/).

The row kernels (the row-kernels patch) claim that each output row is the same sequence
of operations as ggml's own one-row product for its weight type, and the invariant
kernels that a row's attention is the same in any batch and on any thread count.
``EDGE_LLM_ROW_KERNELS=0`` routes every product to ggml's own routines in the same
build, so the claims are one comparison: in the deterministic mode, a real model's
logits for a prefill and for batches of 1 to 16 rows on two threads with the patched
products must be the bits of ggml's own products computing each row alone on one
thread. A kernel that rounds otherwise, or a flash-attention fold that depends on the
thread, fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm.engine.runtime.llama_backend import default_model_path

from support import gemma_path

pytestmark = pytest.mark.e2e

CHILD = Path(__file__).with_name("kernel_logits.py")


def logits(
    model: str, prompt_rows: int, threads: int, shape: str, row_kernels: bool
) -> list[dict[str, object]]:
    """The compared rows' digests (kernel_logits.py), in position order."""
    env = dict(os.environ, EDGE_LLM_ROW_KERNELS="1" if row_kernels else "0")
    done = subprocess.run(
        [sys.executable, str(CHILD), model, str(threads), shape, str(prompt_rows)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.timeout(900)  # several hundred one-row decodes on a loaded 2-core machine
@pytest.mark.parametrize(("model", "prompt_rows"), [("smollm2-q4_1", 520), ("gemma3-q4_k_m", 260)])
def test_patched_products_are_bitwise_ggmls_own_one_row_products(
    model: str, prompt_rows: int
) -> None:
    """SmolLM2-135M (Q4_1 weights and a Q8_0 output matrix: the Q4_1 and Q8_0 row
    kernels) and Gemma 3 270M Q4_K_M (repacked Q4_K: its row kernel; Q6_K): a prefill
    and then batches of 1 to 16 rows on two threads give every compared row the logits
    ggml's own products give it alone on one thread, bit for bit. SmolLM2's rows reach
    656 cells, three 256-cell KV chunks: with two, the first holding the largest score,
    a fold of the chunks in another order often rounds alike."""
    path = str(default_model_path()) if model.startswith("smollm2") else gemma_path()
    ours = logits(path, prompt_rows, 2, "batched", row_kernels=True)
    ggmls = logits(path, prompt_rows, 1, "lone", row_kernels=False)
    assert len(ours) == len(ggmls) == prompt_rows // 10 + 136
    differ = [
        f"row {a['pos']}: {a['first']} != {b['first']}"
        for a, b in zip(ours, ggmls, strict=True)
        if a["sha256"] != b["sha256"]
    ]
    assert not differ, f"{len(differ)} rows differ: {differ[:8]}"
