"""KV-cache budget accounting: reservations in tokens, reported in bytes.

Every admitted sequence reserves prompt + max_tokens cells up front, so the
sum of reservations never exceeds the pool and a running stream can never run
out of KV mid-generation. With a per-sequence KV layout one sequence can also
never hold more than its share (``sequence_tokens``).
"""

from __future__ import annotations


class KvBudget:
    def __init__(
        self, capacity_tokens: int, bytes_per_token: int, sequence_tokens: int | None = None
    ) -> None:
        self.capacity_tokens = capacity_tokens
        self.bytes_per_token = bytes_per_token
        self.sequence_tokens = min(capacity_tokens, sequence_tokens or capacity_tokens)
        self.num_reserved = 0

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_tokens * self.bytes_per_token

    @property
    def reserved_bytes(self) -> int:
        return self.num_reserved * self.bytes_per_token

    @property
    def num_free(self) -> int:
        return self.capacity_tokens - self.num_reserved

    def could_ever_fit(self, num_tokens: int) -> bool:
        return num_tokens <= self.sequence_tokens

    def can_allocate(self, num_tokens: int) -> bool:
        return num_tokens <= self.num_free

    def allocate(self, num_tokens: int) -> None:
        if not self.can_allocate(num_tokens):
            raise ValueError(f"cannot reserve {num_tokens} KV tokens, {self.num_free} free")
        self.num_reserved += num_tokens

    def free(self, num_tokens: int) -> None:
        if num_tokens > self.num_reserved:
            raise ValueError("freeing more KV tokens than are reserved")
        self.num_reserved -= num_tokens
