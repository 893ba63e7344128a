"""The policies that send streams' KV to host memory (``engine/kv/host_offload.py``):
paused ones while others wait (``OffloadPolicy``) and those a more urgent request
preempts (``PreemptionPolicy``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_llm.engine.kv.host_offload import HostOffload
from edge_llm.engine.scheduling.priorities import preemption_victim
from edge_llm.engine.sequence import Sequence
from edge_llm.errors import PauseTimeout
from edge_llm.observability.events import Event
from edge_llm.protocol.stream_rules import PauseCause, StreamState

if TYPE_CHECKING:
    from edge_llm.engine.streams.live import Streams


class OffloadPolicy:
    """While the next request waits for KV or a slot, streams paused longer than
    ``after_s`` are saved to host memory and their cells freed, oldest pause first.
    Called with the engine lock held."""

    def __init__(
        self,
        host_offload: HostOffload,
        after_s: float,
        streams: Streams,
        state_size: Callable[[int], int],
    ) -> None:
        self.host_offload = host_offload
        self.after_s = after_s
        self.streams = streams
        self.scheduler = streams.scheduler
        self.state_size = state_size

    def run(self, now: float) -> None:
        if not self.host_offload.enabled or not self.scheduler.head_blocked:
            return
        paused = [
            s for s in self.scheduler.running
            if s.paused_since is not None and now - s.paused_since >= self.after_s
            and s.num_computed
        ]  # fmt: skip
        for seq in sorted(paused, key=lambda s: s.paused_since or now):
            if not self.scheduler.head_blocked:
                return
            self._offload(seq)

    def next_due(self, now: float) -> float | None:
        """When a paused stream becomes due for offload while requests wait (without
        this wake-up the idle thread slept until the next time-out, measured: 5 s)."""
        if not self.host_offload.enabled or not self.scheduler.head_blocked:
            return None
        # Past due and still here: it cannot be offloaded (too large), no wake-up.
        due = [
            s.paused_since + self.after_s for s in self.scheduler.running
            if s.paused_since is not None and s.paused_since + self.after_s > now
            and s.num_computed
        ]  # fmt: skip
        return min(due, default=None)

    def _offload(self, seq: Sequence) -> None:
        size = self.state_size(seq.require_slot())
        if not self.host_offload.could_ever_hold(size):
            return
        while not self.host_offload.fits(size):
            if not self._cancel_oldest_offloaded():
                return
        self.save(seq, size)

    def save(self, seq: Sequence, size: int) -> bool:
        """Save ``seq``'s KV (``size`` bytes) and give back its slot; False when the
        room for it could not be had after all (nothing changed)."""
        if not self.host_offload.reserve(seq.id, size):
            return False
        self.save_reserved(seq, size)
        return True

    def save_reserved(self, seq: Sequence, size: int) -> None:
        """:meth:`save` once the offload store holds room for ``seq``'s state."""
        n_tokens, slot = seq.num_computed, seq.slot
        self.scheduler.offload(seq)
        self.streams.metrics.kv_offloads.inc()
        self.streams.events(
            Event.OFFLOADED, seq.id, slot=slot, kv_tokens=n_tokens, state_bytes=size
        )
        if handle := self.streams.live.get(seq.id):
            self.streams.touch(handle)

    def _cancel_oldest_offloaded(self) -> bool:
        """Host memory is full: the paused stream offloaded first ends (reason
        pause_timeout); a preempted one is never the one (it waits on the engine).
        False when there is none."""
        preempted = {h.id for h in self.streams.live.values() if h.seq.preempted}
        key = self.host_offload.oldest(skip=preempted)
        if key is None:
            return False
        handle = self.streams.live.get(key)
        if handle is None:
            self.host_offload.evict(key)
            return True
        error = PauseTimeout("offloaded and host memory is full", reason="pause_timeout")
        self.streams.events(
            Event.PAUSE_TIMEOUT,
            key,
            state="offloaded",
            host_offload_bytes=self.host_offload.num_bytes,
        )
        self.streams.finish(handle, error, StreamState.CANCELLED)
        return True


class PreemptionPolicy:
    """When the next request in line cannot start (no slot, no KV) and a running
    stream is of a less urgent class, that stream is paused (cause ``preempted``) and
    its KV offloaded, token-exact, as a paused stream's is; it resumes once no waiting
    request outranks it. A stream of the same or a more urgent class is never
    preempted, nor one already preempted ``max_preemptions`` times, nor where its KV
    does not fit in host memory as it is. Called with the engine lock held."""

    def __init__(self, offload: OffloadPolicy, max_preemptions: int) -> None:
        self.offload = offload
        self.streams = offload.streams
        self.scheduler = offload.scheduler
        self.max_preemptions = max_preemptions

    def run(self, now: float) -> None:
        if not self.offload.host_offload.enabled:
            return
        self._give_back()
        head = self.scheduler.next_in_line(now)
        while head is not None and self.scheduler.head_blocked and not self.scheduler.restoring:
            victim = preemption_victim(head, self.scheduler.running, self.max_preemptions)
            if victim is None or not self._preempt(victim):
                return

    def _preempt(self, seq: Sequence) -> bool:
        handle = self.streams.live.get(seq.id)
        size = self.offload.state_size(seq.require_slot())
        host = self.offload.host_offload
        if handle is None or not host.fits(size) or not host.reserve(seq.id, size):
            return False
        seq.preemptions += 1
        self.streams.metrics.preemptions.labels(str(seq.priority)).inc()
        self.streams.add_pause(handle, PauseCause.PREEMPTED)
        self.offload.save_reserved(seq, size)
        return True

    def _give_back(self) -> None:
        """A preempted stream no waiting request outranks resumes once it can come
        back (restored first, this very step): until then its client is told it is
        preempted, not that it runs. One per step: the room it saw is its own."""
        if self.scheduler.restoring:
            return
        for seq in self.scheduler.preempted_due():
            handle = self.streams.live.get(seq.id)
            if handle is None:
                continue
            if not self.scheduler.can_restore(seq):
                return
            since = seq.pause_causes[PauseCause.PREEMPTED]
            preempted_s = self.streams.clock() - since
            self.streams.metrics.preempted_seconds.labels(str(seq.priority)).inc(preempted_s)
            self.streams.remove_pause(handle, PauseCause.PREEMPTED)
            return
