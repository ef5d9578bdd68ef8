"""Input dims written as ``-1`` or as paddle2onnx's ``'?'`` are unknown dims, as onnxruntime reads
them: ``shapes=`` pins them, and without it each is a symbolic dimension of its own.  A declared
``0`` stays a size, as onnxruntime keeps it.

The model is built like PaddleOCR's text-direction classifier (``ch_ppocr_mobile_v2.0_cls``):
input ``x [-1, 3, ?, ?]``, and a ``Reshape`` whose target is computed from a ``Shape`` (the
``Shape → Cast → Slice → Cast → Concat`` chain paddle2onnx writes for ``flatten``).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tvm_probe import Probe
from tvm_probe.core.errors import InputError, ModelError
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.schema import PIPELINES
from tvm_probe.core.sources import Kind, Served
from tvm_probe.core.tolerance import Tolerance, within
from tvm_probe.importer.onnx import import_onnx

TOL = Tolerance(1e-4, 1e-4)


def _input(dims):
    """``x`` float with ``dims``: an int is a dim_value (-1 and 0 included), a str a dim_param."""
    vi = h.make_tensor_value_info("x", T.FLOAT, None)
    shape = vi.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d
    return vi


def paddle_like(batch=-1, reshape_of_shape=True) -> onnx.ModelProto:
    """Conv → Relu → GlobalAveragePool → flatten (a Reshape of a shape tensor, or a constant
    target) → MatMul → Softmax, input ``x [batch, 3, ?, ?]``."""
    rng = np.random.default_rng(0)
    weights = [nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "conv_w"),
               nh.from_array(rng.standard_normal((8, 2)).astype(np.float32), "fc_w")]
    if reshape_of_shape:
        flatten = [
            h.make_node("Shape", ["pool"], ["pool_shape"], name="Shape@0"),
            h.make_node("Cast", ["pool_shape"], ["shape_i32"], name="Cast@0", to=T.INT32),
            h.make_node("Constant", [], ["starts"], name="Constant@0", value=nh.from_array(np.array([0], np.int64))),
            h.make_node("Constant", [], ["ends"], name="Constant@1", value=nh.from_array(np.array([1], np.int64))),
            h.make_node("Slice", ["shape_i32", "starts", "ends"], ["batch_i32"], name="Slice@0"),
            h.make_node("Cast", ["batch_i32"], ["batch"], name="Cast@1", to=T.INT64),
            h.make_node("Constant", [], ["minus_one"], name="Constant@2",
                        value=nh.from_array(np.array([-1], np.int64))),
            h.make_node("Concat", ["batch", "minus_one"], ["target"], name="Concat@0", axis=0),
        ]
    else:
        flatten = [h.make_node("Constant", [], ["target"], name="Constant@0",
                               value=nh.from_array(np.array([-1, 8], np.int64)))]
    nodes = [
        h.make_node("Conv", ["x", "conv_w"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["conv"], ["relu"], name="relu"),
        h.make_node("GlobalAveragePool", ["relu"], ["pool"], name="pool"),
        *flatten,
        h.make_node("Reshape", ["pool", "target"], ["flat"], name="Reshape@0"),
        h.make_node("MatMul", ["flat", "fc_w"], ["logits"], name="fc"),
        h.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = h.make_graph(nodes, "paddle_like", [_input([batch, 3, "?", "?"])],
                         [h.make_tensor_value_info("probs", T.FLOAT, [batch, 2])], initializer=weights)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 11)])
    onnx.checker.check_model(model)
    return model


def _x(n, height, width, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 3, height, width)).astype(np.float32)


def _check_against_onnxruntime(probe, model, x):
    ref = onnxruntime_values(model, {"x": x})
    checked = 0
    for value in probe.sources_map:
        if value.kind in (Kind.INPUT, Kind.PARAM):
            continue
        assert probe.servings[value.key].served not in (Served.UNKNOWN, Served.UNAVAILABLE), value.key
        got = probe.get_tensor(value.key)
        assert got.shape == ref[value.key].shape and within(got, ref[value.key], TOL).all(), value.key
        checked += 1
    return checked


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_minus_one_dims_take_shapes(pipeline):
    model = paddle_like()
    probe = Probe.from_onnx(model, pipeline=pipeline, shapes={"x": [1, 3, 48, 192]})
    assert probe.inputs[0].shape == (1, 3, 48, 192)
    probe.run({"x": _x(1, 48, 192)})
    assert _check_against_onnxruntime(probe, model, _x(1, 48, 192)) >= 10
    # the Reshape of a shape tensor was folded: its target is a constant of the compiled model
    assert probe.servings["target"].served is Served.CONSTANT


def test_zero_stays_a_size_as_in_onnxruntime():
    model = paddle_like(batch=0, reshape_of_shape=False)
    with pytest.raises(ModelError, match="onnxruntime cannot run the model: .*invalid dimensions for input: x"):
        onnxruntime_values(model, {"x": _x(2, 8, 12)})  # what onnxruntime makes of a declared 0
    with pytest.raises(ModelError, match=r"sets dim 0 to 2; the model declares x \[0, 3, \?, \?\]: keep its fixed "
                                         r"sizes: pass shapes=\{'x': \(0, 3, 8, 12\)\}"):
        Probe.from_onnx(model, shapes={"x": [2, 3, 8, 12]})


def test_a_declared_dim_is_still_checked():
    with pytest.raises(ModelError, match=r"input 'x', \[1, 4, 48, 192\], sets dim 1 to 4; the model declares "
                                         r"x \[\?, 3, \?, \?\]"):
        Probe.from_onnx(paddle_like(), shapes={"x": [1, 4, 48, 192]})


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_without_shapes_each_unknown_dim_is_a_size_of_its_own(pipeline):
    model = paddle_like(reshape_of_shape=False)
    probe = Probe.from_onnx(model, pipeline=pipeline)
    assert probe.inputs[0].shape == ("x_dim0", 3, "x_dim2", "x_dim3")
    for n, height, width in ((1, 8, 12), (3, 10, 6)):  # height and width differ: '?' names no size
        x = _x(n, height, width)
        probe.run({"x": x})
        _check_against_onnxruntime(probe, model, x)


def test_without_shapes_what_tvm_cannot_follow_is_pinned_to_1_and_said(caplog):
    """TVM's importer loses the unknown dims in the Reshape of a Shape: they are pinned (1 each), the
    model folded static, a warning names each choice, and a run of other sizes says how to get them."""
    model = paddle_like()
    with caplog.at_level("WARNING", logger="tvm_probe"):
        probe = Probe.from_onnx(model)
    assert probe.inputs[0].shape == (1, 3, 1, 1) and probe.inputs[0].pinned == (0, 2, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "x: dimension 0 (?) set to 1, dimension 2 (?) set to 1, dimension 3 (?) set to 1; "
        "choose with shapes={'x': (1, 3, 1, 1)}"]
    x = _x(1, 1, 1)
    probe.run({"x": x})
    _check_against_onnxruntime(probe, model, x)
    with pytest.raises(InputError, match=r"built for \[1, 3, 1, 1\]: build it for yours, with "
                                         r"shapes=\{'x': \(2, 3, 8, 12\)\}$"):
        probe.run({"x": _x(2, 8, 12)})


def test_a_dimension_tvm_cannot_follow_takes_the_size_of_the_input_given():
    """A config's run knows its input arrays before the import: their sizes are pinned, not 1."""
    imported = import_onnx(paddle_like(), sizes={"x": (2, 3, 8, 12)})
    assert [(p.name, p.shape, p.from_inputs) for p in imported.pinned] == [("x", (2, 3, 8, 12), True)]
    assert imported.inputs[0].shape == (2, 3, 8, 12)
