"""Compare stage: TVM values against reference values, per source name — every value accounted for.

Every value the comparison is asked about ends in exactly one of four places:

* **passed** / **diverged** — compared with the reference under the rule of
  :mod:`tvm_probe.core.tolerance` (NaN agrees with NaN, ±inf only with the same infinity; a NaN or
  infinity on one side only is a divergence, described in the value's ``note``);
* **unchecked** — asked for but not compared (not served, not captured, no reference value),
  with the reason: this is *not* a pass;
* **dead code** — no model output depends on it in the source graph, so the compiled model
  need not compute it: listed, not a failure.

A comparison is truthy only when nothing diverged and nothing was left unchecked.  Metrics per
value: max abs / max rel / mean abs error and cosine similarity and SNR over the elements both
sides hold as finite numbers, NaN/Inf counts on both sides, and ``over_tolerance``: the largest
error over its allowance, ``|tvm - ref| / (atol + rtol |ref|)`` (the value passes when it is at
most 1).  :attr:`Comparison.first_divergent`
is the earliest diverging value in source (topological) order: where to start looking.
:attr:`Comparison.first_nonfinite` is the earliest value whose NaN/Inf differ from the
reference's — TVM adding them or dropping them.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Mapping, NamedTuple

import numpy as np

from ..core.errors import ProbeError
from ..core.memory import Scratch
from ..core.metrics import EMPTY, TINY, both_finite, cosine_snr_many, error_stats
from ..core.results import Results
from ..core.sources import Kind, Served
from ..core.tolerance import Tolerance, default_tolerance, tolerance_of, within


class Status(str, Enum):
    """The verdict words, for a value and (in reports) for a node holding values."""

    PASSED = "passed"
    DIVERGED = "diverged"
    FIRST_DIVERGENT = "first divergent"  # the value (or node) where divergence starts
    UNCHECKED = "unchecked"              # asked for, not compared (it says why)
    DEAD = "dead code"                   # no model output depends on it: never computed

    def __str__(self) -> str:
        return self.value


@dataclass
class ValueComparison:
    """One source value compared with its reference."""

    # (in this order: compare_many makes hundreds a generation step, positionally)
    key: str
    name: str
    served: str
    dtype: str
    tolerance: str
    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float
    snr_db: float
    nan_tvm: int
    inf_tvm: int
    nan_ref: int
    inf_ref: int
    passed: bool
    nonfinite_differ: bool = False
    note: str = ""
    # max over elements of |tvm - ref| / (atol + rtol·|ref|): at most 1 exactly when ``passed``;
    # 0 where equal (NaN/Inf agreeing), inf where the allowance is 0 or NaN/Inf or shapes disagree
    over_tolerance: float = 0.0

    def describe(self) -> str:
        """What is wrong, in a few words: the note (shape, NaN/Inf), else the error."""
        return self.note or f"max abs error {self.max_abs:.3g}"


@dataclass
class Comparison:
    """Every value asked about, by outcome; truthy when all were compared and passed."""

    values: list[ValueComparison] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)  # key → why it was not compared
    dead: dict[str, str] = field(default_factory=dict)       # key → display name (dead code)
    names: dict[str, str] = field(default_factory=dict)      # key → display name, for messages
    tolerance_rule: str = ""
    terms_note: str = ""   # where the reference and tolerance came from, when not the caller's own
    first_divergent: ValueComparison | None = None
    first_nonfinite: ValueComparison | None = None

    def __bool__(self) -> bool:
        return not self.failed and not self.unchecked

    @property
    def failed(self) -> list[ValueComparison]:
        return [v for v in self.values if not v.passed]

    def add(self, cmp: ValueComparison) -> None:
        """Record one compared value (in source order: the first failure is the first divergent)."""
        self.add_all([cmp])

    def add_all(self, compared: list[ValueComparison]) -> None:
        """Record compared values, in source order (a generation compare records hundreds a step)."""
        self.values += compared
        self.names.update([(cmp.key, cmp.name) for cmp in compared])
        if self.first_divergent is None:
            self.first_divergent = next((cmp for cmp in compared if not cmp.passed), None)
        if self.first_nonfinite is None:
            self.first_nonfinite = next((cmp for cmp in compared if cmp.nonfinite_differ), None)

    def table(self):
        """DataFrame: one row per value asked about, in source order, with its ``status``."""
        import pandas as pd

        rows = [{**v.__dict__, "status": (Status.PASSED if v.passed else Status.DIVERGED).value} for v in self.values]
        rows += [{"key": k, "name": self.names.get(k, k), "status": Status.UNCHECKED.value, "note": why}
                 for k, why in self.unchecked.items()]
        rows += [{"key": k, "name": name, "status": Status.DEAD.value,
                  "note": "no model output depends on it: the compiled model need not compute it"}
                 for k, name in self.dead.items()]
        columns = [f for f in ValueComparison.__dataclass_fields__] + ["status"]
        return pd.DataFrame(rows, columns=columns)

    def verdict(self) -> str:
        """One line accounting for every value: passed, diverged (where first), unchecked, dead code."""
        n, bad = len(self.values), len(self.failed)
        parts = []
        if bad:
            first = self.first_divergent
            parts.append(f"{bad} of {n} compared values out of tolerance; first divergent op: "
                         f"{first.name} ({first.describe()})")
            if self.first_nonfinite is not None and self.first_nonfinite is not first:
                nf = self.first_nonfinite
                parts.append(f"first NaN/Inf difference: {nf.name} ({nf.note})")
        elif n:
            parts.append(f"all {n} compared values within tolerance")
        else:
            parts.append("no value was compared")
        if self.unchecked:
            key, why = next(iter(self.unchecked.items()))
            parts.append(f"{len(self.unchecked)} value{'s' if len(self.unchecked) > 1 else ''} asked for "
                         f"but not checked (first: {self.names.get(key, key)}: {why})")
        if self.dead:
            parts.append(f"{len(self.dead)} dead-code value{'s' if len(self.dead) > 1 else ''} not computed")
        if self.tolerance_rule:
            parts.append(self.tolerance_rule)
        if self.terms_note:
            parts.append(self.terms_note)
        return ("" if self else "FAIL: ") + "; ".join(parts)


class PassedComparison(Comparison):
    """A :class:`Comparison` whose compared values all passed, measured as columns (a generation
    compare measures hundreds a step): each value's :class:`ValueComparison` is made when
    :attr:`values` is first read, and nothing else needs them (nothing failed, no first
    divergent).  ``comparison``: the rest of it (names, unchecked, dead code, the rule);
    ``records()``: the values' records, in source order."""

    def __init__(self, comparison: Comparison, records: Callable[[], list]):
        self.__dict__.update(comparison.__dict__)
        self._records = records

    @property
    def values(self) -> list[ValueComparison]:
        if self._records is not None:
            self.__dict__["values"] = self.__dict__["values"] + self._records()
            self._records = None
        return self.__dict__["values"]

    @values.setter
    def values(self, values: list[ValueComparison]) -> None:
        self.__dict__["values"], self._records = values, None

    @property
    def failed(self) -> list[ValueComparison]:
        return [] if self._records is not None else super().failed


# -- one value ---------------------------------------------------------------------------------
def compare_arrays(key: str, name: str, served: str, got: np.ndarray, ref: np.ndarray,
                   tol: Tolerance | None = None) -> ValueComparison:
    """Metrics of ``got`` against ``ref`` (see module docstring); ``tol`` defaults by dtype."""
    return compare_many([(key, name, served, got, ref, tol)])[0]


def compare_many(entries) -> list[ValueComparison]:
    """:func:`compare_arrays` of each ``(key, name, served, got, ref, tol)``, in order.

    Float values of one shape on both sides are measured together, a few numpy calls for all of
    them (a generation compare makes hundreds a step, each a few dozen elements); those holding
    a NaN or infinity, and the others, one by one.
    """
    out: list[ValueComparison | None] = [None] * len(entries)
    together, pairs = [], []
    for i, (key, name, served, got, ref, tol) in enumerate(entries):
        g, r = np.asarray(got), np.asarray(ref)
        tol = tol or default_tolerance(r.dtype)
        if g.shape == r.shape and g.dtype.kind == "f" and r.dtype.kind == "f":
            together.append(i)
            pairs.append((g, r, tol))
        else:
            out[i] = _compare_one(key, name, served, g, r, tol)
    # (ids of the dtype and the tolerance → both as text: both live through this call, and hashing
    # ids is cheaper than hashing a dtype)
    texts: dict = {}
    for i, (g, r, tol), metrics in zip(together, pairs, _finite_metrics(pairs)):
        key, name, served = entries[i][:3]
        if metrics is None:  # a NaN or infinity somewhere
            out[i] = _compare_one(key, name, served, g, r, tol)
            continue
        dtype = r.dtype
        text = texts.get((id(dtype), id(tol)))
        if text is None:
            text = texts[id(dtype), id(tol)] = (_dtype_name(dtype), str(tol))
        out[i] = ValueComparison(key, name, served, *text, *metrics)  # (positional: hundreds a generation step)
    return out


def _compare_one(key: str, name: str, served: str, g: np.ndarray, r: np.ndarray, tol: Tolerance) -> ValueComparison:
    """:func:`compare_arrays` of one value of any dtype, NaN and infinities included: metrics
    over the elements both sides hold as finite numbers (:func:`tvm_probe.core.metrics.error_stats`),
    pass/fail by the tolerance rule."""
    counts = {f"{what}_{side}": 0 if a.dtype.kind not in "fc" else int(test(a).sum())
              for side, a in (("tvm", g), ("ref", r)) for what, test in (("nan", np.isnan), ("inf", np.isinf))}
    base = dict(key=key, name=name, served=served, dtype=_dtype_name(r.dtype), tolerance=str(tol), **counts)
    stats = error_stats(g, r)
    # A value's max_abs is its finite elements' (stats.finite_max_abs, not the rule's stats.max_abs,
    # which a single NaN makes inf): the NaN/Inf disagreements are reported beside it — counts,
    # ``note``, ``nonfinite_differ`` — and fail it through ``passed``.
    figures = dict(max_abs=stats.finite_max_abs, max_rel=stats.max_rel, mean_abs=stats.mean_abs,
                   cosine=stats.cosine, snr_db=stats.snr_db)
    if stats.shape_mismatch:
        return ValueComparison(**base, **figures, passed=False, over_tolerance=math.inf,
                               note=f"shape {list(g.shape)} where the reference has {list(r.shape)}")
    note = _nonfinite_difference(g.astype(np.float64), r.astype(np.float64)) if stats.mismatches else ""
    passed = bool(within(g, r, tol).all())
    return ValueComparison(**base, **figures, passed=passed, nonfinite_differ=bool(note), note=note,
                           over_tolerance=_over_tolerance(g, r, tol, passed, bool(stats.mismatches)))


def _over_tolerance(g: np.ndarray, r: np.ndarray, tol: Tolerance, passed: bool, mismatched: bool) -> float:
    """The largest ``|g - r| / (atol + rtol |r|)`` of two arrays of one shape under the NaN/Inf
    rule of :mod:`tvm_probe.core.metrics` (a disagreement: inf; NaN or the same infinity on both
    sides: 0; equal elements: 0, whatever their allowance), on the side of 1 that ``passed`` (the
    verdict of :func:`~tvm_probe.core.tolerance.within`) says: its bound, computed here the same
    way, makes ``d <= b`` exactly when ``d / b <= 1`` once rounded; where the float64 difference
    cannot see what ``within`` saw (int64 past 2**53, compared exactly), just above 1."""
    if mismatched:
        return math.inf
    g64, r64 = g.astype(np.float64).ravel(), r.astype(np.float64).ravel()
    finite = both_finite(g64, r64)
    if not finite.all():
        g64, r64 = g64[finite], r64[finite]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        diff = np.abs(g64 - r64)
        bound = tol.atol + tol.rtol * np.abs(r64)  # (as within bounds it)
        ratio = np.divide(diff, bound, out=np.zeros_like(diff), where=diff > 0)
    worst = float(np.maximum.reduce(ratio)) if ratio.size else 0.0
    if passed:
        return worst if worst <= 1 else 1.0  # (inf / inf: a NaN where the bound overflows too)
    if worst <= 1:
        return math.inf if tol.atol == 0 and tol.rtol == 0 else _ABOVE_ONE
    return worst


def _finite_metrics(pairs: list[tuple[np.ndarray, np.ndarray, Tolerance]]) -> list[tuple | None]:
    """For each ``(got, ref, tol)`` of equal sizes: the fields of its :class:`ValueComparison`
    from ``max_abs`` on — max abs / max rel / mean abs error, cosine, SNR, no NaN or infinity on
    either side, and ``passed`` (every element within ``tol``) — or None when either holds a NaN
    or an infinity.  All pairs in one pass (:func:`measure_laid`)."""
    sizes = [g.size for g, _, _ in pairs]
    out: list[tuple | None] = [_EMPTY_METRICS if not n else None for n in sizes]
    kept = [i for i, n in enumerate(sizes) if n]
    if kept:
        figures = measure_laid([pairs[i][0].ravel() for i in kept], [pairs[i][1].ravel() for i in kept],
                               [sizes[i] for i in kept], [pairs[i][2] for i in kept])
        for i, *row, passed, finite, over in zip(kept, *figures):
            if finite:
                out[i] = (*row, 0, 0, 0, 0, passed, False, "", over)
    return out


class Figures(NamedTuple):
    """What :func:`measure_laid` measured, one list per field, value by value (``finite``:
    neither side holds a NaN or an infinity; where false, the other figures mean nothing;
    ``over_tolerance``: as :class:`ValueComparison`'s)."""

    max_abs: list
    max_rel: list
    mean_abs: list
    cosine: list
    snr_db: list
    passed: list
    finite: list
    over_tolerance: list


def measure_laid(got: list[np.ndarray], ref: list[np.ndarray], sizes, tolerances) -> Figures:
    """The figures of values laid end to end: ``got`` and ``ref`` hold their elements in order,
    in flat arrays of any real dtype and any split (``got`` may be one array per call, ``ref``
    one per value), ``sizes[i] > 0`` elements of value ``i`` (a list or an int array), judged by
    ``tolerances[i]`` (or one :class:`Tolerance` for all).  A value holding a NaN or an infinity
    on either side is not ``finite``: :func:`_compare_one` measures it, as the rule says.

    The figures of :func:`tvm_probe.core.metrics.error_stats` (test_metrics holds them equal), made
    for many values at once: a generation compare measures hundreds of small values a step."""
    if isinstance(tolerances, Tolerance):
        distinct = {tolerances}
    else:
        distinct = set({id(t): t for t in tolerances}.values())  # (hashing each object once)
    if len(sizes) == 1:  # (compare_arrays: plain reductions, no offsets)
        total = counts = int(sizes[0])
        per = lambda ufunc, a: ufunc.reduce(a, keepdims=True)  # noqa: E731
    else:
        counts = np.asarray(sizes)
        total, starts = int(counts.sum()), np.concatenate(([0], np.cumsum(counts)[:-1]))
        per = lambda ufunc, a: ufunc.reduceat(a, starts)  # noqa: E731  (one value per pair)
    # (five float64 arrays of every element, reused from call to call: made fresh, they cost
    # more than the arithmetic — a generation compare measures ~50k elements)
    G, R, diff, scratch, bound = _SCRATCH.arrays(5, total)
    np.concatenate(got, out=G)
    np.concatenate(ref, out=R)
    if len(distinct) == 1:  # (the usual case: one dtype, one rule)
        (tolerance,) = distinct
        atol, rtol = tolerance.atol, tolerance.rtol
    else:
        atol = np.repeat([t.atol for t in tolerances], counts)
        rtol = np.repeat([t.rtol for t in tolerances], counts)

    def nonzero(j: int) -> bool:  # (some element of value j is nonzero: asked where a norm is zero)
        edges = np.concatenate(([0], np.cumsum(np.atleast_1d(counts))))
        return bool(np.any(G[edges[j]:edges[j + 1]]) or np.any(R[edges[j]:edges[j + 1]]))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        np.subtract(G, R, out=diff)
        noise = per(np.add, np.square(diff, out=scratch))
        np.abs(diff, out=diff)
        np.abs(R, out=scratch)
        np.multiply(scratch, rtol, out=bound)
        bound += atol  # (atol + rtol * |ref|, as core.tolerance.within bounds it)
        within = per(np.logical_and, diff <= bound)
        np.maximum(scratch, TINY, out=scratch)
        max_rel = per(np.maximum, np.divide(diff, scratch, out=scratch))
        # each error over its allowance (0 where equal, whatever the allowance): at most 1 exactly
        # where diff <= bound, the quotient of two floats being correctly rounded
        scratch.fill(0.0)
        over = per(np.maximum, np.divide(diff, bound, out=scratch, where=diff > 0))
        # plain reductions, not BLAS: BLAS threads fight TVM's busy-waiting thread pool for the cores
        sum_abs = per(np.add, diff)
        mean_abs = (sum_abs / counts).tolist()
        cosine, snr = cosine_snr_many(
            per(np.add, np.square(G, out=scratch)), per(np.add, np.square(R, out=bound)),
            per(np.add, np.multiply(G, R, out=scratch)), noise, nonzero)
        # A NaN or infinity on either side makes the sum of differences NaN or infinite (so may a
        # sum of finite ones that overflows): _compare_one measures those, as the rule says.
        finite = np.isfinite(sum_abs).tolist()
        return Figures(per(np.maximum, diff).tolist(), max_rel.tolist(), mean_abs, cosine, snr, within.tolist(),
                       finite, over.tolist())


_SCRATCH = Scratch()  # _finite_metrics' work arrays
_EMPTY_METRICS = (EMPTY.finite_max_abs, EMPTY.max_rel, EMPTY.mean_abs, EMPTY.cosine, EMPTY.snr_db, 0, 0, 0, 0, True,
                  False, "", 0.0)
_ABOVE_ONE = float(np.nextafter(1.0, 2.0))  # (a failing value's ratio where its float64 error is within)


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype: np.dtype) -> str:
    return str(dtype)


def _nonfinite_difference(g: np.ndarray, r: np.ndarray) -> str:
    """Where one side has NaN/Inf and the other something else, in words ('' when they agree)."""
    cases = [
        (np.isnan(r) & ~np.isnan(g), lambda m: f"TVM gives {_values(g[m])} where the reference has NaN"),
        (np.isnan(g) & ~np.isnan(r), lambda m: f"TVM gives NaN where the reference has {_values(r[m])}"),
        (np.isinf(r) & ~np.isnan(g) & (g != r),
         lambda m: f"TVM gives {_values(g[m])} where the reference has {_values(r[m])}"),
        (np.isinf(g) & np.isfinite(r), lambda m: f"TVM gives {_values(g[m])} where the reference is finite"),
    ]
    return "; ".join(f"{describe(mask)} at {int(mask.sum())} of {g.size} elements"
                     for mask, describe in cases if mask.any())


def _values(a: np.ndarray) -> str:
    """A few words for the values at some positions: the value itself when they are all one."""
    if a.size and (np.isnan(a).all() or (a == a.flat[0]).all()):
        v = float(a.flat[0])
        return "NaN" if np.isnan(v) else {np.inf: "+inf", -np.inf: "-inf"}.get(v, f"{v:g}")
    return "finite values" if np.isfinite(a).all() else "other values"


# -- every value -------------------------------------------------------------------------------
class ResultsReference(Mapping):
    """Another run as the reference — a second TVM build (pipeline, target, dtype, version) or its
    dump — lined up by source name: ``{tensor name: value}`` over what it serves."""

    def __init__(self, results):
        self.results = results
        self.why_missing: dict[str, str] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self.results.sources_map:
            raise KeyError(key)
        try:
            return self.results.get_tensor(key)
        except ProbeError as err:
            self.why_missing[key] = f"the reference run does not serve it ({err})"
            raise KeyError(key) from None

    def __contains__(self, key) -> bool:
        return key in self.results.sources_map

    def __iter__(self):
        return iter(self.results.sources_map.values)

    def __len__(self) -> int:
        return len(self.results.sources_map)


def compare(results, reference, atol: float | None = None,
            rtol: float | None = None, keys=None, tolerance_for: Callable | None = None,
            progress=None) -> Comparison:
    """Compare every value of ``results`` asked about with ``reference`` (keyed by tensor name).

    ``reference`` is ``{tensor name: array}`` (onnxruntime, PyTorch, TFLite values) or another
    run of the same source model — a Probe or a dump of another TVM build — lined up by source
    name whatever its kernels (:class:`ResultsReference`).

    Inputs and weights are not compared (they are what was fed).  Every other value asked about
    is compared, or listed as unchecked (with why) or dead code — see the module docstring.

    Args:
        results: a :class:`~tvm_probe.Probe` after ``run``, or a dump from ``load_dump``.
        reference: ``{tensor name: array}``, e.g. from ``onnxruntime_values``, or a Results.
        atol, rtol: one tolerance for every value; defaults by dtype
            (:func:`tvm_probe.core.tolerance.default_tolerance`).
        keys: the tensor names asked about (default: every computed value).
        tolerance_for: ``tolerance_for(names)`` → a Tolerance for a value with these names, or
            None to use the default (per-pattern tolerances of a config).
        progress: called as ``progress(done, total)`` while comparing.
    """

    if isinstance(reference, Results):
        _check_same_model(results, reference)
        reference = ResultsReference(reference)
    asked = [v for v in (results.sources_map if keys is None else results.sources_map.in_order(keys))
             if v.kind not in (Kind.INPUT, Kind.PARAM)]
    return judge(results, [(v, v.display_name, v.key) for v in asked],
                 lambda label, value: _reference_value(reference, value.key, results.sources_map),
                 atol, rtol, tolerance_for, progress, why_missing=getattr(reference, "why_missing", {}))


def _reference_value(reference, key: str, sources):
    """``reference[key]``; for an element of a sequence the reference lacks by that name, its
    place in the reference's sequence (onnxruntime returns a sequence as a list of arrays)."""
    try:
        return reference[key]
    except KeyError:
        element = sources.element_of(key)
        if element is None:
            raise
        sequence = reference[element[0]]
        if not isinstance(sequence, (list, tuple)) or element[1] >= len(sequence):
            raise KeyError(key) from None
        return sequence[element[1]]


def judge(results, asked, reference_of: Callable, atol: float | None = None, rtol: float | None = None,
          tolerance_for: Callable | None = None, progress=None, why_missing: Mapping | None = None) -> Comparison:
    """The :class:`Comparison` of each ``(value, name, label)`` of ``asked`` (source values, in
    source order; one value may come several times, under several names): compared under
    ``name`` with ``reference_of(label, value)``, or listed under ``label`` as unchecked (a
    KeyError: no reference, for the reason ``why_missing`` gives) or dead code.  What
    :func:`compare` and a per-call compare share."""
    return measured(*gathered(results, asked, reference_of, atol, rtol, tolerance_for, progress, why_missing))


_SERVED_TEXT = {served: served.value for served in Served}  # (Enum's .value is a slow property)
#: values served by one ``serve_many``: a generation step's few dozen at once, while a big dump's
#: progress still moves as its values are read
_SERVED_AT_ONCE = 64


def gathered(results, asked, reference_of: Callable, atol: float | None = None, rtol: float | None = None,
             tolerance_for: Callable | None = None, progress=None, why_missing: Mapping | None = None):
    """:func:`judge` up to the measuring: the Comparison of what was not measured (dead code,
    unchecked), the ``compare_many`` entries of the rest, and the tolerance rule's text.
    :func:`measured` finishes it; the calls of a generation are measured in one pass
    (:func:`tvm_probe.probe.calls.compare_calls`)."""
    out, why_missing = Comparison(), why_missing or {}
    servings, unchecked, dtypes, entries, tolerances = results.servings, {}, set(), [], {}
    for start in range(0, len(asked), _SERVED_AT_ONCE):
        wanted = []
        for done, (value, name, label) in enumerate(asked[start:start + _SERVED_AT_ONCE], start):
            if progress is not None:
                progress(done, len(asked))
            out.names[label] = name
            served = servings[value.key].served
            if served is Served.UNAVAILABLE:
                out.dead[label] = name
                continue
            if served is Served.SEQUENCE:  # compared element by element: each is a value of its own
                continue
            try:
                ref = np.asarray(reference_of(label, value))
            except KeyError:
                unchecked[label] = why_missing.get(label, "the reference has no value for it")
                continue
            wanted.append((value, name, label, served, ref))
        for (value, name, label, served, ref), got in zip(wanted, results.serve_many([w[0].key for w in wanted])):
            if isinstance(got, ProbeError):
                unchecked[label] = f"not served: {got}"
                continue
            if tolerance_for is not None:
                tol = tolerance_for(value.names) or tolerance_of(ref.dtype, atol, rtol)
            else:
                tol = tolerances.get(ref.dtype)
                if tol is None:
                    tol = tolerances[ref.dtype] = tolerance_of(ref.dtype, atol, rtol)
            dtypes.add(ref.dtype)
            entries.append((value.key, name, _SERVED_TEXT[served], got, ref, tol))
    # (in the order asked, whichever pass found them: the verdict names the first)
    if unchecked:
        out.unchecked = {label: unchecked[label] for _, _, label in asked if label in unchecked}
    out.tolerance_rule = _rule(atol, rtol, {_dtype_name(d) for d in dtypes}, tolerance_for is not None)
    return out, entries


def measured(comparison: Comparison, entries: list, compared: list[ValueComparison] | None = None) -> Comparison:
    """``comparison`` (of :func:`gathered`) with its ``entries`` measured, in source order, as
    asked (``compared``: measured already, by one :func:`compare_many` for several)."""
    comparison.add_all(compare_many(entries) if compared is None else compared)
    return comparison


def _check_same_model(a, b) -> None:
    """Two runs line up by source name only when they are runs of one source model."""
    hash_a, hash_b = (getattr(r, "model_hash", "") for r in (a, b))
    if hash_a and hash_b and hash_a != hash_b:
        raise ProbeError("the two runs are of different models (their model hashes differ): "
                         "a diff lines up values of one source model")
    if not (set(a.sources_map.values) & set(b.sources_map.values)):
        raise ProbeError("the two runs share no source name: a dump TVM's debug executor wrote has only "
                         "its own node names, which line up only with a dump of the same TVM graph")


def tolerance_rule(atol, rtol, dtypes) -> str:
    """The verdict's words for how values of ``dtypes`` (numpy dtypes) were judged."""
    return _rule_of(atol, rtol, frozenset(_dtype_name(d) for d in dtypes))


@functools.lru_cache(maxsize=256)
def _rule_of(atol, rtol, dtypes: frozenset) -> str:
    return _rule(atol, rtol, dtypes, False)  # (a generation compare words it for every call)


def _rule(atol, rtol, dtypes, per_pattern: bool) -> str:
    """How values were judged, for the verdict."""
    if atol is not None and rtol is not None:
        rule = f"tolerance atol {atol:g}, rtol {rtol:g}"
    else:
        shown = ", ".join(f"{d} {default_tolerance(d)}" for d in sorted(dtypes))
        rule = f"default tolerance by dtype ({shown})" if shown else ""
        if atol is not None or rtol is not None:
            rule += f"; overridden: {'atol ' + format(atol, 'g') if atol is not None else ''}" \
                    f"{'rtol ' + format(rtol, 'g') if rtol is not None else ''}"
    return rule + ("; per-pattern tolerances where configured" if per_pattern and rule else "")
