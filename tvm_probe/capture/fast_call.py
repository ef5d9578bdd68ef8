"""The prepared call: raw runs of one plan through its hooked VM, decided once.

:meth:`DebugExecutor.fast_call <tvm_probe.capture.executor.DebugExecutor.fast_call>` makes a
:class:`FastCall` once a hooked run of a plan succeeded; an LLM's decode steps go through it.
It gets the executor's :class:`~tvm_probe.capture.observer.ExecutorHandle`, as observers do.
"""
from __future__ import annotations

import time

from ..core.errors import TVMBehaviourChanged
from .kernel_hook import HOOK, HookedVM
from .native import CALLED, COPIED_BYTES, STOPPED, UNEXPECTED
from .observer import ExecutorHandle
from .plan import CapturePlan
from .result import Capture


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
                 "_hooked_call", "_capture", "_on_event", "_timed", "_sites")

    def __init__(self, handle: ExecutorHandle, vm: HookedVM, plan: CapturePlan, prepared, timed: bool = False):
        self._handle, self._plan, self._prepared = handle, plan, prepared
        self._timed, self._sites = timed, vm.hooked_sites
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

    def _keep_untracked(self, kind: int, site: int, *tensors) -> None:
        """The inputs of a fused kernel the plan recomputes from, handed over during the run."""
        self._capture.untracked_inputs[site] = self._prepared.untracked_inputs(site, tensors)
