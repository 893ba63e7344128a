"""Turning token bytes into text: incremental UTF-8 and stop strings."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class IncrementalDetokenizer:
    """Token bytes in, complete characters out.

    A token may end in the middle of a multi-byte character (common for CJK
    text with byte-fallback vocabularies); those bytes are held until the
    character completes, so no piece of output ever contains half a character.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, data: bytes) -> str:
        return self._decoder.decode(data)

    def flush(self) -> str:
        """Text for bytes still held at the end (invalid ones become U+FFFD)."""
        return self._decoder.decode(b"", final=True)


class StopMatcher:
    """Finds stop strings across token boundaries.

    Text that could still be the start of a stop string is held back; once it
    cannot, it is released. On a match, the text before the stop is released and
    the stop string itself is dropped, as OpenAI's API does (released too with
    ``keep``: vLLM's ``include_stop_str_in_output``).
    """

    def __init__(self, stops: Sequence[str], *, keep: bool = False) -> None:
        self._stops = tuple(s for s in stops if s)
        self._keep = keep
        self._held = ""
        self.matched: str | None = None

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was hit)."""
        if not self._stops:
            return text, False
        buffer = self._held + text
        hit = self._first_match(buffer)
        if hit is not None:
            position, self.matched = hit
            self._held = ""
            end = position + len(self.matched) if self._keep else position
            return buffer[:end], True
        keep = self._longest_partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        """(position, stop string) of the earliest match."""
        found = [(buffer.find(stop), stop) for stop in self._stops]
        matches = [(position, stop) for position, stop in found if position >= 0]
        return min(matches) if matches else None

    def _longest_partial_suffix(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
