"""Dumps: one run on disk, in the layout TVM's graph debug executor wrote (TVM <= 0.19).

::

    <root>/
      tvm_probe_manifest.json            format version, versions, model hash, per-file size + sha256
      _tvmdbg_device_CPU_0/
        _tvmdbg_graph_dump.json          graph JSON node for node as TVM's debug executor wrote it
                                         (see :mod:`.graph`); what tvm_probe adds (source names,
                                         input entries, occurrence, view) under each node's
                                         ``"tvm_probe"`` key
        output_tensors.params            node outputs, TVM param-dict format, keys
                                         ``{node name}____topo-index:{i}____output-num:{j}``
        _tvmdbg_execution_trace.json     Chrome trace (chrome://tracing, Perfetto)
        _tvmprobe_sources.json           every source value and how it was served
        _tvmprobe_values.params          values that are not node outputs (recomputed, folded,
                                         import-time constants, inputs; weights on request)

Writing goes to a temporary sibling folder that is renamed into place once complete, so a
failed or interrupted dump leaves nothing half-written and never damages an existing dump.

Reading needs numpy alone.  :func:`load_dump` verifies a tvm_probe dump against its manifest
before trusting any file, and also reads a dump TVM's own debug executor wrote (see
:mod:`.legacy`).  Tensors are never loaded up front: both tensor files are memory-mapped
(:class:`~.paramdict.MappedParams`) and each value is read from disk when it is asked for.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from ..core.errors import CorruptDumpError, DumpError, DumpExistsError, NotCapturedError, Remedy, one_line
from ..core.records import AppliedFix, CompileWarning
from ..core.results import NodeInfo, Results, not_computed
from ..core.sources import Kind, Served, Serving, Servings, SourceMap, SourceValue
from ..core.viewable import Viewable
from . import graph as graph_layout
from . import legacy, paramdict
from .atomic import replace_folder
from .graph import DEVICE_DIR_PREFIX, GRAPH, TENSORS, TRACE
from .legacy import tensor_key

log = logging.getLogger(__name__)

FORMAT = "tvm_probe-dump"
FORMAT_VERSION = 2  # 2: the graph JSON is TVM's debug dump node for node (1 kept the executor's graph)
MANIFEST = "tvm_probe_manifest.json"
SOURCES = "_tvmprobe_sources.json"
VALUES = "_tvmprobe_values.params"


@dataclass
class DumpContent:
    """Everything one dump holds (plain data, produced by :meth:`Probe.dump`).

    ``node_outputs`` holds the outputs of input nodes and kernel nodes, by node index (empty
    when they were streamed to disk); ``values`` the source values that are not node outputs.
    """

    sources: SourceMap
    servings: Servings
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
    import_fixes: list[dict] = field(default_factory=list)      # AppliedFix records
    compile_warnings: list[dict] = field(default_factory=list)  # CompileWarning records

    def __post_init__(self):
        if not self.value_keys:
            self.value_keys = list(self.values)


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
            self.device_dir = self.tmp / f"{DEVICE_DIR_PREFIX}{device}"
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
        # indent=4 as TVM's debug executor wrote its graph dump
        _write_json(self.device_dir / GRAPH, graph_layout.graph_json(content.nodes, _head_keys(content.sources)),
                    indent=4)
        _write_json(self.device_dir / TRACE, graph_layout.chrome_trace(content.nodes if content.timings else []))
        _write_json(self.device_dir / SOURCES, {
            "sources": [{**v.to_record(), **content.servings[v.key].to_record()} for v in content.sources],
            "model_inputs": content.sources.model_inputs, "model_outputs": content.sources.model_outputs,
            "name_notes": content.sources.notes, "sequences": content.sources.sequences,
            "import_fixes": content.import_fixes,
            "compile_warnings": content.compile_warnings, "target": content.target, "pipeline": content.pipeline, "total_us": content.total_us,
            "metadata": content.metadata,
        })
        _write_json(self.tmp / MANIFEST, _manifest(self.tmp, content))

    def commit(self) -> Path:
        """Move the finished dump into place; an old dump is removed only after that succeeded."""
        return replace_folder(self.tmp, self.root)

    def abort(self) -> None:
        """Remove the temporary folder (after a failure: the close may fail the same way)."""
        if self._file is not None and not self._file.closed:
            with contextlib.suppress(OSError):
                self._file.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


class StreamedOutputs(Mapping):
    """Kernel outputs of a streamed run, read from its tensor file: ``site → [arrays]``.

    The file is memory-mapped (the same lazy path as :class:`DumpReader`); arrays are
    read-only views, so nothing is loaded until used.
    """

    def __init__(self, path: Path, nodes: list[NodeInfo], num_input_nodes: int):
        self._file = paramdict.MappedParams(path)
        self._nodes, self._n_in = nodes, num_input_nodes
        index = legacy.key_index(self._file, nodes)
        self._sites = sorted({i - num_input_nodes for i, _ in index if i >= num_input_nodes})
        self._held = set(self._sites)

    def __getitem__(self, site: int) -> list[np.ndarray]:
        if site not in self._held:  # also sites past the last node: `in` must answer False
            raise KeyError(site)
        node = self._nodes[self._n_in + site]
        return [self._file[tensor_key(node.name, node.index, j)] for j in range(len(node.out_shapes))]

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


def _write_json(path: Path, obj, indent: int = 1) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent)
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
            "import_fixes": [f["name"] for f in content.import_fixes],
            "device_dir": f"{DEVICE_DIR_PREFIX}{content.device}", "files": files}


# ---------------------------------------------------------------------------------- reading
def load_dump(path) -> "DumpReader":
    """Open a dump: one written by :meth:`Probe.dump`, or one TVM's graph debug executor wrote.

    Needs numpy only.  A tvm_probe dump is verified against its manifest first.  A dump
    written by TVM <= 0.19 itself (``path`` may be its root or its ``_tvmdbg_device_*`` folder)
    has no source names: its values answer to TVM's node names, ``source_names_known`` is
    False and ``notes`` says so (also logged as a warning).
    """
    return DumpReader(Path(path))


#: What a dump argument should be, in Python's and the command line's words.
_WRITTEN_BY_US = Remedy("give the folder written by probe.dump() or by TVM's debug executor",
                        cli="give the dump folder tvm-probe run wrote (output.dump; tvm_probe_out/MODEL/dump for a "
                            "model file) or one TVM's debug executor wrote")


class DumpReader(Results, Viewable):
    """A dump read back: the same ``get`` / ``get_all`` / ``get_node_output`` / tables as a Probe.

    Also: ``inputs`` (the run's inputs by name), ``metadata`` (what the writer stored, e.g. the
    model's origin), ``model_hash``, ``target``, ``pipeline`` (None where not known),
    ``device`` (e.g. ``CPU_0``), ``written_by`` (``"tvm_probe"`` or ``"tvm"``),
    ``source_names_known`` and ``notes`` (what a user must know about this dump, one line each).

    Values are read-only arrays mapped from the dump's files, read from disk on first use.
    """

    is_dump = True

    def __init__(self, root: Path):
        if not root.is_dir():
            raise DumpError(f"dump folder '{root}' does not exist", remedy=_WRITTEN_BY_US)
        self.root = root
        self.metadata, self.model_hash, self.target, self.pipeline = {}, "", None, None
        self.notes: list[str] = []
        if (root / MANIFEST).is_file():
            self._read_tvm_probe_dump()
        else:
            device_dir = legacy.find_device_dir(root)
            if device_dir is None:
                raise CorruptDumpError(
                    f"'{root}' is not a dump: '{MANIFEST}' is missing and there is no _tvmdbg_device_* folder "
                    "of TVM's debug executor", remedy=_WRITTEN_BY_US)
            self._read_tvm_dump(device_dir)
            log.warning("%s: %s", root, self.notes[0])  # source names are not known: users must see it
            for note in self.notes[1:]:
                log.info("%s: %s", root, note)

    # -- the two kinds of dump ----------------------------------------------------------------
    def _read_tvm_probe_dump(self) -> None:
        self.written_by, self.source_names_known = "tvm_probe", True
        self.manifest = self._verified_manifest()
        device_dir = self.root / self.manifest["device_dir"]
        self.device = device_dir.name.removeprefix(DEVICE_DIR_PREFIX)
        meta = self._json(device_dir / SOURCES)
        with self._malformed(device_dir.name, "graph or sources JSON", "write the dump again"):
            sources, servings = SourceMap(), {}
            for rec in meta["sources"]:
                sources.add(SourceValue.from_record(rec))
                servings[str(rec["key"])] = Serving.from_record(rec)
            sources.model_inputs = list(meta["model_inputs"])
            sources.model_outputs = list(meta["model_outputs"])
            sources.notes = {str(k): str(v) for k, v in (meta.get("name_notes") or {}).items()}
            # a sequence → its elements' keys (each element stored as a value of its own)
            sources.sequences = {str(k): [str(e) for e in v] for k, v in (meta.get("sequences") or {}).items()}
            self._fix_records = list(meta.get("import_fixes") or [])
            self._warning_records = list(meta.get("compile_warnings") or [])
            self.target, self.pipeline = str(meta["target"]), str(meta["pipeline"])
            self.metadata = dict(meta.get("metadata") or {})
            self.model_hash = str(self.manifest.get("model_hash", ""))
            nodes = graph_layout.read_graph(self._json(device_dir / GRAPH), extras=True)
            where = _source_entries(nodes, sources, servings)
            graph_layout.read_times(nodes, self._json(device_dir / TRACE), by_order=False)
        self._tensors = self._mapped(device_dir / TENSORS, "write the dump again")
        self._values = self._mapped(device_dir / VALUES, "write the dump again")
        self._index_tensors(nodes, strict=True)
        self._finish(sources, servings, nodes, where)

    def _read_tvm_dump(self, device_dir: Path) -> None:
        """A dump TVM <= 0.19 wrote: graph, tensors and (optionally) trace, nothing else."""
        self.written_by, self.source_names_known, self.manifest = "tvm", False, None
        self.device = device_dir.name.removeprefix("_tvmdbg_").removeprefix("device_").removeprefix("ctx_")
        self.notes.append(legacy.NOTE)
        advice = "the folder is not as TVM's debug executor wrote it; run it again"
        graph = self._json(device_dir / GRAPH, advice)
        with self._malformed(GRAPH, "the graph JSON", advice):
            nodes = graph_layout.read_graph(graph, extras=False)
            sources, servings, where = legacy.sources_of(nodes, graph)
        if any(k == graph_layout.UNKNOWN_OUTPUT for n in nodes for _, k in n.inputs):
            self.notes.append(legacy.UNKNOWN_OUTPUT_NOTE)
        if (device_dir / TRACE).is_file():
            with self._malformed(TRACE, "the execution trace", "it comes from another run? move it away to read "
                                 "the dump without kernel times"):
                graph_layout.read_times(nodes, self._json(device_dir / TRACE, advice), by_order=True)
        else:
            self.notes.append(legacy.NO_TRACE_NOTE)
        self._tensors = self._mapped(device_dir / TENSORS, "TVM writes it when the debug executor's run() "
                                     "completes; run it again")
        self._values = {}
        self._index_tensors(nodes, strict=False)
        self._finish(sources, servings, nodes, where)

    def _finish(self, sources: SourceMap, servings: Servings, nodes: list[NodeInfo],
                where: dict[str, tuple[int, int]]) -> None:
        self._where = where  # source key -> (node, output) holding it
        self._init_results(sources, servings, nodes)

    # -- checking and opening files -----------------------------------------------------------
    def _verified_manifest(self) -> dict:
        manifest = self._json(self.root / MANIFEST)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorruptDumpError(f"'{self.root / MANIFEST}' is not a tvm_probe dump manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise CorruptDumpError(f"dump format version {manifest.get('version')!r} is not supported "
                                   f"(this tvm_probe reads version {FORMAT_VERSION}): write the dump again "
                                   "with this tvm_probe")
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

    def _json(self, path: Path, advice: str = "write the dump again"):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise CorruptDumpError(f"dump file '{path.name}' is missing from '{self.root}': {advice}") from None
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise CorruptDumpError(f"dump file '{path.name}' is not valid JSON ({one_line(err)}): {advice}") from None

    @contextlib.contextmanager
    def _malformed(self, where: str, what: str, advice: str):
        """Turn the parsers' errors about a malformed file into one CorruptDumpError line."""
        try:
            yield
        except KeyError as err:
            raise CorruptDumpError(f"{where}: {what} is malformed (missing {err.args[0]!r}): {advice}") from None
        except (TypeError, ValueError, IndexError, AttributeError, OverflowError) as err:
            raise CorruptDumpError(f"{where}: {what} is malformed ({one_line(err)}): {advice}") from None

    def _mapped(self, path: Path, advice: str) -> paramdict.MappedParams:
        try:
            return paramdict.MappedParams(path)
        except FileNotFoundError:
            raise CorruptDumpError(f"dump file '{path.name}' is missing from '{path.parent}': {advice}") from None
        except paramdict.ParamDictError as err:
            raise CorruptDumpError(f"{err}: {advice}") from None

    def _index_tensors(self, nodes: list[NodeInfo], strict: bool) -> None:
        """Match every tensor of the tensor file to a node output, checking shape and dtype
        against the graph (from the file's index: no tensor data is read).

        ``strict``: only tvm_probe's key format (TVM's older formats are accepted otherwise).
        """
        try:
            if strict:
                bad = next((k for k in self._tensors if not legacy.is_current_key(k)), None)
                if bad is not None:
                    raise ValueError(f"tensor key {bad!r} is not '<name>____topo-index:<i>____output-num:<j>'")
            self._node_tensors = legacy.key_index(self._tensors, nodes)
        except ValueError as err:
            raise CorruptDumpError(f"{TENSORS}: {err}") from None
        for (i, j), key in self._node_tensors.items():
            entry, node = self._tensors.entries[key], nodes[i]
            if entry.shape != tuple(node.out_shapes[j]) or entry.dtype != node.out_dtypes[j]:
                raise CorruptDumpError(
                    f"{TENSORS}: tensor {key!r} is {entry.dtype}{list(entry.shape)} but the graph JSON says "
                    f"{node.out_dtypes[j]}{list(node.out_shapes[j])}")

    def _array(self, tensors, key: str) -> np.ndarray:
        """One tensor, read now; data errors the index could not see become dump errors."""
        try:
            return tensors[key]
        except paramdict.DtypeUnavailableError as err:
            raise DumpError(str(err)) from None
        except paramdict.ParamDictError as err:
            raise CorruptDumpError(str(err)) from None

    # -- the read API -------------------------------------------------------------------------
    @property
    def import_fixes(self) -> list:
        """The import fixes the dumped model needed (:class:`~tvm_probe.importer.fixes.AppliedFix`)."""
        return [AppliedFix.from_record(r) for r in getattr(self, "_fix_records", [])]

    @property
    def compile_warnings(self) -> list:
        """TVM's compile warnings with the source ops they concern (:class:`~tvm_probe.diagnose.failures.CompileWarning`)."""
        return [CompileWarning.from_record(r) for r in getattr(self, "_warning_records", [])]

    @property
    def captured_keys(self) -> set[str] | None:
        """Keys the dumped run was asked to capture (recorded by the writer); None: everything."""
        keys = self.metadata.get("capture")
        return set(keys) if isinstance(keys, list) else None

    def _capture_limited(self, key: str) -> bool:
        """True when the run did not capture the inputs of the kernel holding value ``key``."""
        node = self.node_infos[self.servings[key].node_index]
        return any((i, k) not in self._node_tensors for i, k in node.inputs)

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The inputs of the dumped run, by name (in a dump TVM wrote: its weights too)."""
        return {n.name: self._node_output(n.index, 0) for n in self.node_infos if n.op == "null"}

    def _node_output(self, index: int, output: int) -> np.ndarray:
        key = self._node_tensors.get((index, output))
        if key is None:
            raise NotCapturedError(f"node {index} ({self.node_infos[index].name}) output {output} is not in "
                                   "this dump: the run captured only some values")
        return self._array(self._tensors, key)

    def _value(self, key: str) -> np.ndarray:
        value = self.sources_map[key]
        if key in self._values:
            return self._array(self._values, key)
        if key in self._where:
            return self._node_output(*self._where[key])
        if value.kind is Kind.PARAM:
            raise NotCapturedError(f"weight {value.display_name!r} is not stored in this dump: dump with "
                                   "include_weights=True (YAML: output: {weights: true})")
        served = self.servings[key].served
        if served in (Served.UNAVAILABLE, Served.UNKNOWN):
            raise not_computed(value, served, "the dump does not record why")
        if served is Served.RECOMPUTED and not self._capture_limited(key):
            raise NotCapturedError(f"{value.display_name!r} is kept inside a fused kernel and this dump was "
                                   "written without recomputed values: dump with recomputed=True")
        raise NotCapturedError(f"{value.display_name!r} is not in this dump: the run captured only some values")


def _head_keys(sources: SourceMap) -> list[str]:
    """The model outputs as the graph's heads list them: a sequence as its elements, in turn (the
    VM returns it as a tuple, which TVM's debug executor listed one entry per tensor)."""
    return [e for key in sources.model_outputs for e in sources.sequences.get(key, [key])]


def _source_entries(nodes: list[NodeInfo], sources: SourceMap, servings: Servings) -> dict[str, tuple[int, int]]:
    """Source key -> (node, output) for the values a node outputs (captured, views, inputs).

    Raises:
        ValueError: a node names (as output or kept inside) a source value the sources file
            does not have.
    """
    output_of = {}
    for n in nodes:
        for key in (k for keys in n.output_keys for k in keys):
            if key not in sources:
                raise ValueError(f"node {n.index} names unknown source {key!r}")
        for key in n.interior_keys:
            if key not in sources:
                raise ValueError(f"node {n.index} names unknown source {key!r} inside it")
        for j, keys in enumerate(n.output_keys):
            for key in keys:
                output_of.setdefault((n.index, key), j)
    where = {}
    for value in sources:
        serving = servings[value.key]
        if serving.served in (Served.CAPTURED, Served.VIEW, Served.INPUT) and serving.node_index >= 0:
            node = nodes[serving.node_index]
            j = output_of.get((node.index, value.key))
            if j is None and len(node.out_shapes) == 1:
                j = 0  # e.g. an identity of a model input: the input node's only output
            if j is not None:
                where[value.key] = (node.index, j)
    return where
