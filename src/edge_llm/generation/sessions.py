"""A session has one live stream: the one place that rule is decided.

A request may name its session (``X-Session-Id``, else the body's ``user``). With
``supersede_sessions`` on, a session's new stream ends the one it still has
running, whichever backend runs either (this model, another local model, an
upstream), with reason ``superseded``; off, a session's streams run side by side.
The old stream ends just before the new one is submitted to its backend, once
the new request has passed validation, so the engine or the upstream that takes
the new one already has the old one's room back (a queue place, KV cells).
"""

from __future__ import annotations

from typing import Protocol


class LiveStream(Protocol):
    """What a session's stream must offer to be superseded (an answer of either backend)."""

    @property
    def finished(self) -> bool: ...

    def cancel(self, reason: str) -> None: ...


class Sessions:
    """The live stream of each session, on whatever backend runs it.

    Call :meth:`starting` just before a session's stream is submitted, :meth:`started`
    once it runs, and :meth:`ended` when its connection is done with it. The book
    holds one entry per session with a live stream, so it is bounded by the streams
    alive.
    """

    def __init__(self, *, supersede: bool = True) -> None:
        self.supersede = supersede
        self._live: dict[str, LiveStream] = {}

    def starting(self, session: str | None) -> None:
        """A new stream of ``session`` is about to be submitted: with supersede on,
        the one the session has running ends (reason ``superseded``)."""
        if session is None or not self.supersede:
            return
        old = self._live.pop(session, None)
        if old is not None and not old.finished:
            old.cancel("superseded")

    def started(self, session: str | None, stream: LiveStream) -> None:
        if session is not None:
            self._live[session] = stream

    def ended(self, session: str | None, stream: LiveStream) -> None:
        if session is not None and self._live.get(session) is stream:
            del self._live[session]

    def __len__(self) -> int:
        return len(self._live)
