"""Dumps: TVM v0.19's debug-dump layout, round trip, read without TVM, lazily, and refusal of damaged dumps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tvm_probe import CorruptDumpError, DumpError, DumpExistsError, load_dump
from tvm_probe.core.results import NodeInfo
from tvm_probe.core.sources import Kind, Served, Serving, SourceMap, SourceValue
from tvm_probe.store.dump import GRAPH, MANIFEST, TENSORS, TRACE, DumpContent, write_dump
from tvm_probe.store.graph import EXTRA, graph_json, read_graph

FIXTURES = Path(__file__).parent / "fixtures"


# -- the graph JSON against TVM v0.19's, on a small graph written by hand -----------------------
def tiny_nodes() -> list[NodeInfo]:
    """Two inputs; a kernel with a weight; a view; two outputs of different dtypes; one kernel called twice."""
    f32 = "float32"
    return [
        NodeInfo(0, "input_ids", "null", out_shapes=[(1, 8)], out_dtypes=["int64"], output_keys=[["input_ids"]]),
        NodeInfo(1, "bias_in", "null", out_shapes=[(8, 2)], out_dtypes=[f32], output_keys=[["bias_in"]]),
        NodeInfo(2, "fused_take", "tvm_op", symbol="fused_take", inputs=[(0, 0)], const_inputs=1,
                 out_shapes=[(1, 8, 4)], out_dtypes=[f32], output_keys=[["emb"]]),
        NodeInfo(3, "vm.builtin.reshape", "tvm_op", symbol="vm.builtin.reshape", is_view=True, inputs=[(2, 0)],
                 out_shapes=[(8, 4)], out_dtypes=[f32], output_keys=[["emb_flat"]]),
        NodeInfo(4, "fused_topk", "tvm_op", symbol="fused_topk", inputs=[(3, 0)], out_shapes=[(8, 2), (8, 2)],
                 out_dtypes=[f32, "int64"], output_keys=[["topk:0"], ["topk:1"]], interior_keys=["scores"]),
        NodeInfo(5, "fused_add", "tvm_op", symbol="fused_add", inputs=[(4, 0), (1, 0)], out_shapes=[(8, 2)],
                 out_dtypes=[f32], output_keys=[["sum_a"]]),
        NodeInfo(6, "fused_cast_add", "tvm_op", symbol="fused_cast_add", inputs=[(5, 0), (4, 1)],
                 out_shapes=[(8, 2)], out_dtypes=[f32], output_keys=[["sum_b", "sum_b_alias"]], interior_keys=["cast"]),
        NodeInfo(7, "fused_add_1", "tvm_op", symbol="fused_add", occurrence=1, inputs=[(6, 0), (1, 0)],
                 out_shapes=[(8, 2)], out_dtypes=[f32], output_keys=[["out"]]),
    ]


def test_graph_json_is_what_tvm_v019_wrote_node_for_node():
    """tests/store/fixtures/tvm019_graph_dump.json was written by hand from v0.19's debug_result.py."""
    expected = json.loads((FIXTURES / "tvm019_graph_dump.json").read_text())
    graph = graph_json(tiny_nodes(), model_outputs=["out", "topk:1", "scores"])  # scores: no node outputs it
    extras = [node.pop(EXTRA) for node in graph["nodes"]]
    assert graph == expected
    assert list(graph) == list(expected)
    assert [list(n) for n in graph["nodes"]] == [list(n) for n in expected["nodes"]], "key order per node"
    assert [list(n["attrs"]) for n in graph["nodes"]] == [list(n["attrs"]) for n in expected["nodes"]]
    # what tvm_probe adds, where old readers do not look
    assert extras[6] == {"source_names": [["sum_b", "sum_b_alias"]], "inputs": [[5, 0], [4, 1]], "occurrence": 0,
                         "view": False, "const_inputs": 0, "interior_source_names": ["cast"]}
    assert extras[3]["view"] is True and extras[7]["occurrence"] == 1 and extras[2]["const_inputs"] == 1
    assert extras[0] == {"source_names": [["input_ids"]]}


def test_graph_json_reads_back_to_the_same_nodes():
    nodes = tiny_nodes()
    text = json.dumps(graph_json(nodes, ["out"]))
    assert read_graph(json.loads(text), extras=True) == nodes


def test_the_hand_written_v019_graph_reads_as_a_tvm_dump():
    """Without tvm_probe's extras: inputs from names, the output of a two-output producer not known."""
    nodes = read_graph(json.loads((FIXTURES / "tvm019_graph_dump.json").read_text()), extras=False)
    assert [(n.op, n.symbol, n.occurrence, n.is_view) for n in nodes[5:]] == [
        ("tvm_op", "fused_add", 0, False), ("tvm_op", "fused_cast_add", 0, False), ("tvm_op", "fused_add", 1, False)]
    assert nodes[6].inputs == [(5, 0), (4, -1)]
    assert [n.out_dtypes for n in nodes[4:5]] == [["float32", "int64"]]
    assert all(n.output_keys == [] and n.interior_keys == [] for n in nodes)


@pytest.fixture(scope="module")
def dumped(tmp_path_factory, bert_probe):
    root = tmp_path_factory.mktemp("dumps") / f"run-{bert_probe.pipeline}"
    bert_probe.dump(root)
    return bert_probe, root


def device_dir(root):
    (d,) = [p for p in root.iterdir() if p.name.startswith("_tvmdbg_device_")]
    return d


def read_like_tvm019(device_dir) -> list[tuple[dict, str, list, str]]:
    """Walk a dump the way v0.19's DebugResult did: per node, (node, tensor key, shape, dtype).

    Outputs are counted with ``1 if op == "param" else int(attrs["num_outputs"])`` and the entry
    index ``eid`` advances by that count, as get_output_tensors / _update_graph_json did.
    """
    graph = json.loads((device_dir / GRAPH).read_text())
    shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
    eid, walked = 0, []
    for i, node in enumerate(graph["nodes"]):
        count = 1 if node["op"] == "param" else int(node["attrs"]["num_outputs"])
        assert node["shape"] == shapes[eid] and node["attrs"]["T"] == "type: " + dtypes[eid], node["name"]
        for j in range(count):
            walked.append((node, f"{node['name']}____topo-index:{i}____output-num:{j}", shapes[eid], dtypes[eid]))
            eid += 1
    assert eid == len(shapes)
    return walked


def test_dump_reads_as_tvm_v019_wrote_it(dumped):
    """A reader written for TVM's dumps finds every node, input name and tensor where TVM put them."""
    import tvm

    probe, root = dumped
    d = device_dir(root)
    assert d.name == "_tvmdbg_device_CPU_0"
    graph = json.loads((d / GRAPH).read_text())
    assert list(graph) == ["nodes", "arg_nodes", "heads", "attrs", "node_row_ptr"]
    assert len(graph["nodes"]) == len(probe.node_infos)
    assert graph["arg_nodes"] == [0, 1]
    names_so_far = set()
    for node in graph["nodes"]:
        if node["op"] == "param":
            assert node["inputs"] == [] and list(node["attrs"]) == ["T"]
        else:
            assert node["op"] == node["attrs"]["func_name"]
            assert {"func_name", "num_inputs", "num_outputs", "flatten_data", "T"} <= set(node["attrs"])
            assert int(node["attrs"]["num_inputs"]) == len(node["inputs"])
            assert set(node["inputs"]) <= names_so_far, "inputs are names of earlier nodes"
        names_so_far.add(node["name"])
    tensors = tvm.runtime.load_param_dict((d / TENSORS).read_bytes())  # TVM reads it as its own
    for node, key, shape, dtype in read_like_tvm019(d):
        assert list(tensors[key].shape) == shape and str(tensors[key].dtype) == dtype, key
    assert len(tensors) == len(read_like_tvm019(d))
    trace = json.loads((d / TRACE).read_text())
    assert {e["ph"] for e in trace["traceEvents"]} == {"B", "E"}
    head = graph["heads"][0]
    assert probe.sources_map.model_outputs[0] in graph["nodes"][head[0]][EXTRA]["source_names"][head[1]]


def test_dump_round_trip_equals_the_live_probe(dumped):
    probe, root = dumped
    reader = load_dump(root)
    checked = 0
    for value in probe.sources_map:
        if probe.servings[value.key].served is Served.UNAVAILABLE or value.kind.value == "param":
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


def test_dump_of_an_older_format_version_is_refused(dumped, tmp_path):
    root = copy_dump(dumped[1], tmp_path)
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["version"] = 1
    (root / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CorruptDumpError, match=r"^dump format version 1 is not supported \(this tvm_probe reads "
                       r"version 2\): write the dump again with this tvm_probe$"):
        load_dump(root)


def test_device_folder_of_a_dump_names_its_parent(dumped):
    root = dumped[1]
    with pytest.raises(DumpError, match=f"is the device folder of a tvm_probe dump: give its parent '{root}'"):
        load_dump(device_dir(root))


def test_dump_without_its_manifest_is_not_read_as_tvms(dumped, tmp_path):
    """tvm_probe's files without the manifest are a damaged tvm_probe dump, not a dump TVM wrote."""
    root = copy_dump(dumped[1], tmp_path)
    os.remove(root / MANIFEST)
    with pytest.raises(CorruptDumpError, match=f"'{MANIFEST}' is missing from '{root}': write the dump again"):
        load_dump(root)


# -- lazy reading (one path for dumps and streamed runs) -----------------------------------------
def one_kernel_content(n: int) -> tuple[DumpContent, np.ndarray, np.ndarray]:
    """A dump of one input x (n float32) and one kernel y = exp(x), built by hand."""
    x = np.linspace(-1, 1, n, dtype=np.float32)
    y = np.exp(x)
    sources = SourceMap(model_inputs=["x"], model_outputs=["y"])
    sources.add(SourceValue("x", op_type="Input", kind=Kind.INPUT, shape=(n,), dtype="float32"))
    sources.add(SourceValue("y", node="Exp", op_type="Exp", kind=Kind.VALUE, topo_index=0, inputs=("x",),
                            shape=(n,), dtype="float32"))
    servings = {"x": Serving(Served.INPUT, 0), "y": Serving(Served.CAPTURED, 1)}
    nodes = [NodeInfo(0, "x", "null", out_shapes=[(n,)], out_dtypes=["float32"], output_keys=[["x"]]),
             NodeInfo(1, "fused_exp", "tvm_op", symbol="fused_exp", inputs=[(0, 0)], out_shapes=[(n,)],
                      out_dtypes=["float32"], output_keys=[["y"]], start_us=0.0, time_us=3.5)]
    content = DumpContent(sources=sources, servings=servings, nodes=nodes, node_outputs={0: [x], 1: [y]}, values={}, device="CPU_0",
                          model_hash="", target="llvm", pipeline="default", total_us=3.5)
    return content, x, y


def test_reading_a_dump_loads_no_tensor_until_asked(tmp_path):
    import tracemalloc

    content, x, y = one_kernel_content(8 << 20)  # 32 MiB per tensor
    root = write_dump(tmp_path / "big", content)
    tracemalloc.start()
    try:
        reader = load_dump(root)
        _, peak = tracemalloc.get_traced_memory()
        got = reader.get("Exp")
        _, peak_after_get = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"opening the dump allocated {peak} bytes"
    assert peak_after_get < 4 << 20, "get() maps the file instead of copying it"
    np.testing.assert_array_equal(got, y)
    np.testing.assert_array_equal(reader.inputs["x"], x)
    assert not got.flags.writeable, "values are read-only views of the dump"
    assert np.shares_memory(got, reader.get_node_output(1)), "one mapping, no copy per call"
    assert reader.nodes["time_us"].tolist()[1] == 3.5


def test_streamed_outputs_map_the_file_the_same_way(tmp_path):
    from tvm_probe.store.dump import DumpWriter, StreamedOutputs, node_tensor_names, tensor_key

    content, x, y = one_kernel_content(16)
    with DumpWriter(tmp_path / "s", "CPU_0") as writer:
        writer.open_tensors(node_tensor_names(content.nodes, {0: 1, 1: 1}))
        writer.write_tensor(tensor_key("x", 0, 0), x)
        writer.write_tensor(tensor_key("fused_exp", 1, 0), y)
        outputs = StreamedOutputs(writer.close_tensors(), content.nodes, num_input_nodes=1)
        writer.finish(content, [])
        writer.commit()
    assert list(outputs) == [0] and 1 not in outputs
    (got,) = outputs[0]
    np.testing.assert_array_equal(got, y)
    assert not got.flags.writeable
    np.testing.assert_array_equal(load_dump(tmp_path / "s").get("Exp"), y)


def test_damaged_tensor_data_is_reported_when_read(tmp_path):
    """The index is checked on opening; data the index cannot vouch for (bool bytes) when read."""
    from tvm_probe.store.dump import _sha256

    content, _, _ = one_kernel_content(4)
    content.nodes[1].out_dtypes = ["bool"]
    content.sources["y"].dtype = "bool"
    content.node_outputs[1] = [np.array([True, False, True, True])]
    root = write_dump(tmp_path / "b", content)
    path = device_dir(root) / TENSORS
    raw = bytearray(path.read_bytes())
    raw[-1] = 7  # not a bool
    path.write_bytes(bytes(raw))
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["files"][f"{device_dir(root).name}/{TENSORS}"] = {"size": len(raw), "sha256": _sha256(path)}
    (root / MANIFEST).write_text(json.dumps(manifest))
    reader = load_dump(root)
    np.testing.assert_array_equal(reader.get("x"), content.node_outputs[0][0])
    with pytest.raises(CorruptDumpError, match="bool data holds bytes other than 0 and 1"):
        reader.get("Exp")
