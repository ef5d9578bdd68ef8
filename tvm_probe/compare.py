"""Compare stage: TVM values against reference values, per source name.

Metrics per value: max abs error, max rel error, mean abs error, cosine similarity, SNR (dB),
NaN/Inf counts on both sides, and pass/fail against ``atol + rtol * |ref|`` (numpy's
``allclose`` rule).  :attr:`Comparison.first_divergent` is the earliest value, in source
order (which is topological), that fails — every value it was computed from passed: where to
start looking.  :attr:`Comparison.first_nonfinite` is the earliest value where TVM produced
NaN/Inf the reference does not have; :meth:`Results.first_nonfinite` finds the first NaN/Inf of
a run without any reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .results import Results
from .sources import Kind, Served

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3


@dataclass
class ValueComparison:
    """One source value compared with its reference."""

    key: str
    name: str
    served: str
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
    note: str = ""


@dataclass
class Comparison:
    """All compared values; truthy when every one passed."""

    values: list[ValueComparison] = field(default_factory=list)
    first_divergent: ValueComparison | None = None
    first_nonfinite: ValueComparison | None = None  # first value where TVM has NaN/Inf and the reference not
    skipped: dict[str, str] = field(default_factory=dict)  # key → why it was not compared

    def __bool__(self) -> bool:
        return all(v.passed for v in self.values)

    @property
    def failed(self) -> list[ValueComparison]:
        return [v for v in self.values if not v.passed]

    def table(self):
        """DataFrame, one row per compared value, in source order."""
        import pandas as pd

        return pd.DataFrame([v.__dict__ for v in self.values])

    def verdict(self) -> str:
        """One line: how many values passed and, when some did not, where divergence starts."""
        n, bad = len(self.values), len(self.failed)
        if not bad:
            return f"all {n} compared values within tolerance"
        first = self.first_divergent
        where = (f"; first divergent op: {first.name} (max abs error {first.max_abs:.3g})"
                 if first else "")
        nonfinite = self.first_nonfinite
        if nonfinite is not None:
            where += (f"; first NaN/Inf: {nonfinite.name} ({nonfinite.nan_tvm} NaN, "
                      f"{nonfinite.inf_tvm} Inf)")
        return f"{bad} of {n} compared values out of tolerance{where}"


def compare_arrays(key: str, name: str, served: str, got: np.ndarray, ref: np.ndarray,
                   atol: float, rtol: float) -> ValueComparison:
    """Metrics of ``got`` against ``ref`` (see module docstring)."""
    g = np.asarray(got)
    r = np.asarray(ref)
    counts = dict(nan_tvm=int(np.isnan(g).sum()) if g.dtype.kind == "f" else 0,
                  inf_tvm=int(np.isinf(g).sum()) if g.dtype.kind == "f" else 0,
                  nan_ref=int(np.isnan(r).sum()) if r.dtype.kind == "f" else 0,
                  inf_ref=int(np.isinf(r).sum()) if r.dtype.kind == "f" else 0)
    if g.shape != r.shape:
        return ValueComparison(key, name, served, np.inf, np.inf, np.inf, np.nan, -np.inf, **counts,
                               passed=False, note=f"shape {list(g.shape)} vs reference {list(r.shape)}")
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(g64 - r64)
        same_nonfinite = (np.isnan(g64) & np.isnan(r64)) | (np.isinf(g64) & (g64 == r64))
        diff = np.where(same_nonfinite, 0.0, diff)
        max_abs = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(r64), np.finfo(np.float64).tiny)
        max_rel = float(np.max(np.where(diff == 0, 0.0, rel))) if diff.size else 0.0
        mean_abs = float(np.mean(diff)) if diff.size else 0.0
        gf, rf = g64.ravel(), r64.ravel()
        norm = np.linalg.norm(gf) * np.linalg.norm(rf)
        cosine = float(gf @ rf / norm) if norm > 0 else (1.0 if not gf.any() and not rf.any() else 0.0)
        noise = float(np.sum((gf - rf) ** 2))
        signal = float(np.sum(rf ** 2))
        snr = np.inf if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else -np.inf)
        passed = bool(np.all(diff <= atol + rtol * np.abs(r64))) if diff.size else True
    return ValueComparison(key, name, served, max_abs, max_rel, mean_abs, cosine, float(snr),
                           **counts, passed=passed)


def compare(results: Results, reference: Mapping[str, np.ndarray], atol: float = DEFAULT_ATOL,
            rtol: float = DEFAULT_RTOL, keys=None, tolerance_for=None, progress=None) -> Comparison:
    """Compare every runtime value of ``results`` that ``reference`` has (by tensor name).

    Inputs and weights are not compared (they are what was fed); values the run cannot serve
    are listed in ``skipped`` with the reason.

    Args:
        atol, rtol: the tolerance of every value, unless ``tolerance_for(names)`` (given the
            value's names) returns an object with ``atol`` and ``rtol`` for it.
        keys: compare only these tensor names.
        progress: called as ``progress(done, total)`` while comparing.
    """
    from .errors import ProbeError

    out = Comparison()
    todo = [v for v in results.sources_map
            if (keys is None or v.key in keys) and v.kind not in (Kind.INPUT, Kind.PARAM) and v.key in reference]
    for done, value in enumerate(todo):
        if progress is not None:
            progress(done, len(todo))
        if value.served is Served.UNAVAILABLE:
            out.skipped[value.key] = "not computed by the compiled module"
            continue
        try:
            got = results._value(value.key)
        except ProbeError as err:
            out.skipped[value.key] = str(err)
            continue
        tol = tolerance_for(value.names) if tolerance_for else None
        cmp = compare_arrays(value.key, value.display_name, value.served.value if value.served else "",
                             got, reference[value.key], tol.atol if tol else atol, tol.rtol if tol else rtol)
        out.values.append(cmp)
        if not cmp.passed and out.first_divergent is None:
            # Source order is topological (ONNX requires it), so the first failure is a value
            # whose inputs all passed.
            out.first_divergent = cmp
        new_nonfinite = cmp.nan_tvm + cmp.inf_tvm > cmp.nan_ref + cmp.inf_ref
        if new_nonfinite and out.first_nonfinite is None:
            out.first_nonfinite = cmp
    return out
