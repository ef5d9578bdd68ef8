"""Progress display for the CLI: one line per stage, with a bar where a stage has steps.

Drawn only on a terminal (and not with ``--quiet``): logs and CI output stay clean.
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    """``with progress.stage("compile"): ...``; inside, ``progress.update(done, total)``."""

    WIDTH = 30

    def __init__(self, enabled: bool | None = None, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = (self.stream.isatty() if enabled is None else enabled)
        self._label = ""
        self._start = 0.0

    @contextmanager
    def stage(self, label: str):
        self._label, self._start = label, time.perf_counter()
        self._draw(f"{label} ...")
        try:
            yield self
        except BaseException:
            self._draw(f"{label} ... failed", end="\n")
            raise
        self._draw(f"{label} ... done ({time.perf_counter() - self._start:.1f} s)", end="\n")

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        filled = int(self.WIDTH * done / total)
        self._draw(f"{self._label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total}")

    def _draw(self, text: str, end: str = "") -> None:
        if self.enabled:
            self.stream.write(f"\r\033[K{text}{end}")
            self.stream.flush()
