"""The observers of a run: the :class:`Observer` protocol, and the handle they are given.

The debug executor (:mod:`tvm_probe.capture.executor`) runs the VM; how a run's kernel calls are
watched is an observer's business.  There are five, one per way of watching:

* :class:`NothingObserved`: no kernel hooked, the VM's own call (``capture=None``);
* :class:`~tvm_probe.capture.kernel_hook.HookedRun`: Python wrappers around a few kernels (no
  native library);
* :class:`~tvm_probe.capture.python_instrument.PythonCalls`: TVM's instrument, in Python (every VM
  call seen);
* :class:`~tvm_probe.capture.native_driver.NativeCalls`: TVM's instrument, the native one (a C++
  session counts, times and copies);
* :class:`~tvm_probe.capture.native_driver.HookedNativeCalls`: native wrappers around the wanted
  kernels, reporting to such a session.

An observer gets an :class:`ExecutorHandle`, never the executor: the handle lists all an
observer may use of it.  This module imports nothing of the executor, so observers cannot
reach into it.
"""
from __future__ import annotations

from ..core.errors import TVMBehaviourChanged


class ExecutorHandle:
    """What the executor's observers (and its prepared calls) may use of it, and nothing more.

    Made once per executor; every run's observer gets the same one.  What a run records (copied
    outputs, times) goes into the run's own :class:`~tvm_probe.capture.result.Capture` (or its
    sink), handed to the observer with the run, not through the handle.

    Attributes:
        kernel_map: the :class:`~tvm_probe.kernel_map.mapping.KernelMap`: the call sites kernel
            calls are matched to.
        sources: the model's SourceMap, to name a call's values for a user's instrument (None:
            names are not known).
        function: the name of the VM function the executor runs (``"main"``).
        device_sync: a function synchronizing the device, to call around every kernel call so
            that kernel times are device times; None on the host (nothing to sync).
        install: ``install(instrument, key=None)``: give the VM ``instrument`` (a function, or
            ``(factory name, *args)``), unless it holds the one named ``key`` already.
        to_device: ``to_device(arrays, times=None, reuse=False, arrays_at=None)``: the arguments
            on the executor's device (numpy arrays copied, the rest as they are).
        give_up_aliased: ``give_up_aliased(result, arrays_at=None)``: forget the held input
            tensors a result handed over as it is may refer to.
        rerun_instrumented: ``rerun_instrumented(err, inputs, plan, raw)``: after a run through
            hooked kernels raised ``err`` (or saw other calls than the kernel map's), the same
            run through TVM's instrument, which names the failing kernel: its Capture, or the
            run's one-line error.
        watch_table: the kernel map's site table in a watched process (the number an observer
            writes into the in-flight record before each kernel call, see
            :mod:`tvm_probe.capture.watch`).
    """

    __slots__ = ("kernel_map", "sources", "function", "device_sync", "install", "to_device", "give_up_aliased",
                 "rerun_instrumented", "watch_table")

    def __init__(self, *, kernel_map, sources, function: str, device_sync, install, to_device, give_up_aliased,
                 rerun_instrumented, watch_table: int = -1):
        self.kernel_map, self.sources, self.function = kernel_map, sources, function
        self.watch_table = watch_table
        self.device_sync = device_sync
        self.install, self.to_device = install, to_device
        self.give_up_aliased, self.rerun_instrumented = give_up_aliased, rerun_instrumented


class Observer:
    """The per-run state of one way of watching a run's kernel calls; override what you need.

    The executor makes an observer for each run (with the :class:`ExecutorHandle`, the run's
    :class:`~tvm_probe.capture.plan.CapturePlan` and :class:`~tvm_probe.capture.result.Capture`)
    and calls it as follows; every method does nothing by default (:meth:`call` just calls)::

        DebugExecutor.run(inputs, plan)
         ├─ call(function, args)      the run; by default ``with self: return function(*args)``
         │   │                        (under TVM's instrument the executor writes the ``with``
         │   │                        itself, to time the run inside it)
         │   ├─ __enter__()           attach: install TVM's instrument, point the hooks at this
         │   │                        run, begin the native session
         │   ├─ per kernel call, while the VM runs (whatever __enter__ attached calls it):
         │   │   ├─ hook(func, symbol, before_run, ret_value, *args)   PythonCalls: TVM's instrument
         │   │   ├─ on_call(symbol, args, before)                      HookedRun: Python wrappers
         │   │   └─ on_event(kind, site, *tensors)                     native: C++ counts, times and
         │   │                                   copies; Python gets untracked inputs (kind 0) and
         │   │                                   streamed outputs (kind 1) only
         │   └─ __exit__(*exc)        detach (the VM returned or raised); read the counters back
         ├─ reraise()                 raise what the observer caught itself, as it was: TVM turns
         │                            an exception raised inside an instrument into a bare
         │                            RuntimeError (hooked runs: always asked; instrumented runs:
         │                            when the run raised)
         ├─ running_site()            when the run raised: ``(site, certain)``, the call to name
         ├─ fetch()                   an instrumented run returned: bring back what a session kept
         │                            instead of handing it over (remote)
         └─ finish()                  check the calls seen against the kernel map (raise
                                      TVMBehaviourChanged); fill the Capture

    Example — the order above, driven by hand (``function`` stands for the VM function)::

        >>> class Counting(Observer):
        ...     def __init__(self):
        ...         self.attached, self.runs = False, 0
        ...     def __enter__(self):
        ...         self.attached = True
        ...         return self
        ...     def __exit__(self, *exc):
        ...         self.attached = False
        ...     def finish(self):
        ...         self.runs += 1
        >>> observer = Counting()
        >>> observer.call(lambda x, y: x + y, [2, 3])
        5
        >>> observer.reraise(); observer.fetch(); observer.finish()
        >>> observer.runs, observer.attached
        (1, False)

    An exception raised by a per-call method stops the run; the observer keeps it
    (:meth:`reraise` raises it again) where the VM would wrap it.
    """

    def __enter__(self):
        """Before the run: attach to the VM (install an instrument, point hooks, begin a session)."""
        return self

    def __exit__(self, *_exc) -> None:
        """After the run, returned or raised: detach; read back what the run counted."""
        return None

    def call(self, function, args: list):
        """``function(*args)`` observed: the run itself (a run through hooked kernels)."""
        with self:
            return function(*args)

    def reraise(self) -> None:
        """Raise, as it is, an exception the observer caught during the run (TVM would have
        wrapped it), or one the run's own bookkeeping says happened; else nothing."""
        return None

    def running_site(self) -> tuple[int | None, bool]:
        """The call site running when the run raised (None: not known), and whether that is
        certain (False: it may have raised between calls)."""
        return None, False

    def fetch(self) -> None:
        """After the run returned: bring back what was kept rather than handed over (a remote
        session's arena and untracked inputs)."""
        return None

    def finish(self) -> None:
        """After the run: check the kernel calls seen against the kernel map; fill the Capture."""
        return None


class NothingObserved(Observer):
    """A run through a VM with no kernel hooked (``capture=None``): nothing to watch or check.
    One instance serves every such run (:data:`NOTHING_OBSERVED`)."""

    @staticmethod
    def call(function, args: list):
        return function(*args)  # (no ``with``: this is the cheapest run there is)


NOTHING_OBSERVED = NothingObserved()


def site_outputs(site, args, ret_value) -> list:
    """The outputs of ``site``'s call as the VM made it: what a view or a packed function
    returned (a tuple of them for several outputs), else the destination arguments."""
    if not site.returns_output:
        return list(args[site.num_inputs: site.num_inputs + site.num_outputs])
    if site.num_outputs == 1:
        return [ret_value]
    return list(ret_value) if site.num_outputs else []


def behaviour_changed(unexpected: list[str], missing) -> TVMBehaviourChanged:
    """The error for a run whose kernel calls are not the kernel map's call sites."""
    return TVMBehaviourChanged(
        "the VM's kernel calls differ from the compiled module's call sites "
        f"(unexpected: {unexpected[:5]}, never called: "
        f"{[f'{s.symbol}#{s.occurrence}' for s in missing[:5]]}); "
        "this TVM version behaves differently from the ones tvm_probe supports")
