"""Shape and scalar values (what ONNX's Shape computes, a Gather of one of its dims, the target
shape of a Reshape) are values like any other: a model returning one runs, ``get`` serves it
(at this run's input sizes), a dump keeps it; and an output the model leaves empty (torch's
``return x + 1, None``) is no failure."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper as h
from support.small_onnx import FLOAT, INT64, check_model, model, tensor

from tvm_probe import Probe, compare, load_dump, onnxruntime_values
from tvm_probe.core.schema import PIPELINES


def shape_models():
    """(model, served names, feeds of two runs with different sizes) per shape-value class."""
    x = tensor("x", FLOAT, ["n", 3])
    feeds = [{"x": np.ones((4, 3), "float32")}, {"x": np.arange(21, dtype="float32").reshape(7, 3)}]
    shape_of = model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                      h.make_node("Shape", ["r"], ["s"], name="shape")], [x], [tensor("s", INT64, [2])])
    start_end = model([h.make_node("Shape", ["x"], ["s"], name="shape", start=0, end=1),
                       h.make_node("Shape", ["x"], ["t"], name="tail", start=-1)],
                      [x], [tensor("s", INT64, [1]), tensor("t", INT64, [1])])
    reshape = model([h.make_node("Shape", ["x"], ["s"], name="shape"),
                     h.make_node("Gather", ["s", "zero"], ["g"], name="gather", axis=0),
                     h.make_node("Neg", ["x"], ["m"], name="neg"),
                     h.make_node("Reshape", ["m", "s"], ["y"], name="reshape")],
                    [x], [tensor("s", INT64, [2]), tensor("g", INT64, []), tensor("y", FLOAT, ["n", 3])],
                    [h.make_tensor("zero", INT64, [], [0])])
    return [(shape_of, {"s"}, feeds), (start_end, {"s", "t"}, feeds), (reshape, {"s", "g", "m", "y"}, feeds)]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", range(3), ids=["shape", "start_end", "reshape_target"])
def test_a_model_returning_shape_values_runs_and_serves_them(pipeline, case, tmp_path):
    proto, served, runs = shape_models()[case]
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    for feeds in runs:  # a shape value follows this run's sizes
        got = check_model(probe, proto, feeds, pipeline, served=served)
        if "s" in served and case != 1:
            np.testing.assert_array_equal(got["s"], feeds["x"].shape)
    comparison = compare(probe, onnxruntime_values(proto, runs[-1]))  # compared like any value
    assert served <= {v.key for v in comparison.values if v.passed}
    probe.dump(tmp_path / "dump")
    dump = load_dump(tmp_path / "dump")
    for name in served:
        np.testing.assert_array_equal(dump.get(name), probe.get(name), err_msg=name)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_squeeze_with_axes_given_at_run_time(pipeline):
    proto = model([h.make_node("Squeeze", ["x", "axes"], ["y"], name="squeeze"),
                   h.make_node("Neg", ["y"], ["z"], name="neg")],
                  [tensor("x", FLOAT, [2, 1, 3]), tensor("axes", INT64, [1])], [tensor("z", FLOAT, [2, 3])])
    feeds = {"x": np.arange(6, dtype="float32").reshape(2, 1, 3), "axes": np.array([1])}
    check_model(Probe.from_onnx(proto, pipeline=pipeline), proto, feeds, pipeline, served={"y", "z"})


class LeavesAnOutputEmpty(torch.nn.Module):
    def forward(self, x):
        return x + 1, None


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_torch_output_left_empty(pipeline):
    x = torch.randn(2, 3)
    probe = Probe.from_torch(LeavesAnOutputEmpty(), (x,), pipeline=pipeline)
    for _ in range(2):
        outputs = probe.run([x.numpy()])
        assert list(outputs) == ["add"]
        np.testing.assert_allclose(outputs["add"], (x + 1).numpy(), rtol=1e-6)
        np.testing.assert_allclose(probe.get("add"), (x + 1).numpy(), rtol=1e-6)
