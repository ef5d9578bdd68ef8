"""Many calls compared at once, the kernel outputs their arenas hold read as columns (issue 35).

A generation compare asks the same few dozen values of every decode step.  Served one by one (a
numpy view of the call's arena, a servings lookup, an entry measured in ``compare_many``, a
record) a value costs ~15 us, several times its arithmetic.  Here (:class:`CallColumns`) the
values a call's arena holds (a capture sized by that call's shapes:
:class:`~tvm_probe.capture.result.LayoutOutputs`), or the arrays an instrument copied, are checked
against their references with a few list operations a call and read as flat slices; every call
is measured in one numpy pass (:func:`~tvm_probe.comparison.verdict.measure_laid`), and each
value's record is made only when read, where all passed
(:class:`~tvm_probe.comparison.verdict.PassedComparison`).  Every other value goes the general
way (:func:`~tvm_probe.comparison.verdict.gathered`): one not in the call's arena as float32,
one served from another call, one whose reference is not a float numpy array of its shape, dead
code, unchecked.  So each value is accounted for as :func:`~tvm_probe.probe.calls.compare_call`
accounts for it.  Where the references of many calls are held stacked (a teacher-forced
forward holds every decode step's: :class:`StackedReference`), :func:`stacked_columns` takes each
label's references for all calls at once.  tests/models/test_llm_generate.py holds both equal
to comparing each call alone.
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import Mapping, NamedTuple

import numpy as np

from ..capture.result import LayoutOutputs
from ..capture.weights_only import ServedOutputs
from ..comparison.verdict import (
    Comparison, PassedComparison, ValueComparison, compare_arrays, gathered, measure_laid, tolerance_of, tolerance_rule,
)
from ..core.sources import Kind, Served

_FLOAT32 = np.dtype("float32")
_KERNEL_OUTPUTS = (Served.CAPTURED, Served.VIEW)


def asked_values(function_probe, names, name_map: dict) -> list:
    """``(value, name, name)`` for each reference name, in the function's source order: several
    reference names may name one value (a module and its last child), each is compared under
    its own name, so no reference is dropped; inputs and weights are not compared."""
    named: dict[str, list[str]] = {}
    for name in names:
        named.setdefault(function_probe.resolve(name_map.get(name, name)), []).append(name)
    return [(value, name, name) for value in function_probe.sources_map.in_order(named)
            if value.kind not in (Kind.INPUT, Kind.PARAM) for name in named[value.key]]


#: per function probe, its plans by reference names (a generation compare asks the same names of
#: every step, and again at every compare; a probe's names and servings are fixed once built)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PLANS_KEPT = 64  # (per function probe: a caller asking ever new names does not grow it forever)


def column_plan(function_probe, names: tuple, name_map: Mapping | None) -> "ColumnPlan":
    """The :class:`ColumnPlan` of reference ``names`` (after ``name_map``) in ``function_probe``."""
    plans = _PLANS.get(function_probe)
    if plans is None:
        plans = _PLANS[function_probe] = {}
    key = (names, tuple((name_map or {}).items()))
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= _PLANS_KEPT:
            plans.clear()
        plan = plans[key] = ColumnPlan(function_probe, asked_values(function_probe, names, dict(name_map or {})))
    return plan


def _own_outputs(outputs) -> tuple:
    """A call's own outputs, and the sites served from another call's capture (weights-only ones)."""
    if isinstance(outputs, ServedOutputs):
        return outputs.own, outputs.served
    return outputs, {}


def _rows_hold(rows: list, shapes: list) -> bool:
    """Whether each layout row is a copied slot at a float32 boundary holding a value of its shape."""
    return [tuple(row[3:3 + row[2]]) for row in rows] == shapes and min(row[1] for row in rows) > 0 \
        and not any(row[0] & 3 for row in rows)


class ColumnPlan:
    """What a function probe asks of each call for one set of reference names: the asked
    ``(value, name, label)`` in source order; those served from a kernel output (their sites,
    outputs and ranks), and the others (served the general way)."""

    def __init__(self, function_probe, asked: list):
        self.asked = asked
        self.order = {label: i for i, (_, _, label) in enumerate(asked)}
        servings, places = function_probe.servings, function_probe.kernel_map.places
        kernel, self.others = [], []
        for i, (value, name, label) in enumerate(asked):
            served = servings[value.key].served
            place = places.get(value.key)
            if served in _KERNEL_OUTPUTS and place is not None:
                kernel.append((i, place.site, place.output, value.key, name, label, served.value))
            else:
                self.others.append((value, name, label))
        self.kernel = kernel
        # (each kernel output's name by its label, then by its key, as Comparison.add_all records them)
        self.label_names = {label: name for _, _, _, _, name, label, _ in kernel}
        self.key_names = {key: name for _, _, _, key, name, _, _ in kernel}
        self.labels = [k[5] for k in kernel]
        self.sites = {k[1] for k in kernel}
        self._rows: dict = {}  # id(plan rows) → (plan rows, row of each kernel output, all of them float32)

    def rows_in(self, layout: LayoutOutputs) -> tuple[np.ndarray, bool]:
        """The layout row of each kernel output in ``layout``'s capture plan (-1: not copied),
        and whether all of them are copied, as float32."""
        found = self._rows.get(id(layout.plan_rows))
        if found is None or found[0] is not layout.plan_rows:
            first = layout.plan_rows
            rows = np.array([first[site][0] + output if site in first else -1
                             for _, site, output, *_ in self.kernel], dtype=np.int64)
            float32 = all(site in first and layout.dtype_of(site, output) == _FLOAT32
                          for _, site, output, *_ in self.kernel)
            found = self._rows[id(first)] = (first, rows, float32)
        return found[1], found[2]


class CallColumns:
    """One call's part of the pass: its kernel outputs ``picked`` (indices into the plan's),
    compared with ``refs``, and the general way's Comparison and entries (:func:`gathered`) of
    the others.  The picked values are read from ``source``: an arena's
    :class:`LayoutOutputs` (``sizes`` float32 elements each at byte ``offsets``), or the arrays
    an instrument copied (``arrays``: a function's first call, which runs through TVM's)."""

    __slots__ = ("plan", "source", "picked", "refs", "arrays", "offsets", "sizes", "tolerances", "tolerances_by_dtype",
                 "dtypes", "figures", "first", "stride", "comparison", "rest")

    def __init__(self, plan: ColumnPlan, function_probe, capture, reference: Mapping, atol, rtol, tolerances: dict):
        self.plan, self.picked, self.refs, self.arrays, self.offsets, self.sizes = plan, [], [], [], [], []
        self.tolerances, self.dtypes, self.tolerances_by_dtype, self.stride = [], set(), tolerances, 1
        outputs, served_elsewhere = _own_outputs(capture.outputs)
        self.source = outputs if plan.kernel and type(reference) is dict and (
            type(outputs) is dict or isinstance(outputs, LayoutOutputs)) else None
        if self.source is None:
            pass  # (every value the general way)
        elif type(outputs) is dict:
            self._copied(outputs, reference, served_elsewhere, atol, rtol)
        else:
            index, float32 = plan.rows_in(outputs)
            rows = outputs.rows(index).tolist()  # (a kernel output the plan does not copy: index -1)
            if not (float32 and plan.sites.isdisjoint(served_elsewhere) and self._all(rows, reference, atol, rtol)):
                self._some(index.tolist(), rows, reference, served_elsewhere, atol, rtol)
        taken = {plan.kernel[j][0] for j in self.picked}
        rest = plan.others if len(taken) == len(plan.kernel) else \
            [asked for i, asked in enumerate(plan.asked) if i not in taken]
        if rest:
            self.comparison, self.rest = gathered(function_probe, rest, lambda label, value: reference[label], atol,
                                                  rtol)
        else:  # (every value read as columns: nothing is served one by one)
            self.comparison, self.rest = Comparison(tolerance_rule=tolerance_rule(atol, rtol, ())), []

    @classmethod
    def measured_stacked(cls, plan: ColumnPlan, source, refs, sizes: list, tolerance, dtypes: set, laid: tuple, atol,
                         rtol) -> "CallColumns":
        """One call's part of :func:`stacked_columns`, every kernel output picked and measured
        already: ``laid`` = (the figures, its first value's place, the calls' count)."""
        part = cls.__new__(cls)
        part.plan, part.source, part.picked, part.refs = plan, source, range(len(plan.kernel)), refs
        part.arrays, part.offsets, part.sizes = [], [], sizes
        part.tolerances, part.tolerances_by_dtype, part.dtypes = [tolerance], {}, dtypes
        part.figures, part.first, part.stride = laid
        part.comparison, part.rest = Comparison(tolerance_rule=tolerance_rule(atol, rtol, ())), []
        return part

    def _tolerance(self, dtype: np.dtype, atol, rtol):
        tol = self.tolerances_by_dtype.get(dtype)
        if tol is None:
            tol = self.tolerances_by_dtype[dtype] = tolerance_of(dtype, atol, rtol)
        return tol

    def _all(self, rows: list, reference: dict, atol, rtol) -> bool:
        """Take every kernel output, if each is copied into the arena as its reference's shape
        and each reference is a numpy array of one float dtype: a few list operations a call (on
        a few dozen values, numpy's calls cost more than Python's)."""
        get = reference.get
        refs = [get(label) for label in self.plan.labels]
        if set(map(type, refs)) != {np.ndarray}:
            return False
        dtypes = {r.dtype for r in refs}
        if len(dtypes) != 1 or next(iter(dtypes)).kind != "f":
            return False
        if not _rows_hold(rows, [r.shape for r in refs]):
            return False
        # (sizes from the references, whose shapes the rows matched: a slot may be padded past its value)
        self.picked, self.refs, self.offsets = range(len(refs)), refs, [row[0] for row in rows]
        self.sizes = [r.size for r in refs]
        self.tolerances, self.dtypes = [self._tolerance(next(iter(dtypes)), atol, rtol)], dtypes
        return True

    def _some(self, index: list, rows: list, reference: dict, served_elsewhere, atol, rtol) -> None:
        """Take each kernel output that passes :meth:`_all`'s checks, one by one."""
        layout = self.source
        for j, ((_, site, output, _, _, label, _), at, row) in enumerate(zip(self.plan.kernel, index, rows)):
            ref = reference.get(label)
            if (type(ref) is not np.ndarray or ref.dtype.kind != "f" or site in served_elsewhere or at < 0
                    or row[1] <= 0 or row[0] & 3 or tuple(row[3:3 + row[2]]) != ref.shape
                    or layout.dtype_of(site, output) != _FLOAT32):
                continue  # (the general way says why, or measures it)
            self._pick(j, ref, atol, rtol)
            self.offsets.append(row[0])
            self.sizes.append(ref.size)

    def _copied(self, outputs: dict, reference: dict, served_elsewhere, atol, rtol) -> None:
        """Take each kernel output an instrument copied as a float numpy array of its
        reference's shape (a float reference too)."""
        for j, (_, site, output, _, _, label, _) in enumerate(self.plan.kernel):
            ref, arrays = reference.get(label), outputs.get(site)
            if arrays is None or type(ref) is not np.ndarray or ref.dtype.kind != "f" or site in served_elsewhere:
                continue
            got = arrays[output]
            if type(got) is not np.ndarray or got.dtype.kind != "f" or got.shape != ref.shape or not got.size:
                continue
            self._pick(j, ref, atol, rtol)
            self.arrays.append(got)
            self.sizes.append(got.size)

    def _pick(self, j: int, ref: np.ndarray, atol, rtol) -> None:
        self.picked.append(j)
        self.refs.append(ref)
        self.tolerances.append(self._tolerance(ref.dtype, atol, rtol))
        self.dtypes.add(ref.dtype)

    def got(self) -> list[np.ndarray]:
        """The picked values' elements, flat: a slice of the arena each, or each copied array."""
        if self.arrays:
            return [a.ravel() for a in self.arrays]
        flat = self.source.flat(_FLOAT32)
        return [flat[offset >> 2:(offset >> 2) + size] for offset, size in zip(self.offsets, self.sizes)]

    def records(self) -> list[ValueComparison]:
        """A record per picked value, from the pass's figures (those with a NaN or an infinity
        measured one by one, as compare_many measures them)."""
        return _records(self.plan.kernel, self.picked, self.figures, self.first, self.stride, *self._texts(),
                        self._measured_alone)

    def _texts(self) -> tuple[list, list]:
        """The picked values' dtypes and tolerances as text (one each where all share it)."""
        dtypes = [str(next(iter(self.dtypes)))] if len(self.dtypes) == 1 else [str(r.dtype) for r in self.refs]
        return dtypes, [str(t) for t in self.tolerances]

    def _measured_alone(self, n: int, j: int) -> ValueComparison:
        _, site, output, key, name, _, served = self.plan.kernel[j]
        tol = self.tolerances[0] if len(self.tolerances) == 1 else self.tolerances[n]
        return compare_arrays(key, name, served, self.source[site][output], self.refs[n], tol)

    def finish(self, rest: list[ValueComparison], atol, rtol) -> Comparison:
        """The call's Comparison, its values recorded in source order: the picked ones measured
        (their records made when read where all passed) and ``rest`` (the general way's)."""
        comparison, kernel, count = self.comparison, self.plan.kernel, len(self.refs)
        if not count:
            comparison.add_all(rest)
            return comparison
        every = len(self.picked) == len(kernel)
        comparison.names.update(self.plan.label_names if every else {kernel[j][5]: kernel[j][4] for j in self.picked})
        comparison.tolerance_rule = tolerance_rule(atol, rtol, self.dtypes | {e[4].dtype for e in self.rest})
        mine = slice(self.first, self.first + count * self.stride, self.stride)  # (its figures)
        if not rest and all(self.figures.passed[mine]) and all(self.figures.finite[mine]):
            comparison.names.update(self.plan.key_names if every else {kernel[j][3]: kernel[j][4] for j in self.picked})
            # (what makes the records holds no array: the arena may be reused, the reference freed)
            return PassedComparison(comparison, functools.partial(
                _records, kernel, self.picked, self.figures, self.first, self.stride, *self._texts()))
        order = self.plan.order
        comparison.add_all(sorted(self.records() + rest, key=lambda record: order[record.name]))
        return comparison


def _records(kernel: list, picked, figures, first: int, stride: int, dtypes: list, tolerances: list,
             measured_alone=None) -> list[ValueComparison]:
    """The records of the ``picked`` kernel outputs (indices into ``kernel``), value ``n``'s
    figures at ``first + n * stride``; one not finite is measured by ``measured_alone(n, j)``."""
    out = []
    for n, j in enumerate(picked):
        at = first + n * stride
        if not figures.finite[at]:
            out.append(measured_alone(n, j))
            continue
        _, _, _, key, name, _, served = kernel[j]
        out.append(ValueComparison(key, name, served, dtypes[n if len(dtypes) > 1 else 0],
                                   tolerances[n if len(tolerances) > 1 else 0], figures.max_abs[at],
                                   figures.max_rel[at], figures.mean_abs[at], figures.cosine[at], figures.snr_db[at],
                                   0, 0, 0, 0, figures.passed[at], False, "", figures.over_tolerance[at]))
    return out


def measure_columns(calls: list[CallColumns]) -> None:
    """Every call's picked values measured in one pass (each call's ``figures`` from its ``first``)."""
    laid = [call for call in calls if len(call.refs)]
    if not laid:
        return
    tolerances = {id(t): t for call in laid for t in call.tolerances}
    if len(tolerances) == 1:
        tolerance = next(iter(tolerances.values()))
    else:
        tolerance = [t for call in laid for t in (call.tolerances * len(call.refs) if len(call.tolerances) == 1
                                                   else call.tolerances)]
    figures = measure_laid([got for call in laid for got in call.got()], [r.ravel() for call in laid for r in call.refs],
                           [size for call in laid for size in call.sizes], tolerance)
    first = 0
    for call in laid:
        call.figures, call.first = figures, first
        first += len(call.refs)


class StackedReference(NamedTuple):
    """Reference values of several calls held stacked, as a teacher-forced forward holds every
    decode step's: call ``c``'s value of ``label`` is ``arrays[label]`` at position
    ``positions[c]`` of axis ``axes[label]`` (size 1 there)."""

    arrays: dict
    axes: dict
    positions: list

    def value(self, label: str, call: int) -> np.ndarray:
        axis, at = self.axes[label], self.positions[call]
        return self.arrays[label][(slice(None),) * axis + (slice(at, at + 1),)]

    def shape(self, label: str) -> tuple:
        shape = list(self.arrays[label].shape)
        shape[self.axes[label]] = 1
        return tuple(shape)

    def flat(self, label: str) -> np.ndarray:
        """Every call's value of ``label``, flat, in call order."""
        array, axis = self.arrays[label], self.axes[label]
        lo = self.positions[0]
        if self.positions == list(range(lo, lo + len(self.positions))):
            block = array[(slice(None),) * axis + (slice(lo, lo + len(self.positions)),)]
        else:
            block = np.take(array, self.positions, axis)
        if any(size != 1 for size in block.shape[:axis]):  # (else the calls come first already)
            block = block.transpose((axis, *range(axis), *range(axis + 1, block.ndim)))
        return block.ravel()


class _StackedRefs:
    """One call's reference values of a :class:`StackedReference`, made when read (its records
    are made when read too)."""

    __slots__ = ("stacked", "labels", "call")

    def __init__(self, stacked: StackedReference, labels: list, call: int):
        self.stacked, self.labels, self.call = stacked, labels, call

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, n: int) -> np.ndarray:
        return self.stacked.value(self.labels[n], self.call)


def stacked_columns(plan: ColumnPlan, records: list, stacked: StackedReference, atol, rtol) -> list | None:
    """:class:`CallColumns` of calls (``records``, one function's, ``plan`` made for its labels)
    whose reference is ``stacked``, measured in one pass with no Python per value: each call's
    arena checked against the stacked shapes a list compare a call, each label's reference taken
    for all calls at once.  None where that does not hold for every value of every call (the
    caller then compares them one call at a time): a value served otherwise than from a kernel
    output, not copied into an arena as float32 at its reference's shape, served from another
    call, references of several dtypes or not float."""
    if plan.others or not plan.kernel:
        return None
    dtypes = {stacked.arrays[label].dtype for label in plan.labels}
    if len(dtypes) != 1 or next(iter(dtypes)).kind != "f":
        return None
    expected = [stacked.shape(label) for label in plan.labels]
    flats, offsets = [], []
    for record in records:
        outputs, served_elsewhere = _own_outputs(record.capture.outputs)
        if not isinstance(outputs, LayoutOutputs) or not plan.sites.isdisjoint(served_elsewhere):
            return None
        index, float32 = plan.rows_in(outputs)
        if not float32:
            return None
        rows = outputs.rows(index).tolist()
        if not _rows_hold(rows, expected):
            return None
        flats.append(outputs.flat(_FLOAT32))
        offsets.append([row[0] >> 2 for row in rows])
    sizes = [math.prod(shape) for shape in expected]
    tolerance = tolerance_of(next(iter(dtypes)), atol, rtol)
    # (laid out label by label, each label's calls in order: a label's references are one block)
    figures = measure_laid([flat[at[m]:at[m] + size] for m, size in enumerate(sizes) for flat, at in zip(flats, offsets)],
                           [stacked.flat(label) for label in plan.labels],
                           [size for size in sizes for _ in records], tolerance)
    return [CallColumns.measured_stacked(plan, record.capture.outputs, _StackedRefs(stacked, plan.labels, c), sizes,
                                         tolerance, dtypes, (figures, c, len(records)), atol, rtol)
            for c, record in enumerate(records)]
