"""Host memory for the KV state of offloaded (paused) sequences, bounded in bytes."""

from __future__ import annotations

from collections import OrderedDict


class HostStore:
    """Saved sequence states by key, oldest first. The engine decides what to drop
    when a new state would not fit (:meth:`oldest`); :meth:`put` never goes over."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.num_bytes = 0
        self._states: OrderedDict[str, bytes] = OrderedDict()
        self._sizes: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def __contains__(self, key: str) -> bool:
        return key in self._states

    def __len__(self) -> int:
        return len(self._states)

    def fits(self, num_bytes: int) -> bool:
        return self.num_bytes + num_bytes <= self.capacity_bytes

    def oldest(self) -> str | None:
        return next(iter(self._states), None)

    def reserve(self, key: str, num_bytes: int) -> None:
        """Hold room for a state about to be saved (the save runs a little later)."""
        if not self.fits(num_bytes):
            raise ValueError(f"{num_bytes} bytes do not fit: {self.num_bytes} used")
        self._states[key] = b""
        self._sizes[key] = num_bytes
        self.num_bytes += num_bytes

    def put(self, key: str, state: bytes) -> None:
        """Store a state, in the room reserved for it if there was one."""
        self.pop(key)
        if not self.fits(len(state)):
            raise ValueError(f"{len(state)} bytes do not fit: {self.num_bytes} used")
        self._states[key] = state
        self._sizes[key] = len(state)
        self.num_bytes += len(state)

    def pop(self, key: str) -> bytes | None:
        state = self._states.pop(key, None)
        self.num_bytes -= self._sizes.pop(key, 0)
        return state
