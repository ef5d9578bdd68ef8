"""verify() on every model the tests build, under both pipelines.

verify() checks each served value against an independent unfused build of the same import (see
tvm_probe/probe/verify.py); a model where it fails means tvm_probe would serve a wrong tensor there.
The fuzzer (test_fuzz_kernel_map.py), the kernel-map regressions, the dynamic-shape and TFLite
tests run it on their own models.
"""
from __future__ import annotations

import pytest

from tvm_probe import Probe, demo

from tvm_probe.core.schema import PIPELINES
from support.handwritten_models import merged_qkv_bert
from support.models import cnn_inputs, folding_model, small_cnn, split_model


def _with_inputs(model, make_inputs):
    return model, make_inputs(model)


ONNX_MODELS = {
    "demo BERT": lambda: _with_inputs(demo.tiny_bert(), demo.demo_inputs),
    "CNN": lambda: _with_inputs(small_cnn(), cnn_inputs),
    "folding": folding_model,
    "split": split_model,
    "merged-QKV BERT": merged_qkv_bert,
}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(ONNX_MODELS))
def test_every_onnx_test_model_verifies(name, pipeline):
    model, inputs = ONNX_MODELS[name]()
    result = Probe.from_onnx(model, pipeline=pipeline).verify(inputs)
    assert result, result.summary()
    assert result.checked > 0


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", ["tiny_torch_bert", "tiny_torch_cnn"])
def test_every_torch_test_model_verifies(name, pipeline):
    from support import torch_models

    model, args = getattr(torch_models, name)()
    result = Probe.from_torch(model, args, pipeline=pipeline).verify([a.numpy() for a in args])
    assert result, result.summary()
    assert result.checked > 0
