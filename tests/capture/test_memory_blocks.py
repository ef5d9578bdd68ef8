"""core.memory.Chunks: the blocks a decode step keeps at every call (one-off arenas, the K/V a call
reads) are aligned, never overlap while held, even when threads take them at once, and a block
too large for a chunk gets memory of its own.  core.memory.Scratch: work arrays reused from call
to call in one thread, never shared between threads, fresh when over its limit."""
from __future__ import annotations

import threading

import numpy as np

from tvm_probe.core.memory import ALIGN, Chunks, Scratch


def _span(block: np.ndarray) -> tuple[int, int]:
    start = block.__array_interface__["data"][0]
    return start, start + block.nbytes


def test_blocks_held_at_once_are_aligned_and_disjoint_across_threads():
    chunks = Chunks(1 << 16)  # small chunks: many are made while the blocks are held
    held: list[tuple[np.ndarray, int]] = []

    def take():
        for n in range(1, 600):
            held.append(chunks.take(n * 7 % 300 + 1))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = sorted(_span(block) for block, _ in held)
    assert all(address % ALIGN == 0 and _span(block)[0] == address for block, address in held)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), "two blocks overlap"


def test_a_block_outlives_its_chunk_and_keeps_its_bytes():
    chunks = Chunks(1 << 12)
    first, _ = chunks.take(100)
    first[:] = 7
    for _ in range(200):  # chunks made and dropped after it
        chunks.take(500)[0][:] = 1
    assert (first == 7).all()


def test_a_block_larger_than_a_quarter_chunk_is_an_array_of_its_own():
    chunks = Chunks(1 << 12)
    block, address = chunks.take(2000)
    assert block.nbytes == 2000 and address % ALIGN == 0
    small, _ = chunks.take(64)
    assert block.base is not small.base


def test_scratch_reuses_its_arrays_in_a_thread_and_never_shares_them_between_threads():
    scratch = Scratch(limit=1 << 20)
    first = scratch.arrays(3, 1000)
    assert [a.shape for a in first] == [(1000,)] * 3 and all(a.dtype == np.float64 for a in first)
    assert len({_span(a) for a in first}) == 3 and all(a.flags.c_contiguous for a in first)
    smaller = scratch.arrays(2, 10)  # fits in the held block: the same memory again
    assert _span(smaller[0])[0] == _span(first[0])[0] and [a.size for a in smaller] == [10, 10]
    other: list[np.ndarray] = []
    worker = threading.Thread(target=lambda: other.extend(scratch.arrays(3, 1000)))
    worker.start()
    worker.join()
    assert not np.shares_memory(other[0], first[0]) and not np.shares_memory(other[2], first[2])
    larger = scratch.arrays(4, 2000)  # more than held: a larger block, kept from then on
    assert _span(scratch.arrays(4, 2000)[3]) == _span(larger[3])


def test_scratch_over_its_limit_makes_arrays_for_the_call_alone():
    scratch = Scratch(limit=8 * 1000)
    kept = scratch.arrays(1, 1000)[0]
    over = scratch.arrays(2, 1000)
    assert not np.shares_memory(over[0], over[1]) and not np.shares_memory(over[0], kept)
    assert not np.shares_memory(scratch.arrays(2, 1000)[0], over[0])
