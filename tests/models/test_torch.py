"""PyTorch models: probed by fx node name and module path, checked against PyTorch eager.

The reference is independent of TVM: ``torch_values`` interprets the exported program node by
node in eager PyTorch, and module outputs come from forward hooks registered here.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.install import install_hint
from tvm_probe.core.schema import PIPELINES

torch = pytest.importorskip("torch")

from tvm_probe import AmbiguousNameError, ModelError, Probe, UnknownNameError, UnsupportedOpError  # noqa: E402
from tvm_probe.importer.module_paths import module_outputs  # noqa: E402
from tvm_probe.importer.torch import export_program, import_torch, node_keys  # noqa: E402
from tvm_probe.comparison.reference.torch import torch_values  # noqa: E402
from tvm_probe.core.sources import Kind  # noqa: E402

from support.processes import run_cli, run_python  # noqa: E402
from support import SUPPORT  # noqa: E402
from support.torch_models import eager_module_outputs, tiny_torch_bert, tiny_torch_cnn  # noqa: E402

ATOL = 1e-4


def _probes(module, args) -> dict[str, Probe]:
    """One probe per pipeline, each after one run capturing everything."""
    probes = {}
    for pipeline in PIPELINES:
        probe = Probe.from_torch(module, args, pipeline=pipeline)
        probe.run([a.numpy() for a in args])
        probes[pipeline] = probe
    return probes


@pytest.fixture(scope="module")
def bert():
    return tiny_torch_bert()


@pytest.fixture(scope="module")
def cnn():
    return tiny_torch_cnn()


@pytest.fixture(scope="module")
def bert_probes(bert):
    return _probes(*bert)


@pytest.fixture(scope="module")
def cnn_probes(cnn):
    return _probes(*cnn)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", ["bert", "cnn"])
def test_every_tagged_value_equals_pytorch_eager(request, name, pipeline):
    module, args = request.getfixturevalue(name)
    probe = request.getfixturevalue(f"{name}_probes")[pipeline]
    reference = torch_values(module, args)
    checked = [v.key for v in probe.imported.sources if v.kind is Kind.VALUE]
    assert len(checked) > (100 if name == "bert" else 10)
    # every value is served: FoldConstant's victims (full_like, embedding of it) are "folded"
    assert not [k for k in checked if probe.served(k) == "unavailable"]
    for key in checked:
        np.testing.assert_allclose(probe.get(key), reference[key], atol=ATOL, err_msg=f"{name} {pipeline} {key}")
    (output,) = probe.imported.sources.model_outputs
    with torch.no_grad():
        np.testing.assert_allclose(probe.get(output), module(*args).numpy(), atol=ATOL)


@pytest.mark.parametrize("name", ["bert", "cnn"])
def test_tagged_import_is_structurally_identical_to_a_plain_import(request, name):
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    module, args = request.getfixturevalue(name)
    tagged = request.getfixturevalue(f"{name}_probes")["default"].imported.mod
    plain = from_exported_program(torch.export.export(module, args))
    tvm.ir.assert_structural_equal(plain, tagged, map_free_vars=True)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_module_paths_resolve_to_the_module_outputs(bert, bert_probes, pipeline):
    paths = ["bert.embeddings", "bert.encoder.layer.0.attention", "bert.encoder.layer.0.attention.self.query",
             "bert.encoder.layer.1.intermediate", "bert.encoder", "bert.pooler", "classifier"]
    expected = eager_module_outputs(*bert, paths)
    probe = bert_probes[pipeline]
    for path in paths:
        np.testing.assert_allclose(probe.get(path), expected[path], atol=ATOL, err_msg=path)


def test_node_and_weight_names_resolve(bert, bert_probes):
    module, args = bert
    probe, reference = bert_probes["fused"], torch_values(*bert)
    for name in ("bmm_1", "_softmax", "gelu_1", "getitem_3", "input_ids"):
        np.testing.assert_allclose(probe.get(name), reference[name], atol=ATOL, err_msg=name)
    weight = "bert.encoder.layer.0.attention.self.query.weight"
    np.testing.assert_array_equal(probe.get(weight), module.state_dict()[weight].numpy())
    assert probe.sources_map["bmm_1"].op_type == "aten.bmm.default"


def test_a_module_called_several_times_answers_with_its_last_call(cnn, cnn_probes):
    """``act`` (one ReLU) runs three times; its path names the third call's output."""
    expected = eager_module_outputs(*cnn, ["act", "bn2", "pool"])
    for path, value in expected.items():
        np.testing.assert_allclose(cnn_probes["fused"].get(path), value, atol=ATOL, err_msg=path)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_getitem_of_a_tuple_literal_stays_served(cnn_probes, pipeline):
    """max_pool2d_with_indices becomes a Relax tuple literal; the pipeline drops its getitem."""
    probe = cnn_probes[pipeline]
    assert probe.served("getitem_9") in ("captured", "recomputed")
    assert [k for k, s in probe.servings.items() if s.served.value == "unavailable"] == []


def test_module_output_rule():
    # (key, {scope: path}, consumers' scopes; None = graph output)
    values = [("a", {"s": "blk", "s.x": "blk.x"}, [{"s"}]),       # leaves blk.x, stays in blk
              ("b", {"s": "blk"}, [{"t"}]),                         # leaves blk
              ("relu", {"r": "relu"}, [{"r@1"}]),                   # first call of `relu`
              ("relu_1", {"r@1": "relu"}, [None])]                  # last call, graph output
    assert module_outputs(values) == {"a": ("blk.x",), "b": ("blk",), "relu_1": ("relu",)}


class _EmbeddingClash(torch.nn.Module):
    """A module path ``embedding`` (LayerNorm of the lookup) and an fx node ``embedding`` (the
    lookup itself); ``blocks.1`` runs through ``.forward``, which export does not record."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4))
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])

    def forward(self, ids):
        x = self.blocks[0](self.embedding(ids))
        return self.blocks[1].forward(x)


def test_a_name_meaning_a_node_and_a_module_is_refused_and_both_are_reachable():
    torch.manual_seed(0)
    module, ids = _EmbeddingClash().eval(), torch.tensor([[1, 2, 3]])
    probe = Probe.from_torch(module, (ids,))
    probe.run(ids.numpy())
    with pytest.raises(AmbiguousNameError, match=r"^'embedding' names 2 different values: node:embedding; "
                                                 r"module:embedding"):
        probe.get("embedding")
    with torch.no_grad():
        lookup, normed = module.embedding[0](ids), module.embedding(ids)
    np.testing.assert_allclose(probe.get("node:embedding"), lookup.numpy(), atol=1e-6)
    np.testing.assert_allclose(probe.get("module:embedding"), normed.numpy(), atol=1e-5)
    assert "module:embedding" in probe.find("embedding*")["other_names"].sum()
    with torch.no_grad():  # called through .forward: served all the same (issue 23)
        np.testing.assert_allclose(probe.get("blocks.1"), module(ids).numpy(), atol=1e-5)


class _Unused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.spare = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


def test_a_module_that_never_runs_says_so():
    probe = Probe.from_torch(_Unused().eval(), (torch.randn(2, 4),))
    probe.run(np.ones((2, 4), np.float32))
    with pytest.raises(UnknownNameError, match=r"^'spare' has no value: torch.export recorded no op of this "
                                               r"module: it did not run in forward"):
        probe.get("spare")


def test_dynamo_onnx_export_answers_to_module_paths(bert, tmp_path):
    pytest.importorskip("onnxscript")
    module, args = bert
    path = tmp_path / "bert.onnx"
    torch.onnx.export(module, args, str(path), dynamo=True, verbose=False)
    probe = Probe.from_onnx(path, pipeline="default")
    probe.run({"input_ids": args[0].numpy(), "attention_mask": args[1].numpy()})
    names = ["bert.encoder.layer.0.attention.self.query", "bert.encoder.layer.1.attention", "classifier"]
    expected = eager_module_outputs(module, args, names)
    for name in names:
        np.testing.assert_allclose(probe.get(name), expected[name], atol=ATOL, err_msg=name)


def test_export_is_deterministic_so_reference_names_match(bert, bert_probes):
    """import_torch and torch_values export separately; the same module gives the same names."""
    first, second = export_program(*bert), export_program(*bert)
    assert [n.name for n in first.graph.nodes] == [n.name for n in second.graph.nodes]
    assert list(node_keys(first).values()) == list(node_keys(second).values())
    imported = import_torch(*bert)
    assert imported.model_hash == bert_probes["default"].imported.model_hash
    assert {v.key for v in imported.sources} <= set(torch_values(*bert, program=first))


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_data_dependent_control_flow_is_a_one_line_model_error():
    with pytest.raises(ModelError) as info:
        import_torch(_DataDependent(), (torch.randn(3),))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("torch.export cannot trace _DataDependent: ")
    assert "data-dependent" in message and "if x.sum() > 0:" in message


@pytest.mark.parametrize("raised, expected", [(ValueError, ModelError), (NotImplementedError, UnsupportedOpError)])
def test_a_failing_converter_names_the_fx_node(monkeypatch, raised, expected):
    """TVM failing on an op it converts is a ModelError; an op it declares unsupported is UnsupportedOpError."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    def broken(self, node):
        raise raised("cannot convert\nsecond line")

    monkeypatch.setattr(ExportedProgramImporter, "_softmax", broken)
    with pytest.raises(expected, match=r"^TVM's PyTorch importer failed on fx node '_softmax' "
                                       r"\(aten._softmax.default\): cannot convert$") as info:
        import_torch(torch.nn.Softmax(dim=-1), (torch.randn(2, 3),))
    assert isinstance(info.value, UnsupportedOpError) == (expected is UnsupportedOpError)


def test_missing_torch_is_a_one_line_model_error():
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "from tvm_probe.importer.torch import import_torch\n"
        "from tvm_probe import ModelError\n"
        "try:\n    import_torch(object(), ())\n"
        "except ModelError as err:\n    print(err)\n")
    assert result.stdout.strip() == f"PyTorch is not installed: {install_hint('torch')}", result.stderr


def test_importing_tvm_probe_does_not_import_torch():
    result = run_python("import sys, tvm_probe, tvm_probe.importer.torch, tvm_probe.comparison.reference.torch\n"
                     "print('torch' in sys.modules)")
    assert result.stdout.strip() == "False", result.stderr


def test_torch_config_with_torch_reference_through_the_cli(tmp_path):
    factory = SUPPORT / "torch_models.py"
    config = tmp_path / "torch.yaml"
    config.write_text(f"model: {{torch: '{factory}:tiny_torch_bert'}}\npipeline: fused\nreference: torch\n"
                      f"output: {{dump: {tmp_path / 'dump'}}}\nsplit: {{cuts: [bmm]}}\n")
    run = run_cli("run", str(config))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("all 141 compared values within tolerance; ")
    # the dump records the torch factory: compare reloads it and runs eager PyTorch
    again = run_cli("compare", str(tmp_path / "dump"))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1].startswith("all 141 compared values within tolerance; ")
    split = run_cli("split", str(config))
    assert split.returncode == 2 and split.stderr.strip().endswith(
        "split: cuts ONNX models into ONNX stages; this is a torch model: export it to ONNX first")
    config.write_text(f"model: {{torch: '{factory}:tiny_torch_bert'}}\nreference: onnxruntime\n")
    wrong = run_cli("run", str(config))
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == (f"tvm-probe: error: {config}:2: reference: 'onnxruntime' cannot run a "
                                    "PyTorch model: use reference: torch")  # said before compiling


# -- issue 23 item 1: modules whose forward is called directly ----------------------------------
def _assert_every_module_path_equals_eager(probe, expected: dict, label: str) -> None:
    for path, value in expected.items():
        np.testing.assert_allclose(probe.get(f"module:{path}"), value, atol=ATOL, err_msg=f"{label} {path}")


@pytest.fixture(scope="module")
def codertimo():
    from support.handwritten_models import codertimo_bert

    return codertimo_bert(layers=2, hidden=32)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_blocks_called_through_forward_answer_to_their_module_paths(codertimo, pipeline):
    """``transformer.forward(x, mask)`` and ``self.attention.forward(...)``: export records no
    module call, unless tvm_probe routes the direct call through the module (same computation)."""
    from support.hf_models import eager_forward_outputs

    module, args = codertimo
    expected = eager_forward_outputs(module, args)
    assert {"transformer_blocks.1", "transformer_blocks.0.attention"} <= set(expected)
    probe = Probe.from_torch(module, args, pipeline=pipeline)
    probe.run([a.numpy() for a in args])
    _assert_every_module_path_equals_eager(probe, expected, pipeline)
    # routing is undone after export: the instances have no forward of their own left
    assert not [p for p, m in module.named_modules() if "forward" in m.__dict__]


def test_dynamo_onnx_export_inside_visible_module_calls_names_the_blocks(codertimo, tmp_path):
    pytest.importorskip("onnxscript")
    from support.hf_models import eager_forward_outputs
    from tvm_probe.importer.torch_export import visible_module_calls

    module, args = codertimo
    path = tmp_path / "codertimo.onnx"
    with visible_module_calls(module):
        torch.onnx.export(module, args, str(path), dynamo=True, verbose=False, input_names=["x", "segment"])
    probe = Probe.from_onnx(path, pipeline="fused")
    probe.run({"x": args[0].numpy(), "segment": args[1].numpy()})
    expected = eager_forward_outputs(module, args)
    blocks = [p for p in expected if p.startswith("transformer_blocks.") and p.count(".") <= 2
              and not p.endswith("dropout")]
    assert {"transformer_blocks.0", "transformer_blocks.1.attention"} <= set(blocks)
    _assert_every_module_path_equals_eager(probe, {p: expected[p] for p in blocks}, "onnx")


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_the_seed_bert_at_full_size_serves_every_module_path(pipeline):
    """The 8-block, 256-wide codertimo BERT (the issue-17 size): every module path that runs."""
    from support.handwritten_models import codertimo_bert
    from support.hf_models import eager_forward_outputs

    module, args = codertimo_bert(layers=8, hidden=256, heads=4, vocab=15, mask_style="eq0")
    expected = eager_forward_outputs(module, args)
    assert len([p for p in expected if p.count(".") == 1 and p.startswith("transformer_blocks.")]) == 8
    probe = Probe.from_torch(module, args, pipeline=pipeline)
    probe.run([a.numpy() for a in args])
    _assert_every_module_path_equals_eager(probe, expected, pipeline)
