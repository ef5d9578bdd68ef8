"""Pipeline split: cut a model into stages, exporting every value that crosses a cut.

The classic mistake when splitting BERT by hand (layers 0–3 | 4–11) is to pass only the hidden
state: the extended attention mask is computed once before layer 0 and used by every layer, so
the second stage silently lacks it.  tvm_probe knows every value and who uses it:

* a cut is a position in the source graph's node order (which ONNX requires to be topological):
  after the last node matching a source name, a scope (``layer_._3/output/LayerNorm``) or a glob;
* every value produced before a cut and used after it crosses the cut — hidden states, masks,
  constants and shape values alike — and becomes an output of the stage that made it;
* each stage is an ONNX sub-model compiled by TVM as a :class:`~tvm_probe.Probe`, so it can be
  run, probed and dumped like a whole model.

    plan = split(model, cuts=["layer_._3/output/LayerNorm"])
    outputs = run_pipeline(plan, inputs)
    plan.table()                     # per cut: crossing values, shape, dtype, bytes per inference
    balance(model, 2, inputs)        # 2 cuts at layer boundaries that even out stage time

Stages can run on different devices over TVM RPC (each a ``tvm-probe serve``)::

    run_pipeline(plan, inputs, devices=[None, {"host": "board", "port": 9190}])
    plan.cut_table()                 # per cut: bytes and time out of one device and into the next

The host drives the pipeline: a stage's outputs come back to it and go on to the stages that
use them, so a cut costs a download from the device before it and an upload to the one after.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import combinations
from typing import Mapping, Sequence

import numpy as np

from ..capture.remote.spec import parse_remote
from ..core.errors import ProbeError
from ..core.names import NameIndex, is_pattern
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, name_matches
from ..core.sources import Kind, SourceMap
from ..importer.onnx import import_onnx, load_onnx
from ..importer.onnx_graph import node_inputs, outside_reads, sub_model
from ..probe.probe import Probe

# A path component naming one repeated layer: layer_._3, layer.3, layers.3, h.3, block_3 ...
LAYER_RE = re.compile(r"(?:^|/)((?:[\w.]*?[/.])?(?:layer|layers|block|blocks|h)(?:_\._|[._])?\d+)(?=/|$)")


class SplitError(ProbeError):
    """A cut names nothing, does not separate the graph, or cuts are out of order."""


@dataclass
class Stage:
    """One stage: an ONNX sub-model, compiled; inputs and outputs named by source names."""

    index: int
    model: object
    probe: object
    inputs: list[str]
    outputs: list[str]
    first_node: int
    last_node: int
    _remote: dict = field(default_factory=dict, repr=False, compare=False)  # device → probe of this stage there

    def run(self, values: Mapping[str, np.ndarray], capture=None, device=None) -> dict[str, np.ndarray]:
        """Run this stage on ``values`` (a superset of its inputs is fine), here or on ``device``."""
        return self.probe_on(device).run({name: values[name] for name in self.inputs}, capture=capture)

    def probe_on(self, device=None):
        """This stage's probe on ``device`` (a remote, see :mod:`tvm_probe.capture.remote`; None: this
        machine).  The compiled stage is uploaded once per device, not compiled again."""
        if device is None:
            return self.probe

        spec = parse_remote(device)
        if spec not in self._remote:
            self._remote[spec] = type(self.probe)(self.probe.imported, self.probe.built, self.probe.kernel_map,
                                                  remote=spec)
        return self._remote[spec]


@dataclass(frozen=True)
class CutCost:
    """What one cut cost in a run of the pipeline: data out of the device before it and into the
    device after it (through this host, which drives the pipeline).

    Attributes:
        cut: the cut's index; ``after``: where it is.
        source, target: the devices of the stages before and after it (``local`` or where).
        bytes_out, out_us: the outputs of the stage before the cut, brought to this host.
        bytes_in, in_us: the inputs of the stage after it that earlier stages made, sent to it.
    """

    cut: int
    after: str
    source: str
    target: str
    bytes_out: int
    out_us: float
    bytes_in: int
    in_us: float

    @property
    def total_us(self) -> float:
        return self.out_us + self.in_us


@dataclass
class SplitPlan:
    """Stages in order and what crosses each cut."""

    stages: list[Stage]
    cut_after: list[str]
    crossings: list[list[str]]
    sources: SourceMap
    stage_time_us: list[float] = field(default_factory=list)
    cut_costs: list[CutCost] = field(default_factory=list)  # of the last run_pipeline

    def table(self):
        """DataFrame: per cut, every crossing value with shape, dtype, bytes per inference."""
        import pandas as pd

        rows = []
        for cut, (after, keys) in enumerate(zip(self.cut_after, self.crossings)):
            for key in keys:
                value = self.sources[key]
                nbytes = int(np.prod(value.shape, dtype=np.int64)) * np.dtype(value.dtype).itemsize
                rows.append({"cut": cut, "after": after, "value": value.display_name, "tensor": key,
                             "op_type": value.op_type, "shape": value.shape, "dtype": value.dtype,
                             "bytes": nbytes})
        return pd.DataFrame(rows, columns=["cut", "after", "value", "tensor", "op_type", "shape", "dtype", "bytes"])

    def stage_table(self):
        """DataFrame: per stage, its node range, inputs/outputs count, measured time and share."""
        import pandas as pd

        total = sum(self.stage_time_us) or None
        return pd.DataFrame([{
            "stage": s.index, "first_node": self.sources_name(s.first_node),
            "last_node": self.sources_name(s.last_node), "inputs": len(s.inputs), "outputs": len(s.outputs),
            "time_us": self.stage_time_us[s.index] if self.stage_time_us else None,
            "time_share": (self.stage_time_us[s.index] / total) if total else None,
        } for s in self.stages])

    def cut_table(self):
        """DataFrame: per cut of the last :func:`run_pipeline`, bytes and time out of the device
        before it and into the device after it (see :class:`CutCost`)."""
        import pandas as pd

        columns = ["cut", "after", "source", "target", "bytes_out", "out_us", "bytes_in", "in_us", "total_us"]
        return pd.DataFrame([{**{c: getattr(k, c) for c in columns[:-1]}, "total_us": k.total_us}
                             for k in self.cut_costs], columns=columns)

    def measure(self, inputs: Mapping[str, np.ndarray], runs: int = 3, devices=None) -> list[float]:
        """Median run time of each stage's executable over ``runs`` chained runs (µs), each
        stage on its device (see :func:`run_pipeline`)."""
        samples = []
        devices = _stage_devices(self.stages, devices)
        for _ in range(max(1, runs)):
            run_pipeline(self, inputs, devices=devices)
            samples.append([s.probe_on(d).last_run_us for s, d in zip(self.stages, devices)])
        self.stage_time_us = [float(t) for t in np.median(np.array(samples), axis=0)]
        return self.stage_time_us

    def sources_name(self, topo: int) -> str:
        return next((v.node or v.key for v in self.sources if v.topo_index == topo), str(topo))


# ------------------------------------------------------------------------------- cutting
def _cut_position(name: str, proto, names: NameIndex, sources: SourceMap) -> int:
    """Topo index of the last node the cut ``name`` covers (value name, scope or glob)."""
    node_names = [n.name for n in proto.graph.node]
    if is_pattern(name):
        hits = [i for i, n in enumerate(node_names) if n and name_matches(n, name)]
    else:
        prefixes = _scope_prefixes(name.strip("/") + "/", node_names)
        if len(prefixes) > 1:
            shown = ", ".join(sorted(repr(p.rstrip("/")) for p in prefixes)[:4])
            raise SplitError(f"cut {name!r} matches {len(prefixes)} scopes ({shown}): give a longer name")
        hits = [i for i, n in enumerate(node_names) if prefixes and n.startswith(next(iter(prefixes)))]
        if not hits:
            try:
                key = names.resolve(name)
            except ProbeError:
                raise SplitError(f"cut {name!r} names no node, scope or value of the model "
                                 "(list names with probe.sources)") from None
            hits = [sources[key].topo_index] if sources[key].topo_index >= 0 else []
    if not hits:
        raise SplitError(f"cut {name!r} matches no node of the model")
    return max(hits)


def _scope_prefixes(scope: str, node_names) -> set[str]:
    """The distinct full prefixes ``.../<scope>/`` under which some node is named."""
    prefixes = set()
    for n in node_names:
        if n.startswith(scope):
            prefixes.add(scope)
        elif "/" + scope in n:
            prefixes.add(n[: n.index("/" + scope) + 1 + len(scope)])
    return prefixes


def _consumers(proto) -> dict[str, list[int]]:
    """Tensor name → positions of the nodes that read it, inside their subgraphs (If) too."""

    users: dict[str, list[int]] = {}
    for i, node in enumerate(proto.graph.node):
        for name in node_inputs(node):
            users.setdefault(name, []).append(i)
    return users


def _crossing(proto, sources: SourceMap, position: int, users) -> list[str]:
    """Values produced at or before ``position`` and used after it (or graph outputs)."""
    outputs = {o.name for o in proto.graph.output}
    crossing = []
    for value in sources:
        if value.kind in (Kind.PARAM, Kind.INPUT) or value.topo_index > position:
            continue
        if any(u > position for u in users.get(value.key, ())) or value.key in outputs:
            crossing.append(value.key)
    return crossing


def _stage_model(proto, sources: SourceMap, lo: int, hi: int, outputs: list[str], index: int):
    """ONNX sub-model of nodes ``lo..hi`` producing ``outputs``; inputs are what it reads from
    outside (inside its If branches too)."""
    from onnx import helper


    nodes = list(proto.graph.node[lo: hi + 1])
    inits = {t.name: t for t in proto.graph.initializer}
    needed = outside_reads(nodes)
    inputs = [i for i in needed if i not in inits]
    weights = [inits[i] for i in needed if i in inits]

    def info(key):
        value = sources[key]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(value.dtype))
        return helper.make_tensor_value_info(key, elem, list(value.shape))

    model = sub_model(proto, nodes, [info(i) for i in inputs], [info(o) for o in outputs], weights,
                      name=f"{proto.graph.name or 'model'}_stage{index}")
    return model, inputs


def split(model, cuts: Sequence[str], target=DEFAULT_TARGET, pipeline=DEFAULT_PIPELINE, shapes=None) -> SplitPlan:
    """Cut ``model`` after each of ``cuts`` (in model order) and compile every stage.

    Args:
        model: an ONNX path or ``onnx.ModelProto``.
        cuts: source names, scopes (``layer_._3/output/LayerNorm``) or glob patterns; the cut
            goes after the last node each one covers.
        target, pipeline, shapes: as for :meth:`Probe.from_onnx`, for every stage.

    Raises:
        SplitError: a cut names nothing, cuts are out of order or equal, a stage would be
            empty, or nothing crosses a cut (it does not separate the graph).
    """

    proto = load_onnx(model)
    imported = import_onnx(proto, shapes)
    sources, names = imported.sources, NameIndex(imported.sources)
    if not cuts:
        raise SplitError("no cuts given: name at least one value or scope to cut after")
    positions = [_cut_position(c, proto, names, sources) for c in cuts]
    for (a, pa), (b, pb) in zip(zip(cuts, positions), zip(cuts[1:], positions[1:])):
        if pb <= pa:
            raise SplitError(f"cuts are out of order: {b!r} comes at or before {a!r} in the model; "
                             "list cuts in model order")
    last = len(proto.graph.node) - 1
    if positions[-1] >= last:
        raise SplitError(f"cut {cuts[-1]!r} is after the last node: the last stage would be empty")
    users = _consumers(proto)
    crossings = []
    for cut, pos in zip(cuts, positions):
        keys = [k for k in _crossing(proto, sources, pos, users) if k not in sources.model_outputs]
        runtime = [k for k in keys if sources[k].kind is not Kind.CONSTANT]
        if not runtime:
            raise SplitError(f"cut {cut!r} does not separate the graph: no computed value crosses it")
        crossings.append(keys)
    bounds = [-1] + positions + [last]
    stages = []
    model_outputs = set(sources.model_outputs)
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i] + 1, bounds[i + 1]
        later_users = {k for k in sources.values if any(u > hi for u in users.get(k, ()))}
        outs = [v.key for v in sources if lo <= v.topo_index <= hi and v.kind is not Kind.PARAM
                and (v.key in later_users or v.key in model_outputs)]
        sub, inputs = _stage_model(proto, sources, lo, hi, outs, i)
        probe = Probe.from_onnx(sub, target=target, pipeline=pipeline)
        stages.append(Stage(i, sub, probe, inputs, outs, lo, hi))
    return SplitPlan(stages=stages, cut_after=list(cuts), crossings=crossings, sources=sources)


def run_pipeline(plan: SplitPlan | Sequence[Stage], inputs: Mapping[str, np.ndarray],
                 capture=None, devices=None) -> dict[str, np.ndarray]:
    """Run the stages in order, each fed from the model inputs and earlier stages' outputs.

    Args:
        plan: a :class:`SplitPlan` (or its stages).
        inputs: the model inputs.
        capture: passed to every stage's run, so each stage can be probed afterwards
            (``plan.stages[1].probe_on(device).get(...)``).
        devices: where each stage runs, one entry per stage: None (this machine) or a remote
            device (``{"host": H, "port": P}`` or ``{"tracker": "H:P", "key": K}``, see
            :mod:`tvm_probe.capture.remote`).  Defaults to every stage here.

    Returns:
        The model outputs.  On a SplitPlan, :attr:`SplitPlan.cut_costs` (and
        :meth:`SplitPlan.cut_table`) then say what each cut cost in this run.
    """
    stages = plan.stages if isinstance(plan, SplitPlan) else list(plan)
    devices = _stage_devices(stages, devices)
    values = dict(inputs)
    probes = []
    for stage, device in zip(stages, devices):
        missing = [n for n in stage.inputs if n not in values]
        if missing:
            raise SplitError(f"stage {stage.index} needs {missing[0]!r}, which no input or earlier stage provides")
        values.update(stage.run(values, capture=capture, device=device))
        probes.append(stage.probe_on(device))
    if isinstance(plan, SplitPlan):
        plan.cut_costs = [_cut_cost(plan, i, probes, values, inputs) for i in range(len(stages) - 1)]
    final = stages[-1].probe.imported.sources.model_outputs if stages else []
    outputs = plan.sources.model_outputs if isinstance(plan, SplitPlan) else final
    return {name: values[name] for name in outputs if name in values}


def _stage_devices(stages: Sequence[Stage], devices) -> list:
    """One device per stage (None: this machine), checked."""
    if devices is None:
        return [None] * len(stages)
    devices = list(devices)
    if len(devices) != len(stages):
        raise SplitError(f"devices: give one per stage ({len(stages)}), got {len(devices)} (None runs a stage "
                         "on this machine)")
    return devices


def _cut_cost(plan: SplitPlan, i: int, probes, values, inputs) -> CutCost:
    """What cut ``i`` cost in the run whose probes (one per stage) and values are given."""
    before, after = probes[i], probes[i + 1]
    sent_out = before.last_transfer_us["outputs"]
    sent_in = {n: t for n, t in after.last_transfer_us["inputs"].items() if n not in inputs}
    return CutCost(cut=i, after=plan.cut_after[i], source=before.remote or "local", target=after.remote or "local",
                   bytes_out=sum(int(values[n].nbytes) for n in sent_out), out_us=float(sum(sent_out.values())),
                   bytes_in=sum(int(values[n].nbytes) for n in sent_in), in_us=float(sum(sent_in.values())))


# ------------------------------------------------------------------------------- balancing
def layer_boundaries(model) -> list[tuple[str, int]]:
    """``(layer scope, topo index of its last node)`` for every repeated layer, in model order."""

    proto = load_onnx(model)
    last: dict[str, int] = {}
    for i, node in enumerate(proto.graph.node):
        m = LAYER_RE.search(node.name or "")
        if m:
            scope = node.name[: m.end(1)]
            last[scope] = i
    return sorted(last.items(), key=lambda kv: kv[1])


def node_times(probe) -> np.ndarray:
    """Measured time of each source-graph node position, from a probe's last run.

    A kernel's time is charged to the latest source node it computes (fused kernels hold several).
    """
    n = 1 + max((v.topo_index for v in probe.sources_map), default=0)
    times = np.zeros(n)
    for node in probe.node_infos:
        keys = [k for ks in node.output_keys for k in ks] + node.interior_keys
        topo = [probe.sources_map[k].topo_index for k in keys if probe.sources_map[k].topo_index >= 0]
        if topo and node.time_us:
            times[max(topo)] += node.time_us
    return times


def balance(model, n: int, inputs: Mapping[str, np.ndarray], target=DEFAULT_TARGET, pipeline=DEFAULT_PIPELINE,
            runs: int = 3, probe=None) -> tuple[list[str], float]:
    """Propose ``n`` cuts at layer boundaries that even out measured stage time.

    Times come from ``runs`` probe runs of the whole model (median per kernel); pass ``probe``
    (the whole model, already compiled) to skip compiling it again.  Returns the cuts (layer
    scopes) and the evenness: slowest stage time / mean stage time (1.0 is perfect).
    """

    boundaries = layer_boundaries(model)
    if n < 1 or n >= len(boundaries) + 1:
        raise SplitError(f"cannot place {n} cuts: the model has {len(boundaries)} layer boundaries")
    probe = probe or Probe.from_onnx(model, target=target, pipeline=pipeline)
    samples = []
    for _ in range(max(1, runs)):
        probe.run(inputs, capture=None, kernel_times=True)
        samples.append(node_times(probe))
    cumulative = np.cumsum(np.median(np.stack(samples), axis=0))
    total = cumulative[-1]
    positions = [pos for _, pos in boundaries if pos < len(cumulative) - 1]
    best, best_cost = None, np.inf
    for combo in combinations(positions, n):
        edges = [0.0] + [cumulative[p] for p in combo] + [total]
        cost = max(b - a for a, b in zip(edges, edges[1:]))
        if cost < best_cost:
            best, best_cost = combo, cost
    scope_of = {pos: scope for scope, pos in boundaries}
    evenness = best_cost / (total / (n + 1)) if total else 1.0
    return [scope_of[p] for p in best], float(evenness)
