"""What one run produced: the :class:`Capture`, and the arena-backed outputs of a native run.

Below every observer and the executor: observers fill a Capture, the prepared call makes one.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

#: :attr:`Capture.instrument` of a run through TVM's instrument: the native one or the Python one
#: (a run through hooked kernels says :data:`tvm_probe.capture.kernel_hook.HOOK`).
NATIVE, PYTHON = "native", "python"


@dataclass(slots=True)
class Capture:
    """What one run produced: copied node outputs, per-node time, the model's outputs.

    Attributes:
        instrument: which instrument ran, ``"native"`` or ``"python"``.
        copied_bytes: bytes of node outputs the native instrument copied during the run.
        total_us: wall time of the executable's ``main`` (on a GPU, until the device finished; on
            a remote device, as seen from here, RPC round trips included).
        input_us, output_us: time to move each model input to the device and each model output
            back (host memory copies on the CPU; transfers over the network to a remote device).
    """

    inputs: list[np.ndarray]
    outputs: Mapping[int, list[np.ndarray]] = field(default_factory=dict)
    untracked_inputs: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    start_us: dict[int, float] = field(default_factory=dict)
    time_us: dict[int, float] = field(default_factory=dict)
    result: list[np.ndarray] = field(default_factory=list)
    total_us: float = 0.0
    instrument: str = PYTHON
    copied_bytes: int = 0
    input_us: list[float] = field(default_factory=list)
    output_us: list[float] = field(default_factory=list)
    returned: object = None  # what the VM function returned (``DebugExecutor.run(..., raw=True)``)
    #: native hooks' times not yet made into the dicts: (the timed site indices, the run's
    #: ``[starts, durations]`` array of every native site)
    timing: tuple | None = None
    #: the call whose capture serves this one's outputs computed from the weights alone (None:
    #: this run copied them itself; see :mod:`tvm_probe.capture.weights_only`)
    served_from: int | None = None

    @classmethod
    def of_call(cls, inputs: list, instrument: str, total_us: float, returned) -> "Capture":
        """``Capture(inputs=..., instrument=..., total_us=..., returned=...)`` in two thirds of its
        time (a decode step of ~170 us makes one per call; the dataclass's own ``__init__``
        costs over a microsecond).  tests/capture/test_symbolic_arenas.py holds the two equal."""
        capture = cls.__new__(cls)
        capture.inputs, capture.instrument, capture.total_us, capture.returned = inputs, instrument, total_us, returned
        capture.outputs, capture.untracked_inputs, capture.start_us, capture.time_us = {}, {}, {}, {}
        capture.result, capture.input_us, capture.output_us = [], [], []
        capture.copied_bytes, capture.timing, capture.served_from = 0, None, None
        return capture

    def kernel_times(self) -> tuple[dict[int, float], dict[int, float]]:
        """``(start_us, time_us)`` by call site (made from the hooks' times when first asked:
        a small model's run cannot afford two dicts it may never need)."""
        if self.timing is not None:
            sites, table = self.timing
            if callable(table):  # (kept in a dynamic arena's header, viewed when first asked)
                table = table()
            starts, durations = table[:, sites].tolist()
            self.start_us, self.time_us = dict(zip(sites, starts)), dict(zip(sites, durations))
            self.timing = None
        return self.start_us, self.time_us


class ArenaOutputs(Mapping):
    """Node outputs the native instrument copied: numpy views of one arena, made when read.

    Making ~100 small arrays costs more than a sub-millisecond run, so a view is made the first
    time a site is read.  Each view keeps the arena alive, and an arena is reused only when
    nothing (no ArenaOutputs, no view) refers to it any more.

    Args:
        arena: the bytes.
        slots: site → its outputs' :class:`~tvm_probe.capture.native.Slot` in the arena, for every
            site copied in this run (in site order).
        dtypes: dtype name → numpy dtype.
    """

    def __init__(self, arena: np.ndarray, slots: dict[int, tuple], dtypes: dict):
        self._arena, self._slots, self._dtypes = arena, slots, dtypes
        self._views: dict[int, list[np.ndarray]] = {}

    def __getitem__(self, site: int) -> list[np.ndarray]:
        views = self._views.get(site)
        if views is None:
            views = self._views[site] = [
                self._arena[s.offset: s.offset + s.nbytes].view(self._dtypes[s.dtype]).reshape(s.shape)
                for s in self._slots[site]]  # KeyError for a site not copied
        return views

    def __contains__(self, site) -> bool:
        return site in self._slots

    def __iter__(self):
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)


class LayoutOutputs(Mapping):
    """Node outputs copied into an arena sized by one call's shapes (symbolic shapes): numpy views
    made when read, at the places and shapes the layout rows at the arena's start say.

    A decode step's shapes change at every step (the past grows), so nothing is made per call:
    the arena is held as the runtime's tensor, its header read the first time anything is, and a
    site's views made from its rows the first time it is read.

    Args:
        tensor: the arena, as the runtime's tensor.
        header: the arena as numpy → its layout rows (int64 ``[output slots, 3 + dims]``:
            offset, nbytes (-1: not copied), ndim, dims) and the run's kernel times.
        first_rows: site → (its first row, its number of outputs), for every site the plan copies.
        dtypes: site → the numpy dtypes of its outputs.
    """

    def __init__(self, tensor, header, first_rows: dict, dtypes: dict):
        self._tensor, self._header, self._first, self._dtypes = tensor, header, first_rows, dtypes
        self._arena = self._rows = self._times = None
        self._views: dict[int, list[np.ndarray]] = {}
        self._copied: list[int] | None = None

    def _layout(self) -> np.ndarray:
        if self._rows is None:
            self._arena = np.from_dlpack(self._tensor)
            self._rows, self._times = self._header(self._arena)
        return self._rows

    @property
    def plan_rows(self) -> dict:
        """Site → (its first layout row, its number of outputs): one object for every call of one
        capture plan (a caller may key what it derives from it by its identity)."""
        return self._first

    def dtype_of(self, site: int, output: int) -> np.dtype:
        """The numpy dtype of output ``output`` of ``site`` (a site the plan copies)."""
        return self._dtypes[site][output]

    def rows(self, indices: np.ndarray) -> np.ndarray:
        """The layout rows at ``indices``: offset, nbytes (-1: not copied), ndim, dims."""
        return self._layout()[indices]

    def flat(self, dtype: np.dtype) -> np.ndarray:
        """The whole arena as one flat array of ``dtype`` (a slot at byte offset ``o`` holding
        ``n`` elements is ``flat[o // size:o // size + n]``, where ``o`` is a multiple of its size):
        a generation compare takes a few dozen slots of every call, a slice each."""
        self._layout()
        dtype = np.dtype(dtype)
        return np.ndarray((self._arena.nbytes // dtype.itemsize,), dtype, self._arena, 0)

    def times(self) -> np.ndarray:
        """The run's ``[starts, durations]`` of every native site, kept in the arena's header."""
        self._layout()
        return self._times

    def __getitem__(self, site: int) -> list[np.ndarray]:
        views = self._views.get(site)
        if views is None:
            first, count = self._first[site]  # KeyError for a site the plan does not copy
            rows, arena, views = self._layout()[first:first + count].tolist(), self._arena, []
            for (offset, nbytes, ndim, *dims), dtype in zip(rows, self._dtypes[site]):
                if nbytes < 0:
                    raise KeyError(site)  # (not called in this run)
                # (one constructor call: a generation compare reads hundreds of sites a step)
                views.append(np.ndarray(dims[:ndim], dtype, arena, offset))
            self._views[site] = views
        return views

    def get(self, site: int, default=None):
        views = self._views.get(site)  # (Mapping.get goes through __getitem__ and a KeyError)
        if views is not None:
            return views
        try:
            return self[site]
        except KeyError:
            return default

    def _sites(self) -> list[int]:
        if self._copied is None:
            rows = self._layout()
            self._copied = [s for s, (first, _) in self._first.items() if rows[first, 1] >= 0]
        return self._copied

    def __contains__(self, site) -> bool:
        entry = self._first.get(site)
        return entry is not None and self._layout()[entry[0], 1] >= 0

    def __iter__(self):
        return iter(self._sites())

    def __len__(self) -> int:
        return len(self._sites())
