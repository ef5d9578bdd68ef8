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

* **native** (:mod:`tvm_probe.capture.native`, driven by :mod:`~tvm_probe.capture.native_driver`):
  a C++ function built with tvm-ffi, compiled once per machine.  It gets a plan per
  :class:`CapturePlan` (per call site: time only, copy, or hand over to a streaming sink) and
  copies into one byte arena allocated once and reused while nobody holds the previous run's
  arrays; Python runs only before and after the run.  Calls the plan does not want cost a symbol
  lookup and two clock reads.
* **python** (:mod:`~tvm_probe.capture.python_instrument`): the same in Python, ~3 us per VM
  call.  Used where the native one cannot be built (no C++ compiler or ninja), for dtypes numpy
  cannot hold byte for byte, or when ``TVM_PROBE_INSTRUMENT=python``.

:attr:`Capture.instrument` and :attr:`DebugExecutor.instrument` say which one ran;
:attr:`DebugExecutor.fallback_reason` says why the Python one was chosen.

Kernel calls are matched to call sites by ``(symbol, occurrence)``, counted the same way as in
:mod:`tvm_probe.kernel_map`; a run that does not call exactly the expected sites raises
:class:`~tvm_probe.core.errors.TVMBehaviourChanged`.

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

**Remote devices** (``remote=``, see :mod:`tvm_probe.capture.remote`): the VM runs in a TVM RPC
server's process and is instrumented by name with a session of the native instrument loaded
there; after the run the client downloads the session's times, stats and arena.  Nothing else
changes: the same plans, the same Capture, byte for byte.

**Where things are.**  This module is the VM's lifecycle: which instrument, making the VM (or a
hooked one), running it, and turning a failure into one line (moving inputs and outputs:
:mod:`~tvm_probe.capture.transfer`).  How a run's kernel
calls are watched is an observer's (:mod:`~tvm_probe.capture.observer`, which declares the call
tree each one implements): :mod:`~tvm_probe.capture.python_instrument`,
:mod:`~tvm_probe.capture.native_driver`, :mod:`~tvm_probe.capture.kernel_hook`.  What a run
copies is planned in :mod:`~tvm_probe.capture.plan`; what it produced is a
:class:`~tvm_probe.capture.result.Capture`; later raw runs of a plan may take
:mod:`~tvm_probe.capture.fast_call`.  Observers get an
:class:`~tvm_probe.capture.observer.ExecutorHandle`, never the executor.
"""
from __future__ import annotations

import logging
import os
import time

import numpy as np

# (build before diagnose: build.compile and diagnose.failures import each other, and only this
# order loads both; it lets tvm_probe.capture be the first module a process imports)
from ..build.compile import BuiltModel
from ..core.device import device_type, on_host
from ..core.errors import ProbeError, TVMBehaviourChanged, TVMRunError, internal_error, raised_by_tvm
from ..diagnose.failures import log_details, run_failure
from ..kernel_map import KernelMap
from .fast_call import FastCall
from .kernel_hook import HOOK, HookedRun, HookedVM, hookable, registry_settled, symbols_to_hook
from .native import NativeUnavailable
from .native_driver import HookedNativeCalls, NativeDriver
from .observer import NOTHING_OBSERVED, ExecutorHandle
from .plan import MAX_PLANS, CapturePlan, CapturePlanner  # noqa: F401  (CapturePlanner: re-exported)
from .python_instrument import PythonCalls
from .recompute import Recomputer
from .remote.client import RemoteRecomputer, RemoteRuntime
from .result import NATIVE, PYTHON, ArenaOutputs, Capture  # noqa: F401  (ArenaOutputs: re-exported)
from .transfer import Transfers, tvm_tensor  # noqa: F401  (tvm_tensor: re-exported)
from .watch import flight, register

log = logging.getLogger(__name__)

#: Environment variable choosing the instrument: ``auto`` (default: native when it can be
#: built), ``native`` (fail when it cannot) or ``python``.
INSTRUMENT_ENV = "TVM_PROBE_INSTRUMENT"
_CHOICES = ("auto", NATIVE, PYTHON)


class DebugExecutor:
    """Runs a built model once per :meth:`run`, capturing what a :class:`CapturePlan` asks for.

    The executable is the one the user deploys; the executor only attaches an instrument.  It
    owns the VM's lifecycle; each run's kernel calls are watched by an
    :class:`~tvm_probe.capture.observer.Observer` it makes for the run and hands its
    :class:`~tvm_probe.capture.observer.ExecutorHandle` (never itself).

    Args:
        built: the compiled model (:class:`~tvm_probe.build.compile.BuiltModel`).
        kernel_map: its call sites.
        instrument: ``"auto"``, ``"native"`` or ``"python"``; defaults to ``$TVM_PROBE_INSTRUMENT``
            or ``"auto"`` (native when it can be built here, else Python).
        sources: the model's SourceMap, to name the ops of a kernel that fails while running.
        remote: run on a remote device over TVM RPC (anything :func:`tvm_probe.capture.remote.connect`
            takes); the executable is uploaded now.
        sync: synchronize the device around every kernel call (device times); defaults to True
            on any device but the CPU.
        function: the VM function to run (multi-function executables: one executor per
            function, all sharing one VM, see :meth:`share_vm`).  Defaults to ``"main"``.
    """

    def __init__(self, built: BuiltModel, kernel_map: KernelMap, instrument: str | None = None, sources=None,
                 remote=None, sync: bool | None = None, function: str = "main"):
        self.function = function
        self.kernel_map = self._km = kernel_map
        self.sources = sources
        self._built = built
        self.remote = None
        choice = instrument or os.environ.get(INSTRUMENT_ENV) or "auto"
        if remote is not None:
            self._check_remote(choice, explicit=instrument is not None)  # before uploading anything
            self.remote = RemoteRuntime(built, remote)
        self._device = self.remote.device if self.remote is not None else built.device
        self.sync = not on_host(self._device) if sync is None else bool(sync)
        self._vm = None  # made at the first run: building for a GPU needs no GPU, running does
        self._main = None  # its "main"
        self._installed = None  # the instrument the VM holds now
        self.instrument, self.fallback_reason = PYTHON, None
        self._native: NativeDriver | None = None
        # runs observing a few kernels go through a VM hooking only those (see run())
        self._hooked: dict[frozenset[str], HookedVM] = {}
        self._hook_of: dict[CapturePlan, HookedVM | None] = {}  # per plan: its hooked VM, or None
        self.fast_calls: dict[tuple, FastCall] = {}  # (plan, every) → raw runs of it, once one succeeded hooked
        self._hook_allowed = choice == "auto" and hookable(kernel_map)
        self._validated = False  # an instrumented run checked the call sequence
        self._hook_native = None  # _native_hooks(): None until asked, False when unavailable
        self._transfers = Transfers(self._device, self.remote)
        # its call sites as a site table of a watched process (tvm_probe.capture.watch)
        self._watch_table = register(self, kernel_map, sources, function)
        # all that observers and prepared calls may use of this executor
        self._handle = ExecutorHandle(kernel_map=kernel_map, sources=sources, function=function,
                                      device_sync=self._device.sync if self.sync else None, install=self.install,
                                      to_device=self._transfers.to_device,
                                      give_up_aliased=self._transfers.give_up_aliased,
                                      rerun_instrumented=self._hooked_run_failed, watch_table=self._watch_table)
        if self.remote is not None:
            self._native = NativeDriver(self._km, library=self.remote.library, sync_device=self._sync_device())
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
            self._native = NativeDriver(self._km, sync_device=self._sync_device(), watch_table=self._watch_table)
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
        branches = self._km.branches
        if branches is not None and (branches.occurrences or branches.open_symbols):
            return ("the model calls kernels inside If branches or functions of its own: the native instrument "
                    "knows call sites only")
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
        """``arrays`` on the executor's device (see :meth:`Transfers.to_device
        <tvm_probe.capture.transfer.Transfers.to_device>`)."""
        return self._transfers.to_device(arrays, times, reuse, arrays_at)

    def recomputer(self, groups=()):
        """What recomputes values kept inside fused kernels (of ``groups``): on this executor's
        device, local or remote."""
        if self.remote is not None:
            return RemoteRecomputer(self._built.target, self.remote, groups)
        return Recomputer(self._built.target, groups)

    def run(self, inputs: list[np.ndarray], plan: CapturePlan, sink=None, raw: bool = False,
            kernel_times: bool | None = None, observer=None, arrays_at=None) -> Capture:
        """Run once; return what ``plan`` asked to copy.

        A probe's first run goes through TVM's instrument: it checks every kernel call against
        the kernel map (and times each).  Later runs go through a VM whose observed kernels are
        hooks (:mod:`tvm_probe.capture.kernel_hook`): none with nothing to copy, the wanted kernels'
        symbols for a selection, every kernel for ``"all"`` or ``kernel_times=True`` (then every
        call is timed; a selection is not timed).  With the native library the hooks are C++
        and any capture goes through them; without it a few kernels are wrapped in Python and
        larger captures use the instrument.  ``observer``, a user's
        :class:`~tvm_probe.capture.instrument.Instrument`, is called around every kernel call (the
        Python instrument runs then).  (Not an :class:`~tvm_probe.capture.observer.Observer`: the
        executor makes those itself, one per run.)

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
        watched = flight()  # (a watched process: see _watching)
        try:
            # (not for a streamed run: a hooked run that fails is run again, and its copies went out)
            hooked = self._hooked_vm(plan, every=bool(kernel_times)) if observer is None and sink is None else None
            if hooked is not None:
                return self._run_hooked(hooked, inputs, plan, raw, arrays_at,
                                        timed=plan.outputs is None or bool(kernel_times))
            return self._run_instrumented(inputs, plan, sink, raw, observer)
        finally:
            if watched is not None:
                watched.run_ends()

    def _watching(self, hooked: HookedVM | None = None) -> None:
        """In a watched process (:mod:`tvm_probe.capture.watch`): the record says that a run of
        these call sites is on, and whether it watches every kernel call (TVM's instrument, or
        a VM hooking every kernel) or only some (``hooked``'s)."""
        watched = flight()
        if watched is not None:
            every = hooked is None or hooked.hooked >= {s.symbol for s in self._km.sites if not s.is_view}
            watched.run_begins(self._watch_table, every)

    def _run_instrumented(self, inputs: list, plan: CapturePlan, sink, raw: bool, observer) -> Capture:
        """:meth:`run` through TVM's instrument: every VM call seen, every kernel call timed."""
        self._watching()
        self._prepare()
        capture = Capture(inputs=inputs, instrument=self.instrument if observer is None else PYTHON)
        if self._native is not None and observer is None:
            calls = self._native.calls(self._handle, plan, capture, sink)
        else:
            calls = PythonCalls(self._handle, capture, plan, sink, observer)
        try:
            device_inputs = self._transfers.to_device(inputs, capture.input_us, reuse=observer is None)
            with calls:
                t0 = time.perf_counter()
                result = self.remote.call(device_inputs) if self.remote is not None else self._main(*device_inputs)
                if self.sync and self.remote is None:  # (remotely the instrument synced after the last kernel)
                    self._device.sync()
                capture.total_us = (time.perf_counter() - t0) * 1e6
            self._transfers.keep_result(capture, result, raw)
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
            if len(self._hooked) >= MAX_PLANS:
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

    def _native_hooks(self) -> NativeDriver | None:
        """What native hooks report to: the native instrument's driver; for a model it cannot
        instrument (symbolic shapes), one whose plans copy the wanted outputs into arenas the
        session sizes by each call's shapes (``dynamic``); None without the library."""
        if self._native is not None:
            return self._native
        if self._hook_native is None:
            try:
                self._hook_native = NativeDriver(self._km, dynamic=True, watch_table=self._watch_table)
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
        self._watching(vm)
        if not vm.hooked:
            run = NOTHING_OBSERVED
        elif vm.switch is None:
            run = HookedRun(vm, plan, capture, watch_table=self._watch_table)
        else:
            prepared = vm.prepared.get(plan)  # the VM's own session for the plan, made at its first run
            if prepared is None:
                prepared = vm.prepared[plan] = self._native_hooks().plan(plan)
            run = HookedNativeCalls(self._handle, prepared, capture, vm, timed)
        device_inputs = self._transfers.to_device(inputs, capture.input_us, reuse=True, arrays_at=arrays_at)
        try:
            t0 = time.perf_counter()
            result = run.call(vm[self.function], device_inputs)
            capture.total_us = (time.perf_counter() - t0) * 1e6
            run.reraise()
            self._transfers.keep_result(capture, result, raw, arrays_at)
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
        for run in self.fast_calls.values():  # (a caller may hold one: it must not run in a VM given up)
            run.retired = True
        self.fast_calls.clear()

    def fast_call(self, plan: CapturePlan, every: bool = False) -> FastCall | None:
        """What later raw runs of ``plan`` (``every``: with every kernel call timed, as
        ``kernel_times=True`` asks) may go through once a run of it succeeded (its hooked VM and
        session are made now if need be, so a decode loop's second step takes it): a
        :class:`FastCall`, or None when the run needs Python during the run (outputs handed
        over as they come) or the VM is not hooked natively.  Kept in :attr:`fast_calls` under
        ``(plan, every)``."""
        vm = self._hooked_vm(plan, every)  # (made now after a first, instrumented run: the next takes this)
        if vm is None or (vm.hooked and vm.switch is None):
            return None
        if vm.hooked and plan not in vm.prepared:
            vm.prepared[plan] = self._native_hooks().plan(plan)
        prepared = vm.prepared.get(plan) if vm.hooked else None
        if vm.hooked and (prepared is None or prepared.streaming or prepared.untracked and not prepared.callbacks):
            return None  # (no session prepared: the hooks would report to nothing)
        timed = vm.hooked and (plan.outputs is None or every)  # what _run_hooked times
        self.fast_calls[plan, every] = FastCall(self._handle, vm, plan, prepared, timed)
        return self.fast_calls[plan, every]

    def _prepare(self) -> None:
        """The VM is ready: made (first run), or reconnected after a lost remote run."""
        if self.remote is not None:
            if self.remote.lost:
                self.remote.reconnect()
            if self._generation != self.remote.generation:  # sessions of a lost connection are gone
                self._native = NativeDriver(self._km, library=self.remote.library,
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

    def _raise_failure(self, err: Exception, calls) -> None:
        """Raise the one-line error for a run that raised ``err``."""
        if self.remote is not None:
            lost = self.remote.failure(err)
            if lost is not None:
                raise lost from None
        # TVM turns an exception raised in the hook (a full disk while streaming, Ctrl-C)
        # into a bare RuntimeError: re-raise the original.
        calls.reraise()
        if isinstance(err, (ProbeError, TVMBehaviourChanged)):  # ours already (a remote download that failed)
            raise err from None
        if not raised_by_tvm(err):  # our own code failed (reading the result back...): not TVM's failure
            raise internal_error(err, "while running the model or reading its result") from err
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

