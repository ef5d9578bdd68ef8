"""The graph JSON and the Chrome trace of a dump, node for node as TVM's graph debug executor wrote them.

TVM's graph debug executor (``python/tvm/contrib/debugger/debug_result.py`` up to v0.19, the last
release that had it) saved the graph executor's JSON after rewriting each node for its readers:

- an input or weight (``"op": "null"``) became ``{"op": "param", "name", "inputs": [],
  "attrs": {"T": "type: <dtype>"}, "shape"}``;
- a kernel call (``"op": "tvm_op"``) became ``{"op": <func_name>, "name", "attrs": {func_name,
  flatten_data, num_inputs, num_outputs, ..., "T": "type: <dtype>"}, "inputs": [<names of the
  input nodes>], "shape"}``; ``T`` and ``shape`` are those of the node's first output;
- ``arg_nodes``, ``heads``, ``node_row_ptr`` and the top-level ``attrs`` (``shape``, ``dltype``,
  ``storage_id``: one entry per node output) stayed as the graph executor had them.

:func:`graph_json` writes exactly that, and puts what tvm_probe adds under a ``"tvm_probe"`` key
of each node, which readers of TVM's dumps never look at: the graph entries ``[node, output]`` of
the inputs (TVM's ``inputs`` names a node, not which of its outputs), the source names of each
output and those kept inside the kernel, the call's occurrence among calls of the same kernel,
whether it is a zero-copy view, and how many constant arguments it takes.  Weights are not graph
nodes in a tvm_probe dump (they are constants of the compiled module), so ``num_inputs`` counts
graph inputs only, as in TVM, where it always equals ``len(inputs)``.  ``storage_id`` gives each
dumped tensor its own id: the dump holds one copy per output, whatever memory the VM reused.

:func:`read_graph` reads both a tvm_probe graph and one TVM wrote (every TVM release that had the
debug executor wrote nodes this way).  :func:`chrome_trace` / :func:`read_times` write and read
the trace: tvm_probe's names each kernel's node in ``args.node``; TVM's has one begin/end pair per
node, inputs included, in node order.

Everything here is plain JSON and :class:`~tvm_probe.core.results.NodeInfo`; no TVM.
"""
from __future__ import annotations

from ..core.results import NodeInfo

# The file names of TVM's debug dump layout (what v0.19's debug executor wrote, and we write).
DEVICE_DIR_PREFIX = "_tvmdbg_device_"
GRAPH = "_tvmdbg_graph_dump.json"
TENSORS = "output_tensors.params"
TRACE = "_tvmdbg_execution_trace.json"

EXTRA = "tvm_probe"  # the per-node key holding what tvm_probe adds
NOP = "__nop"  # TVM's graph-executor kernel for a reshape that shares its input's storage
UNKNOWN_OUTPUT = -1  # output number of an input whose producer has several outputs, in TVM's dumps


# ---------------------------------------------------------------------------------- writing
def graph_json(nodes: list[NodeInfo], model_outputs: list[str]) -> dict:
    """The ``_tvmdbg_graph_dump.json`` of ``nodes``; ``model_outputs`` (source keys) become heads."""
    shapes, dtypes, row_ptr = [], [], [0]
    for n in nodes:
        shapes += [list(s) for s in n.out_shapes]
        dtypes += list(n.out_dtypes)
        row_ptr.append(len(shapes))
    return {
        "nodes": [_node_entry(n, nodes) for n in nodes],
        "arg_nodes": [n.index for n in nodes if n.op == "null"],
        "heads": _heads(nodes, model_outputs),
        "attrs": {"shape": ["list_shape", shapes], "storage_id": ["list_int", list(range(len(shapes)))],
                  "dltype": ["list_str", dtypes]},
        "node_row_ptr": row_ptr,
    }


def _node_entry(n: NodeInfo, nodes: list[NodeInfo]) -> dict:
    """One node as debug_result.py left it (same keys, same order), plus our extras."""
    type_attr = "type: " + (n.out_dtypes[0] if n.out_dtypes else "")
    shape = list(n.out_shapes[0]) if n.out_shapes else []
    extra = {"source_names": [list(keys) for keys in n.output_keys]}
    if n.op == "null":
        return {"op": "param", "name": n.name, "inputs": [], "attrs": {"T": type_attr}, "shape": shape,
                EXTRA: extra}
    extra.update({"inputs": [[i, k] for i, k in n.inputs], "occurrence": n.occurrence, "view": n.is_view,
                  "const_inputs": n.const_inputs, "interior_source_names": list(n.interior_keys)})
    attrs = {"func_name": n.symbol, "flatten_data": "0", "num_inputs": str(len(n.inputs)),
             "num_outputs": str(len(n.out_shapes)), "T": type_attr}
    return {"op": n.symbol, "name": n.name, "attrs": attrs, "inputs": [nodes[i].name for i, _ in n.inputs],
            "shape": shape, EXTRA: extra}


def _heads(nodes: list[NodeInfo], model_outputs: list[str]) -> list[list[int]]:
    """``[node, output, 0]`` of each model output a node outputs, in model-output order.

    A model output that is no node's output (a constant, or a value kept inside a fused
    kernel) has no graph entry, so no head.
    """
    entry_of = {}
    for n in nodes:
        for j, keys in enumerate(n.output_keys):
            for key in keys:
                entry_of.setdefault(key, [n.index, j, 0])
    return [entry_of[k] for k in model_outputs if k in entry_of]


def chrome_trace(nodes: list[NodeInfo]) -> dict:
    """Per-kernel times as a Chrome trace (begin/end events in microseconds, ``args.node``)."""
    events = []
    for n in nodes:
        if n.start_us is None or n.time_us is None:
            continue
        common = {"name": n.name, "cat": "view" if n.is_view else "kernel", "pid": 1, "tid": 1}
        events.append({**common, "ph": "B", "ts": n.start_us, "args": {"node": n.index}})
        events.append({**common, "ph": "E", "ts": n.start_us + n.time_us})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


# ---------------------------------------------------------------------------------- reading
def read_graph(graph: dict, *, extras: bool) -> list[NodeInfo]:
    """The nodes of a graph dump; ``extras``: it was written by tvm_probe (else by TVM).

    Every node must be a ``param`` or a kernel (``attrs.func_name``).  Without extras, inputs
    are resolved from node names (the nearest earlier node of that name) and an input taken
    from a node with several outputs gets output number :data:`UNKNOWN_OUTPUT`: TVM's dump
    does not say which output it was.  ``output_keys`` / ``interior_keys`` stay empty there.

    Raises:
        ValueError, KeyError, TypeError, IndexError: the graph is malformed (the message or
        key names what; callers turn it into a one-line dump error).
    """
    entries = graph["nodes"]
    shapes = _typed_attr(graph, "shape", "list_shape")
    dtypes = _typed_attr(graph, "dltype", "list_str")
    if not isinstance(entries, list) or len(shapes) != len(dtypes):
        raise ValueError("'nodes' is not a list, or attrs.shape and attrs.dltype differ in length")
    row_ptr = _row_ptr(graph, entries, len(shapes))
    nodes: list[NodeInfo] = []
    position: dict[str, int] = {}  # node name -> index of its latest node so far
    calls: dict[str, int] = {}  # kernel symbol -> calls so far
    for i, entry in enumerate(entries):
        lo, hi = row_ptr[i], row_ptr[i + 1]
        node = NodeInfo(index=i, name=str(entry["name"]), op="tvm_op" if _is_kernel(entry) else "null",
                        out_shapes=[tuple(int(d) for d in s) for s in shapes[lo:hi]],
                        out_dtypes=[str(d) for d in dtypes[lo:hi]])
        if node.op == "tvm_op":
            node.symbol = str(entry["attrs"]["func_name"])
            node.inputs = _inputs(entry, nodes, position)
            node.occurrence = calls.get(node.symbol, 0)
            node.is_view = node.symbol == NOP
            calls[node.symbol] = node.occurrence + 1
        if extras:
            _apply_extras(node, entry[EXTRA], nodes)
        nodes.append(node)
        position[node.name] = i
    return nodes


def _row_ptr(graph: dict, entries: list, num_entries: int) -> list[int]:
    """Where each node's outputs start in attrs.shape / attrs.dltype, counted as TVM did and
    checked against ``node_row_ptr`` (TVM's reader ignored it, so we do not require it)."""
    row_ptr = [0]
    for i, entry in enumerate(entries):
        row_ptr.append(row_ptr[-1] + _num_outputs(i, entry))
    if row_ptr[-1] != num_entries or graph.get("node_row_ptr", row_ptr) != row_ptr:
        raise ValueError(f"the nodes have {row_ptr[-1]} outputs, but attrs.shape has {num_entries} entries "
                         "or node_row_ptr disagrees")
    return row_ptr


def _typed_attr(graph: dict, name: str, kind: str) -> list:
    """``graph.attrs[name]``, a ``[kind, list]`` pair as the graph executor writes it."""
    pair = graph["attrs"][name]
    if not isinstance(pair, list) or len(pair) != 2 or pair[0] != kind or not isinstance(pair[1], list):
        raise ValueError(f"attrs.{name} is not ['{kind}', [...]]")
    return pair[1]


def _is_kernel(entry: dict) -> bool:
    attrs = entry.get("attrs")
    return isinstance(attrs, dict) and "func_name" in attrs


def _num_outputs(index: int, entry: dict) -> int:
    """1 for a param, ``attrs.num_outputs`` for a kernel (as debug_result.py counts them)."""
    if not isinstance(entry, dict):
        raise ValueError(f"node {index} is not an object")
    if _is_kernel(entry):
        count = int(entry["attrs"]["num_outputs"])
        if count < 1:
            raise ValueError(f"node {index} ({entry.get('name')!r}) has num_outputs {count}")
        return count
    if entry.get("op") != "param":
        raise ValueError(f"node {index} ({entry.get('name')!r}) is neither a 'param' nor a kernel "
                         "(no attrs.func_name)")
    return 1


def _inputs(entry: dict, earlier: list[NodeInfo], position: dict[str, int]) -> list[tuple[int, int]]:
    """Graph entries of a kernel's inputs, from the names TVM's dump gives (nearest earlier node)."""
    inputs = []
    for name in entry["inputs"]:
        if not isinstance(name, str) or name not in position:
            raise ValueError(f"node {len(earlier)} ({entry['name']!r}) has input {name!r}, "
                             "which is no earlier node")
        producer = earlier[position[name]]
        inputs.append((producer.index, 0 if len(producer.out_shapes) == 1 else UNKNOWN_OUTPUT))
    return inputs


def _apply_extras(node: NodeInfo, extra: dict, earlier: list[NodeInfo]) -> None:
    """Fill ``node`` from tvm_probe's per-node extras, checking them against TVM's fields."""
    node.output_keys = [[str(k) for k in keys] for keys in extra["source_names"]]
    if len(node.output_keys) != len(node.out_shapes):
        raise ValueError(f"node {node.index} has {len(node.out_shapes)} outputs but source names for "
                         f"{len(node.output_keys)}")
    if node.op == "null":
        return
    named = node.inputs  # resolved from TVM's input names by _inputs
    node.inputs = [(int(i), int(k)) for i, k in extra["inputs"]]
    for i, k in node.inputs:
        if not 0 <= i < len(earlier) or not 0 <= k < len(earlier[i].out_shapes):
            raise ValueError(f"node {node.index} has input [{i}, {k}], which is no output of an earlier node")
    if [earlier[i].name for i, _ in node.inputs] != [earlier[i].name for i, _ in named]:
        raise ValueError(f"node {node.index}: the input names and tvm_probe's input entries disagree")
    node.occurrence = int(extra["occurrence"])
    node.is_view = bool(extra["view"])
    node.const_inputs = int(extra["const_inputs"])
    node.interior_keys = [str(k) for k in extra["interior_source_names"]]


def read_times(nodes: list[NodeInfo], trace: dict, *, by_order: bool) -> None:
    """Set ``start_us`` / ``time_us`` of the nodes from a Chrome trace of begin/end pairs.

    ``by_order`` (TVM's trace): the k-th pair is node k, every node has one (an input's
    lasts 0: nothing ran), and its name must be node k's; inputs get no time.  Otherwise
    (tvm_probe's trace) each begin event names its node in ``args.node``.

    Raises:
        ValueError, KeyError, TypeError: the trace is malformed or does not fit the graph.
    """
    pairs = _pairs(trace["traceEvents"])
    if by_order and len(pairs) != len(nodes):
        raise ValueError(f"the trace times {len(pairs)} nodes but the graph has {len(nodes)}")
    for k, (begin, end) in enumerate(pairs):
        index = k if by_order else int(begin["args"]["node"])
        if not 0 <= index < len(nodes) or nodes[index].name != begin["name"]:
            raise ValueError(f"trace event {begin['name']!r} does not match node {index} of the graph")
        if nodes[index].op == "tvm_op":
            nodes[index].start_us = float(begin["ts"])
            nodes[index].time_us = float(end["ts"]) - float(begin["ts"])


def _pairs(events: list) -> list[tuple[dict, dict]]:
    """(begin, end) event pairs in the order of their begin events; each end closes the last
    open begin of its name."""
    pairs, open_ = [], {}
    for event in events:
        if event["ph"] == "B":
            pairs.append([event, None])
            open_.setdefault(event["name"], []).append(len(pairs) - 1)
        elif event["ph"] == "E":
            stack = open_.get(event["name"])
            if not stack:
                raise ValueError(f"trace end event {event['name']!r} has no begin event")
            pairs[stack.pop()][1] = event
    unclosed = [begin["name"] for begin, end in pairs if end is None]
    if unclosed:
        raise ValueError(f"trace begin event {unclosed[0]!r} has no end event")
    return [(begin, end) for begin, end in pairs]
