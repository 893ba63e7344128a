"""The contract under any interleaving (SPEC section 25), as a stateful property test.

Hypothesis drives the engine over the fake backend, one step at a time on the test's
thread and on a clock of its own, with random interleavings of: submit (identical,
prefix-sharing and distinct prompts, of two priority classes, some in a session whose
new request supersedes the old: a regenerate), step (with a PAUSE or CANCEL landing
while the decode runs, as from the event loop), pause, resume, cancel, disconnect,
a reader that reads its ring or not (socket-full pauses), time passing (TTFT time-outs,
offload of paused streams, max_pause), and device memory pressure. Preemption,
offload and restore follow from those. After every rule it checks:

- KV accounting: the book's live + cached cells are the cells the backend holds, its
  live ones exactly those of running sequences, and the offload store holds exactly
  the offloaded sequences' states;
- no sequence waits without a reason that can end (a prefilling sequence always has
  prompt left or the logits of its first token; the queue moves whenever nothing
  runs);
- a paused stream generates at most one token;
- a cancelled stream's KV is free before the next decode;

and at the end, with every pause lifted and every ring read, that every stream ends
with tokens or a typed error. A failure prints the rules that led to it, and the seed:
run again with ``EDGE_LLM_INTERLEAVING_SEED=<seed>``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from edge_llm.engine import Engine, EngineSettings
from edge_llm.engine.build import build_parts
from edge_llm.engine.pressure.memory import MemoryReading
from edge_llm.engine.runtime.backend import BatchItem, Sampled
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.streams.handle import StreamHandle
from edge_llm.errors import BackendFailure, EdgeLLMError
from edge_llm.protocol.stream_rules import StreamState

from fakes import FakeBackend, ManualClock, SteppedEngine

SEED = int(os.environ.get("EDGE_LLM_INTERLEAVING_SEED") or random.randrange(1 << 32))
EXAMPLES = int(os.environ.get("EDGE_LLM_INTERLEAVING_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=list(HealthCheck),
    # Shrinking a long interleaving can take minutes: EDGE_LLM_INTERLEAVING_SHRINK=1 to
    # have the shortest one (a failure prints every rule it ran either way).
    phases=[
        p for p in Phase if p is not Phase.shrink or os.environ.get("EDGE_LLM_INTERLEAVING_SHRINK")
    ],
)

SYSTEM = list(range(500, 520))  # a shared start, as a chat template's system prompt
STORY = list(range(600, 624))
PROMPTS = {
    "identical": [*SYSTEM, *STORY],
    "longer": [*SYSTEM, *STORY, 7, 8, 9],
    "shorter": [*SYSTEM, *STORY[:12]],
    "system only": [*SYSTEM, 1],
    "distinct": list(range(700, 740)),
}
FLOOR = 1 << 30  # min_available_bytes: memory pressure below it


class Memory:
    def __init__(self) -> None:
        self.available = 4 * FLOOR

    def __call__(self) -> MemoryReading:
        return MemoryReading(self.available, "test")


class CheckedBackend(FakeBackend):
    """The fake backend, calling ``before_decode(items)`` first: where the test checks
    that every stream cancelled before this decode has its KV freed."""

    before_decode: Any = None

    def decode_runs(self, items: Sequence[BatchItem], drafting: Any = None) -> list[list[Sampled]]:
        if self.before_decode is not None:
            self.before_decode(items)
        return super().decode_runs(items, drafting)


def machine(per_slot: bool, speculative: bool) -> type[RuleBasedStateMachine]:
    class Interleavings(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.memory = Memory()
            self.backend = CheckedBackend(
                kv_capacity_tokens=600, max_sequences=3, per_slot=per_slot
            )
            self.engine = SteppedEngine(
                build_parts(
                    self.backend,  # type: ignore[arg-type]
                    EngineSettings(
                        max_queue=4,
                        prefill_chunk_tokens=16,
                        itl_target_s=None,
                        speculative=speculative,
                        max_draft_tokens=3,
                        outbound_buffer_tokens=6,
                        ttft_timeout_s=5.0,
                        max_pause_s=30.0,
                        offload_paused_after_s=1.0,
                        host_offload_bytes=2_000,
                        min_available_bytes=FLOOR,
                        max_preemptions=2,
                        adaptive_threads=False,
                    ),
                    clock=self.clock,
                    memory=self.memory,
                )
            )
            self.backend.before_decode = self._cancelled_kv_is_free
            self.cancelled: list[StreamHandle] = []  # since the last step
            self.handles: list[StreamHandle] = []
            self.reading: set[str] = set()  # streams whose reader keeps up
            self.paused_at: dict[str, int] = {}  # n_generated when a pause began
            self.sessions: dict[str, StreamHandle] = {}
            self.submitted = 0
            self.checked: set[str] = set()  # cancelled streams whose KV was checked

        # -- actions -------------------------------------------------------------------

        @rule(
            kind=st.sampled_from(sorted(PROMPTS)),
            max_tokens=st.integers(1, 30),
            priority=st.sampled_from([1, 1, 1, 0]),
            session=st.sampled_from([None, None, "a", "b"]),
            reads=st.booleans(),
        )
        def submit(
            self, kind: str, max_tokens: int, priority: int, session: str | None, reads: bool
        ) -> None:
            if session is not None and (old := self.sessions.get(session)) is not None:
                self._cancel(old, "superseded")  # generation/sessions.py: a regenerate
            request = GenerationRequest(
                list(PROMPTS[kind]), max_tokens, session=session, priority=priority,
                request_id=f"r{len(self.handles)}-{self.submitted}",
            )  # fmt: skip
            self.submitted += 1
            try:
                handle = self.engine.submit(request)
            except EdgeLLMError:
                return  # refused with a typed error (queue full, memory pressure, ...)
            self.handles.append(handle)
            if reads:
                self.reading.add(handle.id)
            if session is not None:
                self.sessions[session] = handle

        @rule(landing=st.sampled_from([None, None, "pause", "cancel"]), index=st.integers(0, 50))
        def step(self, landing: str | None, index: int) -> None:
            live = self._live()
            if landing is not None and live:
                target = live[index % len(live)]
                self.backend.after_sampling = lambda: self._land(landing, target)
            self._read()
            self.cancelled = [  # since the last step: freed before this decode
                h for h in self.handles
                if h.seq.state is StreamState.CANCELLED and h.id not in self.checked
            ]  # fmt: skip
            self.checked.update(h.id for h in self.cancelled)
            self.engine._step()
            self.backend.after_sampling = None
            self._note_pauses()
            scheduler = self.engine.scheduler
            if scheduler.waiting and not scheduler.running and not scheduler.offloaded:
                raise AssertionError("requests wait while nothing runs")

        @precondition(lambda self: self._live())
        @rule(index=st.integers(0, 50))
        def pause(self, index: int) -> None:
            handle = self._pick(index)
            if self.engine.pause(handle):
                self.paused_at.setdefault(handle.id, handle.seq.n_generated)

        @precondition(lambda self: self._live())
        @rule(index=st.integers(0, 50))
        def resume(self, index: int) -> None:
            handle = self._pick(index)
            self.engine.resume(handle)
            if not handle.seq.paused:  # a later pause counts from its own start
                self.paused_at.pop(handle.id, None)

        @precondition(lambda self: self._live())
        @rule(index=st.integers(0, 50), reason=st.sampled_from(["client", "disconnect"]))
        def cancel(self, index: int, reason: str) -> None:
            self._cancel(self._pick(index), reason)

        @precondition(lambda self: self._live())
        @rule(index=st.integers(0, 50))
        def toggle_reader(self, index: int) -> None:
            handle = self._pick(index)
            self.reading ^= {handle.id}

        @rule(seconds=st.sampled_from([0.5, 1.5, 6.0]))
        def time_passes(self, seconds: float) -> None:
            self.clock.now += seconds

        @rule(short=st.booleans())
        def memory(self, short: bool) -> None:
            self.memory.available = FLOOR // 2 if short else 4 * FLOOR

        # -- checks after every rule ---------------------------------------------------

        @invariant()
        def kv_accounting(self) -> None:
            engine = self.engine
            if engine.scheduler._kv_ops:
                return  # admissions since the last step: their copies apply before the next
            stats = engine.kv.stats()
            assert self.backend.num_used_cells == stats.used_tokens + stats.cached_tokens
            live = {
                cell
                for seq in engine.scheduler.running
                if seq.slot is not None
                for cell in self.backend.kv.get(seq.slot, [])
            }
            assert len(live) == stats.used_tokens, (len(live), stats)
            offloaded = {seq.id for seq in engine.scheduler.offloaded}
            assert {k for k in offloaded if k in engine.host_offload} == offloaded
            assert len(engine.host_offload) == len(offloaded)

        @invariant()
        def no_wait_without_a_reason(self) -> None:
            for seq in self.engine.scheduler.running:
                if seq.state is StreamState.PREFILL and not seq.prefill_remaining:
                    assert seq.first_logits is not None, f"{seq.id}: whole prompt, no logits"

        @invariant()
        def a_paused_stream_generates_at_most_one_token(self) -> None:
            for handle in self.handles:
                at = self.paused_at.get(handle.id)
                if at is not None and handle.seq.paused:
                    assert handle.seq.n_generated <= at + 1, (handle.id, at, handle.seq)

        # -- the end -------------------------------------------------------------------

        def teardown(self) -> None:
            """Lift every pause and read every ring: each stream ends, with tokens or a
            typed error."""
            self.memory.available = 4 * FLOOR
            self.reading = {h.id for h in self.handles}
            for _ in range(2000):
                live = self._live()
                if not live:
                    break
                for handle in live:
                    self.engine.resume(handle)
                self._read()
                self.engine._step()
                self.clock.now += 0.05
            assert not self._live(), [h.seq for h in self._live()]
            for handle in self.handles:
                outcome = handle.outcome
                assert outcome is not None
                if outcome.error is None:
                    assert outcome.finish_reason in ("stop", "length") and handle.seq.n_generated
                else:
                    assert isinstance(outcome.error, EdgeLLMError)
                    assert not isinstance(outcome.error, BackendFailure), outcome.error
            assert self.engine.kv.stats().used_tokens == 0
            assert len(self.engine.host_offload) == 0

        # -- helpers -------------------------------------------------------------------

        def _live(self) -> list[StreamHandle]:
            return [h for h in self.handles if not h.finished]

        def _pick(self, index: int) -> StreamHandle:
            live = self._live()
            return live[index % len(live)]

        def _cancel(self, handle: StreamHandle, reason: str) -> None:
            self.engine.cancel(handle, reason)

        def _land(self, what: str, handle: StreamHandle) -> None:
            """A PAUSE or CANCEL from the event loop while the decode runs."""
            if what == "pause":
                if self.engine.pause(handle):
                    self.paused_at.setdefault(handle.id, handle.seq.n_generated)
            else:
                self._cancel(handle, "client")

        def _cancelled_kv_is_free(self, items: Sequence[BatchItem]) -> None:
            decoded = {item.sampler for item in items}
            running = {seq.slot for seq in self.engine.scheduler.running}
            for handle in self.cancelled:
                seq = handle.seq
                assert seq.id not in decoded, f"{seq.id} decoded after its cancel"
                later = self.handles[self.handles.index(handle) + 1 :]
                if seq.slot in running or any(h.seq.slot == seq.slot for h in later):
                    continue  # its slot serves another sequence now
                cells = len(self.backend.kv.get(seq.slot, [])) if seq.slot is not None else 0
                assert cells <= seq.n_prompt, f"{seq.id}: {cells} cells after its cancel"

        def _read(self) -> None:
            for handle in self.handles:
                if handle.id in self.reading and (pieces := handle.ring.peek(100)):
                    self.engine.consumed(handle, len(pieces))

        def _note_pauses(self) -> None:
            """A pause the engine began (socket full, preempted) counts from now; an
            ended one is forgotten."""
            for handle in self.handles:
                if not handle.seq.paused:
                    self.paused_at.pop(handle.id, None)
                else:
                    self.paused_at.setdefault(handle.id, handle.seq.n_generated)

    return Interleavings


@pytest.mark.parametrize(
    ("per_slot", "speculative"),
    [
        (True, False),
        (True, True),
        (False, False),
        (False, True),
    ],
    ids=["per-slot", "per-slot-spec", "pool", "pool-spec"],
)
def test_the_contract_holds_under_random_interleavings(per_slot: bool, speculative: bool) -> None:
    try:
        run_state_machine_as_test(seed(SEED)(machine(per_slot, speculative)), settings=SETTINGS)
    except BaseException as exc:
        exc.add_note(f"interleavings: run again with EDGE_LLM_INTERLEAVING_SEED={SEED}")
        raise


# -- what the harness found, each a named regression test ------------------------------


def stepped(per_slot: bool = True, **settings: Any) -> tuple[SteppedEngine, FakeBackend]:
    backend = FakeBackend(kv_capacity_tokens=600, max_sequences=3, per_slot=per_slot)
    parts = build_parts(backend, EngineSettings(adaptive_threads=False, **settings))  # type: ignore[arg-type]
    engine = SteppedEngine(parts)
    return engine, backend


def run_to_end(engine: Engine, handles: list[StreamHandle]) -> None:
    for _ in range(500):
        if all(h.finished for h in handles):
            return
        for handle in handles:
            if pieces := handle.ring.peek(100):
                engine.consumed(handle, len(pieces))
        engine._step()
    raise AssertionError("streams did not end")


@pytest.mark.parametrize("per_slot", [True, False])
def test_a_stream_paused_before_its_first_step_gets_its_sampler(per_slot: bool) -> None:
    """Found by the harness: a request admitted at once and paused before the engine's
    next step made that step empty; the step returned before starting the samplers of
    the sequences it admitted, so the resumed stream was decoded without one (the fake
    raised KeyError; llama_backend raised it in the engine thread, which died)."""
    engine, _ = stepped(per_slot)
    handle = engine.submit(GenerationRequest(list(PROMPTS["identical"]), 5))
    assert engine.pause(handle)
    engine._step()  # nothing to decode
    assert engine.resume(handle)
    run_to_end(engine, [handle])
    assert handle.outcome is not None and handle.outcome.error is None


def test_a_stream_cancelled_before_its_first_step_leaves_no_sampler() -> None:
    """The other side of the fix above: a sequence admitted and cancelled before the
    step gets no sampler, which nothing would end."""
    engine, backend = stepped()
    handle = engine.submit(GenerationRequest(list(PROMPTS["identical"]), 5))
    engine.cancel(handle, "client")
    engine._step()
    assert handle.id not in backend.generated  # no sampler started for it, none leaked
