"""CUDA targets (issue 15).

Building for CUDA needs no GPU (the wheel is built with CUDA, nvcc or NVRTC compile the kernels),
so every machine checks that a CUDA executable is built and mapped like a CPU one.  Running it
needs a device: those tests skip with the reason where ``tvm.cuda(0).exist`` is False.  The full
check on a GPU (bert-base sized model, every value against onnxruntime, capture overhead) is
``bench/gpu_check.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe import PipelineError, Probe, TVMRunError, demo
from tvm_probe.build.compile import parse_target
from tvm_probe.capture.executor import INSTRUMENT_ENV, CapturePlan, DebugExecutor

CUDA = {"kind": "cuda", "arch": "sm_90"}  # explicit arch: without a GPU TVM cannot detect one


def cuda_device() -> bool:
    import tvm

    return bool(tvm.cuda(0).exist)


def require_cuda() -> None:
    if not cuda_device():
        pytest.skip("no CUDA device: tvm.cuda(0).exist is False on this machine (bench/gpu_check.py runs "
                    "the full check where there is one)")


@pytest.fixture(scope="module")
def bert1():
    model = demo.tiny_bert(num_layers=1)
    return model, demo.demo_inputs(model)


@pytest.fixture(scope="module")
def cuda_probe(bert1):
    """The demo BERT (one layer) built for CUDA with the GPU pipeline; not run."""
    return Probe.from_onnx(bert1[0], target=CUDA, pipeline="fused")


# -- without a device -----------------------------------------------------------------------------
def test_a_cuda_probe_is_built_and_mapped_without_a_device(cuda_probe):
    probe = cuda_probe
    assert probe.built.target.kind.name == "cuda" and "gpu" in probe.built.target.keys
    sites = probe.kernel_map.sites
    assert len(sites) > 10 and all(s.symbol for s in sites)
    nodes = probe.nodes
    assert len(nodes) == probe.num_input_nodes + len(sites)
    assert nodes["source_names"].iloc[probe.num_input_nodes:].map(len).sum() > 0, "kernels named in source terms"
    served = set(probe.sources["served"])
    assert {"captured", "recomputed", "input", "constant"} <= served
    assert probe.device_label == "CUDA_0"
    assert probe._executor.sync, "kernel times on a GPU are device times: synced around each call"


def test_on_cuda_the_native_instrument_is_opt_in(cuda_probe, monkeypatch):
    monkeypatch.delenv(INSTRUMENT_ENV, raising=False)
    executor = DebugExecutor(cuda_probe.built, cuda_probe.kernel_map)
    assert executor.instrument == "python"
    assert executor.fallback_reason == f"the native instrument is used on CUDA only when {INSTRUMENT_ENV}=native"


def test_without_a_device_a_run_fails_in_one_line(cuda_probe, bert1):
    if cuda_device():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(TVMRunError) as err:
        cuda_probe.run(bert1[1])
    assert str(err.value) == ("no CUDA device here (cuda:0 does not exist): the model was built for CUDA; run it "
                              "on a machine that has one, or on a remote device with remote=...")
    assert cuda_probe.instrument is None, "nothing ran"


def test_folded_values_are_evaluated_on_this_cpu_as_fold_constant_does():
    """FoldConstant evaluates on the host ("llvm"), so a CUDA build needs no GPU for them."""
    from support.models import folding_model

    model, _ = folding_model()
    probe = Probe.from_onnx(model, target=CUDA, pipeline="fused")
    assert probe.served("Wr") == "folded"
    w = next(t for t in model.graph.initializer if t.name == "W")
    from onnx import numpy_helper

    expected = np.maximum(numpy_helper.to_array(w).T, 0)
    np.testing.assert_array_equal(probe._server.folded_values()["Wr"], expected)  # no run: no GPU here


def test_a_command_line_style_target_points_to_the_json_form():
    with pytest.raises(PipelineError) as err:
        parse_target("cuda -arch=sm_90 -max_num_threads=1024")
    assert str(err.value) == (
        "target 'cuda -arch=sm_90 -max_num_threads=1024': TVM 0.27 takes a target with options in JSON form, not "
        'as a command line: use {"kind": "cuda", "arch": "sm_90", "max_num_threads": 1024} (a dict in Python, '
        "a quoted string in YAML)")
    assert parse_target('{"kind": "cuda", "arch": "sm_90"}').attrs["arch"] == "sm_90"


@pytest.fixture(scope="module")
def cpu_probe(bert1):
    return Probe.from_onnx(bert1[0], pipeline="fused")


@pytest.mark.parametrize("instrument", ["python", "native"])
def test_the_device_sync_path_captures_the_same_bytes(instrument, bert1, cpu_probe):
    """Device sync around each call (what a GPU run does), exercised on the CPU: same captures."""
    from support.native_tools import HAS_TOOLS

    if instrument == "native" and not HAS_TOOLS:
        pytest.skip("no C++ compiler or ninja")
    _, inputs = bert1
    probe = cpu_probe
    arrays = [inputs[s.name] for s in probe.inputs]
    plain = DebugExecutor(probe.built, probe.kernel_map, instrument=instrument).run(arrays, CapturePlan())
    synced_executor = DebugExecutor(probe.built, probe.kernel_map, instrument=instrument, sync=True)
    synced = synced_executor.run(arrays, CapturePlan())
    assert synced_executor.sync and synced.instrument == instrument
    assert synced.outputs.keys() == plain.outputs.keys() and len(synced.outputs) > 0
    for site in plain.outputs:
        assert [a.tobytes() for a in synced.outputs[site]] == [a.tobytes() for a in plain.outputs[site]]
    assert synced.time_us.keys() == plain.time_us.keys()


# -- on a device ----------------------------------------------------------------------------------
def test_cuda_values_match_onnxruntime_and_dumps_name_the_device(cuda_probe, bert1, tmp_path):
    require_cuda()
    from tvm_probe.comparison.verdict import compare
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model, inputs = bert1
    cuda_probe.run(inputs)
    comparison = compare(cuda_probe, onnxruntime_values(model, inputs))
    assert comparison, comparison.verdict()
    assert cuda_probe.nodes["time_us"].iloc[cuda_probe.num_input_nodes:].notna().all()
    assert (cuda_probe.dump(tmp_path / "d") / "_tvmdbg_device_CUDA_0").is_dir()
