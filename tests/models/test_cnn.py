"""A small CNN with unnamed nodes and weights listed as graph inputs: found by tensor names."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

from tvm_probe import Probe
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.sources import Kind

from support.models import cnn_inputs, small_cnn


@pytest.fixture(scope="module")
def cnn():
    model = small_cnn()
    inputs = cnn_inputs(model)
    return model, inputs, onnxruntime_values(model, inputs)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_cnn_value_matches_onnxruntime_by_tensor_name(cnn, pipeline):
    model, inputs, ref = cnn
    assert all(not n.name for n in model.graph.node)
    probe = Probe.from_onnx(model, pipeline=pipeline)
    assert [s.name for s in probe.inputs] == ["image"]  # weights are initializers, not inputs
    probe.run(inputs)
    values = [v for v in probe.sources_map if v.kind is Kind.VALUE]
    assert {v.op_type for v in values} >= {"Conv", "BatchNormalization", "Relu", "Add", "MaxPool",
                                           "GlobalAveragePool", "Flatten", "Gemm"}
    for value in values:
        assert value.display_name == value.key  # no node name: the tensor name is the name
        np.testing.assert_allclose(probe.get(value.key), ref[value.key], atol=1e-4, err_msg=value.key)
    assert probe.served("conv1.weight") == "constant"
    if pipeline == "fused":
        assert probe.served("bn1_out") == "recomputed"
