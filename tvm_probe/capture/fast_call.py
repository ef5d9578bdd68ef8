"""The prepared call: raw runs of one plan through its hooked VM, decided once.

:meth:`DebugExecutor.fast_call <tvm_probe.capture.executor.DebugExecutor.fast_call>` makes a
:class:`FastCall` once a hooked run of a plan succeeded; an LLM's decode steps go through it.
It gets the executor's :class:`~tvm_probe.capture.observer.ExecutorHandle`, as observers do.
"""
from __future__ import annotations

import time

from ..core.errors import TVMBehaviourChanged
from . import native
from .kernel_hook import HOOK, HookedVM
from .native import CALLED, COPIED_BYTES, STOPPED, UNEXPECTED, PreparedArgument
from .observer import ExecutorHandle
from .plan import CapturePlan
from .result import Capture
from .weights_only import WeightsOnly


class FastCall:
    """Raw runs of one plan through its hooked VM, made once one such run succeeded
    (:meth:`~tvm_probe.capture.executor.DebugExecutor.fast_call`): numpy arguments copied into
    the tensors held for them (as :meth:`~tvm_probe.capture.executor.DebugExecutor.run` copies
    them), the rest passed as they are; kernel times only when ``timed``.

    It does what ``DebugExecutor.run`` does for such a run, less the decisions made once: a
    decode step of a small model takes ~90 us, so each microsecond of Python around it shows.
    A failure, or kernel calls other than the kernel map's, goes where a hooked run's goes
    (:attr:`ExecutorHandle.rerun_instrumented <tvm_probe.capture.observer.ExecutorHandle>`).

    Args:
        handle: the executor's handle.
        vm: the plan's hooked VM.
        plan: the plan.
        prepared: the VM's native session for the plan (a
            :class:`~tvm_probe.capture.native_driver.NativePlan`), or None: no kernel hooked.
        timed: keep the hooked kernels' times (everything captured, or ``kernel_times=True``).
    """

    __slots__ = ("_handle", "_plan", "_function", "_prepared", "_switch", "_session", "_expected",
                 "_hooked_call", "_capture", "_on_event", "_timed", "_sites", "_vm", "retired")

    def __init__(self, handle: ExecutorHandle, vm: HookedVM, plan: CapturePlan, prepared, timed: bool = False):
        self._handle, self._plan, self._prepared = handle, plan, prepared
        self._timed, self._sites, self._vm = timed, vm.hooked_sites, vm
        self.retired = False  # the executor dropped its hooked VMs: a caller holding it must not use it
        self._function = vm[handle.function]
        self._expected = vm.expected_calls
        self._capture: Capture | None = None
        if prepared is not None:
            self._switch, self._session = vm.switch.id, prepared.session
            self._hooked_call = vm.switch.native_call
            self._on_event = self._keep_untracked if prepared.untracked else None

    def __call__(self, args: list, arrays_at: list[int]) -> Capture:
        """Run with every parameter's argument (numpy arrays, checked, at ``arrays_at``): what
        the run copied, its result as returned."""
        handle, prepared = self._handle, self._prepared
        clock = time.perf_counter
        passed = handle.to_device(args, None, reuse=True, arrays_at=arrays_at) if arrays_at else args
        if prepared is None:  # nothing hooked: the VM's own call
            t0 = clock()
            try:
                result = self._function(*passed)
            except KeyboardInterrupt:
                raise
            except Exception as err:
                return handle.rerun_instrumented(err, args, self._plan, True)
            if arrays_at:
                handle.give_up_aliased(result, arrays_at)
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
            return handle.rerun_instrumented(err, args, self._plan, True)
        finally:
            self._capture = None
        if arrays_at:  # (a result may refer to the held tensors the numpy arguments went into)
            handle.give_up_aliased(result, arrays_at)
        capture.returned, capture.copied_bytes = result, stats[COPIED_BYTES]
        prepared.keep_run(capture, arena, self._sites if self._timed else None)
        return capture

    @property
    def plan(self) -> CapturePlan:
        """The plan its runs capture."""
        return self._plan

    def direct(self, params: list, arguments: list[PreparedArgument], types: tuple,
               weights: WeightsOnly | None = None) -> "DirectCall | None":
        """This call's runs in one native call each (:class:`DirectCall`): ``params`` holds every
        parameter's argument (the held weights; None where a caller's argument goes),
        ``arguments`` says where each caller argument goes and which are host arrays to check
        and copy, ``types`` the type of each in the call that prepares it; ``weights``: the
        :class:`~tvm_probe.capture.weights_only.WeightsOnly` serving the weights-only outputs
        its captures leave out (a call of everything, this call of its reduced plan).  None where a run
        needs Python during or around it (outputs handed over as they come, inputs kept for
        recomputing), or without the library.  Outputs go into the session's own arenas (a run
        holds its arena; the next takes another); a static plan's kernel times, which live in the
        session's buffer, are copied after each run."""
        prepared = self._prepared
        if prepared is not None and (prepared.untracked or prepared.streaming):
            return None
        try:
            library = native.load()
        except native.NativeUnavailable:
            return None
        hooked = None if prepared is None else (self._vm.switch, prepared.session, self._expected)
        return DirectCall(self, library.prepare_call(self._function, params, arguments, hooked), params, arguments,
                          types, weights)

    @property
    def timed_in_buffer(self) -> bool:
        """Whether its runs' kernel times are in the session's buffer (a static plan's, timed)."""
        return self._timed and self._prepared is not None and not self._prepared.dynamic

    @property
    def session(self):
        """The native session its hooks report to (None: no kernel hooked)."""
        return self._prepared.session if self._prepared is not None else None

    def rerun(self, err: Exception, args: list) -> Capture:
        """After a run that raised ``err`` (or saw other kernel calls than the map's): where a
        hooked run's failure goes."""
        return self._handle.rerun_instrumented(err, args, self._plan, True)

    def keep_outputs(self, capture: Capture, arena_tensor) -> None:
        """What a run copied into the session's own ``arena_tensor``, into ``capture``."""
        self._prepared.keep_run(capture, None, self._sites if self._timed else None, arena_tensor)

    def _keep_untracked(self, kind: int, site: int, *tensors) -> None:
        """The inputs of a fused kernel the plan recomputes from, handed over during the run."""
        self._capture.untracked_inputs[site] = self._prepared.untracked_inputs(site, tensors)


class DirectCall:
    """A :class:`FastCall`'s runs in one native call each (:class:`~tvm_probe.capture.native.PreparedCall`):
    a decode step of ~170 us shows every microsecond of Python between two VM calls, and each one
    spent around the call costs about two there (the VM's run leaves Python's code and data
    out of the caches).  ``direct(args)`` takes the caller's arguments (the held weights left
    out) and runs them when each is of the type it had in the call that prepared it (host arrays
    checked and copied natively).  It returns

    * None when nothing ran (another type, an array its parameter refuses: the caller's checked
      path says what is wrong);
    * ``(returned, (total_us, arena, copied_bytes, times))`` after a run: what the function
      returned, then what its :class:`Capture` is made of when asked for (:meth:`capture`): the
      arena the hooks copied into (None: nothing hooked), and a static plan's kernel times (a
      copy: the next run writes the session's buffer again; None: in the arena, or not timed);
    * the :class:`Capture` of the run through TVM's instrument, after a failure (as
      :class:`FastCall` does).

    Args:
        fast: the prepared call it runs for.
        prepared: the native call.
        params: every parameter's argument (held weights; None where a caller's argument goes).
        arguments: where each caller argument goes, which are host arrays.
        types: each caller argument's type in the call that prepared it.
        weights: what serves the weights-only outputs its captures leave out (None: they leave
            out none).
    """

    __slots__ = ("_fast", "_call", "_status", "_keep", "_params", "_free", "_types", "_tail", "_session", "_weights",
                 "_times")

    def __init__(self, fast: FastCall, prepared, params: list, arguments: list[PreparedArgument], types: tuple,
                 weights: WeightsOnly | None = None):
        self._fast, self._call, self._status, self._weights = fast, prepared.call, prepared.status, weights
        self._keep = prepared  # (the switch and session its native call uses stay open while it lives)
        self._params, self._free, self._types = params, [a.position for a in arguments], _types_check(types)
        self._session = fast.session  # (None: nothing hooked)
        # (a static plan's times are in the session's buffer, which the next run writes again)
        self._times = fast.timed_in_buffer
        # the caller's arguments first, the held weights after them (as compiled functions take
        # them): the whole list in one step
        self._tail = params[len(self._free):] if self._free == list(range(len(self._free))) else None

    def __call__(self, args: tuple):
        fast = self._fast
        # each argument of the type it had in the preparing call: host arrays where they were,
        # so that none goes to the VM unchecked as if it were one of its own tensors
        if fast.retired or not self._types(args):
            return None
        try:
            returned = self._call(*args)
        except KeyboardInterrupt:
            raise
        except Exception as err:
            return self._served(fast.rerun(err, self.arguments(args)))
        ran, nanos, changed, copied, _ = self._status.tolist()
        if not ran:
            return None
        if self._session is None:
            return returned, (nanos / 1e3, None, 0, None)
        if changed:
            return self._served(fast.rerun(TVMBehaviourChanged(
                "the hooked kernels were called other than the kernel map has call sites of them"), self.arguments(args)))
        # (held, the arena is the run's own: the next run copies into another)
        times = self._session.times.copy() if self._times else None
        return returned, (nanos / 1e3, self._session.arena_tensor(), copied, times)

    def capture(self, args: tuple, ran: tuple) -> Capture:
        """The Capture of a run of ``args``; ``ran``: ``(total_us, arena, copied_bytes, times)`` of it."""
        total_us, arena, copied_bytes, times = ran
        capture = Capture.of_call(self.arguments(args), HOOK, total_us, None)
        if arena is not None:
            capture.copied_bytes = copied_bytes
            self._fast.keep_outputs(capture, arena)
        if times is not None:
            capture.timing = capture.timing[0], times
        return self._served(capture)

    def _served(self, capture: Capture) -> Capture:
        """``capture`` serving the weights-only outputs its plan leaves out, where it leaves some."""
        if self._weights is not None and self._weights.served is not None:
            self._weights.serve(capture)
        return capture

    def arguments(self, args: tuple) -> list:
        """Every parameter's argument of a call passing ``args``."""
        if self._tail is not None:
            return [*args, *self._tail]
        full = self._params.copy()
        for i, value in zip(self._free, args):
            full[i] = value
        return full


def _types_check(types: tuple):
    """``check(args) -> bool``: each of ``args`` is of its type in ``types``, unrolled into one
    expression (made once per prepared call; checking a decode step's arguments in a loop costs
    several times more, and each 100 ns here shows as ~300 ns between two VM calls)."""
    names = {f"t{i}": t for i, t in enumerate(types)}
    tests = [f"len(args) == {len(types)}", *(f"type(args[{i}]) is t{i}" for i in range(len(types)))]
    return eval(f"lambda args: {' and '.join(tests)}", {"len": len, "type": type, **names})  # noqa: S307
