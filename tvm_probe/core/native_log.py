"""What TVM's C++ code prints on stderr, sent to ``logging`` (or kept) instead of the terminal.

TVM logs from C++ straight to file descriptor 2 — warnings for every ``Gather``, "BlockBuilder
destroyed" as a failed pass's objects are freed — which would bury tvm_probe's one-line messages.
Every stage that runs TVM (import, compile, recompute, upload) wraps it in
:func:`native_log_to_logging`; the compile stage also reads the warnings back
(:meth:`NativeLog.warnings`) to attribute them to source ops.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Iterator

_NATIVE_LINE = re.compile(r"^\[[\d:.]+\] (?P<file>[^\s:]+):(?P<line>\d+): (?P<level>[A-Za-z]+): (?P<text>.*)$")

#: What TVM logs as a "Warning" about its own objects, not about the model (e.g. as a failed
#: pass's BlockBuilder is freed).
_NOT_ABOUT_THE_MODEL = ("BlockBuilder destroyed with remaining blocks!",)


def release_native(err: BaseException | None, collect: bool = True) -> None:
    """Free the TVM objects that ``err``'s traceback keeps alive, now.

    A failed import or pass leaves TVM objects in the frames of the traceback — a BlockBuilder
    with open blocks, which logs "BlockBuilder destroyed with remaining blocks!" on stderr when
    it is freed.  Freed later, that line would follow the one-line error; call this inside
    :func:`native_log_to_logging` so that it goes to the log instead.  ``collect=False`` skips
    the garbage collection (slow with PyTorch loaded) for exceptions without reference cycles.
    """
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__
    if collect:
        gc.collect()



@dataclass
class NativeLog:
    """What TVM's C++ code wrote to stderr while :func:`native_log_to_logging` captured it.

    Attributes:
        entries: ``(offset, line)`` per non-empty line, offset in bytes from the start of the
            capture (filled when the capture ends).
    """

    entries: list[tuple[int, str]] = field(default_factory=list)
    _sink: Any = None

    def tell(self) -> int:
        """Bytes captured so far (0 when stderr could not be captured)."""
        if self._sink is None:
            return 0
        _flush_stderr()
        return os.fstat(self._sink.fileno()).st_size

    def warnings(self) -> list[tuple[int, str]]:
        """``(offset, text)`` of each warning TVM logged (``[time] file.cc:line: Warning: text``;
        continuation lines are joined to their warning)."""
        found: list[list] = []
        last_level = ""
        for offset, line in self.entries:
            match = _NATIVE_LINE.match(line)
            if match is not None:
                last_level = match["level"]
                if last_level == "Warning":
                    found.append([offset, match["text"].strip()])
            elif last_level == "Warning" and found:
                found[-1][1] += " " + line
        return [(offset, text) for offset, text in found if text not in _NOT_ABOUT_THE_MODEL]


_STDERR = 2


def _flush_stderr() -> None:
    """Flush what Python buffered for stderr, so that it lands on the right side of a redirect."""
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


@contextlib.contextmanager
def native_log_to_logging(forward: bool = True) -> Iterator[NativeLog]:
    """Send what TVM's C++ code prints to stderr while compiling to ``logging`` instead.

    TVM logs warnings such as "Fast mode segfaults when there are out-of-bounds indices" for
    every Gather; on a terminal they bury tvm_probe's own one-line messages.  They go to the
    ``tvm_probe.build`` logger at INFO level (``tvm-probe -v`` shows them); with
    ``forward=False`` they are only kept in the yielded :class:`NativeLog`.  One thread at a time
    (a build alongside a run is another thread): file descriptor 2 belongs to the process.
    """
    with _REDIRECTING:
        yield from _redirect_native_log(forward)


_REDIRECTING = threading.RLock()


def _redirect_native_log(forward: bool) -> Iterator[NativeLog]:
    native = NativeLog()
    _flush_stderr()
    try:
        saved = os.dup(_STDERR)  # TVM's C++ log writes to file descriptor 2, whatever sys.stderr is
    except OSError:  # no stderr at all: nothing to capture
        yield native
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), _STDERR)
        native._sink = sink
        try:
            yield native
        finally:
            _flush_stderr()
            os.dup2(saved, _STDERR)
            os.close(saved)
            native._sink = None
            sink.seek(0)
            offset = 0
            for raw in sink.read().splitlines(keepends=True):
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    native.entries.append((offset, line))
                    if forward:
                        logging.getLogger("tvm_probe.build").info("TVM: %s", line)
                offset += len(raw)
