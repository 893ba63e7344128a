"""Where a pause goes among the tokens a connection sends (SPEC sections 6 and 25).

After the ``paused`` event a client may receive at most the token of the step that
was in flight when the engine paused the stream. The engine keeps to that; the
connection could still break it, because it runs behind the engine: tokens generated
before the pause may still wait in the ring, unsent (a writer batching
``chunk_size_tokens``, a slow socket, a loaded machine), and going out after the
``paused`` event they would look generated after it. So a pause is reported after
the tokens the ring held when the pump first saw it: every token generated before
the pause, and perhaps the one in flight. A pause that ended meanwhile (a socket-full
pause ends as those tokens drain) is still reported, followed by its end, with no
token between. Pure bookkeeping: the pump asks, then reads the ring as told.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pause:
    """A stream's pause as the pump sees it: what it reports, and since when it has
    been paused without a break (a resume and a new pause give a new ``since``)."""

    cause: str
    since: float | None


class PauseOrder:
    def __init__(self) -> None:
        self._shown: Pause | None = None  # what the client was last told
        self._pending: Pause | None = None  # seen, reported once ``_owed`` tokens are sent
        self._owed = 0

    @property
    def shown(self) -> bool:
        """The client was told of a pause that has not ended for it yet."""
        return self._shown is not None

    @property
    def flushing(self) -> bool:
        """Tokens must go out before a pause is reported: no chunk is held back."""
        return self._pending is not None

    def limit(self, chunk_tokens: int) -> int:
        """Tokens the pump may read from the ring now."""
        return min(chunk_tokens, self._owed) if self._pending is not None else chunk_tokens

    def sent(self, n_tokens: int) -> None:
        if self._pending is not None:
            self._owed -= n_tokens

    def update(self, now: Pause | None, n_unsent: int, *, ended: bool = False) -> list[str | None]:
        """The pause events due before the next token, in order: a cause (paused) or
        None (resumed). ``now``: the stream's pause now (None: not paused);
        ``n_unsent``: tokens in its ring; ``ended``: the stream ended (a pause not
        reported yet never will be)."""
        events: list[str | None] = []
        if ended:
            self._pending = None
        if self._pending is not None and self._owed <= 0:
            self._shown, self._pending = self._pending, None
            events.append(self._shown.cause)
        if self._shown is not None and (now is None or now.since != self._shown.since):
            self._shown = None
            events.append(None)
        if self._shown is None and self._pending is None and now is not None:
            if n_unsent:
                self._pending, self._owed = now, n_unsent
            else:
                self._shown = now
                events.append(now.cause)
        elif self._shown is not None and now is not None and now.cause != self._shown.cause:
            self._shown = now
            events.append(now.cause)
        return events
