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


class Scratch:
    """Float64 work arrays reused from call to call, one set per thread, for a pass that would
    otherwise make the same few large temporaries at every call.

    Fresh arrays of a few hundred KiB cost more than the arithmetic done in them: glibc hands
    the memory back to the system when they are freed together, and every page faults again
    when next written (five such arrays of 52k elements: ~0.9 ms made fresh, ~0.08 ms reused,
    measured on 2 cores).  Sets up to ``limit`` bytes are kept for the next call; larger ones
    are made for the call alone.  What :meth:`arrays` returns is the caller's until its next
    call in the same thread: it must not be kept.
    """

    def __init__(self, limit: int = 8 << 20):
        self._limit, self._local = limit, threading.local()

    def arrays(self, count: int, size: int) -> list[np.ndarray]:
        """``count`` uninitialised float64 arrays of ``size`` elements each."""
        if count * size * 8 > self._limit:
            return list(np.empty((count, size)))
        held = getattr(self._local, "block", None)
        if held is None or held.shape[0] < count or held.shape[1] < size:
            held = self._local.block = np.empty((count, size))
        return [held[i, :size] for i in range(count)]
