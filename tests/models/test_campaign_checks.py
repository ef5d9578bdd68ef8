"""The op campaign's own check (``support.campaign.check_values``) can fail: a served value is held
to plain TVM's own value of that tensor first, so one unlike it is a problem even where the
reference (onnxruntime, eager torch) agrees with it."""
from __future__ import annotations

import numpy as np
from onnx import helper as h
from support.campaign import Outcome, check_values
from support.small_onnx import FLOAT, model, tensor

from tvm_probe import Probe


def test_a_value_unlike_plain_tvms_own_is_a_problem_even_when_the_reference_agrees():
    proto = model([h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Neg", ["r"], ["y"], name="neg")],
                  [tensor("x", FLOAT, [2, 3])], [tensor("y", FLOAT, [2, 3])])
    x = np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)
    probe = Probe.from_onnx(proto)
    probe.run({"x": x})
    truth = {"r": np.maximum(x, 0), "y": -np.maximum(x, 0)}
    agreeing, disagreeing, alone = (Outcome("relu", "Relu", "default") for _ in range(3))
    check_values(agreeing, probe, truth, truth.get)
    check_values(disagreeing, probe, truth, lambda key: truth[key] + (key == "r"))  # plain TVM's r differs
    check_values(alone, probe, {"r": truth["r"] + 1}, lambda key: None)  # no TVM value: the reference decides
    assert agreeing.problems == [] and agreeing.against_tvm == agreeing.compared == 2
    assert [p.split(":")[0] for p in disagreeing.problems] == ["r"]
    assert [p.split(":")[0] for p in alone.problems] == ["r"] and alone.uncompared == 1  # (y: nothing to compare)
