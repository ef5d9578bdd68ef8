"""Every output of a multi-output op is served: a Split whose input has a symbolic length (TVM
re-derives its outputs' sizes, ``(n + 2) // 3`` becoming ``(n + 3 - 1) // 3``, and with them
new Vars), TopK's values and indices, NonMaxSuppression's selected_indices (whose row count only
the run knows)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h
from support.small_onnx import FLOAT, INT64, check_model, model, tensor

from tvm_probe import Probe
from tvm_probe.core.schema import PIPELINES


def three_way_split(length):
    """Relu, a 3-way Split of its output, each part negated; ``length``: an int or a dim name."""
    parts = ["a", "b", "c"]
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Split", ["r"], parts, name="split", axis=0, num_outputs=3)]
    nodes += [h.make_node("Neg", [p], [f"n{p}"], name=f"neg_{p}") for p in parts]
    outputs = [tensor(f"n{p}", FLOAT, [f"len_{p}"]) for p in parts]
    return model(nodes, [tensor("x", FLOAT, [length])], outputs)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("length", [7, "n"], ids=["static", "dynamic"])
def test_every_split_output_is_served(pipeline, length):
    proto = three_way_split(length)
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    served = {"r", "a", "b", "c", "na", "nb", "nc"}
    sizes = [7] if length == 7 else [7, 9]
    for n in sizes:
        x = np.linspace(-1, 2, n).astype("float32")
        check_model(probe, proto, {"x": x}, pipeline, served=served)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_topk_and_non_max_suppression(pipeline):
    topk = model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                  h.make_node("TopK", ["r", "k"], ["v", "i"], name="topk", axis=1),
                  h.make_node("Neg", ["v"], ["y"], name="neg")],
                 [tensor("x", FLOAT, [2, 5])], [tensor("y", FLOAT, [2, 2]), tensor("i", INT64, [2, 2])],
                 [h.make_tensor("k", INT64, [1], [2])])
    x = np.random.default_rng(0).standard_normal((2, 5)).astype("float32")
    check_model(Probe.from_onnx(topk, pipeline=pipeline), topk, {"x": x}, pipeline, served={"v", "i", "y"})
    nms = model([h.make_node("NonMaxSuppression", ["boxes", "scores", "most", "iou"], ["selected"], name="nms")],
                [tensor("boxes", FLOAT, [1, 4, 4]), tensor("scores", FLOAT, [1, 1, 4])],
                [tensor("selected", INT64, ["k", 3])],
                [h.make_tensor("most", INT64, [1], [3]), h.make_tensor("iou", FLOAT, [1], [0.5])])
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3], [0, 0, 0.5, 0.5]]], "float32")
    scores = np.array([[[0.9, 0.8, 0.7, 0.6]]], "float32")
    got = check_model(Probe.from_onnx(nms, pipeline=pipeline), nms, {"boxes": boxes, "scores": scores}, pipeline,
                      served={"selected"})
    assert got["selected"].shape[0] < 4  # the rows the run selected, not the padded table
