"""The ONNX side of QDQ models: which ops of the float model a QDQ model quantizes, and the QDQ
model with some of them kept in float.  onnx only (no TVM, no onnxruntime).

A QDQ model (``onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ)``)
keeps every op of the float model under its name and wraps tensors in ``QuantizeLinear`` →
``DequantizeLinear`` pairs (``<tensor>_QuantizeLinear`` / ``_DequantizeLinear``); weights are
stored quantized and read through a ``DequantizeLinear``.  An op is *quantized* when it reads at
least one ``DequantizeLinear`` output.

**Keeping an op in float** (:func:`with_float_ops`): the op reads float values — each input it
reads through a ``DequantizeLinear`` is replaced by what was quantized: a weight by the float
model's own initializer (as onnxruntime's ``nodes_to_exclude`` leaves it), an activation by the
tensor its ``QuantizeLinear`` reads.  onnxruntime's ``nodes_to_exclude`` differs in one respect:
an activation whose producer is quantized stays quantized for the excluded op too, so excluding
one op can never undo an activation's quantization; here it does, for that op only.  Other
readers of the same tensor keep reading it quantized, and the op's output stays quantized for
the quantized ops that read it (their inputs are theirs to keep or not).  ``QuantizeLinear`` /
``DequantizeLinear`` nodes nothing reads any more are removed.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ...core.errors import ModelError

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
#: Quantized operators of onnxruntime's QOperator format: TVM 0.27's ONNX frontend has no converter
#: for them, so only the QDQ format can be built.
QOPERATORS = ("QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulNBits", "QLinearAdd", "QLinearMul")


class QuantizationError(ModelError):
    """The models given cannot be compared as a float model and its QDQ quantization."""


@dataclass(frozen=True)
class QuantizedOp:
    """An op of the float model that the QDQ model quantizes.

    Attributes:
        name: the node name (the same in both models).
        op_type: its ONNX op type.
        index: its position in the QDQ model's node list (topological order).
        tensor: its first output in the QDQ model (the value compared).
        float_tensor: the same output in the float model.
        dequantized: the input positions it reads through a ``DequantizeLinear``.
    """

    name: str
    op_type: str
    index: int
    tensor: str
    float_tensor: str
    dequantized: tuple[int, ...]


def quantized_ops(float_model, quantized_model) -> list[QuantizedOp]:
    """The ops of ``float_model`` that ``quantized_model`` quantizes, in its node order.

    Raises:
        QuantizationError: the quantized model is in the QOperator format, or quantizes no op
            of the float model (not its QDQ model).
    """
    _check_format(quantized_model)
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    producers = _producers(quantized_model)
    ops = []
    for i, node in enumerate(quantized_model.graph.node):
        if node.op_type in (QUANTIZE, DEQUANTIZE) or node.name not in float_nodes or not node.output:
            continue
        dequantized = tuple(j for j, name in enumerate(node.input)
                            if name and producers.get(name) is not None and producers[name].op_type == DEQUANTIZE)
        if dequantized:
            ops.append(QuantizedOp(node.name, node.op_type, i, node.output[0],
                                   float_nodes[node.name].output[0], dequantized))
    if not ops:
        raise QuantizationError("no op of the float model is quantized in the quantized model (none of its "
                                "nodes reads a DequantizeLinear): give the QDQ model of this float model "
                                "(quantize_static(..., quant_format=QuantFormat.QDQ)), nodes named as in it")
    return ops


def _check_format(model) -> None:
    qops = sorted({n.op_type for n in model.graph.node if n.op_type in QOPERATORS})
    if qops:
        raise QuantizationError(f"the quantized model uses {', '.join(qops)} (onnxruntime's QOperator format), "
                                "which TVM 0.27 cannot import: quantize with quant_format=QuantFormat.QDQ")


def _producers(model) -> dict:
    return {out: node for node in model.graph.node for out in node.output if out}


def with_float_ops(float_model, quantized_model, names: Iterable[str]):
    """A copy of ``quantized_model`` in which the ops ``names`` compute in float (see the module
    docstring); ``names`` are node names of :func:`quantized_ops`.

    Raises:
        QuantizationError: a name is not a quantized op of these models.
    """
    ops = {op.name: op for op in quantized_ops(float_model, quantized_model)}
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in ops]
    if unknown:
        raise QuantizationError(f"{unknown[0]!r} is not an op the quantized model quantizes: choose from "
                                f"{', '.join(list(ops)[:12])}{', ...' if len(ops) > 12 else ''}")
    edit = _FloatEdit(float_model, quantized_model)
    for name in names:
        op = ops[name]
        node = edit.graph.node[op.index]
        for j in op.dequantized:
            node.input[j] = edit.float_input(op, j, node.input[j])
    _prune(edit.graph)
    return edit.model


class _FloatEdit:
    """A copy of the QDQ model being edited so that some ops read float tensors, and where each
    op's float inputs are found (what :func:`with_float_ops` and :func:`switchable` share)."""

    def __init__(self, float_model, quantized_model):
        import onnx

        self.model = onnx.ModelProto()
        self.model.CopyFrom(quantized_model)
        self.graph, self.producers = self.model.graph, _producers(self.model)
        self.float_nodes = {n.name: n for n in float_model.graph.node if n.name}
        self.float_inits = {t.name: t for t in float_model.graph.initializer}
        self.present = {t.name for t in self.graph.initializer} | {i.name for i in self.graph.input}

    def float_input(self, op, j: int, dequantized: str) -> str:
        """The float tensor behind input ``j`` of ``op`` (``dequantized`` in the QDQ model): the
        float model's initializer of that input, else the tensor the QuantizeLinear before the
        DequantizeLinear reads, else ``dequantized`` itself (a weight stored quantized that the
        float model does not hold: nothing float to read)."""
        float_node = self.float_nodes[op.name]
        float_name = float_node.input[j] if j < len(float_node.input) else ""
        if float_name in self.float_inits:
            if float_name not in self.present:
                self.graph.initializer.append(self.float_inits[float_name])
                self.present.add(float_name)
                return float_name
            existing = next((t for t in self.graph.initializer if t.name == float_name), None)
            if existing is not None and existing.SerializeToString() == self.float_inits[float_name].SerializeToString():
                return float_name
        dq = self.producers.get(dequantized)
        q = self.producers.get(dq.input[0]) if dq is not None else None
        if q is not None and q.op_type == QUANTIZE:
            return q.input[0]
        return dequantized


def _prune(graph) -> None:
    """Remove Q/DQ nodes whose outputs nothing reads any more, and initializers nothing reads."""
    while True:
        read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [i for i, n in enumerate(graph.node) if n.op_type in (QUANTIZE, DEQUANTIZE)
                and not any(out in read for out in n.output)]
        if not dead:
            break
        for i in reversed(dead):
            del graph.node[i]
    read = {name for node in graph.node for name in node.input}
    keep = [t for t in graph.initializer if t.name in read or t.name in {o.name for o in graph.output}]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def switchable(float_model, quantized_model):
    """One model holding every single-op variant: ``(model, flags)``, ``flags`` mapping each
    quantized op's name to a boolean scalar input of ``model``.  Each input the op reads through a
    ``DequantizeLinear`` is read through ``Where(flag, <the float tensor>, <the dequantized one>)``
    instead, so that with the op's flag true it computes on what :func:`with_float_ops` would give
    it, and with every flag false the model computes what ``quantized_model`` does.  A ``Where``
    selects, it computes nothing: each op's own arithmetic is the same in every variant.
    """
    from onnx import TensorProto, helper

    ops = quantized_ops(float_model, quantized_model)
    edit = _FloatEdit(float_model, quantized_model)
    model, graph = edit.model, edit.graph
    flags, nodes = {}, [_copy(n) for n in graph.node]
    inserted: dict[int, list] = {}
    for k, op in enumerate(ops):
        flag = flags[op.name] = f"tvm_probe_keep_float_{k}"
        graph.input.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, []))
        node = nodes[op.index]
        for j in op.dequantized:
            dequantized = node.input[j]
            source = edit.float_input(op, j, dequantized)
            if source == dequantized:
                continue
            switched = f"{flag}_input{j}"
            inserted.setdefault(op.index, []).append(
                helper.make_node("Where", [flag, source, dequantized], [switched], name=switched))
            node.input[j] = switched
    del graph.node[:]
    for i, node in enumerate(nodes):
        graph.node.extend(inserted.get(i, []))
        graph.node.append(node)
    return model, flags


def _copy(node):
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def output_names(float_model, quantized_model) -> list[tuple[str, str]]:
    """(float model output, the QDQ model's output) pairs, by position."""
    f_out, q_out = [o.name for o in float_model.graph.output], [o.name for o in quantized_model.graph.output]
    if len(f_out) != len(q_out):
        raise QuantizationError(f"the float model has {len(f_out)} outputs and the quantized model {len(q_out)}: "
                                "give the QDQ model of this float model")
    return list(zip(f_out, q_out))
