"""``pipeline=`` takes every name TVM registers (``relax.pipeline.PIPELINE_MAP``) and builds what
``tvm.compile(relax_pipeline=NAME)`` builds — failing, in one line, where plain TVM fails too."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_probe import PipelineError, Probe, demo
from tvm_probe.app.config import load_config
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.schema import PIPELINE_NAMES
from tvm_probe.importer.onnx import import_onnx


@pytest.fixture(scope="module")
def model():
    return demo.build({"num_layers": 1})


def _plain_tvm(model, inputs, pipeline):
    executable = tvm.compile(import_onnx(model).mod, "llvm", relax_pipeline=pipeline)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs.values()])


def test_every_name_tvm_registers_is_taken():
    assert set(relax.pipeline.PIPELINE_MAP) | {"fused"} == set(PIPELINE_NAMES)


def test_default_build_is_built_as_tvm_compile_builds_it(model):
    inputs = demo.demo_inputs(model)
    probe = Probe.from_onnx(model, pipeline="default_build")
    probe.run(inputs)
    plain = _plain_tvm(model, inputs, "default_build")
    plain = plain if hasattr(plain, "numpy") else plain[0]
    output = probe.sources_map.model_outputs[0]
    np.testing.assert_array_equal(probe.get(output), plain.numpy())
    key = probe.resolve("layer_._0/attention/self/MatMul")
    expected = onnxruntime_values(model, inputs, [key])[key]
    np.testing.assert_allclose(probe.get(key), expected, rtol=1e-3, atol=1e-4)


def test_zero_fails_in_one_line_as_plain_tvm_does(model):
    with pytest.raises(tvm.error.InternalError, match="CodeGenVM cannot emit this Relax operator"):
        _plain_tvm(model, demo.demo_inputs(model), "zero")
    with pytest.raises(PipelineError, match=r"^pipeline 'zero' never ran ToNonDataflow or CallTIRRewrite: it does "
                                            r"not lower the model for the VM \(tvm.compile fails on it too\)"):
        Probe.from_onnx(model, pipeline="zero")


def test_a_pipeline_that_needs_arguments_says_which_and_how(model):
    with pytest.raises(PipelineError, match=r"^pipeline 'static_shape_tuning' takes arguments \(missing 2 required "
                                            r"positional arguments: 'total_trials' and 'target'\): build it with "
                                            r"relax.get_pipeline\('static_shape_tuning', ...\)"):
        Probe.from_onnx(model, pipeline="static_shape_tuning")


def test_yaml_takes_tvms_names_and_lists_them_when_wrong(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {demo: {num_layers: 1}}\npipeline: default_build\n")
    assert load_config(config).pipeline == "default_build"
    config.write_text("model: {demo: {num_layers: 1}}\npipeline: turbo\n")
    with pytest.raises(Exception, match="default, fused, default_build, zero, static_shape_tuning, got 'turbo'"):
        load_config(config)
