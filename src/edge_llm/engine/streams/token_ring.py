"""The bounded outbound buffer between the engine thread and one connection.

A ring of generated tokens with a write cursor (engine side) and a read cursor
(connection side), both counted in tokens since the stream started. The
connection reads without consuming, writes to its socket, and commits only what
the socket accepted, so a stalled socket leaves the ring full: the engine sees
that and pauses the sequence instead of buffering without bound.
"""

from __future__ import annotations

import threading
from collections import deque

from edge_llm.protocol.sampling import TokenLogprob
from edge_llm.protocol.stream_rules import Marks


class RingOverflow(RuntimeError):
    """The engine wrote into a full ring: a scheduling bug, never a client error."""


class TokenRing:
    """Thread-safe single-producer, single-consumer token ring."""

    @classmethod
    def for_stream(cls, marks: Marks, pause_when_full: bool, max_tokens: int) -> TokenRing:
        """A stream's ring: full at ``marks.capacity`` tokens; without pausing a slow
        reader's tokens wait in it, at most all of them (``max_tokens``)."""
        hard_limit = None if pause_when_full else max_tokens
        return cls(marks.capacity, hard_limit, marks.resume_threshold)

    def __init__(
        self, capacity: int, hard_limit: int | None = None, resume_threshold: float = 0.3
    ) -> None:
        """``capacity`` is what counts as full (the engine pauses there), the low mark
        ``resume_threshold`` of it (a socket-full pause ends); ``hard_limit`` (default:
        capacity) is what the ring may ever hold — larger only when pausing is off,
        and then bounded by the request's max_tokens."""
        if capacity < 1:
            raise ValueError("ring capacity must be at least 1")
        self.marks = Marks(capacity, resume_threshold)
        self.capacity = capacity
        self.hard_limit = max(capacity, hard_limit or capacity)
        self._pieces: deque[str] = deque()
        self._logprobs: deque[TokenLogprob | None] = deque()  # beside each piece
        self._write = 0
        self._read = 0
        self._lock = threading.Lock()

    @property
    def write_cursor(self) -> int:
        return self._write

    @property
    def read_cursor(self) -> int:
        return self._read

    def __len__(self) -> int:
        return self._write - self._read

    def fill(self) -> float:
        return (self._write - self._read) / self.capacity

    def is_full(self) -> bool:
        return self.marks.full(len(self))

    def drained(self) -> bool:
        """Down to the low mark: a socket-full pause ends."""
        return self.marks.drained(len(self))

    def push(self, text: str, logprob: TokenLogprob | None = None) -> None:
        """Engine side: append one token's text (and its logprob, if asked for)."""
        with self._lock:
            if self._write - self._read >= self.hard_limit:
                raise RingOverflow(f"ring of {self.hard_limit} tokens is full")
            self._pieces.append(text)
            self._logprobs.append(logprob)
            self._write += 1

    def peek(self, max_tokens: int) -> list[str]:
        """Connection side: up to ``max_tokens`` unread pieces, not consumed."""
        with self._lock:
            n = min(max_tokens, len(self._pieces))
            return [self._pieces[i] for i in range(n)]

    def peek_logprobs(self, max_tokens: int) -> list[TokenLogprob]:
        """Connection side: the logprobs of the tokens :meth:`peek` returns (none
        when the request did not ask for them)."""
        with self._lock:
            n = min(max_tokens, len(self._logprobs))
            return [lp for i in range(n) if (lp := self._logprobs[i]) is not None]

    def commit(self, n_tokens: int) -> None:
        """Connection side: mark ``n_tokens`` as sent."""
        with self._lock:
            if n_tokens > len(self._pieces):
                raise ValueError("cannot commit more tokens than were peeked")
            for _ in range(n_tokens):
                self._pieces.popleft()
                self._logprobs.popleft()
            self._read += n_tokens
