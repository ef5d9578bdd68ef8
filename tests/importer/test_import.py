"""Import with source names: the ops are those of a plain import; every tensor is answerable."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

from tvm_probe import AmbiguousNameError, Probe, ValueUnavailableError
from tvm_probe.importer.onnx import import_onnx
from tvm_probe.core.sources import Kind

from support.models import folding_model, split_model


def test_tagged_import_is_structurally_identical_to_a_plain_import(bert_model):
    import tvm
    from tvm.relax.frontend.onnx import from_onnx

    imported = import_onnx(bert_model)
    tvm.ir.assert_structural_equal(from_onnx(bert_model), imported.mod, map_free_vars=True)


def test_every_onnx_tensor_is_a_source_value(bert_model):
    imported = import_onnx(bert_model)
    tensors = {o for n in bert_model.graph.node for o in n.output}
    tensors |= {t.name for t in bert_model.graph.initializer} | {i.name for i in bert_model.graph.input}
    assert set(imported.sources.values) == tensors
    tagged = {k for keys in imported.var_keys.values() for k in keys}
    runtime = {v.key for v in imported.sources if v.kind in (Kind.VALUE, Kind.INPUT)}
    assert runtime == tagged  # every runtime value carries its name on a Relax Var
    assert {v.kind for v in imported.sources} == {Kind.VALUE, Kind.INPUT, Kind.PARAM, Kind.CONSTANT}


def test_folded_identity_and_dead_values_are_served_honestly():
    """FoldConstant-folded, identity-of-input and dead values, under both pipelines."""
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model, inputs = folding_model()
    ref = onnxruntime_values(model, inputs)
    expected = {"default": {"Wr": "captured", "xi": "input", "unused": "unavailable"},
                "fused": {"Wr": "folded", "xi": "input", "unused": "unavailable"}}
    for pipeline, how in expected.items():
        probe = Probe.from_onnx(model, pipeline=pipeline)
        probe.run(inputs)
        for key, served in how.items():
            assert probe.served(key) == served, (pipeline, key)
        for key in ("Wt", "Wr", "y", "xi", "xi2", "z"):
            np.testing.assert_allclose(probe.get(key), ref[key], atol=1e-5, err_msg=f"{pipeline} {key}")
        with pytest.raises(ValueUnavailableError, match="'dead' is dead code: no output of the source model depends on it"):
            probe.get("dead")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_multi_output_node_answers_to_node_colon_k_and_tensor_names(pipeline):
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model, inputs = split_model()
    ref = onnxruntime_values(model, inputs)
    probe = Probe.from_onnx(model, pipeline=pipeline)
    probe.run(inputs)
    for name, key in [("blk/split:0", "a"), ("split:1", "b"), ("a", "a"), ("b", "b"), ("blk/mul", "y")]:
        np.testing.assert_array_equal(probe.get(name), ref[key], err_msg=name)
    with pytest.raises(AmbiguousNameError, match="node 'blk/split' has 2 outputs: name one of 'blk/split:0', 'blk/split:1'"):
        probe.get("blk/split")
    if pipeline == "default":
        node = probe.servings["b"].node_index
        np.testing.assert_array_equal(probe.get_node_output(node, 1), ref["b"])


def _one_node_model(*nodes, inputs, outputs):
    from onnx import helper

    graph = helper.make_graph(list(nodes), "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_plain_import_uses_no_fix(bert_model):
    imported = import_onnx(bert_model)
    assert imported.fixes == [] and imported.unfixed == []


def test_a_node_tvm_fails_on_is_named_with_tvms_message_not_called_unsupported():
    """TopK is supported; a run-time k is not: a ModelError naming the node and TVM's reason."""
    from onnx import TensorProto, helper

    from tvm_probe import ModelError, UnsupportedOpError

    vi = helper.make_tensor_value_info
    model = _one_node_model(helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk"),
                            inputs=[vi("x", TensorProto.FLOAT, [2, 5]), vi("k", TensorProto.INT64, [1])],
                            outputs=[vi("v", TensorProto.FLOAT, [2, None]), vi("i", TensorProto.INT64, [2, None])])
    with pytest.raises(ModelError) as info:
        import_onnx(model)
    assert not isinstance(info.value, UnsupportedOpError)
    assert str(info.value) == "TVM's ONNX importer failed on node 'topk' (op TopK): TopK k must be a constant"


def test_a_failure_outside_the_converters_still_names_the_node():
    """TVM refuses shape values as inputs of most ops before converting: the node is named."""
    from onnx import TensorProto, helper

    from tvm_probe import ModelError

    vi = helper.make_tensor_value_info
    model = _one_node_model(helper.make_node("Shape", ["x"], ["s"], name="shape"),
                            helper.make_node("Neg", ["s"], ["y"], name="neg"),
                            inputs=[vi("x", TensorProto.FLOAT, [2, 5])], outputs=[vi("y", TensorProto.INT64, [2])])
    with pytest.raises(ModelError) as info:
        import_onnx(model)
    assert str(info.value) == ("TVM's ONNX importer failed on node 'neg' (op Neg): "
                               "Node neg cannot handle ShapeExpr inputs.")
