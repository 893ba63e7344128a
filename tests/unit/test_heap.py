"""The serve process's fixed mmap threshold (engine/runtime/heap.py): freed large
blocks leave RSS at once, as the memory ledger assumes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edge_llm.engine.runtime.heap import USER_SETTINGS, unmap_large_blocks_when_freed

# Frees a 4 MiB block (which, left to glibc, raises its mmap threshold to 4 MiB), then
# holds 128 MiB of 2 MiB blocks between small ones and frees the large ones: RSS
# before, at the peak and after, in MiB. Without the fixed threshold the 128 MiB
# stays (seen: 9, 137, 137); with it RSS falls back (9, 137, 9).
PATTERN = """
import sys
from edge_llm.engine.runtime.heap import unmap_large_blocks_when_freed
assert unmap_large_blocks_when_freed()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
base = rss()
first = bytes(4 << 20)
del first
big, small = [], []
for _ in range(64):
    big.append(bytearray(2 << 20))
    small.append(bytearray(1000))
peak = rss()
del big
print(base, peak, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_large_blocks_leave_rss_even_after_a_larger_one_was_freed() -> None:
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    out = subprocess.run(
        [sys.executable, "-c", PATTERN], env=env, capture_output=True, text=True, check=True
    ).stdout
    base, peak, after = (int(x) for x in out.split())
    assert peak - base >= 120
    assert after - base < 16


def test_a_users_own_malloc_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert not unmap_large_blocks_when_freed()
