"""Dumps: legacy layout, round trip, read without TVM, and refusal of damaged dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tvm_probe import CorruptDumpError, DumpError, DumpExistsError, load_dump
from tvm_probe.sources import Served
from tvm_probe.store.dump import GRAPH, MANIFEST, TENSORS, TRACE


@pytest.fixture(scope="module")
def dumped(tmp_path_factory, bert_probe):
    root = tmp_path_factory.mktemp("dumps") / f"run-{bert_probe.pipeline}"
    bert_probe.dump(root)
    return bert_probe, root


def device_dir(root):
    (d,) = [p for p in root.iterdir() if p.name.startswith("_tvmdbg_device_")]
    return d


def test_dump_has_the_legacy_layout(dumped):
    import tvm

    probe, root = dumped
    d = device_dir(root)
    assert d.name == "_tvmdbg_device_CPU_0"
    graph = json.loads((d / GRAPH).read_text())
    assert len(graph["nodes"]) == len(probe.node_infos)
    assert graph["arg_nodes"] == [0, 1]
    assert graph["node_row_ptr"][-1] == len(graph["attrs"]["shape"][1])
    kernel = graph["nodes"][2]
    assert {"func_name", "num_inputs", "num_outputs", "flatten_data", "T"} <= set(kernel["attrs"])
    tensors = tvm.runtime.load_param_dict((d / TENSORS).read_bytes())  # TVM reads it as its own
    assert any(k.endswith("____topo-index:2____output-num:0") for k in tensors)
    trace = json.loads((d / TRACE).read_text())
    assert {e["ph"] for e in trace["traceEvents"]} == {"B", "E"}
    assert graph["heads"], "the model output is a head"


def test_dump_round_trip_equals_the_live_probe(dumped):
    probe, root = dumped
    reader = load_dump(root)
    checked = 0
    for value in probe.sources_map:
        if value.served in (Served.UNAVAILABLE,) or value.kind.value == "param":
            continue
        np.testing.assert_array_equal(reader.get(value.key), probe.get(value.key), err_msg=value.key)
        checked += 1
    assert checked > 100
    for i in range(len(probe.node_infos)):
        np.testing.assert_array_equal(reader.get_node_output(i), probe.get_node_output(i))
    assert reader.sources.equals(probe.sources)
    assert list(reader.nodes["source_names"]) == list(probe.nodes["source_names"])


def test_dump_reads_without_tvm(dumped):
    probe, root = dumped
    script = textwrap.dedent(f"""
        import sys
        sys.modules["tvm"] = None      # any import of tvm now fails
        sys.modules["onnx"] = None
        import tvm_probe
        r = tvm_probe.load_dump({str(root)!r})
        v = r.get("layer_._1/attention/self/MatMul")
        print(v.shape, float(v.sum()))
        assert "tvm" not in [m for m in sys.modules if sys.modules[m] is not None]
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    expected = probe.get("layer_._1/attention/self/MatMul")
    assert out.split(")")[0] + ")" == str(expected.shape)
    assert abs(float(out.split(")")[1]) - float(expected.sum())) < 1e-3


def test_existing_dump_is_kept_unless_overwrite(dumped):
    probe, root = dumped
    before = (root / MANIFEST).read_bytes()
    with pytest.raises(DumpExistsError, match="already exists.*overwrite=True"):
        probe.dump(root)
    assert (root / MANIFEST).read_bytes() == before
    probe.dump(root, overwrite=True)
    load_dump(root)
    assert not [p for p in root.parent.iterdir() if p.name.startswith(".")], "no temporary folders left"


def copy_dump(root, tmp_path):
    import shutil

    target = tmp_path / "copy"
    shutil.copytree(root, target)
    return target


def test_truncated_tensor_file_is_refused(dumped, tmp_path):
    root = copy_dump(dumped[1], tmp_path)
    path = device_dir(root) / TENSORS
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptDumpError, match=f"{TENSORS}.*bytes, the manifest says.*truncated"):
        load_dump(root)


def test_edited_file_is_refused(dumped, tmp_path):
    root = copy_dump(dumped[1], tmp_path)
    path = device_dir(root) / TENSORS
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptDumpError, match="modified after it was written"):
        load_dump(root)


def test_missing_graph_json_is_refused(dumped, tmp_path):
    root = copy_dump(dumped[1], tmp_path)
    os.remove(device_dir(root) / GRAPH)
    with pytest.raises(CorruptDumpError, match=f"'{device_dir(root).name}/{GRAPH}' is missing"):
        load_dump(root)


def test_graph_json_that_does_not_match_the_tensors_is_refused(dumped, tmp_path):
    """Even with a manifest rewritten to match, an inconsistent graph is caught."""
    from tvm_probe.store.dump import _sha256

    root = copy_dump(dumped[1], tmp_path)
    path = device_dir(root) / GRAPH
    graph = json.loads(path.read_text())
    graph["attrs"]["shape"][1][3] = [7, 7]
    path.write_text(json.dumps(graph))
    manifest = json.loads((root / MANIFEST).read_text())
    rel = f"{device_dir(root).name}/{GRAPH}"
    manifest["files"][rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptDumpError, match="but the graph JSON says"):
        load_dump(root)


def test_not_a_dump_folder(tmp_path):
    with pytest.raises(DumpError, match="does not exist"):
        load_dump(tmp_path / "nope")
    with pytest.raises(CorruptDumpError, match=f"'{MANIFEST}' is missing"):
        load_dump(tmp_path)


def test_dump_without_recomputed_values_says_so(bert_probe, tmp_path):
    from tvm_probe import NotCapturedError

    bert_probe.dump(tmp_path / "lean", recomputed=False)
    reader = load_dump(tmp_path / "lean")
    name = "layer_._0/attention/self/query/MatMul"
    if bert_probe.served(name) != "recomputed":
        np.testing.assert_array_equal(reader.get(name), bert_probe.get(name))
        return
    with pytest.raises(NotCapturedError, match="written without recomputed values: dump with recomputed=True"):
        reader.get(name)
    np.testing.assert_array_equal(reader.get("layer_._0/attention/self/Softmax"),
                                  bert_probe.get("layer_._0/attention/self/Softmax"))
