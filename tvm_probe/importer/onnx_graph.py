"""ONNX sub-models: what a set of nodes reads from outside, and the model made of them.

One builder for every tool that carves a model: ``split`` (a stage per cut) and ``reduce``
(the smallest failing sub-model).  What a node reads includes the outer tensors its subgraphs
use (an ``If`` branch may read a value no node input names), so a value that crosses a cut only
inside an ``If`` still becomes an input of the sub-model that needs it.  Model-local functions
(``proto.functions``) and the opsets go with every sub-model.

onnx is imported lazily.
"""
from __future__ import annotations

from typing import Iterable, Sequence


def node_inputs(node) -> tuple[str, ...]:
    """Every tensor ``node`` reads: its inputs and the outer names its subgraphs (If, Loop) use."""
    names = [i for i in node.input if i]
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            defined = {i.name for i in sub.input} | {t.name for t in sub.initializer}
            for inner in sub.node:
                names += [i for i in node_inputs(inner) if i not in defined]
                defined.update(inner.output)
    return tuple(dict.fromkeys(names))


def outside_reads(nodes: Iterable) -> list[str]:
    """The tensors ``nodes`` read (subgraph reads included) that none of them produces, in order."""
    nodes = list(nodes)
    produced = {o for n in nodes for o in n.output if o}
    return list(dict.fromkeys(name for n in nodes for name in node_inputs(n) if name not in produced))


def sub_model(proto, nodes: Sequence, inputs: Sequence, outputs: Sequence, initializers: Sequence = (),
              name: str | None = None, check: bool = True):
    """The ONNX model of ``nodes`` (in the order given: keep the source's topological order).

    Args:
        proto: the source ``ModelProto``: its opsets, IR version and local functions are kept.
        nodes: ``NodeProto``\\ s of ``proto``.
        inputs, outputs: ``ValueInfoProto``\\ s of the sub-model's graph inputs and outputs.
        initializers: ``TensorProto``\\ s (weights of ``proto``, or values made constants).
        name: the graph's name; defaults to the source graph's.
        check: run ``onnx.checker`` on the result.
    """
    import onnx
    from onnx import helper

    graph = helper.make_graph(list(nodes), name or proto.graph.name or "model", list(inputs), list(outputs),
                              list(initializers))
    model = helper.make_model(graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    if check:
        onnx.checker.check_model(model)
    return model
