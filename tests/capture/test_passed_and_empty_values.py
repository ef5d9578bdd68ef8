"""Values no kernel outputs and values with no elements are values like any other.

- An ``If``'s result is computed in whichever branch ran, outside any kernel call of ``main``:
  it is served where the VM passes it on (copied as the input of the kernel reading it, or as the
  model output the VM returns), for either branch.
- An empty tensor (a Slice whose start is past the end) is served, dumped and compared.
- A Shape with start > end is an empty int64 shape value.

Each model is made here with ``onnx.helper``; under both pipelines every served value is held
to onnxruntime's and to plain TVM's own (the model built with every tensor as an output).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h
from support.campaign import same, tvm_values
from support.small_onnx import FLOAT, INT64, check_model, model, tensor

from tvm_probe import Probe, compare, load_dump, onnxruntime_values
from tvm_probe.core.schema import PIPELINES


def _branch(name, nodes, out):
    return h.make_graph(nodes, name, [], [tensor(out, FLOAT, [2, 3])])


def if_model(variant: str):
    """``r = If(c, relu(x + 1), x * 2)``, then ``y = tanh(r)``; ``returned``: ``r`` is the model's
    output too; ``constant_branches``: ``r = If(c, 1, 2)`` (no kernel in a branch: the native
    instrument runs it).  Returns the model and ``r``'s value for ``x`` and ``c``."""
    const = lambda name, shape, v: h.make_node(  # noqa: E731
        "Constant", [], [name], value=h.make_tensor(name, FLOAT, shape, [v] * int(np.prod(shape))))
    if variant == "constant_branches":
        then, other = [const("t", [2, 3], 1.0)], [const("e", [2, 3], 2.0)]
        expected = lambda x, c: np.full_like(x, 1.0 if c else 2.0)  # noqa: E731
    else:
        then = [const("one", [], 1.0), h.make_node("Add", ["x", "one"], ["t1"]), h.make_node("Relu", ["t1"], ["t"])]
        other = [const("two", [], 2.0), h.make_node("Mul", ["x", "two"], ["e"])]
        expected = lambda x, c: np.maximum(x + 1, 0) if c else x * 2  # noqa: E731
    nodes = [h.make_node("If", ["c"], ["r"], name="if", then_branch=_branch("then", then, "t"),
                         else_branch=_branch("else", other, "e")),
             h.make_node("Tanh", ["r"], ["y"], name="tanh")]
    outputs = [tensor("y", FLOAT, [2, 3])] + ([tensor("r", FLOAT, [2, 3])] if variant == "returned" else [])
    return model(nodes, [tensor("x", FLOAT, [2, 3]), tensor("c", TensorProto.BOOL, [])], outputs, opset=17), expected


def check_against_plain_tvm(probe, proto, feeds, pipeline, served):
    """``check_model`` (outputs against plain TVM and onnxruntime, served values against
    onnxruntime), then every served value against plain TVM's value of that tensor."""
    got = check_model(probe, proto, feeds, pipeline, served=served)
    theirs = tvm_values(proto, feeds, pipeline)
    assert set(served) <= set(theirs), "plain TVM did not build the model with every tensor as an output"
    for key in served:
        assert same(got[key], theirs[key]), f"{key}: {got[key]} is not plain TVM's {theirs[key]}"
    return got


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("variant", ["read_by_a_kernel", "returned", "constant_branches"])
def test_an_if_result_is_served_for_either_branch(pipeline, variant, tmp_path):
    proto, expected = if_model(variant)
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    x = np.linspace(-2, 2, 6, dtype="float32").reshape(2, 3)
    for cond in (True, False):
        feeds = {"x": x, "c": np.array(cond)}
        got = check_against_plain_tvm(probe, proto, feeds, pipeline, served={"r", "y"})
        np.testing.assert_allclose(got["r"], expected(x, cond), rtol=1e-6)
    assert probe.servings["r"].served.value == "passed"
    comparison = compare(probe, onnxruntime_values(proto, feeds))
    assert {"r", "y"} <= {v.key for v in comparison.values if v.passed}
    probe.dump(tmp_path / "dump")
    np.testing.assert_array_equal(load_dump(tmp_path / "dump").get("r"), expected(x, False))
    probe.run(feeds, capture=["r"])  # a selection copies what the value needs
    np.testing.assert_array_equal(probe.get("r"), expected(x, False))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "dynamic"])
def test_an_empty_slice_is_a_value(pipeline, symbolic, tmp_path):
    ints = lambda n, v: h.make_tensor(n, INT64, [len(v)], v)  # noqa: E731
    shape = ["a", "b", "c"] if symbolic else [20, 10, 5]
    # (the slice alone: a run whose every copied output is empty still hands them over)
    proto = model([h.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"], name="slice")],
                  [tensor("x", FLOAT, shape)], [tensor("y", FLOAT, ["a", "e", "c"] if symbolic else [20, 0, 5])],
                  [ints("starts", [1000]), ints("ends", [1000]), ints("axes", [1]), ints("steps", [1])])
    feeds = {"x": np.random.default_rng(0).standard_normal((20, 10, 5)).astype("float32")}
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    got = check_against_plain_tvm(probe, proto, feeds, pipeline, served={"y"})
    assert got["y"].shape == (20, 0, 5)
    comparison = compare(probe, onnxruntime_values(proto, feeds))
    assert "y" in {v.key for v in comparison.values if v.passed}
    probe.dump(tmp_path / "dump")
    assert load_dump(tmp_path / "dump").get("y").shape == (20, 0, 5)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_shape_with_start_after_end_is_an_empty_shape(pipeline, tmp_path):
    proto = model([h.make_node("Shape", ["x"], ["y"], name="shape", start=2, end=1)],
                  [tensor("x", FLOAT, ["a", "b", "c"])], [tensor("y", INT64, [0])])
    feeds = {"x": np.ones((3, 4, 5), "float32")}
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    got = check_against_plain_tvm(probe, proto, feeds, pipeline, served={"y"})
    assert got["y"].shape == (0,) and got["y"].dtype == np.int64
    probe.dump(tmp_path / "dump")
    assert load_dump(tmp_path / "dump").get("y").shape == (0,)
