"""A sequence (ONNX SplitToSequence: a Relax tuple of tensors) is a value like any other: a model
that returns one returns all its tensors, as plain TVM does; ``get`` answers the list of its
elements (as onnxruntime returns it), each element ``seq[k]`` is a value of its own; a dump
stores the elements and gives the sequence back as one value; a comparison with onnxruntime
lines the elements up.  On a symbolic length too (legalization re-derives the parts' sizes)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h
from support.small_onnx import FLOAT, model, plain_tvm_outputs, tensor

from tvm_probe import Probe, compare, load_dump
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.schema import PIPELINES


def split_to_sequence(length):
    """Relu, then SplitToSequence of its output into parts of 1, 2 and 3 rows (a model output)."""
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("SplitToSequence", ["r", "sizes"], ["seq"], name="to_seq", axis=0)]
    out = h.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    return model(nodes, [tensor("x", FLOAT, [length, 2])], [out], [h.make_tensor("sizes", TensorProto.INT64, [3], [1, 2, 3])])


def assert_lists_equal(ours, theirs, what):
    assert isinstance(ours, list) and len(ours) == len(theirs), (what, type(ours), len(theirs))
    for k, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"{what}: element {k}")


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("length", [6, "n"], ids=["static", "dynamic"])
def test_a_sequence_is_returned_served_dumped_and_compared_as_one_value(pipeline, length, tmp_path):
    proto = split_to_sequence(length)
    x = np.linspace(-1, 2, 12).astype("float32").reshape(6, 2)
    reference = onnxruntime_values(proto, {"x": x})
    plain = plain_tvm_outputs(proto, {"x": x}, pipeline)
    assert len(plain) == 3  # plain TVM returns the sequence as a tuple of its three tensors

    probe = Probe.from_onnx(proto, pipeline=pipeline)
    outputs = probe.run({"x": x})
    assert list(outputs) == ["seq"]
    assert_lists_equal(outputs["seq"], plain, "output vs plain TVM")
    assert_lists_equal(outputs["seq"], reference["seq"], "output vs onnxruntime")
    assert list(probe.last_transfer_us["outputs"]) == ["seq"]

    assert probe.served("seq") == "sequence"
    assert_lists_equal(probe.get("seq"), reference["seq"], "get")
    assert_lists_equal(probe.get("to_seq"), reference["seq"], "get by node name")
    for k in range(3):
        assert probe.served(f"seq[{k}]") in ("captured", "view")
        np.testing.assert_allclose(probe.get(f"seq[{k}]"), reference["seq"][k], rtol=1e-6)

    comparison = compare(probe, reference)
    assert not comparison.failed
    assert {v.key for v in comparison.values} >= {"r", "seq[0]", "seq[1]", "seq[2]"}

    verification = probe.verify({"x": x})  # (the unfused build finds the static sequence's elements)
    assert verification and verification.checked >= (4 if length == 6 else 1), verification.summary()

    dump = load_dump(probe.dump(tmp_path / "dump"))
    assert dump.served("seq") == "sequence"
    assert_lists_equal(dump.get("seq"), reference["seq"], "dump")
    np.testing.assert_allclose(dump.get("seq[2]"), reference["seq"][2], rtol=1e-6)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_uneven_split_parts_on_a_symbolic_length_are_served(pipeline):
    """Split into parts of 2 and 4 of an ``n``-length axis: TVM's import sizes them ``T.min(2, n)``
    and ``T.max(n - 2, 0)``, legalization ``2`` and ``n - 2`` (new Vars): equal wherever the split
    kernel can run, so both parts are followed."""
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"),
             h.make_node("Split", ["r", "sizes"], ["a", "b"], name="split", axis=0),
             h.make_node("Neg", ["b"], ["nb"], name="neg")]
    proto = model(nodes, [tensor("x", FLOAT, ["n"])], [tensor("a", FLOAT, [2]), tensor("nb", FLOAT, ["m"])],
                  [h.make_tensor("sizes", TensorProto.INT64, [2], [2, 4])])
    x = np.linspace(-1, 2, 6).astype("float32")
    reference = onnxruntime_values(proto, {"x": x})
    plain = plain_tvm_outputs(proto, {"x": x}, pipeline)
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    outputs = probe.run({"x": x})
    for name, theirs in zip(["a", "nb"], plain):
        np.testing.assert_allclose(outputs[name], theirs, rtol=1e-6)
    for key in ("r", "a", "b", "nb"):
        assert probe.served(key) not in ("unknown", "unavailable"), probe.kernel_map.lost.get(key)
        np.testing.assert_allclose(probe.get(key), reference[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_sequence_of_weights_is_served_where_the_pipeline_folds_it(pipeline):
    """SplitToSequence of a weight, one element taken out (SequenceAt) and added to the input:
    ``fused`` folds the sequence (FoldConstant), ``default`` computes it; each element and the
    sequence are served either way (``get`` once raised AttributeError on a folded tuple)."""
    nodes = [h.make_node("Relu", ["w"], ["rw"], name="relu"),
             h.make_node("SplitToSequence", ["rw", "sizes"], ["seq"], name="to_seq", axis=0),
             h.make_node("SequenceAt", ["seq", "pos"], ["part"], name="at"),
             h.make_node("Add", ["part", "x"], ["y"], name="add")]
    weight = np.linspace(-1, 2, 12).astype("float32").reshape(6, 2)
    proto = model(nodes, [tensor("x", FLOAT, [2, 2])], [tensor("y", FLOAT, [2, 2])],
                  [h.make_tensor("w", TensorProto.FLOAT, [6, 2], weight.ravel()),
                   h.make_tensor("sizes", TensorProto.INT64, [3], [1, 2, 3]),
                   h.make_tensor("pos", TensorProto.INT64, [], [1])])
    x = np.ones((2, 2), "float32")
    reference = onnxruntime_values(proto, {"x": x})
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    outputs = probe.run({"x": x})
    np.testing.assert_allclose(outputs["y"], plain_tvm_outputs(proto, {"x": x}, pipeline)[0], rtol=1e-6)
    assert probe.served("seq") == "sequence"
    assert_lists_equal(probe.get("seq"), reference["seq"], "get")
    comparison = compare(probe, reference)
    assert not comparison.failed and not comparison.unchecked
    assert {v.key for v in comparison.values} >= {"seq[0]", "seq[1]", "seq[2]", "part", "y"}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_sequences_built_of_values_are_served(pipeline):
    """SequenceConstruct of an input and a Relu, SequenceInsert of an Exp, ConcatFromSequence:
    TVM's import holds each sequence as a tuple literal (no Var); its elements are the values in
    it.  (Where the compiled module drops an element no output needs, it is unknown, saying so.)"""
    nodes = [h.make_node("Relu", ["y"], ["r"], name="relu"),
             h.make_node("SequenceConstruct", ["x", "r"], ["s"], name="construct"),
             h.make_node("Exp", ["x"], ["e"], name="exp"),
             h.make_node("SequenceInsert", ["s", "e"], ["s2"], name="insert"),
             h.make_node("ConcatFromSequence", ["s2"], ["a"], name="concat", axis=0),
             h.make_node("Neg", ["a"], ["o"], name="neg")]
    proto = model(nodes, [tensor("x", FLOAT, [2, 3]), tensor("y", FLOAT, [2, 3])], [tensor("o", FLOAT, [6, 3])])
    feeds = {"x": np.linspace(-1, 1, 6).astype("float32").reshape(2, 3),
             "y": np.linspace(2, -2, 6).astype("float32").reshape(2, 3)}
    reference = onnxruntime_values(proto, feeds)
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    outputs = probe.run(feeds)
    np.testing.assert_allclose(outputs["o"], plain_tvm_outputs(proto, feeds, pipeline)[0], rtol=1e-6)
    for name in ("s", "s2"):
        assert probe.served(name) == "sequence"
        assert_lists_equal(probe.get(name), reference[name], name)
    comparison = compare(probe, reference)
    assert not comparison.failed and not comparison.unchecked
    assert {v.key for v in comparison.values} >= {"s[0]", "s[1]", "s2[2]", "a", "o"}
