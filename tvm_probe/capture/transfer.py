"""A run's arguments to the device, and its result back: what the executor's runs and its prepared
calls share.

On the host, numpy arguments are copied into tensors made once per input position
(``tvm.runtime.tensor`` costs ~15 us an array, a copy into memory made once ~0.3 us), and
outputs come back through DLPack.  A result handed to the caller as it is (``raw``) may refer
to those held tensors, which the next run writes into: each it may refer to is given up.
"""
from __future__ import annotations

import functools

import time

import numpy as np

from ..core.device import on_host
from . import native
from .kernel_hook import host_array
from .native import NativeUnavailable
from .result import Capture


def tvm_tensor(array: np.ndarray, device):
    """``array`` copied into a new tensor on ``device``."""
    import tvm

    return tvm.runtime.tensor(array, device)


def _held_input(array: np.ndarray, device) -> tuple:
    """A tensor of ``array``'s shape and dtype, and a numpy view of its memory; ``(None, None)``
    where numpy cannot view it."""
    import tvm

    try:
        tensor = tvm.runtime.empty(array.shape, str(array.dtype), device)
        view = np.from_dlpack(tensor)
        if view.dtype == array.dtype and view.shape == array.shape:
            return tensor, view
    except Exception:  # (a dtype without a DLPack form in numpy)
        pass
    return None, None


def _data_pointers(value) -> list[int] | None:
    """The data pointers of the tensors in a VM function's result (tensors, shapes, tuples of
    them); None when it holds anything else (an object whose references cannot be seen).  TVM's
    KV states (the paged KV cache a decode step returns) hold only memory they allocated: none."""
    if hasattr(value, "data_ptr"):
        return [value.data_ptr()]
    if type(value).__name__ == "Shape" or isinstance(value, (int, float, str)) or value is None:
        return []
    if _is_kv_state(type(value)):
        return []
    if type(value).__name__ in ("Array", "list", "tuple"):
        pointers = []
        for item in value:
            inner = _data_pointers(item)
            if inner is None:
                return None
            pointers += inner
        return pointers
    return None


@functools.lru_cache(maxsize=None)
def _is_kv_state(kind: type) -> bool:
    """Whether ``kind`` is TVM's ``relax.vm.KVState`` or derives from it (see :func:`_data_pointers`)."""
    return any(getattr(getattr(k, "__tvm_ffi_type_info__", None), "type_key", None) == "relax.vm.KVState"
               for k in kind.__mro__)


def _flatten(value) -> list:
    """The tensors of a VM function's result, in order: a shape or a scalar (``R.Shape``,
    ``R.prim_value``) as an int64 (or float) array of its values; a tuple, its elements in
    turn; ``None`` (an output the model leaves empty, torch's ``return x, None``) nothing."""
    if hasattr(value, "numpy"):
        return [value]
    if value is None:
        return []
    if type(value).__name__ == "Shape":
        return [np.array([int(d) for d in value], dtype="int64")]
    if isinstance(value, (bool, int, float)):
        return [np.array(value)]
    return [a for item in value for a in _flatten(item)]


class Transfers:
    """Moves one executor's arguments to its device and results back (see the module doc).

    Args:
        device: the device the executor runs on.
        remote: the :class:`~tvm_probe.capture.remote.RemoteRuntime` it runs through, or None.
    """

    def __init__(self, device, remote=None):
        self._device, self._remote = device, remote
        self._reusable = remote is None and on_host(device)  # held input tensors: on this machine's CPU only
        self.held: dict[int, tuple] = {}  # input position → (tensor, numpy view): to_device(reuse=True)
        self._held_tensors: tuple | None = None  # (positions, tensors) of held: made again when it changes
        self._alias_check = None  # _aliases(): None until asked, False without the library

    def to_device(self, arrays: list[np.ndarray], times: list[float] | None = None, reuse: bool = False,
                  arrays_at=None):
        """``arrays`` on the device (``times`` gets the microseconds each took).

        ``reuse``: on the host, copy them into tensors made once per input position; a result
        handed over as it is gives up the tensors it may refer to (:meth:`give_up_aliased`).
        ``arrays_at``: the only positions that may hold numpy arrays.
        """
        if reuse and self._reusable:
            return self._into_held_inputs(arrays, times, arrays_at)
        import tvm  # (after the branch above: the prepared call's path imports nothing)

        tensors, remote = [], self._remote
        for a in arrays:
            t0 = time.perf_counter()
            if not isinstance(a, np.ndarray):  # a VM object, shape, tuple or device tensor: as it is
                tensors.append(a)
                continue
            tensors.append(remote.to_device(a) if remote is not None else tvm.runtime.tensor(a, self._device))
            if times is not None:
                times.append((time.perf_counter() - t0) * 1e6)
        return tensors

    def keep_result(self, capture: Capture, result, raw: bool, arrays_at=None) -> None:
        """The function's result in ``capture``: as it is (``raw``), or copied out as numpy."""
        if raw:
            capture.returned = result
            self.give_up_aliased(result, arrays_at)
        else:
            capture.result = self.fetch_outputs(result, capture.output_us)

    def give_up_aliased(self, result, arrays_at=None) -> None:
        """A result handed to the caller as it is (``raw``) must not share memory with an input
        tensor the next run writes into: each held input it may refer to is given up (made
        anew by the next run).  A result holding an object that cannot be looked into (a KV
        cache) may refer to any of them.  (``arrays_at``: the positions this run fed from held
        tensors, when known.)"""
        held = self.held
        if not held or arrays_at is not None and not arrays_at:
            return
        if self._held_tensors is None:  # (a decode loop feeds the same held tensors call after call)
            used = [(i, slot[0]) for i, slot in held.items() if slot[0] is not None]
            self._held_tensors = [i for i, _ in used], [t for _, t in used]
        positions, tensors = self._held_tensors
        aliases = self._aliases()
        if aliases is not None:  # one native call: no Python object made for the result's items
            bits = aliases(result, *tensors)
            if not bits:
                return
            doomed = [i for k, i in enumerate(positions) if bits >> k & 1]
        else:
            used = list(zip(positions, tensors))
            pointers = _data_pointers(result)
            doomed = [i for i, t in used if pointers is None or any(
                t.data_ptr() <= p < t.data_ptr() + max(held[i][1].nbytes, 1) for p in pointers)]
        for i in doomed:
            del held[i]
        self._held_tensors = None

    def _aliases(self):
        """The native ``aliases`` check, or None without the library."""
        if self._alias_check is None:
            try:
                self._alias_check = native.load().aliases
            except NativeUnavailable:
                self._alias_check = False
        return self._alias_check or None

    def _into_held_inputs(self, arrays: list, times: list[float] | None, arrays_at=None) -> list:
        if arrays_at is not None and not arrays_at:  # (a decode step fed device tensors: nothing to move)
            return arrays
        tensors, held, clock = list(arrays), self.held, time.perf_counter
        for i in range(len(arrays)) if arrays_at is None else arrays_at:
            a = arrays[i]
            if type(a) is not np.ndarray:
                continue
            t0 = clock()
            tensor, view = held.get(i) or (None, None)
            if view is None or view.shape != a.shape or view.dtype != a.dtype:
                tensor, view = held[i] = _held_input(a, self._device)
                self._held_tensors = None
            if view is None:  # a dtype numpy cannot view in place (bfloat16...): a new tensor
                tensor = tvm_tensor(a, self._device)
            else:
                np.copyto(view, a, casting="no")
            tensors[i] = tensor
            if times is not None:
                times.append((clock() - t0) * 1e6)
        return tensors

    @staticmethod
    def fetch_outputs(result, times: list[float]) -> list[np.ndarray]:
        """The model outputs as numpy arrays (copied from the device), timing each."""
        arrays, clock = [], time.perf_counter
        for tensor in _flatten(result):
            t0 = clock()
            arrays.append(host_array(tensor))
            times.append((clock() - t0) * 1e6)
        return arrays
