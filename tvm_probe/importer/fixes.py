"""Import fixes: small rewrites of constructs that TVM 0.27 cannot import or compile.

Exporters emit constructs that TVM's importers turn into modules that cannot be built at all
(the import raises, or LLVM rejects the generated code).  Users meet them on models they cannot
edit, so the importers rewrite each such construct into an equivalent TVM handles, and record
that they did.  The rules:

* a fix applies only to a construct whose plain import **cannot build at all**; a construct TVM
  compiles but computes wrongly is what a user is debugging, and is never rewritten;
* each rewrite computes exactly what the source op computes (tested against onnxruntime /
  eager PyTorch on the construct's minimal graph, ``tests/importer/test_fixes.py``);
* each fix used is recorded as an :class:`AppliedFix` (fix name, what it does, the source ops it
  touched) in :attr:`ImportedModel.fixes`, so summaries, reports and dumps can say so;
* ``import_fixes=False`` turns them off; then the TVM error names the construct and the fix.

ONNX fixes (checked in ``_convert_operator`` of the ONNX importer, before TVM's converter):

==========================  ===========================================================
fix                         upstream symptom (TVM 0.27.0.post1)
==========================  ===========================================================
constant_of_shape_scalar    ``ConstantOfShape`` of an empty shape (transformers-5 masks, legacy
                            exporter): "broadcast_to expects the input shape to have the number
                            of ndim at least as the input tensor's ... ndim 0"
reshape_scalar_shape_value  ``Reshape`` of a shape value TVM keeps as a scalar (dynamo exporter,
                            ``sym_size`` arithmetic): "Reshape expects the input data to be a
                            Tensor. However, the given input is ir.PrimType"
reshape_unknown_shape       ``Reshape`` with a ``-1`` of a tensor whose shape TVM lost (dynamo
                            exporter): "Reshape expects the input tensor to have known shape
                            when there is some dimension length to infer"
shape_value_as_tensor       ``Gather`` from the ``Shape`` of a tensor whose shape TVM lost:
                            "shape_of expects a tensor input, but received R.Shape(ndim=3)"
global_pool_unknown_shape   ``GlobalAveragePool`` / ``GlobalMaxPool`` of a tensor whose shape
                            TVM lost (tf2onnx): "object of type 'NoneType' has no len()"
unsqueeze_shape_value       ``Unsqueeze`` of a 1-element 1-D shape value TVM holds as a scalar
                            (``cache_position`` of a decoder exported with a dynamic past):
                            "Unsqueeze axis 1 is out of range for rank 1", or a ``ShapeExpr``
                            one rank short that the next op refuses: "cannot handle ShapeExpr
                            inputs"
==========================  ===========================================================

PyTorch fix (in the converter map of the ``torch.export`` importer):

==========================  ===========================================================
bool_compare_constant       ``mask == 0`` / ``mask != 1`` on a bool tensor imports as
                            ``R.equal(mask, R.const(False, "bool"))``, which LLVM rejects:
                            "fcmp oeq i1"; becomes ``logical_not(mask)`` or ``mask`` itself
bool_cumsum                 ``cumsum`` of a bool tensor (transformers-5 masks without
                            ``attention_mask``) sums in bool: "Check failed:
                            (t.MatchesCode(kDLFloat))"; sums in int64, as torch does
cat_empty_1d                ``cat`` of a 1-D empty tensor with 4-D keys (``DynamicLayer``):
                            "Concat expects all input tensors to have same ndim"; the empty
                            operand is left out, as torch does
index_put_short_indices     ``index_put(cache, [None, None, pos], v)``: "IndexPut requires the
                            number of index tensors (3) to match the data tensor dimensions
                            (4)"; every axis gets an explicit index
==========================  ===========================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core.records import AppliedFix  # noqa: F401  (made here, kept there)


@dataclass(frozen=True)
class ImportFix:
    """One known construct TVM 0.27 cannot build, and the rewrite that replaces it.

    Attributes:
        name: how reports and errors name the fix.
        frontend: ``"onnx"`` or ``"torch"``.
        does: what the rewrite does, in one line.
        symptom: TVM's own error on the plain import or build, shortened.
    """

    name: str
    frontend: str
    does: str
    symptom: str


@dataclass
class FixLog:
    """The fixes one import used (or, with fixes off, would have used), per fix, in first-use order."""

    touched: dict[str, list[str]] = field(default_factory=dict)

    def add(self, fix: ImportFix, source: str) -> None:
        """Record that ``fix`` concerns the source op ``source``."""
        self.touched.setdefault(fix.name, []).append(source)

    def applied(self) -> list[AppliedFix]:
        """One :class:`AppliedFix` per fix, with every source op it concerned."""
        return [AppliedFix(name, FIXES[name].does, FIXES[name].symptom, tuple(sources))
                for name, sources in self.touched.items()]


def off_hint(fix: ImportFix) -> str:
    """What an import error says when a fix that would apply is off."""
    return f"import fix '{fix.name}' ({fix.does}) rewrites this construct: import with import_fixes=True"


def unfixed_hint(unfixed: list[AppliedFix]) -> str:
    """What a *build* error adds when the import left constructs a fix rewrites (fixes off).

    ``ImportedModel.unfixed`` lists them; e.g. ``mask == 0`` on a bool tensor imports fine and
    only LLVM rejects it, so the build stage appends this to its one-line error.
    """
    if not unfixed:
        return ""
    first = unfixed[0]
    ops = ", ".join(repr(s) for s in first.sources[:3]) + (" ..." if len(first.sources) > 3 else "")
    more = f" (and {len(unfixed) - 1} more import fixes)" if len(unfixed) > 1 else ""
    return (f"the model has a construct TVM 0.27 cannot build at {ops}: import fix '{first.name}' "
            f"({first.does}) rewrites it{more}: import with import_fixes=True")


# -- ONNX ------------------------------------------------------------------------------------
# Each ONNX fix is a predicate on (inputs, attrs) — exactly the condition under which TVM's own
# converter fails — and a rewrite(bb, inputs, attrs, convert) returning the Relax expression;
# ``convert(inputs)`` runs TVM's converter for the node on (rewritten) inputs.

Convert = Callable[[list], Any]


@dataclass(frozen=True)
class OnnxNode:
    """What the ONNX graph says of the node being converted, where TVM's view of its inputs
    lost it: the rank ONNX shape inference gives each input (TVM holds a 1-element 1-D shape
    value as a scalar).

    Attributes:
        inputs: the node's input tensor names.
        rank_of: tensor name → its ONNX rank, None when inference cannot tell (called only by
            the fixes that need it: inference runs on first use).
    """

    inputs: tuple[str, ...] = ()
    rank_of: Callable[[str], int | None] = lambda name: None

    def input_rank(self, i: int) -> int | None:
        """The ONNX rank of input ``i``, or None."""
        return self.rank_of(self.inputs[i]) if i < len(self.inputs) and self.inputs[i] else None


@dataclass(frozen=True)
class OnnxFix:
    """An ImportFix for ONNX: the ops it concerns, when it applies, and the rewrite.

    ``matches(inputs, attrs, node)`` sees TVM's converted inputs, the node's attributes and the
    :class:`OnnxNode` facts; ``rewrite(bb, inputs, attrs, convert)`` returns the Relax expression.
    """

    fix: ImportFix
    ops: tuple[str, ...]
    matches: Callable[[list, dict, OnnxNode], bool]
    rewrite: Callable[[Any, list, dict, Convert], Any]


def _is_tensor_const(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.GenericConst)


def _lost_shape(expr) -> bool:
    """A tensor whose rank TVM knows but whose dimensions it lost."""
    from tvm import relax

    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim >= 0


def _empty_constant_shape(inputs, attrs, node=None) -> bool:
    """An empty constant shape and a 1-D ``value``: TVM broadcasts the 1-D value to rank 0.

    (Without ``value`` TVM broadcasts a 0-d zero, which works: no fix.)
    """
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import get_numpy

    if attrs.get("value") is None or np.asarray(get_numpy(attrs["value"])).ndim == 0:
        return False
    shape = inputs[0]
    if isinstance(shape, relax.ShapeExpr):
        return len(shape.values) == 0
    return _is_tensor_const(shape) and shape.value.numpy().size == 0


def _scalar_constant(bb, inputs, attrs, convert):
    """ConstantOfShape([]) is the 0-d tensor holding ``value``'s one element."""
    from tvm import relax
    from tvm.relax.frontend.onnx.onnx_frontend import get_numpy

    value = np.asarray(get_numpy(attrs["value"]))
    return relax.const(value.reshape(-1)[:1].reshape(()), str(value.dtype))


def _prim_data(inputs, attrs, node=None) -> bool:
    """The data is a scalar shape value (a PrimValue), which Relax's reshape refuses."""
    import tvm

    data = inputs[0]
    return isinstance(getattr(data, "ty", None), tvm.ir.PrimType) and tvm.ir.is_prim_expr(data)


def _prim_as_1d_tensor(bb, value):
    """The 1-element 1-D tensor holding the scalar shape value ``value``, in its dtype."""
    from tvm import relax, tirx

    dtype = str(value.ty.dtype)
    as_int64 = value if dtype == "int64" else tirx.Cast("int64", value)
    tensor = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([as_int64])))
    return tensor if dtype == "int64" else bb.normalize(relax.op.astype(tensor, dtype))


def _prim_as_tensor_first(bb, inputs, attrs, convert):
    """Convert the node with the scalar made the 1-element 1-D tensor ONNX holds (Reshape: which
    ignores the input's rank; Unsqueeze: whose input ONNX gives rank 1)."""
    return convert([_prim_as_1d_tensor(bb, inputs[0]), *inputs[1:]])


def _infers_on_lost_shape(inputs, attrs, node=None) -> bool:
    """The data's dims are lost and the target shape, known at import, has a -1 to infer."""
    from tvm import relax, tirx

    shape = inputs[1]
    if isinstance(shape, relax.ShapeExpr):
        dims = [int(v) for v in shape.values if isinstance(v, tirx.IntImm)]
    elif _is_tensor_const(shape):
        dims = shape.value.numpy().reshape(-1).tolist()
    else:
        return False
    return _lost_shape(inputs[0]) and -1 in dims


def _reshape_after_match_cast(bb, inputs, attrs, convert):
    """Name the lost dimensions (``match_cast`` to fresh symbolic dims), then reshape as usual."""
    from tvm import relax, tirx

    data = inputs[0]
    dims = [tirx.Var(f"reshape_in_dim{i}", "int64") for i in range(data.ty.ndim)]
    named = bb.match_cast(data, relax.TensorType(dims, data.ty.dtype))
    return convert([named, *inputs[1:]])


def _gather_from_shape_value(inputs, attrs, node=None) -> bool:
    """The data is a shape computed at run time (``R.shape_of``), not a ShapeExpr TVM can index."""
    from tvm import relax

    data = inputs[0]
    return isinstance(getattr(data, "ty", None), relax.ShapeType) and not isinstance(data, relax.ShapeExpr)


def _shape_to_tensor_first(bb, inputs, attrs, convert):
    """Gather from the int64 tensor of the shape (what ONNX's Shape outputs)."""
    from tvm import relax

    return convert([bb.normalize(relax.op.shape_to_tensor(inputs[0])), *inputs[1:]])


def _global_pool_lost_shape(inputs, attrs, node=None) -> bool:
    """TVM's converter takes the rank from the dims, which it lost (the rank it still knows)."""
    return _lost_shape(inputs[0])


def _global_pool_by_rank(op: str):
    """The rewrite of ``op``: TVM's own reduction (mean or max), over the axes after N, C."""
    def rewrite(bb, inputs, attrs, convert):
        from tvm import relax

        axes = list(range(2, inputs[0].ty.ndim))
        reduce = relax.op.mean if op == "GlobalAveragePool" else relax.op.max
        return reduce(inputs[0], axis=axes, keepdims=True)
    return rewrite


def _scalar_holding_1d_shape_value(inputs, attrs, node=None) -> bool:
    """The data is a shape value TVM holds as a scalar (a PrimExpr) where ONNX has a 1-element
    1-D tensor: TVM's Unsqueeze takes it as rank 0, so axis 1 is "out of range", and axis 0
    gives a ShapeExpr one rank short, which the next op refuses ("cannot handle ShapeExpr")."""
    return _prim_data(inputs, attrs) and node is not None and node.input_rank(0) == 1


CONSTANT_OF_SHAPE_SCALAR = ImportFix(
    "constant_of_shape_scalar", "onnx",
    "ConstantOfShape of an empty shape becomes the 0-d constant it is",
    "broadcast_to expects the input shape to have the number of ndim at least as the input "
    "tensor's ... ndim 1 while the target shape has ndim 0")
RESHAPE_SCALAR_SHAPE_VALUE = ImportFix(
    "reshape_scalar_shape_value", "onnx",
    "a shape value TVM holds as a scalar is made a 1-element int64 tensor before Reshape",
    "Reshape expects the input data to be a Tensor. However, the given input is ir.PrimType")
RESHAPE_UNKNOWN_SHAPE = ImportFix(
    "reshape_unknown_shape", "onnx",
    "the input's lost dimensions are named (match_cast) so Reshape can infer its -1",
    "Reshape expects the input tensor to have known shape when there is some dimension length "
    "to infer")
SHAPE_VALUE_AS_TENSOR = ImportFix(
    "shape_value_as_tensor", "onnx",
    "Gather reads the computed shape as the int64 tensor ONNX's Shape outputs",
    "shape_of expects a tensor input, but received R.Shape(ndim=...)")
GLOBAL_POOL_UNKNOWN_SHAPE = ImportFix(
    "global_pool_unknown_shape", "onnx",
    "global pooling reduces the axes after N, C from the rank TVM still knows",
    "object of type 'NoneType' has no len()")
UNSQUEEZE_SHAPE_VALUE = ImportFix(
    "unsqueeze_shape_value", "onnx",
    "a 1-element 1-D shape value TVM holds as a scalar is made the 1-D tensor ONNX has before Unsqueeze",
    "Unsqueeze axis 1 is out of range for rank 1 (or, one node later, cannot handle ShapeExpr inputs)")
BOOL_COMPARE_CONSTANT = ImportFix(
    "bool_compare_constant", "torch",
    "comparing a bool tensor with 0/1/False/True becomes logical_not or the tensor itself",
    "LLVM rejects R.equal on bool tensors: fcmp oeq i1")

FIXES: dict[str, ImportFix] = {f.name: f for f in (
    CONSTANT_OF_SHAPE_SCALAR, RESHAPE_SCALAR_SHAPE_VALUE, RESHAPE_UNKNOWN_SHAPE, SHAPE_VALUE_AS_TENSOR,
    GLOBAL_POOL_UNKNOWN_SHAPE, UNSQUEEZE_SHAPE_VALUE, BOOL_COMPARE_CONSTANT)}

ONNX_FIXES: tuple[OnnxFix, ...] = (
    OnnxFix(CONSTANT_OF_SHAPE_SCALAR, ("ConstantOfShape",), _empty_constant_shape, _scalar_constant),
    OnnxFix(RESHAPE_SCALAR_SHAPE_VALUE, ("Reshape",), _prim_data, _prim_as_tensor_first),
    OnnxFix(RESHAPE_UNKNOWN_SHAPE, ("Reshape",), _infers_on_lost_shape, _reshape_after_match_cast),
    OnnxFix(SHAPE_VALUE_AS_TENSOR, ("Gather",), _gather_from_shape_value, _shape_to_tensor_first),
    OnnxFix(GLOBAL_POOL_UNKNOWN_SHAPE, ("GlobalAveragePool",), _global_pool_lost_shape,
            _global_pool_by_rank("GlobalAveragePool")),
    OnnxFix(GLOBAL_POOL_UNKNOWN_SHAPE, ("GlobalMaxPool",), _global_pool_lost_shape,
            _global_pool_by_rank("GlobalMaxPool")),
    OnnxFix(UNSQUEEZE_SHAPE_VALUE, ("Unsqueeze",), _scalar_holding_1d_shape_value, _prim_as_tensor_first),
)


def onnx_fix_for(op_name: str, inputs: list, attrs: dict, node: OnnxNode | None = None) -> OnnxFix | None:
    """The ONNX fix for this node's construct, or None when TVM's converter handles it.

    ``node`` gives what the ONNX graph knows of the node (ranks); without it, fixes that need
    it do not apply.
    """
    for candidate in ONNX_FIXES:
        if (op_name in candidate.ops and inputs and inputs[0] is not None
                and candidate.matches(inputs, attrs, node)):
            return candidate
    return None


# -- PyTorch ---------------------------------------------------------------------------------
_BOOL_COMPARES = {"eq.Scalar": False, "ne.Scalar": True}  # converter → negated
BOOL_COMPARE_CONVERTERS = tuple(_BOOL_COMPARES)


def bool_compare_rewrite(convert_name: str, lhs, rhs) -> str | None:
    """For ``lhs == rhs`` / ``lhs != rhs``: ``"not"``, ``"identity"`` or None (no fix applies).

    Applies when ``lhs`` is a bool Relax tensor and ``rhs`` a Python 0, 1, False or True; other
    constants keep TVM's conversion (``mask == 2`` is not a construct this fix understands).
    """
    from tvm import relax

    if convert_name not in _BOOL_COMPARES:
        return None
    ty = getattr(lhs, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.dtype != "bool":
        return None
    if isinstance(rhs, bool) or (isinstance(rhs, int) and rhs in (0, 1)):
        keeps_true = bool(rhs) != _BOOL_COMPARES[convert_name]  # mask == 1, mask != 0
        return "identity" if keeps_true else "not"
    return None


# -- PyTorch: converter-level fixes (HF decoders, functional KV caches) ----------------------
# Each is a TorchFix: ``matches(importer, node)`` is exactly the condition under which TVM's
# converter yields a module that cannot build (or the import raises); ``rewrite(importer, node)``
# emits the equivalent Relax with TVM's own ops.  The torch importer wraps the named converters.

@dataclass(frozen=True)
class TorchFix:
    """An ImportFix for ``torch.export`` programs: the converters it wraps, when, and how."""

    fix: ImportFix
    converters: tuple[str, ...]
    matches: Callable[[Any, Any], bool]
    rewrite: Callable[[Any, Any], Any]


def _relax_dtype(expr) -> str | None:
    return getattr(getattr(expr, "ty", None), "dtype", None)


def _fx_dtype(node) -> str | None:
    """The dtype torch records for an fx node's value (``int64``), or None."""
    val = node.meta.get("val")
    return str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else None


def _bool_cumsum(importer, node) -> bool:
    """``cumsum`` of a bool tensor with no dtype: TVM sums in bool, which LLVM cannot build."""
    data = importer.env.get(node.args[0]) if node.args and hasattr(node.args[0], "op") else None
    return _relax_dtype(data) == "bool" and "dtype" not in node.kwargs and _fx_dtype(node) is not None


def _cumsum_in_result_dtype(importer, node):
    """Sum in the dtype torch gives the result (int64 for bool): ``cumsum(x, dim, dtype=int64)``."""
    from tvm import relax

    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    data = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.op.cumsum(data, dim, _fx_dtype(node)))


BOOL_CUMSUM = ImportFix(
    "bool_cumsum", "torch",
    "cumsum of a bool tensor sums in the result dtype torch gives it (int64), not in bool",
    "building cumsum of a bool tensor fails on llvm: Check failed: (t.MatchesCode(kDLFloat))")

def _legacy_empty_operands(importer, node) -> list:
    """The operands of ``cat`` that are 1-D and empty while another has a higher rank: torch
    skips them (its legacy rule), TVM's concat refuses the ranks."""
    operands = node.args[0] if node.args and isinstance(node.args[0], (list, tuple)) else ()
    exprs = [importer.env.get(a) if hasattr(a, "op") else None for a in operands]
    ranks = [getattr(getattr(e, "ty", None), "ndim", -1) for e in exprs]
    if not exprs or None in exprs or max(ranks) <= 1:
        return []
    return [i for i, (e, rank) in enumerate(zip(exprs, ranks))
            if rank == 1 and _static_dims(e) == [0]]


def _static_dims(expr) -> list | None:
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        return None
    return [int(v) if hasattr(v, "value") else None for v in values]


def _cat_with_empty_1d(importer, node) -> bool:
    return bool(_legacy_empty_operands(importer, node))


def _cat_without_empty_1d(importer, node):
    """Concatenate the other operands (at least one remains: the one of higher rank)."""
    from tvm import relax

    skip = set(_legacy_empty_operands(importer, node))
    kept = [importer.env[a] for i, a in enumerate(node.args[0]) if i not in skip]
    axis = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if len(kept) == 1:
        return kept[0]
    return importer.block_builder.emit(relax.op.concat(kept, axis=axis))


CAT_EMPTY_1D = ImportFix(
    "cat_empty_1d", "torch",
    "cat leaves out 1-D empty operands, as torch does (transformers' DynamicLayer starts its cache so)",
    "Concat expects all input tensors to have same ndim")

def _short_index_layout(importer, node):
    """``(data, full index list, first advanced axis)`` for an ``index_put`` with fewer index
    tensors than data dimensions (``cache[:, :, pos] = v``: ``[None, None, pos]`` on 4-D),
    which TVM's converter passes on short; None when this fix does not apply."""
    if len(node.args) < 3 or not isinstance(node.args[1], (list, tuple)):
        return None
    data = importer.env.get(node.args[0]) if hasattr(node.args[0], "op") else None
    dims = _static_dims(data)
    indices = list(node.args[1])
    if not dims or None in dims or len(indices) >= len(dims):
        return None
    full = indices + [None] * (len(dims) - len(indices))
    advanced = [i for i, x in enumerate(full) if x is not None]
    exprs = [importer.env.get(full[i]) for i in advanced]
    if (not advanced or advanced != list(range(advanced[0], advanced[-1] + 1))  # torch moves split ones first
            or any(_static_dims(e) is None or None in _static_dims(e) for e in exprs)
            or any(getattr(e.ty, "dtype", "") == "bool" for e in exprs)):
        return None
    return data, full, advanced[0]


def _index_put_short(importer, node) -> bool:
    return _short_index_layout(importer, node) is not None


def _index_put_full_grid(importer, node):
    """Index every axis: the index tensors broadcast together in place of their axes, each other
    axis an ``arange`` on an axis of its own; the values broadcast to that grid (as torch does)."""
    from tvm import relax

    bb, (data, full, first) = importer.block_builder, _short_index_layout(importer, node)
    dims = _static_dims(data)
    advanced = [importer.env[x] for x in full if x is not None]
    adv_shape = list(np.broadcast_shapes(*[tuple(_static_dims(e)) for e in advanced]))
    last = first + len(advanced) - 1
    grid = dims[:first] + adv_shape + dims[last + 1:]
    rank, indices = len(grid), []
    for axis, index in enumerate(full):
        if index is None:
            at = axis if axis < first else axis - last - 1 + first + len(adv_shape)
            shape = [1] * rank
            shape[at] = dims[axis]
            rng = bb.emit(relax.op.arange(0, dims[axis], 1, "int64"))
            indices.append(bb.emit(relax.op.reshape(rng, shape)))
        else:
            own = _static_dims(importer.env[index])
            shape = [1] * first + [1] * (len(adv_shape) - len(own)) + own + [1] * (rank - first - len(adv_shape))
            indices.append(bb.emit(relax.op.reshape(importer.env[index], shape)))
    indices = [bb.emit(relax.op.broadcast_to(i, grid)) for i in indices]
    values = importer.env[node.args[2]] if hasattr(node.args[2], "op") else relax.const(node.args[2], data.ty.dtype)
    values = bb.emit(relax.op.broadcast_to(values, grid))
    accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
    return bb.emit(relax.op.index_put(data, relax.Tuple(indices), values, accumulate))


INDEX_PUT_SHORT = ImportFix(
    "index_put_short_indices", "torch",
    "index_put with fewer index tensors than dimensions ([None, None, pos]) indexes every axis explicitly",
    "IndexPut requires the number of index tensors (3) to match the data tensor dimensions (4)")

_MATMULS = ("mm.default", "matmul.default", "bmm.default", "addmm.default")


def _matmul_in_half(importer, node) -> bool:
    """A matrix product torch computes in float16/bfloat16: TVM's converters give it float32
    (``out_dtype="float32"`` always), and the next op mixing it with a half tensor fails."""
    return _fx_dtype(node) in ("float16", "bfloat16")


def _matmul_stored_in_torch_dtype(importer, node):
    """Accumulate in float32 as TVM's converter does (and torch on CPU), then store the result
    in torch's dtype; ``addmm`` adds ``beta * input`` in that dtype."""
    from tvm import relax

    bb, dtype = importer.block_builder, _fx_dtype(node)
    operands = node.args[1:3] if node.target.__name__.startswith("addmm") else node.args[:2]
    product = bb.emit(relax.op.linear_algebra.matmul(importer.env[operands[0]], importer.env[operands[1]],
                                                     out_dtype="float32"))
    result = bb.emit(relax.op.astype(product, dtype))
    if not node.target.__name__.startswith("addmm"):
        return result
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    if alpha != 1:
        result = bb.emit(relax.op.multiply(result, relax.const(alpha, dtype)))
    if beta == 0:
        return result
    bias = importer.env[node.args[0]]
    if beta != 1:
        bias = bb.emit(relax.op.multiply(bias, relax.const(beta, dtype)))
    return bb.emit(relax.op.add(bias, result))


MATMUL_HALF = ImportFix(
    "matmul_half_result", "torch",
    "mm/bmm/matmul/addmm of float16 tensors accumulate in float32, then store float16 as torch gives it",
    "TVM's converter makes every matrix product float32: Concat expects all input tensors to have the same dtype")

TORCH_FIXES: tuple[TorchFix, ...] = (
    TorchFix(MATMUL_HALF, _MATMULS, _matmul_in_half, _matmul_stored_in_torch_dtype),
    TorchFix(INDEX_PUT_SHORT, ("index_put.default", "index_put_.default"), _index_put_short, _index_put_full_grid),
    TorchFix(BOOL_CUMSUM, ("cumsum.default",), _bool_cumsum, _cumsum_in_result_dtype),
    TorchFix(CAT_EMPTY_1D, ("cat.default", "concat.default"), _cat_with_empty_1d, _cat_without_empty_1d),
)
FIXES.update({f.fix.name: f.fix for f in TORCH_FIXES})
