"""Every bad input is a ProbeError subclass with a one-line message that says what to do."""
from __future__ import annotations


import numpy as np
import pytest
from support.processes import run_cli
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import (InputError, ModelError, NotRunError, PipelineError, Probe, ProbeError,
                       UnsupportedOpError)

from support.models import folding_model


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text, text
    assert isinstance(err.value, ProbeError)
    return text


def single_node_model(node, inits=()):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def small_probe():
    model, inputs = folding_model()
    return Probe.from_onnx(model), inputs


def test_missing_file(tmp_path):
    with pytest.raises(ModelError) as err:
        Probe.from_onnx(tmp_path / "nope.onnx")
    assert one_line(err) == f"model file '{tmp_path / 'nope.onnx'}' does not exist: check the path"


@pytest.mark.parametrize("content", [b"", b"this is not a protobuf \xff\xfe", b"\x08\x07"])
def test_not_an_onnx_file(tmp_path, content):
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError) as err:
        Probe.from_onnx(path)
    assert one_line(err).startswith(f"'{path}' is not an ONNX model")


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(ModelError, match="is not a file"):
        Probe.from_onnx(tmp_path)


def test_wrong_model_type():
    with pytest.raises(ModelError, match="cannot import a dict"):
        Probe.from_onnx({"not": "a model"})


def test_op_without_converter_names_node_and_op():
    model = single_node_model(helper.make_node("FooBar", ["x"], ["y"], name="block1/foo"))
    with pytest.raises(UnsupportedOpError) as err:
        Probe.from_onnx(model)
    assert one_line(err) == ("node 'block1/foo' has op type FooBar, which TVM's ONNX importer cannot "
                             "convert: replace the op in the model or register a converter")


def test_converter_failure_names_node_and_op():
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "p")
    model = single_node_model(helper.make_node("Pad", ["x", "p"], ["y"], name="", mode="wrap"), [pads])
    with pytest.raises(UnsupportedOpError) as err:
        Probe.from_onnx(model)
    assert one_line(err).startswith("TVM's ONNX importer failed on node producing 'y' (op Pad): ")


def test_unknown_pipeline_and_target():
    model, _ = folding_model()
    with pytest.raises(PipelineError) as err:
        Probe.from_onnx(model, pipeline="turbo")
    assert one_line(err) == "unknown pipeline 'turbo': use one of default, fused, default_build, zero, static_shape_tuning or a tvm.transform.Pass"
    with pytest.raises(PipelineError) as err:
        Probe.from_onnx(model, target="no-such-target")
    assert one_line(err).startswith("target 'no-such-target' is not a TVM target")


def test_get_before_run():
    model, _ = folding_model()
    probe = Probe.from_onnx(model)
    with pytest.raises(NotRunError) as err:
        probe.get("y")
    assert one_line(err) == "the model has not run yet: call probe.run(inputs) before reading values"


@pytest.mark.parametrize("inputs, message", [
    (None, "no inputs given: run() needs x float32[2, 16]"),
    ({}, "missing input(s) 'x': run() needs x float32[2, 16]"),
    ({"x": np.zeros((2, 16), np.float32), "mask": np.zeros(2)},
     "unknown input(s) 'mask': the model's inputs are x float32[2, 16]"),
    ({"x": np.zeros((2, 15), np.float32)}, "input 'x' has shape [2, 15], the model expects [2, 16]"),
    ({"x": np.zeros((2, 16), np.float64)},
     "input 'x' has dtype float64, the model expects float32: convert it with .astype('float32')"),
    ({"x": np.zeros((16,), np.float32)}, "input 'x' has shape [16], the model expects [2, 16]"),
    ([np.zeros((2, 16), np.float32)] * 2, "got 2 inputs, the model takes 1: x float32[2, 16]"),
    ({"x": [["a"]]}, "input 'x' has dtype <U1, the model expects float32: convert it with .astype('float32')"),
])
def test_bad_inputs(small_probe, inputs, message):
    probe, _ = small_probe
    with pytest.raises(InputError) as err:
        probe.run(inputs)
    assert one_line(err) == message


def test_inputs_as_a_list_in_declared_order(small_probe):
    probe, inputs = small_probe
    out = probe.run([inputs["x"]])
    np.testing.assert_array_equal(out["z"], probe.run(inputs)["z"])


def test_cli_bad_input_exits_2_without_traceback(tmp_path):
    proc = run_cli("get", tmp_path / "nope", "x", quiet=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"tvm-probe: error: dump folder '{tmp_path / 'nope'}' does not exist: " \
                                  "give the dump folder tvm-probe run wrote (output.dump; tvm_probe_out/MODEL/dump " \
                                  "for a model file) or one TVM's debug executor wrote"
    assert "Traceback" not in proc.stderr
