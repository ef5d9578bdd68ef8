"""Pipeline split: every value crossing a cut is exported; chained stages equal the whole model."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import Probe, demo
from tvm_probe.tools.split import SplitError, balance, layer_boundaries, run_pipeline, split

MASK = "tf_bert_for_sequence_classification/bert/Mul:0"  # the extended mask, made once before layer 0


@pytest.fixture(scope="module")
def bert12():
    model = demo.tiny_bert(num_layers=12)
    inputs = demo.demo_inputs(model)
    whole = Probe.from_onnx(model).run(inputs)
    return model, inputs, whole


def test_split_4_8_exports_the_mask_and_chains_to_the_whole(bert12):
    model, inputs, whole = bert12
    plan = split(model, ["layer_._3/output/LayerNorm"])
    assert len(plan.stages) == 2
    crossing = set(plan.crossings[0])
    assert MASK in crossing, "the mask is computed before layer 0 and used by layers 4-11"
    assert "tf_bert_for_sequence_classification/bert/encoder/layer_._3/output/LayerNorm/batchnorm/add_1:0" in crossing
    assert set(plan.stages[0].outputs) == crossing and set(plan.stages[1].inputs) == crossing
    chained = run_pipeline(plan, inputs, capture="all")
    np.testing.assert_allclose(chained["logits"], whole["logits"], rtol=0, atol=1e-5)
    table = plan.table()
    assert set(table["tensor"]) == crossing
    assert table.loc[table["tensor"] == MASK, "bytes"].item() == 4 * 16
    # each stage is a probe like any other
    second = plan.stages[1].probe
    assert second.get("layer_._4/attention/self/Softmax").shape == (1, 4, 16, 16)


def test_three_way_split(bert12):
    model, inputs, whole = bert12
    plan = split(model, ["layer_._3/output/LayerNorm", "*/layer_._7/*"], pipeline="fused")
    assert len(plan.stages) == 3
    assert MASK in plan.crossings[0] and MASK in plan.crossings[1]
    np.testing.assert_allclose(run_pipeline(plan, inputs)["logits"], whole["logits"], atol=1e-5)
    times = plan.measure(inputs, runs=1)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert abs(plan.stage_table()["time_share"].sum() - 1) < 1e-9


def test_balance_proposes_layer_boundary_cuts(bert12):
    model, inputs, _ = bert12
    assert len(layer_boundaries(model)) == 12
    # The cut follows measured kernel times, which another process on the machine can disturb (the
    # suite runs in parallel workers): medians of 3 runs, and a cut anywhere in the middle half of
    # 12 equal layers, rather than a bound on the evenness of one noisy run.
    cuts, evenness = balance(model, 1, inputs, runs=3)
    assert len(cuts) == 1 and cuts[0].startswith("tf_bert_for_sequence_classification/bert/encoder/layer_._")
    layer = int(cuts[0].split("layer_._")[1].split("/")[0])
    assert 3 <= layer <= 8, cuts
    assert evenness >= 1.0


@pytest.mark.parametrize("cuts, message", [
    (["layer_._99/output"], "cut 'layer_._99/output' names no node, scope or value of the model"),
    (["layer_._7/output/LayerNorm", "layer_._3/output/LayerNorm"], "cuts are out of order"),
    (["output/LayerNorm"], "cut 'output/LayerNorm' matches 24 scopes"),
    (["bert/embeddings/range"], "cut 'bert/embeddings/range' does not separate the graph"),
    (["classifier/BiasAdd"], "the last stage would be empty"),
    ([], "no cuts given"),
])
def test_bad_cuts(bert12, cuts, message):
    with pytest.raises(SplitError) as err:
        split(bert12[0], cuts)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_deep_bert_split_under_the_fused_pipeline_matches_the_whole():
    # 8 layers, hidden 256, seq 64: the mask crosses the cut as in bert-base, at a fraction of its
    # runs (bert-base itself is tests/models/test_bert_base.py)
    model = demo.tiny_bert(num_layers=8, hidden=256, heads=4, seq_len=64)
    inputs = demo.demo_inputs(model)
    plan = split(model, ["layer_._3/output/LayerNorm"], pipeline="fused")
    whole = Probe.from_onnx(model, pipeline="fused").run(inputs)
    assert MASK in plan.crossings[0]
    np.testing.assert_allclose(run_pipeline(plan, inputs)["logits"], whole["logits"], rtol=0, atol=1e-5)


def _if_after_cut_model():
    """``t = tanh(x)`` is read by the next stage only inside the branches of an If (then: ``t @ w``,
    else: ``t * x``); the cut goes after ``relu``, which the If's condition reads."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    w = nh.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "w")
    then_branch = h.make_graph([h.make_node("MatMul", ["t", "w"], ["then_out"], name="then_matmul")], "then", [],
                               [h.make_tensor_value_info("then_out", T.FLOAT, [2, 4])])
    else_branch = h.make_graph([h.make_node("Mul", ["t", "x"], ["else_out"], name="else_mul")], "else", [],
                               [h.make_tensor_value_info("else_out", T.FLOAT, [2, 4])])
    graph = h.make_graph([
        h.make_node("Tanh", ["x"], ["t"], name="tanh"),
        h.make_node("Relu", ["x"], ["r"], name="relu"),
        h.make_node("ReduceSum", ["r"], ["s"], name="sum", keepdims=0),
        h.make_node("Greater", ["s", "limit"], ["c"], name="big"),
        h.make_node("If", ["c"], ["z"], name="branch", then_branch=then_branch, else_branch=else_branch),
        h.make_node("Sigmoid", ["z"], ["out"], name="out"),
    ], "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 4])], [h.make_tensor_value_info("out", T.FLOAT, [2, 4])],
        initializer=[w, nh.from_array(np.array(2.0, np.float32), "limit")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_a_value_read_only_inside_an_if_crosses_the_cut():
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model = _if_after_cut_model()
    plan = split(model, ["relu"])
    assert "t" in plan.crossings[0], "the If's branches read t: it must cross the cut"
    assert "t" in plan.stages[0].outputs and "t" in plan.stages[1].inputs
    for scale in (1.0, -1.0):  # both branches: sum(relu(x)) > 2, and == 0
        x = (scale * (np.abs(np.random.default_rng(3).standard_normal((2, 4))) + 0.5)).astype(np.float32)
        ref = onnxruntime_values(model, {"x": x}, ["out"])
        np.testing.assert_allclose(run_pipeline(plan, {"x": x})["out"], ref["out"], rtol=1e-5, atol=1e-6)
