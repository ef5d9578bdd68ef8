"""Delta debugging: the smallest part of a list that still has a property (Zeller's ddmin).

Used where tvm_probe searches for a minimal set by trying real builds: the ops to keep in fp32
(:mod:`tvm_probe.tools.precision`), the passes a compile failure needs
(:mod:`tvm_probe.tools.blame`).  Order is kept; items are told apart by equality, so a list that
may repeat an item is searched by its indices.
"""
from __future__ import annotations

from typing import Callable


def ddmin(items: list, passes: Callable[[list], bool]) -> list:
    """A 1-minimal sublist of ``items`` that still ``passes`` (Zeller's delta debugging; ``items``
    itself must pass): removing any single element of the result fails."""
    current, n = list(items), 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if passes(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks:
                rest = [x for x in current if x not in chunk]
                if rest and passes(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(2 * n, len(current))
    if len(current) == 1 and passes([]):
        return []
    return current
