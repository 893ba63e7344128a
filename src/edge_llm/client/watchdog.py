"""Stream deadlines (sans I/O): TTFT warning, TTFT hard timeout, dead connection.

The transport asks :meth:`Watchdog.seconds_left` before each read and waits at
most that long; when the wait runs out it calls :meth:`Watchdog.expired` to learn
which deadline passed. ``TTFT_WARN`` fires once and the caller keeps reading;
``TTFT_HARD`` and ``DEAD`` end the attempt. The caller must report bytes with
:meth:`bytes_received`, the first content with :meth:`first_token`, and call
:meth:`touch` after any time it deliberately did not read (a paused reader is
not a dead connection).

The dead-connection deadline (``dead_after_s`` without a byte) only runs once
:meth:`arm` was called: a server that sends heartbeats promises to keep doing
so, while a plain OpenAI server may legitimately stay silent during a prefill.
"""

from __future__ import annotations

import enum


class Deadline(enum.Enum):
    TTFT_WARN = "ttft_warn"
    TTFT_HARD = "ttft_timeout"
    DEAD = "dead_connection"


class Watchdog:
    """Deadlines of one attempt; times are monotonic seconds; 0 disables a limit."""

    def __init__(
        self, *, start: float, ttft_warn_s: float, ttft_hard_s: float, dead_after_s: float
    ) -> None:
        self.start = start
        self.ttft_warn_s = ttft_warn_s
        self.ttft_hard_s = ttft_hard_s
        self.dead_after_s = dead_after_s
        self.armed = False
        self.warned = False
        self.got_token = False
        self.last_activity = start

    def arm(self) -> None:
        """Start the dead-connection deadline (the server was seen to heartbeat)."""
        self.armed = True

    def bytes_received(self, now: float) -> None:
        self.last_activity = now

    def touch(self, now: float) -> None:
        """The reader was not reading until ``now``; restart the silence clock."""
        self.last_activity = now

    def first_token(self) -> None:
        self.got_token = True

    def _deadlines(self) -> list[tuple[float, Deadline]]:
        out: list[tuple[float, Deadline]] = []
        if not self.got_token and self.ttft_warn_s > 0 and not self.warned:
            out.append((self.start + self.ttft_warn_s, Deadline.TTFT_WARN))
        if not self.got_token and self.ttft_hard_s > 0:
            out.append((self.start + self.ttft_hard_s, Deadline.TTFT_HARD))
        if self.armed and self.dead_after_s > 0:
            out.append((self.last_activity + self.dead_after_s, Deadline.DEAD))
        return out

    def seconds_left(self, now: float) -> float | None:
        """How long the next read may wait (>= 0), or None for no limit."""
        deadlines = self._deadlines()
        if not deadlines:
            return None
        return max(0.0, min(at for at, _ in deadlines) - now)

    def expired(self, now: float) -> Deadline | None:
        """The deadline that has passed by ``now`` (the hard ones first), if any.

        Returning ``TTFT_WARN`` marks the warning as given.
        """
        passed = {kind for at, kind in self._deadlines() if at <= now}
        for kind in (Deadline.TTFT_HARD, Deadline.DEAD, Deadline.TTFT_WARN):
            if kind in passed:
                self.warned = self.warned or kind is Deadline.TTFT_WARN
                return kind
        return None
