"""A deterministic stand-in for the llama.cpp backend, for fast unit tests only."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from edge_llm.config.tree import EngineConfig
from edge_llm.engine import Engine, build_engine
from edge_llm.engine.runtime.backend import (
    BatchItem,
    ModelInfo,
    Sampled,
)
from edge_llm.engine.speculation.prompt_lookup import verify
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import BackendError, InvalidRequest, KvSlotUnavailable
from edge_llm.models.pool import LoadedModel, Loader
from edge_llm.models.spec import ModelSpec
from edge_llm.observability.events import EventSink
from edge_llm.observability.metrics import EngineMetrics
from edge_llm.protocol.sampling import SamplingParams, TokenLogprob

FAKE_LOGITS = ("fake logits",)  # what the fake keeps for a prompt's first token

EOG = 0
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
# Tokens 1 and 2 together spell one CJK character split across two tokens.
SPLIT_CHAR = {1: "中".encode()[:2], 2: "中".encode()[2:]}
# Tokens from here on stand for one character each (see text_script).
TEXT_BASE = 100_000


def text_script(text: str) -> list[int]:
    """A script that generates exactly ``text``, one character per token."""
    return [TEXT_BASE + ord(ch) for ch in text]


class FakeBackend:
    """Generates ``script`` (token ids) for every sequence, then EOG.

    ``gate`` (when set) makes each decode wait until the test releases it, so a
    test can act between steps; ``step_delay_s`` makes each decode take time;
    ``fail_slots`` makes decoding those slots fail; ``after_sampling`` (when set) is
    called on the engine thread once a decode's runs are sampled, before the engine
    records them: where a PAUSE or CANCEL from the event loop can land.

    KV is modelled as llama.cpp's unified pool, or with ``per_slot`` its per-slot
    layout (each slot a share of its own): each slot sees a list of cell ids (one per
    position); a copy shares cells in the pool and makes new ones per slot, a cell
    lives while a slot sees it. Decoding at a position that does not follow the
    slot's cells, or past the capacity, fails as llama.cpp would: tests catch cursor
    and budget bugs.
    """

    def __init__(
        self,
        script: Sequence[int] = tuple(range(10, 60)),
        *,
        kv_capacity_tokens: int = 4096,
        max_sequences: int = 4,
        kv_bytes_per_token: int = 100,
        per_slot: bool = False,
    ) -> None:
        self.info = ModelInfo(
            model_id="fake",
            path="fake.gguf",
            n_ctx_train=2048,
            kv_bytes_per_token=kv_bytes_per_token,
            n_vocab=1000,
        )
        self.kv_capacity_tokens = kv_capacity_tokens
        self.per_slot = per_slot
        self.kv_sequence_tokens = (
            kv_capacity_tokens // max_sequences if per_slot else kv_capacity_tokens
        )
        self.max_sequences = max_sequences
        self.num_seq_ids = max_sequences if per_slot else 2 * max_sequences
        self.template_has_tools = False
        self.n_threads = 1
        self.thread_counts: list[int] = []  # each set_threads call
        self.decode_threads: list[int] = []  # the thread count of each decode
        self.kv_cache_type = "f16"
        self.state_fingerprint = f"fake-{'slots' if per_slot else 'pool'}"
        self.script = list(script)
        self.fail_slots: set[int] = set()
        self.gate: threading.Semaphore | None = None
        self.at_gate = threading.Event()  # a decode, its batch fixed, waits at the gate
        self.after_sampling: Callable[[], None] | None = None
        self.step_delay_s = 0.0
        self.kv: dict[int, list[int]] = {}  # slot -> cell id per position
        self._next_cell = 0
        self.generated: dict[str, int] = {}  # sampler key -> tokens sampled
        self.decode_calls: list[list[tuple[int, int]]] = []
        self.drafts: list[int] = []  # draft length of each verified draft
        self.released: list[int] = []
        self.params: dict[str, SamplingParams] = {}  # each sequence's sampling, as started
        self.embedders: list[FakeEmbedder] = []

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = n_threads
        self.thread_counts.append(n_threads)

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        return [100 + (ord(ch) % 800) for ch in text]

    def render_chat(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> str:
        return "".join(f"<{m['role']}>{m.get('content') or ''}" for m in messages) + "<assistant>"

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        if token in SPLIT_CHAR:
            return SPLIT_CHAR[token]
        if token >= TEXT_BASE:
            return chr(token - TEXT_BASE).encode()
        return f"t{token} ".encode()

    def is_end_of_generation(self, token: int) -> bool:
        return token == EOG

    def json_schema_grammar(self, schema: dict[str, Any] | None) -> str:
        """Not GBNF: the schema itself, for tests to see what reached the engine;
        refuses a ``type`` JSON schema does not know, as the real converter does."""
        kind = "object" if schema is None else schema.get("type", "object")
        if not isinstance(kind, str) or kind not in _JSON_TYPES:
            raise InvalidRequest(f"unsupported JSON schema type {kind!r}")
        return "fake-grammar " + json.dumps(schema)

    @property
    def last_params(self) -> SamplingParams:
        """The sampling of the sequence started last."""
        return list(self.params.values())[-1]

    @property
    def cells(self) -> dict[int, int]:
        """Cells each slot sees."""
        return {slot: len(cells) for slot, cells in self.kv.items() if cells}

    @property
    def num_used_cells(self) -> int:
        return len({cell for cells in self.kv.values() for cell in cells})

    def start_sequence(self, key: str, params: SamplingParams) -> None:
        self.generated[key] = 0
        self.params[key] = params

    def end_sequence(self, key: str) -> None:
        self.generated.pop(key, None)

    def decode(self, items: Sequence[BatchItem]) -> list[Sampled]:
        return [run[0] for run in self.decode_runs(items)]

    def decode_runs(
        self, items: Sequence[BatchItem], drafting: Callable[[str], bool] | None = None
    ) -> list[list[Sampled]]:
        """The script's next token at each logit position, drafts verified as the
        real backend does (position i follows the draft's first i tokens)."""
        if self.gate is not None:
            self.at_gate.set()
            self.gate.acquire()
            self.at_gate.clear()
        if self.step_delay_s:
            time.sleep(self.step_delay_s)  # stands for the time a real decode takes
        self.decode_calls.append([(item.slot, len(item.tokens)) for item in items])
        self.decode_threads.append(self.n_threads)
        if any(item.slot in self.fail_slots for item in items):
            raise BackendError("injected failure")
        if self.num_used_cells + sum(len(i.tokens) for i in items) > self.kv_capacity_tokens:
            raise KvSlotUnavailable("fake KV pool is full")
        for item in items:
            cells = self.kv.setdefault(item.slot, [])
            if item.start_pos != len(cells):
                raise BackendError(
                    f"slot {item.slot}: position {item.start_pos} after {len(cells)}"
                )
            if len(cells) + len(item.tokens) > self.kv_sequence_tokens:
                raise KvSlotUnavailable(f"slot {item.slot} is full")
            cells.extend(range(self._next_cell, self._next_cell + len(item.tokens)))
            self._next_cell += len(item.tokens)
        self.drafts.extend(item.n_draft for item in items if item.n_draft)
        runs = [self._verify(item, drafting) for item in items if item.sample]
        if self.after_sampling is not None:
            self.after_sampling()
        return runs

    def sample_from(self, key: str, logits: Any) -> Sampled:
        assert logits == FAKE_LOGITS
        return self._next(key)

    def _verify(self, item: BatchItem, drafting: Callable[[str], bool] | None) -> list[Sampled]:
        end = len(item.tokens) - item.n_pad
        draft = list(item.tokens[end - item.n_draft : end]) if item.n_draft else []
        go_on = (lambda: drafting(item.sampler)) if drafting else (lambda: True)
        run = verify(draft, lambda _: self._next(item.sampler), lambda s: s.token, go_on)
        if item.keep_logits:
            run[0] = replace(run[0], logits=FAKE_LOGITS)
        return run

    def _next(self, key: str) -> Sampled:
        index = self.generated[key]
        self.generated[key] = index + 1
        token = self.script[index] if index < len(self.script) else EOG
        k = self.params[key].n_logprobs
        if k is None:
            return Sampled(token)
        # The script's token is the most likely, then the ids after it.
        top = tuple((token + i, -0.25 * (i + 1)) for i in range(k))
        return Sampled(token, TokenLogprob(token, -0.25, top))

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        source = self.kv.get(src, [])
        held = self.kv.get(dst, [])
        # In the pool a copy tags cells: a sequence that holds a start of them already
        # (a waiting sequence attaching more of a prefix) gains the rest, as llama.cpp.
        if held and (self.per_slot or held != source[: len(held)]):
            raise BackendError(f"copy into slot {dst}, which is not empty")
        if len(source) < n_tokens:
            raise BackendError(f"slot {src} has {len(source)} cells, {n_tokens} copied")
        if not self.per_slot:
            self.kv[dst] = source[:n_tokens]
            return
        self.kv[dst] = list(range(self._next_cell, self._next_cell + n_tokens))
        self._next_cell += n_tokens

    def truncate(self, slot: int, start: int) -> None:
        cells = self.kv.get(slot)
        if cells is not None and len(cells) > start:
            del cells[start:]
            self.released.append(slot)

    def state_size(self, slot: int) -> int:
        return len(self.save_state(slot))

    def save_state(self, slot: int) -> bytes:
        return json.dumps(["cell"] * len(self.kv.get(slot, []))).encode()

    def load_state(self, slot: int, state: bytes) -> None:
        if self.kv.get(slot):
            raise BackendError(f"restore into slot {slot}, which is not empty")
        n_cells = len(json.loads(state))  # restored into new cells, as llama.cpp does
        self.kv[slot] = list(range(self._next_cell, self._next_cell + n_cells))
        self._next_cell += n_cells

    def close(self) -> None:
        self.kv.clear()

    def embedder(self, max_tokens: int, n_threads: int) -> FakeEmbedder:
        self.embedders.append(embedder := FakeEmbedder(max_tokens))
        return embedder


class FakeEmbedder:
    """Vectors of token counts by residue (texts that share characters point alike)."""

    n_embd = 8
    pooling = "mean"

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.inputs: list[list[int]] = []
        self.closed = False

    def embed(self, tokens: Sequence[int]) -> list[float]:
        if not 0 < len(tokens) <= self.max_tokens:
            raise BackendError("input out of bounds")  # the route must have refused it
        self.inputs.append(list(tokens))
        return [float(sum(1 for t in tokens if t % 8 == i)) for i in range(8)]

    def close(self) -> None:
        self.closed = True


def fake_loader(
    config: EngineConfig, make: Callable[[ModelSpec], FakeBackend] | None = None
) -> Loader:
    """Loads a served model as a fake backend (``make(spec)``, else the default
    script) with the configuration's engine settings."""
    from edge_llm.server.runtime import engine_settings, loaded_model

    def load(spec: ModelSpec, metrics: EngineMetrics, events: EventSink) -> LoadedModel:
        backend = make(spec) if make else FakeBackend()
        engine = build_engine(backend, engine_settings(config), metrics=metrics)
        return loaded_model(config, spec, engine, backend, events)

    return load


async def drain(engine: Engine, handle: StreamHandle) -> str:
    """Read the ring like a connection that never stalls; returns the text."""
    parts = []
    while True:
        pieces = handle.ring.peek(100)
        if pieces:
            parts.extend(pieces)
            engine.consumed(handle, len(pieces))
            continue
        if handle.outcome is not None:
            return "".join(parts) + handle.outcome.tail
        assert await handle.wait_changed(10.0), "engine made no progress"


class ManualClock:
    """A clock the test moves (``now``): time-outs without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class SteppedEngine(Engine):
    """The engine without its thread: the test takes each step (``_step``)."""

    @property
    def alive(self) -> bool:
        return True

    def _idle(self) -> None:
        self._signal_touched()  # nothing to decode: back to the test, no wait
