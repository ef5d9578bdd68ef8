"""Comparison tolerances: one home for the defaults, which follow the dtype (as numpy and torch
testing do), and the one rule every comparison in tvm_probe uses.

A value passes when, element by element, ``|tvm - ref| <= atol + rtol * |ref|`` — where NaN
agrees with NaN and ±inf agrees only with the same infinity; a NaN or an infinity on one side
only is a divergence, whatever the tolerance.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

from .dtypes import canonical, is_exact


@dataclass(frozen=True)
class Tolerance:
    """``atol`` and ``rtol`` of the rule in the module docstring."""

    atol: float
    rtol: float

    def __str__(self) -> str:
        return "exact" if self.atol == 0 and self.rtol == 0 else f"atol {self.atol:g}, rtol {self.rtol:g}"


EXACT = Tolerance(0.0, 0.0)

# Defaults by dtype: a few units of each type's rounding, accumulated through a deep model.
_BY_DTYPE = {
    "float64": Tolerance(1e-7, 1e-6),
    "float32": Tolerance(1e-4, 1e-3),
    "float16": Tolerance(5e-3, 5e-3),
    "bfloat16": Tolerance(5e-2, 3e-2),
}


@functools.lru_cache(maxsize=64)
def default_tolerance(dtype) -> Tolerance:
    """The default tolerance for values of ``dtype``: exact for integers and booleans.

    Defaults to atol 1e-4, rtol 1e-3 for float32; 5e-3 / 5e-3 for float16; 5e-2 / 3e-2 for
    bfloat16; 1e-7 / 1e-6 for float64.
    """
    name = canonical(dtype)
    if name in _BY_DTYPE:
        return _BY_DTYPE[name]
    return EXACT if is_exact(name) else _BY_DTYPE["float32"]


@functools.lru_cache(maxsize=256)  # (a generation compare asks for each of hundreds of values)
def tolerance_of(dtype, atol: float | None = None, rtol: float | None = None) -> Tolerance:
    """The tolerance for values of ``dtype``: the default, with ``atol`` / ``rtol`` given by the
    user in its place."""
    default = default_tolerance(dtype)
    if atol is None and rtol is None:
        return default
    return Tolerance(default.atol if atol is None else atol, default.rtol if rtol is None else rtol)


def describe_defaults() -> str:
    """One line stating the default tolerances (printed with verdicts that use them)."""
    floats = ", ".join(f"{d} {t}" for d, t in _BY_DTYPE.items())
    return f"default tolerances by dtype: {floats}; integers and booleans exact"


def within(got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Elementwise pass/fail of ``got`` against ``ref`` (same shape) under the module's rule."""
    g = np.asarray(got)
    r = np.asarray(ref)
    if g.dtype.kind not in "fc" and r.dtype.kind not in "fc":
        if tol == EXACT:
            return g == r
        r64 = r.astype(np.float64)  # before abs: np.abs of int64's minimum overflows to itself
        return np.abs(g.astype(np.float64) - r64) <= tol.atol + tol.rtol * np.abs(r64)
    g64, r64 = g.astype(np.float64), r.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(g64 - r64) <= tol.atol + tol.rtol * np.abs(r64)
    both_nan = np.isnan(g64) & np.isnan(r64)
    same_inf = np.isinf(r64) & (g64 == r64)
    finite_ref = np.isfinite(r64)
    return both_nan | same_inf | (close & finite_ref & np.isfinite(g64))


#: How far apart two floating-point tensors may be and still count as rounding (``reduce`` without
#: ``--exact``): this many units in the last place at the tensor's magnitude (the largest |ref|).
ROUNDING_ULPS = 8


def rounding(got: np.ndarray, ref: np.ndarray, ulps: int = ROUNDING_ULPS) -> np.ndarray:
    """Elementwise: finite floating-point values within ``ulps`` units in the last place of the
    reference's magnitude (summation order, fused multiply-adds: rounding, not a wrong value)."""
    g, r = np.asarray(got), np.asarray(ref)
    if r.dtype.kind != "f" or g.shape != r.shape or not r.size:
        return np.zeros(g.shape, dtype=bool)
    finite = np.isfinite(g) & np.isfinite(r)
    scale = np.abs(np.where(finite, r, 0)).max()
    with np.errstate(invalid="ignore", over="ignore"):
        return finite & (np.abs(g.astype(np.float64) - r) <= ulps * float(np.spacing(r.dtype.type(scale))))

