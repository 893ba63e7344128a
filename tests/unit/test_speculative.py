"""Prompt-lookup speculation: the lookup and verification alone, then the engine with
the fake backend (which verifies drafts as llama.cpp's logits would: position i
follows the draft's first i tokens) against the same engine with speculation off."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from edge_llm.engine.scheduling.prefill_budget import StepCosts
from edge_llm.engine.sequence import GenerationRequest
from edge_llm.engine.speculation.edits import EditTracker
from edge_llm.engine.speculation.prompt_lookup import PromptLookup, verify
from edge_llm.protocol.sampling import SamplingParams

from fakes import EOG, FakeBackend, drain, text_script

COPIED = list(range(20, 40))
# The prompt holds the text the fake model will copy, then an EOG and two more tokens.
PROMPT = [1, 2, 3, *COPIED, EOG, 50, 51, 4, 5]


# -- the lookup -----------------------------------------------------------------------


def test_propose_continues_the_latest_occurrence_of_the_longest_suffix() -> None:
    lookup = PromptLookup(max_draft=8)
    tokens = [1, 2, 3, 9, 9, 2, 3, 4, 5, 6, 1, 2, 3]
    # (1, 2, 3) first occurs at the start, followed by 9; (2, 3) alone later is followed by 4.
    assert lookup.propose(tokens, limit=8)[:2] == [9, 9]


def test_no_match_no_draft_and_the_limit_caps_the_draft() -> None:
    assert PromptLookup(max_draft=8).propose([1, 2, 3, 4], limit=8) == []
    assert PromptLookup(max_draft=8).propose([5, 6, 7, 5, 6], limit=1) == [7]
    assert PromptLookup(max_draft=8).propose([5, 6, 7, 5, 6, 7, 5, 6], limit=0) == []


def test_draft_length_follows_acceptance_and_cost() -> None:
    lookup = PromptLookup(max_draft=8)
    tokens = list(range(30)) * 2
    assert lookup.draft_length(threshold=0.0) == 8  # extra tokens are free: draft all
    assert lookup.draft_length(threshold=0.3) == 2  # the prior 0.6: 0.36 > 0.3 > 0.216
    assert lookup.draft_length(threshold=0.3, long=True) == 5  # a long match's prior, 0.8
    assert len(lookup.propose(tokens[:40], limit=99, threshold=0.3)) == 5  # an 8-token match
    for _ in range(10):
        lookup.feedback(8, 8)
    assert lookup.draft_length(threshold=0.3, long=True) == 8
    assert len(lookup.propose(tokens[:40], limit=99, threshold=0.3)) == 8
    lookup.feedback(8, 0)  # the copying stopped: the next draft is shorter at once
    assert lookup.draft_length(threshold=0.3, long=True) < 8
    assert lookup.draft_length(threshold=0.3) == 2  # a short match: its own rate and cap
    for _ in range(20):
        lookup.feedback(1, 0)  # nothing accepted: drafts no longer pay
    assert lookup.draft_length(threshold=0.3, long=True) == 0
    drafts = [lookup.propose(tokens[: 41 + i], limit=99, threshold=0.3) for i in range(32)]
    probes = [i for i, draft in enumerate(drafts) if draft]
    assert probes == [15, 31] and all(len(drafts[i]) == 1 for i in probes)
    assert (lookup.num_drafted, lookup.num_accepted) == (108, 80)


def test_short_and_long_matches_keep_their_own_acceptance() -> None:
    lookup = PromptLookup(max_draft=32)
    tokens = [1, 2, 9, 1, 2]
    for _ in range(10):
        lookup.propose(tokens, limit=99, threshold=0.3)  # a 2-token match
        lookup.feedback(2, 0)  # coincidences: rejected
    assert lookup.acceptance < 0.1
    assert lookup.propose(tokens, limit=99, threshold=0.3) == []
    copy = list(range(100, 140))
    tokens += [*copy, 7, *copy[:10]]
    assert lookup.propose(tokens, limit=99, threshold=0.3) == copy[10:15]  # the prior 0.8
    for _ in range(10):
        lookup.feedback(5, 5)  # the long match copies: its drafts grow to the cap
    assert lookup.propose(tokens, limit=99, threshold=0.3) == [*copy[10:], 7, 100]


def test_where_drafts_do_not_pay_a_probe_comes_every_probe_every_proposals() -> None:
    lookup = PromptLookup(max_draft=8)
    assert lookup.draft_length(threshold=0.3) == 2  # the prior acceptance, 0.6
    for _ in range(10):
        lookup.feedback(8, 8)  # a copying stream
    assert lookup.draft_length(threshold=0.67) == 8
    for _ in range(20):
        lookup.feedback(1, 0)
    assert lookup.draft_length(0.67, probe_every=64) == 0
    tokens = [t % 3 for t in range(60)]  # only short matches
    drafts = [len(lookup.propose(tokens[: 41 + i][-7:], 99, 0.67, 64)) for i in range(64)]
    assert drafts == [0] * 63 + [1]  # a probe only every 64 proposals


def test_the_longest_match_wins_and_a_repeating_text_drafts_whole_periods() -> None:
    lookup = PromptLookup(max_draft=16)
    # (5, 6) last followed by 1, but the 4-token suffix (3, 4, 5, 6) by 7, 8.
    tokens = [3, 4, 5, 6, 7, 8, 0, 5, 6, 1, 2, 3, 4, 5, 6]
    assert lookup.propose(tokens, limit=2) == [7, 8]
    # A period of 3 repeating: the draft runs on past the end of the text.
    assert PromptLookup(max_draft=16).propose([1, 2, 3, 1, 2, 3, 1], limit=7) == [
        2, 3, 1, 2, 3, 1, 2,
    ]  # fmt: skip


def copy_steps(lookup: PromptLookup, prompt: list[int], answer: list[int]) -> list[list[int]]:
    """The drafts of a sequence whose model emits ``answer`` after ``prompt``, one
    decode step each (verification as the engine does it: the draft's agreeing prefix
    and the model's own next token)."""
    tokens, drafts = list(prompt), []
    while len(tokens) < len(prompt) + len(answer):
        draft = lookup.propose(tokens, limit=99)
        target = answer[len(tokens) - len(prompt) :]
        accepted = next((i for i, t in enumerate(draft) if i >= len(target) or t != target[i]),
                        len(draft))  # fmt: skip
        lookup.feedback(len(draft), accepted)
        tokens += target[: accepted + 1]
        drafts.append(draft)
    return drafts


def test_a_renamed_variable_is_drafted_renamed_after_its_first_occurrence() -> None:
    total, running_total = [50], [60, 61]  # " total" -> " running", "_total"
    function = [1, 2, 3, *total, 4, 5, 6, 7, *total, 8, 9, 10, 11, *total, 12, 13, 14]
    renamed = [1, 2, 3, *running_total, 4, 5, 6, 7, *running_total, 8, 9, 10, 11,
               *running_total, 12, 13, 14]  # fmt: skip
    prompt = [90, 91, *function, 92, 93]
    lookup = PromptLookup(max_draft=64)
    drafts = copy_steps(lookup, prompt, renamed)
    assert lookup.edits == {(50,): (60, 61)}
    # From the edit on, a draft carries the rest of the answer renamed.
    assert [6, 7, 60, 61, 8, 9, 10, 11, 60, 61, 12, 13, 14] in [d[:13] for d in drafts]
    plain = copy_steps(PlainLookup(max_draft=64), prompt, renamed)
    assert len(drafts) < len(plain)


class PlainLookup(PromptLookup):
    """Prompt lookup without the edit tracker: n-gram matches alone."""

    def __init__(self, max_draft: int) -> None:
        super().__init__(max_draft)
        self._edits = _NoEdits()


class _NoEdits(EditTracker):
    def diverged(self, source: Sequence[int], at_source: int, at_output: int) -> None:
        return None


def test_verify_stops_at_the_first_sample_that_differs() -> None:
    model = [7, 8, 5, 6]
    asked: list[int] = []

    def sample_at(i: int) -> int:
        asked.append(i)
        return model[i]

    assert verify([7, 8, 9], sample_at, int) == [7, 8, 5]
    assert asked == [0, 1, 2]  # position 3 is never sampled: it followed a rejected token
    assert verify([], lambda i: 4, int) == [4]


# -- the engine -------------------------------------------------------------------------


class FreeDrafts(StepCosts):
    """The fake's steps take no time to speak of: tests fix what a token costs (a
    GPU-like step, extra tokens free) so that every match is drafted in full."""

    def fit(self) -> tuple[float, float]:
        return 0.01, 0.0

    def observe(self, n_prefill: int, n_decode: int, seconds: float, n_calls: int = 0) -> None:
        return None


def request(
    prompt: list[int] = PROMPT, max_tokens: int = 40, stop: tuple[str, ...] = ()
) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=list(prompt), max_tokens=max_tokens, sampling=SamplingParams(stop=stop)
    )


async def generate(engine_of, speculative: bool, req: GenerationRequest, **settings: object):
    backend = FakeBackend(script=COPIED)
    engine = engine_of(backend, FreeDrafts(), speculative=speculative, **settings)
    handle = engine.submit(req)
    text = await drain(engine, handle)
    return backend, engine, handle, text


async def test_copied_text_is_identical_and_takes_fewer_decode_steps(engine_of) -> None:
    off_backend, _, off, off_text = await generate(engine_of, False, request())
    on_backend, engine, on, on_text = await generate(engine_of, True, request())
    assert on_text == off_text == "".join(f"t{t} " for t in COPIED)
    assert on.seq.token_ids == off.seq.token_ids
    assert on_backend.drafts and not off_backend.drafts
    assert len(on_backend.decode_calls) < len(off_backend.decode_calls) - 5
    drafted = engine.metrics.spec_draft_tokens._value.get()
    accepted = engine.metrics.spec_accepted_tokens._value.get()
    assert drafted == sum(on_backend.drafts) and 0 < accepted <= drafted


async def test_kv_cells_match_the_tokens_after_rejected_drafts(engine_of) -> None:
    # The model stops copying where the prompt has EOG: the draft [EOG, 50, 51...] is
    # verified up to EOG, which ends the stream inside the accepted run.
    backend, engine, handle, _ = await generate(engine_of, True, request())
    seq = handle.seq
    assert handle.outcome.finish_reason == "stop"
    assert seq.token_ids[-1] == EOG and seq.n_generated == len(COPIED) + 1
    # The finished answer stays as prefix cache: exactly its tokens' cells, no draft's.
    assert backend.cells[seq.slot] == len(seq.token_ids) - 1 == seq.num_computed
    assert engine.kv_used_bytes == 0


async def test_max_tokens_inside_an_accepted_run(engine_of) -> None:
    for max_tokens in (5, 9, 14):
        off = await generate(engine_of, False, request(max_tokens=max_tokens))
        backend, _, handle, text = await generate(engine_of, True, request(max_tokens=max_tokens))
        assert text == off[3]
        assert handle.seq.n_generated == max_tokens
        assert handle.outcome.finish_reason == "length"
        assert backend.cells[handle.seq.slot] == len(handle.seq.token_ids) - 1


async def test_a_stop_string_inside_an_accepted_run(engine_of) -> None:
    off = await generate(engine_of, False, request(stop=("t27",)))
    backend, _, handle, text = await generate(engine_of, True, request(stop=("t27",)))
    assert text == off[3] == "".join(f"t{t} " for t in range(20, 27))
    assert max(backend.drafts) > 2  # the stop fell inside a run, not at a draft's edge
    assert backend.cells[handle.seq.slot] == len(handle.seq.token_ids) - 1


async def test_beside_other_streams_each_text_is_its_own(engine_of) -> None:
    text = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat."
    backend = FakeBackend(script=text_script(text))
    engine = engine_of(backend, FreeDrafts(), speculative=True)
    prompt = [7, *text_script(text), 8]
    handles = [engine.submit(request(prompt, max_tokens=100)) for _ in range(4)]
    texts = await asyncio.gather(*(drain(engine, h) for h in handles))
    assert texts == [text] * 4
    assert backend.drafts


async def test_a_full_ring_is_never_overrun_by_a_run(engine_of) -> None:
    backend = FakeBackend(script=COPIED)
    engine = engine_of(backend, FreeDrafts(), speculative=True, outbound_buffer_tokens=6)
    stalled = engine.submit(request())
    while not stalled.seq.paused:
        assert await stalled.wait_changed(10.0)
    assert stalled.ring.write_cursor == 6  # a draft never holds more than the ring's room
    assert engine.alive
    assert await drain(engine, stalled) == "".join(f"t{t} " for t in COPIED)


async def test_pause_in_a_run_lets_through_at_most_that_step(engine_of) -> None:
    _, _, _, uninterrupted = await generate(engine_of, True, request())
    backend = FakeBackend(script=COPIED)
    backend.gate = threading.Semaphore(0)
    engine = engine_of(backend, FreeDrafts(), speculative=True)
    handle = engine.submit(request())
    backend.gate.release(3)  # the prompt (its first token) + two decodes
    while handle.seq.n_generated < 3:
        assert await handle.wait_changed(10.0)
    assert await asyncio.to_thread(backend.at_gate.wait, 10.0)
    engine.pause(handle)  # the next step, with a draft of 8, waits at the gate
    at_pause, calls_at_pause = handle.seq.n_generated, len(backend.decode_calls)
    drafts_at_pause = len(backend.drafts)
    backend.gate.release(10_000)
    other = engine.submit(request([9, 9, 9], max_tokens=10))
    await drain(engine, other)  # the engine kept stepping for the other stream
    slot = handle.seq.slot
    steps_since = [c for c in backend.decode_calls[calls_at_pause:] if slot in dict(c)]
    assert len(steps_since) == 1  # only the step in flight
    assert backend.drafts[drafts_at_pause] == 8  # its draft, all of which the model agrees with
    # ... yet the paused stream gets one token of it (docs/design.md §6), not the run of 9.
    assert handle.seq.tokens_while_paused == handle.seq.n_generated - at_pause == 1
    engine.resume(handle)
    assert await drain(engine, handle) == uninterrupted


async def test_a_pause_cannot_land_between_a_runs_sampling_and_its_recording(
    engine_of,
) -> None:
    """SPEC section 6: after PAUSE at most one more token. The engine asks whether a
    stream is paused between the tokens of its run; a PAUSE arriving just after the
    run was sampled must not be applied before the run is recorded (it would find the
    whole run generated while paused). The fake backend sends that PAUSE from another
    thread, as the event loop does, and gives it a second to land: it must wait until
    the run is recorded, then pause the stream with no token let through."""
    backend = FakeBackend(script=COPIED)
    backend.gate = threading.Semaphore(0)
    engine = engine_of(backend, FreeDrafts(), speculative=True)
    handle = engine.submit(request())
    backend.gate.release(3)  # the prompt (its first token) + two decodes, as above
    while handle.seq.n_generated < 3:
        assert await handle.wait_changed(10.0)
    assert await asyncio.to_thread(backend.at_gate.wait, 10.0)  # the step with a draft of 8
    at_pause = handle.seq.n_generated
    pause_landed = threading.Event()

    def pause_from_another_thread() -> None:
        engine.pause(handle)
        pause_landed.set()

    def pause_once_sampled() -> None:
        threading.Thread(target=pause_from_another_thread).start()
        assert not pause_landed.wait(1.0), "the pause landed before the run was recorded"

    backend.after_sampling = pause_once_sampled
    backend.gate.release(1)
    assert await asyncio.to_thread(pause_landed.wait, 10.0)
    backend.after_sampling = None
    assert backend.drafts[-1] == 8  # the step carried a draft the model accepts
    assert handle.seq.n_generated - at_pause == 9  # its run, recorded before the pause
    assert handle.seq.paused
    assert handle.seq.tokens_while_paused == 0


def test_a_copy_of_its_own_text_resumes_only_where_a_token_follows() -> None:
    """Regression (engine thread died: IndexError in ``_periodic``): when a sequence's
    draft source is its own growing text, its tail always "agrees" with itself; the
    copy may resume only at a position that has a successor."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    tracker = EditTracker()
    tracker.diverged(tokens, at_source=5, at_output=6)
    tokens.extend([9, 10, 11])
    resumed = tracker.resume(tokens)
    assert resumed is None or resumed[1] < len(resumed[0])
    lookup = PromptLookup(max_draft=8)
    story = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    for _ in range(40):  # drafting from its own repeating text never fails
        draft = lookup.propose(story, limit=8)
        lookup.feedback(len(draft), max(0, len(draft) - 1))
        story.append(draft[0] if draft else 5)
