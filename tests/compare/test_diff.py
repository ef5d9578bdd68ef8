"""Diffs of two TVM builds of one model, by source name: pipelines, targets, and a broken build.

The reference is another run of the same source model — a Probe or a dump — lined up by source
name whatever its kernels.  A pass written here perturbs one op before the fused pipeline runs:
the diff must name that op as the first divergent one.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

from tvm_probe import Probe, ProbeError, demo, load_dump
from tvm_probe.app.cli import main
from tvm_probe.comparison.verdict import compare

SOFTMAX = "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/Softmax"


def perturb_first_softmax(scale: float = 1.05):
    """A module pass scaling the input of the first softmax of ``main``: a deliberately wrong build."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Scale(PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.done = False

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not self.done and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.softmax":
                self.done = True
                scaled = self.builder_.emit(relax.op.multiply(call.args[0], relax.const(scale, "float32")))
                return relax.Call(call.op, [scaled], call.attrs, call.ty_args)
            return call

    @tvm.transform.module_pass(opt_level=0, name="PerturbFirstSoftmax")
    def perturb(mod, ctx):
        mod["main"] = _Scale(mod).visit_expr(mod["main"])
        return mod

    return perturb


@pytest.fixture(scope="module")
def demo_runs(bert_model, bert_inputs):
    runs = {}
    for pipeline in PIPELINES:
        runs[pipeline] = Probe.from_onnx(bert_model, pipeline=pipeline)
        runs[pipeline].run(bert_inputs)
    return runs


def test_fused_and_default_builds_agree_everywhere(demo_runs):
    result = compare(demo_runs["fused"], demo_runs["default"])
    assert result, result.verdict()
    assert len(result.values) > 100 and not result.unchecked


def test_a_deliberately_broken_build_is_caught_at_the_op_it_breaks(bert_model, bert_inputs, demo_runs):
    import tvm
    from tvm import relax

    broken = tvm.transform.Sequential([perturb_first_softmax(), relax.get_default_pipeline(tvm.target.Target("llvm"))],
                                      name="broken")
    probe = Probe.from_onnx(bert_model, pipeline=broken)
    probe.run(bert_inputs)
    result = compare(probe, demo_runs["default"])
    assert not result and result.first_divergent.key == probe.resolve(SOFTMAX)
    assert result.verdict().startswith("FAIL: ") and "first divergent op: " + result.first_divergent.name in result.verdict()
    # every value computed before the broken op still agrees
    order = [v.key for v in probe.sources_map]
    first = order.index(result.first_divergent.key)
    assert all(v.passed for v in result.values if order.index(v.key) < first)


def test_diff_of_two_dumps_through_the_cli(demo_runs, tmp_path, capsys):
    demo_runs["fused"].dump(tmp_path / "fused")
    demo_runs["default"].dump(tmp_path / "default")
    assert main(["diff", str(tmp_path / "fused"), str(tmp_path / "default"), "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "all 126 compared values within tolerance" in out and (tmp_path / "rep" / "report.html").exists()
    a, b = load_dump(tmp_path / "fused"), load_dump(tmp_path / "default")
    assert a.pipeline == "fused" and b.pipeline == "default"


def test_a_diff_of_two_different_models_is_refused(demo_runs, tmp_path):
    other = demo.tiny_bert(seed=1)
    probe = Probe.from_onnx(other)
    probe.run(demo.demo_inputs(other))
    with pytest.raises(ProbeError, match="different models"):
        compare(probe, demo_runs["default"])


def test_reference_tvm_build_in_a_config(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  demo: {num_layers: 1, hidden: 32, seq_len: 8}\npipeline: fused\n"
                      "reference:\n  tvm: {pipeline: default, target: llvm}\n")
    assert main(["-q", "run", str(config)]) == 0
    assert "compared values within tolerance" in capsys.readouterr().out


@pytest.mark.slow
def test_fused_and_default_agree_on_a_bert_base_sized_model():
    model = demo.bert_base(num_layers=1, seq_len=32, vocab=8192)
    inputs = demo.demo_inputs(model)
    runs = []
    for pipeline in ("fused", "default"):
        probe = Probe.from_onnx(model, pipeline=pipeline)
        probe.run(inputs)
        runs.append(probe)
    result = compare(*runs)
    assert result, result.verdict()
    assert np.array_equal(runs[0].get("logits").shape, (1, 2))
