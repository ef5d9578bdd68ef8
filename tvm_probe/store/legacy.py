"""Dumps written by TVM's own graph debug executor (TVM <= 0.19), read without TVM.

Such a dump is a folder ``<root>/_tvmdbg_device_<DEV>_<n>/`` (``_tvmdbg_ctx_...`` before v0.8)
holding ``_tvmdbg_graph_dump.json`` (see :mod:`.graph`), ``output_tensors.params`` (every node's
outputs, inputs and weights included) and ``_tvmdbg_execution_trace.json``.  It knows nothing
of the source model: no manifest, no source names.  Here every node output becomes a
:class:`~tvm_probe.core.sources.SourceValue` named after its node (``node:k`` for output k of a node
with several), so ``get(node name)`` and ``get_node_output(i)`` work, and the reader says that
source names are not known.

The tensor keys changed over TVM's releases; all are read:

======== ==============================================
v0.9+    ``{name}____topo-index:{i}____output-num:{j}``
v0.8     ``{name}____{j}``
<= v0.7  ``{name}_{j}__{cumulative time}``
======== ==============================================
"""
from __future__ import annotations

import re
from pathlib import Path

from ..core.errors import CorruptDumpError, DumpError
from ..core.results import NodeInfo
from ..core.sources import Kind, Served, Serving, Servings, SourceMap, SourceValue
from .graph import GRAPH, NOP, UNKNOWN_OUTPUT
PROBE_FILE_PREFIX = "_tvmprobe_"  # files only tvm_probe writes into the device folder

NOTE = ("written by TVM's graph debug executor, not by tvm_probe: source names are not known for "
        "this dump; its values answer to TVM's node names (kernels, and 'param' nodes: the model's "
        "inputs and weights alike)")
NO_TRACE_NOTE = "the dump has no execution trace: kernel times are not known"
UNKNOWN_OUTPUT_NOTE = ("TVM's graph names the nodes a kernel reads, not which of their outputs: an input "
                       f"taken from a node with several outputs is listed with output {UNKNOWN_OUTPUT} (not known)")

_KEY_FORMATS = [  # newest first; each gives the node name, maybe its index, and the output number
    re.compile(r"^(?P<name>.*)____topo-index:(?P<i>\d+)____output-num:(?P<j>\d+)$"),
    re.compile(r"^(?P<name>.*)____(?P<j>\d+)$"),
    re.compile(r"^(?P<name>.*)_(?P<j>\d+)__[-+.0-9eE]+$"),
]


def find_device_dir(root: Path) -> Path | None:
    """The folder of ``root`` holding a graph dump TVM wrote (``root`` itself or one
    ``_tvmdbg_*`` folder in it), or None when there is none.

    Raises:
        DumpError: several device folders, or a tvm_probe dump given by its device folder.
        CorruptDumpError: a tvm_probe dump whose manifest is missing.
    """
    if (root / GRAPH).is_file():
        candidates = [root]
    else:
        candidates = sorted(p for p in root.glob("_tvmdbg_*") if (p / GRAPH).is_file())
    if len(candidates) > 1:
        raise DumpError(f"'{root}' holds dumps of several devices ({', '.join(p.name for p in candidates)}): "
                        "give one of these folders")
    if not candidates:
        return None
    device_dir = candidates[0]
    if any(p.name.startswith(PROBE_FILE_PREFIX) for p in device_dir.iterdir()):
        if device_dir == root:
            raise DumpError(f"'{root}' is the device folder of a tvm_probe dump: give its parent "
                            f"'{root.parent}'")
        raise CorruptDumpError(f"dump file 'tvm_probe_manifest.json' is missing from '{root}': "
                               "write the dump again")
    return device_dir


def key_index(keys, nodes: list[NodeInfo]) -> dict[tuple[int, int], str]:
    """``(node, output) -> key`` for the keys of a TVM ``output_tensors.params``.

    Raises:
        ValueError: a key fits no TVM release's format, names no node, or is ambiguous.
    """
    by_name: dict[str, list[int]] = {}
    for n in nodes:
        by_name.setdefault(n.name, []).append(n.index)
    index = {}
    for key in keys:
        i, j = _entry_of(key, nodes, by_name)
        if not 0 <= j < len(nodes[i].out_shapes):
            raise ValueError(f"tensor {key!r}: node {i} ({nodes[i].name}) has no output {j}")
        if (i, j) in index:
            raise ValueError(f"tensors {index[(i, j)]!r} and {key!r} are both output {j} of node {i}")
        index[(i, j)] = key
    return index


def _entry_of(key: str, nodes: list[NodeInfo], by_name: dict[str, list[int]]) -> tuple[int, int]:
    for form in _KEY_FORMATS:
        m = form.match(key)
        if m and "i" in m.groupdict():  # v0.9+: the key names its node
            i = int(m["i"])
            if i >= len(nodes) or nodes[i].name != m["name"]:
                raise ValueError(f"tensor {key!r} has no matching node in the graph")
            return i, int(m["j"])
        if m and m["name"] in by_name:  # older: by node name (an older form may still fit otherwise)
            candidates = by_name[m["name"]]
            if len(candidates) > 1:
                raise ValueError(f"tensor {key!r}: {len(candidates)} nodes are named {m['name']!r} and "
                                 "keys of this TVM release do not say which")
            return candidates[0], int(m["j"])
    raise ValueError(f"tensor key {key!r} is in no format TVM's debug executor wrote "
                     "('<name>____topo-index:<i>____output-num:<j>' since v0.9)")


def is_current_key(key: str) -> bool:
    """True for a key in the v0.9+ format (the only one tvm_probe writes)."""
    return _KEY_FORMATS[0].match(key) is not None


def tensor_key(name: str, index: int, output: int) -> str:
    """The key of output ``output`` of node ``index`` in ``output_tensors.params`` (TVM v0.9+)."""
    return f"{name}____topo-index:{index}____output-num:{output}"


def sources_of(nodes: list[NodeInfo], graph: dict) -> tuple[SourceMap, Servings, dict[str, tuple[int, int]]]:
    """One source value per node output, named after its node, how it was served, and where it is.

    Keys are TVM's v0.9+ tensor keys (unique even where node names repeat).  ``param`` nodes
    are graph inputs (TVM passes weights as graph inputs too; the dump does not tell them
    apart); kernel outputs were captured, those of ``__nop`` (a reshape sharing its input's
    storage) are views.
    """
    sources, servings, where = SourceMap(), {}, {}
    keys = {(n.index, j): tensor_key(n.name, n.index, j) for n in nodes for j in range(len(n.out_shapes))}
    for n in nodes:
        inputs = tuple(keys[(i, j)] for i, k in n.inputs for j in range(len(nodes[i].out_shapes))
                       if k in (j, UNKNOWN_OUTPUT))  # all outputs of the producer when k is not known
        for j, (shape, dtype) in enumerate(zip(n.out_shapes, n.out_dtypes)):
            kernel = n.op == "tvm_op"
            sources.add(SourceValue(
                key=keys[(n.index, j)], node=n.name, op_type=n.symbol if kernel else "param", output_index=j,
                num_outputs=len(n.out_shapes), kind=Kind.VALUE if kernel else Kind.INPUT, topo_index=n.index,
                inputs=inputs, shape=shape, dtype=dtype))
            served = (Served.VIEW if n.symbol == NOP else Served.CAPTURED) if kernel else Served.INPUT
            servings[keys[(n.index, j)]] = Serving(served, n.index)
            where[keys[(n.index, j)]] = (n.index, j)
    sources.model_inputs = [keys[(int(i), 0)] for i in graph.get("arg_nodes", [])]
    sources.model_outputs = [keys[(int(h[0]), int(h[1]))] for h in graph.get("heads", [])]
    return sources, servings, where
