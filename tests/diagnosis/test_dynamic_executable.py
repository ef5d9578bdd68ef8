"""The dynamic executable as deployed: a model compiled with symbolic dimensions (no ``shapes=``),
probed at several input sizes with one Probe, each run's values against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tvm_probe.core.schema import PIPELINES

from tvm_probe import InputError, Probe, TVMCompileError
from tvm_probe.comparison.verdict import compare
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

from support.models import small_cnn



def dynamic_batch_cnn():
    model = small_cnn()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return model


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_one_probe_runs_a_dynamic_batch_cnn_at_several_sizes(pipeline, tmp_path):
    model = dynamic_batch_cnn()
    probe = Probe.from_onnx(model, pipeline=pipeline)
    assert [s.shape for s in probe.inputs] == [("N", 3, 16, 16)]
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        image = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        probe.run(image)
        result = compare(probe, onnxruntime_values(model, {"image": image}))
        assert result and len(result.values) > 10, result.verdict()
        assert probe.get("logits").shape == (batch, 10)
        probe.dump(tmp_path / f"b{batch}")
        assert probe.verify(image)
    from tvm_probe import load_dump

    assert load_dump(tmp_path / "b3").nodes["shape"].iloc[0] == (3, 3, 16, 16)  # this run's sizes


def test_sizes_of_one_symbolic_dimension_must_agree():
    model = dynamic_batch_cnn()
    extra = onnx.helper.make_tensor_value_info("bias", onnx.TensorProto.FLOAT, ["N", 10])
    model.graph.input.append(extra)
    model.graph.node.append(onnx.helper.make_node("Add", ["logits", "bias"], ["out"], name="add"))
    model.graph.output[0].CopyFrom(onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 10]))
    probe = Probe.from_onnx(model)
    with pytest.raises(InputError, match=r"^dimension 'N' is 2 in input 'image' but 1 in input 'bias'"):
        probe.run({"image": np.zeros((2, 3, 16, 16), np.float32), "bias": np.zeros((1, 10), np.float32)})


@pytest.fixture(scope="module")
def dynamic_bert(tmp_path_factory):
    pytest.importorskip("transformers")
    from support.hf_models import TEXT_AXES, export_legacy, hf_bert

    model, args = hf_bert()
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    export_legacy(model, args, path, ["input_ids", "attention_mask"],
                  {"input_ids": TEXT_AXES, "attention_mask": TEXT_AXES})
    return onnx.load(path)


@pytest.mark.slow
def test_a_dynamic_hf_bert_runs_at_several_sizes(dynamic_bert):
    """Every value equals onnxruntime's at two batch/sequence sizes — but for the TVM 0.27
    importer bug this export hits: ``Equal`` of a ``Shape`` and a constant is folded to False at
    import.  The verdict names it first, as it should."""
    probe = Probe.from_onnx(dynamic_bert, pipeline="default")
    assert [s.shape for s in probe.inputs] == [("batch", "seq"), ("batch", "seq")]
    rng = np.random.default_rng(1)
    for shape in ((2, 8), (1, 5)):
        inputs = {"input_ids": rng.integers(0, 100, shape), "attention_mask": np.ones(shape, np.int64)}
        probe.run(inputs)
        result = compare(probe, onnxruntime_values(dynamic_bert, inputs))
        wrong = {v.name for v in result.failed}  # the folded Equal, and the Wheres that read it
        assert wrong <= {"/bert/embeddings/Equal", "/bert/embeddings/Where", "/bert/Equal", "/bert/Where"}, \
            result.verdict()
        assert result.first_divergent.name == "/bert/embeddings/Equal"
        # shape values TVM holds only as expressions of a size known at run time (an arange's
        # length): unknown, saying why — never guessed
        assert set(result.unchecked) <= {"/bert/Shape_4_output_0", "/bert/Concat_output_0"}, result.unchecked
        assert all("as the symbolic expression" in why for why in result.unchecked.values())
        assert probe.served("/bert/Gather") == "shape" and probe.get("/bert/Gather") == shape[1]
        logits = onnxruntime_values(dynamic_bert, inputs)["logits"]
        np.testing.assert_allclose(probe.get("logits"), logits, atol=1e-4)


@pytest.mark.slow
def test_a_model_tvm_cannot_compile_dynamically_points_to_shapes(dynamic_bert):
    with pytest.raises(TVMCompileError, match=r"this model has symbolic dimensions \(inputs input_ids, "
                                              r"attention_mask\), which TVM 0.27 cannot compile here: pass shapes="):
        Probe.from_onnx(dynamic_bert, pipeline="fused")
