"""Robustness: every bad input is one clear line; nothing on disk is damaged or left half-written."""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_probe import (CorruptDumpError, DumpError, InputError, ModelError, Probe, ProbeError,
                       load_dump)
from tvm_probe.store.dump import MANIFEST, _sha256

from support import SUPPORT
from support.models import folding_model
from support.processes import run_signalling_itself


@pytest.fixture(scope="module")
def small():
    model, inputs = folding_model()
    probe = Probe.from_onnx(model, pipeline="fused")
    probe.run(inputs)
    return model, inputs, probe


@pytest.fixture(scope="module")
def small_dump(small, tmp_path_factory):
    root = tmp_path_factory.mktemp("robust") / "dump"
    small[2].dump(root)
    return root


# -- model files ---------------------------------------------------------------------------------
def test_truncated_onnx_file(tmp_path, bert_model):
    path = tmp_path / "cut.onnx"
    path.write_bytes(bert_model.SerializeToString()[:5000])
    with pytest.raises(ModelError) as err:
        Probe.from_onnx(path)
    assert str(err.value).startswith(f"'{path}' is not an ONNX model") and "\n" not in str(err.value)


def test_dynamic_dimensions_compile_dynamically_or_as_pinned():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], np.float32)
    dynamic = Probe.from_onnx(model)
    assert dynamic.inputs[0].shape == ("batch", 4)
    np.testing.assert_array_equal(dynamic.run(x)["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(dynamic.run(x[:1])["y"], np.maximum(x[:1], 0))
    with pytest.raises(InputError, match=r"^input 'x' has shape \[2, 5\], the model expects \['batch', 4\]"):
        dynamic.run(np.zeros((2, 5), np.float32))
    pinned = Probe.from_onnx(model, shapes={"x": (2, 4)})
    np.testing.assert_array_equal(pinned.run({"x": x})["y"], np.maximum(x, 0))
    rankless = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    rankless = helper.make_model(rankless, opset_imports=[helper.make_opsetid("", 17)])
    # no rank: compiled as TVM compiles it, which cannot build a Relu of unknown rank (TVM's own
    # build fails too: tests/importer/test_unknown_rank_inputs.py); shapes= pins it
    with pytest.raises(ModelError, match=r"R.nn.relu of R.Tensor\(ndim=-1\) .* pass shapes=\{'x': \(\.\.\.\)\}"):
        Probe.from_onnx(rankless)
    np.testing.assert_array_equal(Probe.from_onnx(rankless, shapes={"x": (2, 4)}).run(x)["y"], np.maximum(x, 0))


# -- inputs --------------------------------------------------------------------------------------
def test_nan_and_inf_inputs_are_refused_unless_allowed(small):
    _, inputs, probe = small
    bad = inputs["x"].copy()
    bad[0, :3] = [np.nan, np.inf, -np.inf]
    with pytest.raises(InputError) as err:
        probe.run({"x": bad})
    assert str(err.value) == ("input 'x' holds 1 NaN and 2 Inf values: fix the data, or pass "
                              "allow_nonfinite=True to run() to trace how they propagate")
    out = probe.run({"x": bad}, allow_nonfinite=True)
    assert np.isnan(out["z"][0]).any()
    assert np.isnan(probe.get("y")[0]).any() and not np.isnan(probe.get("y")[1]).any()
    assert probe.first_nonfinite() == "mm"  # x@Wr: the first computed value holding NaN
    probe.run(inputs)
    assert probe.first_nonfinite() is None


def test_out_of_range_ids_are_refused_before_tvm_reads_out_of_bounds(bert_model, bert_inputs):
    probe = Probe.from_onnx(bert_model)
    ids = bert_inputs["input_ids"].copy()
    ids[0, 0] = 128  # the demo vocabulary has 128 rows
    with pytest.raises(InputError) as err:
        probe.run({**bert_inputs, "input_ids": ids})
    assert str(err.value) == (
        "input 'input_ids' holds values outside [-128, 128) but indexes "
        "'tf_bert_for_sequence_classification/bert/embeddings/word_embeddings/weight:0', which has 128 rows "
        "(TVM's Gather does not check bounds): fix the ids")


# -- dumps ---------------------------------------------------------------------------------------
def test_dump_into_a_path_below_a_file(small, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DumpError) as err:
        small[2].dump(tmp_path / "file" / "dump")
    assert str(err.value).startswith(f"cannot write dump to '{tmp_path / 'file' / 'dump'}'")


def test_manifest_paths_cannot_leave_the_dump(small_dump, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(small_dump, root)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["device_dir"] = "../../etc"
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptDumpError, match=r"names a path outside the dump \('../../etc'\)"):
        load_dump(root)


def test_a_full_disk_during_a_dump_loses_nothing(small_dump, tmp_path):
    """A real write failure: the file-size limit makes the kernel refuse writes past 1 KiB."""
    script = textwrap.dedent(f"""
        import resource, signal, sys
        sys.path.insert(0, {str(SUPPORT.parent)!r})  # tests/, where the support package is
        from support.models import folding_model
        from tvm_probe import Probe, DumpError
        model, inputs = folding_model()
        probe = Probe.from_onnx(model)
        probe.run(inputs)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        try:
            probe.dump({str(small_dump)!r}, overwrite=True)
        except DumpError as err:
            print("DumpError:", err)
        try:  # the same while streaming: the write fails inside the VM's instrument
            probe.run(inputs, stream_to={str(small_dump)!r}, overwrite=True)
        except DumpError as err:
            print("DumpError:", err)
    """)
    before = {p.name: p.read_bytes() for p in small_dump.rglob("*") if p.is_file()}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"DumpError: cannot write dump to '{small_dump}': File too large"] * 2, out
    after = {p.name: p.read_bytes() for p in small_dump.rglob("*") if p.is_file()}
    assert after == before, "the existing dump is untouched"
    assert [p.name for p in small_dump.parent.iterdir()] == ["dump"], "no partial folder left"


def test_ctrl_c_during_a_streamed_dump_leaves_no_trace(small, tmp_path, monkeypatch):
    from tvm_probe.store import paramdict

    _, inputs, probe = small
    written = []
    original = paramdict.StreamWriter.write

    def interrupted_write(self, name, value):  # Ctrl-C arriving after the third tensor
        if len(written) == 3:
            raise KeyboardInterrupt
        written.append(name)
        return original(self, name, value)

    monkeypatch.setattr(paramdict.StreamWriter, "write", interrupted_write)
    with pytest.raises(KeyboardInterrupt):
        probe.run(inputs, stream_to=tmp_path / "dump")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    probe.run(inputs)  # the probe is still usable


def test_ctrl_c_during_a_run_is_a_keyboard_interrupt():
    """SIGINT lands inside the VM's instrument hook; TVM would turn it into a RuntimeError.  (In a
    process of its own: support.processes.SIGNALS_ITSELF.)"""
    run = run_signalling_itself(textwrap.dedent("""
        import os, threading
        from tvm_probe import Probe, demo
        model = demo.tiny_bert()
        inputs = demo.demo_inputs(model)
        probe = Probe.from_onnx(model)
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        try:
            for _ in range(100000):
                probe.run(inputs)
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
        timer.join()
        probe.run(inputs)
        print("usable")
    """))
    assert run.stdout.split() == ["KeyboardInterrupt", "usable"], run.stderr[-2000:]


def test_cli_ctrl_c_exits_2_with_one_line(tmp_path, ctrl_c):
    import signal
    import time

    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{demo: {{num_layers: 6}}}}\noutput: {{dump: {tmp_path / 'dump'}}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "tvm_probe.app.cli", "-q", "run", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not _loaded_tvm(proc.pid) and time.monotonic() < deadline:  # TVM loaded: the job is on
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to tvm-probe and the child it watches
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.strip().splitlines()[-1] == "tvm-probe: error: interrupted (no partial dump or report is left behind)"
    assert "Traceback" not in err
    assert not (tmp_path / "dump").exists() and [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def _loaded_tvm(pid: int) -> bool:
    """Whether ``pid``, or the watched child doing its job (capture/watch.py), has loaded TVM."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [pid, *(int(c) for c in (children.read_text().split() if children.exists() else []))]
    for p in pids:
        try:
            if "libtvm" in Path(f"/proc/{p}/maps").read_text():
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def test_a_ctrl_c_after_the_work_is_done_changes_nothing():
    """A Ctrl-C while the interpreter shuts down (the result already printed) once killed the
    process with the signal (status -2, nothing said); it must leave the exit status alone."""
    script = ("import atexit, os, signal, time\n"
              "from tvm_probe.app import cli\n"
              "cli.main = lambda argv=None: 1\n"
              "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n"
              "cli.console_main()\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (1, "")


# -- determinism ---------------------------------------------------------------------------------
def test_same_model_inputs_and_pipeline_give_bit_identical_dumps(bert_model, bert_inputs, tmp_path):
    roots = []
    for i in range(2):
        probe = Probe.from_onnx(bert_model, pipeline="fused")
        probe.run(bert_inputs)
        roots.append(probe.dump(tmp_path / f"d{i}", timings=False))
    files = sorted(p.relative_to(roots[0]) for p in roots[0].rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(roots[1]) for p in roots[1].rglob("*") if p.is_file())
    for rel in files:
        assert filecmp.cmp(roots[0] / rel, roots[1] / rel, shallow=False), rel


# -- property-based ------------------------------------------------------------------------------
names = st.text(alphabet=st.sampled_from("ab/_.:*?[]0 "), max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names)
def test_name_resolution_never_crashes(small, name):
    probe = small[2]
    try:
        key = probe.resolve(name)
    except ProbeError as err:
        assert "\n" not in str(err)
    else:
        assert key in probe.sources_map
    try:
        probe.get_all(name) if name.strip() else None
    except ProbeError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["model", "demo", "onnx", "inputs", "pipeline", "capture", "reference", "atol",
                         "output", "dump", "write", "split", "cuts", "x", "random", "shape"]), inner, max_size=4),
    max_leaves=12))
def test_config_validation_never_crashes(tmp_path, data):
    import yaml

    from tvm_probe.app.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_config(path)
    except ConfigError as err:
        assert "\n" not in str(err)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupting_any_dump_file_gives_a_clear_error(small_dump, tmp_path_factory, data):
    """Random damage to any file, with the manifest re-sealed so the parsers see it."""
    import shutil

    root = tmp_path_factory.mktemp("corrupt") / "d"
    shutil.copytree(small_dump, root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    target = data.draw(st.sampled_from(files))
    raw = bytearray(target.read_bytes())
    action = data.draw(st.sampled_from(["flip", "truncate", "append"]))
    if action == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "truncate":
        raw = raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=16))
    target.write_bytes(bytes(raw))
    manifest = json.loads((root / MANIFEST).read_text())
    rel = target.relative_to(root).as_posix()
    manifest["files"][rel] = {"size": target.stat().st_size, "sha256": _sha256(target)}
    (root / MANIFEST).write_text(json.dumps(manifest))
    try:
        reader = load_dump(root)
        for value in reader.sources_map:
            try:
                reader.get(value.key)
            except ProbeError:
                pass
        reader.nodes, reader.sources
    except ProbeError as err:
        assert "\n" not in str(err)


def test_comparison_names_the_first_nan(small):
    from tvm_probe.comparison.verdict import compare
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model, inputs, probe = small
    clean = onnxruntime_values(model, inputs)
    bad = inputs["x"].copy()
    bad[1, 2] = np.nan
    probe.run({"x": bad}, allow_nonfinite=True)
    result = compare(probe, clean)
    assert not result and result.first_nonfinite.name == "mm"
    # one NaN in x spoils a row of x@Wr: the verdict says so in words
    assert ("first divergent op: mm (TVM gives NaN where the reference has finite values at 8 of 16 elements)"
            in result.verdict())
    probe.run(inputs)
