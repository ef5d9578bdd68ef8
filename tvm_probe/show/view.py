"""Look at a run in Google's Model Explorer: the source graph with every value's error on it, and
the compiled module's kernels, each fused kernel call a group holding the source ops it computes.

::

    tvm-probe view DUMP [--port P] [--no-browser]      a local Model Explorer server (Ctrl-C stops it)
    tvm-probe view DUMP --export DIR                   the same data as Model Explorer JSON files

    probe.view(model="model.onnx")                     Python: a Probe or a dump read back
    load_dump("dumps/run1").view()

Two graphs are shown:

* the **source model** (the ONNX or TFLite file, read by Model Explorer's own adapters), with one
  per-node overlay per fact: ``error`` (max abs error against the reference, on a colour scale
  whose first step is the verdict's ``atol``; every value out of tolerance orange, the first
  divergent red, whatever its number), ``cosine``, ``verdict`` (passed / diverged / first divergent / unchecked and why /
  dead code), ``served`` (captured / view / recomputed / folded / constant / input / unavailable /
  unknown), ``kernel`` (the kernel call that computes it) and ``time (us)`` (that call's time);
* the **TVM kernels** (``kernels.json``, a Model Explorer graph written here): every kernel call
  of the compiled ``main`` is a group named ``symbol#occurrence`` holding the source values it
  outputs or keeps inside; the group holding the first divergent value is drawn red.  Values no
  kernel holds sit in groups named after how they are served (``folded``, ``dead code``,
  ``unknown``).  The same overlays apply to it.

Where the source model comes from: a dump *points to* its model (``metadata["model"]``, which
``tvm-probe run`` records: the ONNX/TFLite path, or the demo preset, rebuilt here), it does not
copy it — weights can be gigabytes; ``model=`` / ``--model`` gives another path.  The reference
values come from running that model (onnxruntime / TFLite) on the dump's own inputs, as
``tvm-probe compare`` does, unless a comparison is passed in.

Needs the ``view`` extra (ai-edge-model-explorer and model-explorer-onnx); without it, a one-line
error says so and how to install it (:func:`tvm_probe.core.install.install_hint`).  Model
Explorer's web app is inside its wheel: the view works offline.
"""
from __future__ import annotations

import contextlib
import html
import io
import json
import math
import re
import shutil
import signal
import socket
import tempfile
import webbrowser
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from ..comparison.dump import compare_dump, recorded_model
from ..comparison.verdict import Status
from ..core.errors import ProbeError
from ..core.install import install_hint
from ..core.sources import Kind, Served
from ..importer.kinds import SourceGraph, adapter_of
from ..importer.torch import node_keys
from ..importer.torch_export import export_program
from ..store.atomic import replace_folder
from .graph import FILL
from .plots import atol_of

KERNEL_GRAPH = "kernels.json"
KERNEL_GRAPH_ID = "tvm kernels"
KERNEL_LABEL = "TVM kernels"  # the collection label: what node data of the kernel graph targets
INDEX = "view.json"
DEFAULT_PORT = 8080

# Overlay colours: the report's (green passed, red first divergent, orange diverged, grey
# unchecked), and yellow for a passing value above atol.
PASSED, FAILED, FIRST, NOT_COMPARED = (FILL[s.value] for s in (Status.PASSED, Status.DIVERGED,
                                                                 Status.FIRST_DIVERGENT, Status.UNCHECKED))
NEAR = "#fff59d"
_HUGE = 1.0e300  # the last threshold of the error scale: JSON has no infinity


class ViewUnavailableError(ProbeError):
    """Model Explorer (the ``view`` extra) is not installed."""


def model_explorer():
    """``model_explorer``, or a one-line error saying what to install."""
    try:
        import model_explorer
        import model_explorer_onnx
    except ImportError as err:
        raise ViewUnavailableError(f"the view needs Google's Model Explorer ({err.name} is missing): "
                                   f"{install_hint('view')}") from None
    del model_explorer_onnx  # loaded by the server as an extension, by name
    return model_explorer


# ------------------------------------------------------------------------------ per value facts
@dataclass
class ValueFacts:
    """What the view says about one source value (plain data, no Model Explorer)."""

    key: str
    name: str
    status: str                 # a Status word (passed / diverged / first divergent / unchecked / dead code) or model input
    served: str
    note: str = ""
    max_abs: float | None = None
    cosine: float | None = None
    atol: float | None = None
    kernel: str = ""            # "symbol#occurrence (node i)", or "" when no kernel holds it
    kernel_ns: str = ""         # its group in the kernel graph
    time_us: float | None = None

    @property
    def colour(self) -> str:
        return {Status.PASSED.value: PASSED, Status.DIVERGED.value: FAILED,
                Status.FIRST_DIVERGENT.value: FIRST}.get(self.status, NOT_COMPARED)

    def verdict_text(self) -> str:
        """The ``verdict`` overlay's value: the status, and for a failure what is wrong."""
        return f"{self.status}: {self.note}" if self.note else self.status


def kernel_group(node) -> str:
    """The kernel graph's group (namespace) of a graph node: ``symbol#occurrence``."""
    label = node.symbol or node.name
    return re.sub(r"[/\s]", "_", f"{label}#{node.occurrence}")


_OUTSIDE = {Served.FOLDED: "folded", Served.CONSTANT: "constant", Served.UNAVAILABLE: "dead code",
            Served.UNKNOWN: "unknown", Served.SHAPE: "shape", Served.INPUT: "inputs", Served.PASSED: "passed"}


def value_facts(results, comparison=None) -> dict[str, ValueFacts]:
    """Facts per source value key, for every run-time value and model input of ``results``."""
    compared = {v.key: v for v in comparison.values} if comparison is not None else {}
    first = comparison.first_divergent.key if comparison is not None and comparison.first_divergent else None
    facts = {}
    for value in results.sources_map:
        if value.kind not in (Kind.VALUE, Kind.INPUT):
            continue
        serving = results.servings[value.key]
        served = serving.served.value
        node = results.node_infos[serving.node_index] if 0 <= serving.node_index < len(results.node_infos) else None
        status = "model input" if value.kind is Kind.INPUT else Status.UNCHECKED.value
        fact = ValueFacts(key=value.key, name=value.display_name, status=status, served=served)
        if node is not None and node.op != "null":
            fact.kernel = f"{kernel_group(node)} (node {node.index})"
            fact.kernel_ns = kernel_group(node)
            fact.time_us = node.time_us
        else:
            fact.kernel_ns = _OUTSIDE.get(serving.served, "inputs" if value.kind is Kind.INPUT else "unknown")
        cmp = compared.get(value.key)
        if cmp is not None:
            fact.status = (Status.FIRST_DIVERGENT if value.key == first else Status.PASSED if cmp.passed
                           else Status.DIVERGED).value
            fact.max_abs = cmp.max_abs if math.isfinite(cmp.max_abs) else None
            fact.cosine = cmp.cosine if math.isfinite(cmp.cosine) else None
            fact.atol = atol_of(cmp.tolerance)
            fact.note = "" if cmp.passed else cmp.describe()
        elif comparison is not None and value.key in comparison.unchecked:
            fact.status, fact.note = Status.UNCHECKED.value, comparison.unchecked[value.key]
        elif comparison is not None and value.key in comparison.dead:
            fact.status = Status.DEAD.value
        facts[value.key] = fact
    return facts


def _scale_atol(facts) -> float:
    """The atol of the error scale: the one most compared values were held to (float32: 1e-4)."""
    counts: dict[float, int] = {}
    for f in facts:
        if f.atol:
            counts[f.atol] = counts.get(f.atol, 0) + 1
    return max(counts, key=counts.get) if counts else 1e-4


# ------------------------------------------------------------------------------ overlays
OVERLAYS = ("error", "cosine", "verdict", "served", "kernel", "time (us)")


def overlays(facts_by_node: dict[str, list[ValueFacts]], atol: float) -> dict[str, dict]:
    """Per overlay name, ``{node id: NodeDataResult fields}`` plus the scale, as plain dicts.

    A node holding several values (multi-output ops) shows its worst one.
    """
    out = {name: {} for name in OVERLAYS}
    for node_id, facts in facts_by_node.items():
        worst = max(facts, key=_badness)
        if worst.max_abs is not None:
            result = {"value": worst.max_abs}
            if worst.status in (Status.DIVERGED.value, Status.FIRST_DIVERGENT.value):
                result["bgColor"] = worst.colour  # out of tolerance whatever the number says (NaN, rtol)
            out["error"][node_id] = result
        if worst.cosine is not None:
            out["cosine"][node_id] = {"value": worst.cosine}
        out["verdict"][node_id] = {"value": worst.verdict_text(), "bgColor": worst.colour}
        out["served"][node_id] = {"value": ", ".join(dict.fromkeys(f.served for f in facts))}
        kernels = [f.kernel for f in facts if f.kernel]
        if kernels:
            out["kernel"][node_id] = {"value": ", ".join(dict.fromkeys(kernels))}
        times = [f.time_us for f in facts if f.time_us is not None]
        if times:
            out["time (us)"][node_id] = {"value": round(max(times), 3)}
    return out


def _badness(fact: ValueFacts) -> tuple:
    rank = {Status.FIRST_DIVERGENT.value: 4, Status.DIVERGED.value: 3, Status.UNCHECKED.value: 2,
            Status.PASSED.value: 1}.get(fact.status, 0)
    return rank, fact.max_abs or 0.0


def _thresholds(name: str, atol: float) -> list[dict]:
    if name == "error":  # values in tolerance: within atol alone, or only through rtol (failures: bgColor)
        return [{"value": atol, "bgColor": PASSED}, {"value": _HUGE, "bgColor": NEAR}]
    if name == "cosine":
        return [{"value": 0.99, "bgColor": FAILED}, {"value": 0.9999, "bgColor": NEAR},
                {"value": 1.1, "bgColor": PASSED}]
    return []


def node_data(graph_id: str, overlay: str, results: dict, atol: float) -> dict:
    """One Model Explorer node-data file (``ModelNodeData``): ``{graph id: GraphNodeData}``."""
    data = {"name": f"tvm_probe {overlay}", "results": results}
    scale = _thresholds(overlay, atol)
    if scale:
        data["thresholds"] = scale
    return {graph_id: data}


# ------------------------------------------------------------------------------ the kernel graph
def kernel_graph(results, facts: dict[str, ValueFacts], first_key: str | None = None) -> dict:
    """The compiled module as a Model Explorer graph collection (plain JSON).

    Nodes are source values (id ``key``), grouped by the kernel call holding them; edges are the
    source graph's data flow between them.  A kernel call holding no source value is one node.
    """
    nodes, ids = [], set()
    for fact in facts.values():
        value = results.sources_map[fact.key]
        ids.add(fact.key)
        attrs = [("name", fact.name), ("op", value.op_type), ("served", fact.served), ("kernel", fact.kernel or "none")]
        if value.shape is not None:
            attrs.append(("shape", str(list(value.shape))))
        nodes.append({
            "id": fact.key, "label": value.op_type or "value", "namespace": fact.kernel_ns,
            "attrs": [{"key": k, "value": str(v)} for k, v in attrs],
            "outputsMetadata": [{"id": "0", "attrs": [{"key": "tensor_name", "value": fact.key},
                                                      {"key": "dtype", "value": str(value.dtype)}]}],
            "incomingEdges": [],
        })
    for node, value_node in zip(nodes, facts.values()):
        inputs = [k for k in results.sources_map[value_node.key].inputs if k in ids]
        node["incomingEdges"] = [{"sourceNodeId": k, "sourceNodeOutputId": "0", "targetNodeInputId": str(i)}
                                 for i, k in enumerate(inputs)]
    groups = {}
    for n in results.node_infos:
        if n.op == "null":
            continue
        ns = kernel_group(n)
        groups[ns] = {"kernel": n.symbol or n.name, "call": f"node {n.index}, occurrence {n.occurrence}",
                      "time (us)": "not timed" if n.time_us is None else f"{n.time_us:.3f}",
                      "view": "zero-copy reshape" if n.is_view else "kernel"}
        if not any(f.kernel_ns == ns for f in facts.values()):
            nodes.append({"id": f"kernel {n.index}", "label": n.symbol or n.name, "namespace": ns,
                          "attrs": [{"key": "note", "value": "no source value is placed at this call"}],
                          "incomingEdges": []})
    configs = []
    if first_key is not None and first_key in facts:
        ns = facts[first_key].kernel_ns
        configs.append({"namespaceRegex": f"^{re.escape(ns)}$", "backgroundColor": "#ffcdd2",
                        "borderColor": FIRST, "textColor": "#b71c1c"})
    graph = {"id": KERNEL_GRAPH_ID, "nodes": nodes, "groupNodeAttributes": groups, "groupNodeConfigs": configs}
    return {"label": KERNEL_LABEL, "graphs": [graph]}


# ------------------------------------------------------------------------------ the source model
@dataclass
class SourceModel:
    """The source model file Model Explorer reads, and which of its nodes shows which value."""

    path: Path
    graph_id: str
    node_values: dict[str, list[str]] = field(default_factory=dict)  # node id -> value keys
    adapter: str | None = None  # Model Explorer's adapter for the file (None: by its extension)


def _onnx_nodes(path: Path, known: set[str]) -> tuple[str, dict[str, list[str]]]:
    """Graph id and ``node id -> output tensor names`` as Model Explorer's ONNX adapter names them.

    Its own converter runs here, so the node ids are exactly those of the page (it renames
    unnamed and duplicate nodes).
    """
    from model_explorer_onnx.main import ONNXAdapter

    try:
        graphs = ONNXAdapter().convert(str(path), {})["graphs"]
    except Exception as err:  # noqa: BLE001  (whatever its converter raises: one line)
        raise ProbeError(f"Model Explorer cannot read the model '{path}': {err}") from None
    return _tensor_map(graphs[0], known)


def _tflite_nodes(path: Path, known: set[str]) -> tuple[str, dict[str, list[str]]]:
    from model_explorer import builtin_tflite_flatbuffer_adapter as tflite_adapter

    collections = tflite_adapter.BuiltinTfliteFlatbufferAdapter().convert(str(path), {})["graphCollections"]
    return _tensor_map(collections[0].graphs[0], known)


def _torch_model(module, example_inputs, known: set[str], workdir: Path) -> SourceModel:
    """The ExportedProgram tvm_probe imports (the same node names), converted by Model
    Explorer's own PyTorch adapter and written as its JSON graph; nodes are fx nodes."""
    from model_explorer.config import DEFAULT_SETTINGS
    from model_explorer.pytorch_exported_program_adapter_impl import PytorchExportedProgramAdapterImpl
    from model_explorer.utils import convert_adapter_response


    program = export_program(module, example_inputs)
    graphs = convert_adapter_response(PytorchExportedProgramAdapterImpl(program, DEFAULT_SETTINGS).convert())
    path = Path(workdir) / "model.pt2.json"
    _write(path, graphs)
    keys = {node.name: key for node, key in node_keys(program).items()}
    mapping = {name: [key] for name, key in keys.items() if key in known}
    return SourceModel(path=path, graph_id=graphs["graphs"][0]["id"], node_values=mapping, adapter="builtin_json")


def _tensor_map(graph, known: set[str]) -> tuple[str, dict[str, list[str]]]:
    """Node id -> the tensor names (among ``known``) its outputs carry, for dataclass or JSON graphs."""
    get = (lambda o, k: o.get(k)) if isinstance(graph, dict) else getattr
    mapping = {}
    for node in get(graph, "nodes") or []:
        names = []
        for meta in get(node, "outputsMetadata") or []:
            for attr in get(meta, "attrs") or []:
                if get(attr, "key") in ("__tensor_tag", "tensor_name") and get(attr, "value") in known:
                    names.append(get(attr, "value"))
        if names:
            mapping[get(node, "id")] = list(dict.fromkeys(names))
    return get(graph, "id"), mapping


def source_model(results, model=None, workdir: Path | None = None) -> SourceModel | None:
    """The source model a dump points to (or ``model``: a path or an ``onnx.ModelProto``).

    A PyTorch model (a dump recording its factory, or ``model=(module, example_inputs)``) is
    shown as the ExportedProgram tvm_probe imported; a one-line error when no model is known.
    """
    described = getattr(results, "metadata", {}).get("model") if model is None else None
    if model is None and not described:
        raise ProbeError("this run does not record its source model: give it with --model PATH "
                         "(Python: view(model=...); dumps written by 'tvm-probe run' record it)")
    known = {v.key for v in results.sources_map}
    workdir = Path(workdir or tempfile.mkdtemp(prefix="tvm_probe_view_"))
    if model is None:  # read as `tvm-probe compare DUMP` reads it (a demo built as its config built it)
        adapter, source, shapes = recorded_model(results)
        graph = adapter.source_graph(source, shapes)
    elif isinstance(model, (str, Path)) and not Path(model).is_file():
        raise ProbeError(f"the source model '{model}' does not exist: give it with --model PATH")
    else:  # the model as its importer takes it: shown as it is
        graph = SourceGraph(adapter_of(model).graph, model)
    if graph.format == "torch":  # (torch module, example inputs): the ExportedProgram tvm_probe imported
        return _torch_model(*graph.model, known, workdir)
    model = graph.model
    if not isinstance(model, (str, Path)):  # an onnx.ModelProto: Model Explorer reads files
        import onnx

        path = workdir / "model.onnx"
        onnx.save(model, str(path))
        model = path
    path = Path(model)
    if not path.is_file():
        raise ProbeError(f"the source model '{path}' does not exist: give it with --model PATH")
    read = _tflite_nodes if path.suffix == ".tflite" else _onnx_nodes
    graph_id, mapping = read(path, known)
    if not mapping:
        raise ProbeError(f"no node of '{path}' outputs a value of this run: it is not the model the run "
                         "was made with; give the right one with --model PATH")
    return SourceModel(path=path.resolve(), graph_id=graph_id, node_values=mapping)


# ------------------------------------------------------------------------------ export and serve
@dataclass
class ViewFiles:
    """What :func:`export` wrote: the kernel graph, node-data files per graph, the source model."""

    folder: Path
    kernel_graph: Path
    kernel_overlays: dict[str, Path]
    source_model: Path | None
    source_overlays: dict[str, Path]
    source_adapter: str | None = None  # builtin_json for a PyTorch model's graph
    first_divergent: str | None = None   # source node id of the first divergent value
    first_divergent_value: str | None = None

    @property
    def commands(self) -> list[str]:
        """``model-explorer`` command lines that load these files by hand: one per graph, since
        with the ONNX extension loaded, Model Explorer hands every ``.json`` file to it."""
        kernels = ",".join(str(p) for p in self.kernel_overlays.values())
        lines = [f"model-explorer {self.kernel_graph} --node_data_paths={kernels}"]
        if self.source_model is not None:
            source = ",".join(str(p) for p in self.source_overlays.values())
            extension = "" if self.source_adapter else " --extensions=model_explorer_onnx"
            lines.insert(0, f"model-explorer {self.source_model}{extension} --node_data_paths={source}")
        return lines


def _file_name(overlay: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", overlay.lower()).strip("_")


def export(results, folder, comparison=None, model=None, overwrite: bool = False) -> ViewFiles:
    """Write the view as Model Explorer JSON files into ``folder`` (no server); return them.

    ``kernels.json`` (the kernel graph), ``kernels.<overlay>.json`` and ``source.<overlay>.json``
    (node data), ``view.json`` (an index, with the ``model-explorer`` commands that load them).
    """
    model_explorer()
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise ProbeError(f"'{folder}' exists and is not empty: choose another folder or pass --overwrite (Python: overwrite=True)")
    facts = value_facts(results, comparison)
    first = comparison.first_divergent.key if comparison is not None and comparison.first_divergent else None
    atol = _scale_atol(facts.values())
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=_parent(folder)))
    try:
        source = source_model(results, model, tmp)
        files = ViewFiles(folder=folder, kernel_graph=folder / KERNEL_GRAPH, kernel_overlays={},
                          source_model=None, source_overlays={}, first_divergent_value=first)
        _write(tmp / KERNEL_GRAPH, kernel_graph(results, facts, first))
        for name, res in overlays({k: [f] for k, f in facts.items()}, atol).items():
            rel = f"kernels.{_file_name(name)}.json"
            _write(tmp / rel, node_data(KERNEL_GRAPH_ID, name, res, atol))
            files.kernel_overlays[name] = folder / rel
        if source is not None:
            by_node = {nid: [facts[k] for k in keys if k in facts] for nid, keys in source.node_values.items()}
            by_node = {nid: fs for nid, fs in by_node.items() if fs}
            for name, res in overlays(by_node, atol).items():
                rel = f"source.{_file_name(name)}.json"
                _write(tmp / rel, node_data(source.graph_id, name, res, atol))
                files.source_overlays[name] = folder / rel
            files.source_model, files.source_adapter = source.path, source.adapter
            if source.path.parent == tmp:  # a model that had no file (demo, ModelProto): keep it
                files.source_model = folder / source.path.name
            if first is not None:
                files.first_divergent = next((nid for nid, keys in source.node_values.items() if first in keys), None)
        _write(tmp / INDEX, _index(files))

        replace_folder(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return files


def _parent(folder: Path) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder.parent


def _write(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, allow_nan=False)  # JSON.parse in the page refuses NaN/Infinity


def _index(files: ViewFiles) -> dict:
    return {"source_model": str(files.source_model) if files.source_model else None,
            "kernel_graph": str(files.kernel_graph),
            "source_overlays": {k: str(v) for k, v in files.source_overlays.items()},
            "kernel_overlays": {k: str(v) for k, v in files.kernel_overlays.items()},
            "first_divergent_node": files.first_divergent, "first_divergent_value": files.first_divergent_value,
            "commands": files.commands}


def config(files: ViewFiles):
    """A Model Explorer config loading the exported files: the source model first, its overlays,
    then the kernel graph (read by Model Explorer's JSON loader) and its overlays."""
    me = model_explorer()
    cfg = me.config()
    if files.source_model is not None:
        cfg.add_model_from_path(str(files.source_model),
                                **({"adapterId": files.source_adapter} if files.source_adapter else {}))
        for path in files.source_overlays.values():
            cfg.add_node_data_from_path(str(path), model_name=files.source_model.name)
    cfg.add_model_from_path(str(files.kernel_graph), adapterId="builtin_json")
    for path in files.kernel_overlays.values():
        cfg.add_node_data_from_path(str(path), model_name=KERNEL_LABEL)
    return cfg


def page_url(files: ViewFiles, host: str, port: int, select_first: bool = True) -> str:
    """The page's address: every model and overlay, the first divergent node selected."""
    cfg = config(files)
    data = json.loads(_unquote(cfg.to_url_param_value()))
    if select_first and files.first_divergent:
        data["uiState"] = {"paneStates": [{"deepestExpandedGroupNodeIds": [], "selectedNodeId": files.first_divergent,
                                           "selectedGraphId": "", "selectedCollectionLabel": "",
                                           "widthFraction": 1, "selected": True}]}
    return f"http://{host}:{port}/?data={quote(json.dumps(data))}"


def _unquote(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


def free_port(host: str = "localhost", start: int = DEFAULT_PORT) -> int:
    """The first port from ``start`` on which nothing listens (as Model Explorer picks its own)."""
    for port in range(start, start + 50):
        if not _in_use(host, port):
            return port
    raise ProbeError(f"no free port in {start}..{start + 49}: give one with --port")


def _in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex((host if host != "localhost" else "127.0.0.1", port)) == 0


def view(results, comparison=None, model=None, host: str = "localhost", port: int | None = None,
         open_browser: bool = True, workdir=None, on_ready=None) -> None:
    """Serve the view on ``http://host:port`` until stopped (Ctrl-C, SIGTERM); see the module docstring.

    Prints one line: the page to open (a small file that forwards to Model Explorer's address,
    which holds every file path and is thousands of characters long).  Model Explorer's own
    banner is not shown.  The temporary folder (``tvm_probe_view_*``) is removed on every exit:
    normal, error, Ctrl-C, SIGTERM or SIGHUP.

    Args:
        results: a :class:`~tvm_probe.Probe` after a run, or a dump (:func:`~tvm_probe.load_dump`).
        comparison: the :class:`~tvm_probe.comparison.Comparison` to show; None: the dump is
            compared with the reference of the model it records (onnxruntime / TFLite), on its
            own inputs, as ``tvm-probe compare`` does; a live probe without one shows no errors.
        model: the source model (path or ``onnx.ModelProto``) when the run does not record it.
        port: defaults to the first free port from 8080 on; a port in use is an error.
        open_browser: open the page in the default browser.
        workdir: where the exported files go (default: a temporary folder, removed at exit).
        on_ready: called with the page's full address once it is known (before serving).
    """
    me = model_explorer()
    if port is None:
        port = free_port(host)
    elif _in_use(host, port):
        raise ProbeError(f"port {port} is in use: choose another with --port")
    if comparison is None and results.is_dump:  # compared with its model's reference
        comparison = reference_comparison(results, model if isinstance(model, (str, Path)) else None)
    scratch = None if workdir else Path(tempfile.mkdtemp(prefix="tvm_probe_view_"))
    folder = Path(workdir) if workdir else scratch / "view"
    try:
        with _stopped_by_signals():
            files = export(results, folder, comparison, model, overwrite=True)
            url = page_url(files, host, port)
            page = _forwarding_page(folder, url)
            print(f"tvm-probe view: {page.as_uri()} (Model Explorer on http://{host}:{port}; Ctrl-C stops it)",
                  flush=True)
            if on_ready is not None:
                on_ready(url)
            if open_browser:
                webbrowser.open_new_tab(url)
            with contextlib.redirect_stdout(io.StringIO()):  # its banner, adapter list and address
                me.visualize_from_config(config(files), host=host, port=port, extensions=["model_explorer_onnx"],
                                         no_open_in_browser=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


OPEN_PAGE = "open.html"


def _forwarding_page(folder: Path, url: str) -> Path:
    """``folder/open.html``: a page that forwards to ``url`` (a short name for a long address)."""
    path = folder / OPEN_PAGE
    target = html.escape(url, quote=True)
    path.write_text(f'<!DOCTYPE html>\n<meta charset="utf-8"><meta http-equiv="refresh" content="0; url={target}">'
                    f'<title>tvm_probe view</title><a href="{target}">Model Explorer</a>\n', encoding="utf-8")
    return path


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM and SIGHUP stop the view as Ctrl-C does (a KeyboardInterrupt, which Model
    Explorer's loop ends on), so that the caller's clean-up runs; by default they kill the
    process on the spot.  Only the main thread can set handlers: elsewhere this does nothing."""
    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {}
    try:
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                previous[sig] = signal.signal(sig, stop)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ------------------------------------------------------------------------------ quantization overlays
#: Per-op figures of tvm_probe.tools.quantization shown on the float model: (overlay, row column, thresholds)
QUANTIZATION_OVERLAYS = (
    ("sqnr (dB)", "sqnr_db", [{"value": 10, "bgColor": FAILED}, {"value": 20, "bgColor": NEAR},
                              {"value": _HUGE, "bgColor": PASSED}]),
    ("tvm vs onnxruntime", "tvm_vs_runtime", [{"value": 1e-5, "bgColor": PASSED}, {"value": _HUGE, "bgColor": FAILED}]),
    ("sqnr kept in float (dB)", "sensitivity_sqnr_db", []),
    ("gain kept in float (dB)", "gain_db", [{"value": 1, "bgColor": PASSED}, {"value": 3, "bgColor": NEAR},
                                            {"value": _HUGE, "bgColor": FAILED}]),
)


def export_quantization(comparison, folder, sensitivity=None, overwrite: bool = False) -> list[str]:
    """Write the float model and Model Explorer overlays of a quantization comparison (and ranking)
    into ``folder``: per quantized op, its SQNR, TVM against onnxruntime, and (with ``sensitivity``)
    the outputs' SQNR and gain with that op in float.  Returns the ``model-explorer`` command
    line that loads them.  ``comparison`` is :func:`tvm_probe.tools.quantization.compare_quantized`'s."""
    import onnx

    model_explorer()
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()) and not overwrite:
        raise ProbeError(f"'{folder}' exists and is not empty: choose another folder or pass overwrite=True")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "float.onnx"
    onnx.save(comparison.float_model, str(path))
    rows = {r["name"]: dict(r) for r in comparison.rows}
    for r in sensitivity.rows if sensitivity is not None else ():
        rows[r["name"]].update(sensitivity_sqnr_db=r["sqnr_db"], gain_db=r["gain_db"])
    tensors = {op.float_tensor: op.name for op in comparison.ops}
    graph_id, nodes = _onnx_nodes(path, set(tensors))
    overlays = []
    for overlay, column, scale in QUANTIZATION_OVERLAYS:
        results = {}
        for node_id, keys in nodes.items():
            value = rows[tensors[keys[0]]].get(column)
            if value is not None and not math.isnan(value):
                results[node_id] = {"value": max(min(float(value), _HUGE), -_HUGE)}  # JSON has no infinity
        if results:
            data = {"name": f"tvm_probe {overlay}", "results": results, **({"thresholds": scale} if scale else {})}
            overlays.append(folder / f"quantization.{_file_name(overlay)}.json")
            _write(overlays[-1], {graph_id: data})
    return [f"model-explorer {path} --extensions=model_explorer_onnx --node_data_paths="
            + ",".join(str(p) for p in overlays)]


def reference_comparison(reader, model_path=None, atol=None, rtol=None):
    """The dump compared with the reference of its model on its own inputs (``tvm-probe compare``)."""
    return compare_dump(reader, model_path, atol, rtol)
