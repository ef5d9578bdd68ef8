"""compare_many measures many values at once; each must equal what the metrics mean, worked out
here element by element in plain Python (not with the vectorised code under test), and equal
compare_arrays of that value alone."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_probe.comparison.verdict import compare_arrays, compare_many
from tvm_probe.core.tolerance import Tolerance, default_tolerance

SPECIAL = [0.0, -0.0, 1e-310, 1e30, np.nan, np.inf, -np.inf]


@st.composite
def pairs(draw):
    """(got, ref, tol): random shapes (empty included) and dtypes, sometimes NaN/Inf, zeros, equal
    values or a shape mismatch; the tolerance by dtype or given."""
    dtype = draw(st.sampled_from(["float32", "float64", "float16", "int64"]))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ref = rng.normal(size=shape) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    got = ref + rng.normal(size=shape) * draw(st.sampled_from([0.0, 1e-7, 1e-3, 1.0]))
    if draw(st.booleans()) and ref.size:
        for a in (got, ref):
            flat = a.reshape(-1)
            flat[rng.integers(0, flat.size)] = draw(st.sampled_from(SPECIAL))
    if draw(st.booleans()):
        got = np.zeros_like(got)
    if dtype == "int64":
        got, ref = np.nan_to_num(got, posinf=9, neginf=-9).round(), np.nan_to_num(ref, posinf=9, neginf=-9).round()
    got, ref = got.astype(dtype), ref.astype(dtype)
    if draw(st.integers(0, 9)) == 0:
        got = got.reshape(-1)[:max(got.size - 1, 0)]
    tol = draw(st.sampled_from([None, Tolerance(1e-4, 1e-3), Tolerance(0.0, 0.0)]))
    return got, ref, tol


def expected(got: np.ndarray, ref: np.ndarray, tol: Tolerance | None) -> dict:
    """The metrics by their definitions, one element at a time."""
    tol = tol or default_tolerance(ref.dtype)
    g, r = [float(x) for x in got.ravel()], [float(x) for x in ref.ravel()]
    both = [(a, b) for a, b in zip(g, r) if math.isfinite(a) and math.isfinite(b)]
    diffs = [abs(a - b) for a, b in both]
    rels = [d / max(abs(b), np.finfo(np.float64).tiny) for d, (_, b) in zip(diffs, both)]
    gg, rr, gr = (math.fsum(x * y for x, y in pairs_) for pairs_ in
                  ([(a, a) for a, _ in both], [(b, b) for _, b in both], both))
    norm = math.sqrt(gg) * math.sqrt(rr)
    noise = math.fsum(d * d for d in diffs)

    def agrees(a, b):
        if math.isnan(b) or math.isnan(a):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(b) or math.isinf(a):
            return a == b
        return abs(a - b) <= tol.atol + tol.rtol * abs(b)

    return dict(
        max_abs=max(diffs, default=0.0), max_rel=max(rels, default=0.0),
        mean_abs=math.fsum(diffs) / len(diffs) if diffs else 0.0,
        cosine=gr / norm if norm > 0 else (0.0 if any(a or b for a, b in both) else 1.0),
        snr_db=math.inf if noise == 0 else (10 * math.log10(rr / noise) if rr > 0 else -math.inf),
        passed=all(agrees(a, b) for a, b in zip(g, r)),
        nan_tvm=sum(map(math.isnan, g)), nan_ref=sum(map(math.isnan, r)),
        inf_tvm=sum(map(math.isinf, g)), inf_ref=sum(map(math.isinf, r)))


def close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


@settings(max_examples=60, deadline=None)
@given(st.lists(pairs(), min_size=1, max_size=12))
def test_many_values_at_once_equal_their_definitions_and_one_at_a_time(cases):
    entries = [(f"k{i}", f"n{i}", "captured", g, r, tol) for i, (g, r, tol) in enumerate(cases)]
    together = compare_many(entries)
    for (key, name, served, got, ref, tol), value in zip(entries, together):
        alone = compare_arrays(key, name, served, got, ref, tol)
        assert value == alone or all(close(getattr(value, f), getattr(alone, f)) for f in
                                     ("max_abs", "max_rel", "mean_abs", "cosine", "snr_db")), key
        assert (value.key, value.passed, value.note) == (key, alone.passed, alone.note)
        if got.shape != ref.shape:
            assert not value.passed and "shape" in value.note
            continue
        want = expected(got, ref, tol)
        assert value.passed == want.pop("passed"), (key, got, ref)
        for field, number in want.items():
            assert close(getattr(value, field), number), (key, field, getattr(value, field), number, got, ref)


def test_where_a_side_sums_to_zero_the_cosine_follows_its_definition():
    """Measured together, a side whose squares sum to zero — zeros, negative zeros, or float64
    values so small their squares underflow — gets the cosine its definition gives: 1 where both
    sides are all zero, 0 where either holds a nonzero element."""
    cases = [(np.zeros(4), np.zeros(4)), (np.array([0.0, -0.0]), np.array([-0.0, 0.0])),
             (np.zeros(3), np.ones(3)), (np.ones(3), np.zeros(3)),
             (np.full(5, 1e-200), np.full(5, 1e-200)), (np.full(5, 1e-200), np.zeros(5)),
             (np.zeros(2, np.float32), np.zeros(2, np.float32)), (np.ones(2), np.ones(2))]
    entries = [(f"k{i}", f"n{i}", "captured", g, r, None) for i, (g, r) in enumerate(cases)]
    measured = compare_many(entries)
    assert [v.cosine for v in measured[:7]] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert close(measured[7].cosine, 1.0)  # (nonzero on both sides: the sums' own rounding)
    for (_, _, _, got, ref, tol), value in zip(entries, measured):
        assert close(value.cosine, expected(got, ref, tol)["cosine"])
