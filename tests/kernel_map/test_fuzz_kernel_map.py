"""Differential fuzzing of the kernel map: random graphs, every served value against onnxruntime.

The graphs (``tests/support/fuzz_graphs.py``) repeat subexpressions, share weights and whole blocks, use
multi-output ops, views, foldable and dead branches — what broke the map on real models.  Under
both pipelines every served value must equal onnxruntime's and every "dead" / "folded" /
"constant" claim must hold (:func:`fuzz_graphs.check_probe`).  CI runs a fixed budget with a
fixed seed; ``python bench/fuzz.py --graphs 5000`` runs thousands on demand.  A graph that fails
here becomes a named test in ``tests/kernel_map/test_kernel_map_regressions.py``.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tvm_probe.core.schema import PIPELINES
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from support.fuzz_graphs import HypothesisChooser, check_probe, random_graph, random_inputs

BUDGET = 120  # graphs, each probed under both pipelines (bench/fuzz.py runs longer campaigns)


@pytest.mark.slow
@settings(max_examples=BUDGET, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example compiles twice
          suppress_health_check=list(HealthCheck))
@given(st.data())
def test_every_served_value_of_a_random_graph_is_right(data):
    from tvm_probe import Probe

    model, inputs = random_graph(HypothesisChooser(data))
    other = random_inputs(model, np.random.default_rng(1))
    for pipeline in PIPELINES:
        probe = Probe.from_onnx(model, pipeline=pipeline)
        probe.run(inputs)
        problems = check_probe(probe, model, inputs, other)
        assert not problems, (f"pipeline {pipeline}: {problems}\n"
                              f"{onnx.helper.printable_graph(model.graph)}")
