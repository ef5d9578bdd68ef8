"""The Python instrument: TVM's ``vm.set_instrument`` hook written in Python (~3 us a VM call).

Used where the native instrument cannot be (no C++ compiler or ninja, a dtype numpy cannot
hold byte for byte, symbolic shapes, kernels inside If branches), when
``TVM_PROBE_INSTRUMENT=python``, and for a run with a user's
:class:`~tvm_probe.capture.instrument.Instrument` (the native one cannot call back per call).
It implements the executor's call tree (see :mod:`tvm_probe.capture.executor`) and gives
captures byte-identical to the native instrument's.
"""
from __future__ import annotations

import signal
import threading
import time

from ..kernel_map import ArgKind
from .instrument import KernelCall
from .kernel_hook import host_array, host_copy
from .observer import ExecutorHandle, Observer, behaviour_changed, site_outputs
from .plan import CapturePlan
from .result import PYTHON, Capture
from .watch import BETWEEN, COPYING, OTHER, flight


def _continue(*_args) -> int:
    """The instrument the VM keeps between runs: a no-op, so it holds none of a run's state."""
    return 0


class PythonCalls(Observer):
    """State of one run under the Python instrument (occurrence counters, clock).

    The hook runs twice per VM instruction, so it does as little as it can: one dict lookup
    decides whether a call is a kernel at all.  ``with calls:`` wraps the VM run.

    Args:
        handle: the executor's handle (kernel map, sources, device sync, ``install``).
        capture: what the run fills.
        plan: what it copies.
        sink: ``sink(site, outputs)`` instead of storing copies in ``capture.outputs``.
        instrument: a user's :class:`~tvm_probe.capture.instrument.Instrument`, called around
            every kernel call.
    """

    def __init__(self, handle: ExecutorHandle, capture: Capture, plan: CapturePlan, sink=None, instrument=None):
        km = handle.kernel_map
        self.instrument = instrument
        if instrument is not None:
            instrument.reset()
        self.handle, self.capture, self.plan = handle, capture, plan
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
        self.sync = handle.device_sync  # device times: see the executor's module doc
        self.t_start = time.perf_counter()
        self.t_call = 0.0
        self.unexpected: list[str] = []
        self.failure: BaseException | None = None
        self.interrupted = False
        self._previous_handler = None
        self.running: int | None = None  # the site whose call began and has not returned
        self.flight, self.table = flight(), handle.watch_table  # a watched process's in-flight record

    def __enter__(self) -> "PythonCalls":
        """Install the hook and defer Ctrl-C.

        Python delivers SIGINT wherever it next runs bytecode — inside the VM that is the hook,
        where TVM would wrap the KeyboardInterrupt into a RuntimeError.  So the handler only
        sets a flag; the hook sees it and stops the run, and the interrupt is raised on exit.
        """
        self.handle.install(self.guarded_hook)
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
        self.handle.install(_continue, key=PYTHON)  # the VM keeps a no-op, not our state
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
        """:meth:`hook` as TVM calls it: an exception is kept for :meth:`reraise` (TVM wraps it)."""
        try:
            if self.interrupted:
                raise KeyboardInterrupt
            return self.hook(*args)
        except BaseException as err:
            self.failure = err
            raise

    def hook(self, func, symbol, before_run, ret_value, *args):
        """TVM's instrument, called before and after every VM call (see the executor's module doc)."""
        sites = self.sites_of.get(symbol)
        if sites is None:
            if symbol.startswith("vm.builtin."):
                return 0
            if before_run and symbol not in self.km.helper_symbols:
                self.unexpected.append(str(symbol))
            return self._other_kernel(before_run)
        if before_run:
            occurrence = self.seen[symbol]
            self.seen[symbol] = occurrence + 1
            if occurrence >= len(sites):  # a view too: those before it would be matched wrongly
                if symbol not in self.open_symbols:  # (calls after an If that unbalances them match nothing)
                    self.unexpected.append(f"{symbol}#{occurrence}")
                return self._other_kernel(True)
            site = sites[occurrence]
            if site is None:  # a call inside an If branch: no call site
                return self._other_kernel(True)
            if site.index in self.plan.untracked_inputs:
                self.capture.untracked_inputs[site.index] = {
                    j: host_copy(args[j]) for j, a in enumerate(site.args) if a.kind == ArgKind.UNTRACKED}
            self.running = site.index
            if self.instrument is not None:
                self.instrument.before_call(self._kernel_call(site, args))
            if self.sync is not None:
                self.sync()  # what was launched before is not this call's time
            if self.flight is not None:
                self.flight.kernel(self.table, site.index)
            self.t_call = time.perf_counter()
            return 0
        if self.sync is not None:
            self.sync()  # the kernel itself, not its launch
        t_end = time.perf_counter()
        self.running = None
        occurrence = self.seen[symbol] - 1
        if occurrence >= len(sites) or sites[occurrence] is None:
            return self._other_kernel(False)
        site = sites[occurrence]
        if self.flight is not None:
            self.flight.state(COPYING)
        self.capture.time_us[site.index] = (t_end - self.t_call) * 1e6
        self.capture.start_us[site.index] = (self.t_call - self.t_start) * 1e6
        self.called.add(site.index)
        if self.plan.wants_output(site.index) or self.instrument is not None:
            outs = site_outputs(site, args, ret_value)
            if self.plan.wants_output(site.index):
                self.store(site.index, [host_array(o) for o in outs])
            if self.instrument is not None:
                self.instrument.after_call(self._kernel_call(site, args, list(outs), self.capture.time_us[site.index]))
        if self.flight is not None:
            self.flight.state(BETWEEN)
        return 0

    def _other_kernel(self, before_run: bool) -> int:
        """A kernel call with no call site (a helper lowering added, a call inside an If branch)
        is in flight, or has returned: said in a watched process's record."""
        if self.flight is not None:
            self.flight.state(OTHER if before_run else BETWEEN)
        return 0

    def _kernel_call(self, site, args, outputs=(), time_us=None) -> KernelCall:
        """What a user's instrument sees of a call (see :mod:`tvm_probe.capture.instrument`)."""
        sources = self.handle.sources
        name = (lambda k: sources[k].display_name) if sources is not None else str
        return KernelCall(site=site.index, symbol=site.symbol, occurrence=site.occurrence,
                          names=[[name(k) for k in keys] for keys in site.output_keys],
                          interior=[name(k) for k in site.interior_keys],
                          inputs=list(args[: site.num_inputs]) if not site.returns_output else list(args),
                          outputs=list(outputs), time_us=time_us)

    def finish(self) -> None:
        """Every call site was called and no other kernel: else TVMBehaviourChanged."""
        missing = [s for s in self.km.sites if s.index not in self.called and not s.is_view]
        if self.unexpected or missing:
            raise behaviour_changed(self.unexpected, missing)
