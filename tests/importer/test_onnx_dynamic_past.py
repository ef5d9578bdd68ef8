"""The ONNX route of an LLM decoder with a dynamic past length (issue 24).

A tiny seeded Llama, wrapped as the functional decode step users export
(``forward(input_ids, position_ids, k0, v0, k1, v1) -> (logits, k0', v0', k1', v1')``,
:class:`tvm_probe.importer.hf.CacheStep`), exported with the past length dynamic:

* legacy exporter (``dynamic_axes``): imports with the past length symbolic (the import fix
  ``unsqueeze_shape_value`` on ``cache_position``), one executable for every past length, every
  value equal to onnxruntime's but one that TVM's own importer gets wrong (see
  :data:`TVM_EQUAL_OF_SHAPE`);
* dynamo exporter (``Dim.DYNAMIC``): TVM's importer loses the shape of the attention scores, so
  the import is refused in one line naming the node and the ``shapes=`` to pass; with it, it
  probes and equals onnxruntime.

The fix itself is checked on its minimal graph against onnxruntime.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import ModelError, Probe
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

ATOL = 1e-4
CACHE = ["k0", "v0", "k1", "v1"]
INPUTS = ["input_ids", "position_ids", *CACHE]

TVM_EQUAL_OF_SHAPE = "/model/model/Equal_output_0"
"""TVM 0.27's Equal converter compares a ShapeExpr with a constant by ``structural_equal`` of each
dim (``T.int64(-1)``) with a Python int (``-1``): never equal, so the import-time constant is all
False where the model has ``[False, True, False, False]`` (transformers' mask ``expand`` of a
shape with a -1).  The probe serves the constant TVM compiled; with ``shapes=`` the value is folded
by ``onnx.reference`` instead and is right."""
TVM_WHERE_OF_EQUAL = "/model/model/Where_output_0"
"""The ``Where`` that reads that Equal: the shape TVM holds keeps the -1 the model replaces, so it
diverges with the Equal (served as TVM's own shape expression, as TVM computes it)."""


# -- the minimal graph of the fix ----------------------------------------------------------------
def _const(name: str, value) -> object:
    value = np.asarray(value)
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))


def _cache_position_model(axes_chain):
    """``cache_position = [0] + shape(k)[2]`` (1-D, one element), then Unsqueeze by each of
    ``axes_chain``: what transformers' decoders compute from a dynamic past length."""
    nodes = [helper.make_node("Shape", ["k"], ["shape"], name="shape"), _const("two", np.array(2, np.int64)),
             helper.make_node("Gather", ["shape", "two"], ["past"], name="past", axis=0),
             _const("zero", np.array([0], np.int64)),
             helper.make_node("Add", ["zero", "past"], ["position"], name="position")]
    last = "position"
    for i, axes in enumerate(axes_chain):
        nodes += [_const(f"axes{i}", np.array(axes, np.int64)),
                  helper.make_node("Unsqueeze", [last, f"axes{i}"], [f"u{i}"], name=f"unsqueeze{i}")]
        last = f"u{i}"
    graph = helper.make_graph(nodes, "cache_position",
                              [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, "past", 4])],
                              [helper.make_tensor_value_info(last, TensorProto.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("axes_chain, symptom", [
    ([[1]], "Unsqueeze axis 1 is out of range for rank 1"),          # the dynamo exporter's form
    ([[0], [1]], "Node unsqueeze1 cannot handle ShapeExpr inputs"),  # the legacy exporter's form
])
def test_unsqueeze_of_a_1d_shape_value_imports_symbolically_and_equals_onnxruntime(axes_chain, symptom):
    from tvm.relax.frontend.onnx import from_onnx

    model = _cache_position_model(axes_chain)
    with warnings.catch_warnings(), pytest.raises(Exception) as info:
        warnings.simplefilter("ignore")
        from_onnx(model)
    assert symptom in str(info.value)
    probe = Probe.from_onnx(model)  # one executable, past symbolic
    assert [(f.name, f.sources) for f in probe.import_fixes] == [("unsqueeze_shape_value", ("unsqueeze0",))]
    for past in (1, 5):
        feeds = {"k": np.zeros((1, 2, past, 4), np.float32)}
        reference = onnxruntime_values(model, feeds)
        probe.run(feeds)
        for name in [f"u{i}" for i in range(len(axes_chain))] + ["past"]:
            np.testing.assert_array_equal(probe.get(name), reference[name], err_msg=f"past {past} {name}")
            assert probe.get(name).shape == reference[name].shape
        # shape values: served as TVM's expressions of the input sizes, evaluated for this run
        for name in ("position", "shape"):
            assert probe.served(name) == "shape"
            np.testing.assert_array_equal(probe.get(name), reference[name], err_msg=f"past {past} {name}")


def test_with_import_fixes_off_the_error_names_the_fix():
    with pytest.raises(ModelError) as info:
        Probe.from_onnx(_cache_position_model([[1]]), import_fixes=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("TVM's ONNX importer failed on node 'unsqueeze0' (op Unsqueeze): Unsqueeze axis 1 "
                              "is out of range for rank 1")
    assert "import fix 'unsqueeze_shape_value'" in message and "import_fixes=True" in message


# -- the decoder ---------------------------------------------------------------------------------
def _feeds(past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": np.array([[7]], np.int64), "position_ids": np.array([[past]], np.int64)}
    feeds.update({n: rng.standard_normal((1, 2, past, 16)).astype(np.float32) for n in CACHE})
    return feeds


def _shapes(past: int) -> dict[str, tuple[int, ...]]:
    return {n: a.shape for n, a in _feeds(past).items() if n in CACHE}


def _export(tmp_path_factory, dynamo: bool):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from support.hf_models import hf_decoder

    from tvm_probe.importer.hf import cache_shape, example_decode, make_cache_step

    step = make_cache_step(hf_decoder("llama"))
    args = example_decode(cache_shape(step), 1, past=3)
    path = tmp_path_factory.mktemp("dynamic_past") / f"llama_{'dynamo' if dynamo else 'legacy'}.onnx"
    outputs = ["logits", *[f"present_{n}" for n in CACHE]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            past = torch.export.Dim.DYNAMIC
            torch.onnx.export(step, args, str(path), dynamo=True, input_names=INPUTS, output_names=outputs,
                              dynamic_shapes=(None, None, tuple({2: past} for _ in CACHE)), verbose=False)
        else:
            axes = {n: {2: "past"} for n in CACHE}
            axes.update({f"present_{n}": {2: "total"} for n in CACHE})
            torch.onnx.export(step, args, str(path), dynamo=False, input_names=INPUTS, output_names=outputs,
                              dynamic_axes=axes, opset_version=17)
    return path


@pytest.fixture(scope="module")
def legacy_export(tmp_path_factory):
    return _export(tmp_path_factory, dynamo=False)


@pytest.fixture(scope="module")
def dynamo_export(tmp_path_factory):
    pytest.importorskip("onnxscript")
    return _export(tmp_path_factory, dynamo=True)


def _mismatches(probe, path, feeds) -> set[str]:
    """Every served tensor of one run against onnxruntime on the dynamic model: those that differ."""
    reference = onnxruntime_values(path, feeds)
    outputs = probe.run(feeds)
    for name, value in outputs.items():
        np.testing.assert_allclose(value, reference[name], atol=ATOL, err_msg=name)
    bad = set()
    for value in probe.imported.sources:
        if value.key in reference:
            got = probe.get(value.key)
            if got.shape != reference[value.key].shape or not np.allclose(
                    got, reference[value.key], atol=ATOL, equal_nan=True):
                bad.add(value.key)
    return bad


@pytest.mark.slow
def test_legacy_export_with_a_dynamic_past_probes_symbolically_and_equals_onnxruntime(legacy_export):
    probe = Probe.from_onnx(legacy_export)
    assert [s.shape for s in probe.imported.inputs] == [(1, 1), (1, 1), *[(1, 2, "past", 16)] * 4]
    assert [f.name for f in probe.import_fixes] == ["unsqueeze_shape_value"]
    for past in (1, 6):  # one executable serves every past length
        assert _mismatches(probe, legacy_export, _feeds(past)) == {TVM_EQUAL_OF_SHAPE, TVM_WHERE_OF_EQUAL}, past
        assert probe.served(TVM_WHERE_OF_EQUAL) == "shape"
        assert -1 in probe.get(TVM_WHERE_OF_EQUAL)  # the -1 the folded Equal failed to replace


@pytest.mark.slow
def test_legacy_export_with_shapes_pinning_the_past_equals_onnxruntime(legacy_export):
    probe = Probe.from_onnx(legacy_export, shapes=_shapes(4))
    assert _mismatches(probe, legacy_export, _feeds(4)) == set()


@pytest.mark.slow
def test_dynamo_export_with_a_dynamic_past_is_pinned_and_equals_onnxruntime(dynamo_export, caplog):
    """TVM's importer loses the dynamic past of the dynamo export (an attention mask broadcast
    against scores of unknown length): without shapes= each past length is pinned to 1, each
    choice said, and the pinned build equals onnxruntime at those sizes."""
    with caplog.at_level("WARNING", logger="tvm_probe"):
        probe = Probe.from_onnx(dynamo_export)
    assert sorted(p.name for p in probe.imported.pinned) == sorted(CACHE)  # k1 shares v0's length: said too
    assert all(p.shape == (1, 2, 1, 16) and not p.from_inputs for p in probe.imported.pinned)
    assert len(caplog.records) == len(CACHE) and all("set to 1" in r.getMessage() for r in caplog.records)
    assert _mismatches(probe, dynamo_export, _feeds(1)) == set()


@pytest.mark.slow
def test_dynamo_export_with_shapes_pinning_the_past_equals_onnxruntime(dynamo_export):
    probe = Probe.from_onnx(dynamo_export, shapes=_shapes(5))
    assert _mismatches(probe, dynamo_export, _feeds(5)) == set()


@pytest.mark.slow
def test_legacy_export_under_the_fused_pipeline_serves_right_values_or_says_why(legacy_export):
    """Fused kernels of the symbolic decoder take shapes FuseTIR computed: a value recomputed
    inside one is right, or refused in one line (never a raw error, never a wrong value)."""
    from tvm_probe.core.errors import ValueUnavailableError

    probe = Probe.from_onnx(legacy_export, pipeline="fused")
    feeds = _feeds(3)
    reference = onnxruntime_values(legacy_export, feeds)
    probe.run(feeds)
    served, refused = 0, []
    for value in probe.imported.sources:
        if value.key not in reference or value.key in (TVM_EQUAL_OF_SHAPE, TVM_WHERE_OF_EQUAL):
            continue
        try:
            got = probe.get(value.key)
        except ValueUnavailableError as err:  # a value FuseOps hid from the map, or computed from a symbolic shape
            assert "\n" not in str(err), err
            refused.append(value.key)
            continue
        np.testing.assert_allclose(got, reference[value.key], atol=ATOL, err_msg=value.key)
        served += 1
    assert served > 2 * len(refused), (served, refused)
