"""``tvm-probe view``: Model Explorer on a real divergent run, checked in a real headless Chromium;
the ``--export`` files read back with Model Explorer's own readers; the report's graph drawn
without Graphviz.

The divergent run is a real TVM 0.27 bug (``tests/support/tvm_bugs.py``: Relu drops NaN), compiled by TVM
and compared with onnxruntime; the node expected to be first divergent comes from the bug list,
not from tvm_probe's output.  The browser is Debian's ``chromium`` driven through its DevTools
protocol (a websocket); a screenshot of each page is saved under ``build/test-artifacts/`` (or
``$TVM_PROBE_ARTIFACTS``).  The browser tests skip, saying why, only where chromium is missing.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from support import SUPPORT
from support.browser import Chromium, free_port, needs_chromium, png_size, wait
from support.tvm_bugs import BUGS

from tvm_probe import Probe, load_dump
from tvm_probe.app.cli import main
from tvm_probe.core.install import install_hint

me = pytest.importorskip("model_explorer", reason=f"the view extra is not installed: {install_hint('view')}")

BUG = BUGS["relu_nan"]
DIVERGENT = BUG.nodes[0]          # "bug/relu": where TVM's arithmetic goes wrong


@pytest.fixture(scope="module")
def bug_dump(tmp_path_factory):
    """A dump of the Relu-NaN bug model that records its ONNX file (as ``tvm-probe run`` does)."""
    folder = tmp_path_factory.mktemp("view")
    model, inputs = BUG.build()
    path = folder / "relu_nan.onnx"
    onnx.save(model, str(path))
    probe = Probe.from_onnx(str(path), pipeline="fused")
    probe.run(inputs)
    return probe.dump(folder / "dump", metadata={"model": {"onnx": str(path), "shapes": {}}})


@pytest.fixture(scope="module")
def exported(bug_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "view"
    assert main(["-q", "view", str(bug_dump), "--export", str(out)]) == 0
    return out


def _read(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------ export
def test_export_files_load_with_model_explorers_readers(exported):
    from dacite import Config, from_dict
    from model_explorer.graph_builder import Graph, GraphCollection
    from model_explorer.node_data_builder import GraphNodeData

    strict = Config(strict=True)  # an unknown key is an error, not silently dropped
    index = _read(exported / "view.json")
    collection = from_dict(GraphCollection, _read(exported / "kernels.json"), strict)
    (graph,) = [from_dict(Graph, g, strict) if isinstance(g, dict) else g for g in collection.graphs]
    # Model Explorer's web app shows string values too (served, kernel, verdict), which its Python
    # dataclass types as numbers only: those overlays are read with every check but the value's type.
    textual = Config(strict=True, check_types=False)
    for name, path in [*index["source_overlays"].items(), *index["kernel_overlays"].items()]:
        (per_graph,) = _read(Path(path)).values()
        numeric = name in ("error", "cosine", "time (us)")
        data = from_dict(GraphNodeData, per_graph, strict if numeric else textual)
        assert data.results and data.name == f"tvm_probe {name}"
        assert all(isinstance(r.value, (int, float) if numeric else str) for r in data.results.values())
    # the kernel holding the divergent Relu is a group, and it holds the Relu
    relu = next(n for n in graph.nodes if n.id == f"{DIVERGENT}:0")
    assert relu.label == BUG.op and relu.namespace.startswith("fused_") and "relu" in relu.namespace
    assert any(c.namespaceRegex == f"^{re.escape(relu.namespace)}$" for c in graph.groupNodeConfigs)
    ids = {n.id for n in graph.nodes}
    assert all(e.sourceNodeId in ids for n in graph.nodes for e in n.incomingEdges)


def test_source_overlays_name_the_divergent_node_as_model_explorer_names_it(exported):
    from model_explorer_onnx.main import ONNXAdapter

    index = _read(exported / "view.json")
    (graph,) = ONNXAdapter().convert(index["source_model"], {})["graphs"][:1]
    node_ids = {n.id for n in graph.nodes}
    verdict = _read(Path(index["source_overlays"]["verdict"]))[graph.id]["results"]
    assert set(verdict) <= node_ids
    assert index["first_divergent_node"] == DIVERGENT
    assert verdict[DIVERGENT]["value"].startswith("first divergent: ") and "NaN" in verdict[DIVERGENT]["value"]
    assert verdict["pre/sqrt"]["value"] == "passed"  # before the bug, TVM and onnxruntime agree
    error = _read(Path(index["source_overlays"]["error"]))[graph.id]
    assert error["thresholds"][0]["value"] == 1e-4  # the float32 default atol of the verdict
    assert error["results"][DIVERGENT]["bgColor"] == "#e53935"  # out of tolerance, whatever its number
    served = _read(Path(index["source_overlays"]["served"]))[graph.id]["results"]
    assert served[DIVERGENT]["value"] == "recomputed"  # fused inside the kernel: recomputed from its inputs
    kernel = _read(Path(index["source_overlays"]["kernel"]))[graph.id]["results"]
    assert "relu" in kernel[DIVERGENT]["value"] and "(node 1)" in kernel[DIVERGENT]["value"]


def test_a_tflite_model_gets_its_overlays_on_model_explorers_tflite_graph(tmp_path):
    """TFLite: Model Explorer's built-in adapter names nodes its own way; every run-time value of
    the model still lands on the node whose output tensor it is."""
    pytest.importorskip("tflite")
    from model_explorer.builtin_tflite_flatbuffer_adapter import (
        BuiltinTfliteFlatbufferAdapter,
    )

    from tvm_probe.comparison.verdict import compare
    from tvm_probe.comparison.reference.tflite import tflite_values
    from tvm_probe.show.view import export

    model = SUPPORT / "tflite_models" / "cnn.tflite"
    probe = Probe.from_tflite(str(model), pipeline="fused")
    spec = probe.inputs[0]
    inputs = {spec.name: np.random.default_rng(0).standard_normal(spec.shape).astype(spec.dtype)}
    probe.run(inputs)
    comparison = compare(probe, tflite_values(str(model), inputs))
    files = export(probe, tmp_path / "view", comparison, model=model)
    (graph,) = BuiltinTfliteFlatbufferAdapter().convert(str(model), {})["graphCollections"][0].graphs[:1]
    tensor_of = {n["id"]: {a["value"] for m in n.get("outputsMetadata", []) for a in m["attrs"]
                           if a["key"] == "tensor_name"} for n in graph["nodes"]}
    verdict = _read(files.source_overlays["verdict"])[graph["id"]]["results"]
    shown = {k for node_id in verdict for k in tensor_of[node_id]}
    values = {v.key for v in probe.sources_map if v.kind.value == "value"}
    assert values <= shown and {c.key for c in comparison.values} <= values
    assert {r["value"] for r in verdict.values()} >= {"passed"}


def test_export_refuses_a_folder_in_use_and_a_dump_without_its_model(bug_dump, exported, tmp_path, capsys):
    assert main(["-q", "view", str(bug_dump), "--export", str(exported)]) == 2
    assert "exists and is not empty: choose another folder or pass --overwrite" in capsys.readouterr().err
    bare = Probe.from_onnx(BUG.build()[0], pipeline="fused")
    bare.run(BUG.build()[1])
    bare.dump(tmp_path / "bare")
    assert main(["-q", "view", str(tmp_path / "bare"), "--export", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tvm-probe: error: this dump does not record its model: give it with --model PATH"
    assert not (tmp_path / "out").exists()


def test_without_the_extra_one_line_says_what_to_install(bug_dump, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "model_explorer", None)  # as if not installed
    assert main(["-q", "view", str(bug_dump), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and install_hint("view") in err


def test_a_port_in_use_is_a_one_line_error(bug_dump, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["-q", "view", str(bug_dump), "--no-browser", "--port", str(port)]) == 2
    assert capsys.readouterr().err.strip() == f"tvm-probe: error: port {port} is in use: choose another with --port"


# ------------------------------------------------------------------------------ a real browser
def _start_view(dump, port: int, tmp: Path, *extra: str) -> subprocess.Popen:
    """``tvm-probe view DUMP --no-browser`` as a user starts it from a shell: its temporary folder
    under ``tmp`` (TMPDIR), Ctrl-C delivered with its default action whatever started the tests."""
    return subprocess.Popen([sys.executable, "-m", "tvm_probe.app.cli", "-q", "view", str(dump), "--no-browser",
                             "--port", str(port), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _served_page(proc: subprocess.Popen, port: int) -> tuple[str, str]:
    """The one line ``tvm-probe view`` prints: (the page it names, Model Explorer's full address
    that page forwards to), once the server answers."""
    line = proc.stdout.readline()
    found = re.fullmatch(r"tvm-probe view: (file://\S+/open\.html) \(Model Explorer on http://localhost:(\d+); "
                         r"Ctrl-C stops it\)\n", line)
    assert found and int(found.group(2)) == port, (line, proc.stderr.read() if proc.poll() is not None else "")
    page = Path(urllib.parse.unquote(urllib.parse.urlparse(found.group(1)).path))
    url = html.unescape(re.search(r'url=([^"]+)"', page.read_text(encoding="utf-8")).group(1))
    assert url.startswith(f"http://localhost:{port}/?data=")
    wait(lambda: urllib.request.urlopen(f"http://localhost:{port}/check_health").read() == b"model_explorer_ok",
         60, "Model Explorer's server")
    return found.group(1), url


@pytest.fixture(scope="module")
def server(bug_dump, tmp_path_factory):
    """A running ``tvm-probe view``: (the page it prints, the address that page forwards to)."""
    port = free_port()
    proc = _start_view(bug_dump, port, tmp_path_factory.mktemp("tmp"))
    try:
        yield _served_page(proc, port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ------------------------------------------------------------------------------ one line, no leftovers
def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("tvm_probe_view_*"))


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_view_prints_one_short_line_and_leaves_no_folder_when_stopped(bug_dump, tmp_path, stop):
    port = free_port()
    proc = _start_view(bug_dump, port, tmp_path)
    try:
        page, _ = _served_page(proc, port)
        assert _leftovers(tmp_path) and Path(urllib.parse.urlparse(page).path).is_file()  # while it serves
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err  # stopped as asked: not an error
    assert out == "" and err == ""  # nothing after the one line: no banner, no adapter list, no address
    assert len(page) < 120 and _leftovers(tmp_path) == []


def test_view_leaves_no_folder_when_stopped_while_it_prepares(bug_dump, tmp_path):
    """SIGTERM as soon as the temporary folder exists (comparing, exporting or starting up)."""
    proc = _start_view(bug_dump, free_port(), tmp_path)
    try:
        wait(lambda: _leftovers(tmp_path) or proc.poll() is not None, 120, "the view's temporary folder")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 2) and _leftovers(tmp_path) == []


def test_view_leaves_no_folder_after_an_error(bug_dump, tmp_path):
    """An error once the folder exists (the source model given is missing: found while exporting),
    in a real process through the Python API, as a notebook calls it."""
    code = ("import sys\nfrom tvm_probe import load_dump, ProbeError\nfrom tvm_probe.comparison.verdict import compare\n"
            "from tvm_probe.show.view import view\nr = load_dump(sys.argv[1])\n"
            "try:\n    view(r, compare(r, {}), model=sys.argv[2], open_browser=False)\n"
            "except ProbeError as e:\n    print(e)\n")
    run = subprocess.run([sys.executable, "-c", code, str(bug_dump), str(tmp_path / "missing.onnx")],
                         capture_output=True, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=300)
    assert run.stdout.strip() == f"the source model '{tmp_path / 'missing.onnx'}' does not exist: give it with --model PATH"
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
@needs_chromium
def test_the_divergent_nodes_overlay_is_on_the_rendered_page(server):
    browser = Chromium(server[0])  # the printed page, which forwards to Model Explorer
    try:
        # the address selects the first divergent node: its info panel lists every overlay
        text = browser.wait_for(r"node data providers", r"\bid\s+" + re.escape(DIVERGENT) + r"\s",
                                r"tvm_probe verdict\s+first divergent: TVM gives 0 where the reference has NaN",
                                r"tvm_probe served\s+recomputed", r"tvm_probe kernel\s+fused_\w*relu\w*#0 \(node 1\)",
                                r"tvm_probe error\s+0\s", r"tvm_probe cosine\s+1\s")
        shot = browser.screenshot("view-source.png")
    finally:
        browser.close()
    assert "tvm_probe time (us)" in text
    width, height = png_size(shot)  # the viewport: the window less its frame
    assert width == 1400 and height > 600 and shot.stat().st_size > 20_000


@pytest.mark.slow
def _on_the_kernel_graph(url: str) -> str:
    """``url`` of a Model Explorer page, opened on the kernel graph with the divergent op selected."""
    from urllib.parse import quote, unquote

    base, data = url.split("?data=")
    state = json.loads(unquote(data))
    state["uiState"] = {"paneStates": [{"deepestExpandedGroupNodeIds": [], "selectedNodeId": f"{DIVERGENT}:0",
                                        "selectedGraphId": "tvm kernels", "selectedCollectionLabel": "TVM kernels",
                                        "widthFraction": 1, "selected": True}]}
    return f"{base}?data={quote(json.dumps(state))}"


@needs_chromium
def test_the_kernel_graph_groups_the_divergent_op_in_its_kernel(server):

    browser = Chromium(_on_the_kernel_graph(server[1]))
    try:
        browser.wait_for(r"TVM kernels", r"\bid\s+" + re.escape(DIVERGENT) + r":0\s",
                         r"namespace\s+fused_\w*relu\w*#0",  # the op sits in its kernel's group
                         r"tvm_probe verdict\s+first divergent: ", r"tvm_probe served\s+recomputed")
        browser.screenshot("view-kernels.png")
    finally:
        browser.close()


@pytest.mark.slow
@needs_chromium
def test_the_exported_kernel_graph_loads_in_model_explorers_own_server(exported):
    """The command ``view.json`` gives, run as printed: Model Explorer's CLI and JSON reader."""

    command = _read(exported / "view.json")["commands"][-1].split()
    assert command[0] == "model-explorer" and command[1].endswith("kernels.json")
    port = free_port()
    proc = subprocess.Popen([shutil.which("model-explorer"), *command[1:], "--no_open_in_browser", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        url = next(line.strip() for line in proc.stdout if line.startswith(f"http://localhost:{port}/?data="))
        browser = Chromium(_on_the_kernel_graph(url))
        try:
            browser.wait_for(r"namespace\s+fused_\w*relu\w*#0", r"tvm_probe verdict\s+first divergent: ")
        finally:
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
@needs_chromium
def test_the_report_draws_its_graph_without_graphviz(bug_dump, tmp_path):
    env = dict(os.environ, PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                                if not (Path(p) / "dot").exists()))
    out = tmp_path / "report"
    run = subprocess.run([sys.executable, "-m", "tvm_probe.app.cli", "-q", "compare", str(bug_dump), "-o", str(out)],
                         env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 1 and (out / "graph.svg").is_file(), run.stderr  # 1: it diverges
    browser = Chromium((out / "report.html").as_uri(), size=(1200, 1600))
    try:
        browser.wait_for(r"Graph nodes")
        boxes = browser.evaluate("""[...document.querySelectorAll('#kernel-graph g.node')].map(g => {
            const r = g.getBoundingClientRect(); return [g.id, g.dataset.status, r.width, r.height]; })""")
        # every line of text inside its box, in the drawing's own units (as the page's columns show it)
        overflowing = browser.evaluate("""[...document.querySelectorAll('#kernel-graph g.node')].flatMap(g => {
            const r = g.querySelector('rect').getBBox();
            return [...g.querySelectorAll('text')].filter(t => { const b = t.getBBox();
                return b.x < r.x - 1 || b.x + b.width > r.x + r.width + 1; }).map(t => t.textContent); })""")
        browser.evaluate("document.getElementById('kernel-graph').scrollIntoView()")
        browser.screenshot("report-graph.png")
    finally:
        browser.close()
    nodes = load_dump(bug_dump).node_infos
    assert [b[0] for b in boxes] == [f"node-{n.index}" for n in nodes]
    assert all(w > 50 and h > 10 for _, _, w, h in boxes) and overflowing == []  # drawn, with room for their text
    assert {b[0]: b[1] for b in boxes}["node-1"] == "first divergent"  # the kernel holding bug/relu


# ------------------------------------------------------------------------------ the layout alone
def test_the_own_layout_keeps_200_kernels_apart():
    """A 200-kernel graph with branches and long skips: no two boxes overlap, every edge joins boxes."""
    from tvm_probe.show import report
    from tvm_probe.core.results import NodeInfo, Results
    from tvm_probe.core.sources import Served, Serving, SourceMap, SourceValue

    rng = np.random.default_rng(0)
    sources, nodes = SourceMap(), [NodeInfo(index=0, name="x", op="null", output_keys=[["x"]])]
    servings = {"x": Serving(Served.INPUT)}
    sources.add(SourceValue(key="x"))
    for i in range(1, 201):
        key = f"layer_{i // 10}/block/op_{i}"
        sources.add(SourceValue(key=key))
        servings[key] = Serving(Served.CAPTURED, i)
        inputs = {(i - 1, 0)} | ({(int(rng.integers(max(0, i - 12), i)), 0)} if i % 3 == 0 else set())
        nodes.append(NodeInfo(index=i, name=f"fused_op_{i % 7}", op="tvm_op", symbol=f"fused_op_{i % 7}",
                              occurrence=i // 7, inputs=sorted(inputs), output_keys=[[key]]))

    class Run(Results):
        pass

    run = Run()
    run._init_results(sources, servings, nodes)
    svg = report.layout_svg(run)
    rects = [tuple(map(float, m)) for m in re.findall(
        r'<rect x="([-\d.]+)" y="([-\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)]
    assert len(rects) == 201
    for a in range(len(rects)):
        xa, ya, wa, ha = rects[a]
        for xb, yb, wb, hb in rects[a + 1:]:
            assert xa + wa <= xb or xb + wb <= xa or ya + ha <= yb or yb + hb <= ya, "boxes overlap"
    assert all(x >= 0 for x, *_ in rects)
    assert svg.count('class="edge"') == sum(len({i for i, _ in n.inputs}) for n in nodes)


def test_a_pytorch_dump_shows_its_exported_program_with_the_overlays(tmp_path):
    """PyTorch: the source graph is the ExportedProgram tvm_probe imported, converted by Model
    Explorer's own adapter; its nodes are fx nodes, so each value lands on its own node."""
    pytest.importorskip("torch")
    from dacite import Config, from_dict
    from model_explorer.graph_builder import Graph

    from support.torch_models import tiny_torch_bert
    from tvm_probe import compare, load_dump, torch_values
    from tvm_probe.show.view import export

    module, args = tiny_torch_bert()
    probe = Probe.from_torch(module, args)
    probe.run([a.numpy() for a in args])
    factory = SUPPORT / "torch_models.py"
    probe.dump(tmp_path / "dump", metadata={"model": {"torch": f"{factory}:tiny_torch_bert"}})
    reader = load_dump(tmp_path / "dump")
    comparison = compare(reader, torch_values(module, args))
    files = export(reader, tmp_path / "view", comparison)  # the model comes from the dump's record
    assert files.source_adapter == "builtin_json" and "model_explorer_onnx" not in files.commands[0]
    (raw,) = _read(files.source_model)["graphs"]
    graph = from_dict(Graph, raw, Config(strict=True))
    ids = {n.id for n in graph.nodes}
    verdict = _read(files.source_overlays["verdict"])[graph.id]["results"]
    compared = {c.key: c for c in comparison.values}
    assert comparison and compared
    on_graph = {key for key in compared if key in verdict}  # computed values: their key is the fx node's name
    assert len(on_graph) >= 0.9 * len(compared), sorted(set(compared) - on_graph)[:5]
    assert set(verdict) <= ids and {verdict[k]["value"] for k in on_graph} == {"passed"}


def test_a_demo_dump_is_viewed_with_the_model_its_config_built(tmp_path):
    """`tvm-probe run configs/demo.yaml` records the demo as its config gave it (a preset and
    sizes): the view builds that same model again."""
    from tvm_probe import demo, load_dump
    from tvm_probe.show.view import export

    model = demo.tiny_bert(num_layers=1)
    probe = Probe.from_onnx(model)
    probe.run(demo.demo_inputs(model))
    probe.dump(tmp_path / "dump", metadata={"model": {"demo": {"preset": "tiny", "num_layers": 1}}})
    files = export(load_dump(tmp_path / "dump"), tmp_path / "view")
    assert files.source_model.name == "model.onnx" and files.source_overlays["served"].is_file()


def test_a_model_record_that_cannot_be_rebuilt_is_refused_in_one_line(tmp_path):
    """A dump recording a model kind compare/view cannot rebuild is refused, never read as the demo."""
    from tvm_probe import ProbeError, demo, load_dump
    from tvm_probe.comparison.dump import compare_dump

    model = demo.tiny_bert(num_layers=1)
    probe = Probe.from_onnx(model)
    probe.run(demo.demo_inputs(model))
    probe.dump(tmp_path / "dump", metadata={"model": {"hf": "llm.py:build"}})
    with pytest.raises(ProbeError, match=r"^this dump records a model tvm_probe cannot rebuild here \(hf\): "
                                         r"give an ONNX export of it with --model PATH$"):
        compare_dump(load_dump(tmp_path / "dump"))
