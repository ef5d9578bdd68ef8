"""Quantization debugging of ONNX QDQ models (tvm_probe.quantization): models built here, quantized by
onnxruntime's own ``quantize_static`` (QDQ, per-tensor int8, a seeded calibration reader).

* a planted activation outlier (one channel ×30 before one layer's MatMul, that MatMul's weight row
  ÷30: the float model computes the same function) must rank that MatMul first;
* a QuantizeLinear of NaN — where TVM 0.27 and onnxruntime disagree (TVM saturates NaN to 127,
  onnxruntime to -128) — must be named as TVM's first divergence.

Expected values come from onnxruntime and numpy, never from tvm_probe's own output.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)
from tvm_probe.quantization import (
    QuantizationError,
    compare_quantized,
    quantized_ops,
    sensitivity,
    switchable,
    with_float_ops,
)

from tvm_probe import Probe
from tvm_probe.app.cli import main
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.metrics import error_stats
from tvm_probe.core.schema import Exit

D = 16


def _model(nodes, weights, rows=8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, D])],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def outlier_model(layers=3, outlier=1, factor=30.0) -> onnx.ModelProto:
    """``layer{k}/Mul`` (a per-channel scale, like a norm's gamma) → ``layer{k}/MatMul``; in layer
    ``outlier`` the scale of channel 0 is ``factor`` and the weight's row 0 divided by it."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], {}, "x"
    for k in range(layers):
        gamma, w = np.ones(D, np.float32), (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)
        if k == outlier:
            gamma[0], w[0] = factor, w[0] / factor
        weights[f"gamma{k}"], weights[f"w{k}"] = gamma, w
        out = "y" if k == layers - 1 else f"h{k}"
        nodes += [helper.make_node("Mul", [x, f"gamma{k}"], [f"t{k}"], name=f"layer{k}/Mul"),
                  helper.make_node("MatMul", [f"t{k}", f"w{k}"], [out], name=f"layer{k}/MatMul")]
        x = out
    return _model(nodes, weights)


def nan_model() -> onnx.ModelProto:
    """``layer0/MatMul(x, W0 > 0)`` → ``layer1/Div(h0, x)`` → ``layer2/MatMul``.  Calibrated on x in
    [0.5, 2), every range includes 0: inputs near 0 quantize h0 and x to 0, and 0/0 is NaN, which
    the QuantizeLinear of the Div's output then meets."""
    rng = np.random.default_rng(2)
    return _model([helper.make_node("MatMul", ["x", "w0"], ["h0"], name="layer0/MatMul"),
                   helper.make_node("Div", ["h0", "x"], ["r"], name="layer1/Div"),
                   helper.make_node("MatMul", ["r", "w2"], ["y"], name="layer2/MatMul")],
                  {"w0": rng.uniform(0.1, 0.5, (D, D)).astype(np.float32),
                   "w2": (rng.standard_normal((D, D)) / 4).astype(np.float32)})


class Reader(CalibrationDataReader):
    """Seeded calibration batches: standard normal, or uniform in [low, 2)."""

    def __init__(self, low=None, batches=8, seed=1):
        rng = np.random.default_rng(seed)
        draw = (lambda: rng.standard_normal((8, D))) if low is None else (lambda: rng.uniform(low, 2.0, (8, D)))
        self.batches = iter([{"x": draw().astype(np.float32)} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(model, folder, reader):
    float_path, qdq_path = folder / "float.onnx", folder / "qdq.onnx"
    onnx.save(model, float_path)
    quantize_static(str(float_path), str(qdq_path), reader, quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=False)
    return float_path, qdq_path


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    return _quantize(outlier_model(), tmp_path_factory.mktemp("outlier"), Reader())


@pytest.fixture(scope="module")
def with_nan(tmp_path_factory):
    return _quantize(nan_model(), tmp_path_factory.mktemp("nan"), Reader(low=0.5))


def _inputs(seed=5, low=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, D)) if low is None else rng.uniform(low, 2.0, (8, D))
    return {"x": x.astype(np.float32)}


def test_outlier_layer_ranks_first_and_is_kept_in_float(outlier, tmp_path):
    float_path, qdq_path = outlier
    inputs = _inputs()
    report = compare_quantized(float_path, qdq_path, inputs)
    table = report.table()
    assert list(table["name"]) == [f"layer{k}/{op}" for k in range(3) for op in ("Mul", "MatMul")]
    # the figures are onnxruntime's float values against TVM's quantized ones, recomputed here
    float_values = onnxruntime_values(float_path, inputs)
    row = table.set_index("name").loc["layer1/Mul"]
    tvm = report.probe.get("layer1/Mul")
    assert row["sqnr_db"] == pytest.approx(error_stats(tvm, float_values["t1"]).snr_db)
    # TVM's build agrees with onnxruntime's run of the same QDQ model: elementwise ops to the bit,
    # MatMuls within float32 rounding (their sums are accumulated in another order)
    runtime_values = onnxruntime_values(qdq_path, inputs)
    assert (table[table["op_type"] == "Mul"]["tvm_vs_runtime"] == 0).all()
    assert (table["tvm_vs_runtime"] <= 1e-5 * max(np.abs(v).max() for v in runtime_values.values())).all()
    assert report.first_tvm_divergence is None

    ranking = sensitivity(float_path, qdq_path, inputs, comparison=report)
    assert ranking.ranking()[0] == "layer1/MatMul"
    assert ranking.note == ""  # the switchable build reproduced the real builds it was checked against
    best, last = ranking.table().iloc[0], ranking.table().iloc[-1]
    assert best["gain_db"] > 3 and best["sqnr_db"] > ranking.baseline_sqnr_db
    # each figure is the outputs of that variant, built here as its own model, against the float model
    variant = ranking.quantized_model_with(keep_float=["layer1/MatMul"], path=tmp_path / "keep.onnx")
    assert (tmp_path / "keep.onnx").is_file()
    node = next(n for n in variant.graph.node if n.name == "layer1/MatMul")
    assert list(node.input) == ["t1", "w1"]  # the float tensor and the float model's own weight
    for row in (best, last):
        built = Probe.from_onnx(ranking.quantized_model_with(keep_float=[row["name"]])).run(inputs, capture=None)
        assert row["sqnr_db"] == error_stats(built["y"], float_values["y"]).snr_db
    # and onnxruntime's run of the variant tells the same story
    runtime_variant = onnxruntime_values(variant, inputs, names=["y"])["y"]
    assert best["sqnr_db"] == pytest.approx(error_stats(runtime_variant, float_values["y"]).snr_db, abs=0.5)

    target = (ranking.baseline_sqnr_db + best["sqnr_db"]) / 2
    assert ranking.keep_float(target_sqnr_db=target) == ["layer1/MatMul"]
    assert ranking.keep_float(target_sqnr_db=ranking.baseline_sqnr_db - 1) == []
    with pytest.raises(QuantizationError, match="below the target 1000 dB"):
        ranking.keep_float(target_sqnr_db=1000)


def test_switchable_model_is_each_variant(outlier):
    """The one model holding every variant computes, flag by flag, what the variant's own model
    computes (both run by onnxruntime here)."""
    float_path, qdq_path = outlier
    float_model, qdq = onnx.load(float_path), onnx.load(qdq_path)
    model, flags = switchable(float_model, qdq)
    assert list(flags) == [op.name for op in quantized_ops(float_model, qdq)]
    inputs = _inputs()
    for kept in ([], ["layer1/MatMul"], ["layer0/Mul", "layer2/MatMul"]):
        feed = dict(inputs, **{flag: np.array(name in kept) for name, flag in flags.items()})
        switched = onnxruntime_values(model, feed, names=["y"])["y"]
        alone = onnxruntime_values(with_float_ops(float_model, qdq, kept) if kept else qdq, inputs, names=["y"])["y"]
        np.testing.assert_array_equal(switched, alone)


def test_tvm_divergence_on_quantize_linear_of_nan_is_named(with_nan):
    float_path, qdq_path = with_nan
    clean = compare_quantized(float_path, qdq_path, _inputs(low=0.5))
    assert clean.first_tvm_divergence is None
    inputs = _inputs(low=0.5)
    inputs["x"][0] = 1e-4  # row 0: h0 and x quantize to 0, 0/0 is NaN
    report = compare_quantized(float_path, qdq_path, inputs)
    qdq = onnx.load(qdq_path)
    quantize_div = next(n.name for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "r")
    assert report.first_tvm_divergence == quantize_div
    # the divergence itself: onnxruntime and TVM quantize the NaN of row 0 differently
    runtime = onnxruntime_values(qdq_path, inputs)
    quantized = next(n.output[0] for n in qdq.graph.node if n.name == quantize_div)
    assert np.isnan(runtime["r"][0]).all()
    assert (report.probe.get(quantize_div)[0] != runtime[quantized][0]).all()
    table = report.table().set_index("name")
    assert table.loc["layer0/MatMul", "tvm_vs_runtime"] < 1e-4  # before the NaN: float32 rounding at most
    assert table.loc["layer1/Div", "tvm_vs_runtime"] == 0      # NaN on both sides agrees
    assert table.loc["layer2/MatMul", "tvm_vs_runtime"] > 1    # reads the differently quantized NaN
    assert any(quantize_div in line for line in report.lines())


def test_refuses_models_that_are_not_float_and_qdq(outlier, tmp_path):
    float_path, _ = outlier
    with pytest.raises(QuantizationError, match="no op of the float model is quantized"):
        compare_quantized(float_path, float_path, _inputs())
    with pytest.raises(QuantizationError, match="is not an op the quantized model quantizes"):
        with_float_ops(onnx.load(float_path), onnx.load(outlier[1]), ["layer0/Mul", "nope"])
    qoperator = tmp_path / "qop.onnx"
    quantize_static(str(float_path), str(qoperator), Reader(), quant_format=QuantFormat.QOperator)
    with pytest.raises(QuantizationError, match="QLinearMatMul.*which TVM 0.27 cannot import: quantize with "
                                                "quant_format=QuantFormat.QDQ"):
        compare_quantized(float_path, qoperator, _inputs())


def test_cli_quantization_end_to_end(outlier, tmp_path, capsys):
    float_path, qdq_path = outlier
    np.savez(tmp_path / "inputs.npz", **_inputs())
    out = tmp_path / "out"
    status = main(["-q", "quantization", str(float_path), str(qdq_path), "--inputs", str(tmp_path / "inputs.npz"),
                   "--target-sqnr", "1", "-o", str(out)])
    printed = capsys.readouterr().out
    assert status == Exit.OK
    assert "1. layer1/MatMul" in printed
    import pandas as pd

    ranking = pd.read_csv(out / "sensitivity.csv")
    assert ranking["name"][0] == "layer1/MatMul" and len(ranking) == 6
    assert set(pd.read_csv(out / "quantization.csv")["name"]) == set(ranking["name"])
    assert "keep in float: nothing" in printed  # 1 dB: the QDQ model as given reaches it
    status = main(["-q", "quantization", str(float_path), str(tmp_path / "missing.onnx")])
    assert status == Exit.BAD_INPUT
    assert "missing.onnx" in capsys.readouterr().err


def test_yaml_quantization_key_runs_the_same(outlier, tmp_path, capsys):
    float_path, qdq_path = outlier
    np.save(tmp_path / "x.npy", _inputs()["x"])
    config = tmp_path / "quant.yaml"
    config.write_text(f"model: {{onnx: {float_path}}}\nquantization: {{model: {qdq_path}, target_sqnr: 1000}}\n"
                      f"inputs: {{x: {{file: x.npy}}}}\noutput: {{report: out}}\n")
    assert main(["-q", "run", str(config)]) == Exit.DIVERGED  # 1000 dB: no set of ops in float reaches it
    printed = capsys.readouterr().out
    assert "1. layer1/MatMul" in printed and "below the target 1000 dB" in printed
    assert (tmp_path / "out" / "sensitivity.csv").is_file() and (tmp_path / "out" / "quantization.csv").is_file()


def test_yaml_quantization_key_is_checked(outlier, tmp_path):
    from tvm_probe.app.config import ConfigError, load_config

    config = tmp_path / "bad.yaml"
    config.write_text("model: {demo: {}}\nquantization: {model: missing.onnx, target_sqnr: high}\n")
    with pytest.raises(ConfigError) as err:
        load_config(config)
    message = str(err.value)
    assert "\n" not in message
    assert "quantization: compares an ONNX model with its QDQ model" in message
    assert "quantization.model: file" in message and "missing.onnx' does not exist" in message
    assert "quantization.target_sqnr: must be a number of dB, got 'high'" in message
    config.write_text(f"model: {{onnx: {outlier[0]}}}\nquantization: {{model: {outlier[1]}}}\nprecision: fp16\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3: precision: cannot go with quantization: \(the float and "
                                          r"QDQ models are built on this machine as they are\): remove 'precision'$"):
        load_config(config)


def test_docs_page_runs_as_written(tmp_path, monkeypatch):
    """docs/quantization.md's Python block, run from an empty folder, twice (it rewrites its files)."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "quantization.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", page, re.S)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        exec(compile(block, "docs/quantization.md", "exec"), {"__name__": "docs"})
    assert (tmp_path / "qdq_keep.onnx").is_file()


def test_view_overlays_show_each_ops_figures(outlier, tmp_path):
    pytest.importorskip("model_explorer_onnx")
    import json

    from tvm_probe.show.view import export_quantization

    float_path, qdq_path = outlier
    inputs = _inputs()
    report = compare_quantized(float_path, qdq_path, inputs)
    ranking = sensitivity(float_path, qdq_path, inputs, comparison=report)
    (command,) = export_quantization(report, tmp_path / "view", ranking)
    assert command.startswith(f"model-explorer {tmp_path / 'view' / 'float.onnx'}")
    (graph_id, sqnr), = json.loads((tmp_path / "view" / "quantization.sqnr_db.json").read_text()).items()
    gain = json.loads((tmp_path / "view" / "quantization.gain_kept_in_float_db.json").read_text())[graph_id]
    rows, ranked = report.table().set_index("name"), ranking.table().set_index("name")
    # Model Explorer's ONNX adapter names the nodes by their ONNX names here (all named, unique)
    assert set(sqnr["results"]) == set(rows.index)
    for name, result in sqnr["results"].items():
        assert result["value"] == pytest.approx(rows.loc[name, "sqnr_db"])
        assert gain["results"][name]["value"] == pytest.approx(ranked.loc[name, "gain_db"])


def test_readme_section_runs_as_written(tmp_path, monkeypatch):
    """README.md's "Quantization" block, run from an empty folder, twice."""
    import re
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Quantization\n.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        scope = {"__name__": "readme"}
        exec(compile(block, "README.md", "exec"), scope)
        assert scope["report"].first_tvm_divergence is None
    assert (tmp_path / "qdq_keep.onnx").is_file()
