"""Small host blocks made fast, for what a decode step keeps at every call.

A decode step of a small model takes ~100 us; what it keeps per call (a capture's arena, the K/V
its caches hold) is a few KiB.  A numpy array of its own costs microseconds to make and to align,
and fresh memory faults a page per 4 KiB when first written; blocks cut from a large chunk cost a
slice (and numpy asks for huge pages for chunks of 4 MiB and more: a fault per 2 MiB).
"""
from __future__ import annotations

import threading

import numpy as np

ALIGN = 64  # bytes: a cache line, and what TVM's kernels may assume of a tensor's start


class Chunks:
    """Aligned byte blocks cut from chunks of ``chunk`` bytes, one after the other.  A block is
    a numpy slice of its chunk, so a chunk is freed when no block cut from it is held any more.
    Blocks larger than a quarter of a chunk get arrays of their own.
    """

    def __init__(self, chunk: int = 16 << 20):
        self._size = chunk
        self._chunk, self._address, self._at = np.empty(0, np.uint8), 0, 0
        self._lock = threading.Lock()  # (two threads must never be handed one block)

    def take(self, nbytes: int) -> tuple[np.ndarray, int]:
        """A block of ``nbytes`` uninitialised bytes starting on an :data:`ALIGN` boundary, and
        its address."""
        rounded = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if rounded > self._size // 4:
            return aligned_bytes(nbytes)
        with self._lock:
            if self._at + rounded > self._chunk.size:
                self._chunk, self._address = aligned_bytes(self._size)
                self._at = 0
            chunk, at = self._chunk, self._at
            self._at = at + rounded
            return chunk[at:at + nbytes], self._address + at


def aligned_bytes(nbytes: int) -> tuple[np.ndarray, int]:
    """A new array of ``nbytes`` uninitialised bytes starting on an :data:`ALIGN` boundary, and
    its address."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    address = raw.__array_interface__["data"][0]
    skip = -address % ALIGN
    return raw[skip:skip + nbytes], address + skip
