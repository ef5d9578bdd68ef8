"""Honest verdicts: every value asked about is accounted for; NaN, Inf, dtypes and shapes judged
as the issue reports demand.  Pure numpy where possible; one real model for the accounting."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tvm_probe.comparison.verdict import compare, compare_arrays
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

NAN, INF = np.nan, np.inf


def cmp(got, ref, dtype="float32"):
    return compare_arrays("k", "k", "captured", np.array(got, dtype), np.array(ref, dtype))


def test_nan_at_the_same_positions_is_agreement():
    result = cmp([1, NAN], [1, NAN])
    assert result.passed and result.max_abs == 0 and result.cosine == 1.0 and not result.note


def test_a_nan_tvm_drops_is_a_divergence_named_in_words():
    result = cmp(np.zeros(16), [0] * 14 + [NAN, NAN])
    assert not result.passed and result.nonfinite_differ
    assert result.note == "TVM gives 0 where the reference has NaN at 2 of 16 elements"


def test_a_nan_tvm_adds_is_a_divergence():
    result = cmp([1, NAN, 3], [1, 2, 3])
    assert not result.passed and result.note == "TVM gives NaN where the reference has 2 at 1 of 3 elements"


def test_infinity_must_be_the_same_infinity():
    result = cmp([0.5, 0.0, 123.0], [0.5, -INF, -INF])
    assert not result.passed
    assert result.note == "TVM gives finite values where the reference has -inf at 2 of 3 elements"
    assert not cmp([INF], [-INF]).passed and cmp([-INF, 1], [-INF, 1]).passed


def test_tolerance_follows_the_dtype():
    ref = np.linspace(-4, 4, 50).astype(np.float16)
    got = (ref.astype(np.float32) + 2.9e-3).astype(np.float16)  # fp16 rounding, not a bug
    result = compare_arrays("k", "k", "captured", got, ref)
    assert result.passed and result.tolerance == "atol 0.005, rtol 0.005"
    assert not compare_arrays("k", "k", "captured", np.array([3], "int64"), np.array([4], "int64")).passed


def test_a_shape_mismatch_is_said_in_the_verdict():
    result = cmp(np.zeros((3, 3)), np.zeros((4, 4)))
    assert not result.passed and result.describe() == "shape [3, 3] where the reference has [4, 4]"


@pytest.fixture(scope="module")
def folding():
    from support.models import folding_model
    from tvm_probe import Probe

    model, inputs = folding_model()
    probe = Probe.from_onnx(model, pipeline="fused")
    probe.run(inputs)
    return probe, onnxruntime_values(model, inputs)


def test_every_value_is_accounted_for(folding):
    probe, reference = folding
    result = compare(probe, reference)
    assert result, result.verdict()
    assert {v.key for v in result.values} | set(result.dead) == {
        v.key for v in probe.sources_map if v.kind.value not in ("input", "param")}
    assert result.dead == {"unused": "dead"}
    assert result.verdict() == ("all 6 compared values within tolerance; 1 dead-code value not computed; "
                                "default tolerance by dtype (float32 atol 0.0001, rtol 0.001)")


def test_a_value_asked_for_and_not_checked_is_not_a_pass(folding):
    probe, reference = folding
    partial = {k: v for k, v in reference.items() if k != "y"}
    result = compare(probe, partial)
    assert not result and not result.failed and result.unchecked == {"y": "the reference has no value for it"}
    assert result.verdict().startswith("FAIL: all 5 compared values within tolerance; 1 value asked for but "
                                       "not checked (first: mm: the reference has no value for it)")


def test_selective_capture_asks_only_for_what_it_captured(folding):
    probe, reference = folding
    probe.run(_inputs(), capture=["mm"])
    try:
        result = compare(probe, reference, keys=probe.captured_keys)
        assert result and [v.key for v in result.values] == ["y"] and not result.unchecked
    finally:
        probe.run(_inputs())


def _inputs():
    from support.models import folding_model

    return folding_model()[1]


def test_one_array_for_a_one_input_model(folding):
    probe, _ = folding
    x = _inputs()["x"]
    np.testing.assert_array_equal(probe.run(x)["z"], probe.run({"x": x})["z"])


def test_unchecked_values_are_listed_in_source_order_whatever_kept_them_out(folding):
    """Values the run did not capture ('y', 'xi2': first in source order) and one the reference
    lacks ('z', last) are all unchecked, in source order, each with its reason: the verdict names the
    first; what ``serve_many`` answers is what ``get_tensor`` answers, value or error."""
    from tvm_probe.core.errors import ProbeError

    probe, reference = folding
    probe.run(_inputs(), capture=["add"])
    try:
        result = compare(probe, {k: v for k, v in reference.items() if k != "z"})
        assert list(result.unchecked) == ["y", "xi2", "z"]
        assert result.unchecked["z"] == "the reference has no value for it"
        for key in ("y", "xi2"):
            with pytest.raises(ProbeError) as not_captured:
                probe.get_tensor(key)
            assert result.unchecked[key] == f"not served: {not_captured.value}"
        assert "(first: mm: not served: " in result.verdict()
        keys = [v.key for v in probe.sources_map if v.kind.value not in ("param",) and v.key != "unused"]
        for key, served in zip(keys, probe.serve_many(keys), strict=True):
            if isinstance(served, ProbeError):
                with pytest.raises(ProbeError, match=re.escape(str(served))):
                    probe.get_tensor(key)
            else:
                assert served.dtype == probe.get_tensor(key).dtype and np.array_equal(served, probe.get_tensor(key))
        assert any(isinstance(s, ProbeError) for s in probe.serve_many(keys))
    finally:
        probe.run(_inputs())


def test_progress_moves_while_the_values_are_served():
    """A compare of more values than one ``serve_many`` takes serves them a few dozen at a time,
    reporting progress between the servings (a dump read back from disk reads each value then),
    not all of it before the first."""
    from support.models import chained_matmuls
    from tvm_probe import Probe

    model, inputs = chained_matmuls(layers=70, n=4)
    probe = Probe.from_onnx(model)
    probe.run(inputs)
    events, serve = [], probe.serve_many
    probe.serve_many = lambda keys: (events.append(("served", len(keys))), serve(keys))[1]  # (a spy)
    result = compare(probe, onnxruntime_values(model, inputs), progress=lambda done, total: events.append(done))
    assert result and len(result.values) == 70
    servings = [i for i, event in enumerate(events) if type(event) is tuple]
    assert [events[i][1] for i in servings] == [64, 6] and servings[0] < events.index(64)
    assert [event for event in events if type(event) is int] == list(range(70))
