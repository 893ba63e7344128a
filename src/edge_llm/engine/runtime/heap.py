"""Large freed blocks go back to the OS at once, so RSS follows the memory ledger.

glibc's malloc serves a block of 128 KiB or more with its own ``mmap`` and unmaps it
when freed, but each such free raises that threshold to the block's size: after the
first saved KV state (megabytes) is freed, later ones come from the heap, and what
they leave there stays in RSS. Beside a full ledger that was 40-60 MiB more RSS after
eight minutes of the soak's mixed traffic, still growing (issue 48; 30 minutes grew
another 47 MiB). Fixed thresholds keep every block of 1 MiB or more (a saved state
of some 45 cells or more) mmapped. Smaller blocks stay on the heap, which keeps up to
4 MiB free at its top: a sampled (not greedy) token makes llama.cpp's sampler copy
the vocabulary into 576 KiB of candidates, and trimming the heap after each one made
that block cost 0.2 ms instead of 15 us.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_THRESHOLD_BYTES = 4 << 20
# The user's own settings win (glibc reads these at start).
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def unmap_large_blocks_when_freed() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; False where there is
    no glibc (or the environment already tunes malloc)."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
