"""References as an extension point: a user's own reference, registered by name, is what a
config's ``reference:`` picks and what the verdict is judged against."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import ProbeError, Reference, get_reference, register_reference
from tvm_probe.app.config import ConfigError, load_config
from tvm_probe.app.investigate import investigate
from tvm_probe.comparison.reference import NO_REFERENCE, reference_names
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
    reserved.name = NO_REFERENCE
    with pytest.raises(ProbeError, match="reserved"):
        register_reference(reserved)
    reserved.name = "tvm"  # the built-in TVM build, registered by its own module on first use
    with pytest.raises(ProbeError, match="'tvm' is already registered"):
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


# -- another TVM build: the registered reference 'tvm' ---------------------------------------------
def test_another_tvm_build_is_a_registered_reference_loaded_on_first_use():
    import subprocess
    import sys

    code = ("import sys, tvm_probe.comparison.reference as r; names = r.reference_names(); "
            "print(names[0], names[-1], 'tvm_probe.probe' in sys.modules, 'tvm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["none", "tvm", "False", "False"]  # listed before its module is loaded
    from tvm_probe.probe.tvm_reference import TVMBuildReference

    build = get_reference("tvm")
    assert isinstance(build, Reference) and isinstance(build, TVMBuildReference) and "tvm" in reference_names()
    assert (build.target, build.pipeline) == ("llvm", "default") and build.label == "TVM (llvm, pipeline default)"
    assert all(build.runs(kind) for kind in ("onnx", "demo", "torch", "tflite"))
    assert reference_names().count("tvm") == 1 and NO_REFERENCE not in reference_names()[1:]


@pytest.fixture(scope="module")
def demo_fused():
    from tvm_probe import Probe, demo

    model = demo.tiny_bert(num_layers=1)
    inputs = demo.demo_inputs(model)
    probe = Probe.from_onnx(model, pipeline="fused")
    probe.run(inputs)
    return model, inputs, probe


def test_a_default_build_as_reference_agrees_with_onnxruntime_and_with_a_fused_build(demo_fused):
    from tvm_probe import compare
    from tvm_probe.probe.tvm_reference import TVMBuildReference
    from tvm_probe.core.tolerance import default_tolerance, within

    model, inputs, fused = demo_fused
    values = TVMBuildReference(pipeline="default").values(model, inputs)
    expected = onnxruntime_values(model, inputs)  # independent of TVM
    both = [k for k in values if k in expected]
    assert len(both) > 50 and not set(inputs) & set(values)  # computed values only, keyed like onnxruntime's
    wrong = [k for k in both if values[k].shape != expected[k].shape
             or not within(values[k], expected[k], default_tolerance(expected[k].dtype)).all()]
    assert wrong == []
    result = compare(fused, values)
    assert result and len(result.values) >= len(both), result.verdict()


def test_a_tvm_build_reuses_an_imported_model_and_is_compared_run_to_run(demo_fused):
    from tvm_probe import Probe, compare
    from tvm_probe.probe.tvm_reference import TVMBuildReference

    model, inputs, fused = demo_fused
    reference = TVMBuildReference(pipeline="default")
    run = reference.values_for(fused, model, inputs)  # what `reference: tvm` compares with
    assert isinstance(run, Probe) and run.imported is fused.imported  # not imported again
    assert len(run.kernel_map.sites) > len(fused.kernel_map.sites)  # the unfused build
    assert compare(fused, run), compare(fused, run).verdict()


def test_reference_tvm_in_a_config_is_another_build_and_none_is_no_comparison(tmp_path):
    outcome = investigate(_config(tmp_path, "tvm"))
    assert outcome.exit_code == Exit.OK and outcome.comparison and len(outcome.comparison.values) > 50
    assert investigate(_config(tmp_path, NO_REFERENCE)).comparison is None
