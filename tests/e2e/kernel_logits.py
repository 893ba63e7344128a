"""Child process of test_kernels_exact.py: a real model's logits in the deterministic mode.

Usage: ``python kernel_logits.py MODEL_PATH THREADS lone|batched PROMPT_ROWS``. The
context is the deterministic mode's (the invariant kernels' switch, weights repacked, as
LlamaBackend sets them). ``batched``: a prefill of PROMPT_ROWS rows (two ubatches past
512), then batches of 1 to 16 rows; ``lone``: the same rows decoded one at a time.
Prints, as one JSON line, a SHA-256 of the logits of each compared row (every
PREFILL_LOGIT_EVERY-th prefill row and every batch row) and its first logit. ggml reads
its switches (``EDGE_LLM_ROW_KERNELS``, ``GGML_CPU_USE_REF``) once per process, hence a
process per configuration.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys

import llama_cpp as llama
import numpy as np

BATCHES = range(1, 17)  # a decode step's rows: one token and up to 15 draft tokens
PREFILL_LOGIT_EVERY = 10  # prefill rows whose logits are compared (the output matrix's rows)
TEXT = (
    "The lighthouse stood on a narrow spit of rock at the mouth of the bay. Every evening "
    "the keeper climbed the one hundred and twelve steps to the lamp room, trimmed the "
    "wick, polished the great lens and wound the clockwork that turned it. "
)


class Model:
    def __init__(self, path: str, threads: int) -> None:
        os.environ["GGML_CPU_USE_REF"] = "1"
        self._quiet = llama.llama_log_callback(lambda *_: None)  # kept: llama.cpp calls it
        llama.llama_log_set(self._quiet, ctypes.c_void_p(0))
        llama.llama_backend_init()
        mparams = llama.llama_model_default_params()
        mparams.use_extra_bufts = True
        self.model = llama.llama_model_load_from_file(path.encode(), mparams)
        cparams = llama.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 1024, 1024, 512
        cparams.n_threads = cparams.n_threads_batch = threads
        self.ctx = llama.llama_init_from_model(self.model, cparams)
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)
        self.batch = llama.llama_batch_init(1024, 0, 1)

    def tokens(self, n: int) -> list[int]:
        text = (TEXT * 40).encode()
        buf = (llama.llama_token * (len(text) + 8))()
        count = llama.llama_tokenize(self.vocab, text, len(text), buf, len(buf), True, False)
        assert count >= n, count
        return list(buf[:n])

    def decode(self, tokens: list[int], pos: int, compared: set[int]) -> list[dict[str, object]]:
        """Decode ``tokens`` from ``pos`` in one batch; the digests of rows ``compared``."""
        raw = self.batch
        for i, token in enumerate(tokens):
            raw.token[i], raw.pos[i], raw.n_seq_id[i] = token, pos + i, 1
            raw.seq_id[i][0], raw.logits[i] = 0, pos + i in compared
        raw.n_tokens = len(tokens)
        if llama.llama_decode(self.ctx, raw) != 0:
            raise SystemExit("llama_decode failed")
        out = []
        for i in range(len(tokens)):
            if pos + i in compared:
                row = llama.llama_get_logits_ith(self.ctx, i)
                logits = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
                digest = hashlib.sha256(logits.tobytes()).hexdigest()
                out.append({"pos": pos + i, "sha256": digest, "first": float(logits[0])})
        return out


def main(path: str, threads: int, shape: str, prompt_rows: int) -> None:
    model = Model(path, threads)
    tokens = model.tokens(prompt_rows + sum(BATCHES))
    prefill = set(range(PREFILL_LOGIT_EVERY - 1, prompt_rows, PREFILL_LOGIT_EVERY))
    compared = prefill | set(range(prompt_rows, len(tokens)))
    chunks = [prompt_rows, *BATCHES] if shape == "batched" else [1] * len(tokens)
    rows, pos = [], 0
    for n in chunks:
        rows += model.decode(tokens[pos : pos + n], pos, compared)
        pos += n
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
