"""The bert-base preset (12 layers, hidden 768, seq 128): the last layer, by name, equals onnxruntime.

Slow (TVM's untuned CPU kernels take ~20 s per run), so it checks one pipeline and one layer.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import Probe, demo
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values


@pytest.mark.slow
def test_bert_base_last_layer_matches_onnxruntime():
    model = demo.bert_base()
    inputs = demo.demo_inputs(model)
    names = [f"layer_._11/attention/self/{op}" for op in ("MatMul", "add", "Softmax", "MatMul_1")]
    names += ["layer_._11/output/LayerNorm/batchnorm/add_1", "classifier/BiasAdd"]
    probe = Probe.from_onnx(model, pipeline="fused")
    probe.run(inputs, capture=names)
    keys = [probe.resolve(n) for n in names]
    ref = onnxruntime_values(model, inputs, names=keys)
    assert probe.served(names[0]) == "recomputed"
    for name, key in zip(names, keys):
        # Scores carry the -10000 mask: compare relative to magnitude as well.
        np.testing.assert_allclose(probe.get(name), ref[key], rtol=1e-4, atol=1e-4, err_msg=name)
