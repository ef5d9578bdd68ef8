"""Hugging Face decoder LLMs (issue 23 item 3): one forward, with and without ``attention_mask``.

Llama, Qwen2, Mistral, GPT-2, Phi-3 and Gemma, built from tiny configs in code with seeded
weights (tests/support/hf_models.py).  Called with ``input_ids`` alone, transformers 5.24 builds its mask
from ``(position_diff != 1).cumsum(-1)`` — a cumsum of a bool tensor, which TVM 0.27 cannot
build on llvm; the import fix ``bool_cumsum`` rewrites it.  Every value is checked against the
exported program run in eager PyTorch, and module paths against the eager model itself.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvm_probe import Probe, TVMError  # noqa: E402
from tvm_probe.comparison.reference.torch import torch_values  # noqa: E402
from tvm_probe.core.sources import Kind  # noqa: E402

from support.hf_models import LogitsOnly, decoder_ids, eager_forward_outputs, hf_decoder  # noqa: E402

ATOL = 1e-4


def _model(family: str, with_mask: bool):
    """The wrapped decoder and its inputs: batch 1 (GPT-2's decomposition fails in torch at batch 2)."""
    ids = decoder_ids(0, batch=1, seq=8)
    args = (ids, torch.ones_like(ids)) if with_mask else (ids,)
    return LogitsOnly(hf_decoder(family), with_mask).eval(), args


def _probe(module, args, pipeline: str, **options) -> Probe:
    probe = Probe.from_torch(module, args, pipeline=pipeline, **options)
    probe.run([a.numpy() for a in args])
    return probe


def _assert_every_value_equals_eager(probe, module, args, label: str) -> None:
    reference = torch_values(module, args)
    keys = [v.key for v in probe.imported.sources if v.kind is Kind.VALUE]
    assert len(keys) > 150, label
    for key in keys:
        np.testing.assert_allclose(probe.get(key), reference[key], atol=ATOL, err_msg=f"{label} {key}")


def _layer_paths(family: str) -> list[str]:
    stack = "model.transformer.h" if family == "gpt2" else "model.model.layers"
    return [f"{stack}.0", f"{stack}.1", "model.lm_head"]


# Without a mask: the four families of the issue and Phi-3 / Gemma under `default`; Llama and
# GPT-2 under both pipelines, with every module path too (test below).  Kept to one build each:
# a decoder costs 10-25 s here (export, compile) on 2 busy cores.
@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "mistral", "phi3", "gemma"])
def test_decoder_without_a_mask_builds_and_every_value_equals_eager(family):
    module, args = _model(family, with_mask=False)
    probe = _probe(module, args, "default")
    assert [(f.name, f.sources) for f in probe.import_fixes] == [("bool_cumsum", ("cumsum",))]
    _assert_every_value_equals_eager(probe, module, args, family)
    expected = eager_forward_outputs(module, args)
    for path in _layer_paths(family):
        np.testing.assert_allclose(probe.get(path), expected[path], atol=ATOL, err_msg=f"{family} {path}")


@pytest.mark.slow
@pytest.mark.parametrize("family, pipeline", [("llama", "default"), ("gpt2", "fused")])  # one build each
def test_decoder_with_a_mask_needs_no_fix_and_every_value_equals_eager(family, pipeline):
    module, args = _model(family, with_mask=True)
    args[1][0, :2] = 0  # left padding: the mask matters
    probe = _probe(module, args, pipeline)
    assert probe.import_fixes == []
    _assert_every_value_equals_eager(probe, module, args, family)


@pytest.mark.parametrize("family", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_every_value_and_every_module_path_that_runs_equals_eager(family, pipeline):
    """Without a mask (the bool_cumsum fix), every value; and issue 23 item 1 for HF decoders:
    every module path that runs, tuple-returning modules (rotary embeddings give ``(cos, sin)``)
    answering with their first tensor, as a forward hook sees it."""
    module, args = _model(family, with_mask=False)
    expected = eager_forward_outputs(module, args)
    assert len(expected) >= 29 and set(_layer_paths(family)) <= set(expected)
    probe = _probe(module, args, pipeline)
    assert [(f.name, f.sources) for f in probe.import_fixes] == [("bool_cumsum", ("cumsum",))]
    _assert_every_value_equals_eager(probe, module, args, f"{family} {pipeline}")
    for path, value in expected.items():
        np.testing.assert_allclose(probe.get(f"module:{path}"), value, atol=ATOL, err_msg=f"{family} {path}")


def test_with_fixes_off_the_build_fails_naming_the_cumsum_and_the_fix():
    module, args = _model("llama", with_mask=False)
    with pytest.raises(TVMError) as info:
        Probe.from_torch(module, args, pipeline="default", import_fixes=False)
    message = str(info.value)
    assert "\n" not in message and "cumsum" in message
    assert "import fix 'bool_cumsum'" in message and "import_fixes=True" in message


def test_bool_cumsum_fix_is_exact_on_its_own_graph():
    """The rewrite against eager PyTorch on the construct alone: int64 result, as torch gives."""
    class Positions(torch.nn.Module):
        def forward(self, x):
            return (x != 1).cumsum(-1), (x > 2).cumsum(0)

    x = torch.tensor([[1, 2, 3, 1, 5, 1], [4, 1, 1, 6, 7, 8]])
    probe = _probe(Positions(), (x,), "fused")
    first, second = Positions()(x)
    outputs = probe.imported.sources.model_outputs
    assert [probe.get(k).dtype for k in outputs] == [np.int64, np.int64]
    np.testing.assert_array_equal(probe.get(outputs[0]), first.numpy())
    np.testing.assert_array_equal(probe.get(outputs[1]), second.numpy())


class _LazyCache(torch.nn.Module):
    """What transformers' ``DynamicLayer.lazy_initialization`` does: a 1-D empty tensor, then
    ``cat`` with the 4-D keys along the sequence axis."""

    def forward(self, keys):
        start = torch.tensor([], dtype=keys.dtype)
        return torch.cat([start, keys], dim=-2) * 2


def test_cat_with_a_1d_empty_tensor_is_fixed_exactly_and_named_when_off():
    keys = torch.randn(1, 2, 3, 4)
    probe = _probe(_LazyCache(), (keys,), "fused")
    assert [(f.name, f.sources) for f in probe.import_fixes] == [("cat_empty_1d", ("cat",))]
    (output,) = probe.imported.sources.model_outputs
    np.testing.assert_array_equal(probe.get(output), _LazyCache()(keys).numpy())
    from tvm_probe import ModelError

    with pytest.raises(ModelError, match=r"^TVM's PyTorch importer failed on fx node 'cat' \(aten.cat.default\): "
                                         r"Concat expects all input tensors to have same ndim.*import fix "
                                         r"'cat_empty_1d'.*import_fixes=True$"):
        Probe.from_torch(_LazyCache(), (keys,), import_fixes=False)


class _IndexPut(torch.nn.Module):
    """``data[:, :, pos] = values`` (a static cache's update, functional) and kin."""

    def __init__(self, leading: int):
        super().__init__()
        self.leading = leading

    def forward(self, data, pos, values):
        return torch.ops.aten.index_put(data, [None] * self.leading + [pos], values)


@pytest.mark.parametrize("leading, data_shape, values_shape", [
    (2, (2, 3, 5, 4), (2, 3, 2, 4)),   # [None, None, pos] on 4-D: the KV cache update
    (0, (5, 3), (2, 3)),               # [pos] on 2-D
    (1, (2, 5, 3), (1, 2, 1)),         # values broadcast
])
def test_index_put_with_fewer_indices_than_dims_is_fixed_exactly(leading, data_shape, values_shape):
    gen = torch.Generator().manual_seed(0)
    data, values = torch.randn(*data_shape, generator=gen), torch.randn(*values_shape, generator=gen)
    args = (data, torch.tensor([1, 3]), values)
    probe = _probe(_IndexPut(leading), args, "default")
    assert [f.name for f in probe.import_fixes] == ["index_put_short_indices"]
    (output,) = probe.imported.sources.model_outputs
    np.testing.assert_array_equal(probe.get(output), _IndexPut(leading)(*args).numpy())
    from tvm_probe import ModelError

    with pytest.raises(ModelError, match=r"IndexPut requires the number of index tensors.*import fix "
                                         r"'index_put_short_indices'"):
        Probe.from_torch(_IndexPut(leading), args, import_fixes=False)


@pytest.mark.slow
def test_dynamo_onnx_export_of_a_decoder_serves_its_module_paths(tmp_path):
    """Issue 23 item 1 for the ONNX route: every module path the export has a node for equals
    eager (the layers among them); ``visible_module_calls`` changes nothing for HF modules."""
    pytest.importorskip("onnxscript")
    import warnings

    from tvm_probe import NameLookupError
    from tvm_probe.importer.torch_export import visible_module_calls

    module, args = _model("llama", with_mask=False)
    path = tmp_path / "llama.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with visible_module_calls(module):
            torch.onnx.export(module, args, str(path), dynamo=True, verbose=False, input_names=["input_ids"])
    probe = Probe.from_onnx(path, pipeline="fused")
    probe.run({"input_ids": args[0].numpy()})
    served = 0
    for name, value in eager_forward_outputs(module, args).items():
        try:
            got = probe.get(f"module:{name}")
        except NameLookupError:
            continue  # no node in the export (constants the exporter folded)
        np.testing.assert_allclose(got, value, atol=ATOL, err_msg=name)
        served += 1
    assert served >= 29


class _AsUsersCallIt(torch.nn.Module):
    """``model(input_ids=ids).logits`` with transformers' defaults: ``use_cache=True``, so a
    DynamicCache starts lazily with a 1-D empty tensor (the cat_empty_1d fix)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


@pytest.mark.slow
def test_a_decoder_called_with_its_defaults_builds_and_equals_eager():
    module, ids = _AsUsersCallIt(hf_decoder("llama")).eval(), decoder_ids(0, batch=1, seq=8)
    probe = _probe(module, (ids,), "default")
    assert "cat_empty_1d" in [f.name for f in probe.import_fixes]
    _assert_every_value_equals_eager(probe, module, (ids,), "llama defaults")
