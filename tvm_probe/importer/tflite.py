"""Import a TFLite model into Relax, tagging every runtime value with its TFLite tensor name.

TFLite tensors keep the names TensorFlow gave its ops (``.../layer_._0/attention/self/MatMul``).
When the converter fuses several TF ops into one TFLite op it joins their names with ``;``
(``.../dense/MatMul;.../dense/BiasAdd``): such a tensor answers to its full name and to each
part, by the usual suffix rules.  Its value is the fused op's output — a part names a TF op
that was fused into it, whose own TF value may differ (``dense/MatMul`` is before the bias).

TVM's TFLite frontend (``tvm.relax.frontend.tflite``) keeps an ``ExprTable`` of ``tensor name →
Relax expression`` while converting, and takes its operator converter as an argument.  We pass
a subclass that only (a) wraps every op converter so that a failure names the op and its
output tensor, and (b) keeps the table.  The ops are therefore exactly those of a plain import
(``tests/models/test_tflite.py`` checks structural equality).  Like the ONNX frontend, converters
return unbound Calls that normalisation binds where first used, so tags go through the
binding table (see :func:`tvm_probe.importer.relax_values.binding_of_value`).

TVM and the ``tflite`` schema package are imported lazily: ``import tvm_probe`` stays light.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Union

import numpy as np

from ..core.errors import ModelError, ProbeError, UnsupportedOpError, one_line
from ..core.install import install_hint
from ..core.records import sizes_remedy
from ..core.sources import Kind, SourceMap, SourceValue
from .adapter import ModelAdapter, SourceGraph, file_from_record, file_record, static_shapes
from .model import ImportedModel, InputSpec, LazyArrays
from .relax_values import binding_of_value, const_value, follow_aliases, tensor_info

log = logging.getLogger(__name__)

ModelLike = Union[str, os.PathLike, bytes, "TFLiteModel"]
# TFLite's TensorType codes → numpy dtypes (the types a weight buffer can hold)
_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 6: "bool", 7: "int16",
           9: "int8", 10: "float64", 12: "uint64", 15: "uint32", 16: "uint16"}


@dataclass(frozen=True)
class TFLiteModel:
    """A parsed ``.tflite`` file: its bytes (the interpreter's input) and the schema's root."""

    content: bytes
    model: object  # tflite.Model
    label: str     # how messages name it: the path, or "the TFLite model" for bytes

    @property
    def subgraph(self):
        return self.model.Subgraphs(0)


def load_tflite(model: ModelLike) -> TFLiteModel:
    """Read and parse a ``.tflite`` file (or its bytes), with a clear error for bad input."""
    if isinstance(model, TFLiteModel):
        return model
    content, label = _read_bytes(model)
    # every TFLite flatbuffer carries the file identifier "TFL3" at bytes 4..8
    if len(content) < 8 or content[4:8] != b"TFL3":
        raise ModelError(f"{label} is not a TFLite model (no 'TFL3' file identifier): give a .tflite file")
    tflite = require_tflite()
    try:
        root = tflite.Model.GetRootAsModel(content, 0)
        _walk(root)
    except Exception as err:  # flatbuffers raises struct/index errors on damaged files
        raise ModelError(f"{label} is a damaged TFLite model ({one_line(err)}): convert it again") from None
    if root.SubgraphsLength() < 1:
        raise ModelError(f"{label} has no subgraph: convert the model again")
    return TFLiteModel(content, root, label)


def _walk(root) -> None:
    """Read every table of the main subgraph once, so a truncated file fails here, not mid-import."""
    for i in range(root.OperatorCodesLength()):
        root.OperatorCodes(i).BuiltinCode()
    for i in range(root.BuffersLength()):
        buffer = root.Buffers(i)
        buffer.DataLength(), buffer.Offset()
    subgraph = root.Subgraphs(0) if root.SubgraphsLength() else None
    if subgraph is None:
        return
    subgraph.InputsAsNumpy(), subgraph.OutputsAsNumpy()
    for i in range(subgraph.TensorsLength()):
        tensor = subgraph.Tensors(i)
        tensor.Name(), tensor.ShapeAsNumpy(), tensor.Type(), tensor.Buffer()
    for i in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(i)
        op.OpcodeIndex(), op.InputsAsNumpy(), op.OutputsAsNumpy(), op.BuiltinOptions()


def _read_bytes(model: ModelLike) -> tuple[bytes, str]:
    if isinstance(model, (bytes, bytearray)):
        return bytes(model), "the model given as bytes"
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(f"cannot import a {type(model).__name__}: pass a path to a .tflite file or its bytes")
    path = Path(model)
    if not path.exists():
        raise ModelError(f"model file '{path}' does not exist: check the path")
    if not path.is_file():
        raise ModelError(f"model path '{path}' is not a file: give the path of a .tflite file")
    return path.read_bytes(), f"'{path}'"


def require_tflite():
    """The ``tflite`` schema package TVM's frontend reads models with, or a one-line ModelError."""
    try:
        import tflite
    except ImportError:
        raise ModelError(f"TVM's TFLite importer needs the 'tflite' package: {install_hint('tflite')}") from None
    return tflite


def model_hash(content: bytes) -> str:
    """sha256 of the file: a flatbuffer holds the graph and the weights in one buffer."""
    return hashlib.sha256(content).hexdigest()


# -- the graph as tvm_probe sees it ----------------------------------------------------------
def tensor_keys(subgraph) -> list[str]:
    """The source key of every tensor of ``subgraph``, by tensor index.

    A key is the tensor name, as TVM's importer spells it (``tvmgen_tensor_<i>`` when a tensor
    has none).  TVM looks tensors up by name, so two *computed* tensors sharing a name would be
    conflated: that raises.  A weight whose name an earlier tensor already has is keyed
    ``<name>#<index>``, since weights are read by index and are not conflated.
    """
    from tvm.relax.frontend.tflite.tflite_frontend import get_tensor_name

    names = [get_tensor_name(subgraph, i) for i in range(subgraph.TensorsLength())]
    computed = set(subgraph.InputsAsNumpy().tolist())
    for o in range(subgraph.OperatorsLength()):
        computed.update(int(t) for t in subgraph.Operators(o).OutputsAsNumpy() if t >= 0)
    first: dict[str, int] = {}
    keys = []
    for i, name in enumerate(names):
        if name not in first:
            first[name] = i
            keys.append(name)
            continue
        if i in computed or first[name] in computed:
            raise ModelError(
                f"tensors {first[name]} and {i} are both named {name!r}; TVM's TFLite importer looks "
                "tensors up by name and would conflate them: give them distinct names before converting")
        keys.append(f"{name}#{i}")
    return keys


def _op_code(converter, op) -> str:
    """The op's name as TVM's converter map spells it (``FULLY_CONNECTED``), or a description."""
    try:
        return converter.get_op_code_str(op)
    except NotImplementedError:  # custom ops, codes newer than the schema package
        code = converter.model.OperatorCodes(op.OpcodeIndex())
        custom = code.CustomCode()
        if custom:
            return f"custom op {custom.decode(errors='replace')!r}"
        return f"builtin op code {max(code.BuiltinCode(), code.DeprecatedBuiltinCode())}"


def _outputs_of(subgraph, op, keys: list[str]) -> list[str]:
    return [keys[t] for t in op.OutputsAsNumpy() if t >= 0]


def _op_label(subgraph, op, index: int, keys: list[str]) -> str:
    """How errors name a TFLite op (they have no names): its index and first output tensor."""
    outs = _outputs_of(subgraph, op, keys)
    return f"op {index} producing {outs[0]!r}" if outs else f"op {index} (no outputs)"


def merged_aliases(keys: list[str], computed: set[int]) -> dict[str, tuple[str, ...]]:
    """The parts of every merged name (``a;b`` → ``(a, b)``) of a computed tensor.

    Only op outputs answer to their parts: the converter also names weights after the ops
    that read them (a conv's bias ``.../Relu;.../BiasAdd;.../Conv2D``), and those parts name
    ops, not the weight.  A part that is itself some tensor's full name is left out: that
    tensor owns the name.
    """
    owned = set(keys)
    found = {}
    for index in sorted(computed):
        key = keys[index]
        if ";" not in key:
            continue
        parts = tuple(dict.fromkeys(p for p in key.split(";") if p and p not in owned))
        if parts:
            found[key] = parts
    return found


def signature_keys(model, keys: list[str]) -> dict[int, tuple[str, ...]]:
    """Tensor index → the signature keys it answers to, for the main subgraph's signatures.

    A model converted from a SavedModel names its tensors after TF's graph
    (``serving_default_input_ids:0``, ``StatefulPartitionedCall:0``); the names the user gave
    (``input_ids``, ``logits``) are the keys of its signatures.  A key that is some tensor's
    own name is left out: that tensor owns the name.
    """
    owned = set(keys)
    found: dict[int, list[str]] = {}
    for i in range(model.SignatureDefsLength()):
        signature = model.SignatureDefs(i)
        if signature.SubgraphIndex() != 0:
            continue
        maps = [signature.Inputs(j) for j in range(signature.InputsLength())]
        maps += [signature.Outputs(j) for j in range(signature.OutputsLength())]
        for entry in maps:
            name = (entry.Name() or b"").decode()
            if name and name not in owned and name not in found.setdefault(entry.TensorIndex(), []):
                found[entry.TensorIndex()].append(name)
    return {t: tuple(names) for t, names in found.items() if names}


# -- import ----------------------------------------------------------------------------------
def import_tflite(model: ModelLike, shapes: dict[str, tuple[int, ...]] | None = None) -> ImportedModel:
    """Import a TFLite model with every runtime value tagged by its tensor name.

    Only the main subgraph (subgraph 0) is a source graph; other subgraphs are bodies of
    control-flow ops and are converted by the ops that use them.

    Args:
        model: a path to a ``.tflite`` file, its bytes, or a :func:`load_tflite` result.
        shapes: static shapes for inputs, overriding those the model declares.

    Raises:
        ModelError: the file is missing or not TFLite, or the ``tflite`` package is missing;
        UnsupportedOpError: TVM cannot convert an op.
    """
    parsed = load_tflite(model)
    subgraph = parsed.subgraph
    keys = tensor_keys(subgraph)
    _check_shapes(shapes or {}, [keys[int(t)] for t in subgraph.InputsAsNumpy()])
    converter_cls, created = _make_converter(keys)
    from tvm.relax.frontend.tflite import from_tflite

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            mod = from_tflite(parsed.model, shape_dict=dict(shapes or {}), op_converter=converter_cls)
        except ProbeError:
            raise
        except Exception as err:
            raise ModelError(f"TVM's TFLite importer failed on {parsed.label}: {one_line(err)}") from None
    imported = _collect(parsed, mod, created[0], keys)
    _warn_about_shapes(shape_differences(parsed, imported))
    return imported


def _check_shapes(shapes: dict, input_names: list[str]) -> None:
    """``shapes`` may only name model inputs (TVM's importer would ignore other names)."""
    unknown = [n for n in shapes if n not in input_names]
    if unknown:
        raise ModelError(f"shapes names {unknown[0]!r}, which is not an input of the model; its inputs are "
                         + ", ".join(repr(n) for n in input_names))


def shape_differences(model, imported: ImportedModel) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Tensors TVM's importer gives another shape than the TFLite file declares.

    TVM 0.27 ignores ``keep_num_dims=False`` of FULLY_CONNECTED: a ``[1, 8, 64]`` input gives
    ``[1, 8, 32]`` where TFLite declares (and computes) ``[8, 32]``.  Such a value is served in
    TVM's shape, so a comparison with the TFLite interpreter reports it as a shape mismatch.

    Args:
        model: the ``.tflite`` path or bytes (or a :class:`TFLiteModel`) ``imported`` came from.

    Returns:
        ``{tensor key: (declared shape, TVM's shape)}``, in source order.
    """
    parsed = load_tflite(model)
    subgraph = parsed.subgraph
    index_of = {key: i for i, key in enumerate(tensor_keys(subgraph))}
    found = {}
    for value in imported.sources:
        if value.kind is not Kind.VALUE or value.shape is None or value.key not in index_of:
            continue
        tensor = subgraph.Tensors(index_of[value.key])
        declared = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
        if declared != tuple(value.shape):
            found[value.key] = (declared, tuple(value.shape))
    return found


def _warn_about_shapes(differences: dict) -> None:
    if not differences:
        return
    key, (declared, served) = next(iter(differences.items()))
    log.warning("TVM's TFLite importer gives %d tensor(s) another shape than the model declares (first %r: "
                "%s declared, %s in TVM); they are served in TVM's shape (see shape_differences)",
                len(differences), key, list(declared), list(served))


def _make_converter(keys: list[str]):
    """A subclass of TVM's ``OperatorConverter`` that names failing ops; and the instances made.

    ``from_tflite`` makes the first instance, for subgraph 0; control-flow converters make more
    (``type(self)(...)``) for the bodies they lower.
    """
    from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

    created: list = []

    class _NamingConverter(OperatorConverter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)
            self.convert_map = {name: self._naming_failures(convert)
                                for name, convert in self.convert_map.items()}

        def _naming_failures(self, convert):
            def wrapped(*args, op=None, **kwargs):
                try:
                    return convert(*args, op=op, **kwargs)
                except ProbeError:
                    raise
                except Exception as err:
                    raise UnsupportedOpError(
                        f"TVM's TFLite importer failed on {self._label(op)} ({_op_code(self, op)}): "
                        f"{one_line(err)}") from None
            return wrapped

        def _label(self, op) -> str:
            if self is not created[0] or op is None:
                return "an op of a control-flow body"
            index = next(i for i in range(self.subgraph.OperatorsLength())
                         if self.subgraph.Operators(i)._tab.Pos == op._tab.Pos)
            return _op_label(self.subgraph, op, index, keys)

        def check_unsupported_ops(self):
            """One line for the first op TVM cannot convert (TVM's own message is a list)."""
            if self is created[0]:
                _check_ops_supported(self, keys)
            try:
                super().check_unsupported_ops()
            except Exception as err:  # quantized variants TVM refuses; one line of TVM's list
                raise UnsupportedOpError(f"TVM's TFLite importer cannot convert this model: {one_line(err)}") from None

    return _NamingConverter, created


def _check_ops_supported(converter, keys: list[str]) -> None:
    subgraph = converter.subgraph
    bad = []
    for i in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(i)
        code = _op_code(converter, op)
        if code not in converter.convert_map:
            bad.append((i, op, code))
    if bad:
        i, op, code = bad[0]
        others = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UnsupportedOpError(
            f"{_op_label(subgraph, op, i, keys)} is a {code}, which TVM's TFLite importer cannot convert"
            f"{others}: convert the model with builtin ops only (no SELECT_TF_OPS or custom ops)")


# -- what each tensor became -----------------------------------------------------------------
def _collect(parsed: TFLiteModel, mod, converter, keys: list[str]) -> ImportedModel:
    """Turn the importer's expression table into a SourceMap, Var tags and constants."""
    from tvm import relax

    subgraph = parsed.subgraph
    table = converter.exp_tab.exprs  # tensor name → expression; weights are not in it
    sources, var_keys = SourceMap(), {}
    produced = {int(t) for o in range(subgraph.OperatorsLength())
                for t in subgraph.Operators(o).OutputsAsNumpy() if t >= 0}
    aliases = merged_aliases(keys, produced)
    signed = signature_keys(parsed.model, keys)
    for t, names in signed.items():
        aliases[keys[t]] = tuple(dict.fromkeys((*aliases.get(keys[t], ()), *names)))
    model_inputs = [int(t) for t in subgraph.InputsAsNumpy()]
    weights = {keys[t]: t for t in _weights(parsed, produced | set(model_inputs))}
    # weights are read from the file on first access: no copy of every weight up front
    constants = LazyArrays(lambda t: _buffer_value(parsed, t), weights)

    inputs = []
    for t in model_inputs:
        inputs.append(_add_input(keys[t], table.get(keys[t]), sources, var_keys, aliases.get(keys[t], ())))
    inputs = _with_index_bounds(parsed, converter, keys, inputs)
    for key, t in weights.items():
        sources.add(_weight_value(parsed.subgraph.Tensors(t), key))

    bound_to = binding_of_value(mod)
    for index in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(index)
        outs = [int(t) for t in op.OutputsAsNumpy() if t >= 0]
        reads = tuple(keys[t] for t in op.InputsAsNumpy() if t >= 0)
        for k, t in enumerate(outs):
            key = keys[t]
            value = SourceValue(key=key, op_type=_op_code(converter, op), output_index=k,
                                num_outputs=len(outs), topo_index=index, inputs=reads,
                                aliases=aliases.get(key, ()))
            expr = table.get(key)
            if expr is None and key in converter.prefetched_nodes:  # e.g. DENSIFY: done at import
                expr = relax.const(converter.prefetched_nodes[key])
            _add_computed(value, bound_to.get(expr, expr), var_keys, constants)
            sources.add(value)
    follow_aliases(mod, var_keys)
    sources.model_inputs = [s.name for s in inputs]
    sources.model_outputs = [keys[int(t)] for t in subgraph.OutputsAsNumpy()]
    return ImportedModel(mod=mod, sources=sources, var_keys=var_keys, constants=constants, inputs=inputs,
                         hash_model=lambda: model_hash(parsed.content))


def _add_input(key: str, var, sources: SourceMap, var_keys: dict, aliases: tuple[str, ...] = ()) -> InputSpec:
    shape, dtype = tensor_info(var)
    if shape is None:
        raise ModelError(f"input '{key}' has no static shape", remedy=sizes_remedy(key))
    sources.add(SourceValue(key=key, op_type="Input", kind=Kind.INPUT, shape=shape, dtype=dtype, aliases=aliases))
    var_keys.setdefault(var, []).append(key)
    return InputSpec(key, shape, dtype, aliases=aliases)


def _add_computed(value: SourceValue, expr, var_keys: dict, constants) -> None:
    """Fill in an op output from the expression TVM's importer made of it."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        value.kind = Kind.VALUE
        value.shape, value.dtype = tensor_info(expr)
        var_keys.setdefault(expr, []).append(value.key)
    elif isinstance(expr, relax.Expr) and not isinstance(expr, relax.Call):
        const = const_value(expr)
        if const is not None:  # folded at import time (e.g. a shape computed from static dims)
            value.kind, value.shape, value.dtype = Kind.CONSTANT, const.shape, str(const.dtype)
            constants[value.key] = const
    elif isinstance(expr, relax.Call):  # never bound: nothing reads it (the import drops it)
        value.shape, value.dtype = tensor_info(expr)
    # no expression at all: a live value without a place is reported as such by the kernel map


def _weights(parsed: TFLiteModel, not_weights: set[int]) -> list[int]:
    """Indices of the tensors ops read that hold data in the file (weights, constants)."""
    subgraph, model = parsed.subgraph, parsed.model
    read = sorted({int(t) for o in range(subgraph.OperatorsLength())
                   for t in subgraph.Operators(o).InputsAsNumpy() if t >= 0} - not_weights)
    found = []
    for t in read:
        buffer = model.Buffers(subgraph.Tensors(t).Buffer())
        if buffer is not None and (buffer.DataLength() > 0 or buffer.Offset() > 1):
            found.append(t)
    return found


def _weight_value(tensor, key: str) -> SourceValue:
    shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
    dtype = _DTYPES.get(tensor.Type(), f"tflite type {tensor.Type()}")
    return SourceValue(key=key, op_type="Weight", kind=Kind.PARAM, shape=shape, dtype=dtype)


def _buffer_value(parsed: TFLiteModel, t: int) -> np.ndarray:
    """A weight's value from the file (data inline, or at an offset for models over 2 GB)."""
    tensor = parsed.subgraph.Tensors(t)
    buffer = parsed.model.Buffers(tensor.Buffer())
    dtype = _DTYPES.get(tensor.Type())
    if dtype is None:
        raise ModelError(f"weight {t} of {parsed.label} has TFLite type {tensor.Type()}, which tvm_probe "
                         "cannot read")
    if buffer.Offset() > 1:
        raw = parsed.content[buffer.Offset(): buffer.Offset() + buffer.Size()]
    else:
        raw = buffer.DataAsNumpy().tobytes()
    shape = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def _with_index_bounds(parsed: TFLiteModel, converter, keys: list[str], inputs: list[InputSpec]) -> list[InputSpec]:
    """Inputs that index a weight through GATHER get its row count as ``index_bound``.

    TVM converts GATHER to ``take(mode="fast")``, which reads out of memory for bad ids.
    """
    from tflite.GatherOptions import GatherOptions

    subgraph = parsed.subgraph
    by_key = {s.name: s for s in inputs}
    for i in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(i)
        if _op_code(converter, op) != "GATHER" or op.InputsLength() < 2:
            continue
        table, ids = int(op.Inputs(0)), int(op.Inputs(1))
        spec = by_key.get(keys[ids])
        if spec is None or table < 0 or table in {int(t) for t in subgraph.InputsAsNumpy()}:
            continue
        options = GatherOptions()
        options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        dims = subgraph.Tensors(table).ShapeAsNumpy()
        size = int(dims[options.Axis() % len(dims)])
        if spec.index_bound is None or size < spec.index_bound:
            # TFLite's GATHER takes no negative ids (the interpreter stops on them)
            by_key[spec.name] = replace(spec, index_bound=size, indexes=keys[table], negative_ids=False)
    return [by_key[s.name] for s in inputs]


class TFLiteAdapter(ModelAdapter):
    """TFLite models: a ``.tflite`` path, its bytes or a :func:`load_tflite` result."""

    kind, described, reference, config, shapes, graph = "tflite", "a TFLite model", "tflite", "file", True, "tflite"

    def load(self, source, shapes=None):
        return load_tflite(source)

    def record(self, source, shapes=None) -> dict:
        return file_record(self.kind, source, shapes)

    def from_record(self, record):
        return file_from_record(self.kind, record)

    def source_graph(self, source, shapes=None) -> SourceGraph:
        return SourceGraph("tflite", Path(source))

    def owns(self, model) -> bool:
        return isinstance(model, (TFLiteModel, bytes, bytearray)) or \
            (isinstance(model, (str, os.PathLike)) and str(model).endswith(".tflite"))

    def import_model(self, model, shapes=None, import_fixes: bool = True, sizes=None) -> ImportedModel:
        return import_tflite(model, static_shapes(shapes))
