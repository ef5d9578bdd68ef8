"""How a value is served is a fact of one build, not of the imported model.

One import compiled with two pipelines serves the same source value in two ways (a kernel
output in the unfused build, kept inside a fused kernel or folded in the other); each probe
keeps its own table (``probe.servings``) and the imported model is left as it was.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import Probe
from tvm_probe.importer.onnx import import_onnx
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.sources import Kind, Served


def _model():
    """x @ Relu(Transpose(W)) + b → Relu: ``wr`` needs no input (folded by the fused pipeline),
    ``mm`` and ``add`` end up inside the fused matmul kernel."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.normal(size=(8,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], name="wt", perm=[1, 0]),
        helper.make_node("Relu", ["Wt"], ["Wr"], name="wr"),
        helper.make_node("MatMul", ["x", "Wr"], ["m"], name="mm"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "per_build", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.normal(size=(2, 16)).astype(np.float32)}


def test_one_import_two_pipelines_each_probe_serves_its_own_way():
    model, inputs = _model()
    ref = onnxruntime_values(model, inputs)
    imported = import_onnx(model)
    before = [v.to_record() for v in imported.sources]

    unfused = Probe.from_imported(imported, pipeline="default")
    fused = Probe.from_imported(imported, pipeline="fused")
    # the one import is shared, not copied per probe, and neither build wrote on it
    assert unfused.imported is imported and fused.imported is imported
    assert unfused.sources_map is fused.sources_map is imported.sources
    assert [v.to_record() for v in imported.sources] == before
    assert not hasattr(imported.sources["Wr"], "served")

    assert [unfused.served(k) for k in ("Wr", "m", "a", "y")] == ["captured"] * 4
    assert fused.served("Wr") == "folded"
    assert fused.served("m") == "recomputed" and fused.served("y") == "captured"
    assert unfused.servings["m"].node_index != fused.servings["m"].node_index

    unfused.run(inputs)
    fused.run(inputs)  # (a run of one build must not change what the other serves)
    for probe in (unfused, fused):
        table = probe.sources.set_index("tensor")
        for value in imported.sources:
            serving = probe.servings[value.key]
            assert (table.loc[value.key, "served"], table.loc[value.key, "node"]) == \
                (serving.served.value, serving.node_index), (probe.pipeline, value.key)
            if value.kind is Kind.VALUE:
                np.testing.assert_allclose(probe.get_tensor(value.key), ref[value.key], atol=1e-5,
                                           err_msg=f"{probe.pipeline} {value.key}")
    assert unfused.servings["Wr"].served is Served.CAPTURED and fused.servings["Wr"].served is Served.FOLDED
    assert [v.to_record() for v in imported.sources] == before


def test_a_dump_records_its_own_build_s_servings(tmp_path):
    from tvm_probe import load_dump

    model, inputs = _model()
    imported = import_onnx(model)
    for pipeline in ("default", "fused"):
        probe = Probe.from_imported(imported, pipeline=pipeline)
        probe.run(inputs)
        reader = load_dump(probe.dump(tmp_path / pipeline))
        assert reader.servings == probe.servings, pipeline
        assert reader.sources.equals(probe.sources), pipeline
