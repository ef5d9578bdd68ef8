"""Quantization debugging of ONNX QDQ models (tvm_probe.tools.quantization), on models quantized by onnxruntime's
own ``quantize_static`` as users call it (tests/support/quantized_models.py).

The ground truth of "op X kept in float" is onnxruntime's quantizer run again with
``nodes_to_exclude=[X]``: the variants tvm_probe writes must compute what those models compute
(onnxruntime runs both), and its ranking must put first the op whose exclusion helps most.  Expected
values come from onnxruntime and numpy, never from tvm_probe's own output.

* onnxruntime folds a Relu / Clip into the QuantizeLinear after the op before it: keeping that op in
  float brings the activation back (the issue this file was rewritten for: it did not);
* a QuantizeLinear of NaN — where TVM 0.27 and onnxruntime disagree (TVM saturates NaN to 127,
  onnxruntime to -128) — must be named as TVM's first divergence.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat, quantize_static
from support import quantized_models as qm
from tvm_probe.tools.quantization import (
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
from tvm_probe.core.errors import ProbeError
from tvm_probe.core.metrics import error_stats
from tvm_probe.core.schema import Exit

D = qm.D


def _run(model, inputs) -> np.ndarray:
    """onnxruntime's value of the model's first output, each op computed as the graph writes it: no graph
    optimization (optimized, onnxruntime fuses DequantizeLinear -> Conv -> QuantizeLinear into an integer
    QLinearConv, which rounds otherwise: up to a quantization step, ~1 dB of a ResNet block's SQNR)."""
    import onnxruntime as ort

    model = onnx.load(model) if not isinstance(model, onnx.ModelProto) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([model.graph.output[0].name], inputs)[0]


def _inputs(model, seed=5) -> dict:
    return {"x": np.random.default_rng(seed).standard_normal(qm.input_shape(model)).astype(np.float32)}


def _saved(model, folder, name="float.onnx"):
    path = folder / name
    onnx.save(model, path)
    return path


MODELS = {"mlp_relu": lambda: qm.mlp("Relu"), "mlp_relu6": lambda: qm.mlp("Relu6"),
          "mlp_leaky_relu": lambda: qm.mlp("LeakyRelu"), "mlp_sigmoid": lambda: qm.mlp("Sigmoid"),
          "gemm_relu": lambda: qm.mlp("Relu", gemm=True), "resnet_block": qm.resnet_block,
          "mobilenet_block": qm.mobilenet_block}
CASES = [(m, "default") for m in MODELS] + [(m, o) for m in ("mlp_relu", "resnet_block", "mobilenet_block")
                                             for o in qm.OPTIONS if o != "default"]


@pytest.mark.parametrize("model_name,options", CASES)
def test_kept_in_float_is_what_onnxruntimes_quantizer_excludes(model_name, options, tmp_path):
    """Every op alone, and every op at once, kept in float: the model tvm_probe writes computes, in
    onnxruntime, bit for bit what quantize_static(nodes_to_exclude=...) writes — but for the tensors
    onnxruntime would calibrate anew, which the QDQ model does not record (named by the pairing).
    Every op in float is the float model; none is the QDQ model as given."""
    from tvm_probe.tools.quantization.qdq_graph import QDQPair

    model = MODELS[model_name]()
    float_path, shape, opts = _saved(model, tmp_path), qm.input_shape(model), qm.OPTIONS[options]
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", shape, opts)
    float_model, qdq = onnx.load(float_path), onnx.load(qdq_path)
    pair = QDQPair(float_model, qdq)
    inputs = _inputs(model)
    every = [op.name for op in pair.ops]
    for kept in [[name] for name in every] + [every]:
        ours = _run(with_float_ops(float_model, qdq, kept), inputs)
        theirs = _run(qm.quantize(float_path, tmp_path / "excluded.onnx", shape, opts, exclude=kept), inputs)
        if pair.recalibrated(kept):
            assert options == "symmetric_activations"  # onnxruntime shares a Relu's range with its input only then
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{kept} kept in float")
    np.testing.assert_array_equal(_run(with_float_ops(float_model, qdq, every), inputs), _run(float_path, inputs))
    np.testing.assert_array_equal(_run(with_float_ops(float_model, qdq, []), inputs), _run(qdq_path, inputs))


def test_folded_activations_belong_to_the_op_before_them(tmp_path):
    """onnxruntime's default (asymmetric activations) removes every Relu and Clip after a quantized op;
    symmetric activations keep them as quantized ops of their own."""
    model = qm.mlp("Relu6")
    float_path = _saved(model, tmp_path)
    qdq = onnx.load(qm.quantize(float_path, tmp_path / "qdq.onnx", qm.input_shape(model)))
    assert not any(n.op_type == "Clip" for n in qdq.graph.node)  # the quantizer folded them
    ops = quantized_ops(model, qdq)
    assert [(op.name, op.folded) for op in ops] == [("fc1", ("act1",)), ("fc2", ("act2",)), ("fc3", ("act3",)),
                                                    ("fc4", ())]
    assert ops[1].float_tensor == "h2" and ops[1].tensor == "a2"  # the Clip's output name moved to the MatMul
    with pytest.raises(QuantizationError, match=r"'act2' is not in the quantized model: the quantizer folded it "
                                                r"into 'fc2' .*keep 'fc2' in float"):
        with_float_ops(model, qdq, ["act2"])
    symmetric = onnx.load(qm.quantize(float_path, tmp_path / "sym.onnx", qm.input_shape(model),
                                      qm.OPTIONS["symmetric_activations"]))
    assert [op.name for op in quantized_ops(model, symmetric)] == ["fc1", "act1", "fc2", "act2", "fc3", "act3", "fc4"]


def test_switchable_model_is_each_variant(tmp_path):
    """The one model holding every variant computes, flag by flag, what the variant's own model computes
    (both run by onnxruntime), folded activations brought back included."""
    model = qm.resnet_block()
    float_path = _saved(model, tmp_path)
    float_model = onnx.load(float_path)
    qdq = onnx.load(qm.quantize(float_path, tmp_path / "qdq.onnx", qm.input_shape(model)))
    switched_model, flags = switchable(float_model, qdq)
    ops = [op.name for op in quantized_ops(float_model, qdq)]
    assert list(flags) == ops
    inputs = _inputs(model)
    for kept in ([], ["conv1"], ["conv1", "conv2"], ["stem", "add", "fc"], ops):
        feed = dict(inputs, **{flag: np.array(name in kept) for name, flag in flags.items()})
        switched = _run(switched_model, feed)
        alone = _run(with_float_ops(float_model, qdq, kept), inputs)
        np.testing.assert_array_equal(switched, alone, err_msg=f"{kept} kept in float")


def _onnxruntime_ranking(float_path, ops, shape, options, inputs, folder) -> dict[str, float]:
    """Each op's outputs' SQNR against the float model when onnxruntime's quantizer excludes it."""
    reference = _run(float_path, inputs)
    return {op: error_stats(_run(qm.quantize(float_path, folder / "excluded.onnx", shape, options, exclude=[op]),
                                 inputs), reference).snr_db for op in ops}


@pytest.mark.parametrize("model_name,options", [("mlp_relu", "default"), ("resnet_block", "default"),
                                                ("mobilenet_block", "per_channel")])
def test_ranking_follows_onnxruntimes_own_exclusions(model_name, options, tmp_path):
    """The issue's MLP (an outlier channel in fc2's output, Relus folded), a ResNet block and a MobileNet
    block: the ranking's first op is the one whose exclusion by onnxruntime's quantizer helps most, each
    row's SQNR is that exclusion's (TVM against onnxruntime: float32 rounding), keeping every op in float
    gives back the float model, and keep_float's answer, excluded by onnxruntime, reaches the target."""
    model = MODELS[model_name]()
    float_path, shape, opts = _saved(model, tmp_path), qm.input_shape(model), qm.OPTIONS[options]
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", shape, opts)
    inputs = _inputs(model)
    ranking = sensitivity(float_path, qdq_path, inputs)
    truth = _onnxruntime_ranking(float_path, ranking.ranking(), shape, opts, inputs, tmp_path)
    assert ranking.ranking()[0] == max(truth, key=truth.get)
    for row in ranking.rows:
        assert row["sqnr_db"] == pytest.approx(truth[row["name"]], abs=0.05), row["name"]
    assert ranking.float_sqnr_db >= 100 and ranking.note == ""
    if model_name == "mlp_relu":
        assert ranking.ranking()[0] == "fc2"  # the planted outlier
        assert ranking.table().iloc[0]["folded"] == "act2"
    best = ranking.rows[0]["sqnr_db"]
    target = best + 1  # more than the best op alone gives
    kept = ranking.keep_float(target_sqnr_db=target)
    assert len(kept) >= 2 and kept == ranking.ranking()[:len(kept)]
    excluded = qm.quantize(float_path, tmp_path / "kept.onnx", shape, opts, exclude=kept)
    assert error_stats(_run(excluded, inputs), _run(float_path, inputs)).snr_db >= target
    # the model handed back to deploy is that model: onnxruntime runs both to the bit
    np.testing.assert_array_equal(_run(ranking.quantized_model_with(keep_float=kept), inputs), _run(excluded, inputs))


def test_every_op_in_float_is_the_float_model_in_tvm(tmp_path):
    """quantized_model_with(every op), built by TVM, equals onnxruntime's float run within float32 rounding."""
    model = qm.mlp("Relu")
    float_path = _saved(model, tmp_path)
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", qm.input_shape(model))
    inputs = _inputs(model)
    ranking = sensitivity(float_path, qdq_path, inputs)
    every = ranking.quantized_model_with(keep_float=ranking.ranking())
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in every.graph.node)
    assert [n.op_type for n in every.graph.node].count("Relu") == 3
    built = Probe.from_onnx(every).run(inputs, capture=None)["y"]
    np.testing.assert_allclose(built, _run(float_path, inputs), rtol=1e-5, atol=1e-5)


def test_compare_rows_hold_the_folded_activation(tmp_path):
    """compare_quantized's row of fc1 compares fc1's own output (before its folded Relu) in both models, and
    names the Relu; the figures are those of onnxruntime's run of the QDQ model, to float32 rounding."""
    model = qm.mlp("Relu")
    float_path = _saved(model, tmp_path)
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", qm.input_shape(model))
    inputs = _inputs(model)
    report = compare_quantized(float_path, qdq_path, inputs)
    table = report.table().set_index("name")
    assert list(table.index) == ["fc1", "fc2", "fc3", "fc4"]
    assert list(table["folded"]) == ["act1", "act2", "act3", ""]
    float_values, runtime = onnxruntime_values(float_path, inputs), onnxruntime_values(qdq_path, inputs)
    for k in (1, 2, 3):  # the QDQ model's MatMul output took the Relu's name a{k}; the float one is h{k}
        expected = error_stats(runtime[f"a{k}"], float_values[f"h{k}"]).snr_db
        assert table.loc[f"fc{k}", "sqnr_db"] == pytest.approx(expected, abs=0.01)
    assert report.first_tvm_divergence is None


@pytest.mark.slow
def test_real_cnn_with_dynamic_dimensions(tmp_path):
    """PP-OCR's mobile text-direction classifier (from the rapidocr wheel: dynamic batch and width, 201
    quantized ops, 33 Relu / Clip folded), quantized with default options on normalized-image-like data.

    TVM builds it for the sizes given.  Its build and onnxruntime's run of the same QDQ model differ by
    a quantization step here and there (float32 rounding across a QuantizeLinear boundary, 50 convs
    deep), which moves single-op SQNRs by a dB or two: the ground truth is therefore onnxruntime's
    quantizer's own models (``nodes_to_exclude``), evaluated by TVM, the runtime being debugged: the
    ranking's first op and six drawn at random are the models onnxruntime writes (onnxruntime runs both to
    the bit; sensitivity checks its switchable build against TVM's real build of the first); every op in
    float is the float model; keep_float's answer reaches the target in TVM's real build of it, which is
    the model onnxruntime writes excluding those ops."""
    shape = (4, 3, 48, 64)
    float_path = qm.PPOCR_CLS
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", shape, batches=4, uniform=True)
    inputs = {"x": qm.draw(shape, seed=5, uniform=True)}
    with pytest.raises(ProbeError, match=r"Divide by zero: it was built with sizes chosen for dimensions the model "
                                         r"leaves unknown \(x \[1, 3, 1, 1\]\): give sizes it takes with shapes="):
        compare_quantized(float_path, qdq_path, inputs)  # TVM cannot follow its dims; 1 is too small a width
    ranking = sensitivity(float_path, qdq_path, inputs, shapes={"x": shape})
    assert ranking.float_sqnr_db >= 100 and ranking.note == ""
    assert len(ranking.rows) == 201 and sum(len(op.folded) for op in ranking.study.ops) == 33
    reference = _run(float_path, inputs)
    best = ranking.ranking()[0]
    for op in [best, *np.random.default_rng(0).choice(ranking.ranking()[1:], 6, replace=False)]:
        excluded = qm.quantize(float_path, tmp_path / f"excluded_{op}.onnx", shape, exclude=[op], batches=4,
                               uniform=True)
        np.testing.assert_array_equal(_run(ranking.quantized_model_with(keep_float=[op]), inputs),
                                      _run(excluded, inputs), err_msg=op)
    assert ranking.rows[0]["gain_db"] > 1
    target = ranking.rows[0]["sqnr_db"] + 1
    kept = ranking.keep_float(target_sqnr_db=target)  # checked against TVM's real build of that variant
    assert len(kept) >= 2
    assert ranking.study.output_stats(ranking.study.outputs_with(kept)).snr_db >= target
    excluded = qm.quantize(float_path, tmp_path / "kept.onnx", shape, exclude=kept, batches=4, uniform=True)
    np.testing.assert_array_equal(_run(ranking.quantized_model_with(keep_float=kept), inputs), _run(excluded, inputs))
    np.testing.assert_array_equal(_run(ranking.quantized_model_with(keep_float=ranking.ranking()), inputs),
                                  reference)


def nan_model() -> onnx.ModelProto:
    """``layer0/MatMul(x, W0 > 0)`` → ``layer1/Div(h0, x)`` → ``layer2/MatMul``.  Calibrated on x in
    [0.5, 2), every range includes 0: inputs near 0 quantize h0 and x to 0, and 0/0 is NaN, which
    the QuantizeLinear of the Div's output then meets."""
    rng = np.random.default_rng(2)
    weights = {"w0": rng.uniform(0.1, 0.5, (D, D)).astype(np.float32),
               "w2": (rng.standard_normal((D, D)) / 4).astype(np.float32)}
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w0"], ["h0"], name="layer0/MatMul"),
                               helper.make_node("Div", ["h0", "x"], ["r"], name="layer1/Div"),
                               helper.make_node("MatMul", ["r", "w2"], ["y"], name="layer2/MatMul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, D])],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _positive_inputs(seed=5):
    return {"x": np.random.default_rng(seed).uniform(0.5, 2.0, (8, D)).astype(np.float32)}


@pytest.fixture(scope="module")
def with_nan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nan")
    float_path = _saved(nan_model(), folder)
    reader = qm.calibration((8, D))
    reader.batches = iter([_positive_inputs(seed) for seed in range(8)])
    quantize_static(str(float_path), str(folder / "qdq.onnx"), reader, quant_format=QuantFormat.QDQ)
    return float_path, folder / "qdq.onnx"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The issue's MLP (outlier in fc2's output) and its QDQ model, default options."""
    folder = tmp_path_factory.mktemp("planted")
    float_path = _saved(qm.mlp("Relu"), folder)
    return float_path, qm.quantize(float_path, folder / "qdq.onnx", (8, D))


def test_tvm_divergence_on_quantize_linear_of_nan_is_named(with_nan):
    float_path, qdq_path = with_nan
    clean = compare_quantized(float_path, qdq_path, _positive_inputs())
    assert clean.first_tvm_divergence is None
    every = [op.name for op in clean.ops]  # (every op in float is the float model here too)
    np.testing.assert_array_equal(_run(with_float_ops(onnx.load(float_path), onnx.load(qdq_path), every),
                                       _positive_inputs()), _run(float_path, _positive_inputs()))
    inputs = _positive_inputs()
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


def test_refuses_models_that_are_not_float_and_qdq(planted, tmp_path):
    float_path, qdq_path = planted
    with pytest.raises(QuantizationError, match="no op of the float model is quantized"):
        compare_quantized(float_path, float_path, _inputs(qm.mlp()))
    with pytest.raises(QuantizationError, match="'nope' is not an op the quantized model quantizes: choose from "
                                                "fc1, fc2, fc3, fc4$"):
        with_float_ops(onnx.load(float_path), onnx.load(qdq_path), ["fc1", "nope"])
    other = qm.mlp("Sigmoid")  # its Sigmoids are not in this QDQ model, and no quantizer folds a Sigmoid
    with pytest.raises(QuantizationError, match=r"the quantized model has no node 'act1' \(Sigmoid\) of the float "
                                                r"model.*give the QDQ model quantize_static wrote from this float"):
        quantized_ops(other, onnx.load(qdq_path))
    qoperator = tmp_path / "qop.onnx"
    quantize_static(str(float_path), str(qoperator), qm.calibration((8, D)), quant_format=QuantFormat.QOperator)
    with pytest.raises(QuantizationError, match="QLinearMatMul.*which TVM 0.27 cannot import: quantize with "
                                                "quant_format=QuantFormat.QDQ"):
        compare_quantized(float_path, qoperator, _inputs(qm.mlp()))


def test_cli_quantization_end_to_end(planted, tmp_path, capsys):
    float_path, qdq_path = planted
    np.savez(tmp_path / "inputs.npz", **_inputs(qm.mlp()))
    out = tmp_path / "out"
    status = main(["-q", "quantization", str(float_path), str(qdq_path), "--inputs", str(tmp_path / "inputs.npz"),
                   "--target-sqnr", "1", "-o", str(out)])
    printed = capsys.readouterr().out
    assert status == Exit.OK
    assert "1. fc2 (MatMul + act2)" in printed and "every op in float: " in printed
    import pandas as pd

    ranking = pd.read_csv(out / "sensitivity.csv")
    assert ranking["name"][0] == "fc2" and len(ranking) == 4 and ranking["folded"][0] == "act2"
    assert set(pd.read_csv(out / "quantization.csv")["name"]) == set(ranking["name"])
    assert "keep in float: nothing" in printed  # 1 dB: the QDQ model as given reaches it
    status = main(["-q", "quantization", str(float_path), str(tmp_path / "missing.onnx")])
    assert status == Exit.BAD_INPUT
    assert "missing.onnx" in capsys.readouterr().err


def test_cli_quantization_of_a_model_with_symbolic_dimensions(tmp_path, capsys):
    """A batch dimension left symbolic, as exports leave it: --shapes sizes TVM's builds and the random
    inputs; --inputs alone sizes both; neither says how to give them."""
    model = qm.mlp("Relu")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    float_path = _saved(model, tmp_path)
    qdq_path = qm.quantize(float_path, tmp_path / "qdq.onnx", (8, D))
    assert main(["-q", "quantization", str(float_path), str(qdq_path), "-o", str(tmp_path / "none")]) == Exit.BAD_INPUT
    assert ("input 'x' has symbolic dimensions ['batch', 16]: give its sizes (--shapes x=AxB) or the inputs "
            "(--inputs FILE.npz)") in capsys.readouterr().err
    assert main(["-q", "quantization", str(float_path), str(qdq_path), "--shapes", "x=4x16",
                 "-o", str(tmp_path / "shaped")]) == Exit.OK
    assert "1. fc2 (MatMul + act2)" in capsys.readouterr().out
    np.savez(tmp_path / "inputs.npz", **_inputs(qm.mlp()))
    assert main(["-q", "quantization", str(float_path), str(qdq_path), "--inputs", str(tmp_path / "inputs.npz"),
                 "-o", str(tmp_path / "given")]) == Exit.OK
    capsys.readouterr()
    assert main(["-q", "quantization", str(float_path), str(qdq_path), "--shapes", "x=4xa"]) == Exit.BAD_INPUT
    assert "--shapes x=4xa: give an input's name and its sizes, e.g. --shapes x=1x3x224x224" in capsys.readouterr().err
    assert main(["-q", "quantization", str(float_path), str(qdq_path), "--shapes", "y=4x16"]) == Exit.BAD_INPUT
    assert "--shapes y: the model has no input 'y'; its inputs are x" in capsys.readouterr().err


def test_yaml_quantization_key_runs_the_same(planted, tmp_path, capsys):
    float_path, qdq_path = planted
    np.save(tmp_path / "x.npy", _inputs(qm.mlp())["x"])
    config = tmp_path / "quant.yaml"
    config.write_text(f"model: {{onnx: {float_path}}}\nquantization: {{model: {qdq_path}, target_sqnr: 1000}}\n"
                      f"inputs: {{x: {{file: x.npy}}}}\noutput: {{report: out}}\n")
    assert main(["-q", "run", str(config)]) == Exit.DIVERGED  # 1000 dB: no set of ops in float reaches it
    printed = capsys.readouterr().out
    assert "1. fc2 (MatMul + act2)" in printed and "below the target 1000 dB" in printed
    assert (tmp_path / "out" / "sensitivity.csv").is_file() and (tmp_path / "out" / "quantization.csv").is_file()


def test_yaml_quantization_key_is_checked(planted, tmp_path):
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
    config.write_text(f"model: {{onnx: {planted[0]}}}\nquantization: {{model: {planted[1]}}}\nprecision: fp16\n")
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


def test_view_overlays_show_each_ops_figures(planted, tmp_path):
    pytest.importorskip("model_explorer_onnx")
    import json

    from tvm_probe.show.view import export_quantization

    float_path, qdq_path = planted
    inputs = _inputs(qm.mlp())
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


def test_the_docs_first_example_runs_as_written_and_finds_no_tvm_divergence(tmp_path, monkeypatch):
    """docs/quantization.md's first block, run from an empty folder, twice: what its comments say holds."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "quantization.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        scope = {"__name__": "docs"}
        exec(compile(block, "docs/quantization.md", "exec"), scope)
        assert scope["report"].first_tvm_divergence is None
    assert (tmp_path / "qdq_keep.onnx").is_file()
