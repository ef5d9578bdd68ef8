"""Run stage: the debug executor.

One run of the deployed executable in TVM's Relax VM with an instrument attached.  The VM calls
the instrument before and after every Call instruction::

    instrument(func, symbol, before_run, ret_value, *args)
        ├─ symbol "vm.builtin.*" except the reshape view → ignored (allocation, shape checks)
        ├─ before_run=True   → start the clock; copy arguments that no earlier node produced
        │                      (only for sites whose interior values are wanted)
        └─ before_run=False  → stop the clock; copy the outputs at once — memory planning
                               reuses buffers, so later is too late.  Kernels use
                               destination passing (inputs first, outputs last); a reshape
                               view returns its output as ``ret_value``.

Two instruments implement this call tree and give byte-identical captures:

* **native** (:mod:`tvm_probe.native`): a C++ function built with tvm-ffi, compiled once per
  machine.  It gets a plan per :class:`CapturePlan` (per call site: time only, copy, or hand over
  to a streaming sink) and copies into one byte arena allocated once and reused while nobody
  holds the previous run's arrays; Python runs only before and after the run.  Calls the plan
  does not want cost a symbol lookup and two clock reads.
* **python** (:class:`_Calls`): the same in Python, ~3 us per VM call.  Used where the native
  one cannot be built (no C++ compiler or ninja), for dtypes numpy cannot hold byte for byte, or
  when ``TVM_PROBE_INSTRUMENT=python``.

:attr:`Capture.instrument` and :attr:`DebugExecutor.instrument` say which one ran;
:attr:`DebugExecutor.fallback_reason` says why the Python one was chosen.

Kernel calls are matched to call sites by ``(symbol, occurrence)``, counted the same way as in
:mod:`tvm_probe.kernel_map`; a run that does not call exactly the expected sites raises
:class:`~tvm_probe.errors.TVMBehaviourChanged`.

**Devices.**  On a GPU (any device but the CPU) kernel launches are asynchronous, so both
instruments synchronize the device before and after every kernel call: per-call times are
device times measured by the host clock around a device sync (the sync adds a few microseconds
a call; the model's own run is longer by as much).  Each captured output is copied device → host
once, right after its call, into host memory (the Python instrument: ``Tensor.numpy()``; the
native one: TVM's ``TVMTensorCopyToBytes`` into the arena), with no pinned staging buffers:
whether reused pinned buffers are faster has not been measured.  The native instrument is used
on GPUs only when asked for (``TVM_PROBE_INSTRUMENT=native``) until ``bench/gpu_check.py`` has
shown it byte-identical to the Python one there.  Without a device the executable still builds
and the probe maps it; the VM is made at the first run, which then fails in one line.

**Remote devices** (``remote=``, see :mod:`tvm_probe.remote`): the VM runs in a TVM RPC server's
process and is instrumented by name with a session of the native instrument loaded there; after
the run the client downloads the session's times, stats and arena.  Nothing else changes: the
same plans, the same Capture, byte for byte.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.device import device_type, on_host
from ..core.errors import ProbeError, TVMBehaviourChanged, TVMRunError
from ..diagnose.failures import log_details, run_failure
from .kernel_hook import (HOOK, HookedRun, HookedVM, hookable, host_array, host_copy, registry_settled,
                          symbols_to_hook)
from ..kernel_map import ArgKind, KernelMap, PlaceKind
from . import native
from .native import CALLED, COPIED_BYTES, COPY, EMIT, STOPPED, UNEXPECTED, NativeUnavailable

log = logging.getLogger(__name__)

NATIVE, PYTHON = "native", "python"
#: Environment variable choosing the instrument: ``auto`` (default: native when it can be
#: built), ``native`` (fail when it cannot) or ``python``.
INSTRUMENT_ENV = "TVM_PROBE_INSTRUMENT"
_CHOICES = ("auto", NATIVE, PYTHON)
_MAX_PLANS = 16  # native plans kept per executor (one per distinct CapturePlan)


@dataclass(frozen=True)
class CapturePlan:
    """What one run copies.  ``outputs=None`` means every node's outputs."""

    outputs: frozenset[int] | None = None
    untracked_inputs: frozenset[int] = frozenset()

    def wants_output(self, node: int) -> bool:
        return self.outputs is None or node in self.outputs


class CapturePlanner:
    """What a run must copy to serve the values it is asked for (``run(capture=...)``).

    ``"all"``: every node output (and the untracked inputs of every fused site that keeps a
    source value inside); ``None``: nothing; names or patterns: the outputs of the nodes holding
    those values, or the inputs of the fused kernels that keep them inside.  Fixed per probe, so
    each selection is planned once (on a 300-kernel model planning took longer than the run).
    """

    def __init__(self, kernel_map: KernelMap, names):
        self._km, self._names = kernel_map, names
        self._untracked_all = frozenset(s.index for s in kernel_map.sites
                                        if s.group and any(a.kind is ArgKind.UNTRACKED for a in s.args))
        self._selections: dict[tuple[str, ...], tuple[CapturePlan, set[str]]] = {}
        self._any_interior = any(p.kind is PlaceKind.INTERIOR for p in kernel_map.places.values())
        self._everything = CapturePlan(outputs=None, untracked_inputs=self._untracked_all), None
        self._nothing = CapturePlan(outputs=frozenset()), frozenset()

    def plan(self, capture) -> tuple[CapturePlan, set[str] | None]:
        """The plan, and the keys asked for (None: everything).  The same plan object for the
        same selection (executors key what they prepare by it)."""
        if capture is None:
            return self._nothing
        if capture == "all":
            return self._everything
        patterns = (capture,) if isinstance(capture, str) else tuple(capture)
        if patterns not in self._selections:
            self._selections[patterns] = self._select(patterns)
        return self._selections[patterns]

    def recomputes(self, wanted: set[str] | None) -> bool:
        """Whether serving ``wanted`` (None: every value) recomputes values kept inside kernels."""
        if wanted is None:
            return self._any_interior
        places = self._km.places
        return any(k in places and places[k].kind is PlaceKind.INTERIOR for k in wanted)

    def _select(self, patterns: tuple[str, ...]) -> tuple[CapturePlan, set[str]]:
        km = self._km
        wanted = {k for p in patterns for k in self._names.match(p)}
        outputs, untracked = set(), set()
        for key in wanted:
            place = km.places.get(key)
            if place is None:
                continue
            if place.kind is PlaceKind.OUTPUT:
                outputs.add(place.site)
            elif place.kind is PlaceKind.INTERIOR:
                site = km.sites[place.site]
                outputs |= {a.node for a in site.args if a.kind is ArgKind.NODE}
                if site.index in self._untracked_all:
                    untracked.add(site.index)
        return CapturePlan(outputs=frozenset(outputs), untracked_inputs=frozenset(untracked)), wanted


@dataclass
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
    #: native hooks' times not yet made into the dicts: (site indices, [starts, durations] array)
    timing: tuple | None = None

    def kernel_times(self) -> tuple[dict[int, float], dict[int, float]]:
        """``(start_us, time_us)`` by call site (made from the hooks' times when first asked:
        a small model's run cannot afford two dicts it may never need)."""
        if self.timing is not None:
            sites, table = self.timing
            starts, durations = table.tolist()
            self.start_us, self.time_us = dict(zip(sites, starts)), dict(zip(sites, durations))
            self.timing = None
        return self.start_us, self.time_us


class _NothingObserved:
    """The per-run state of a run through a VM with no kernel hooked: nothing to do."""

    def reraise(self) -> None:
        return None

    def finish(self) -> None:
        return None

    @staticmethod
    def call(function, args: list):
        return function(*args)


_NOTHING_OBSERVED = _NothingObserved()


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


def tvm_tensor(array: np.ndarray, device):
    """``array`` copied into a new tensor on ``device``."""
    import tvm

    return tvm.runtime.tensor(array, device)


def _data_pointers(value) -> list[int] | None:
    """The data pointers of the tensors in a VM function's result (tensors, shapes, tuples of
    them); None when it holds anything else (an object whose references cannot be seen)."""
    if hasattr(value, "data_ptr"):
        return [value.data_ptr()]
    if type(value).__name__ == "Shape" or isinstance(value, (int, float, str)) or value is None:
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


def _flatten(value) -> list:
    if hasattr(value, "numpy"):
        return [value]
    return [a for item in value for a in _flatten(item)]


class DebugExecutor:
    """Runs a built model once per :meth:`run`, capturing what a :class:`CapturePlan` asks for.

    The executable is the one the user deploys; the executor only attaches an instrument.

    Args:
        built: the compiled model (:class:`~tvm_probe.build.BuiltModel`).
        kernel_map: its call sites.
        instrument: ``"auto"``, ``"native"`` or ``"python"``; defaults to ``$TVM_PROBE_INSTRUMENT``
            or ``"auto"`` (native when it can be built here, else Python).
        sources: the model's SourceMap, to name the ops of a kernel that fails while running.
        remote: run on a remote device over TVM RPC (anything :func:`tvm_probe.remote.connect`
            takes); the executable is uploaded now.
        sync: synchronize the device around every kernel call (device times); defaults to True
            on any device but the CPU.
        function: the VM function to run (multi-function executables: one executor per
            function, all sharing one VM, see :meth:`share_vm`).  Defaults to ``"main"``.
    """

    def __init__(self, built, kernel_map: KernelMap, instrument: str | None = None, sources=None,
                 remote=None, sync: bool | None = None, function: str = "main"):
        self.function = function
        self.kernel_map = self._km = kernel_map
        self.sources = sources
        self._built = built
        self.remote = None
        choice = instrument or os.environ.get(INSTRUMENT_ENV) or "auto"
        if remote is not None:
            from .remote import RemoteRuntime

            self._check_remote(choice, explicit=instrument is not None)  # before uploading anything
            self.remote = RemoteRuntime(built, remote)
        self._device = self.remote.device if self.remote is not None else built.device
        self.sync = not on_host(self._device) if sync is None else bool(sync)
        self._vm = None  # made at the first run: building for a GPU needs no GPU, running does
        self._main = None  # its "main"
        self._installed = None  # the instrument the VM holds now
        self.instrument, self.fallback_reason = PYTHON, None
        self._native: _NativeExecutor | None = None
        # runs observing a few kernels go through a VM hooking only those (see run())
        self._hooked: dict[frozenset[str], HookedVM] = {}
        self._hook_of: dict[CapturePlan, HookedVM | None] = {}  # per plan: its hooked VM, or None
        self.fast_calls: dict[CapturePlan, FastCall] = {}  # raw runs of a plan, once one succeeded hooked
        self._hook_allowed = choice == "auto" and hookable(kernel_map)
        self._validated = False  # an instrumented run checked the call sequence
        self._hook_native = None  # _native_hooks(): None until asked, False when unavailable
        self._held_inputs: dict[int, tuple] = {}
        self._alias_check = None  # _aliases(): None until asked, False without the library  # input position → (tensor, numpy view): to_device(reuse=True)
        if self.remote is not None:
            self._native = _NativeExecutor(self._km, library=self.remote.library, sync_device=self._sync_device())
            self._generation = self.remote.generation  # the connection the sessions were opened on
            self.instrument = NATIVE
        else:
            self._choose(choice, explicit=instrument is not None)

    def _choose(self, choice: str, explicit: bool) -> None:
        """Set up the instrument ``choice`` names; on "auto", say why when it is not native."""
        self._check_choice(choice, explicit)
        if choice == PYTHON:
            return
        reason = self._native_impossible()
        if reason:
            self.fallback_reason = reason
            if choice == NATIVE:
                raise ProbeError(f"the native instrument is unavailable: {self.fallback_reason}")
            return
        if choice == "auto" and not on_host(self._device):
            # the native device-to-host copy (TVM's TVMTensorCopyToBytes, as Tensor.numpy()
            # uses) and sync have not been checked on a GPU yet (bench/gpu_check.py does):
            # opt in with TVM_PROBE_INSTRUMENT=native
            self.fallback_reason = (f"the native instrument is used on {self._device_kind()} only when "
                                    f"{INSTRUMENT_ENV}=native")
            return
        try:
            self._native = _NativeExecutor(self._km, sync_device=self._sync_device())
        except NativeUnavailable as err:
            if choice == NATIVE:
                raise ProbeError(f"the native instrument is unavailable: {err}; set {INSTRUMENT_ENV}="
                                 "auto or python to use the Python instrument") from None
            self.fallback_reason = str(err)
            log.info("native instrument unavailable (%s): using the Python instrument", err)
            return
        self.instrument = NATIVE

    @staticmethod
    def _check_choice(choice: str, explicit: bool) -> None:
        if choice not in _CHOICES:
            raise ProbeError(f"instrument must be one of {', '.join(_CHOICES)}, got {choice!r} "
                             f"(from {'the argument' if explicit else INSTRUMENT_ENV})")

    def _native_impossible(self) -> str | None:
        """Why this model cannot be captured by the native instrument (None: it can)."""
        static = not any(isinstance(d, str) for s in self._km.sites for shape in s.out_shapes for d in shape)
        if static and self._km.helper_symbols and set(self._km.helper_symbols) <= set(self._km.fixed_helpers):
            return None  # helpers called a fixed number of times: the plan times them as sites of their own
        if static and self._km.helper_symbols:
            # kernels called inside If branches (kernel_map.BranchCalls): the native plan
            # knows call sites only
            return "the model calls kernels inside If branches: the native instrument knows call sites only"
        if self._km.helper_symbols or any(isinstance(d, str) for s in self._km.sites for shape in s.out_shapes
                                          for d in shape):
            # symbolic shapes: outputs change size from run to run, and lowering adds kernels
            # (shape functions) the native plan does not know
            return "the model has symbolic shapes: the native instrument needs static ones"
        return None

    def _check_remote(self, choice: str, explicit: bool) -> None:
        """A remote VM can only be instrumented by the native instrument in the server's process."""
        self._check_choice(choice, explicit)
        if choice == PYTHON:
            raise ProbeError("a Python instrument cannot run on a remote device (TVM RPC cannot call back into "
                             f"this process): unset {INSTRUMENT_ENV} to use the native one, loaded by the server")
        reason = self._native_impossible()
        if reason:
            raise ProbeError(f"cannot capture on a remote device: {reason}")

    def _device_kind(self) -> str:
        return str(self._built.target.kind.name).upper()

    def _sync_device(self) -> tuple[int, int] | None:
        """``(DLPack type, index)`` of the device the native instrument syncs, or None."""
        return (device_type(self._device), self._device.index) if self.sync else None

    @property
    def vm(self):
        """The Relax VM (made on first use; the remote one when running remotely)."""
        if self.remote is not None:
            return self.remote.vm
        if self._vm is None:
            self._vm = self._make_vm()
        return self._vm

    def _make_vm(self):
        from tvm import relax

        if not self._device.exist:
            raise TVMRunError(f"no {self._device_kind()} device here ({self._device} does not exist): the model "
                              f"was built for {self._device_kind()}; run it on a machine that has one, or on a "
                              "remote device with remote=...")
        with registry_settled():
            return relax.VirtualMachine(self._built.executable, self._device)

    def to_device(self, arrays: list[np.ndarray], times: list[float] | None = None, reuse: bool = False,
                  arrays_at=None):
        """``arrays`` on the executor's device (``times`` gets the microseconds each took).

        ``reuse``: on the host, copy them into tensors this executor made once per input
        position (``tvm.runtime.tensor`` costs ~15 us an array, a copy into memory made once
        ~0.3 us); a result handed over as it is gives up the tensors it may refer to
        (:meth:`_give_up_aliased`).  ``arrays_at``: the only positions that may hold numpy arrays.
        """
        import tvm

        if reuse and self.remote is None and on_host(self._device):
            return self._into_held_inputs(arrays, times, arrays_at)
        tensors = []
        for a in arrays:
            t0 = time.perf_counter()
            if not isinstance(a, np.ndarray):  # a VM object, shape, tuple or device tensor: as it is
                tensors.append(a)
                continue
            tensors.append(self.remote.to_device(a) if self.remote is not None else tvm.runtime.tensor(a, self._device))
            if times is not None:
                times.append((time.perf_counter() - t0) * 1e6)
        return tensors

    def _keep_result(self, capture: Capture, result, raw: bool, arrays_at=None) -> None:
        """The function's result in ``capture``: as it is (``raw``), or copied out as numpy."""
        if raw:
            capture.returned = result
            self._give_up_aliased(result, arrays_at)
        else:
            capture.result = self._fetch_outputs(result, capture.output_us)

    def _give_up_aliased(self, result, arrays_at=None) -> None:
        """A result handed to the caller as it is (``raw``) must not share memory with an input
        tensor the next run writes into: each held input it may refer to is given up (made
        anew by the next run).  A result holding an object that cannot be looked into (a KV
        cache) may refer to any of them.  (``arrays_at``: the positions this run fed from held
        tensors, when known.)"""
        held = self._held_inputs
        if not held or arrays_at is not None and not arrays_at:
            return
        used = [(i, slot[0]) for i, slot in held.items() if slot[0] is not None]
        aliases = self._aliases()
        if aliases is not None:  # one native call: no Python object made for the result's items
            bits = int(aliases(result, *(t for _, t in used)))
            doomed = [i for k, (i, _) in enumerate(used) if bits >> k & 1]
        else:
            pointers = _data_pointers(result)
            doomed = [i for i, t in used if pointers is None or any(
                t.data_ptr() <= p < t.data_ptr() + max(held[i][1].nbytes, 1) for p in pointers)]
        for i in doomed:
            del held[i]

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
        tensors, held, clock = list(arrays), self._held_inputs, time.perf_counter
        for i in range(len(arrays)) if arrays_at is None else arrays_at:
            a = arrays[i]
            if type(a) is not np.ndarray:
                continue
            t0 = clock()
            tensor, view = held.get(i) or (None, None)
            if view is None or view.shape != a.shape or view.dtype != a.dtype:
                tensor, view = held[i] = _held_input(a, self._device)
            if view is None:  # a dtype numpy cannot view in place (bfloat16...): a new tensor
                tensor = tvm_tensor(a, self._device)
            else:
                np.copyto(view, a, casting="no")
            tensors[i] = tensor
            if times is not None:
                times.append((clock() - t0) * 1e6)
        return tensors

    def recomputer(self, groups=()):
        """What recomputes values kept inside fused kernels (of ``groups``): on this executor's
        device, local or remote."""
        if self.remote is not None:
            from .remote import RemoteRecomputer

            return RemoteRecomputer(self._built.target, self.remote, groups)
        from .recompute import Recomputer

        return Recomputer(self._built.target, groups)

    def run(self, inputs: list[np.ndarray], plan: CapturePlan, sink=None, raw: bool = False,
            kernel_times: bool | None = None, observer=None, arrays_at=None) -> Capture:
        """Run once; return what ``plan`` asked to copy.

        A probe's first run goes through TVM's instrument: it checks every kernel call against
        the kernel map (and times each).  Later runs go through a VM whose observed kernels are
        hooks (:mod:`tvm_probe.kernel_hook`): none with nothing to copy, the wanted kernels'
        symbols for a selection, every kernel for ``"all"`` or ``kernel_times=True`` (then every
        call is timed; a selection is not timed).  With the native library the hooks are C++
        and any capture goes through them; without it a few kernels are wrapped in Python and
        larger captures use the instrument.  ``observer``, a user's
        :class:`~tvm_probe.instrument.Instrument`, is called around every kernel call (the Python
        instrument runs then).

        ``sink(node, outputs)``, when given, receives each copied node's outputs instead of the
        returned Capture (so they can go to disk at once and not accumulate in memory).
        With ``raw``, ``inputs`` may hold anything the VM function takes (arrays are copied to
        the device, the rest passed as is; ``arrays_at``, when given, lists the positions that
        may hold numpy arrays) and the function's result is kept as it is
        (:attr:`Capture.returned`), not copied to numpy.

        Raises:
            TVMRunError: the VM raised; the error names the kernel call it was running and its
                source ops (``err.failure``), with TVM's message.
            RemoteError: the remote device was lost (a TVMRunError: nothing of the run is kept).
        """
        # (not for a streamed run: a hooked run that fails is run again, and its copies went out)
        hooked = self._hooked_vm(plan, every=bool(kernel_times)) if observer is None and sink is None else None
        if hooked is not None:
            return self._run_hooked(hooked, inputs, plan, raw, arrays_at, timed=plan.outputs is None or bool(kernel_times))
        return self._run_instrumented(inputs, plan, sink, raw, observer)

    def _run_instrumented(self, inputs: list, plan: CapturePlan, sink, raw: bool, observer) -> Capture:
        """:meth:`run` through TVM's instrument: every VM call seen, every kernel call timed."""
        self._prepare()
        capture = Capture(inputs=inputs, instrument=self.instrument if observer is None else PYTHON)
        if self._native is not None and observer is None:
            calls = self._native.calls(self, plan, capture, sink)
        else:
            calls = _Calls(self, capture, plan, sink, observer)
        try:
            device_inputs = self.to_device(inputs, capture.input_us, reuse=observer is None)
            with calls:
                t0 = time.perf_counter()
                result = self.remote.call(device_inputs) if self.remote is not None else self._main(*device_inputs)
                if self.sync and self.remote is None:  # (remotely the instrument synced after the last kernel)
                    self._device.sync()
                capture.total_us = (time.perf_counter() - t0) * 1e6
            self._keep_result(capture, result, raw)
            calls.fetch()
        except Exception as err:
            self._raise_failure(err, calls)
        calls.finish()
        self._validated = True
        return capture

    def _hooked_vm(self, plan: CapturePlan, every: bool = False):
        """The VM that observes only the kernels ``plan`` needs (``every``: all kernels, each
        call timed), or None: the run needs TVM's instrument (see :meth:`run`)."""
        if not self._hook_allowed or not self._validated:
            return None
        key = (plan, every)
        if key in self._hook_of:
            return self._hook_of[key]
        hooks = self._native_hooks()
        native = hooks is not None
        symbols = (symbols_to_hook(self._km, plan, native=native, every=every)
                   if self.remote is None and on_host(self._device) else None)
        if symbols is not None and symbols not in self._hooked:
            if len(self._hooked) >= _MAX_PLANS:
                self._forget_hooks()
            all_symbols = ({s.symbol for s in self._km.sites if not s.is_view} | set(self._km.helper_symbols)
                           | self._other_kernels())
            try:
                self._hooked[symbols] = HookedVM(self._built.executable, self._device, all_symbols, symbols,
                                                 self._km, switch=hooks.switch() if native else None)
            except LookupError as err:  # a kernel the library does not have under its name
                log.info("runs observing few kernels use the instrument: %s", err)
                self._hook_allowed = False
                return None
        self._hook_of[key] = self._hooked.get(symbols) if symbols is not None else None
        return self._hook_of[key]

    def _native_hooks(self) -> "_NativeExecutor | None":
        """What native hooks report to: the native instrument's executor; for a model it cannot
        instrument (symbolic shapes), one whose plans hand the wanted outputs to Python as they
        are produced (no arena: their sizes change from run to run); None without the library."""
        if self._native is not None:
            return self._native
        if self._hook_native is None:
            try:
                self._hook_native = _NativeExecutor(self._km, emit_only=True)
            except NativeUnavailable as err:
                log.info("kernel hooks in Python: %s", err)
                self._hook_native = False
        return self._hook_native or None

    def _other_kernels(self) -> set[str]:
        """Kernels of the executable's other functions (a multi-function executable): the VM
        resolves every function's kernels when it is made, so a hooked VM must register them too."""
        whole = getattr(self._built.snapshots, "whole_final", None)
        if whole is None:
            return set()
        return {gv.name_hint for gv, f in whole.functions.items() if type(f).__name__ == "PrimFunc"}

    def _run_hooked(self, vm: HookedVM, inputs, plan: CapturePlan, raw: bool, arrays_at=None,
                    timed: bool = True) -> Capture:
        capture = Capture(inputs=inputs, instrument=HOOK)
        run = (_NOTHING_OBSERVED if not vm.hooked else HookedRun(vm, plan, capture) if vm.switch is None
               else _HookedNativeCalls(self, plan, capture, vm, timed))
        device_inputs = self.to_device(inputs, capture.input_us, reuse=True, arrays_at=arrays_at)
        try:
            t0 = time.perf_counter()
            result = run.call(vm[self.function], device_inputs)
            capture.total_us = (time.perf_counter() - t0) * 1e6
            run.reraise()
            self._keep_result(capture, result, raw, arrays_at)
            run.finish()
        except KeyboardInterrupt:
            raise
        except Exception as err:
            return self._hooked_run_failed(err, inputs, plan, raw)
        return capture

    def _hooked_run_failed(self, err: Exception, inputs, plan: CapturePlan, raw: bool) -> Capture:
        """After a hooked run raised ``err`` or saw other kernel calls than the kernel map has:
        the same run through the instrument, which names the failing kernel and checks every
        call (later runs keep to the instrument when the calls differed).

        A raw call that saw other calls but finished may have changed what it was given as it is
        (a KV cache, a tensor a kernel writes in place): it is not repeated, since a second run
        would change it again.
        """
        log.info("a run through hooked kernels failed (%s): running it through the instrument", err)
        self._forget_hooks()
        if isinstance(err, TVMBehaviourChanged):
            self._hook_allowed = False
            if raw and not all(isinstance(a, np.ndarray) for a in inputs):
                raise TVMBehaviourChanged(f"{err}; the call changed its state arguments (such as a KV cache), so it "
                                          "is not repeated: its values are not served, later calls use TVM's "
                                          "instrument") from None
        return self._run_instrumented(inputs, plan, None, raw, None)

    def _forget_hooks(self) -> None:
        self._hooked.clear()
        self._hook_of.clear()
        self.fast_calls.clear()

    def fast_call(self, plan: CapturePlan) -> "FastCall | None":
        """What later raw runs of ``plan`` (no kernel times) may go through once a hooked run of
        it succeeded: a :class:`FastCall`, or None when the run needs Python during the run
        (outputs handed over as they come) or the VM is not hooked natively."""
        vm = self._hook_of.get((plan, False))
        if vm is None or (vm.hooked and vm.switch is None):
            return None
        prepared = vm.prepared.get(plan) if vm.hooked else None
        if vm.hooked and (prepared is None or prepared.streaming or prepared.untracked and not prepared.callbacks):
            return None  # (no session prepared: the hooks would report to nothing)
        self.fast_calls[plan] = FastCall(self, vm, plan, prepared)
        return self.fast_calls[plan]

    def _prepare(self) -> None:
        """The VM is ready: made (first run), or reconnected after a lost remote run."""
        if self.remote is not None:
            if self.remote.lost:
                self.remote.reconnect()
            if self._generation != self.remote.generation:  # sessions of a lost connection are gone
                self._native = _NativeExecutor(self._km, library=self.remote.library,
                                               sync_device=self._sync_device())
                self._generation, self._installed = self.remote.generation, None
        if self.remote is None and self._main is None:
            self._main = self.vm[self.function]

    def share_vm(self, other: "DebugExecutor") -> None:
        """Run in ``other``'s VM (one VM for all functions of an executable: objects such as a
        KV cache made by one function are used by the next).  The VM holds one instrument at a
        time, so whoever runs next installs its own (:meth:`forget_instrument`)."""
        self._vm = other.vm

    def forget_instrument(self) -> None:
        """The VM's instrument may be another executor's now: install ours at the next run."""
        self._installed = None

    @staticmethod
    def _fetch_outputs(result, times: list[float]) -> list[np.ndarray]:
        """The model outputs as numpy arrays (copied from the device), timing each."""
        arrays, clock = [], time.perf_counter
        for tensor in _flatten(result):
            t0 = clock()
            arrays.append(host_array(tensor))
            times.append((clock() - t0) * 1e6)
        return arrays

    def _raise_failure(self, err: Exception, calls) -> None:
        """Raise the one-line error for a run that raised ``err``."""
        if self.remote is not None:
            lost = self.remote.failure(err)
            if lost is not None:
                raise lost from None
        # TVM turns an exception raised in the hook (a full disk while streaming, Ctrl-C)
        # into a bare RuntimeError: re-raise the original.
        calls.reraise()
        if isinstance(err, ProbeError):  # ours already (a remote download that failed): one line
            raise err from None
        site, certain = calls.running_site()
        error = run_failure(err, self._km, site, self.sources, finished=not certain)
        log_details(error)
        raise error from None

    def install(self, instrument, key=None) -> None:
        """Give the VM ``instrument`` (a function, or ``(factory name, *args)`` to have the VM's
        own process make it), unless it holds the one named ``key`` already (a ``key`` of None
        always installs: the Python hook is new each run)."""
        if key is None or self._installed != key:
            if isinstance(instrument, tuple):
                self.vm.module["set_instrument"](*instrument)
            else:
                self.vm.set_instrument(instrument)
            self._installed = key


def _behaviour_changed(unexpected: list[str], missing) -> TVMBehaviourChanged:
    return TVMBehaviourChanged(
        "the VM's kernel calls differ from the compiled module's call sites "
        f"(unexpected: {unexpected[:5]}, never called: "
        f"{[f'{s.symbol}#{s.occurrence}' for s in missing[:5]]}); "
        "this TVM version behaves differently from the ones tvm_probe supports")


# ------------------------------------------------------------------------------------- python
def _continue(*_args) -> int:
    return 0


class _Calls:
    """State of one run under the Python instrument (occurrence counters, clock).

    The hook runs twice per VM instruction, so it does as little as it can: one dict lookup
    decides whether a call is a kernel at all.  ``with calls:`` wraps the VM run.
    """

    def __init__(self, executor: DebugExecutor, capture: Capture, plan: CapturePlan, sink=None, observer=None):
        km = executor.kernel_map
        self.observer = observer
        if observer is not None:
            observer.reset()
        self.executor, self.capture, self.plan = executor, capture, plan
        self.store = sink or capture.outputs.__setitem__
        self.sites_of: dict[str, list] = {}  # symbol → its sites by occurrence (None: a call inside an If)
        for site in km.sites:
            self.sites_of.setdefault(site.symbol, []).append(site)
        branches = km.branches
        if branches is not None and branches.occurrences:
            for symbol in set(self.sites_of) | set(branches.occurrences):
                inside = branches.occurrences.get(symbol, ())
                by_occurrence = [None] * (len(self.sites_of.get(symbol, ())) + len(inside))
                for site in self.sites_of.get(symbol, ()):
                    by_occurrence[site.occurrence] = site
                self.sites_of[symbol] = by_occurrence
        self.open_symbols = branches.open_symbols if branches is not None else set()
        self.km = km
        self.seen: dict[str, int] = dict.fromkeys(self.sites_of, 0)
        self.called: set[int] = set()
        self.sync = executor._device.sync if executor.sync else None  # device times: see the module doc
        self.t_start = time.perf_counter()
        self.t_call = 0.0
        self.unexpected: list[str] = []
        self.failure: BaseException | None = None
        self.interrupted = False
        self._previous_handler = None
        self.running: int | None = None  # the site whose call began and has not returned

    def __enter__(self) -> "_Calls":
        """Install the hook and defer Ctrl-C.

        Python delivers SIGINT wherever it next runs bytecode — inside the VM that is the hook,
        where TVM would wrap the KeyboardInterrupt into a RuntimeError.  So the handler only
        sets a flag; the hook sees it and stops the run, and the interrupt is raised on exit.
        """
        self.executor.install(self.guarded_hook)
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job stays deaf
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        self.t_start = time.perf_counter()
        return self

    def _on_sigint(self, *_args) -> None:
        self.interrupted = True

    def __exit__(self, exc_type, *_exc) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
        self.executor.install(_continue, key=PYTHON)  # the VM keeps a no-op, not our state
        if exc_type is None and self.interrupted:
            raise KeyboardInterrupt

    def reraise(self) -> None:
        if self.failure is not None:
            raise self.failure from None

    def fetch(self) -> None:
        """Nothing to bring back: the hook stored every copy during the run."""

    def running_site(self) -> tuple[int | None, bool]:
        """The call site the VM was running when it raised, and True: the hook knows it."""
        return self.running, True

    def guarded_hook(self, *args):
        try:
            if self.interrupted:
                raise KeyboardInterrupt
            return self.hook(*args)
        except BaseException as err:
            self.failure = err
            raise

    def hook(self, func, symbol, before_run, ret_value, *args):
        sites = self.sites_of.get(symbol)
        if sites is None:
            if before_run and not symbol.startswith("vm.builtin.") and symbol not in self.km.helper_symbols:
                self.unexpected.append(str(symbol))
            return 0
        if before_run:
            occurrence = self.seen[symbol]
            self.seen[symbol] = occurrence + 1
            if occurrence >= len(sites):  # a view too: those before it would be matched wrongly
                if symbol not in self.open_symbols:  # (calls after an If that unbalances them match nothing)
                    self.unexpected.append(f"{symbol}#{occurrence}")
                return 0
            site = sites[occurrence]
            if site is None:  # a call inside an If branch: no call site
                return 0
            if site.index in self.plan.untracked_inputs:
                self.capture.untracked_inputs[site.index] = {
                    j: host_copy(args[j]) for j, a in enumerate(site.args) if a.kind == ArgKind.UNTRACKED}
            self.running = site.index
            if self.observer is not None:
                self.observer.before_call(self._kernel_call(site, args))
            if self.sync is not None:
                self.sync()  # what was launched before is not this call's time
            self.t_call = time.perf_counter()
            return 0
        if self.sync is not None:
            self.sync()  # the kernel itself, not its launch
        t_end = time.perf_counter()
        self.running = None
        occurrence = self.seen[symbol] - 1
        if occurrence >= len(sites) or sites[occurrence] is None:
            return 0
        site = sites[occurrence]
        self.capture.time_us[site.index] = (t_end - self.t_call) * 1e6
        self.capture.start_us[site.index] = (self.t_call - self.t_start) * 1e6
        self.called.add(site.index)
        if self.plan.wants_output(site.index) or self.observer is not None:
            outs = [ret_value] if site.is_view else args[site.num_inputs: site.num_inputs + site.num_outputs]
            if self.plan.wants_output(site.index):
                self.store(site.index, [host_array(o) for o in outs])
            if self.observer is not None:
                self.observer.after_call(self._kernel_call(site, args, list(outs), self.capture.time_us[site.index]))
        return 0

    def _kernel_call(self, site, args, outputs=(), time_us=None):
        """What a user's instrument sees of a call (see :mod:`tvm_probe.instrument`)."""
        from .instrument import KernelCall

        sources = self.executor.sources
        name = (lambda k: sources[k].display_name) if sources is not None else str
        return KernelCall(site=site.index, symbol=site.symbol, occurrence=site.occurrence,
                          names=[[name(k) for k in keys] for keys in site.output_keys],
                          interior=[name(k) for k in site.interior_keys],
                          inputs=list(args[: site.num_inputs]) if not site.is_view else list(args),
                          outputs=list(outputs), time_us=time_us)

    def finish(self) -> None:
        missing = [s for s in self.km.sites if s.index not in self.called and not s.is_view]
        if self.unexpected or missing:
            raise _behaviour_changed(self.unexpected, missing)


# ------------------------------------------------------------------------------------- native
class _NativeExecutor:
    """The native instrument for one kernel map: plans per CapturePlan, sessions kept warm.

    Args:
        km: the kernel map.
        library: where sessions are opened: this process (default) or a remote server
            (:class:`tvm_probe.remote.RemoteLibrary`).
        sync_device: ``(DLPack type, index)`` of a device to sync around every kernel call.
    """

    def __init__(self, km: KernelMap, library=None, sync_device: tuple[int, int] | None = None,
                 emit_only: bool = False):
        self._lib = library if library is not None else native.load()
        self._km = km
        self._sync_device = sync_device
        self.emit_only = emit_only  # wanted outputs always go to Python as produced (symbolic shapes)
        # every output dtype must have a byte-exact numpy form, or no plan could copy it
        self._dtypes = {d: native.numpy_dtype(d) for s in km.sites for d in s.out_dtypes}
        self._plans: dict[tuple[CapturePlan, bool], _NativePlan] = {}
        self.plan(CapturePlan(), streaming=False)  # fail here, not in the first run

    def calls(self, executor: DebugExecutor, plan: CapturePlan, capture: Capture, sink) -> "_NativeCalls":
        # a library that cannot call back (remote) copies into its arena; the sink gets the
        # copies once they are downloaded
        streaming = sink is not None and self._lib.can_call_back
        return _NativeCalls(executor, self.plan(plan, streaming), capture, sink)

    def switch(self):
        """A switch for the native hooks of one VM (:class:`tvm_probe.native.HookSwitch`)."""
        return self._lib.switch()

    def plan(self, plan: CapturePlan, streaming: bool = False) -> "_NativePlan":
        """``plan`` as a native session (made once, kept)."""
        streaming = streaming or self.emit_only
        key = (plan, streaming)
        prepared = self._plans.get(key)
        if prepared is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))  # the oldest; its session closes
            prepared = self._plans[key] = _NativePlan(self._lib, self._km, plan, streaming, self._dtypes,
                                                      self._sync_device)
        return prepared


class _NativePlan:
    """One CapturePlan as a native session: arena layout, arenas, how to read a run back."""

    _POOL = 2  # arenas kept: the one the last run's Capture holds, and one to fill
    _CHUNK = 1 << 20  # arenas of at most _CUT_BELOW bytes are cut from chunks of this size
    _CUT_BELOW = _CHUNK // 16

    def __init__(self, lib, km: KernelMap, plan: CapturePlan, streaming: bool, dtypes: dict,
                 sync_device: tuple[int, int] | None = None):
        sites, offset = [], 0
        self.slots: dict[int, tuple] = {}           # site → arena slots of its outputs
        self.untracked: dict[int, tuple[int, ...]] = {}
        for s in km.sites:
            action = 0 if not plan.wants_output(s.index) else EMIT if streaming else COPY
            if action == COPY:
                slots, offset = native.layout(list(zip(s.out_shapes, s.out_dtypes)), offset)
                self.slots[s.index] = tuple(slots)
            else:  # shapes are only checked where copied; the count tells how many outputs
                slots = [native.Slot(-1, 0, d, tuple(shape)) for shape, d in zip(s.out_shapes, s.out_dtypes)]
            if s.index in plan.untracked_inputs:
                self.untracked[s.index] = tuple(j for j, a in enumerate(s.args) if a.kind == ArgKind.UNTRACKED)
            sites.append(native.NativeSite(s.symbol, s.is_view, s.num_inputs, action,
                                           self.untracked.get(s.index, ()), tuple(slots)))
        # helpers lowering added, called a fixed number of times a run (kernel_map.fixed_helpers):
        # sites of the plan after the map's own, timed only, so that the instrument expects them
        for symbol, count in getattr(km, "fixed_helpers", {}).items():
            sites += [native.NativeSite(symbol, False, 0)] * count
        self.num_native_sites = len(sites)
        self.session = lib.open(native.encode_plan(sites, offset, sync_device=sync_device))
        self.instrument = self.session.instrument()
        self.own_arena = not lib.can_call_back  # remote: the session's own arena, downloaded
        self.callbacks, self.streaming = lib.can_call_back, streaming
        self.arena_bytes, self.dtypes = offset, dtypes
        self.sites = km.sites
        self.copied_sites = sorted(self.slots)
        self._arenas: list[np.ndarray] = []
        self._free_refs: list[int] = []  # each arena's reference count when nothing else holds it
        self._addresses: list[int] = []
        self._chunk, self._chunk_address, self._chunk_bytes, self._cut_at = None, 0, 0, 0  # small arenas

    def arena(self) -> tuple[np.ndarray | None, int]:
        """An arena no Capture or array of an earlier run still uses (so reusing it overwrites
        nothing anyone can read), and its address; a new one when all are held.  Reused memory
        is already paged in, which is what lets copies run at memcpy speed.  (None, 0) when
        nothing is copied, or when the session copies into an arena of its own (remote)."""
        if not self.arena_bytes or self.own_arena:
            return None, 0
        for i in range(len(self._arenas)):
            if _references(self._arenas[i]) == self._free_refs[i]:
                return self._arenas[i], self._addresses[i]
        if len(self._arenas) == self._POOL:  # all held (calls keep their captures): a one-off
            if self.arena_bytes <= self._CUT_BELOW:
                return self._cut()
            fresh = np.empty(self.arena_bytes, dtype=np.uint8)
            return fresh, fresh.__array_interface__["data"][0]
        self._arenas.append(np.empty(self.arena_bytes, dtype=np.uint8))
        self._free_refs.append(_references(self._arenas[-1]))  # held by the pool alone
        self._addresses.append(self._arenas[-1].__array_interface__["data"][0])
        return self._arenas[-1], self._addresses[-1]

    def untracked_inputs(self, site: int, tensors) -> dict[int, np.ndarray]:
        """The inputs of ``site`` the plan keeps (handed over during a run), on the host, by
        argument position."""
        return dict(zip(self.untracked[site], [host_array(t) for t in tensors]))

    def _cut(self) -> tuple[np.ndarray, int]:
        """A small one-off arena, cut from a chunk of many: a slice, where a new array and its
        address cost microseconds (a decode step that copies one value is that short).  A chunk
        is freed when no arena cut from it is held any more."""
        n = self.arena_bytes
        if self._cut_at + n > self._chunk_bytes:
            chunk = np.empty(self._CHUNK + native.ALIGN, dtype=np.uint8)
            skip = -chunk.__array_interface__["data"][0] % native.ALIGN  # arena offsets assume aligned starts
            self._chunk = chunk[skip:skip + self._CHUNK]
            self._chunk_address = chunk.__array_interface__["data"][0] + skip
            self._chunk_bytes, self._cut_at = self._CHUNK // n * n, 0
        at = self._cut_at
        self._cut_at = at + n
        return self._chunk[at:at + n], self._chunk_address + at


def _references(array: np.ndarray) -> int:
    """``array``'s reference count, measured the same way for the pool and its baseline."""
    return sys.getrefcount(array)


class _NativeCalls:
    """One run under the native instrument: ``with calls:`` wraps the VM run (begin, then read
    the session's buffers back); :meth:`fetch` downloads what a remote session holds;
    :meth:`finish` fills the Capture.

    Ctrl-C needs no deferral here: the instrument lets Python's SIGINT handler run now and then,
    and a KeyboardInterrupt it raises stops the VM and reaches Python as itself.
    """

    def __init__(self, executor: DebugExecutor, prepared: _NativePlan, capture: Capture, sink):
        self.executor, self.prepared, self.capture, self.sink = executor, prepared, capture, sink
        self.failure: BaseException | None = None
        self.arena: np.ndarray | None = None
        self.stats: list[int] = []
        self._events = prepared.callbacks and (sink is not None or bool(prepared.untracked))

    def __enter__(self) -> "_NativeCalls":
        prepared = self.prepared
        self.executor.install(prepared.instrument, key=prepared.session.id)
        self.arena, address = prepared.arena()
        prepared.session.begin(address, self._on_event if self._events else None)
        return self

    def __exit__(self, *_exc) -> None:
        session = self.prepared.session
        session.end()
        self.stats = session.stats.tolist()

    def _on_event(self, kind: int, site: int, *tensors) -> None:
        """Python's part during the run: untracked inputs (0) and streamed outputs (1)."""
        try:
            if kind == 0:
                self.capture.untracked_inputs[site] = self.prepared.untracked_inputs(site, tensors)
            else:
                self.sink(site, [host_array(t) for t in tensors])
        except BaseException as err:
            self.failure = err
            raise

    def running_site(self) -> tuple[int | None, bool]:
        """The first kernel call that did not finish, and False: the instrument times calls when
        they end, so the VM may have raised in a builtin just before that call."""
        durations = self.prepared.session.times[1]
        if len(durations) != self.prepared.num_native_sites:  # a remote session that could not be read
            return None, False
        return next((s.index for s in self.prepared.sites if not s.is_view and durations[s.index] != durations[s.index]),
                    None), False

    def reraise(self) -> None:
        if self.failure is not None:
            raise self.failure from None
        if self.stats and self.stats[STOPPED]:
            raise TVMBehaviourChanged(f"{self.prepared.session.error()}; this TVM version behaves "
                                      "differently from the ones tvm_probe supports") from None

    def fetch(self) -> None:
        """Bring back what the session kept instead of handing it over during the run (a remote
        session: the arena of copied outputs, the untracked inputs); all of it, or an error."""
        prepared, session = self.prepared, self.prepared.session
        if session.times.shape[1] != prepared.num_native_sites:  # a remote session end() could not read
            raise TVMRunError("the capture session's times and counts could not be read back: nothing of this "
                              "run is kept")
        if prepared.own_arena and prepared.arena_bytes:
            self.arena = session.arena()
            got = -1 if self.arena is None else self.arena.nbytes
            if got != prepared.arena_bytes:
                raise TVMRunError(f"the capture session returned {max(got, 0)} bytes of kernel outputs where "
                                  f"{prepared.arena_bytes} were copied: nothing of this run is kept")
        if prepared.untracked and not self._events:
            durations = session.times[1]
            for site, positions in prepared.untracked.items():
                if site < len(durations) and durations[site] == durations[site]:  # called
                    kept = {j: session.kept(site, j) for j in positions}
                    self.capture.untracked_inputs[site] = {j: a for j, a in kept.items() if a is not None}

    def finish(self) -> None:
        prepared, capture, stats = self.prepared, self.capture, self.stats
        starts, durations = prepared.session.times.tolist()
        if stats[CALLED] == len(durations):  # the usual case: dicts made in C
            capture.start_us, capture.time_us = dict(enumerate(starts)), dict(enumerate(durations))
            copied = prepared.slots
        else:
            called = [i for i, d in enumerate(durations) if d == d]  # NaN: not called
            capture.start_us = {i: starts[i] for i in called}
            capture.time_us = {i: durations[i] for i in called}
            copied = {i: prepared.slots[i] for i in prepared.copied_sites if i in capture.time_us}
        capture.copied_bytes = stats[COPIED_BYTES]
        if self.arena is not None:
            capture.outputs = ArenaOutputs(self.arena, copied, prepared.dtypes)
        if stats[UNEXPECTED] or stats[CALLED] < len(durations):
            missing = [s for s in prepared.sites if s.index not in capture.time_us and not s.is_view]
            if stats[UNEXPECTED] or missing:
                raise _behaviour_changed(prepared.session.unexpected(), missing)
        if self.sink is not None and not prepared.streaming:  # downloaded, now handed over in order
            for site in copied:
                self.sink(site, capture.outputs[site])



class _HookedNativeCalls(_NativeCalls):
    """One run through a VM whose observed kernels are native hooks (:mod:`tvm_probe.kernel_hook`):
    the session of the plan is the instrument's, pointed at by the VM's switch instead of
    installed as TVM's instrument; only the hooked kernels' calls are seen, counted and checked."""

    def __init__(self, executor: DebugExecutor, plan: CapturePlan, capture: Capture, vm: HookedVM, timed: bool):
        prepared = vm.prepared.get(plan)
        if prepared is None:
            prepared = vm.prepared[plan] = executor._native_hooks().plan(plan)
        # a plan that hands outputs over (symbolic shapes) stores them in the capture as they come
        super().__init__(executor, prepared, capture, capture.outputs.__setitem__ if prepared.streaming else None)
        self.vm = vm
        self.timed = timed  # kernel times kept (everything captured, or asked for)

    def call(self, function, args: list):
        """``function(*args)`` with the hooks reporting to the plan's session."""
        prepared = self.prepared
        self.arena, address = prepared.arena()
        try:
            return self.vm.switch.call(prepared.session, address, self._on_event if self._events else None,
                                       function, args)
        finally:
            self.stats = prepared.session.stats.tolist()

    def finish(self) -> None:
        """The hooked kernels were called as often as the kernel map has call sites for them
        (checked by count: a pass over every site costs more than a small model's run)."""
        prepared, capture, stats, sites = self.prepared, self.capture, self.stats, self.vm.hooked_sites
        if stats[UNEXPECTED] or stats[CALLED] != self.vm.expected_calls:
            capture.time_us = {i: d for i, d in enumerate(prepared.session.times[1].tolist()) if d == d}
            missing = [s for s in prepared.sites if s.index not in capture.time_us and s.symbol in self.vm.hooked
                       and not s.is_view]
            raise _behaviour_changed(prepared.session.unexpected(), missing)
        if self.timed:  # the hooked sites' columns (a copy: the next run writes the session's buffer again)
            capture.timing = sites, prepared.session.times[:, self.vm.hooked_columns]
        capture.copied_bytes = stats[COPIED_BYTES]
        if self.arena is not None:
            capture.outputs = ArenaOutputs(self.arena, prepared.slots, prepared.dtypes)


class FastCall:
    """Raw runs of one plan through its hooked VM, made once one such run succeeded
    (:meth:`DebugExecutor.fast_call`): numpy arguments copied into the tensors held for them
    (as :meth:`DebugExecutor.run` copies them), the rest passed as they are; no kernel times.

    It does what :meth:`DebugExecutor.run` does for such a run, less the decisions made once: a
    decode step of a small model takes ~90 us, so each microsecond of Python around it shows.
    A failure, or kernel calls other than the kernel map's, goes where a hooked run's goes.
    """

    __slots__ = ("_executor", "_plan", "_function", "_prepared", "_switch", "_session", "_expected",
                 "_hooked_call", "_capture", "_on_event")

    def __init__(self, executor: DebugExecutor, vm: HookedVM, plan: CapturePlan, prepared):
        self._executor, self._plan, self._prepared = executor, plan, prepared
        self._function = vm[executor.function]
        self._expected = vm.expected_calls
        self._capture: Capture | None = None
        if prepared is not None:
            self._switch, self._session = vm.switch.id, prepared.session
            self._hooked_call = vm.switch._lib._hooked_call
            self._on_event = self._keep_untracked if prepared.untracked else None

    def __call__(self, args: list, arrays_at: list[int]) -> Capture:
        """Run with every parameter's argument (numpy arrays, checked, at ``arrays_at``): what
        the run copied, its result as returned."""
        executor, prepared = self._executor, self._prepared
        clock = time.perf_counter
        passed = executor.to_device(args, None, reuse=True, arrays_at=arrays_at) if arrays_at else args
        if prepared is None:  # nothing hooked: the VM's own call
            t0 = clock()
            try:
                result = self._function(*passed)
            except KeyboardInterrupt:
                raise
            except Exception as err:
                return executor._hooked_run_failed(err, args, self._plan, True)
            if arrays_at:
                executor._give_up_aliased(result, arrays_at)
            return Capture(inputs=args, instrument=HOOK, total_us=(clock() - t0) * 1e6, returned=result)
        session, arena, address = self._session, *prepared.arena()
        self._capture = capture = Capture(inputs=args, instrument=HOOK)
        t0 = clock()
        try:
            result = self._hooked_call(self._switch, session.id, address, self._on_event, self._function, *passed)
            capture.total_us = (clock() - t0) * 1e6
            stats = session.stats.tolist()
            if stats[UNEXPECTED] or stats[STOPPED] or stats[CALLED] != self._expected:
                raise TVMBehaviourChanged(f"the hooked kernels were called {stats[CALLED]} times where the kernel "
                                          f"map has {self._expected} call sites of them")
        except KeyboardInterrupt:
            raise
        except Exception as err:
            return executor._hooked_run_failed(err, args, self._plan, True)
        finally:
            self._capture = None
        if arrays_at:  # (a result may refer to the held tensors the numpy arguments went into)
            executor._give_up_aliased(result, arrays_at)
        capture.returned, capture.copied_bytes = result, stats[COPIED_BYTES]
        if arena is not None:
            capture.outputs = ArenaOutputs(arena, prepared.slots, prepared.dtypes)
        return capture

    def _keep_untracked(self, kind: int, site: int, *tensors) -> None:
        """The inputs of a fused kernel the plan recomputes from, handed over during the run."""
        self._capture.untracked_inputs[site] = self._prepared.untracked_inputs(site, tensors)


class ArenaOutputs(Mapping):
    """Node outputs the native instrument copied: numpy views of one arena, made when read.

    Making ~100 small arrays costs more than a sub-millisecond run, so a view is made the first
    time a site is read.  Each view keeps the arena alive, and an arena is reused only when
    nothing (no ArenaOutputs, no view) refers to it any more.

    Args:
        arena: the bytes.
        slots: site → its outputs' :class:`~tvm_probe.native.Slot` in the arena, for every site
            copied in this run (in site order).
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
