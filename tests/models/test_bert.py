"""The demo BERT under both pipelines: every value by its source name equals onnxruntime's."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import AmbiguousNameError, NotCapturedError, Probe, UnknownNameError
from tvm_probe.kernel_map import ArgKind
from tvm_probe.core.sources import Kind

from support.session import SERVED_COUNTS

ATOL = 1e-4


def computed_values(probe):
    """Every value a node of the model computes (at run time or folded at import)."""
    return [v for v in probe.sources_map if v.kind in (Kind.VALUE, Kind.CONSTANT)]


def test_every_value_matches_onnxruntime(bert_probe, bert_reference, record_property):
    served = {}
    for value in computed_values(bert_probe):
        got = bert_probe.get(value.display_name)  # the full node name
        ref = bert_reference[value.key]
        assert got.shape == ref.shape, value.display_name
        np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL, err_msg=value.display_name)
        how = bert_probe.servings[value.key].served.value
        served[how] = served.get(how, 0) + 1
    record_property("served", served)
    SERVED_COUNTS[bert_probe.pipeline] = served
    assert "unavailable" not in served
    assert sum(served.values()) == len(computed_values(bert_probe)) > 100
    assert served["constant"] >= 2  # the demo's Constant nodes
    if bert_probe.pipeline == "default":
        assert "recomputed" not in served  # nothing is fused: every value is a kernel output
    else:
        assert served["recomputed"] > 30 and served["captured"] > 30


def test_fused_kernels_shared_between_layers_map_per_call_site(bert_probe, bert_reference):
    if bert_probe.pipeline != "fused":
        pytest.skip("sharing only happens when FuseOps runs")
    name = "layer_._{}/attention/self/query/MatMul"
    nodes = [bert_probe.servings[bert_probe.resolve(name.format(i))].node_index for i in (0, 1)]
    symbols = [bert_probe.node_infos[n].symbol for n in nodes]
    assert symbols[0] == symbols[1], "both layers call one shared grouped kernel"
    assert nodes[0] != nodes[1]
    for i in (0, 1):
        assert bert_probe.served(name.format(i)) == "recomputed"
        key = bert_probe.resolve(name.format(i))
        np.testing.assert_allclose(bert_probe.get(name.format(i)), bert_reference[key], atol=ATOL)
    assert not np.allclose(bert_probe.get(name.format(0)), bert_probe.get(name.format(1)))


def test_model_outputs_bit_identical_with_and_without_capture(bert_probe, bert_model, bert_inputs):
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from tvm_probe.build.compile import compile_plain

    captured = bert_probe.run(bert_inputs, capture="all")["logits"]
    uncaptured = bert_probe.run(bert_inputs, capture=None)["logits"]
    vm = relax.VirtualMachine(compile_plain(from_onnx(bert_model), "llvm", bert_probe.pipeline), tvm.cpu())
    plain = vm["main"](*[tvm.runtime.tensor(bert_inputs[s.name]) for s in bert_probe.inputs]).numpy()
    assert np.array_equal(captured, uncaptured)
    assert np.array_equal(captured, plain)
    bert_probe.run(bert_inputs)  # leave the shared fixture as the other tests expect it


def kernel_calls(vm, device_inputs) -> list[str]:
    """The non-builtin functions a VM calls in one run, in order."""
    calls = []

    def record(func, symbol, before, ret, *args):
        if before and not str(symbol).startswith("vm.builtin."):
            calls.append(str(symbol))
        return 0

    vm.set_instrument(record)
    vm["main"](*device_inputs)
    return calls


def test_probe_runs_the_same_kernel_calls_as_a_plain_build(bert_probe, bert_model, bert_inputs):
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from tvm_probe.build.compile import compile_plain

    arrays = [tvm.runtime.tensor(bert_inputs[s.name]) for s in bert_probe.inputs]
    plain_vm = relax.VirtualMachine(compile_plain(from_onnx(bert_model), "llvm", bert_probe.pipeline), tvm.cpu())
    plain = kernel_calls(plain_vm, arrays)
    probe_vm = relax.VirtualMachine(bert_probe.built.executable, tvm.cpu())
    probed = kernel_calls(probe_vm, arrays)
    assert probed == plain
    assert [s.symbol for s in bert_probe.kernel_map.sites if not s.is_view] == plain


def test_names_resolve_by_node_name_tensor_name_suffix_and_glob(bert_probe, bert_reference):
    full = "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/MatMul"
    by_suffix = bert_probe.get("layer_._0/attention/self/MatMul")
    np.testing.assert_array_equal(by_suffix, bert_probe.get(full))
    np.testing.assert_array_equal(by_suffix, bert_probe.get(full + ":0"))  # the tensor name
    softmaxes = bert_probe.get_all("*/attention/self/Softmax")
    assert list(softmaxes) == [f"tf_bert_for_sequence_classification/bert/encoder/layer_._{i}/attention/self/Softmax"
                               for i in (0, 1)]
    with pytest.raises(AmbiguousNameError, match="names 2 different values.*layer_._0.*layer_._1"):
        bert_probe.get("attention/self/MatMul")
    with pytest.raises(UnknownNameError, match="did you mean.*layer_._0/attention/self/MatMul"):
        bert_probe.get("tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/MatMull")
    for typed in ("layer_._0/attention/self/MatMuk", "Layer_._0/Attention/Self/MatMul"):  # a suffix, a case miss
        with pytest.raises(UnknownNameError, match=f"'{typed}'; did you mean '{full}'"):
            bert_probe.get(typed)
    with pytest.raises(UnknownNameError, match="empty name"):
        bert_probe.get("")
    with pytest.raises(UnknownNameError, match="matches no source value"):
        bert_probe.get_all("*/NoSuchOp*")


def test_get_node_output_agrees_with_get(bert_probe):
    nodes = bert_probe.nodes
    row = nodes[nodes["source_names"].map(lambda n: any(x.endswith("layer_._1/attention/self/Softmax") for x in n))]
    assert len(row) == 1
    index = int(row["index"].iloc[0])
    np.testing.assert_array_equal(bert_probe.get_node_output(index), bert_probe.get("layer_._1/attention/self/Softmax"))
    np.testing.assert_array_equal(bert_probe.get_node_output(0), bert_probe.get("input_ids"))


def test_tables_describe_every_value_and_node(bert_probe):
    sources, nodes = bert_probe.sources, bert_probe.nodes
    assert len(sources) == len(bert_probe.sources_map)
    assert set(sources["served"]) <= {"input", "constant", "captured", "view", "recomputed", "folded"}
    kernels = nodes[nodes["op"] == "tvm_op"]
    assert (kernels["time_us"] >= 0).all() and kernels["time_us"].notna().all()
    assert abs(kernels["time_share"].sum() - 1.0) < 1e-9
    assert (kernels["bytes"] > 0).all()


def test_selective_capture_copies_only_what_is_needed(fused_bert_probe, bert_inputs, bert_reference):
    probe = fused_bert_probe
    wanted = "layer_._1/attention/self/query/MatMul"  # fused away: needs its kernel's inputs
    probe.run(bert_inputs, capture=[wanted])
    np.testing.assert_allclose(probe.get(wanted), bert_reference[probe.resolve(wanted)], atol=ATOL)
    site = probe.kernel_map.sites[probe.kernel_map.site_of(probe.resolve(wanted))]
    producers = {a.node for a in site.args if a.kind is ArgKind.NODE}
    assert set(probe._capture.outputs) == producers
    with pytest.raises(NotCapturedError, match="not captured by the last run"):
        probe.get("layer_._0/attention/self/Softmax")
    probe.run(bert_inputs, capture=None, kernel_times=True)
    assert probe._capture.outputs == {}
    assert probe.nodes["time_us"].notna().sum() == len(probe.kernel_map.sites)
    # without kernel_times, a run capturing nothing observes no kernel at all (and times none)
    probe.run(bert_inputs, capture=None)
    assert probe.instrument == "kernel hook" and probe._capture.outputs == {}
    assert probe.nodes["time_us"].isna().all()


def test_every_cut_is_compiled_once_in_one_module(fused_bert_probe, bert_inputs):
    probe = fused_bert_probe
    probe.run(bert_inputs)
    layer0 = probe.get("layer_._0/attention/self/query/MatMul")
    vm = probe._recomputer._vm
    assert vm is not None and len(probe._recomputer._names) == len(
        {s.group.name for s in probe.kernel_map.sites if s.group is not None})
    probe.get("layer_._1/attention/self/query/MatMul")  # another call site of the same kernel
    probe.run(bert_inputs)
    np.testing.assert_array_equal(probe.get("layer_._0/attention/self/query/MatMul"), layer0)
    assert probe._recomputer._vm is vm  # no second build


def test_a_run_that_will_recompute_builds_the_cuts_alongside_itself(bert_model, bert_inputs, bert_reference):
    """The cut modules are built during the run that needs them (overlapped, once), not on the
    first read; a run that needs none builds nothing."""
    probe = Probe.from_onnx(bert_model, pipeline="fused")
    probe.run(bert_inputs, capture=None)
    probe.run(bert_inputs, capture="layer_._0/attention/self/Softmax")  # a kernel output: nothing to recompute
    assert probe._recomputer._vm is None
    wanted = "layer_._1/attention/self/query/MatMul"
    assert probe.servings[probe.resolve(wanted)].served.value == "recomputed"
    probe.run(bert_inputs, capture=[wanted])
    vm = probe._recomputer._vm
    assert vm is not None
    np.testing.assert_allclose(probe.get(wanted), bert_reference[probe.resolve(wanted)], atol=ATOL)
    probe.run(bert_inputs)
    assert probe._recomputer._vm is vm


def test_a_cut_build_that_fails_alongside_the_run_is_reported_on_read(bert_model, bert_inputs, bert_reference,
                                                                      monkeypatch):
    from tvm_probe.capture import recompute
    from tvm_probe.core.errors import ProbeError

    def failing(groups, target):
        raise ProbeError(f"cannot recompute values inside kernel {groups[0].name}: LLVM said no")

    monkeypatch.setattr(recompute, "compile_cuts", failing)
    probe = Probe.from_onnx(bert_model, pipeline="fused")
    probe.run(bert_inputs)  # the run and its captured values do not depend on the cuts
    captured = "layer_._0/attention/self/Softmax"
    np.testing.assert_allclose(probe.get(captured), bert_reference[probe.resolve(captured)], atol=ATOL)
    with pytest.raises(ProbeError, match="LLVM said no"):
        probe.get("layer_._1/attention/self/query/MatMul")


def test_a_run_is_call_0_and_takes_the_tensors_a_deployment_holds():
    """``run`` takes ``tvm.runtime.Tensor`` inputs (as a deployment holds them) and, on a probe
    never called, is call 0: ``get(name, call=0)`` is the run's value."""
    import tvm

    from tvm_probe import Probe, demo

    model = demo.tiny_bert()
    inputs = demo.demo_inputs(model)
    probe = Probe.from_onnx(model, target="llvm", pipeline="fused")
    expected = probe.run(inputs)
    got = probe.run({k: tvm.runtime.tensor(v) for k, v in inputs.items()})
    assert all(np.array_equal(got[k], expected[k]) for k in expected)
    name = "layer_._0/attention/self/MatMul"
    np.testing.assert_array_equal(probe.get(name, call=0), probe.get(name))
