"""The ONNX side of QDQ models: which ops of the float model a QDQ model quantizes, and the QDQ
model with some of them kept in float.  onnx only (no TVM); onnxruntime's quantizer registry says
which op types it quantizes.

A QDQ model (``onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QDQ)``)
keeps every op of the float model under its name and wraps tensors in ``QuantizeLinear`` →
``DequantizeLinear`` pairs (``<tensor>_QuantizeLinear`` / ``_DequantizeLinear``); weights are
stored quantized and read through a ``DequantizeLinear``.  An op is *quantized* when it reads at
least one ``DequantizeLinear`` output.

**What the quantizer folded.**  With asymmetric activations (its default) onnxruntime removes a
``Relu`` or ``Clip`` whose input it quantizes: the op before it writes the activation's output
name, and the ``QuantizeLinear``'s range ([0, max], or the Clip's) clips instead.  The QDQ model
then reads ``MatMul fc1 -> a1 -> Q/DQ``, where ``a1`` was the Relu's output in the float model.
Such an activation belongs to the op it was folded into (:attr:`QuantizedOp.folded`).

**Kept in float** (:func:`with_float_ops`) is what ``quantize_static(...,
nodes_to_exclude=[the op])`` writes from the same calibration (excluded, the op no longer
quantizes its output, so the activation after it is not folded either), built here from the two
models (nothing is calibrated again):

* the op reads the float model's own weights;
* a quantized tensor stays quantized while an op that quantizes it is left quantized: the op
  writing it (onnxruntime quantizes the outputs of the op types it quantizes) or another op
  reading it; every reader then reads it quantized, as onnxruntime wires it.  So keeping one op in
  float does not undo the quantization of an activation the op before it quantizes: keep both;
* where a quantization is dropped, what was folded into it comes back: the readers read the float
  model's value of that tensor (a folded Relu computed again on the op's output).

With every quantized op kept, the model computes the float model; with none, the QDQ model.
Where onnxruntime would calibrate a tensor anew, which the QDQ model does not record, the variant
keeps the parameters it has (:meth:`QDQPair.recalibrated`).  The op types that quantize are those
onnxruntime's ``quantize_static`` quantizes by default (no ``op_types_to_quantize``).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ...core.errors import ModelError

QUANTIZE, DEQUANTIZE = "QuantizeLinear", "DequantizeLinear"
#: Quantized operators of onnxruntime's QOperator format: TVM 0.27's ONNX frontend has no converter
#: for them, so only the QDQ format can be built.
QOPERATORS = ("QLinearConv", "QLinearMatMul", "QGemm", "ConvInteger", "MatMulNBits", "QLinearAdd", "QLinearMul")
#: What onnxruntime's QDQ quantizer removes when it quantizes their input (QDQRemovableActivation):
#: the QuantizeLinear after the op before them clips as they did.
FOLDED_ACTIVATIONS = ("Relu", "Clip")


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
        float_tensor: the same output in the float model (before any activation folded into it).
        dequantized: the input positions it reads through a ``DequantizeLinear``.
        folded: the float model's activations (Relu, Clip) the quantizer folded into its output.
    """

    name: str
    op_type: str
    index: int
    tensor: str
    float_tensor: str
    dequantized: tuple[int, ...]
    folded: tuple[str, ...] = ()


def quantized_ops(float_model, quantized_model) -> list[QuantizedOp]:
    """The ops of ``float_model`` that ``quantized_model`` quantizes, in its node order.

    Raises:
        QuantizationError: the quantized model is in the QOperator format, quantizes no op of the
            float model, or lacks an op of it the quantizer does not fold (not its QDQ model).
    """
    return list(QDQPair(float_model, quantized_model).ops)


def _check_format(model) -> None:
    qops = sorted({n.op_type for n in model.graph.node if n.op_type in QOPERATORS})
    if qops:
        raise QuantizationError(f"the quantized model uses {', '.join(qops)} (onnxruntime's QOperator format), "
                                "which TVM 0.27 cannot import: quantize with quant_format=QuantFormat.QDQ")


def _producers(model) -> dict:
    return {out: node for node in model.graph.node for out in node.output if out}


def _output_quantizing_types() -> frozenset[str]:
    """The op types whose outputs onnxruntime's quantizer quantizes by default (``quantize_static``
    with no ``op_types_to_quantize``: every op type of its QOperator and QDQ registries)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return frozenset(QDQRegistry) | frozenset(QLinearOpsRegistry)


@dataclass
class _Quantized:
    """One quantized tensor of the QDQ model — an activation behind a ``QuantizeLinear`` or a weight
    stored quantized — and the ops that quantize it."""

    writer: str | None = None   # the quantized op writing it
    readers: set = field(default_factory=set)  # quantized ops reading it; None for a node not in the float model
    reads: list = field(default_factory=list)  # (node index, input position, the float model's tensor there)
    outputs: list = field(default_factory=list)  # (graph output position, the float model's output there)
    quantizing: set = field(default_factory=set)  # the writer and readers of op types onnxruntime quantizes

    @property
    def members(self) -> tuple[str, ...]:
        """The ops that quantize it: it is dropped when all are kept in float.  onnxruntime
        quantizes the inputs and outputs of the op types it quantizes; an op of another type
        (HardSigmoid, Div) reads and writes what those hand it.  Where no op of its types touches
        the tensor (a QDQ model of another tool), every op writing or reading it counts."""
        touching = ({self.writer} if self.writer else set()) | (self.readers - {None})
        return tuple(sorted(self.quantizing or touching))

    def dropped(self, kept: set[str]) -> bool:
        """Whether no op quantizes it once the ops ``kept`` are in float (never, for a tensor no
        quantized op reaches)."""
        members = self.members
        return bool(members) and None not in self.readers and all(m in kept for m in members)


class QDQPair:
    """A float model and its QDQ model: the quantized ops (:attr:`ops`), what was folded into
    them, and every quantized tensor with the ops that quantize it.

    Raises:
        QuantizationError: the models are not a float model and its QDQ model.
    """

    def __init__(self, float_model, quantized_model):
        _check_format(quantized_model)
        self.float_model, self.quantized_model = float_model, quantized_model
        self.float_nodes = {n.name: n for n in float_model.graph.node if n.name}
        self.float_producers = _producers(float_model)
        self.producers = _producers(quantized_model)
        self.twins = {n.name: n for n in quantized_model.graph.node
                      if n.name and n.op_type not in (QUANTIZE, DEQUANTIZE)}
        self.folded_into = self._folded()
        self.ops = self._quantized_ops()
        self.quantized = self._quantized_tensors()

    def twin(self, float_node):
        """The QDQ model's node that is ``float_node`` (by name; an unnamed one by its output), or None."""
        if float_node.name:
            twin = self.twins.get(float_node.name)
        else:
            twin = self.producers.get(float_node.output[0]) if float_node.output else None
        return twin if twin is not None and twin.op_type == float_node.op_type else None

    def _folded(self) -> dict[str, str]:
        """Each float node the QDQ model lacks (a folded activation) -> the node it was folded into."""
        absent = [n for n in self.float_model.graph.node if n.op_type != "Constant" and self.twin(n) is None]
        absent_names = {n.name for n in absent}
        folded = {}
        for node in absent:
            if node.op_type not in FOLDED_ACTIVATIONS or not node.name:
                raise QuantizationError(
                    f"the quantized model has no node {node.name or node.output[0]!r} ({node.op_type}) of the "
                    f"float model, and onnxruntime's quantizer removes only the {' and '.join(FOLDED_ACTIVATIONS)} "
                    "it folds into a quantization: give the QDQ model quantize_static wrote from this float model")
            owner = self.float_producers.get(node.input[0])
            while owner is not None and owner.name in absent_names:
                owner = self.float_producers.get(owner.input[0])
            if owner is None or self.twin(owner) is None:
                raise QuantizationError(f"the float model's {node.name!r} ({node.op_type}) is missing from the "
                                        "quantized model and folds into no op of it: give the QDQ model "
                                        "quantize_static wrote from this float model")
            folded[node.name] = owner.name
        return folded

    def _quantized_ops(self) -> list[QuantizedOp]:
        ops = []
        for i, node in enumerate(self.quantized_model.graph.node):
            if node.op_type in (QUANTIZE, DEQUANTIZE) or node.name not in self.float_nodes or not node.output:
                continue
            dequantized = tuple(j for j, name in enumerate(node.input) if self._dequantize(name) is not None)
            if dequantized:
                folded = tuple(f for f, owner in self.folded_into.items() if owner == node.name)
                ops.append(QuantizedOp(node.name, node.op_type, i, node.output[0],
                                       self.float_nodes[node.name].output[0], dequantized, folded))
        if not ops:
            raise QuantizationError("no op of the float model is quantized in the quantized model (none of its "
                                    "nodes reads a DequantizeLinear): give the QDQ model of this float model "
                                    "(quantize_static(..., quant_format=QuantFormat.QDQ)), nodes named as in it")
        return ops

    def _dequantize(self, name: str):
        node = self.producers.get(name) if name else None
        return node if node is not None and node.op_type == DEQUANTIZE else None

    def _quantized_tensors(self) -> list[_Quantized]:
        ops = {op.name for op in self.ops}
        quantizing = _output_quantizing_types()
        tensors: dict[str, _Quantized] = {}

        def tensor_of(dequantize) -> _Quantized:
            quantize = self.producers.get(dequantize.input[0])
            if quantize is not None and quantize.op_type != QUANTIZE:
                quantize = None  # a weight stored quantized, or what another op made
            key = dequantize.input[0]
            if key not in tensors:
                tensors[key] = _Quantized()
                writer = self.producers.get(quantize.input[0]) if quantize is not None else None
                if writer is not None and writer.name in ops:
                    tensors[key].writer = writer.name
                    if writer.op_type in quantizing:
                        tensors[key].quantizing.add(writer.name)
            return tensors[key]

        for i, node in enumerate(self.quantized_model.graph.node):
            if node.op_type in (QUANTIZE, DEQUANTIZE):
                continue
            for j, name in enumerate(node.input):
                dequantize = self._dequantize(name)
                if dequantize is None:
                    continue
                tensor, float_node = tensor_of(dequantize), self.float_nodes.get(node.name)
                known = node.name in ops and float_node is not None and j < len(float_node.input)
                tensor.readers.add(node.name if known else None)
                if known and node.op_type in quantizing:
                    tensor.quantizing.add(node.name)
                tensor.reads.append((i, j, float_node.input[j] if known else None))
        float_outputs = [o.name for o in self.float_model.graph.output]
        for k, output in enumerate(self.quantized_model.graph.output):
            dequantize = self._dequantize(output.name)
            if dequantize is not None and k < len(float_outputs):
                tensor_of(dequantize).outputs.append((k, float_outputs[k]))
        return list(tensors.values())

    def drops_nothing(self, name: str) -> bool:
        """Whether keeping the op ``name`` alone in float changes nothing: no quantization it takes
        part in (onnxruntime does not quantize its op type; it reads what the ops before it hand it)."""
        return not any(name in tensor.members for tensor in self.quantized)

    def recalibrated(self, kept: Iterable[str]) -> list[str]:
        """The float model's tensors whose quantization onnxruntime would calibrate anew with the
        ops ``kept`` excluded while they stay quantized — which the QDQ model does not record, so
        the variant keeps the parameters it has: the input of a Relu or Clip (onnxruntime gives it
        the activation's output range while it quantizes the activation) and the output of a
        Softmax (given the range [0, 1])."""
        kept, types = set(kept), {op.name: op.op_type for op in self.ops}
        changed = []
        for tensor in self.quantized:
            if tensor.dropped(kept) or not tensor.reads:
                continue
            readers = tensor.readers - {None}
            if (len(readers) == 1 and readers <= kept and types[next(iter(readers))] in FOLDED_ACTIVATIONS
                    and all(j == 0 for _, j, _ in tensor.reads)):
                changed.append(tensor.reads[0][2])
            elif tensor.writer in kept and types[tensor.writer] == "Softmax":
                changed.append(self.float_nodes[tensor.writer].output[0])
        return changed

    def kept(self, names: Iterable[str]) -> set[str]:
        """``names`` checked as quantized ops (a folded activation is named with its op)."""
        ops = {op.name for op in self.ops}
        names = list(dict.fromkeys(names))
        for name in names:
            if name in self.folded_into:
                raise QuantizationError(f"{name!r} is not in the quantized model: the quantizer folded it into "
                                        f"{self.folded_into[name]!r} (its QuantizeLinear clips instead); keep "
                                        f"{self.folded_into[name]!r} in float")
            if name not in ops:
                listed = [op.name for op in self.ops]
                raise QuantizationError(f"{name!r} is not an op the quantized model quantizes: choose from "
                                        f"{', '.join(listed[:12])}{', ...' if len(listed) > 12 else ''}")
        return set(names)


class _Edit:
    """A copy of the QDQ model being edited, and the float model's value of any of its tensors
    there (what :func:`with_float_ops` and :func:`switchable` share).  Nodes are only appended
    while editing, so the pair's node indices stay valid until :meth:`finish`."""

    def __init__(self, pair: QDQPair):
        import onnx

        self.pair = pair
        self.model = onnx.ModelProto()
        self.model.CopyFrom(pair.quantized_model)
        self.graph = self.model.graph
        self.float_inits = {t.name: t for t in pair.float_model.graph.initializer}
        self.float_inputs = {i.name for i in pair.float_model.graph.input} - set(self.float_inits)
        self.names = ({t.name for t in self.graph.initializer} | {i.name for i in self.graph.input}
                      | {o for n in self.graph.node for o in n.output})
        self._values: dict[str, str] = {}
        self._made: dict[tuple, str] = {}

    def fresh(self, name: str) -> str:
        """``name``, or ``name_float``, ``name_float2``... where the graph already has it."""
        candidate, n = name, 1
        while candidate in self.names:
            candidate, n = f"{name}_float{n if n > 1 else ''}", n + 1
        self.names.add(candidate)
        return candidate

    def float_value(self, name: str) -> str:
        """The tensor holding the float model's ``name`` as this graph computes it: a weight from
        the float model, an input as given, an op's output where the QDQ model has the op, and a
        folded activation (or a constant the quantizer dropped) computed again here."""
        if name not in self._values:
            self._values[name] = self._float_value(name)
        return self._values[name]

    def _float_value(self, name: str) -> str:
        if name in self.float_inits:
            return self._initializer(self.float_inits[name])
        if name in self.float_inputs:
            return name
        node = self.pair.float_producers.get(name)
        if node is None:
            raise QuantizationError(f"the float model's tensor {name!r} has no producer: give a valid float model")
        position = list(node.output).index(name)
        twin = self.pair.twin(node)
        if twin is not None:
            return twin.output[position]
        import onnx

        again = onnx.NodeProto()
        again.CopyFrom(node)
        again.input[:] = [self.float_value(i) if i else "" for i in node.input]
        again.output[:] = [self.fresh(o) if o else "" for o in node.output]
        for original, made in zip(node.output, again.output):
            self._values.setdefault(original, made)
        self.graph.node.append(again)
        return again.output[position]

    def _initializer(self, tensor) -> str:
        existing = next((t for t in self.graph.initializer if t.name == tensor.name), None)
        if existing is not None and existing.SerializeToString() == tensor.SerializeToString():
            return tensor.name
        copy = self.graph.initializer.add()
        copy.CopyFrom(tensor)
        copy.name = self.fresh(tensor.name)
        return copy.name

    def replace_output(self, position: int, value: str, select: str | None = None) -> None:
        """Graph output ``position`` becomes ``value`` (with ``select``: ``value`` where that boolean
        is true, what it was otherwise), under its own name."""
        from onnx import helper

        name = self.graph.output[position].name
        producer = next(n for n in self.graph.node if name in n.output)
        quantized = self.fresh(f"{name}_quantized")
        producer.output[list(producer.output).index(name)] = quantized
        if select is None:
            self.graph.node.append(helper.make_node("Identity", [value], [name], name=f"{name}_kept_float"))
        else:
            self.graph.node.append(helper.make_node("Where", [select, value, quantized], [name],
                                                    name=f"{name}_kept_float"))

    def made(self, op_type: str, inputs: tuple[str, ...], hint: str) -> str:
        """The output of one ``op_type`` node over ``inputs`` (made once)."""
        from onnx import helper

        key = (op_type, inputs)
        if key not in self._made:
            out = self.fresh(hint)
            self.graph.node.append(helper.make_node(op_type, list(inputs), [out], name=out))
            self._made[key] = out
        return self._made[key]

    def finish(self):
        """Drop what nothing reads any more, put the nodes in an order ONNX accepts; the model."""
        _prune(self.graph)
        _sort_nodes(self.graph)
        return self.model


def with_float_ops(float_model, quantized_model, names: Iterable[str]):
    """A copy of ``quantized_model`` with the ops ``names`` in float, as onnxruntime's
    ``quantize_static(nodes_to_exclude=...)`` would have written it (see the module docstring);
    ``names`` are node names of :func:`quantized_ops`.

    Raises:
        QuantizationError: a name is not a quantized op of these models.
    """
    pair = QDQPair(float_model, quantized_model)
    kept = pair.kept(names)
    edit = _Edit(pair)
    for tensor in pair.quantized:
        if tensor.dropped(kept):
            for i, j, float_name in tensor.reads:
                edit.graph.node[i].input[j] = edit.float_value(float_name)
            for position, float_name in tensor.outputs:
                edit.replace_output(position, edit.float_value(float_name))
    return edit.finish()


def switchable(float_model, quantized_model):
    """One model holding every variant: ``(model, flags)``, ``flags`` mapping each quantized op's
    name to a boolean scalar input of ``model``.  Each quantized tensor is read through
    ``Where(<the flags of every op that quantizes it, all true>, <the float value>, <the
    dequantized one>)``, so that with the flags of the ops ``K`` true the model computes what
    :func:`with_float_ops` of ``K`` gives, and with every flag false what ``quantized_model`` does.
    ``Where`` and ``And`` select, they compute nothing: each op's own arithmetic is the same in
    every variant (the folded activations computed again are computed in every variant).
    """
    from onnx import TensorProto, helper

    pair = QDQPair(float_model, quantized_model)
    edit = _Edit(pair)
    flags = {op.name: f"tvm_probe_keep_float_{k}" for k, op in enumerate(pair.ops)}
    edit.graph.input.extend(helper.make_tensor_value_info(flag, TensorProto.BOOL, []) for flag in flags.values())
    for tensor in pair.quantized:
        if not tensor.dropped(set(flags)):  # no set of kept ops drops it
            continue
        condition = flags[tensor.members[0]]
        for member in tensor.members[1:]:
            condition = edit.made("And", (condition, flags[member]), f"{condition}_and")
        for i, j, float_name in tensor.reads:
            node, value = edit.graph.node[i], edit.float_value(float_name)
            if value != node.input[j]:
                node.input[j] = edit.made("Where", (condition, value, node.input[j]), f"{condition}_{value}")
        for position, float_name in tensor.outputs:
            edit.replace_output(position, edit.float_value(float_name), select=condition)
    return edit.finish(), flags


def _read_names(graph) -> set[str]:
    """Every tensor name the graph's nodes read, in subgraphs (If, Loop bodies) too."""
    return set().union(*(_read_names_of(node) for node in graph.node))


def _read_names_of(node) -> set[str]:
    """Every tensor name ``node`` reads: its inputs and what its subgraphs read."""
    names = set(node.input)
    for attribute in node.attribute:
        for sub in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            names |= _read_names(sub)
    return names


def _prune(graph) -> None:
    """Remove Q/DQ nodes whose outputs nothing reads any more, and initializers nothing reads."""
    outputs = {o.name for o in graph.output}
    while True:
        read = _read_names(graph) | outputs
        dead = [i for i, n in enumerate(graph.node) if n.op_type in (QUANTIZE, DEQUANTIZE)
                and not any(out in read for out in n.output)]
        if not dead:
            break
        for i in reversed(dead):
            del graph.node[i]
    read = _read_names(graph) | outputs
    keep = [t for t in graph.initializer if t.name in read]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _sort_nodes(graph) -> None:
    """Each node after the nodes whose outputs it reads (ONNX's order), else in the order given."""
    import heapq

    nodes = list(graph.node)
    producers = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    needs = [{producers[name] for name in _read_names_of(n) if name in producers} - {i} for i, n in enumerate(nodes)]
    needed_by: dict[int, list[int]] = {}
    for i, needed in enumerate(needs):
        for k in needed:
            needed_by.setdefault(k, []).append(i)
    waiting = [len(needed) for needed in needs]
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in needed_by.get(i, ()):
            waiting[k] -= 1
            if waiting[k] == 0:
                heapq.heappush(ready, k)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]  # a cycle: left as it was
    if order != list(range(len(nodes))):
        copies = [_copy(nodes[i]) for i in order]
        del graph.node[:]
        graph.node.extend(copies)


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
