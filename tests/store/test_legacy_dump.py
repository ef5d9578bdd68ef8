"""Dumps written by TVM's own graph debug executor (TVM <= 0.19): read by node name, without TVM.

The fixture tests/store/fixtures/tvm019_dump was written by hand from TVM v0.19's sources (see
tests/store/fixtures/README.md); its tensors were saved by TVM's own save_param_dict.
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_probe import AmbiguousNameError, CorruptDumpError, DumpError, ProbeError, load_dump
from tvm_probe.store import paramdict
from tvm_probe.store.dump import GRAPH, TENSORS, TRACE

FIXTURE = Path(__file__).parent / "fixtures" / "tvm019_dump"
DEVICE = FIXTURE / "_tvmdbg_device_CPU_0"
DENSE, SPLIT, ADD = ("tvmgen_default_fused_nn_dense_add_nn_relu", "tvmgen_default_fused_subtract_split",
                     "tvmgen_default_fused_add")


@pytest.fixture
def old(tmp_path) -> Path:
    """A copy of the fixture dump, free to damage."""
    root = tmp_path / "tvmdbg"
    shutil.copytree(FIXTURE, root)
    return root


def test_a_dump_tvm_wrote_says_source_names_are_not_known(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_probe"):
        reader = load_dump(FIXTURE)
    assert (reader.written_by, reader.source_names_known, reader.manifest, reader.device) == ("tvm", False, None,
                                                                                              "CPU_0")
    assert "source names are not known for this dump" in reader.notes[0]
    assert [r.getMessage() for r in caplog.records] == [f"{FIXTURE}: {reader.notes[0]}"]
    assert (reader.target, reader.pipeline, reader.model_hash, reader.metadata) == (None, None, "", {})
    assert list(reader.nodes["source_names"]) == [[]] * 8, "no node claims a source name"


def test_kernels_and_params_by_node_name():
    reader = load_dump(FIXTURE)
    data, p0, p1, p2 = (reader.get(n) for n in ("data", "p0", "p1", "p2"))
    dense = np.maximum(data @ p0.T + p1, np.float32(0))
    np.testing.assert_array_equal(reader.get(DENSE), dense)
    np.testing.assert_allclose(reader.get(DENSE), [[4.35, 0.3, 0.05]], rtol=1e-6)
    splits = [reader.get(f"{SPLIT}:{j}") for j in range(3)]
    np.testing.assert_array_equal(np.concatenate(splits, axis=1), dense - p2)
    np.testing.assert_array_equal(reader.get(ADD), splits[0] + splits[2])
    np.testing.assert_array_equal(reader.get("reshape_nop"), np.array([5.0], np.float32))
    assert list(reader.inputs) == ["data", "p0", "p1", "p2"], "TVM's weights are graph inputs too"
    with pytest.raises(AmbiguousNameError, match=f"node '{SPLIT}' has 3 outputs: name one of '{SPLIT}:0'"):
        reader.get(SPLIT)
    assert reader.get_tensor(f"{SPLIT}____topo-index:5____output-num:1").tolist() == splits[1].tolist()


def test_get_node_output_by_index():
    reader = load_dump(FIXTURE)
    np.testing.assert_array_equal(reader.get_node_output(3), reader.get(DENSE))
    np.testing.assert_array_equal(reader.get_node_output(5, 2), reader.get(f"{SPLIT}:2"))
    np.testing.assert_array_equal(reader.get_node_output(1), reader.get("p0"))
    with pytest.raises(ProbeError, match=rf"node 5 \({SPLIT}\) has 3 output\(s\), not output 3"):
        reader.get_node_output(5, 3)


def test_nodes_and_times_from_tvms_graph_and_trace():
    reader = load_dump(FIXTURE)
    nodes = reader.nodes
    assert nodes["op"].tolist() == ["null", "null", "null", "tvm_op", "null", "tvm_op", "tvm_op", "tvm_op"]
    assert nodes["symbol"].tolist()[5:] == [SPLIT, ADD, "__nop"]
    times = nodes["time_us"].tolist()
    assert all(np.isnan(times[i]) for i in (0, 1, 2, 4)), "inputs did not run: no time, not 0"
    assert times[3] == pytest.approx(15.218) and times[5] == pytest.approx(19.931 - 15.218)
    assert times[7] == pytest.approx(22.061 - 22.004)
    infos = reader.node_infos
    assert infos[7].is_view and not infos[6].is_view
    assert infos[3].inputs == [(0, 0), (1, 0), (2, 0)]
    assert infos[6].inputs == [(5, -1), (5, -1)], "TVM's dump names the producer, not which of its 3 outputs"
    assert any("output -1 (not known)" in note for note in reader.notes)
    sources = reader.sources_map
    assert [sources[k].display_name for k in sources.model_outputs] == ["reshape_nop", f"{SPLIT}:1"]
    assert [sources[k].display_name for k in sources.model_inputs] == ["data", "p0", "p1", "p2"]
    assert reader.sources["served"].tolist() == ["input"] * 3 + ["captured", "input"] + ["captured"] * 4 + ["view"]


def test_the_device_folder_itself_can_be_given():
    reader = load_dump(DEVICE)
    np.testing.assert_array_equal(reader.get(ADD), load_dump(FIXTURE).get(ADD))


def test_reads_without_tvm():
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tvm"] = None      # any import of tvm now fails
        import tvm_probe
        r = tvm_probe.load_dump({str(FIXTURE)!r})
        print(r.get("reshape_nop").tolist(), r.source_names_known)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[5.0] False"
    assert "source names are not known" in out.stderr, "the note reaches a user with no logging set up"


def test_cli_ls_get_report(tmp_path, capsys):
    from tvm_probe.app.cli import main

    assert main(["ls", str(FIXTURE), "p*"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[1:]] == ["p0", "p1", "p2"]
    assert main(["get", str(FIXTURE), f"{SPLIT}:1", "-o", str(tmp_path / "s.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), load_dump(FIXTURE).get(f"{SPLIT}:1"))
    capsys.readouterr()
    assert main(["report", str(FIXTURE), "-o", str(tmp_path / "rep")]) == 0
    nodes_csv = (tmp_path / "rep" / "nodes.csv").read_text()
    assert DENSE in nodes_csv and "15.218" in nodes_csv


# -- TVM's older key formats ---------------------------------------------------------------------
def rekey(root: Path, rename) -> None:
    path = root / "_tvmdbg_device_CPU_0" / TENSORS
    tensors = paramdict.load(path)
    paramdict.save(path, {rename(k): v for k, v in tensors.items()})


@pytest.mark.parametrize("release, rename", [
    ("v0.8", lambda k: k.split("____topo-index:")[0] + "____" + k.rsplit(":", 1)[1]),
    ("v0.7", lambda k: k.split("____topo-index:")[0] + "_" + k.rsplit(":", 1)[1] + "__2.5e-05"),
])
def test_tensor_keys_of_older_tvm_releases(old, release, rename):
    rekey(old, rename)
    reader = load_dump(old)
    fresh = load_dump(FIXTURE)
    for value in fresh.sources_map:
        np.testing.assert_array_equal(reader.get_tensor(value.key), fresh.get_tensor(value.key), err_msg=release)


# -- damaged or mismatched dumps: one line each, saying what to do -------------------------------
def test_a_trace_from_another_run_is_refused(old):
    trace_path = old / "_tvmdbg_device_CPU_0" / TRACE
    trace = json.loads(trace_path.read_text())
    trace["traceEvents"] = trace["traceEvents"][2:]
    trace_path.write_text(json.dumps(trace))
    with pytest.raises(CorruptDumpError, match=rf"^{TRACE}: the execution trace is malformed \(the trace times 7 "
                       r"nodes but the graph has 8\): .*move it away to read the dump without kernel times$"):
        load_dump(old)


def test_without_a_trace_times_are_not_known(old):
    (old / "_tvmdbg_device_CPU_0" / TRACE).unlink()
    reader = load_dump(old)
    assert reader.nodes["time_us"].isna().all()
    assert "kernel times are not known" in " ".join(reader.notes)


def test_missing_tensor_file(old):
    (old / "_tvmdbg_device_CPU_0" / TENSORS).unlink()
    with pytest.raises(CorruptDumpError, match=rf"'{TENSORS}' is missing .*TVM writes it when the debug "
                       r"executor's run\(\) completes; run it again$"):
        load_dump(old)


def test_tensor_that_disagrees_with_the_graph(old):
    rekey(old, lambda k: k)
    path = old / "_tvmdbg_device_CPU_0" / TENSORS
    tensors = paramdict.load(path)
    tensors["p0____topo-index:1____output-num:0"] = np.zeros((4, 3), np.float32)
    paramdict.save(path, tensors)
    with pytest.raises(CorruptDumpError, match=r"tensor 'p0____topo-index:1____output-num:0' is float32\[4, 3\] "
                       r"but the graph JSON says float32\[3, 4\]"):
        load_dump(old)


def test_graph_naming_an_unknown_input(old):
    path = old / "_tvmdbg_device_CPU_0" / GRAPH
    graph = json.loads(path.read_text())
    graph["nodes"][3]["inputs"][1] = "p9"
    path.write_text(json.dumps(graph))
    with pytest.raises(CorruptDumpError, match=f"node 3 \\('{DENSE}'\\) has input 'p9', which is no earlier node"):
        load_dump(old)


def test_graph_that_is_not_json(old):
    (old / "_tvmdbg_device_CPU_0" / GRAPH).write_text("{\"nodes\": [")
    with pytest.raises(CorruptDumpError, match=f"^dump file '{GRAPH}' is not valid JSON"):
        load_dump(old)


def test_several_device_folders(old):
    shutil.copytree(old / "_tvmdbg_device_CPU_0", old / "_tvmdbg_device_CUDA_0")
    with pytest.raises(DumpError, match=r"holds dumps of several devices \(_tvmdbg_device_CPU_0, "
                       r"_tvmdbg_device_CUDA_0\): give one of these folders"):
        load_dump(old)


def test_a_folder_that_is_no_dump(tmp_path):
    with pytest.raises(CorruptDumpError, match=r"is not a dump: 'tvm_probe_manifest.json' is missing and there is "
                       r"no _tvmdbg_device_\* folder"):
        load_dump(tmp_path)


# -- lazy reading ----------------------------------------------------------------------------------
def test_tensors_are_mapped_not_loaded(tmp_path):
    """A TVM-style dump with a 32 MiB input: opening and reading it copies nothing."""
    import tracemalloc

    n = 8 << 20
    device = tmp_path / "big" / "_tvmdbg_device_CPU_0"
    device.mkdir(parents=True)
    x = np.arange(n, dtype=np.float32)
    graph = {"nodes": [{"op": "param", "name": "x", "inputs": [], "attrs": {"T": "type: float32"}, "shape": [n]},
                       {"op": "f", "name": "f", "attrs": {"func_name": "f", "flatten_data": "0", "num_inputs": "1",
                                                          "num_outputs": "1", "T": "type: float32"},
                        "inputs": ["x"], "shape": [n]}],
             "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
             "attrs": {"shape": ["list_shape", [[n], [n]]], "storage_id": ["list_int", [0, 1]],
                       "dltype": ["list_str", ["float32", "float32"]]}}
    (device / GRAPH).write_text(json.dumps(graph))
    paramdict.save(device / TENSORS, {"x____topo-index:0____output-num:0": x,
                                      "f____topo-index:1____output-num:0": x[::-1]})
    tracemalloc.start()
    try:
        reader = load_dump(tmp_path / "big")
        f = reader.get("f")
        last = f[-4:].copy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"reading allocated {peak} bytes"
    np.testing.assert_array_equal(last, x[3::-1])
    assert not f.flags.writeable


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_gives_a_one_line_error(tmp_path_factory, data):
    """A dump TVM wrote has no manifest to catch damage: the parsers themselves must."""
    root = tmp_path_factory.mktemp("damaged") / "d"
    shutil.copytree(FIXTURE, root)
    target = data.draw(st.sampled_from(sorted((root / "_tvmdbg_device_CPU_0").iterdir())))
    raw = bytearray(target.read_bytes())
    action = data.draw(st.sampled_from(["flip", "truncate", "append"]))
    if action == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    elif action == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        raw += data.draw(st.binary(min_size=1, max_size=16))
    target.write_bytes(bytes(raw))
    try:
        reader = load_dump(root)
        for value in reader.sources_map:
            try:
                reader.get_tensor(value.key)
            except ProbeError as err:
                assert "\n" not in str(err)
        reader.nodes, reader.sources, reader.inputs
    except ProbeError as err:
        assert "\n" not in str(err)
