"""References as an extension point: a user's own reference, registered by name, is what a
config's ``reference:`` picks and what the verdict is judged against."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import ProbeError, Reference, get_reference, register_reference
from tvm_probe.app.config import ConfigError, load_config
from tvm_probe.app.investigate import investigate
from tvm_probe.comparison.reference import reference_names
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.schema import Exit

SHIFTED = "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/Softmax:0"


class ShiftedOnnxruntime(Reference):
    """onnxruntime's values with one intermediate moved: a reference that disagrees on purpose."""

    name, model_kinds = "shifted-ort", ("onnx", "demo")

    def __init__(self):
        self.calls = 0

    def values(self, model, inputs):
        self.calls += 1
        values = onnxruntime_values(model, inputs)
        values[SHIFTED] = values[SHIFTED] + 0.5
        return values


class TorchOnly(Reference):
    name, model_kinds = "torch-only", ("torch",)


@pytest.fixture(scope="module")
def shifted():
    return register_reference(ShiftedOnnxruntime(), replace=True)


def _config(tmp_path, reference: str):
    path = tmp_path / "c.yaml"
    path.write_text(f"model: {{demo: {{}}}}\nreference: {reference}\n")
    return load_config(path)


def test_a_registered_reference_is_what_the_verdict_is_judged_against(tmp_path, shifted):
    outcome = investigate(_config(tmp_path, "shifted-ort"))
    assert shifted.calls == 1
    comparison = outcome.comparison
    assert outcome.exit_code == Exit.DIVERGED
    assert comparison.first_divergent.key == SHIFTED
    # everything before the moved value agrees with it: the verdict is the reference's, not ours
    assert all(v.passed for v in comparison.values[: comparison.values.index(comparison.first_divergent)])
    assert get_reference("shifted-ort") is shifted and "shifted-ort" in reference_names()


def test_config_refuses_an_unknown_reference_and_names_the_registered_ones(tmp_path, shifted):
    with pytest.raises(ConfigError, match=r"reference.runtime: must be one of .*onnxruntime.*shifted-ort"):
        _config(tmp_path, "no-such-runtime")


def test_config_refuses_a_reference_that_cannot_run_the_model(tmp_path):
    register_reference(TorchOnly(), replace=True)
    with pytest.raises(ConfigError, match="'torch-only' cannot run an ONNX model: use reference: onnxruntime"):
        _config(tmp_path, "torch-only")


def test_register_refuses_nameless_reserved_and_taken_names(shifted):
    with pytest.raises(ProbeError, match="not a usable reference"):
        register_reference(Reference())
    reserved = ShiftedOnnxruntime()
    reserved.name = "tvm"
    with pytest.raises(ProbeError, match="reserved"):
        register_reference(reserved)
    with pytest.raises(ProbeError, match="already registered: pass replace=True"):
        register_reference(ShiftedOnnxruntime())
    with pytest.raises(ProbeError, match="unknown reference 'nope': use one of none, onnxruntime"):
        get_reference("nope")


def test_the_built_in_references_are_the_runtimes():
    assert get_reference("onnxruntime").runs("demo") and get_reference("torch").runs("torch")
    assert not get_reference("tflite").runs("onnx")
    from tvm_probe import demo

    model = demo.tiny_bert(num_layers=1)
    values = get_reference("onnxruntime").values(model, demo.demo_inputs(model))
    assert all(isinstance(v, np.ndarray) for v in values.values()) and len(values) > 50
