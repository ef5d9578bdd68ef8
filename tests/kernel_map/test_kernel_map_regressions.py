"""Named regression tests for the kernel map: each graph once made tvm_probe serve a wrong value
or call a live value dead code.  Every value is checked against an independent reference
(onnxruntime, eager PyTorch), and every "dead" claim against the source graph itself.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tvm_probe.core.schema import PIPELINES
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import Probe
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.sources import Kind, Served
from tvm_probe.core.tolerance import Tolerance, within

from support.fuzz_graphs import live_tensors

TOL = Tolerance(1e-4, 1e-3)


def assert_served_right(probe, reference, live) -> dict[str, int]:
    """Every computed value equals ``reference``; 'unavailable' only for values not in ``live``.

    Returns how many values were served each way (callers check that fusion happened).
    """
    counts: dict[str, int] = {}
    for value in probe.sources_map:
        if value.kind in (Kind.INPUT, Kind.PARAM):
            continue
        served = probe.servings[value.key].served
        counts[served.value] = counts.get(served.value, 0) + 1
        assert served is not Served.UNKNOWN, (value.display_name, probe.kernel_map.lost.get(value.key))
        if served is Served.UNAVAILABLE:
            assert value.key not in live, f"{value.display_name} is live but was called dead code"
            continue
        if value.key not in reference:
            continue
        got, ref = probe.get_tensor(value.key), reference[value.key]
        assert got.shape == ref.shape, value.display_name
        assert within(got, ref, TOL).all(), (
            f"{value.display_name} ({served.value}): max abs error "
            f"{np.abs(got.astype(np.float64) - ref).max():.3g}")
    return counts


def onnx_probe_check(model, inputs, pipeline):
    probe = Probe.from_onnx(model, pipeline=pipeline)
    probe.run(inputs)
    counts = assert_served_right(probe, onnxruntime_values(model, inputs), live_tensors(model))
    assert probe.verify(inputs), probe.verify(inputs).summary()
    return probe, counts


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "regression", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(rng, name, shape, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(rng.normal(size=shape), dtype=dtype), name)


# -- graphs the issue reported ---------------------------------------------------------------------
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_identical_computations_each_serve_their_own_name(pipeline):
    """A hand-written LayerNorm computing the same mean twice, in three blocks: block 0's
    ``a_2 * (x - mean)`` was served with a later block's value, and blocks 1-2 called dead."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for b in range(3):
        inits += [_w(rng, f"a2_{b}", (16,)), _w(rng, f"b2_{b}", (16,)),
                  numpy_helper.from_array(np.array(1e-6, np.float32), f"eps{b}")]
        def node(op, ins, name, **kw):
            nodes.append(helper.make_node(op, ins, [name], name=name, **kw))
            return name
        mean = node("ReduceMean", [x], f"b{b}/mean", axes=[-1])
        mul = node("Mul", [f"a2_{b}", node("Sub", [x, mean], f"b{b}/sub")], f"b{b}/mul")
        d2 = node("Sub", [x, node("ReduceMean", [x], f"b{b}/mean2", axes=[-1])], f"b{b}/sub2")
        std = node("Sqrt", [node("ReduceMean", [node("Mul", [d2, d2], f"b{b}/sq")], f"b{b}/var", axes=[-1])],
                   f"b{b}/std")
        x = node("Add", [node("Div", [mul, node("Add", [std, f"eps{b}"], f"b{b}/den")], f"b{b}/div"),
                         f"b2_{b}"], f"b{b}/out")
    model = _model(nodes, [_f32("x", [4, 16])], [_f32(x, [4, 16])], inits, opset=13)
    probe, counts = onnx_probe_check(model, {"x": rng.normal(size=(4, 16)).astype(np.float32)}, pipeline)
    assert "unavailable" not in counts
    if pipeline == "fused":
        assert counts.get("recomputed", 0) > 10


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_output_of_a_split_after_gemm_is_mapped(pipeline):
    """Gemm → Split(3) → Add → MatMul: the split kernel mapped to no name and everything after
    it was called dead code under the fused pipeline."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["qkv"], name="gemm"),
             helper.make_node("Split", ["qkv"], ["q", "k", "v"], name="split", axis=1),
             helper.make_node("Add", ["q", "k"], ["qk"], name="add"),
             helper.make_node("Transpose", ["v"], ["vt"], name="tr", perm=[1, 0]),
             helper.make_node("MatMul", ["qk", "vt"], ["y"], name="mm")]
    model = _model(nodes, [_f32("x", [4, 8])], [_f32("y", [4, 4])],
                   [_w(rng, "W", (8, 24)), _w(rng, "B", (24,))], opset=13)
    probe, counts = onnx_probe_check(model, {"x": rng.normal(size=(4, 8)).astype(np.float32)}, pipeline)
    assert counts.get("unavailable", 0) == 0
    assert [probe.served(f"split:{k}") for k in range(3)] == ["captured"] * 3


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_merged_qkv_attention_names_every_kernel_right(pipeline):
    """MatMul/Gemm → Split → Reshape → Transpose attention: split outputs, q/k/v reshapes and a
    transpose were called dead, and a kernel labelled with q's transpose computed v's."""
    from support.handwritten_models import merged_qkv_bert

    model, inputs = merged_qkv_bert()
    probe, counts = onnx_probe_check(model, inputs, pipeline)
    assert counts.get("unavailable", 0) == 0
    for node in probe.node_infos[probe.num_input_nodes:]:
        for k, keys in enumerate(node.output_keys):  # every name on a kernel output is that output
            for key in keys:
                np.testing.assert_array_equal(probe.get_node_output(node.index, k), probe.get_tensor(key))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_dynamically_quantized_matmuls_are_served(pipeline, tmp_path):
    """onnxruntime's quantize_dynamic: DynamicQuantizeLinear (3 outputs) → MatMulInteger; the
    MatMulInteger outputs were called dead although used downstream."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="query/MatMul"),
             helper.make_node("MatMul", ["x", "Wv"], ["v"], name="value/MatMul"),
             helper.make_node("Tanh", ["q"], ["qa"], name="query/Tanh"),
             helper.make_node("Mul", ["qa", "v"], ["y"], name="mix")]
    model = _model(nodes, [_f32("x", [4, 16])], [_f32("y", [4, 16])],
                   [_w(rng, "Wq", (16, 16)), _w(rng, "Wv", (16, 16))], opset=13)
    onnx.save(model, tmp_path / "f.onnx")
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QUInt8)
    quantized = onnx.load(tmp_path / "q.onnx")
    assert any(n.op_type == "MatMulInteger" for n in quantized.graph.node)
    _, counts = onnx_probe_check(quantized, {"x": rng.normal(size=(4, 16)).astype(np.float32)}, pipeline)
    assert counts.get("unavailable", 0) == 0


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_reshape_feeding_a_classifier_is_not_dead(pipeline):
    """GlobalAveragePool → Reshape → Gemm (an ONNX-zoo CNN's head): the Reshape was called dead."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "Wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
             helper.make_node("Reshape", ["g", "shape"], ["flat"], name="flatten/Reshape"),
             helper.make_node("Gemm", ["flat", "Wf", "Bf"], ["logits"], name="classifier", transB=1)]
    inits = [_w(rng, "Wc", (4, 3, 3, 3)), _w(rng, "Wf", (5, 4)), _w(rng, "Bf", (5,)),
             numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")]
    model = _model(nodes, [_f32("x", [1, 3, 8, 8])], [_f32("logits", [1, 5])], inits, opset=13)
    probe, _ = onnx_probe_check(model, {"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)}, pipeline)
    assert probe.served("flatten/Reshape") != "unavailable"


# -- graphs the fuzzer found -----------------------------------------------------------------------
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_view_nothing_reads_is_not_served(pipeline):
    """Fuzzer seed 1: a dead Reshape of an early value at the end of the graph.  TVM's memory
    planner ignores it and reuses the storage it aliases before the VM makes the view: the
    'view' held another tensor's data."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Sub", ["x", "x"], ["zero"], name="zero"),
             helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
             helper.make_node("MatMul", ["t", "W2"], ["y"], name="mm2"),
             helper.make_node("Add", ["y", "zero"], ["out"], name="add"),
             helper.make_node("Reshape", ["zero", "shape"], ["late_view"], name="late_view")]
    inits = [_w(rng, "W", (6, 6)), _w(rng, "W2", (6, 6)),
             numpy_helper.from_array(np.array([2, 2, 3], dtype=np.int64), "shape")]
    model = _model(nodes, [_f32("x", [2, 6])], [_f32("out", [2, 6])], inits)
    probe, _ = onnx_probe_check(model, {"x": rng.normal(size=(2, 6)).astype(np.float32)}, pipeline)
    assert probe.served("late_view") == "unavailable"


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_chain_of_views_ending_dead_is_not_served(pipeline):
    """Fuzzer seed 278: Unsqueeze → Squeeze → Unsqueeze of a value, the last one unused.  Each
    view but the last is read by another view, yet the whole chain is dead to TVM."""
    rng = np.random.default_rng(5)
    axes = numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Tanh", ["h"], ["t"], name="tanh"),
             helper.make_node("Unsqueeze", ["t", "axes"], ["u1"], name="u1"),
             helper.make_node("Squeeze", ["u1", "axes"], ["s1"], name="s1"),
             helper.make_node("Unsqueeze", ["s1", "axes"], ["u2"], name="u2"),
             helper.make_node("MatMul", ["t", "W"], ["h2"], name="mm2"),
             helper.make_node("Relu", ["h2"], ["out"], name="relu")]
    model = _model(nodes, [_f32("x", [2, 8])], [_f32("out", [2, 8])], [_w(rng, "W", (8, 8)), axes])
    probe, _ = onnx_probe_check(model, {"x": rng.normal(size=(2, 8)).astype(np.float32)}, pipeline)
    assert {probe.served(n) for n in ("u1", "s1", "u2")} == {"unavailable"}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_fused_kernel_whose_output_is_an_alias(pipeline):
    """Fuzzer seed 3: Reshape → Split where the graph returns one split output: FuseOps binds
    ``gv = lv`` and the reshape inside the kernel was 'computed outside any kernel call'."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             helper.make_node("Split", ["r"], ["a", "b"], name="split", axis=-1)]
    inits = [numpy_helper.from_array(np.array([2, 2, 2], dtype=np.int64), "shape")]
    model = _model(nodes, [_f32("x", [2, 4])], [_f32("b", [2, 2, 1])], inits)
    probe, _ = onnx_probe_check(model, {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}, pipeline)
    assert probe.served("reshape") in ("recomputed", "view")


# -- the hand-written BERT, through every way users import it ---------------------------------------
@pytest.fixture(scope="module")
def codertimo():
    from support.handwritten_models import codertimo_bert

    return codertimo_bert()


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_handwritten_bert_from_torch(codertimo, pipeline):
    from tvm_probe.comparison.reference.torch import torch_values

    model, args = codertimo
    probe = Probe.from_torch(model, args, pipeline=pipeline)
    probe._torch_source = (model, args)
    arrays = [a.numpy() for a in args]
    probe.run(arrays)
    reference = torch_values(model, args)
    counts = assert_served_right(probe, reference, _torch_live(probe))
    assert counts.get("unavailable", 0) == 0, counts
    assert probe.verify(arrays)


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_handwritten_bert_onnx_exports(codertimo, exporter, pipeline, tmp_path):
    import torch

    model, args = codertimo
    path = tmp_path / "bert.onnx"
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=["tokens", "segments"],
                          output_names=["hidden"], dynamo=exporter == "dynamo", opset_version=18)
    proto = onnx.load(str(path))
    inputs = {"tokens": args[0].numpy(), "segments": args[1].numpy()}
    _, counts = onnx_probe_check(proto, inputs, pipeline)
    assert counts.get("unavailable", 0) == 0, counts


def _torch_live(probe) -> set[str]:
    """Keys some output depends on, from the exported fx graph (not tvm_probe's own liveness)."""
    from tvm_probe.importer.torch import export_program, node_keys

    model, args = probe._torch_source  # set by the test: the module and inputs it was built from
    program = export_program(model, args)
    keys = node_keys(program)
    output = next(n for n in program.graph.nodes if n.op == "output")
    live, todo = set(), list(output.all_input_nodes)
    while todo:
        node = todo.pop()
        if node in live:
            continue
        live.add(node)
        todo.extend(node.all_input_nodes)
    return {keys[n] for n in live if n in keys}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_verify_catches_a_wrong_mapping(pipeline):
    """verify() is not a rubber stamp: a deliberately swapped place is reported as a mismatch."""
    from dataclasses import replace

    from tvm_probe.kernel_map import PlaceKind, classify

    rng = np.random.default_rng(6)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["a"], name="a"),
             helper.make_node("Tanh", ["a"], ["b"], name="b"),
             helper.make_node("Sigmoid", ["b"], ["c"], name="c")]
    model = _model(nodes, [_f32("x", [2, 4])], [_f32("c", [2, 4])], [_w(rng, "W", (4, 4))])
    inputs = {"x": rng.normal(size=(2, 4)).astype(np.float32)}
    probe = Probe.from_onnx(model, pipeline=pipeline)
    places = probe.kernel_map.places
    assert probe.verify(inputs)
    if places["b"].kind is PlaceKind.OUTPUT and places["c"].kind is PlaceKind.OUTPUT:
        places["b"], places["c"] = places["c"], places["b"]
    else:  # fused: b lives inside c's kernel; point b at the kernel's output instead
        places["b"] = replace(places["c"])
    probe.servings.update(classify(probe.sources_map, probe.kernel_map, probe.num_input_nodes))
    result = probe.verify(inputs)
    assert not result and [m.name for m in result.mismatches] == ["b"] + (
        ["c"] if pipeline == "default" else [])
    assert "tvm_probe problem" in result.summary()


def _mask_row_module():
    """A decode step's mask row: ``arange(n + 1) <= pos`` over an input extended by one column.
    FuseOps passes the fused group ``R.Shape([n])``, since none of its tensors defines ``n``, and
    renames ``n`` inside: the values in it were once all "unknown" (lost through FuseOps)."""
    import tvm
    from tvm.script import relax as R
    from tvm.script import tirx as T

    @tvm.script.ir_module
    class MaskRow:
        @R.function
        def main(x: R.Tensor((1, "n"), "float32"), pos: R.Tensor((1,), "int64")):
            n = T.int64()
            with R.dataflow():
                r = R.arange(R.prim_value(0), R.prim_value(n + 1), R.prim_value(1), dtype="int64")
                mask = R.less_equal(r, pos)
                xe = R.concat([x, R.zeros(R.shape([1, 1]), "float32")], axis=1)
                scaled = R.multiply(xe, R.const(2.0, "float32"))
                out = R.where(mask, scaled, R.const(-1.0, "float32"))
                R.output(out)
            return out

    return MaskRow


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_fused_kernel_given_its_symbolic_size_as_a_shape_serves_every_value(pipeline):
    probe = Probe.from_relax(_mask_row_module(), pipeline=pipeline)
    for n, pos in ((5, 3), (2, 0)):  # the size recomputation feeds is each run's own
        x = np.arange(n, dtype="float32")[None] + 1
        probe.run([x, np.array([pos], "int64")])
        r = np.arange(n + 1)
        xe = np.concatenate([x, np.zeros((1, 1), "float32")], axis=1)
        reference = {"r": r, "mask": r <= pos, "xe": xe, "scaled": 2 * xe, "out": np.where(r <= pos, 2 * xe, -1)}
        keys = {probe.resolve(name): ref for name, ref in reference.items()}
        counts = assert_served_right(probe, keys, live=set(keys))
        assert sum(counts.values()) >= len(reference), counts
    if pipeline == "fused":
        assert counts.get("recomputed", 0) >= 3, counts  # r, mask, scaled stay inside the fused kernel
