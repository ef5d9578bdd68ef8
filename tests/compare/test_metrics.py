"""tvm_probe.core.metrics: the one NaN/Inf rule and error record, checked by hand, against an
element-by-element computation in plain Python, against compare's vectorised figures, and at the
sites that use it (the split's max difference, the precision checks, reduce's divergence)."""
from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_probe.comparison import compare_arrays, compare_many
from tvm_probe.comparison.verdict import _compare_one, measure_laid
from tvm_probe.core.metrics import EMPTY, ErrorStats, cosine_snr, cosine_snr_many, error_stats, worst
from tvm_probe.core.tolerance import Tolerance, within

nan, inf = math.nan, math.inf


# -- the rule, by hand -------------------------------------------------------------------------
def test_finite_figures_by_hand():
    s = error_stats(np.array([1.0, 2.0, 4.0]), np.array([1.0, 3.0, 2.0]))
    assert (s.max_abs, s.finite_max_abs, s.max_rel, s.mean_abs) == (2.0, 2.0, 1.0, 1.0)
    assert s.cosine == pytest.approx((1 + 6 + 8) / math.sqrt(21 * 14))
    assert s.snr_db == pytest.approx(10 * math.log10(14 / 5))
    assert (s.size, s.finite, s.mismatches, s.shape_mismatch) == (3, 3, 0, False)


@pytest.mark.parametrize("got, ref", [
    ([1.0, nan, 3.0], [1.0, nan, 3.0]),
    ([inf, 2.0, -inf], [inf, 2.0, -inf]),
    ([nan, inf, -inf], [nan, inf, -inf]),
])
def test_nan_or_inf_in_the_same_place_on_both_sides_agrees(got, ref):
    s = error_stats(np.array(got), np.array(ref))
    assert s.max_abs == 0.0 and s.finite_max_abs == 0.0 and s.mismatches == 0


@pytest.mark.parametrize("got, ref, nan_mismatch, inf_mismatch", [
    ([1.0, nan], [1.0, 2.0], 1, 0),     # NaN on TVM's side only
    ([1.0, 2.0], [1.0, nan], 1, 0),     # NaN on the reference's side only
    ([nan, 2.0], [inf, 2.0], 1, 0),     # NaN against inf: a NaN mismatch
    ([inf, 2.0], [5.0, 2.0], 0, 1),     # inf against a number
    ([7.0, 2.0], [-inf, 2.0], 0, 1),
    ([inf, 2.0], [-inf, 2.0], 0, 1),    # opposite infinities
    ([nan, inf], [3.0, 3.0], 1, 1),
])
def test_nan_or_inf_on_one_side_only_is_an_infinite_difference(got, ref, nan_mismatch, inf_mismatch):
    s = error_stats(np.array(got), np.array(ref))
    assert s.max_abs == inf
    assert (s.nan_mismatch, s.inf_mismatch) == (nan_mismatch, inf_mismatch)
    assert s.finite == sum(math.isfinite(a) and math.isfinite(b) for a, b in zip(got, ref))


def test_a_nan_elsewhere_does_not_hide_the_finite_figures():
    s = error_stats(np.array([1.0, nan, 5.0, inf]), np.array([1.5, 2.0, 3.0, inf]))
    assert (s.max_abs, s.finite_max_abs, s.mean_abs, s.finite, s.nan_mismatch) == (inf, 2.0, 1.25, 2, 1)


@pytest.mark.parametrize("got, ref", [(np.zeros((2, 3)), np.zeros((3, 2))), (np.zeros(3), np.zeros(4)),
                                      (np.zeros((0, 3)), np.zeros((3, 0))), (np.float32(1), np.ones(1))])
def test_a_shape_mismatch_is_an_infinite_difference(got, ref):
    s = error_stats(got, ref)
    assert s.shape_mismatch and s.max_abs == s.max_rel == s.mean_abs == inf and s.snr_db == -inf


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 0, 5)])
def test_empty_arrays_have_no_error(shape):
    s = error_stats(np.zeros(shape, np.float32), np.zeros(shape, np.float64))
    assert s == EMPTY and s.max_abs == 0.0


def test_integers_and_booleans_compare_as_numbers():
    assert error_stats(np.array([1, 5, -3], np.int64), np.array([1, 2, -3], np.int32)).max_abs == 3.0
    assert error_stats(np.array([True, False]), np.array([True, True])).max_abs == 1.0


# -- the rule against plain Python ---------------------------------------------------------------
SPECIAL = [nan, nan, inf, -inf, 0.0, -0.0, 1e-310, 6e4, -1e30]


@st.composite
def pairs(draw):
    """(got, ref): random shapes (empty included) and dtypes; ref a perturbed got, NaN/Inf sprinkled
    on either side or both at once, sometimes another shape."""
    dtype = draw(st.sampled_from(["float16", "float32", "float64", "int32"]))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    got = rng.normal(size=shape) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    ref = got + rng.normal(size=shape) * draw(st.sampled_from([0.0, 1e-3, 1.0]))
    for _ in range(draw(st.integers(0, 4)) if got.size else 0):
        value, i = draw(st.sampled_from(SPECIAL)), rng.integers(0, got.size)
        for a in {"got": [got], "ref": [ref], "both": [got, ref]}[draw(st.sampled_from(["got", "ref", "both"]))]:
            a.reshape(-1)[i] = value
    if dtype == "int32":
        got, ref = (np.nan_to_num(a, posinf=9, neginf=-9).clip(-1e6, 1e6).round() for a in (got, ref))
    with np.errstate(over="ignore"):  # float16: large values become infinities, more of them
        got, ref = got.astype(dtype), ref.astype(dtype)
    if draw(st.integers(0, 9)) == 0:
        ref = ref.reshape(-1)[:max(ref.size - 1, 0)]
    return got, ref


def by_hand(got: np.ndarray, ref: np.ndarray) -> dict:
    """max abs by the rule, finite max abs and mismatch counts, one element at a time in Python floats."""
    if got.shape != ref.shape:
        return dict(max_abs=inf)

    def difference(a, b):
        if math.isnan(a) or math.isnan(b):
            return 0.0 if math.isnan(a) and math.isnan(b) else inf
        if math.isinf(a) or math.isinf(b):
            return 0.0 if a == b else inf
        return abs(a - b)

    g, r = [float(x) for x in got.ravel()], [float(x) for x in ref.ravel()]
    finite = [abs(a - b) for a, b in zip(g, r) if math.isfinite(a) and math.isfinite(b)]
    return dict(max_abs=max(map(difference, g, r), default=0.0), finite_max_abs=max(finite, default=0.0),
                finite=len(finite), nan_mismatch=sum(math.isnan(a) != math.isnan(b) for a, b in zip(g, r)),
                inf_mismatch=sum(difference(a, b) == inf and not (math.isnan(a) or math.isnan(b))
                                 and (math.isinf(a) or math.isinf(b)) for a, b in zip(g, r)))


@settings(max_examples=300, deadline=None)
@given(pairs())
def test_max_abs_is_the_rule_worked_out_element_by_element(case):
    got, ref = case
    s = error_stats(got, ref)
    for field, value in by_hand(got, ref).items():
        assert getattr(s, field) == value, (field, got, ref)


def close(a: float, b: float, abs_tol: float = 1e-300) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=abs_tol)


# An SNR is 10 log10 of a ratio of sums: near 0 dB (noise as large as the signal) one rounding of a
# sum summed in another order moves it by ~1e-15 dB, which is large relative to a figure near 0.
# The reader sees decibels, so it is held to 1e-12 dB absolute beside the relative rule.
ABS_TOL = {"snr_db": 1e-12}


@settings(max_examples=150, deadline=None)
@given(st.lists(pairs(), min_size=1, max_size=8))
def test_compare_measures_as_error_stats_alone_and_many_at_once(cases):
    """compare's figures are error_stats' finite ones (its NaN/Inf are reported beside them), one
    value alone and many in the vectorised pass; a disagreement under the rule never passes."""
    entries = [(f"k{i}", f"n{i}", "captured", g, r, None) for i, (g, r) in enumerate(cases)]
    for entry, together in zip(entries, compare_many(entries)):
        got, ref = entry[3], entry[4]
        s = error_stats(got, ref)
        for value in (together, compare_arrays(*entry)):
            assert value.max_abs == s.finite_max_abs or close(value.max_abs, s.finite_max_abs)
            for field in ("max_rel", "mean_abs", "cosine", "snr_db"):
                assert close(getattr(value, field), getattr(s, field), ABS_TOL.get(field, 1e-300)), (field, getattr(value, field), s, got, ref)
            assert value.nonfinite_differ == (s.mismatches > 0)
            if s.max_abs == inf:
                assert not value.passed


sums = st.sampled_from([0.0, 5e-324, 1e-300, 0.25, 1.0, 3.0, 1e300, inf, nan])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(sums, sums, sums, sums, st.booleans()), min_size=1, max_size=6))
def test_cosine_snr_of_many_is_cosine_snr_of_each_bit_for_bit(rows):
    """The vectorised cosine and SNR are the scalar ones, float for float: zero and NaN norms, no
    noise, overflowed sums (gr signed either way)."""
    rows = [(gg, rr, gr * (-1) ** k, noise, nonzero) for k, (gg, rr, gr, noise, nonzero) in enumerate(rows)]
    cosine, snr = cosine_snr_many(*(np.array(column) for column in list(zip(*rows))[:4]), lambda i: rows[i][4])
    for (gg, rr, gr, noise, nonzero), together in zip(rows, zip(cosine, snr)):
        for alone, many in zip(cosine_snr(gg, rr, gr, noise, nonzero), together):
            assert alone == many or (math.isnan(alone) and math.isnan(many)), (gg, rr, gr, noise, nonzero)


# -- folding ---------------------------------------------------------------------------------------
def same(a: ErrorStats, b: ErrorStats) -> bool:
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a.__dict__.values(), b.__dict__.values()))


numbers = st.sampled_from([0.0, 0.5, 3.0, 1e30, inf, -inf, nan])
records = st.builds(ErrorStats, max_abs=numbers, finite_max_abs=numbers, max_rel=numbers, mean_abs=numbers,
                    cosine=numbers, snr_db=numbers, size=st.integers(0, 9), nan_mismatch=st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(records, min_size=1, max_size=4))
def test_worst_does_not_depend_on_the_order_nan_included(stats):
    folded = worst(stats)
    for order in itertools.permutations(stats):
        assert same(worst(order), folded)
    assert folded.size == sum(s.size for s in stats)


def test_worst_of_real_records():
    clean = error_stats(np.array([1.0, 2.0]), np.array([1.0, 2.5]))
    overflow = error_stats(np.array([1e300, 1e300]), np.array([-1e300, 1e300]))  # cosine of inf sums: NaN
    lost = error_stats(np.array([nan, 1.0]), np.array([1.0, 1.0]))
    assert math.isnan(overflow.cosine)
    for order in itertools.permutations([clean, overflow, lost]):
        w = worst(order)
        assert w.max_abs == inf and w.finite_max_abs == 2e300 and math.isnan(w.cosine) and w.nan_mismatch == 1
    assert worst([clean, clean]).max_abs == 0.5 and worst([]) == EMPTY


# -- the sites ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("lost", [False, True])
def test_split_max_difference_does_not_depend_on_the_order_of_the_outputs(lost):
    """tvm-probe split's max difference over the outputs: the same NaN in both runs agrees, a NaN
    the chained stages alone give is inf — whichever output comes first (np.max's NaN fed to
    Python's max once made it NaN one way round and 0.5 the other)."""
    from tvm_probe.app.investigate import _chained_outcome

    whole = {"a": np.array([1.0, nan], np.float32), "b": np.array([1.0, 2.0], np.float32)}
    chained = {"a": np.array([1.0, nan], np.float32), "b": np.array([1.5, 2.0], np.float32)}
    if lost:
        whole["a"] = np.array([1.0, 3.0], np.float32)
    found = {order: _chained_outcome(None, [], None, {k: whole[k] for k in order}, chained, None, None)
             for order in ("ab", "ba")}
    assert [o.max_difference for o in found.values()] == [inf if lost else 0.5] * 2
    assert not any(o.within_tolerance for o in found.values())


def test_precision_output_errors_follow_the_rule():
    from tvm_probe.tools.precision.search import check_outputs
    from tvm_probe.core.tolerance import Tolerance

    ref = {"same": np.array([nan, inf, 1.0]), "new_nan": np.array([1.0, 2.0]), "close": np.array([1.0, 2.0]),
           "shape": np.zeros(3), "empty": np.zeros(0)}
    out = {"same": np.array([nan, inf, 1.0], np.float16), "new_nan": np.array([nan, 2.0]),
           "close": np.array([1.0, 2.25]), "shape": np.zeros(2), "empty": np.zeros(0)}
    check = check_outputs(out, ref, Tolerance(0.5, 0.0))
    assert check.errors == {"same": 0.0, "new_nan": inf, "close": 0.25, "shape": inf, "empty": 0.0}
    assert not check.passed
    assert check_outputs({"same": out["same"]}, {"same": ref["same"]}, Tolerance(0.0, 0.0)).passed


def test_precision_op_error_keeps_its_one_sided_counts():
    from tvm_probe.tools.precision.analysis import error_stats as op_error

    # an inf and a NaN the reduced op creates, one finite where fp32 overflowed (not its doing), a 0
    low = np.array([inf, nan, 5.0, 0.0, 2.5, 4.0])
    ref = np.array([1.0, 1.0, inf, 1e-8, 2.0, 4.0])
    assert op_error(low, ref) == (inf, 0.5, 1, 1, 1)
    assert op_error(np.array([0.0, 2.5, nan]), np.array([1e-8, 2.0, nan])) == (0.25, 0.5, 0, 0, 1)
    assert op_error(np.array([5.0, 1.0]), np.array([inf, 1.0])) == (0.0, 0.0, 0, 0, 0)
    assert op_error(np.zeros(2), np.zeros(3)) == (inf, inf, 0, 0, 0)


def test_reduce_divergence_max_abs_counts_only_the_failing_finite_elements():
    from tvm_probe.tools.reduce import find_divergence
    from tvm_probe.core.tolerance import Tolerance

    value = SimpleNamespace(key="t", node="n", op_type="Relu")
    got = np.array([nan, 1.0, 10.0, 3.0, inf], np.float32)
    ref = np.array([1.0, 1.05, 7.0, 3.0, 2.0], np.float32)
    found = find_divergence(value, got, ref, Tolerance(0.1, 0.0))
    assert dict(found.counts) == {"nan-extra": 1, "inf": 1, "value": 1} and found.max_abs == 3.0
    only_nan = find_divergence(value, got[:2], ref[:2], Tolerance(0.1, 0.0))
    assert only_nan.max_abs == 0.0 and only_nan.kinds == ("nan-extra",)
    assert find_divergence(value, got, ref[:4]).max_abs == inf


def test_the_smallest_int64_equals_itself_under_a_tolerance():
    """np.abs of int64's minimum is itself (negative): the rule must not judge equal integers apart."""
    from tvm_probe.core.tolerance import Tolerance, within

    low = np.array([np.iinfo(np.int64).min, 3], dtype=np.int64)
    assert within(low, low.copy(), Tolerance(atol=1e-5, rtol=1e-3)).all()


# -- the error over its allowance (issue 54: what the report's error plot draws) ----------------------
TOLERANCES = [Tolerance(0.0, 0.0), Tolerance(1e-4, 1e-3), Tolerance(0.0, 1e-3), Tolerance(1e-4, 0.0),
              Tolerance(5e-3, 5e-3), Tolerance(1e-300, 1e-16), Tolerance(2.0, 3.0)]


@st.composite
def judged(draw):
    """(got, ref, tol): a float value (float16/32/64) whose error sits anywhere around its allowance,
    often right at ``atol + rtol |ref|`` (rtol-dominant: a large |ref| and a small atol), with
    NaN/Inf sprinkled on either side or both, sometimes equal elements or an empty value."""
    dtype = draw(st.sampled_from(["float16", "float32", "float64"]))
    tol = draw(st.sampled_from(TOLERANCES))
    n = draw(st.integers(0, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ref = rng.normal(size=n) * draw(st.sampled_from([1e-3, 1.0, 1e3]))
    scale = draw(st.sampled_from([0.0, 0.5, 0.999, 1.0, 1.001, 2.0, 1e3]))  # the error over its allowance
    got = ref + rng.choice([-1.0, 1.0], size=n) * scale * (tol.atol + tol.rtol * np.abs(ref))
    for _ in range(draw(st.integers(0, 3)) if n else 0):
        value, i = draw(st.sampled_from(SPECIAL)), rng.integers(0, n)
        for a in {"got": [got], "ref": [ref], "both": [got, ref]}[draw(st.sampled_from(["got", "ref", "both"]))]:
            a[i] = value
    with np.errstate(over="ignore"):
        return got.astype(dtype), ref.astype(dtype), tol


@settings(max_examples=250, deadline=None)
@given(st.lists(judged(), min_size=1, max_size=6))
def test_over_tolerance_is_at_most_one_exactly_when_the_value_passes(cases):
    """over_tolerance = max |tvm - ref| / (atol + rtol |ref|): the same float from the batched pass
    (compare_many, measure_laid) and the value alone (_compare_one, for any dtype, NaN/Inf
    included), and on the side of 1 the verdict says."""
    entries = [(f"k{i}", f"n{i}", "captured", g, r, tol) for i, (g, r, tol) in enumerate(cases)]
    for (_, _, _, got, ref, tol), together in zip(entries, compare_many(entries)):
        alone = _compare_one("k", "n", "captured", got, ref, tol)
        assert together.passed == alone.passed == bool(within(got, ref, tol).all())
        assert together.over_tolerance == alone.over_tolerance, (together, alone, got, ref, tol)
        assert (together.over_tolerance <= 1) == together.passed, (together, got, ref, tol)
        s = error_stats(got, ref)
        if s.mismatches:
            assert together.over_tolerance == inf
        elif not s.finite_max_abs:
            assert together.over_tolerance == 0.0  # equal (NaN/Inf agreeing): no error at all


def test_over_tolerance_by_hand():
    tol = Tolerance(1e-4, 1e-3)  # float32's default
    ref = np.array([10.0, -1.0, 0.0], np.float32)
    # 5e-3 at |ref| 10: fifty times atol, yet half the allowance 1e-4 + 1e-2 (rtol-dominant: it passes)
    value = compare_arrays("k", "n", "captured", ref + np.array([5e-3, 0, 0], np.float32), ref)
    assert value.passed and value.max_abs > tol.atol
    assert value.over_tolerance == pytest.approx(5e-3 / (1e-4 + 1e-3 * 10), rel=1e-4)
    failing = compare_arrays("k", "n", "captured", ref + np.array([0, 0, 2e-4], np.float32), ref)
    assert not failing.passed and failing.over_tolerance == pytest.approx(2.0, rel=1e-4)
    exact = compare_arrays("k", "n", "captured", np.array([1, 2]), np.array([1, 3]))
    assert not exact.passed and exact.over_tolerance == inf  # no allowance at all
    assert compare_arrays("k", "n", "captured", np.array([1, 2]), np.array([1, 2])).over_tolerance == 0.0
    assert compare_arrays("k", "n", "captured", np.zeros(2), np.zeros(3)).over_tolerance == inf  # shapes
    nan_both = compare_arrays("k", "n", "captured", np.array([nan, inf, 1.0]), np.array([nan, inf, 1.0]))
    assert nan_both.passed and nan_both.over_tolerance == 0.0
    nan_one = compare_arrays("k", "n", "captured", np.array([nan, 1.0]), np.array([1.0, 1.0]))
    assert not nan_one.passed and nan_one.over_tolerance == inf


def test_int64_past_two_to_the_53_that_differs_is_above_one():
    """Compared exactly, 2**60 + 1 is not 2**60; in float64 their difference is 0.  The ratio must
    still say it fails."""
    big = np.array([2**60 + 1, 5], np.int64)
    value = compare_arrays("k", "n", "captured", big, big - [1, 0])
    assert not value.passed and value.max_abs == 0.0 and value.over_tolerance > 1
    assert compare_arrays("k", "n", "captured", big, big.copy()).over_tolerance == 0.0


def test_over_tolerance_at_the_boundary_element_by_element():
    """300,000 single-element values laid end to end (measure_laid, as a generation compare lays
    them), their errors within a few ulps of atol + rtol |ref| either side: each passes exactly
    when its ratio is at most 1, and a failing one is at least the float after 1."""
    rng = np.random.default_rng(54)
    n, kinds = 300_000, 1000
    tolerances = [Tolerance(float(10.0 ** rng.integers(-8, -2)), float(10.0 ** rng.integers(-6, -1)))
                  for _ in range(kinds)] * (n // kinds)
    atol, rtol = (np.array([getattr(t, f) for t in tolerances[:kinds]] * (n // kinds)) for f in ("atol", "rtol"))
    ref = rng.normal(size=n) * 10.0 ** rng.integers(-6, 6, size=n)
    bound = atol + rtol * np.abs(ref)
    got = ref + np.sign(rng.normal(size=n)) * bound * (1 + rng.integers(-4, 5, size=n) * 2.0**-52)
    figures = measure_laid([got], [ref], np.ones(n, np.int64), tolerances)
    passed, over = np.array(figures.passed), np.array(figures.over_tolerance)
    np.testing.assert_array_equal(passed, np.abs(got - ref) <= bound)  # (the rule, element by element)
    assert 0.3 < passed.mean() < 0.9
    np.testing.assert_array_equal(passed, over <= 1)
    assert over[~passed].min() >= 1 + 2.0**-52
