"""How far apart two arrays are: one record (:class:`ErrorStats`), one function computing it
(:func:`error_stats`), one fold over several (:func:`worst`) and one NaN/Inf rule.  numpy only.

The rule, element by element (the same rule :func:`tvm_probe.core.tolerance.within` passes and fails by):

* both sides finite: the difference is ``|got - ref|``;
* NaN on both sides, or the same infinity on both sides: agreement, difference 0;
* NaN or an infinity on one side only, or opposite infinities: an infinite difference.

And for whole arrays: shapes that differ are an infinite difference; empty arrays have 0 error.

:attr:`ErrorStats.max_abs` is the largest difference under that rule.  The other figures
(``finite_max_abs``, ``max_rel``, ``mean_abs``, ``cosine``, ``snr_db``) describe the elements
both sides hold as finite numbers — how close the numbers are, which one NaN elsewhere would
otherwise hide — and the NaN/Inf disagreements are counted beside them (``nan_mismatch``,
``inf_mismatch``).  Values are compared as float64.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

TINY = np.finfo(np.float64).tiny  # max_rel divides by max(|ref|, TINY): a zero reference is not a NaN


@dataclass(frozen=True)
class ErrorStats:
    """``got`` against ``ref`` (see the module docstring for the rule).

    Attributes:
        max_abs: the largest difference under the rule: ``inf`` when NaN/Inf disagree somewhere
            or the shapes differ, 0 for empty arrays.
        finite_max_abs: the largest ``|got - ref|`` over the elements finite on both sides.
        max_rel: the largest ``|got - ref| / max(|ref|, tiny)`` over those elements.
        mean_abs: the mean ``|got - ref|`` over those elements.
        cosine: cosine similarity over those elements (1 when both are all zeros or there are
            none, 0 when one side only is all zeros).
        snr_db: ``10 log10(sum ref² / sum (got - ref)²)`` over those elements (``inf`` when they
            are equal).
        size: elements compared (0 when the shapes differ).
        finite: of them, those finite on both sides.
        nan_mismatch: elements NaN on one side only.
        inf_mismatch: elements ±inf on one side where the other holds another number or the
            opposite infinity (not NaN: that is a NaN mismatch).
        shape_mismatch: the shapes differ (every figure is then the worst: distances ``inf``,
            ``cosine`` NaN, ``snr_db`` ``-inf``).
    """

    max_abs: float = 0.0
    finite_max_abs: float = 0.0
    max_rel: float = 0.0
    mean_abs: float = 0.0
    cosine: float = 1.0
    snr_db: float = math.inf
    size: int = 0
    finite: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    shape_mismatch: bool = False

    @property
    def mismatches(self) -> int:
        """Elements whose NaN/Inf the other side does not share (each an infinite difference)."""
        return self.nan_mismatch + self.inf_mismatch


EMPTY = ErrorStats()
SHAPE_MISMATCH = ErrorStats(max_abs=math.inf, finite_max_abs=math.inf, max_rel=math.inf, mean_abs=math.inf,
                            cosine=math.nan, snr_db=-math.inf, shape_mismatch=True)


class Agreement(NamedTuple):
    """Element masks of the rule, for two float64 arrays of one shape."""

    finite: np.ndarray  # finite on both sides: the difference is |got - ref|
    differ: np.ndarray  # NaN/Inf on one side only, or opposite infinities: an infinite difference
    # (the rest — NaN on both sides or the same infinity — agree: difference 0)


def both_finite(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The elements the rule measures by ``|got - ref|``: finite on both sides."""
    return np.isfinite(got) & np.isfinite(ref)


def agreement(got: np.ndarray, ref: np.ndarray) -> Agreement:
    """The masks of the rule for ``got`` and ``ref`` (float arrays of one shape)."""
    finite = both_finite(got, ref)
    with np.errstate(invalid="ignore"):
        same = (np.isnan(got) & np.isnan(ref)) | (np.isinf(ref) & (got == ref))
    return Agreement(finite, ~(finite | same))


def cosine_snr(gg: float, rr: float, gr: float, noise: float, nonzero: bool) -> tuple[float, float]:
    """(cosine, snr_db) from the sums over the finite elements: ``gg`` = Σgot², ``rr`` = Σref²,
    ``gr`` = Σgot·ref, ``noise`` = Σ(got - ref)², ``nonzero``: some element nonzero on either side."""
    norm = math.sqrt(gg) * math.sqrt(rr)
    cosine = gr / norm if norm > 0 else (0.0 if nonzero else 1.0)
    ratio = rr / noise if noise else math.inf
    snr = 10 * math.log10(ratio) if ratio > 0 else (-math.inf if ratio == 0 else math.nan)
    return cosine, snr


def cosine_snr_many(gg: np.ndarray, rr: np.ndarray, gr: np.ndarray, noise: np.ndarray,
                    nonzero: Callable[[int], bool]) -> tuple[list[float], list[float]]:
    """:func:`cosine_snr` of many values at once, from float64 arrays of their sums, the same
    floats bit for bit (square roots, products and quotients are correctly rounded in numpy as
    in ``math``; the logarithm is ``math.log10``).  ``nonzero(i)``: some element of value ``i``
    is nonzero, asked only where its norm is zero."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        norm = np.sqrt(gg) * np.sqrt(rr)
        cosine = (gr / norm).tolist()
        ratio = (rr / noise).tolist()
    for i in np.flatnonzero(~(norm > 0)).tolist():  # (a zero or NaN norm: rare)
        cosine[i] = 0.0 if nonzero(i) else 1.0
    log10, inf, nan = math.log10, math.inf, math.nan
    snr = [10 * log10(x) if x > 0 else (-inf if x == 0 else nan) for x in ratio]
    for i in np.flatnonzero(noise == 0).tolist():  # (no noise: an infinite ratio, as cosine_snr says)
        snr[i] = inf
    return cosine, snr


def error_stats(got, ref) -> ErrorStats:
    """``got`` against ``ref`` (array-likes of any real dtype) under the module's rule."""
    g, r = np.asarray(got), np.asarray(ref)
    if g.shape != r.shape:
        return SHAPE_MISMATCH
    g = g.astype(np.float64, copy=False).ravel()
    r = r.astype(np.float64, copy=False).ravel()
    nan_mismatch = inf_mismatch = 0
    finite = both_finite(g, r)
    if not finite.all():
        masks = agreement(g, r)
        nan_mismatch = int((np.isnan(g) ^ np.isnan(r)).sum())
        inf_mismatch = int(masks.differ.sum()) - nan_mismatch
        g, r = g[masks.finite], r[masks.finite]
    if not g.size:
        max_abs = math.inf if nan_mismatch or inf_mismatch else 0.0
        return ErrorStats(max_abs=max_abs, size=int(finite.size), nan_mismatch=nan_mismatch,
                          inf_mismatch=inf_mismatch)
    # plain ufunc reductions, as compare's batched path makes them (and no BLAS, whose threads
    # fight TVM's busy-waiting pool for the cores)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        diff = np.abs(g - r)
        finite_max_abs = float(np.maximum.reduce(diff))
        max_rel = float(np.maximum.reduce(diff / np.maximum(np.abs(r), TINY)))
        mean_abs = float(np.add.reduce(diff)) / g.size
        sums = [float(np.add.reduce(a)) for a in (g * g, r * r, g * r, diff * diff)]
    cosine, snr = cosine_snr(*sums, nonzero=bool(np.logical_or.reduce((g != 0) | (r != 0))))
    return ErrorStats(max_abs=math.inf if nan_mismatch or inf_mismatch else finite_max_abs,
                      finite_max_abs=finite_max_abs, max_rel=max_rel, mean_abs=mean_abs, cosine=cosine,
                      snr_db=snr, size=int(finite.size), finite=int(g.size), nan_mismatch=nan_mismatch,
                      inf_mismatch=inf_mismatch)


def worst(stats: Iterable[ErrorStats]) -> ErrorStats:
    """Several records folded into one (e.g. over a model's outputs): the worst of each figure —
    the largest distances, the smallest cosine and SNR — and the counts summed; no records is
    :data:`EMPTY`.  Independent of order: a NaN figure (a cosine of overflowing sums) is the
    worst of its kind, whichever record holds it."""
    items = list(stats)
    if not items:
        return EMPTY

    def pick(values, best):
        values = [float(v) for v in values]
        return math.nan if any(map(math.isnan, values)) else best(values)

    return ErrorStats(
        max_abs=pick((s.max_abs for s in items), max), finite_max_abs=pick((s.finite_max_abs for s in items), max),
        max_rel=pick((s.max_rel for s in items), max), mean_abs=pick((s.mean_abs for s in items), max),
        cosine=pick((s.cosine for s in items), min), snr_db=pick((s.snr_db for s in items), min),
        size=sum(s.size for s in items), finite=sum(s.finite for s in items),
        nan_mismatch=sum(s.nan_mismatch for s in items), inf_mismatch=sum(s.inf_mismatch for s in items),
        shape_mismatch=any(s.shape_mismatch for s in items))
