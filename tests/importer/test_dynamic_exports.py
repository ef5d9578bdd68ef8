"""Models exported with dynamic axes probe with ``shapes=`` (issue 12).

Each model is exported in the test (transformers BERT through both torch exporters, a GPT-2
causal LM through the dynamo exporter, a CNN with a dynamic batch) and probed under both
pipelines with its inputs pinned by ``shapes=``.  Every value is checked against onnxruntime
running the *dynamic* model on the same inputs, module paths against eager PyTorch, and
``probe.verify`` against an unfused build.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")

from tvm_probe import ModelError, Probe  # noqa: E402
from tvm_probe.importer.onnx import import_onnx, load_onnx  # noqa: E402
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values  # noqa: E402
from tvm_probe.core.sources import Kind  # noqa: E402

from support.hf_models import TEXT_AXES, export_dynamo, export_legacy, hf_bert, hf_gpt2, logits  # noqa: E402
from support.torch_models import eager_module_outputs, tiny_torch_cnn  # noqa: E402

ATOL = 1e-4
TEXT = ["input_ids", "attention_mask"]

# name → (model factory, exporter, input names, dynamic axes, module paths checked against eager)
EXPORTS = {
    "bert_legacy": (hf_bert, export_legacy, TEXT, {n: TEXT_AXES for n in TEXT}, []),
    "bert_dynamo": (hf_bert, export_dynamo, TEXT, {n: TEXT_AXES for n in TEXT},
                    ["bert.embeddings", "bert.encoder.layer.0.attention.self.query",
                     "bert.encoder.layer.1.output", "bert.pooler", "classifier"]),
    "gpt2_dynamo": (hf_gpt2, export_dynamo, ["input_ids"], {"input_ids": TEXT_AXES},
                    ["transformer.h.0.ln_1", "transformer.h.0.mlp", "transformer.h.1.attn.c_proj",
                     "transformer.ln_f", "lm_head"]),
    "cnn_legacy": (tiny_torch_cnn, export_legacy, ["image"], {"image": {0: "batch"}}, []),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name → (path of the dynamic ONNX export, torch module, example args); built on first use."""
    cache = {}

    def get(name):
        if name not in cache:
            factory, export, names, axes, _ = EXPORTS[name]
            module, args = factory(batch=2)
            path = export(module, args, tmp_path_factory.mktemp(name) / f"{name}.onnx", names, axes)
            cache[name] = (path, module, args)
        return cache[name]
    return get


def _feeds(name, args) -> dict[str, np.ndarray]:
    return {n: a.numpy() for n, a in zip(EXPORTS[name][2], args)}


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", list(EXPORTS))
def test_dynamic_export_probes_with_shapes(exported, name, pipeline):
    path, module, args = exported(name)
    feeds = _feeds(name, args)
    assert load_onnx(path).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    reference = onnxruntime_values(path, feeds)  # the dynamic model, as onnxruntime runs it
    probe = Probe.from_onnx(path, pipeline=pipeline, shapes={n: a.shape for n, a in feeds.items()})
    outputs = probe.run(feeds)
    checked = [v.key for v in probe.imported.sources if v.key in reference]
    assert len(checked) == len(reference)  # every tensor of the export is a source value
    for key in checked:
        np.testing.assert_allclose(probe.get(key), reference[key], atol=ATOL, err_msg=f"{name} {pipeline} {key}")
    with torch.no_grad():
        eager = logits(module(*args))
    np.testing.assert_allclose(next(iter(outputs.values())), eager.numpy(), atol=ATOL)
    paths = EXPORTS[name][4]
    for path_name, value in eager_module_outputs(module, args, paths).items():
        np.testing.assert_allclose(probe.get(path_name), value, atol=ATOL, err_msg=f"{name} {path_name}")
    verification = probe.verify(feeds)
    assert verification, verification.summary()


def test_folded_shape_values_keep_their_names_and_are_served_as_constants(exported):
    """Shape arithmetic folded before TVM keeps its node names, op types and module paths."""
    path, _, args = exported("bert_dynamo")
    proto = load_onnx(path)
    imported = import_onnx(proto, shapes={"input_ids": (2, 8), "attention_mask": (2, 8)})
    reference = onnxruntime_values(proto, _feeds("bert_dynamo", args))
    node_of = {o: n for n in proto.graph.node for o in n.output}
    assert set(reference) <= set(imported.sources.values)
    folded = [v for v in imported.sources if v.kind is Kind.CONSTANT and node_of[v.key].op_type == "Shape"]
    assert folded, "the dynamo BERT computes shapes: some must be folded"
    for value in imported.sources:
        if value.key in node_of:
            assert (value.node, value.op_type) == (node_of[value.key].name, node_of[value.key].op_type)
        if value.kind is Kind.CONSTANT and value.key in reference:
            np.testing.assert_array_equal(imported.constants[value.key], reference[value.key], err_msg=value.key)
    names = {n for v in imported.sources for n in v.names}
    assert {"bert.encoder.layer.0.attention.self.query", "classifier"} <= names


def test_inputs_left_out_of_shapes_follow_shared_dimension_names(exported):
    """attention_mask[batch, seq] takes the sizes input_ids[batch, seq] was given."""
    path, _, _ = exported("bert_legacy")
    imported = import_onnx(path, shapes={"input_ids": (2, 8)})
    assert [(s.name, s.shape) for s in imported.inputs] == [("input_ids", (2, 8)), ("attention_mask", (2, 8))]
    assert [f.name for f in imported.fixes] == ["constant_of_shape_scalar"]
    assert imported.fixes[0].sources == ("/bert/ConstantOfShape",)


def test_a_symbolic_model_without_shapes_is_imported_with_its_symbolic_dimensions(exported):
    """Without shapes= the model is compiled as deployed, dynamic (tests/diagnosis/test_dynamic_executable.py)."""
    path, _, _ = exported("bert_legacy")
    assert [s.shape for s in import_onnx(path).inputs] == [("batch", "seq"), ("batch", "seq")]


@pytest.mark.parametrize("shapes, message", [
    ({"ids": (2, 8)}, "shapes names 'ids', which the model does not take (its inputs are 'input_ids', "
                      "'attention_mask'): name inputs of the model in shapes="),
    ({"input_ids": (2, 8, 1)}, "the shape given for input 'input_ids', [2, 8, 1], has 3 dims; the model declares "
                               "input_ids [batch, seq] (2 dims): give one size per dim, e.g. pass "
                               "shapes={'input_ids': (1, 1)}"),
    ({"input_ids": (2, 8), "attention_mask": (2, 9)},
     "shapes gives dimension 'seq' size 9 in 'attention_mask' but 8 in 'input_ids', which the model declares as "
     "one dimension: give them equal sizes: pass shapes={'attention_mask': (2, 8)}"),
    ({"input_ids": "2x8"}, "the shape given for input 'input_ids', '2x8', is not a list of sizes: give numbers, "
                           "e.g. pass shapes={'input_ids': (1, 1)}"),
])
def test_shapes_that_do_not_fit_the_model_are_one_line_errors(exported, shapes, message):
    path, _, _ = exported("bert_legacy")
    with pytest.raises(ModelError) as info:
        import_onnx(path, shapes=shapes)
    assert str(info.value) == message
