"""The search for a small node set that still fails: :class:`Search` (pure: bisection, then
single-node removal) and :func:`run_search`, which tests its candidates as real sub-models."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from .check import Checker
from .failure import Divergence, Failure, ReduceError
from .submodels import CannotCut, SubModels

log = logging.getLogger(__package__)


@dataclass(frozen=True)
class ReduceStep:
    """One sub-model tried, for progress displays.

    Attributes:
        phase: ``check`` (the whole model), ``isolate`` (the failing node alone), ``bisect``
            or ``linear``.
        tried: sub-models tried so far.
        nodes: nodes of this sub-model; reproduced: whether it shows the failure.
        best: nodes of the smallest sub-model that showed it so far; total: nodes of the model.
        seconds: since the search started.
    """

    phase: str
    tried: int
    nodes: int
    reproduced: bool
    best: int
    total: int
    seconds: float


class Search:
    """Finds a small node set for which ``test(frozenset of node indices)`` is true.

    Pure: knows nothing of ONNX or TVM.  ``pinned`` is a node every candidate must keep (the
    failing node of a divergence).  Each node set is tested once.  After ``max_seconds`` no
    further set is tested (each counts as not reproducing, so what is returned was still
    verified) and :attr:`stopped` is set.
    """

    def __init__(self, total: int, test: Callable[[frozenset], bool], pinned: int | None = None,
                 progress: Callable[[ReduceStep], None] | None = None, max_seconds: float | None = None):
        self.total, self.test, self.pinned, self.progress = total, test, pinned, progress
        self.tried: dict[frozenset, bool] = {}
        self.best = total
        self.phase = "check"
        self.stopped = False
        self.result: list[int] | None = None
        self._start = time.perf_counter()
        self._deadline = None if max_seconds is None else self._start + max_seconds

    def run(self) -> list[int] | None:
        """The node indices found, sorted (also kept in :attr:`result`); None when even the
        whole model does not reproduce."""
        self.result = self._find()
        return self.result

    def _find(self) -> list[int] | None:
        if not self.reproduces(range(self.total)):
            return None
        if self.pinned is not None:
            self.phase = "isolate"
            if self.reproduces([self.pinned]):
                return [self.pinned]
        self.phase = "bisect"
        lo, hi = self.bisect()
        self.phase = "linear"
        return self.linear(list(range(lo, hi + 1)))

    def reproduces(self, keep: Iterable[int]) -> bool:
        key = frozenset(keep)
        if not key or (self.pinned is not None and self.pinned not in key):
            return False
        if key not in self.tried and self._out_of_time():
            return False
        if key not in self.tried:
            self.tried[key] = ok = bool(self.test(key))
            if ok:
                self.best = min(self.best, len(key))
            if self.progress is not None:
                self.progress(ReduceStep(self.phase, len(self.tried), len(key), ok, self.best, self.total,
                                         time.perf_counter() - self._start))
        return self.tried[key]

    def _out_of_time(self) -> bool:
        if self.phase != "check" and self._deadline is not None and time.perf_counter() > self._deadline:
            self.stopped = True
        return self.stopped

    def bisect(self) -> tuple[int, int]:
        """The window ``[lo, hi]`` found by bisecting from the input side, then the output side."""
        hi = self.total - 1
        top = hi if self.pinned is None else self.pinned
        good, bad = 0, top + 1          # [good, hi] reproduces; [bad, hi] is not worth testing
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.reproduces(range(mid, hi + 1)) else (good, mid)
        lo = good
        bottom = lo if self.pinned is None else self.pinned
        good, bad = hi, bottom - 1      # [lo, good] reproduces; [lo, bad] is not worth testing
        while good - bad > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.reproduces(range(lo, mid + 1)) else (good, mid)
        return lo, good

    def linear(self, keep: list[int]) -> list[int]:
        """Remove single nodes, last first, while the failure persists; repeat until none goes."""
        changed = True
        while changed:
            changed = False
            for node in reversed(list(keep)):
                if node == self.pinned or len(keep) == 1:
                    continue
                trial = [k for k in keep if k != node]
                if self.reproduces(trial):
                    keep, changed = trial, True
        return sorted(keep)


def run_search(graph: SubModels, checker: Checker, failure: Failure, progress, max_seconds=None) -> Search:
    """The finished search: ``.result`` holds the nodes a minimal reproduction keeps."""
    extra = (failure.tensor,) if isinstance(failure, Divergence) else ()
    pinned = graph.producer.get(failure.tensor) if isinstance(failure, Divergence) else None

    def test(keep) -> bool:
        try:
            sub = graph.model(keep, extra)
        except CannotCut as err:
            log.info("cannot cut: %s", err)
            return False
        ok = checker.reproduces(sub, graph.feeds(sub), failure)
        log.info("%d nodes: %s", len(keep), "reproduces" if ok else "does not reproduce")
        return ok

    search = Search(len(graph), test, pinned, progress, max_seconds)
    if search.run() is None:
        raise ReduceError(f"the failure does not reproduce on any sub-model, not even the whole model with "
                          f"{'its failing tensor as an output' if extra else 'static input shapes'}: "
                          f"{failure.statement('TVM', checker.reference.label)}")
    return search
