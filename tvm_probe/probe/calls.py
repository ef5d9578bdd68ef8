"""Calls of a multi-function executable: what each :meth:`Probe.call` ran and captured.

A :class:`CallRecord` is plain data (numbered from 0 in call order): the function, the
:class:`~tvm_probe.capture.Capture` of that call, and what it was asked to capture.  Values are
served from it by the function's own probe, so a name means what it means in that function.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

import numpy as np

from ..capture.native import PreparedArgument
from ..comparison.verdict import compare_many, gathered, measured
from ..core.errors import InputError, NotRunError, ProbeError
from ..core.inputs import check_input, fast_check, id_range
from .columns import CallColumns, StackedReference, asked_values, column_plan, measure_columns, stacked_columns


@dataclass(slots=True)
class CallRecord:
    """One :meth:`Probe.call`.

    Attributes:
        index: its number (0 for the first call).
        function: the VM function it ran.
        capture: what the instrument copied (and the arguments, as passed).
        wanted: the keys it was asked to capture (None: everything).
        time_us: wall time of the VM function.
        captured_bytes: bytes of kernel outputs copied during the call.
        values: values recomputed from this call (kept so a second read costs nothing; None
            until a value is read).
        kv: what the paged KV caches held after the call (``paged_kv_cache.layers.0.k``...;
            None: no paged KV cache).
    """

    index: int
    function: str
    capture: Any
    wanted: set | None
    time_us: float
    captured_bytes: int
    # (None until needed: a decode step of a small model takes ~100 us, and two dicts a call show)
    values: dict | None = None
    kv: Mapping | None = None  # KV cache contents after the call, by name


class CallLog:
    """Every call of an executable's functions, numbered from 0 in call order (a probe's ``call``
    adds one record per call; forgotten ones keep their number)."""

    def __init__(self):
        # a CallRecord per call; a call that ran in one native call is kept as (function, wanted,
        # its DirectCall, its arguments, (time_us, arena, copied bytes, times), KV) until a record is asked for
        self._entries: list = []
        self._pending_from: int | None = None  # the first such entry, if any
        self._kept_from = 0  # records before this one are forgotten already

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def records(self) -> list[CallRecord]:
        """Every call's record, in call order."""
        if self._pending_from is not None:
            entries = self._entries
            for k in range(self._pending_from, len(entries)):
                if type(entries[k]) is tuple:
                    function, wanted, direct, args, ran, kv = entries[k]
                    entries[k] = CallRecord(k, function, direct.capture(args, ran), wanted, ran[0], ran[2], kv=kv)
            self._pending_from = None
        return self._entries

    def copy(self) -> "CallLog":
        log = CallLog()
        log._entries, log._kept_from = list(self.records), self._kept_from
        return log

    @property
    def last(self) -> CallRecord | None:
        return self.records[-1] if self._entries else None

    def add(self, function: str, result, wanted) -> CallRecord:
        """The record of the next call: ``result`` is its capture."""
        record = CallRecord(len(self._entries), function, result, wanted, result.total_us, captured_bytes(result))
        self._entries.append(record)
        return record

    def add_direct(self, function: str, wanted, direct, args: tuple, ran: tuple, kv: Mapping | None = None) -> None:
        """The next call, run by ``direct`` (a :class:`~tvm_probe.capture.fast_call.DirectCall`)
        with ``args``; ``ran``: ``(time_us, arena, copied bytes, times)`` of the run; ``kv``: what its KV
        caches held after it.  Its record is made when first asked for (a decode loop calling
        thousands of times reads few of them)."""
        if self._pending_from is None:
            self._pending_from = len(self._entries)
        self._entries.append((function, wanted, direct, args, ran, kv))

    def at(self, call: int | None = None) -> CallRecord:
        """Call ``call`` (default: the last one), or a one-line error."""
        records = self.records
        if not records:
            raise NotRunError("no function has been called yet: use probe.call(function, *args)")
        if call is None:
            return records[-1]
        if not isinstance(call, (int, np.integer)) or not -len(records) <= call < len(records):
            raise ProbeError(f"there is no call {call!r}: calls are numbered 0..{len(records) - 1}")
        record = records[call]
        if record.capture is None:
            raise NotRunError(f"call {record.index} ({record.function}) was forgotten (forget_calls): "
                              "only later calls can be read")
        return record

    def forget(self, keep_last: int = 0) -> None:
        """Drop the captures of all calls but the last ``keep_last``."""
        if keep_last < 0:
            raise ProbeError(f"keep_last must be >= 0, got {keep_last}")
        entries = self._entries
        end = max(len(entries) - keep_last, 0)
        for k in range(self._kept_from, end):  # (a loop forgetting often pays for its new calls only)
            record = entries[k]
            if type(record) is tuple:  # (a record never read: made forgotten)
                function, _, _, _, (time_us, _, copied, _), _ = record
                entries[k] = CallRecord(k, function, None, set(), time_us, copied)
            else:
                record.capture, record.values, record.kv, record.wanted = None, None, None, set()
        self._kept_from = max(self._kept_from, end)

    def frame(self):
        """DataFrame: one row per call — call, function, time_us, captured_bytes."""
        import pandas as pd

        return pd.DataFrame([{"call": r.index, "function": r.function, "time_us": r.time_us,
                              "captured_bytes": r.captured_bytes} for r in self.records],
                            columns=["call", "function", "time_us", "captured_bytes"])


def captured_bytes(capture) -> int:
    """Bytes of kernel outputs ``capture`` holds (the native instrument counts them itself)."""
    if capture.copied_bytes:
        return int(capture.copied_bytes)
    if not capture.outputs:  # (a call capturing nothing: no generator to make)
        return 0
    return int(sum(a.nbytes for site in capture.outputs for a in capture.outputs[site]))


def as_numpy(value) -> np.ndarray:
    """A call argument as numpy: arrays as they are, device tensors copied to the host."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy"):
        return value.numpy()
    raise ProbeError(f"this argument is a {type(value).__name__}, not a tensor: it has no array value")


class CallArguments:
    """Every parameter's argument of one call of ``model``'s function: the caller's ``args``
    where the caller passes them, the probe's held weights elsewhere; tensors given as numpy
    are checked against the parameter.  Made once per function (a decode step is called
    thousands of times).  :attr:`arrays_at`: where the last call's numpy arrays are."""

    def __init__(self, model, function: str):
        self.model, self.function = model, function
        self.free = [i for i in range(len(model.params)) if i not in model.held]
        self.template = [model.held.get(i) for i in range(len(model.params))]
        self._checks = [fast_check(model.params[i][1]) for i in self.free]

    def as_passed(self, args: tuple) -> list | None:
        """Every parameter's argument when ``args`` need no conversion: numpy arrays that pass
        their parameter's precompiled check (:attr:`arrays_at` says where they are) and
        anything else as it is; else None (:meth:`__call__` then converts them, or says what
        is wrong)."""
        if len(args) != len(self.free):
            return None
        full, at = self.template.copy(), []
        for i, value, check in zip(self.free, args, self._checks):
            if type(value) is np.ndarray:
                if check is None or not check(value, True):
                    return None
                at.append(i)
            full[i] = value
        self.arrays_at = at
        return full

    def prepared(self, args: tuple) -> list[PreparedArgument] | None:
        """Where each of ``args`` goes and what a host array among them must be, for a native
        call that checks and copies them (:class:`~tvm_probe.capture.native.PreparedArgument`);
        None when a host array's parameter has a symbolic shape, a dtype numpy cannot hold, or
        ids of a type other than int32 and int64 (checked across arguments, or converted:
        Python's path)."""
        params, out = self.model.params, []
        for i, value, check in zip(self.free, args, self._checks):
            if type(value) is not np.ndarray:
                out.append(PreparedArgument(i))
                continue
            if check is None:  # (fast_check: a symbolic shape, or a dtype numpy cannot hold)
                return None
            spec = params[i][1]
            if spec.index_bound is not None and str(spec.dtype) not in ("int32", "int64"):
                return None  # (ids of another type: checked in Python)
            low, bound = id_range(spec) if spec.index_bound is not None else (0, None)
            out.append(PreparedArgument(i, str(spec.dtype), tuple(spec.shape), low, bound))
        return out

    def __call__(self, args: tuple) -> list:
        free = self.free
        if len(args) != len(free):
            params = self.model.params
            wanted = ", ".join(f"{params[i][0]} ({params[i][1].dtype}{list(params[i][1].shape) if params[i][1].shape else ''})"
                               for i in free)
            raise InputError(f"{self.function}() takes {len(free)} argument(s), got {len(args)}: it takes "
                             f"{wanted or 'none'}")
        full, self.arrays_at = self.template.copy(), []
        for i, value, check in zip(free, args, self._checks):
            if isinstance(value, np.ndarray):
                if not (check is not None and check(value, True)):
                    value = check_input(self.model.params[i][1], value, allow_nonfinite=True)
                self.arrays_at.append(i)
            full[i] = value
        return full


# -- comparison per call -------------------------------------------------------------------------
class CallComparison(NamedTuple):
    """One call compared: its number, the function it ran, and the
    :class:`~tvm_probe.comparison.Comparison` of its values."""

    call: int
    function: str
    comparison: Any


class CallDivergence(NamedTuple):
    """Where a run of calls first diverges: the call, and its first divergent value (a
    :class:`~tvm_probe.comparison.ValueComparison`)."""

    call: int
    value: Any


@dataclass
class CallsComparison:
    """One :class:`~tvm_probe.comparison.Comparison` per call, in call order; truthy when all are.

    Attributes:
        by_call: a :class:`CallComparison` per call compared.
    """

    by_call: list[CallComparison] = field(default_factory=list)

    def __bool__(self) -> bool:
        return all(bool(c) for _, _, c in self.by_call)

    @property
    def first_divergent(self) -> CallDivergence | None:
        """The earliest call's first divergent value, or None."""
        return next((CallDivergence(k, c.first_divergent) for k, _, c in self.by_call
                     if c.first_divergent is not None), None)

    def table(self):
        """DataFrame: one row per call — compared, diverged, unchecked, first divergent value, max abs error."""
        import pandas as pd

        rows = [{"call": k, "function": f, "compared": len(c.values), "diverged": len(c.failed),
                 "unchecked": len(c.unchecked),
                 "first_divergent": c.first_divergent.name if c.first_divergent else None,
                 "max_abs": max((v.max_abs for v in c.values), default=None)} for k, f, c in self.by_call]
        return pd.DataFrame(rows, columns=["call", "function", "compared", "diverged", "unchecked",
                                           "first_divergent", "max_abs"])

    def verdict(self) -> str:
        """One line per call (its :meth:`Comparison.verdict`)."""
        return "\n".join(f"call {k} ({f}): {c.verdict()}" for k, f, c in self.by_call)


def compare_call(probe, reference: Mapping, call: int | None = None, name_map: Mapping | None = None,
                 atol: float | None = None, rtol: float | None = None):
    """Compare call ``call`` of ``probe`` with ``reference`` (``{name: array}``).

    Reference names are resolved within the call's function, after ``name_map``
    (``{reference name: probe name}``, for paths that differ between the two models); a
    reference name that names nothing there is an error (a typo must not pass as "nothing to
    check").  Only the values the reference has are compared.
    """
    with probe.in_call(call) as function_probe:
        return compare_named(function_probe, reference, name_map, atol, rtol)


def compare_named(probe, reference: Mapping, name_map: Mapping | None = None, atol: float | None = None,
                  rtol: float | None = None):
    """The values ``reference`` names (after ``name_map``) of what ``probe`` serves now: a call's
    function probe, or a probe after :meth:`~tvm_probe.Probe.run`."""
    asked = asked_values(probe, tuple(reference), dict(name_map or {}))
    return measured(*gathered(probe, asked, lambda name, value: reference[name], atol, rtol))


def compare_calls(probe, references, name_map: Mapping | None = None, atol: float | None = None,
                  rtol: float | None = None, calls=None) -> CallsComparison:
    """:func:`compare_call` for several calls: ``references[i]`` against call ``calls[i]``
    (default: the last ``len(references)`` calls, in order)."""
    references = list(references)
    made = probe.num_calls
    if calls is None:
        calls = list(range(made - len(references), made))
    if len(calls) != len(references) or min(calls, default=0) < 0:
        raise ProbeError(f"{len(references)} references for {len(calls)} calls ({made} made): give one "
                         "reference per call")
    # every call's values measured in one pass (a generation's steps hold a few dozen small values
    # each): those in a call's arena read as columns, the rest served one by one (probe.columns)
    tolerances, parts = {}, []
    for k, reference in zip(calls, references):
        record = probe.call_record(k)
        with probe.in_call(k) as function_probe:
            plan = column_plan(function_probe, tuple(reference), name_map)
            parts.append(CallColumns(plan, function_probe, record.capture, reference, atol, rtol, tolerances))
    measure_columns(parts)
    compared = iter(compare_many([e for part in parts for e in part.rest]))
    out = CallsComparison()
    for k, part in zip(calls, parts):
        comparison = part.finish([next(compared) for _ in part.rest], atol, rtol)
        out.by_call.append(CallComparison(k, probe.call_record(k).function, comparison))
    return out


def compare_stacked(probe, calls: list[int], stacked: StackedReference, atol: float | None = None,
                    rtol: float | None = None) -> CallsComparison | None:
    """:func:`compare_calls` of ``calls`` (of one function) against ``stacked`` (each label's
    reference values of every call in one array, as a teacher-forced forward holds a
    generation's decode steps), in one pass with no Python per value; None where that does not
    apply to every value (:func:`~tvm_probe.probe.columns.stacked_columns` says when): compare
    those calls with :func:`compare_calls` then."""
    records = [probe.call_record(k) for k in calls]
    if not records or len({record.function for record in records}) != 1:
        return None
    with probe.in_call(calls[0]) as function_probe:
        plan = column_plan(function_probe, tuple(stacked.arrays), None)
    parts = stacked_columns(plan, records, stacked, atol, rtol)
    if parts is None:
        return None
    return CallsComparison([CallComparison(k, record.function, part.finish([], atol, rtol))
                            for k, record, part in zip(calls, records, parts)])
