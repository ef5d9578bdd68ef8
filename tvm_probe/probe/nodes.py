"""The graph nodes a probe shows (:attr:`Probe.nodes`): made from the kernel map, then given
each run's times (and, for symbolic shapes, its sizes)."""
from __future__ import annotations

from ..capture.executor import Capture
from ..core.results import NodeInfo
from ..kernel_map import ArgKind


def _declared(shape) -> tuple:
    """An input's declared shape; one without a rank (``None``) shows as one symbolic dimension
    until a run gives its shape (a symbolic shape is replaced by each run's: :func:`show_run`)."""
    return ("any rank",) if shape is None else tuple(shape)


def static_nodes(inputs, sources, sites) -> list[NodeInfo]:
    """One node per model input (``inputs``: InputSpecs), then one per kernel call site."""
    n_in = len(inputs)
    # (a function's arguments may be objects — a KV cache, a shape — that are no source values)
    nodes = [NodeInfo(index=i, name=s.name, op="null", out_shapes=[_declared(s.shape)], out_dtypes=[s.dtype],
                      output_keys=[[s.name] if s.name in sources else []])
             for i, s in enumerate(inputs)]
    for site in sites:
        args = [(n_in + a.node, a.output) if a.kind is ArgKind.NODE else (a.input_index, 0)
                for a in site.args if a.kind in (ArgKind.NODE, ArgKind.INPUT)]
        name = site.symbol if site.occurrence == 0 else f"{site.symbol}_{site.occurrence}"
        nodes.append(NodeInfo(
            index=n_in + site.index, name=name, op="tvm_op", symbol=site.symbol,
            occurrence=site.occurrence, is_view=site.is_view, inputs=args,
            const_inputs=sum(a.kind is ArgKind.CONST for a in site.args),
            out_shapes=list(site.out_shapes), out_dtypes=list(site.out_dtypes),
            output_keys=[list(k) for k in site.output_keys], interior_keys=list(site.interior_keys)))
    return nodes


def show_run(nodes: list[NodeInfo], n_in: int, capture: Capture, previous: Capture | None, sites,
             symbolic: bool) -> None:
    """The nodes take the times of ``capture`` (after ``previous``, the capture they showed), and
    for symbolic shapes its sizes."""
    start_us, time_us = capture.kernel_times()
    if time_us or (previous is not None and previous.kernel_times()[1]):  # (untimed after untimed: nothing to do)
        for node in nodes[n_in:]:
            node.time_us = time_us.get(node.index - n_in)
            node.start_us = start_us.get(node.index - n_in)
    if symbolic:
        _record_sizes(nodes, n_in, capture, sites)


def _record_sizes(nodes: list[NodeInfo], n_in: int, capture: Capture, sites) -> None:
    """Symbolic dimensions: the nodes take this run's sizes where the run shows them."""
    for node, array in zip(nodes[:n_in], capture.inputs):
        if hasattr(array, "shape"):  # (a call's arguments may be objects: a KV cache, a shape)
            node.out_shapes = [tuple(int(d) for d in array.shape)]
    for node in nodes[n_in:]:
        site = node.index - n_in
        outs = capture.outputs[site] if site in capture.outputs else None
        node.out_shapes = [tuple(a.shape) for a in outs] if outs is not None else list(sites[site].out_shapes)
