"""Make an ONNX model static before TVM sees it, keeping every source name.

Models exported with dynamic axes (``batch``, ``seq``) compute their shapes at run time:
``Shape → Gather → Concat → Reshape`` chains, masks built with ``ConstantOfShape`` / ``Range``
/ ``Expand``.  TVM 0.27's ONNX importer loses track of shapes in many of these chains even when
``shapes=`` pins the inputs (``Reshape expects the input tensor to have known shape``, scalars
where tensors are expected, ...).  Once the inputs are pinned, all of this arithmetic is known
before the model runs, so this module computes it and hands TVM constants instead:

1. **pin** the inputs: ``shapes=`` for the inputs it names; an input it does not name takes
   the sizes of the dimension names it shares with named inputs (``attention_mask[batch, seq]``
   follows ``input_ids[batch, seq]``, as ONNX defines equal ``dim_param``\\ s to be equal);
2. **infer** every tensor's shape with ONNX's own shape inference (on a copy of the graph that
   holds the weights' types, not their data);
3. **fold** the shape-only subgraphs: ``Shape``/``Size`` of a tensor of known shape, and every
   deterministic op computing only from such values and constants (up to
   :data:`FOLD_LIMIT` elements), evaluated with ONNX's reference implementation
   (``onnx.reference``); steps 2 and 3 alternate until nothing new folds, since a folded
   ``Expand`` target lets inference find shapes it could not before.

A value computed from the model's *data* (an attention mask built from ``attention_mask``) is
never folded: only input shapes and constants feed a folded value.

Nothing of the source model is renamed or dropped: the graph TVM converts is the source graph
with each folded node *replaced by a ``Constant`` node producing the same tensor names*; the
importer still reads node names, op types and metadata (module paths of dynamo exports) from
the source graph.  A folded value is a constant of the compiled model, served as
``Kind.CONSTANT`` with the value the source model computes for those input shapes.

Why not a library: ``onnxscript.optimizer`` folds the same subgraphs and keeps the metadata of
the nodes it keeps, but *removes* every folded node (37 of 124 node names of a dynamo BERT), so
their names would no longer answer; onnxsim / onnxslim likewise delete and merge nodes.
``onnx.tools.update_model_dims`` only rewrites the declared input/output dims.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..core.errors import ModelError, Remedy
from ..core.records import PinnedInput, shapes_remedy

log = logging.getLogger(__name__)

FOLD_LIMIT = 1 << 16
"""Largest folded value, in elements: shape values are tiny; a big mask is left to TVM."""

_FOLDABLE = frozenset({
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "ConstantOfShape", "CumSum",
    "Div", "Equal", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Greater",
    "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Max", "Min", "Mod", "Mul", "Neg", "Not",
    "Or", "Range", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSum", "Reshape", "ScatterND",
    "Shape", "Sign", "Size", "Slice", "Split", "Sqrt", "Squeeze", "Sub", "Tile", "Transpose",
    "Trilu", "Unsqueeze", "Where", "Xor",
})
"""Deterministic ops of the default domain that shape arithmetic and mask building use."""

_SMALL_INITIALIZER = 1024  # weights larger than this never take part in shape arithmetic
_MAX_ROUNDS = 8  # rounds of inference and folding; real exports settle in two or three


@dataclass
class StaticGraph:
    """What TVM converts instead of the source graph, and what was folded.

    Attributes:
        shapes: the static shape of every graph input (pinned, declared or shared by name).
        folded: output tensor name → value, for every tensor computed here rather than by TVM.
        nodes: the nodes TVM converts: the source nodes, each folded one replaced by
            ``Constant`` node(s) producing its output tensors.
    """

    shapes: dict[str, tuple[int, ...]]
    folded: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list = field(default_factory=list)

    def view(self, graph) -> "GraphView":
        """``graph`` as TVM's importer reads it, with :attr:`nodes` in place of its nodes."""
        return GraphView(graph, self.nodes)


class GraphView:
    """A ``GraphProto`` stand-in: TVM's importer reads ``node``, ``input``, ``output``,
    ``initializer`` and ``name``; the weights stay where they are (no copy of a large model).
    ``inputs``, when given, replaces the declared inputs (see :func:`name_unknown_dims`)."""

    def __init__(self, graph, nodes, inputs=None):
        self._graph, self.node = graph, nodes
        if inputs is not None:
            self.input = inputs

    def __getattr__(self, name):
        return getattr(self._graph, name)


def symbolic_inputs(graph) -> dict[str, list]:
    """``{input: declared dims}`` for every graph input whose shape is not fully static.

    A dim is an int, a dimension name (``'batch'``) or None (unknown, or no shape at all).
    """
    weights = {t.name for t in graph.initializer}
    found = {}
    for vi in graph.input:
        if vi.name in weights:
            continue
        dims = declared_dims(vi)
        if dims is None or not all(isinstance(d, int) for d in dims):
            found[vi.name] = dims
    return found


def declared_dims(value_info) -> list | None:
    """The declared dims of a graph input (see :func:`symbolic_inputs`), None without a shape.

    A dim written as ``-1`` (paddle2onnx) is unknown, as onnxruntime reads it: None, like a dim
    with no value at all; so is paddle2onnx's ``'?'``.  A ``0`` stays a size, as onnxruntime
    (1.32) keeps it: it refuses an input of any other size there.
    """
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        else:
            dims.append(None if _unnamed(dim) else dim.dim_param)
    return dims


def _unnamed(dim) -> bool:
    """An unknown dim that names no size: no ``dim_param``, or paddle2onnx's ``'?'`` (which it
    writes for every unknown dim: it does not say two of them are equal)."""
    return dim.dim_param in ("", "?")


def name_unknown_dims(graph) -> list | None:
    """Copies of the graph inputs with every unknown dim (see :func:`declared_dims`) given a name
    of its own (``x_dim0``), or None when no input has one.

    TVM's importer takes ``-1`` as a size, and gives every dim of one name, ``''`` and ``'?'``
    included, one symbolic variable; each unknown dim is a size of its own.
    """
    from onnx import ValueInfoProto

    weights = {t.name for t in graph.initializer}
    named, changed = [], False
    for vi in graph.input:
        copy = vi
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else ()
        unknown = [k for k, d in enumerate(dims) if _unnamed(d) and not (d.HasField("dim_value") and d.dim_value >= 0)]
        if unknown and vi.name not in weights:
            copy = ValueInfoProto()
            copy.CopyFrom(vi)
            for k in unknown:
                dim = copy.type.tensor_type.shape.dim[k]
                dim.Clear()
                dim.dim_param = f"{vi.name}_dim{k}"
            changed = True
        named.append(copy)
    return named if changed else None


def pin_inputs(graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The static shape of every graph input, from ``shapes`` and the declared dims.

    Raises:
        ModelError: ``shapes`` names something that is not an input, disagrees with a declared
            dim or with itself on a shared dimension name, or an input stays symbolic.
    """
    declared = declared_inputs(graph)
    shapes = _checked(shapes, declared)
    sizes: dict[str, tuple[int, str]] = {}  # dimension name → (size, input that fixed it)
    for name, shape in shapes.items():
        for dim, size in zip(declared[name] or [], shape):
            if isinstance(dim, str):
                seen = sizes.setdefault(dim, (size, name))
                if seen[0] != size:
                    raise ModelError(f"shapes gives dimension '{dim}' size {size} in {name!r} but {seen[0]} "
                                     f"in {seen[1]!r}, which the model declares as one dimension",
                                     remedy=shapes_remedy(name, _with(shape, declared[name], dim, seen[0]),
                                                          "give them equal sizes: pass "))
    pinned = {}
    for name, dims in declared.items():
        if name in shapes:
            pinned[name] = tuple(int(s) for s in shapes[name])
        elif dims is not None and all(isinstance(d, int) or d in sizes for d in dims):
            pinned[name] = tuple(d if isinstance(d, int) else sizes[d][0] for d in dims)
            if any(isinstance(d, str) for d in dims):
                log.info("input %r takes shape %s from the dimension names it shares", name, pinned[name])
    missing = {n: d for n, d in declared.items() if n not in pinned}
    if missing:
        name, dims = next(iter(missing.items()))
        raise ModelError(f"{_describe_symbolic(missing)}", remedy=shapes_remedy(
            name, tuple(d if isinstance(d, int) else 1 for d in dims or (1,)), "give its sizes, e.g. pass "))
    return pinned


def _checked(shapes: Mapping[str, Sequence[int]], declared: dict) -> dict[str, tuple[int, ...]]:
    """``shapes`` as ints, each checked against the input it names (:func:`_check_pinned`)."""
    unknown = [n for n in shapes if n not in declared]
    if unknown:
        raise ModelError(f"shapes names {', '.join(map(repr, unknown))}, which the model does not take "
                         f"(its inputs are {', '.join(map(repr, declared))})",
                         remedy=Remedy("name inputs of the model in shapes=", key="model.shapes",
                                       value="{" + ", ".join(f"{n}: [...]" for n in declared) + "}",
                                       flag="--shapes NAME=AxB"))
    return {name: _check_pinned(name, shape, declared[name]) for name, shape in shapes.items()}


def declared_inputs(graph) -> dict[str, list | None]:
    """``{input: declared dims}`` of every graph input that is not a weight."""
    weights = {t.name for t in graph.initializer}
    return {vi.name: declared_dims(vi) for vi in graph.input if vi.name not in weights}


def fill_unknown_dims(graph, shapes: Mapping[str, Sequence[int]],
                      sizes: Mapping[str, Sequence[int]] | None = None) -> tuple[dict, list[PinnedInput]]:
    """``shapes`` completed for every input it leaves with unknown dimensions, and what was chosen.

    A dimension takes the size the inputs of ``shapes`` give its name; else the size of the
    array the run will feed (``sizes``: ``{input: shape}`` of the user's arrays); else 1.  An
    input declared without a rank is left out unless ``sizes`` gives it (:func:`pin_inputs`
    then asks for it).
    """
    sizes = {n: tuple(int(d) for d in s) for n, s in (sizes or {}).items()}
    declared = declared_inputs(graph)
    full = _checked(shapes, declared)
    named = {d: s for n, shape in full.items() for d, s in zip(declared[n] or (), shape) if isinstance(d, str)}
    ours = set()  # dimensions sized here (an input sharing one says so too)
    chosen = []
    for name, dims in declared.items():
        if name in full or (dims is not None and all(isinstance(d, int) for d in dims)):
            continue
        given = sizes.get(name)
        if dims is None:
            if given is not None:
                full[name] = given
                chosen.append(PinnedInput(name, given, tuple((k, "?") for k in range(len(given))), True))
            continue
        given = given if given is not None and len(given) == len(dims) else None
        shape, picked = [], []
        for axis, dim in enumerate(dims):
            if isinstance(dim, int) or (dim in named and dim not in ours):
                shape.append(dim if isinstance(dim, int) else named[dim])
                continue
            key = dim if dim is not None else (name, axis)  # an unnamed dimension is its own
            if key not in named:
                named[key] = given[axis] if given is not None else 1
                ours.add(key)
            shape.append(named[key])
            picked.append((axis, dim or "?"))
        full[name] = tuple(shape)
        if picked:
            chosen.append(PinnedInput(name, tuple(shape), tuple(picked), given is not None))
    return full, chosen


def _with(shape, dims, name: str, size: int) -> tuple[int, ...]:
    """``shape`` with every dimension declared as ``name`` set to ``size``."""
    return tuple(size if d == name else s for s, d in zip(shape, dims or ()))


def _check_pinned(name: str, shape, dims) -> tuple[int, ...]:
    """``shape`` as ints, checked against the input's declared dims."""
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ModelError(f"the shape given for input {name!r}, {shape!r}, is not a list of sizes",
                         remedy=shapes_remedy(name, tuple(d if isinstance(d, int) else 1 for d in dims or (1,)),
                                           "give numbers, e.g. pass ")) from None
    if any(s < 0 for s in shape):
        raise ModelError(f"the shape given for input {name!r}, {list(shape)}, has a negative size",
                         remedy=shapes_remedy(name, tuple(abs(s) for s in shape), "give sizes >= 0, e.g. pass "))
    if dims is not None:
        if len(dims) != len(shape):
            raise ModelError(f"the shape given for input {name!r}, {list(shape)}, has {len(shape)} dims; the "
                             f"model declares {name} {_dims_text(dims)} ({len(dims)} dims)",
                             remedy=shapes_remedy(name, tuple(d if isinstance(d, int) else 1 for d in dims),
                                              "give one size per dim, e.g. pass "))
        for i, (dim, size) in enumerate(zip(dims, shape)):
            if isinstance(dim, int) and dim != size:
                raise ModelError(f"the shape given for input {name!r}, {list(shape)}, sets dim {i} to {size}; "
                                 f"the model declares {name} {_dims_text(dims)}",
                                 remedy=shapes_remedy(name, _fixed(shape, dims), "keep its fixed sizes: pass "))
    return shape


def _fixed(shape, dims) -> tuple[int, ...]:
    """``shape`` with the model's fixed sizes where it declares them."""
    return tuple(d if isinstance(d, int) else s for s, d in zip(shape, dims))


def _dims_text(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _describe_symbolic(inputs: dict) -> str:
    """``input 'x' has no static shape ([batch, 4])``, or ``inputs ... have ...`` for several."""
    parts = [f"{name!r} ({'none declared' if dims is None else _dims_text(dims)})" for name, dims in inputs.items()]
    if len(parts) == 1:
        name, rest = parts[0].split(" ", 1)
        return f"input {name} has no static shape {rest}"
    return f"inputs {', '.join(parts)} have no static shape"


def make_static(proto, shapes: Mapping[str, Sequence[int]]) -> StaticGraph:
    """Pin the inputs of ``proto``, infer shapes, fold the shape-only subgraphs (module docstring).

    Inference and folding alternate: a folded value (an ``Expand`` target, say) lets ONNX shape
    inference find shapes it could not before, whose ``Shape`` then folds in turn.  ``proto``
    itself is not modified.

    Raises:
        ModelError: see :func:`pin_inputs`.
    """
    static = StaticGraph(shapes=pin_inputs(proto.graph, shapes), nodes=list(proto.graph.node))
    for _ in range(_MAX_ROUNDS):
        folder = _Folder(proto, _inferred_shapes(proto, static.shapes, static.nodes))
        nodes, folded = [], {}
        for node in proto.graph.node:
            values = folder.fold(node)
            if values is None:
                nodes.append(node)
            else:
                folded.update(values)
                nodes.extend(_constant_node(name, value) for name, value in values.items())
        progress = len(folded) > len(static.folded)
        static.nodes, static.folded = nodes, folded
        if not progress:
            break
    if static.folded:
        log.info("folded %d shape values of the source model for shapes %s", len(static.folded), static.shapes)
    return static


def _inferred_shapes(proto, inputs: dict[str, tuple[int, ...]], nodes) -> dict[str, tuple[int, ...]]:
    """Static shape of every tensor ONNX shape inference can tell, with the inputs pinned.

    Inference runs on a light copy of the graph with ``nodes`` (folded values already
    constants): large weights become typed graph inputs (their data is not needed), declared
    intermediate and output shapes are dropped (exporters write symbolic ones), and the pinned
    input shapes replace the declared ones.
    """
    shapes = {name: tuple(shape) for name, shape in inputs.items()}
    for vi in _infer(proto, {n: list(s) for n, s in inputs.items()}, nodes):
        dims = declared_dims(vi)
        if dims is not None and all(isinstance(d, int) for d in dims) and vi.name not in shapes:
            shapes[vi.name] = tuple(dims)
    return shapes


def inferred_ranks(proto) -> dict[str, int]:
    """The rank of every tensor of ``proto`` that ONNX shape inference can tell, with the inputs
    as declared (symbolic dims stay symbolic: a rank needs no sizes).

    TVM's importer holds shape values as scalars or ``ShapeExpr``\\ s, which lose the rank ONNX
    gives them (a 1-element 1-D tensor becomes a scalar); the import fixes read it from here.
    """
    graph = proto.graph
    weights = {t.name for t in graph.initializer}
    declared = {vi.name: declared_dims(vi) for vi in graph.input if vi.name not in weights}
    ranks = {name: len(dims) for name, dims in declared.items() if dims is not None}
    for vi in _infer(proto, declared, list(graph.node)):
        dims = declared_dims(vi)
        if dims is not None:
            ranks.setdefault(vi.name, len(dims))
    return ranks


def _infer(proto, inputs: dict[str, list | None], nodes) -> list:
    """The value infos ONNX shape inference finds for ``nodes`` with the graph inputs typed
    ``inputs`` (dims: ints, dimension names or None; None for no shape), on a light copy (see
    :func:`_inferred_shapes`); none where inference fails."""
    from onnx import helper, shape_inference

    graph = proto.graph
    light = helper.make_graph([], graph.name or "static", [], [])
    light.node.extend(nodes)
    for vi in graph.input:
        if vi.name in inputs:
            elem = vi.type.tensor_type.elem_type
            light.input.append(helper.make_tensor_value_info(vi.name, elem, inputs[vi.name]))
    for tensor in graph.initializer:
        if _numel(tensor.dims) <= _SMALL_INITIALIZER:
            light.initializer.append(tensor)
        else:
            light.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    for out in graph.output:
        light.output.append(helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type, None))
    model = helper.make_model(light, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    model.functions.extend(proto.functions)
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=True)
    except Exception as err:  # inference is a help, not a requirement: use what is known
        log.info("ONNX shape inference failed (%s); using only what the inputs tell", err)
        return []
    return [*inferred.graph.value_info, *inferred.graph.output]


def _numel(dims) -> int:
    return int(np.prod([int(d) for d in dims])) if len(dims) else 1


class _Folder:
    """Decides node by node (in graph order) whether a node's outputs are shape values to fold."""

    def __init__(self, proto, shapes: dict[str, tuple[int, ...]]):
        self._opsets = {o.domain or "": o.version for o in proto.opset_import}
        self._initializers = {t.name: t for t in proto.graph.initializer}
        self._shapes = {**{n: tuple(int(d) for d in t.dims) for n, t in self._initializers.items()}, **shapes}
        self._constants: dict[str, np.ndarray] = {}  # Constant nodes and small weights, on demand
        self._folded: dict[str, np.ndarray] = {}     # values computed from input shapes

    def fold(self, node) -> dict[str, np.ndarray] | None:
        """``{output: value}`` when ``node`` computes only from input shapes and constants.

        A node computing from constants alone is evaluated too (small results only), so that
        shape arithmetic mixing it in folds, but it is left to TVM: it is not a shape value.
        """
        if node.domain not in ("", "ai.onnx") or _has_subgraph(node):
            return None
        if node.op_type == "Constant":
            self._remember(self._constant(node))
            return None
        if node.op_type in ("Shape", "Size"):
            values = self._from_shape(node)
        elif node.op_type in _FOLDABLE and self._known_inputs(node):
            values = self._evaluate(node)
            if values is not None and not any(n in self._folded for n in node.input if n):
                self._remember(values)  # constants only: known, not folded
                return None
        else:
            return None
        if values is None or any(v.size > FOLD_LIMIT for v in values.values()):
            return None
        self._folded.update(values)
        return values

    def _remember(self, values: dict[str, np.ndarray] | None) -> None:
        for name, value in (values or {}).items():
            if value.size <= _SMALL_INITIALIZER:
                self._constants[name] = value

    def _constant(self, node) -> dict[str, np.ndarray] | None:
        """A ``Constant`` node's value, unless it is large (a weight, not shape arithmetic)."""
        tensor = next((a.t for a in node.attribute if a.name == "value"), None)
        if tensor is not None and _numel(tensor.dims) > _SMALL_INITIALIZER:
            return None
        return self._evaluate(node)

    def _from_shape(self, node) -> dict[str, np.ndarray] | None:
        known = self._value(node.input[0])
        shape = self._shapes.get(node.input[0]) if known is None else known.shape
        if shape is None:
            return None
        if node.op_type == "Size":
            return {node.output[0]: np.array(_numel(shape), dtype=np.int64)}
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return {node.output[0]: np.array(shape[slice(start, end)], dtype=np.int64)}

    def _value(self, name: str) -> np.ndarray | None:
        if name in self._folded:
            return self._folded[name]
        if name in self._constants:
            return self._constants[name]
        tensor = self._initializers.get(name)
        if tensor is not None and _numel(tensor.dims) <= _SMALL_INITIALIZER:
            from onnx import numpy_helper

            self._constants[name] = numpy_helper.to_array(tensor)
            return self._constants[name]
        return None

    def _known_inputs(self, node) -> bool:
        """Every input of ``node`` has a value known before the model runs."""
        names = [n for n in node.input if n]
        return bool(names) and all(self._value(n) is not None for n in names)

    def _evaluate(self, node) -> dict[str, np.ndarray] | None:
        from onnx.reference import ReferenceEvaluator

        feeds = {n: self._value(n) for n in node.input if n}
        try:
            results = ReferenceEvaluator(node, opsets=self._opsets).run(None, feeds)
        except Exception as err:  # leave the node to TVM rather than guess its value
            log.info("not folding %s (%s): %s", node.name or node.output[0], node.op_type, err)
            return None
        return {name: np.asarray(value) for name, value in zip(node.output, results) if name}


def _has_subgraph(node) -> bool:
    return any(a.HasField("g") or len(a.graphs) for a in node.attribute)


def _constant_node(name: str, value: np.ndarray):
    """A ``Constant`` node producing tensor ``name`` (what TVM converts instead of a folded node)."""
    from onnx import helper, numpy_helper

    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))
