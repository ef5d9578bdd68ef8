"""Reduced precision (tvm_probe.tools.precision): fp16 builds probed by source name, local error, and the
search for the ops to keep in fp32 — on models built here whose fp16 values overflow, and on the
demo BERT, which is fine in fp16.

Expected values come from numpy and onnxruntime, never from tvm_probe's own output.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import Probe, demo
from tvm_probe.app.cli import main
from tvm_probe.comparison.verdict import compare
from tvm_probe.importer.onnx import import_onnx
from tvm_probe.tools.precision import BF16_REFUSED, PrecisionError, analyse, ddmin, find_keep_fp32, parse_precision
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

FP16_MAX = 65504.0
H = 64
LLVM_O0 = {"kind": "llvm", "opt-level": 0}  # fp16 kernels: LLVM's optimizer is slow on them (see the BERT test)


def _model(nodes, inputs, outputs, weights) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def projection_layernorm_model() -> onnx.ModelProto:
    """x @ W (|values| beyond 65504: weights ~4000, 64 terms) → LayerNorm → a harmless MatMul."""
    rng = np.random.default_rng(0)
    return _model(
        [helper.make_node("MatMul", ["x", "W"], ["proj"], name="proj/MatMul"),
         helper.make_node("LayerNormalization", ["proj", "gamma", "beta"], ["ln"], name="ln/LayerNorm", axis=-1),
         helper.make_node("MatMul", ["ln", "W2"], ["y"], name="out/MatMul")],
        [("x", [4, H])], [("y", [4, H])],
        {"W": (rng.standard_normal((H, H)) * 4000).astype(np.float32),
         "W2": (rng.standard_normal((H, H)) * 0.1).astype(np.float32),
         "gamma": np.ones(H, np.float32), "beta": np.zeros(H, np.float32)})


def attention_model() -> onnx.ModelProto:
    """Single-head attention whose Q·K scores (~4e5) exceed 65504 before a scale brings them to ~1."""
    rng = np.random.default_rng(1)
    d = 16
    return _model(
        [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="attn/q/MatMul"),
         helper.make_node("MatMul", ["x", "Wk"], ["k"], name="attn/k/MatMul"),
         helper.make_node("MatMul", ["x", "Wv"], ["v"], name="attn/v/MatMul"),
         helper.make_node("Transpose", ["k"], ["kt"], name="attn/k/Transpose", perm=[1, 0]),
         helper.make_node("MatMul", ["q", "kt"], ["scores"], name="attn/scores/MatMul"),
         helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="attn/scores/Mul"),
         helper.make_node("Softmax", ["scaled"], ["probs"], name="attn/Softmax", axis=-1),
         helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="attn/context/MatMul"),
         helper.make_node("MatMul", ["ctx", "Wo"], ["y"], name="attn/output/MatMul")],
        [("x", [8, d])], [("y", [8, d])],
        {"Wq": (rng.standard_normal((d, d)) * 80).astype(np.float32),
         "Wk": (rng.standard_normal((d, d)) * 80).astype(np.float32),
         "Wv": (rng.standard_normal((d, d)) * 0.3).astype(np.float32),
         "Wo": (rng.standard_normal((d, d)) * 0.3).astype(np.float32),
         "scale": np.array(2.5e-6, np.float32)})


def _x(shape, seed=2):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


@pytest.fixture(scope="module")
def ln_case():
    model = projection_layernorm_model()
    inputs = _x((4, H))
    return model, inputs, onnxruntime_values(model, inputs)


@pytest.fixture(scope="module")
def attention_case():
    model = attention_model()
    inputs = _x((8, 16))
    return model, inputs, onnxruntime_values(model, inputs)


def test_the_test_models_overflow_fp16_where_intended(ln_case, attention_case):
    """The premise, from onnxruntime alone: only the named values leave the fp16 range."""
    _, _, ref = ln_case
    assert np.abs(ref["proj"]).max() > FP16_MAX and np.isfinite(ref["y"]).all()
    _, _, ref = attention_case
    assert np.abs(ref["scores"]).max() > FP16_MAX
    assert all(np.abs(ref[k]).max() < FP16_MAX for k in ("q", "k", "scaled", "ctx", "y"))


def test_fp16_probe_serves_source_names_in_fp16(ln_case, tmp_path):
    model, inputs, ref = ln_case
    probe = Probe.from_onnx(model, pipeline="fused", precision="fp16")
    probe.run(inputs)
    proj = probe.get("proj/MatMul")
    assert proj.dtype == np.float16  # the value downstream ops read: the fp32 accumulation stored in fp16
    # ToMixedPrecision's matmul, in numpy: fp16 operands, a wide accumulator, the result stored in fp16
    weight = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    wide = inputs["x"].astype(np.float16).astype(np.float64) @ weight.astype(np.float16).astype(np.float64)
    with np.errstate(over="ignore"):
        expected = wide.astype(np.float16)
    np.testing.assert_array_equal(np.isinf(proj), np.isinf(expected))
    assert np.isinf(proj).any()
    finite = np.isfinite(expected)
    np.testing.assert_allclose(proj[finite].astype(np.float64), expected[finite], rtol=2e-3, atol=1e-3)
    assert np.isnan(probe.get("ln/LayerNorm")).any()
    assert probe.get("y").dtype == np.float32  # model outputs keep their dtype
    assert probe.get("x").dtype == np.float32  # the input, not the fp16 cast ToMixedPrecision put after it
    assert not compare(probe, ref)
    # every served value against an independent unfused build of the same fp16 module
    assert probe.verify(inputs), probe.verify(inputs).summary()
    from tvm_probe import load_dump

    reader = load_dump(probe.dump(tmp_path / "dump"))
    np.testing.assert_array_equal(reader.get("proj/MatMul"), proj)  # float16 in the dump too


def test_a_precision_pass_of_ones_own(ln_case):
    from tvm import relax

    model, inputs, _ = ln_case
    probe = Probe.from_onnx(model, precision=relax.transform.ToMixedPrecision("float32"))
    probe.run(inputs)
    assert probe.get("proj/MatMul").dtype == np.float16 and probe.precision.spec.pass_ is not None


def test_local_error_ranks_the_overflowing_projection_first(ln_case):
    model, inputs, _ = ln_case
    p32, p16 = Probe.from_onnx(model), Probe.from_onnx(model, precision="fp16")
    p32.run(inputs)
    p16.run(inputs)
    analysis = analyse(p16, p32)
    assert analysis.overflowing() == ["proj/MatMul"]
    first = analysis.ops[0]
    assert first.name == "proj/MatMul" and first.local == np.inf and first.local_inf > 0
    # the LayerNorm's input is already inf in fp16: that is the projection's doing, not counted
    ln = next(op for op in analysis.ops if op.name == "ln/LayerNorm")
    assert np.isnan(ln.local) and "already overflows" in ln.note and ln.nan > 0
    out = next(op for op in analysis.ops if op.name == "out/MatMul")
    assert 0 < out.local < 1e-2 and out.inherited == np.inf
    assert analysis.ranking()[0] == "proj/MatMul"


def test_keep_fp32_builds_those_ops_in_fp32(ln_case):
    model, inputs, ref = ln_case
    probe = Probe.from_onnx(model, pipeline="fused", precision={"dtype": "fp16", "keep_fp32": ["proj/MatMul"]})
    probe.run(inputs)
    # read from the built module: the kernel computing the projection writes float32
    site = probe.kernel_map.sites[probe.kernel_map.site_of("proj")]
    assert "float32" in site.out_dtypes or probe.kernel_map.places["proj"].kind.value == "interior"
    assert probe.get("proj/MatMul").dtype == np.float32
    np.testing.assert_allclose(probe.get("proj/MatMul"), ref["proj"], rtol=1e-5, atol=1e-2)
    # the harmless matmul after it still runs in fp16 (its inputs are cast down)
    text = probe.built.snapshots.final.script()
    assert "float16" in text
    np.testing.assert_allclose(probe.get("y"), ref["y"], rtol=5e-3, atol=5e-3)
    assert probe.verify(inputs)  # every served value against an unfused build of the same module


@pytest.mark.slow
def test_precision_command_names_the_projection_and_its_build_passes(ln_case, tmp_path, capsys):
    model, inputs, _ = ln_case
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", inputs["x"])
    config = tmp_path / "c.yaml"
    config.write_text("model: {onnx: m.onnx}\ninputs: {x: {file: x.npy}}\npipeline: fused\n"
                      "reference: onnxruntime\ncapture: [y]\n")
    assert main(["--quiet", "precision", str(config), "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    import yaml

    written = yaml.safe_load((tmp_path / "out" / "precision.yaml").read_text())
    assert written["precision"] == {"dtype": "fp16", "keep_fp32": ["proj/MatMul"]}
    assert "rebuilds for" in printed and (tmp_path / "out" / "ranking.csv").is_file()
    assert "proj/MatMul" in (tmp_path / "out" / "precision.html").read_text()
    # the plain fp16 build fails the comparison; the written keep_fp32 build meets the tolerance
    assert main(["--quiet", "run", str(config), "--set", "precision=fp16"]) == 1
    keep = "precision={dtype: fp16, keep_fp32: [proj/MatMul]}"
    assert main(["--quiet", "run", str(config), "--set", keep]) == 0


@pytest.mark.slow
def test_search_on_attention_names_only_the_scores_matmul(attention_case):
    model, inputs, ref = attention_case
    search = find_keep_fp32(import_onnx(model), inputs, pipeline="fused", reference={"y": ref["y"]})
    assert search.found and search.keep_fp32 == ["attn/scores/MatMul"]
    assert not search.plain.passed and search.kept.passed
    assert search.analysis.overflowing() == ["attn/scores/MatMul"]
    assert search.rebuilds < search.num_ops


@pytest.mark.slow
def test_demo_bert_passes_in_fp16_with_an_empty_set():
    model = demo.tiny_bert()
    inputs = demo.demo_inputs(model)
    ref = onnxruntime_values(model, inputs)
    # LLVM's optimizer takes minutes on the fp16 GELU (erf) kernel; at opt-level 0 it takes a second
    search = find_keep_fp32(import_onnx(model), inputs, target=LLVM_O0, pipeline="fused",
                            reference={"logits": ref["logits"]})
    assert search.found and search.keep_fp32 == [] and search.rebuilds == 1 and search.plain.passed
    assert max(search.plain.errors.values()) > 0  # it did run in fp16
    ops = search.analysis.ops
    assert len(ops) > 50 and not search.analysis.overflowing() and search.analysis.ranking()
    assert all(op.local < 1e-2 for op in ops if op.local == op.local)  # every op fine in fp16 by itself


def test_all_fp32_failing_is_exit_1_with_the_numbers(ln_case):
    """A tolerance even the fp32 build cannot meet: no set is found, and the lines say so."""
    model, inputs, ref = ln_case
    from tvm_probe.core.tolerance import Tolerance

    wrong = {"y": ref["y"] + 1.0}
    search = find_keep_fp32(import_onnx(model), inputs, reference=wrong, tolerance=Tolerance(1e-3, 0))
    assert not search.found and search.all_fp32 is not None and not search.all_fp32.passed
    assert any("no set of ops can meet the tolerance" in line for line in search.lines())
    assert search.all_fp32.errors["y"] == pytest.approx(1.0, abs=1e-2)


def test_ddmin_finds_a_one_minimal_set():
    needed = {3, 7}
    calls = []

    def passes(subset):
        calls.append(tuple(subset))
        return needed <= set(subset)

    assert sorted(ddmin(list(range(10)), passes)) == [3, 7]
    assert ddmin([5], lambda s: True) == []


@pytest.mark.parametrize("value, message", [
    ("bf16", BF16_REFUSED),
    ("int4", "precision dtype 'int4': use fp16 (or fp32 for none)"),
    ({"dtype": "fp16", "keep": []}, "precision: unknown key 'keep'; valid keys: dtype, keep_fp32"),
    ({"dtype": "fp16", "keep_fp32": "a"}, "precision keep_fp32: must be a list of source names, got 'a'"),
])
def test_bad_precision_values_are_one_line_errors(value, message):
    with pytest.raises(PrecisionError) as err:
        parse_precision(value)
    assert str(err.value) == message


def test_unknown_keep_name_is_refused_before_compiling(ln_case):
    model, _, _ = ln_case
    with pytest.raises(PrecisionError, match="keep_fp32: .*nosuch"):
        Probe.from_onnx(model, precision={"dtype": "fp16", "keep_fp32": ["nosuch/op"]})
    with pytest.raises(PrecisionError, match="is a param"):
        Probe.from_onnx(model, precision={"dtype": "fp16", "keep_fp32": ["W"]})


def test_config_precision_key(tmp_path):
    from tvm_probe.app.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("model: {demo: {}}\nprecision: {dtype: fp16, keep_fp32: [a/b]}\n")
    assert load_config(path).precision.keep_fp32 == ("a/b",)
    path.write_text("model: {demo: {}}\nprecision: bf16\n")
    with pytest.raises(ConfigError, match="c.yaml:2: precision: bf16: TVM 0.27"):
        load_config(path)


@pytest.mark.slow
def test_pytorch_module_paths_in_fp16_and_kept():
    """A PyTorch Linear is several Relax bindings (transpose, matmul, bias add): keep_fp32 keeps them all."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.proj, self.norm, self.out = torch.nn.Linear(H, H), torch.nn.LayerNorm(H), torch.nn.Linear(H, H)
            with torch.no_grad():
                self.proj.weight.mul_(1e5)  # default init ~U(±1/8): weights < 65504, outputs beyond it

        def forward(self, x):
            return self.out(self.norm(self.proj(x)))

    net = Net().eval()
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        proj, y = net.proj(x).numpy(), net(x).numpy()
    assert np.abs(proj).max() > FP16_MAX
    plain = Probe.from_torch(net, (x,), precision="fp16")
    plain.run([x.numpy()])
    assert plain.get("proj").dtype == np.float16 and np.isinf(plain.get("proj")).any()
    kept = Probe.from_torch(net, (x,), precision={"dtype": "fp16", "keep_fp32": ["proj"]})
    kept.run([x.numpy()])
    assert kept.get("proj").dtype == np.float32
    # exactly the module's addmm is kept: the weight's transpose (fx node 'permute') is an op of its
    # own, stored in fp16 — so the kept projection is x @ fp16(W).T + b, computed in fp32
    w16 = net.proj.weight.detach().numpy().astype(np.float16).astype(np.float64)
    emulated = x.numpy().astype(np.float64) @ w16.T + net.proj.bias.detach().numpy()
    np.testing.assert_allclose(kept.get("proj"), emulated, rtol=1e-4, atol=1)
    both = Probe.from_torch(net, (x,), precision={"dtype": "fp16", "keep_fp32": ["proj", "permute"]})
    out = both.run([x.numpy()])
    np.testing.assert_allclose(both.get("proj"), proj, rtol=1e-4, atol=1)
    np.testing.assert_allclose(next(iter(out.values())), y, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("reference", ["tvm", "none"])
def test_precision_command_without_a_runtime_reference_holds_fp16_to_the_fp32_tvm_build(ln_case, tmp_path,
                                                                                      reference):
    model, inputs, _ = ln_case
    onnx.save(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", inputs["x"])
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{onnx: m.onnx}}\ninputs: {{x: {{file: x.npy}}}}\nreference: {reference}\n")
    assert main(["--quiet", "precision", str(config), "-o", str(tmp_path / "out")]) == 0
    assert "plain float16 build against the fp32 TVM build" in (tmp_path / "out" / "precision.yaml").read_text()
