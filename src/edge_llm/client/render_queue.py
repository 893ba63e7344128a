"""The render queue: a bounded FIFO of text chunks with high/low watermarks (sans I/O).

The network reader pushes chunks, the renderer pops them. Crossing the high
watermark on a push returns :attr:`Watermark.HIGH` once (the caller must then
send PAUSE or stop reading the socket); draining to the low watermark afterwards
returns :attr:`Watermark.LOW` once (the caller must send RESUME or read again).
The hysteresis means each HIGH is followed by exactly one LOW before the next
HIGH. The queue never holds more than ``capacity`` items: the caller must check
:attr:`RenderQueue.is_full` and wait for the renderer before pushing.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Watermark(enum.Enum):
    HIGH = "high"
    LOW = "low"


class RenderQueueFullError(RuntimeError):
    """:meth:`RenderQueue.push` was called on a full queue (a caller bug)."""


class RenderQueue(Generic[T]):
    """Bounded FIFO; ``high_mark``/``low_mark`` are lengths, not fractions."""

    def __init__(self, capacity: int, *, high_mark: int, low_mark: int) -> None:
        if not 0 <= low_mark < high_mark <= capacity:
            raise ValueError(
                f"need 0 <= low_mark < high_mark <= capacity, got "
                f"{low_mark}, {high_mark}, {capacity}"
            )
        self.capacity = capacity
        self.high_mark = high_mark
        self.low_mark = low_mark
        self.above_high = False
        self._items: deque[T] = deque()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def fill(self) -> float:
        """Fraction of the capacity in use, 0.0 to 1.0."""
        return len(self._items) / self.capacity

    @property
    def is_full(self) -> bool:
        return len(self._items) >= self.capacity

    def push(self, item: T) -> Watermark | None:
        """Append ``item``; return HIGH when this push reached the high watermark.

        Raises :class:`RenderQueueFullError` if the queue is full.
        """
        if self.is_full:
            raise RenderQueueFullError(f"render queue full ({self.capacity} chunks)")
        self._items.append(item)
        if not self.above_high and len(self._items) >= self.high_mark:
            self.above_high = True
            return Watermark.HIGH
        return None

    def pop(self) -> tuple[T, Watermark | None]:
        """Remove the oldest item; also return LOW when the queue drained to the low
        watermark after a HIGH. Raises :class:`IndexError` when empty."""
        item = self._items.popleft()
        if self.above_high and len(self._items) <= self.low_mark:
            self.above_high = False
            return item, Watermark.LOW
        return item, None
