"""Dumps: one run on disk, in the layout TVM's old graph debug executor wrote.

::

    <root>/
      tvm_probe_manifest.json            format version, versions, model hash, per-file size + sha256
      _tvmdbg_device_CPU_0/
        _tvmdbg_graph_dump.json          legacy graph JSON (nodes, arg_nodes, heads, node_row_ptr,
                                         attrs{storage_id, dltype, shape}); each kernel node's attrs
                                         also carry ``source_names`` / ``interior_source_names``
        output_tensors.params            node outputs, TVM param-dict format, keys
                                         ``{node name}____topo-index:{i}____output-num:{j}``
        _tvmdbg_execution_trace.json     Chrome trace (chrome://tracing, Perfetto)
        _tvmprobe_sources.json           every source value and how it was served
        _tvmprobe_values.params          values that are not node outputs (recomputed, folded,
                                         import-time constants, inputs; weights on request)

Writing goes to a temporary sibling folder that is renamed into place once complete, so a
failed or interrupted dump leaves nothing half-written and never damages an existing dump.
Reading needs numpy alone and verifies the manifest before trusting any file.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import CorruptDumpError, DumpError, DumpExistsError, NotCapturedError
from ..results import NodeInfo, Results
from ..sources import Kind, Served, SourceMap, SourceValue
from . import paramdict

FORMAT = "tvm_probe-dump"
FORMAT_VERSION = 1
MANIFEST = "tvm_probe_manifest.json"
GRAPH = "_tvmdbg_graph_dump.json"
TENSORS = "output_tensors.params"
TRACE = "_tvmdbg_execution_trace.json"
SOURCES = "_tvmprobe_sources.json"
VALUES = "_tvmprobe_values.params"
_KEY_RE = re.compile(r"^(?P<name>.*)____topo-index:(?P<i>\d+)____output-num:(?P<j>\d+)$")


@dataclass
class DumpContent:
    """Everything one dump holds (plain data, produced by :meth:`Probe.dump`).

    ``node_outputs`` holds the outputs of input nodes and kernel nodes, by node index (empty
    when they were streamed to disk); ``values`` the source values that are not node outputs.
    """

    sources: SourceMap
    nodes: list[NodeInfo]
    node_outputs: dict[int, list[np.ndarray]]
    values: dict[str, np.ndarray]
    device: str
    model_hash: str
    target: str
    pipeline: str
    total_us: float | None
    metadata: dict = field(default_factory=dict)
    value_keys: list[str] = field(default_factory=list)
    timings: bool = True

    def __post_init__(self):
        if not self.value_keys:
            self.value_keys = list(self.values)


def tensor_key(name: str, index: int, output: int) -> str:
    """The legacy key of output ``output`` of node ``index`` in ``output_tensors.params``."""
    return f"{name}____topo-index:{index}____output-num:{output}"


# ---------------------------------------------------------------------------------- writing
class DumpWriter:
    """Writes one dump into a temporary sibling folder; :meth:`commit` renames it into place.

    Node tensors go through :meth:`open_tensors` / :meth:`write_tensor` one at a time (so a run
    can stream them to disk as they are produced); :meth:`finish` writes everything else.  Use it
    as a ``with`` block: any failure before :meth:`commit` leaves no trace, and a failed write
    (a full disk, say) comes out as a one-line :class:`DumpError`.
    """

    def __init__(self, root: Path, device: str, overwrite: bool = False):
        self.root = Path(root)
        if self.root.exists() and not overwrite:
            raise DumpExistsError(f"dump folder '{self.root}' already exists: choose another path or pass overwrite=True")
        if self.root.exists() and not self.root.is_dir():
            raise DumpError(f"'{self.root}' exists and is not a folder: choose another path for the dump")
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.root.name}.partial-", dir=self.root.parent))
            self.device_dir = self.tmp / f"_tvmdbg_device_{device}"
            self.device_dir.mkdir()
        except OSError as err:
            raise DumpError(f"cannot write dump to '{self.root}': {err.strerror or err}") from None
        self._file = None
        self._stream = None

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if kind is None:
            return False
        self.abort()
        if isinstance(err, OSError):
            raise DumpError(f"cannot write dump to '{self.root}': {err.strerror or err}") from None
        return False

    def open_tensors(self, names: list[str]) -> None:
        """Announce the node tensors (``tensor_key`` names, in the order they will be written)."""
        self._file = open(self.device_dir / TENSORS, "wb")
        self._stream = paramdict.StreamWriter(self._file, names)

    def write_tensor(self, name: str, array: np.ndarray) -> None:
        self._stream.write(name, array)

    def close_tensors(self) -> Path:
        """Finish the tensor file; return its path (in the temporary folder: open it before
        :meth:`commit`, an open file stays valid across the rename)."""
        self._stream.close()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self.device_dir / TENSORS

    def finish(self, content: "DumpContent", values) -> None:
        """Write the values file (``values``: ``(key, array)`` pairs, names first via content)."""
        with open(self.device_dir / VALUES, "wb") as f:
            stream = paramdict.StreamWriter(f, content.value_keys)
            for key, array in values:
                stream.write(key, array)
            stream.close()
        _write_json(self.device_dir / GRAPH, graph_json(content.nodes, content.sources))
        _write_json(self.device_dir / TRACE, chrome_trace(content.nodes if content.timings else []))
        _write_json(self.device_dir / SOURCES, {
            "sources": [v.to_record() for v in content.sources],
            "model_inputs": content.sources.model_inputs, "model_outputs": content.sources.model_outputs,
            "target": content.target, "pipeline": content.pipeline, "total_us": content.total_us,
            "metadata": content.metadata,
        })
        _write_json(self.tmp / MANIFEST, _manifest(self.tmp, content))

    def commit(self) -> Path:
        """Move the finished dump into place; an old dump is removed only after that succeeded."""
        root, tmp = self.root, self.tmp
        if not root.exists():
            os.rename(tmp, root)
            return root
        old = root.with_name(f".{root.name}.old-{os.getpid()}")
        os.rename(root, old)
        try:
            os.rename(tmp, root)
        except OSError:
            os.rename(old, root)
            raise
        shutil.rmtree(old, ignore_errors=True)
        return root

    def abort(self) -> None:
        """Remove the temporary folder (after a failure: the close may fail the same way)."""
        if self._file is not None and not self._file.closed:
            with contextlib.suppress(OSError):
                self._file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class StreamedOutputs(Mapping):
    """Kernel outputs of a streamed run, read from its tensor file: ``site → [arrays]``.

    The file is memory-mapped; arrays are read-only views, so nothing is loaded until used.
    """

    def __init__(self, path: Path, nodes: list[NodeInfo], num_input_nodes: int):
        import mmap

        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._entries = {e.name: e for e in paramdict.read_index(self._map, source=str(path))}
        self._nodes, self._n_in, self._path = nodes, num_input_nodes, path
        self._sites = sorted({int(_KEY_RE.match(k)["i"]) - num_input_nodes for k in self._entries}
                             - set(range(-num_input_nodes, 0)))

    def __getitem__(self, site: int) -> list[np.ndarray]:
        node = self._nodes[self._n_in + site]
        names = [tensor_key(node.name, node.index, j) for j in range(len(node.out_shapes))]
        if names[0] not in self._entries:
            raise KeyError(site)
        return [paramdict.view(self._map, self._entries[n], source=str(self._path)) for n in names]

    def __iter__(self):
        return iter(self._sites)

    def __len__(self) -> int:
        return len(self._sites)


def node_tensor_names(nodes: list[NodeInfo], outputs: dict[int, int]) -> list[str]:
    """``tensor_key`` names of the node outputs a dump holds (``outputs``: node → count), in node order."""
    return [tensor_key(nodes[i].name, i, j) for i in sorted(outputs) for j in range(outputs[i])]


def write_dump(root: Path, content: "DumpContent", overwrite: bool = False) -> Path:
    """Write ``content`` (node outputs in memory) to ``root`` atomically; return ``root``."""
    outputs = {i: len(outs) for i, outs in content.node_outputs.items()}
    with DumpWriter(root, content.device, overwrite) as writer:
        writer.open_tensors(node_tensor_names(content.nodes, outputs))
        for i in sorted(outputs):
            for j, array in enumerate(content.node_outputs[i]):
                writer.write_tensor(tensor_key(content.nodes[i].name, i, j), array)
        writer.close_tensors()
        writer.finish(content, content.values.items())
        return writer.commit()


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest(tmp: Path, content: DumpContent) -> dict:
    files = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        rel = path.relative_to(tmp).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    try:
        import tvm

        tvm_version = tvm.__version__
    except ImportError:  # pragma: no cover - a probe always has TVM
        tvm_version = None
    return {"format": FORMAT, "version": FORMAT_VERSION, "tvm_probe_version": __version__,
            "tvm_version": tvm_version, "model_hash": content.model_hash,
            "device_dir": f"_tvmdbg_device_{content.device}", "files": files}


def graph_json(nodes: list[NodeInfo], sources: SourceMap) -> dict:
    """The legacy graph JSON for ``nodes``, with source names added to each node's attrs."""
    out_nodes, row_ptr, storage, dltype, shapes = [], [0], [], [], []
    heads = []
    outputs = set(sources.model_outputs)
    for n in nodes:
        entry = {"op": n.op, "name": n.name, "inputs": [[i, k, 0] for i, k in n.inputs]}
        if n.op == "tvm_op":
            entry["attrs"] = {
                "func_name": n.symbol, "num_inputs": str(len(n.inputs) + n.const_inputs),
                "num_outputs": str(len(n.out_shapes)), "flatten_data": "0",
                "T": "type: " + (n.out_dtypes[0] if n.out_dtypes else ""),
                "occurrence": n.occurrence, "view": n.is_view, "const_inputs": n.const_inputs,
                "source_names": n.output_keys, "interior_source_names": n.interior_keys,
            }
        entry["shape"] = list(n.out_shapes[0]) if n.out_shapes else []
        out_nodes.append(entry)
        for j, (shape, dtype) in enumerate(zip(n.out_shapes, n.out_dtypes)):
            storage.append(len(storage))
            dltype.append(dtype)
            shapes.append(list(shape))
            if n.op == "tvm_op" and outputs & set(n.output_keys[j]):
                heads.append([n.index, j, 0])
        row_ptr.append(len(storage))
    return {
        "nodes": out_nodes, "arg_nodes": [n.index for n in nodes if n.op == "null"],
        "heads": heads, "node_row_ptr": row_ptr,
        "attrs": {"storage_id": ["list_int", storage], "dltype": ["list_str", dltype],
                  "shape": ["list_shape", shapes]},
    }


def chrome_trace(nodes: list[NodeInfo]) -> dict:
    """Per-kernel times as a Chrome trace (begin/end events, microseconds)."""
    events = []
    for n in nodes:
        if n.start_us is None or n.time_us is None:
            continue
        common = {"name": n.name, "cat": "view" if n.is_view else "kernel", "pid": 1, "tid": 1}
        events.append({**common, "ph": "B", "ts": n.start_us, "args": {"node": n.index}})
        events.append({**common, "ph": "E", "ts": n.start_us + n.time_us})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


# ---------------------------------------------------------------------------------- reading
def load_dump(path) -> "DumpReader":
    """Open a dump written by :meth:`Probe.dump` (numpy only; verifies every file first)."""
    return DumpReader(Path(path))


class DumpReader(Results):
    """A dump read back: the same ``get`` / ``get_all`` / ``get_node_output`` / tables as a Probe.

    Also: ``inputs`` (the run's inputs by name), ``metadata`` (what the writer stored, e.g. the
    model's origin), ``model_hash``, ``target``, ``pipeline``.
    """

    def __init__(self, root: Path):
        if not root.is_dir():
            raise DumpError(f"dump folder '{root}' does not exist: give the folder written by probe.dump()")
        self.root = root
        self.manifest = self._verified_manifest()
        device_dir = root / self.manifest["device_dir"]
        meta = self._json(device_dir / SOURCES)
        try:
            sources = SourceMap()
            for rec in meta["sources"]:
                sources.add(SourceValue.from_record(rec))
            sources.model_inputs = list(meta["model_inputs"])
            sources.model_outputs = list(meta["model_outputs"])
            self.target, self.pipeline = str(meta["target"]), str(meta["pipeline"])
            self.metadata = dict(meta.get("metadata") or {})
            self.model_hash = str(self.manifest.get("model_hash", ""))
            nodes = _nodes_from_graph(self._json(device_dir / GRAPH), sources)
            _times_from_trace(nodes, self._json(device_dir / TRACE))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
            raise CorruptDumpError(f"{device_dir.name}: graph or sources JSON is malformed ({err!r}): "
                                   "write the dump again") from None
        self._tensors = self._params(device_dir / TENSORS)
        self._values = self._params(device_dir / VALUES)
        self._check_tensors(nodes)
        self._init_results(sources, nodes)

    def _verified_manifest(self) -> dict:
        manifest = self._json(self.root / MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorruptDumpError(f"'{self.root / MANIFEST}' is not a tvm_probe dump manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise CorruptDumpError(f"dump format version {manifest.get('version')!r} is not supported "
                                   f"(this tvm_probe reads version {FORMAT_VERSION})")
        files = manifest.get("files")
        if not isinstance(files, dict) or not isinstance(manifest.get("device_dir"), str):
            raise CorruptDumpError(f"'{self.root / MANIFEST}' lacks its file list: write the dump again")
        for rel in [manifest["device_dir"], *files]:
            self._inside(rel)
        for rel, info in files.items():
            if not isinstance(info, dict):
                raise CorruptDumpError(f"'{self.root / MANIFEST}': the entry of '{rel}' is malformed")
            path = self.root / rel
            if not path.is_file():
                raise CorruptDumpError(f"dump file '{rel}' is missing from '{self.root}': write the dump again")
            size = path.stat().st_size
            if size != info.get("size"):
                raise CorruptDumpError(f"dump file '{rel}' has {size} bytes, the manifest says "
                                       f"{info.get('size')} (truncated or edited): write the dump again")
            if _sha256(path) != info.get("sha256"):
                raise CorruptDumpError(f"dump file '{rel}' was modified after it was written "
                                       "(checksum mismatch): write the dump again")
        return manifest

    def _inside(self, rel) -> None:
        """Refuse manifest paths that would read outside the dump folder."""
        root = self.root.resolve()
        target = (root / str(rel)).resolve()
        if not isinstance(rel, str) or not rel or (target != root and root not in target.parents):
            raise CorruptDumpError(f"'{self.root / MANIFEST}' names a path outside the dump ({rel!r}): "
                                   "refusing to read it")

    def _json(self, path: Path):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise CorruptDumpError(f"dump file '{path.name}' is missing from '{self.root}': write the dump again") from None
        except (ValueError, UnicodeDecodeError) as err:
            raise CorruptDumpError(f"dump file '{path.name}' is not valid JSON ({err}): write the dump again") from None

    @staticmethod
    def _params(path: Path) -> dict[str, np.ndarray]:
        try:
            return paramdict.load(path)
        except paramdict.ParamDictError as err:
            raise CorruptDumpError(f"{err}: write the dump again") from None

    def _check_tensors(self, nodes: list[NodeInfo]) -> None:
        self._node_tensors: dict[tuple[int, int], np.ndarray] = {}
        for key, array in self._tensors.items():
            m = _KEY_RE.match(key)
            if not m:
                raise CorruptDumpError(f"{TENSORS}: tensor key {key!r} is not '<name>____topo-index:<i>____output-num:<j>'")
            i, j = int(m["i"]), int(m["j"])
            if i >= len(nodes) or j >= len(nodes[i].out_shapes) or nodes[i].name != m["name"]:
                raise CorruptDumpError(f"{TENSORS}: tensor {key!r} has no matching node in the graph JSON")
            node = nodes[i]
            if tuple(array.shape) != tuple(node.out_shapes[j]) or str(array.dtype) != node.out_dtypes[j]:
                raise CorruptDumpError(
                    f"{TENSORS}: tensor {key!r} is {array.dtype}{list(array.shape)} but the graph JSON says "
                    f"{node.out_dtypes[j]}{list(node.out_shapes[j])}")
            self._node_tensors[(i, j)] = array

    def _capture_limited(self, value) -> bool:
        """True when the run did not capture the inputs of the kernel holding ``value``."""
        node = self.node_infos[value.node_index]
        return any((i, k) not in self._node_tensors for i, k in node.inputs)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The inputs of the dumped run, by name."""
        return {n.name: self._node_output(n.index, 0) for n in self.node_infos if n.op == "null"}

    def _node_output(self, index: int, output: int) -> np.ndarray:
        try:
            return self._node_tensors[(index, output)]
        except KeyError:
            raise NotCapturedError(f"node {index} ({self.node_infos[index].name}) output {output} is not in "
                                   "this dump: the run captured only some values") from None

    def _value(self, key: str) -> np.ndarray:
        value = self.sources_map[key]
        if key in self._values:
            return self._values[key]
        if value.served in (Served.CAPTURED, Served.VIEW, Served.INPUT) and value.node_index >= 0:
            node = self.node_infos[value.node_index]
            k = next((j for j, keys in enumerate(node.output_keys) if key in keys), 0)
            return self._node_output(value.node_index, k)
        if value.kind is Kind.PARAM:
            raise NotCapturedError(f"weight {value.display_name!r} is not stored in this dump: "
                                   "dump with include_weights=True")
        if value.served is Served.UNAVAILABLE:
            raise NotCapturedError(f"{value.display_name!r} is never computed by the compiled module")
        if value.served is Served.RECOMPUTED and not self._capture_limited(value):
            raise NotCapturedError(f"{value.display_name!r} is kept inside a fused kernel and this dump was "
                                   "written without recomputed values: dump with recomputed=True")
        raise NotCapturedError(f"{value.display_name!r} is not in this dump: the run captured only some values")


def _times_from_trace(nodes: list[NodeInfo], trace: dict) -> None:
    """Per-node start and duration from the Chrome trace's begin/end events."""
    begin = {}
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "B":
            begin[event["name"]] = (event["args"]["node"], float(event["ts"]))
        elif event.get("ph") == "E" and event.get("name") in begin:
            index, ts = begin.pop(event["name"])
            if 0 <= index < len(nodes):
                nodes[index].start_us, nodes[index].time_us = ts, float(event["ts"]) - ts


def _nodes_from_graph(graph: dict, sources: SourceMap) -> list[NodeInfo]:
    nodes = []
    shapes = graph["attrs"]["shape"][1]
    dtypes = graph["attrs"]["dltype"][1]
    row_ptr = graph["node_row_ptr"]
    if len(row_ptr) != len(graph["nodes"]) + 1 or row_ptr[-1] != len(shapes) or len(shapes) != len(dtypes):
        raise ValueError("node_row_ptr does not match nodes/attrs")
    for i, entry in enumerate(graph["nodes"]):
        attrs = entry.get("attrs", {})
        lo, hi = row_ptr[i], row_ptr[i + 1]
        output_keys = attrs.get("source_names") if entry["op"] == "tvm_op" else [[entry["name"]]]
        for keys in output_keys:
            for key in keys:
                if key not in sources:
                    raise ValueError(f"node {i} names unknown source {key!r}")
        nodes.append(NodeInfo(
            index=i, name=str(entry["name"]), op=str(entry["op"]), symbol=str(attrs.get("func_name", "")),
            occurrence=int(attrs.get("occurrence", 0)), is_view=bool(attrs.get("view", False)),
            inputs=[(int(a[0]), int(a[1])) for a in entry["inputs"]],
            const_inputs=int(attrs.get("const_inputs", 0)),
            out_shapes=[tuple(int(d) for d in s) for s in shapes[lo:hi]],
            out_dtypes=[str(d) for d in dtypes[lo:hi]],
            output_keys=[list(k) for k in output_keys],
            interior_keys=list(attrs.get("interior_source_names", []))))
    return nodes
