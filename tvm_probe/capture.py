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

Kernel calls are matched to call sites by ``(symbol, occurrence)``, counted the same way as in
:mod:`tvm_probe.kernel_map`; a run that does not call exactly the expected sites raises
:class:`~tvm_probe.errors.TVMBehaviourChanged`.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import TVMBehaviourChanged
from .kernel_map import VIEW_SYMBOL, KernelMap


@dataclass(frozen=True)
class CapturePlan:
    """What one run copies.  ``outputs=None`` means every node's outputs."""

    outputs: frozenset[int] | None = None
    untracked_inputs: frozenset[int] = frozenset()

    def wants_output(self, node: int) -> bool:
        return self.outputs is None or node in self.outputs


@dataclass
class Capture:
    """What one run produced: copied node outputs, per-node time, the model's outputs."""

    inputs: list[np.ndarray]
    outputs: dict[int, list[np.ndarray]] = field(default_factory=dict)
    untracked_inputs: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)
    start_us: dict[int, float] = field(default_factory=dict)
    time_us: dict[int, float] = field(default_factory=dict)
    result: list[np.ndarray] = field(default_factory=list)
    total_us: float = 0.0


def _to_numpy_list(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for item in value for a in _to_numpy_list(item)]


class DebugExecutor:
    """Runs a built model once per :meth:`run`, capturing what a :class:`CapturePlan` asks for.

    The executable is the one the user deploys; the executor only attaches an instrument.
    """

    def __init__(self, built, kernel_map: KernelMap):
        from tvm import relax

        self._km = kernel_map
        self._device = built.device
        self.vm = relax.VirtualMachine(built.executable, self._device)

    def to_device(self, arrays: list[np.ndarray]):
        import tvm

        return [tvm.runtime.tensor(a, self._device) for a in arrays]

    def run(self, inputs: list[np.ndarray], plan: CapturePlan, sink=None) -> Capture:
        """Run once with the instrument; return what ``plan`` asked to copy.

        ``sink(node, outputs)``, when given, receives each copied node's outputs instead of the
        returned Capture (so they can go to disk at once and not accumulate in memory).
        """
        capture = Capture(inputs=inputs)
        device_inputs = self.to_device(inputs)
        calls = _Calls(self._km, capture, plan, sink)
        t0 = time.perf_counter()
        self.vm.set_instrument(calls.guarded_hook)
        try:
            with _deferred_interrupt(calls):
                result = self.vm["main"](*device_inputs)
        except Exception:
            # TVM turns an exception raised in the hook (a full disk while streaming, Ctrl-C)
            # into a bare RuntimeError: re-raise the original.
            if calls.failure is not None:
                raise calls.failure from None
            raise
        finally:
            self.vm.set_instrument(_continue)
        capture.total_us = (time.perf_counter() - t0) * 1e6
        capture.result = _to_numpy_list(result)
        calls.check_complete()
        return capture


def _continue(*_args) -> int:
    return 0


@contextlib.contextmanager
def _deferred_interrupt(calls: "_Calls"):
    """Turn Ctrl-C during a VM run into a KeyboardInterrupt after the run stops.

    Python delivers SIGINT wherever it next runs bytecode — inside the VM that is the instrument
    hook, where TVM would wrap the KeyboardInterrupt into a RuntimeError.  So the handler only
    sets a flag; the hook sees it and stops the run, and the interrupt is raised here.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: setattr(calls, "interrupted", True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if calls.interrupted:
        raise KeyboardInterrupt


class _Calls:
    """State of one instrumented run (occurrence counters, clock).

    The hook runs twice per VM instruction, so it does as little as it can: one dict lookup
    decides whether a call is a kernel at all.
    """

    def __init__(self, km: KernelMap, capture: Capture, plan: CapturePlan, sink=None):
        self.capture, self.plan = capture, plan
        self.store = sink or capture.outputs.__setitem__
        self.sites_of: dict[str, list] = {}
        for site in km.sites:
            self.sites_of.setdefault(site.symbol, []).append(site)
        self.km = km
        self.seen: dict[str, int] = dict.fromkeys(self.sites_of, 0)
        self.called: set[int] = set()
        self.t_start = time.perf_counter()
        self.t_call = 0.0
        self.unexpected: list[str] = []
        self.failure: BaseException | None = None
        self.interrupted = False

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
            if before_run and not symbol.startswith("vm.builtin."):
                self.unexpected.append(str(symbol))
            return 0
        if before_run:
            occurrence = self.seen[symbol]
            self.seen[symbol] = occurrence + 1
            if occurrence >= len(sites):
                if symbol != VIEW_SYMBOL:
                    self.unexpected.append(f"{symbol}#{occurrence}")
                return 0
            site = sites[occurrence]
            if site.index in self.plan.untracked_inputs:
                self.capture.untracked_inputs[site.index] = {
                    j: args[j].numpy() for j, a in enumerate(site.args) if a.kind == "untracked"}
            self.t_call = time.perf_counter()
            return 0
        t_end = time.perf_counter()
        occurrence = self.seen[symbol] - 1
        if occurrence >= len(sites):
            return 0
        site = sites[occurrence]
        self.capture.time_us[site.index] = (t_end - self.t_call) * 1e6
        self.capture.start_us[site.index] = (self.t_call - self.t_start) * 1e6
        self.called.add(site.index)
        if self.plan.wants_output(site.index):
            outs = [ret_value] if site.is_view else args[site.num_inputs: site.num_inputs + site.num_outputs]
            self.store(site.index, [o.numpy() for o in outs])
        return 0

    def check_complete(self) -> None:
        missing = [s for s in self.km.sites if s.index not in self.called and not s.is_view]
        if self.unexpected or missing:
            raise TVMBehaviourChanged(
                "the VM's kernel calls differ from the compiled module's call sites "
                f"(unexpected: {self.unexpected[:5]}, never called: "
                f"{[f'{s.symbol}#{s.occurrence}' for s in missing[:5]]}); "
                "this TVM version behaves differently from the ones tvm_probe supports")
