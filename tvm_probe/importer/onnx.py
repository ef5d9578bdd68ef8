"""Import an ONNX model into Relax, tagging every runtime value with its source tensor.

TVM's ONNX frontend attaches no source names, and hand-set spans do not survive legalization.
What does survive is *Var identity*.  So we subclass TVM's importer and change two things:

* every converted node's result is emitted into its own binding (a Var) — normalisation would
  bind it anyway when it is used, so the ops are unchanged;
* the importer's ``tensor name → expression`` table records what each ONNX tensor became.

Afterwards every ONNX tensor is one of: a graph input, a weight, a constant folded at import
time, or a Relax Var computed at run time.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import logging
import os
import re
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from ..core.errors import ModelError, ProbeError, TVMImportError, UnsupportedOpError, one_line
from ..core.native_log import native_log_to_logging, release_native
from ..core.records import sizes_remedy
from ..core.sources import Kind, SourceMap, SourceValue
from .adapter import ModelAdapter, SourceGraph, file_from_record, file_record, static_shapes
from .fixes import FixLog, OnnxNode, off_hint, onnx_fix_for
from .model import ImportedModel, InputSpec, LazyArrays
from .module_paths import module_outputs
from .onnx_graph import node_inputs
from .relax_values import binding_of_value, const_value, dim_of, follow_aliases, tensor_info, type_info
from .static import (GraphView, fill_unknown_dims, inferred_ranks, make_static, name_unknown_dims, pin_inputs,
                     symbolic_inputs)

log = logging.getLogger(__name__)

ModelLike = Union[str, os.PathLike, Any]  # a path or an onnx.ModelProto (onnx is imported lazily)


def load_onnx(model: ModelLike):
    """Return an ``onnx.ModelProto`` from a path or a model, with a clear error for bad files."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(
            f"cannot import a {type(model).__name__}: pass an onnx.ModelProto or a path to a .onnx file")
    path = Path(model)
    if not path.exists():
        raise ModelError(f"model file '{path}' does not exist: check the path")
    if not path.is_file():
        raise ModelError(f"model path '{path}' is not a file: give the path of a .onnx file")
    try:
        proto = onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError, onnx raises others
        raise ModelError(f"'{path}' is not an ONNX model ({one_line(err)}): give a .onnx file") from None
    if not proto.ir_version or not proto.graph.output:
        raise ModelError(f"'{path}' is not an ONNX model (no IR version or no graph outputs): give a .onnx file")
    return proto


def model_hash(proto) -> str:
    """sha256 over the model's graph and weights, to tie dumps to the model they came from.

    Fed piece by piece (each node, each weight) rather than from one serialization of the whole
    model, which for a BERT-base would briefly double its 440 MB in memory.
    """
    digest = hashlib.sha256()
    graph = proto.graph
    for opset in proto.opset_import:
        digest.update(opset.SerializeToString())
    for part in (*graph.input, *graph.output, *graph.node):
        digest.update(part.SerializeToString())
    for tensor in graph.initializer:
        if tensor.data_location == 1:  # EXTERNAL: hash where the data lives, not the file
            digest.update(tensor.SerializeToString())
            continue
        digest.update(f"{tensor.name}|{tensor.data_type}|{list(tensor.dims)}".encode())
        digest.update(tensor.raw_data if tensor.HasField("raw_data") else tensor.SerializeToString())
    return digest.hexdigest()


def import_onnx(model: ModelLike, shapes: Mapping[str, Sequence[int]] | None = None,
                import_fixes: bool = True, sizes: Mapping[str, Sequence[int]] | None = None) -> ImportedModel:
    """Import an ONNX model with every runtime value tagged by its source tensor name.

    A model whose inputs have unknown dimensions (named, unnamed, ``-1``) is imported as TVM
    imports it, with symbolic dimensions, where TVM's importer can follow them.  Where it cannot
    (shape arithmetic it loses track of), or where ``shapes`` pins some inputs, the model is made
    static first (see :mod:`tvm_probe.importer.static`): every unknown dimension takes a size —
    from ``shapes``, else the size of the arrays the run will feed (``sizes``), else 1 — listed in
    ``ImportedModel.pinned`` and logged, and the shape arithmetic that then has a known value is
    folded to constants (served as such).

    Args:
        model: an ``onnx.ModelProto`` or a path to a ``.onnx`` file.
        shapes: static shapes for inputs with unknown dimensions; an input left out takes the
            sizes of the dimension names it shares with the inputs given.
        import_fixes: rewrite the constructs TVM 0.27 cannot import (see
            :mod:`tvm_probe.importer.fixes`); those used are listed in ``ImportedModel.fixes``.
            False imports as TVM does: unknown dimensions stay symbolic unless ``shapes`` pins them.
        sizes: ``{input: shape}`` of the arrays the model will be run with, for a dimension that
            must be pinned and that ``shapes`` does not give.

    Raises:
        ModelError: the file is missing or not ONNX, ``shapes`` does not fit the model, an input
            declared without a rank must be pinned and neither ``shapes`` nor ``sizes`` gives
            it, or TVM's importer fails on a node;
        UnsupportedOpError: the model uses an op TVM's ONNX importer cannot convert.
    """
    proto = load_onnx(model)
    _check_ops_supported(proto.graph)
    shapes = dict(shapes or {})
    if not symbolic_inputs(proto.graph):
        pin_inputs(proto.graph, shapes)  # checks shapes given for a static model
        return _import(proto, None, import_fixes)
    if not shapes and not import_fixes:  # as TVM imports it, failures included
        return _import(proto, None, import_fixes)
    failed = None
    if not shapes:
        try:
            return _import(proto, None, import_fixes)
        except TVMImportError as err:  # TVM's importer lost a symbolic dimension: pin them
            log.info("TVM's importer cannot follow the model's unknown dimensions (%s): pinning them", err)
            with native_log_to_logging():  # the failed import's BlockBuilder complains as it is freed
                release_native(err)
            failed = err
    full, pinned = fill_unknown_dims(proto.graph, shapes, sizes)
    rankless = [name for name in symbolic_inputs(proto.graph) if name not in full]
    if failed is not None and rankless:  # nothing to pin them to: TVM's failure, and what fixes it
        raise type(failed)(str(failed), remedy=sizes_remedy(rankless[0])) from None
    imported = _import(proto, make_static(proto, full), import_fixes)
    imported.pinned = pinned
    axes = {chosen.name: tuple(axis for axis, _ in chosen.dims) for chosen in pinned}
    imported.inputs = [replace(spec, pinned=axes.get(spec.name, ())) for spec in imported.inputs]
    for chosen in pinned:
        log.warning("%s", chosen.notice(), extra={"notice": chosen})  # the CLI says it with its flags
    return imported


def _import(proto, static, import_fixes: bool) -> ImportedModel:
    """One import of ``proto``: of ``static`` (the static graph) where given, else with the
    model's unknown dimensions symbolic."""
    importer = _make_importer(static.shapes if static else {}, import_fixes, _rank_lookup(proto))
    graph = static.view(proto.graph) if static else _named_dims_view(proto.graph)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # the onnx checker's opinions; we report real failures
        try:
            mod = importer.from_onnx(graph, _opset_of(proto))
        except ProbeError:
            raise
        except Exception as err:  # raised outside a converter (e.g. TVM's ShapeExpr check)
            raise _import_failure(importer.current_node, err) from None
    imported = _collect(proto, mod, importer)
    if static is None and symbolic_inputs(proto.graph):  # dims TVM may have lost on the way
        _check_shapes_kept(proto, imported)
    return imported


def _rank_lookup(proto):
    """``tensor name → ONNX rank or None``, inferred on the first call (only some fixes ask)."""

    ranks: list[dict] = []

    def rank_of(name: str) -> int | None:
        if not ranks:
            ranks.append(inferred_ranks(proto))
        return ranks[0].get(name)
    return rank_of


def _check_shapes_kept(proto, imported: ImportedModel) -> None:
    """Refuse an import in which TVM lost the shape of an op's result, naming the node.

    TVM's LegalizeOps leaves an op whose shapes are unknown as it is, and the build then fails
    far from the cause ("CodeGenVM cannot emit this Relax operator"); with symbolic input dims
    this is TVM's importer losing track of them (a decoder's attention mask broadcast against
    scores of a dynamic past), which pinning the dims avoids (:func:`import_onnx` does).

    Raises:
        TVMImportError: naming the first ONNX node whose value TVM holds without a shape.
    """
    from tvm import relax

    lost = _first_lost_shape(imported.mod["main"], imported.var_keys)
    if lost is None:
        return
    var, call, keys = lost
    node_of = {o: n for n in proto.graph.node for o in n.output}
    node = node_of.get(keys[0]) if keys else None
    where = f" of '{keys[0]}' (node {_node_label(node)}, op {node.op_type})" if node is not None else ""
    args = " and ".join(_shape_text(a) for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType))
    raise TVMImportError(
        f"TVM's ONNX importer lost the shape{where}: R.{call.op.name.removeprefix('relax.')} of {args} gives "
        f"R.Tensor(ndim={var.ty.ndim}), which TVM 0.27 cannot build")


def _first_lost_shape(func, var_keys: dict):
    """``(var, call, source keys)`` of the first binding of ``func`` whose op TVM must legalize
    but whose result has no shape (None when every such result has one).  The keys are those of
    that binding or, when it is internal to a converter, of the first tagged one with a lost
    shape after it."""
    import tvm
    from tvm import relax

    first = None
    for block in func.body.blocks:
        for binding in block.bindings:
            call, var = binding.value, binding.var
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            if call.op.get_attr("FLegalize") is None or call.op.get_attr("RequiresArgumentShapes") is False:
                continue  # not legalized, or legalized without shapes
            if not (isinstance(var.ty, relax.TensorType) and var.ty.shape is None):
                continue
            first = first or (var, call)
            if var in var_keys:
                return (*first, var_keys[var])
    return None if first is None else (*first, [])


def _shape_text(expr) -> str:
    """``(1, 4, 1, past + 1)``, or ``R.Tensor(ndim=4)`` without a shape, for a tensor expression."""
    dims, _ = tensor_info(expr)
    if dims is None:
        return f"R.Tensor(ndim={expr.ty.ndim})"
    text = "(" + ", ".join(_dim_text(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"
    return text if len(text) <= 80 else text[:76] + "...)"


def _named_dims_view(graph):
    """``graph``, or a view of it whose inputs name each unknown dim (``-1``, or ``0`` without a
    name) so that TVM compiles it as a symbolic dimension of its own."""

    inputs = name_unknown_dims(graph)
    return graph if inputs is None else GraphView(graph, graph.node, inputs)


def _import_failure(node, err: Exception, hint: str = "") -> ProbeError:
    """One line naming the node TVM's importer failed on and TVM's own message.

    What TVM's converter declares unsupported (``NotImplementedError``, TVM's ``OpError`` family:
    an attribute value it does not implement) is UnsupportedOpError; any other failure is a
    ModelError: the op is supported, yet TVM failed on this node.
    """
    import tvm

    where = f" on node {_node_label(node)} (op {node.op_type})" if node is not None else ""
    kind = UnsupportedOpError if isinstance(err, (NotImplementedError, tvm.error.OpError)) else TVMImportError
    return kind(f"TVM's ONNX importer failed{where}: {one_line(err)}{hint}")


def _opset_of(proto) -> int:
    for ident in proto.opset_import:
        if ident.domain in ("", "ai.onnx"):
            return ident.version
    return 1


def _node_label(node) -> str:
    """How errors name a node: its name, else its first output tensor."""
    if node.name:
        return f"'{node.name}'"
    return f"producing '{node.output[0]}'" if node.output else "(unnamed, no outputs)"


def _check_ops_supported(graph) -> None:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    known = set(_get_convert_map()) | {"If", "Constant"}
    bad = [n for n in _all_nodes(graph) if n.op_type not in known]
    if bad:
        others = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        fix = ("Erfc is not an ONNX op: TF >= 2.19 writes exact GELU with Erfc, which tf2onnx 1.17 cannot "
               "convert; export with TF <= 2.18, use gelu(approximate=True), or convert to TFLite "
               "(see docs/tensorflow.md)" if bad[0].op_type == "Erfc"
               else "replace the op in the model or register a converter")
        raise UnsupportedOpError(
            f"node {_node_label(bad[0])} has op type {bad[0].op_type}, which TVM's ONNX importer "
            f"cannot convert{others}: {fix}")


def _all_nodes(graph):
    """Every node of ``graph`` and of its subgraphs (If branches), outer ones first."""
    for node in graph.node:
        yield node
        for sub in _subgraphs(node).values():
            yield from _all_nodes(sub)


def _subgraphs(node) -> dict:
    """``{attribute name: GraphProto}`` of a node's subgraphs (an If's two branches)."""
    found = {}
    for attr in node.attribute:
        if attr.HasField("g"):
            found[attr.name] = attr.g
        for k, sub in enumerate(attr.graphs):
            found[f"{attr.name}[{k}]"] = sub
    return found


def branch_notes(graph) -> dict[str, str]:
    """Why each tensor and node computed inside an If branch has no value, by name.

    TVM 0.27 hoists all but the last ops of both branches out of the ``If`` (they run whichever
    branch is taken), and only the VM knows which branch it took: a value of the branch that did
    not run would be one the source model never computed.  So none is served; each note names
    the branch and its condition.
    """
    notes: dict[str, str] = {}

    def visit(graph, where: str) -> None:
        for node in graph.node:
            for attr_name, sub in _subgraphs(node).items():
                side = {"then_branch": "then", "else_branch": "else"}.get(attr_name, attr_name)
                cond = node.input[0] if node.input else "?"
                when = {"then": f"runs when {cond!r} is true", "else": f"runs when {cond!r} is false"}.get(side, "")
                inner = (f"it is computed inside the {side} branch of If {_node_label(node)}{where}"
                         f"{f' ({when})' if when else ''}: tvm_probe serves no value computed inside an If "
                         "branch (only the VM knows which branch ran); read the values the branch reads, "
                         "or the If's outputs")
                for inner_node in sub.node:
                    for name in [*inner_node.output, inner_node.name]:
                        if name:
                            notes.setdefault(name, inner)
                visit(sub, f" inside {_node_label(node)}")

    visit(graph, "")
    return notes


def _make_importer(shapes, import_fixes: bool = True, rank_of=None):
    """An instance of TVM's ONNX importer that records what each tensor becomes.

    It also applies the import fixes (:mod:`.fixes`) where a node's construct needs one, and
    turns a converter's failure into one line naming the node.  ``rank_of`` (tensor name →
    ONNX rank) tells the fixes what TVM's view of a shape value lost.
    """
    from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, onnx_input

    class _RecordingDict(dict):
        def __init__(self):
            super().__init__()
            self.history: dict[str, object] = {}

        def __setitem__(self, key, value):
            self.history[key] = value
            super().__setitem__(key, value)

    class _TaggingImporter(ONNXGraphImporter):
        def __init__(self):
            super().__init__(shapes, "float32")
            self._nodes = _RecordingDict()
            self.current_node = None
            self.fixes = FixLog()    # fixes applied
            self.unfixed = FixLog()  # constructs a fix would rewrite, left alone (fixes off)
            self.rank_of = rank_of or (lambda name: None)

        def _parse_value_proto(self, value_proto):
            # Called once per node just before it is converted: remember which node it is.
            if hasattr(value_proto, "op_type"):
                self.current_node = value_proto
            return super()._parse_value_proto(value_proto)

        def _convert_subgraph(self, bb, graph):
            # TVM converts an If branch with a plain-dict copy of the tensor table and puts
            # that copy back afterwards: put our recording table back instead, keeping what it
            # recorded inside the branch (ONNX tensor names are unique across subgraphs).
            recording = self._nodes
            try:
                return super()._convert_subgraph(bb, graph)
            finally:
                restored = self._nodes
                dict.clear(recording)
                dict.update(recording, restored)
                self._nodes = recording

        def _convert_operator(self, op_name, inputs, attrs, opset):
            node = self.current_node
            facts = OnnxNode(tuple(node.input), self.rank_of) if node is not None and rank_of else None
            fix = onnx_fix_for(op_name, inputs, attrs, facts)
            try:
                if fix is not None and import_fixes:
                    self.fixes.add(fix.fix, _source_label(node))
                    return self._apply(fix, op_name, inputs, attrs, opset)
                if fix is not None:
                    self.unfixed.add(fix.fix, _source_label(node))
                return super()._convert_operator(op_name, inputs, attrs, opset)
            except ProbeError:
                raise
            except Exception as err:
                if fix is None:
                    hint = ""
                elif import_fixes:
                    hint = f" (after import fix '{fix.fix.name}')"
                else:
                    hint = f": {off_hint(fix.fix)}"
                raise _import_failure(node, err, hint) from None

        def _apply(self, fix, op_name, inputs, attrs, opset):
            def convert(new_inputs):
                return super(_TaggingImporter, self)._convert_operator(
                    op_name, onnx_input(new_inputs), attrs, opset)
            return self.bb.normalize(fix.rewrite(self.bb, inputs, attrs, convert))

    return _TaggingImporter()


def _source_label(node) -> str:
    """How fix records name a node: its name, else its first output tensor."""
    if node is None:
        return ""
    return node.name or (node.output[0] if node.output else node.op_type)


def _collect(proto, mod, importer) -> ImportedModel:
    """Turn the importer's record into a SourceMap, var tags and constants."""
    from onnx import helper, numpy_helper
    from tvm import relax

    graph = proto.graph
    record = importer._nodes.history
    sources = SourceMap()
    var_keys: dict = {}
    params = list(mod["main"].params)

    initializers = {t.name: t for t in graph.initializer}
    constants = LazyArrays(numpy_helper.to_array, initializers)
    for name, tensor in initializers.items():
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        sources.add(SourceValue(key=name, op_type="Initializer", kind=Kind.PARAM,
                                shape=tuple(int(d) for d in tensor.dims), dtype=str(dtype)))
    inputs = []
    for vi in graph.input:
        if vi.name in initializers:
            continue  # older exporters list weights as inputs too; they are weights
        expr = record.get(vi.name)
        shape, dtype = tensor_info(expr)
        # shape None: declared without a rank; TVM compiles it so (any rank goes), as plain TVM does
        sources.add(SourceValue(key=vi.name, op_type="Input", kind=Kind.INPUT, shape=shape, dtype=dtype))
        sources.model_inputs.append(vi.name)
        bound, weight = _index_bound(graph, vi.name, initializers)
        inputs.append(InputSpec(vi.name, shape, dtype, bound, weight))
        var_keys.setdefault(expr, []).append(vi.name)

    bound_to = binding_of_value(mod)
    modules = _scope_modules(graph)
    shape_values: dict = {}
    for topo, node in enumerate(graph.node):
        outs = [o for o in node.output]
        for k, out in enumerate(outs):
            if not out or out not in record:
                continue
            expr = record[out]
            expr = bound_to.get(expr, expr)  # a converted op's Call, bound where first used
            value = SourceValue(key=out, node=node.name, op_type=node.op_type, output_index=k,
                                num_outputs=len(outs), topo_index=topo,
                                inputs=node_inputs(node), modules=modules.get(out, ()))
            rank = importer.rank_of(out) if _is_prim(expr) else None
            if rank:  # a tensor of one element TVM holds as a scalar: the source model's shape, or a note
                const = const_value(expr)
                if const is None:
                    sources.notes[out] = _scalar_rank_note(expr, rank)
                    _add_shape_value(sources, shape_values, value, expr, (1,) * rank)
                    continue
                expr = relax.const(const.reshape((1,) * rank))
            if isinstance(expr, relax.Var):
                value.kind = Kind.VALUE
                value.shape, value.dtype = tensor_info(expr)
                var_keys.setdefault(expr, []).append(out)
                _add_sequence_elements(sources, value, expr, record)
            elif isinstance(expr, relax.Tuple):  # SequenceConstruct, SequenceInsert...: a tuple literal
                _add_sequence_literal(sources, value, expr, record, var_keys, constants)
                continue
            elif isinstance(expr, relax.Call):
                value.shape, value.dtype = tensor_info(expr)  # never used: the import drops it
            else:
                const = const_value(expr)
                if const is None:  # an empty optional, or a shape value of symbolic dims
                    note = _symbolic_shape_note(expr)
                    if note:
                        sources.notes[out] = note
                        _add_shape_value(sources, shape_values, value, expr,
                                         (len(expr.values),) if isinstance(expr, relax.ShapeExpr) else ())
                    continue
                value.kind = Kind.CONSTANT
                value.shape, value.dtype = const.shape, str(const.dtype)
                constants[out] = const
            sources.add(value)
    follow_aliases(mod, var_keys)
    sources.notes.update({k: v for k, v in branch_notes(graph).items() if k not in sources})
    sources.model_outputs = [o.name for o in graph.output]
    # main's parameters come in graph-input order; the InputSpec list follows them.
    order = {p: i for i, p in enumerate(params)}
    inputs.sort(key=lambda s: order.get(record.get(s.name), 0))
    return ImportedModel(mod=mod, sources=sources, var_keys=var_keys, constants=constants,
                         inputs=inputs, hash_model=lambda: model_hash(proto),
                         fixes=importer.fixes.applied(), unfixed=importer.unfixed.applied(),
                         shape_values=shape_values)


def _add_sequence_elements(sources, value, expr, record) -> None:
    """A sequence (a Var of tuple type: SplitToSequence's output) is a value made of its
    elements: each element ``seq[k]`` is a source value of its own (the kernel map places it,
    a dump stores it), added right after the sequence; ``sources.sequences`` lists them, so
    that ``get(seq)`` answers every element."""
    fields = getattr(getattr(expr, "ty", None), "fields", None)
    if fields is None:
        return
    keys = [f"{value.key}[{k}]" for k in range(len(fields))]
    if any(k in record or k in sources for k in keys):  # (a tensor of the model has that name)
        return
    sources.add(value)
    for k, (key, field) in enumerate(zip(keys, fields)):
        shape, dtype = type_info(field)
        sources.add(SourceValue(key=key, op_type=value.op_type, output_index=value.output_index,
                                num_outputs=value.num_outputs, topo_index=value.topo_index,
                                inputs=value.inputs, shape=shape, dtype=dtype, modules=value.modules))
    sources.sequences[value.key] = keys


def _add_sequence_literal(sources, value, expr, record, var_keys: dict, constants) -> None:
    """A sequence TVM's import holds as a tuple literal (SequenceConstruct, SequenceInsert,
    SequenceEmpty: bound to no Var): a value made of its elements, each ``seq[k]`` tagged with
    the Var (or holding the constant) in its place, as :func:`_add_sequence_elements`.  Left out
    (as before: no value) when an element is anything else."""
    from tvm import relax

    fields = list(expr.fields)
    consts = [None if isinstance(f, relax.Var) else const_value(f) for f in fields]
    if any(not isinstance(f, relax.Var) and c is None for f, c in zip(fields, consts)):
        return
    value.kind = Kind.VALUE
    _add_sequence_elements(sources, value, expr, record)
    for key, field, const in zip(sources.sequences.get(value.key, ()), fields, consts):
        if const is not None:
            sources[key].kind = Kind.CONSTANT
            constants[key] = const
        else:
            var_keys.setdefault(field, []).append(key)


def _add_shape_value(sources, shape_values: dict, value, expr, shape: tuple) -> None:
    """A source value TVM computed at import as a shape expression of symbolic dims: a value
    like any other (the kernel map serves it from the run's input sizes when it can; the note
    says why not otherwise)."""
    value.kind, value.shape, value.dtype = Kind.VALUE, shape, "int64"
    sources.add(value)
    shape_values[value.key] = expr


def _dim_text(dim) -> str:
    """A dim as users write it: ``past + 1``, not TVMScript's ``past + T.int64(1)``."""
    text = str(dim if isinstance(dim, (int, str)) else dim_of(dim))
    return re.sub(r"T\.int(?:32|64)\((-?\d+)\)", r"\1", text)


def _is_prim(expr) -> bool:
    """A scalar shape value (TIR expression) where ONNX has a tensor."""
    import tvm

    return tvm.ir.is_prim_expr(expr)


def _scalar_rank_note(expr, onnx_rank: int) -> str:
    """Why a tensor of rank >= 1 that TVM holds as a symbolic scalar shape value is not served.

    TVM keeps a 1-element 1-D shape value (``cache_position = past + arange(1)``) as the scalar
    ``past``; served, it would come back 0-d where the source model has shape ``(1,)``."""
    return (f"the source model computes a {onnx_rank}-D tensor here, which TVM holds as the scalar "
            f"shape value {_dim_text(expr)}: a 0-d value would not be the source value; its consumers' "
            "values are served")


def _symbolic_shape_note(expr) -> str:
    """Why a shape value TVM computed symbolically at import has no value, or ``""``.

    TVM keeps shape arithmetic on symbolic dims as expressions (``R.shape([1, past + 1])``, a
    scalar ``past + 1``) that no kernel computes, so there is nothing to capture."""
    import tvm
    from tvm import relax

    if isinstance(expr, relax.ShapeExpr):
        text = "[" + ", ".join(_dim_text(v) for v in expr.values) + "]"
    elif tvm.ir.is_prim_expr(expr):
        text = _dim_text(expr)
    else:
        return ""
    return (f"TVM computes this shape value at import, as the symbolic expression {text}, and no "
            "kernel computes it at run time; import with shapes= to have it folded to a constant")


def _index_bound(graph, name: str, initializers: dict) -> tuple[int | None, str]:
    """The smallest table size ``name`` indexes through a ``Gather`` on a weight, and that weight."""
    bound, weight = None, ""
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] != name:
            continue
        table = initializers.get(node.input[0])
        if table is None:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        size = int(table.dims[axis])
        if bound is None or size < bound:
            bound, weight = size, node.input[0]
    return bound, weight


# -- module paths of dynamo-exported ONNX -----------------------------------------------------
# The dynamo exporter (torch.onnx.export(..., dynamo=True)) names nodes `node_linear_3`, which
# nobody knows; users know module paths.  Each node carries them in `pkg.torch.onnx.name_scopes`.

def _scope_modules(graph) -> dict[str, tuple[str, ...]]:
    """Module paths of the tensors of a dynamo-exported graph (empty for other exporters)."""
    scopes_of = [_name_scopes(node) for node in graph.node]  # by position: names may be empty
    if not any(scopes_of):
        return {}
    consumers: dict[str, list] = {o.name: [None] for o in graph.output}
    for node, scopes in zip(graph.node, scopes_of):
        for name in node.input:
            consumers.setdefault(name, []).append(scopes)
    values = [(out, scopes, consumers.get(out, []))
              for node, scopes in zip(graph.node, scopes_of) for out in node.output if out]
    return module_outputs(values)


def _name_scopes(node) -> dict[str, str]:
    """``{scope: scope}`` from a node's ``pkg.torch.onnx.name_scopes`` (a Python list literal)."""
    text = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    # the last entry names the fx node the ONNX node came from, not a module
    return {s: s for s in scopes[:-1]} if isinstance(scopes, list) else {}


class OnnxAdapter(ModelAdapter):
    """ONNX models: a ``.onnx`` path or an ``onnx.ModelProto`` (see :mod:`tvm_probe.importer.kinds`)."""

    kind, described, reference, config, shapes, graph = "onnx", "an ONNX model", "onnxruntime", "file", True, "onnx"

    def load(self, source, shapes=None):
        return load_onnx(source)

    def record(self, source, shapes=None) -> dict:
        return file_record(self.kind, source, shapes)

    def from_record(self, record):
        return file_from_record(self.kind, record)

    def source_graph(self, source, shapes=None) -> SourceGraph:
        return SourceGraph("onnx", source if not isinstance(source, (str, os.PathLike)) else Path(source))

    def owns(self, model) -> bool:
        onnx = sys.modules.get("onnx")  # an onnx.ModelProto exists only once onnx is imported
        return (isinstance(model, (str, os.PathLike)) and str(model).endswith(".onnx")) or \
            (onnx is not None and isinstance(model, onnx.ModelProto))

    def import_model(self, model, shapes=None, import_fixes: bool = True, sizes=None) -> ImportedModel:
        return import_onnx(model, static_shapes(shapes), import_fixes=import_fixes, sizes=sizes)
