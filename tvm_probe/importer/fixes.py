"""Import fixes: small rewrites of constructs that TVM 0.27 cannot import or compile.

Exporters emit constructs that TVM's importers turn into modules that cannot be built at all
(the import raises, or LLVM rejects the generated code).  Users meet them on models they cannot
edit, so the importers rewrite each such construct into an equivalent TVM handles, and record
that they did.  The rules:

* a fix applies only to a construct whose plain import **cannot build at all**; a construct TVM
  compiles but computes wrongly is what a user is debugging, and is never rewritten;
* each rewrite computes exactly what the source op computes (tested against onnxruntime /
  eager PyTorch on the construct's minimal graph, ``tests/test_fixes.py``);
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
==========================  ===========================================================

PyTorch fix (in the converter map of the ``torch.export`` importer):

==========================  ===========================================================
bool_compare_constant       ``mask == 0`` / ``mask != 1`` on a bool tensor imports as
                            ``R.equal(mask, R.const(False, "bool"))``, which LLVM rejects:
                            "fcmp oeq i1"; becomes ``logical_not(mask)`` or ``mask`` itself
==========================  ===========================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


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


@dataclass(frozen=True)
class AppliedFix:
    """An import fix a model needed: which one, and every source op it touched.

    ``sources`` are ONNX node names (the output tensor name of an unnamed node) or fx node names.
    """

    name: str
    does: str
    symptom: str
    sources: tuple[str, ...]

    def summary(self) -> str:
        """One line, e.g. ``constant_of_shape_scalar on 1 op (/bert/ConstantOfShape): ...``."""
        shown = ", ".join(self.sources[:3]) + (f" and {len(self.sources) - 3} more" if len(self.sources) > 3 else "")
        ops = f"{len(self.sources)} op{'s' if len(self.sources) != 1 else ''}"
        return f"import fix {self.name} on {ops} ({shown}): {self.does}"

    def to_record(self) -> dict:
        """A JSON-friendly dict (the inverse of :meth:`from_record`)."""
        return {"name": self.name, "does": self.does, "symptom": self.symptom, "sources": list(self.sources)}

    @classmethod
    def from_record(cls, rec: dict) -> "AppliedFix":
        """Rebuild from :meth:`to_record` output (e.g. a dump manifest's ``import_fixes``)."""
        return cls(name=str(rec["name"]), does=str(rec["does"]), symptom=str(rec["symptom"]),
                   sources=tuple(str(s) for s in rec["sources"]))


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
class OnnxFix:
    """An ImportFix for ONNX: the ops it concerns, when it applies, and the rewrite."""

    fix: ImportFix
    ops: tuple[str, ...]
    matches: Callable[[list, dict], bool]
    rewrite: Callable[[Any, list, dict, Convert], Any]


def _is_tensor_const(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.GenericConst)


def _lost_shape(expr) -> bool:
    """A tensor whose rank TVM knows but whose dimensions it lost."""
    from tvm import relax

    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim >= 0


def _empty_constant_shape(inputs, attrs) -> bool:
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


def _prim_data(inputs, attrs) -> bool:
    """The data is a scalar shape value (a PrimValue), which Relax's reshape refuses."""
    import tvm

    data = inputs[0]
    return isinstance(getattr(data, "ty", None), tvm.ir.PrimType) and tvm.ir.is_prim_expr(data)


def _reshape_prim_as_tensor(bb, inputs, attrs, convert):
    """Reshape the scalar as the 1-element tensor ONNX holds (a reshape ignores the input's rank)."""
    from tvm import relax, tirx

    value = inputs[0]
    dtype = str(value.ty.dtype)
    as_int64 = value if dtype == "int64" else tirx.Cast("int64", value)
    tensor = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr([as_int64])))
    if dtype != "int64":
        tensor = bb.normalize(relax.op.astype(tensor, dtype))
    return convert([tensor, *inputs[1:]])


def _infers_on_lost_shape(inputs, attrs) -> bool:
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


def _gather_from_shape_value(inputs, attrs) -> bool:
    """The data is a shape computed at run time (``R.shape_of``), not a ShapeExpr TVM can index."""
    from tvm import relax

    data = inputs[0]
    return isinstance(getattr(data, "ty", None), relax.ShapeType) and not isinstance(data, relax.ShapeExpr)


def _shape_to_tensor_first(bb, inputs, attrs, convert):
    """Gather from the int64 tensor of the shape (what ONNX's Shape outputs)."""
    from tvm import relax

    return convert([bb.normalize(relax.op.shape_to_tensor(inputs[0])), *inputs[1:]])


def _global_pool_lost_shape(inputs, attrs) -> bool:
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
BOOL_COMPARE_CONSTANT = ImportFix(
    "bool_compare_constant", "torch",
    "comparing a bool tensor with 0/1/False/True becomes logical_not or the tensor itself",
    "LLVM rejects R.equal on bool tensors: fcmp oeq i1")

FIXES: dict[str, ImportFix] = {f.name: f for f in (
    CONSTANT_OF_SHAPE_SCALAR, RESHAPE_SCALAR_SHAPE_VALUE, RESHAPE_UNKNOWN_SHAPE, SHAPE_VALUE_AS_TENSOR,
    GLOBAL_POOL_UNKNOWN_SHAPE, BOOL_COMPARE_CONSTANT)}

ONNX_FIXES: tuple[OnnxFix, ...] = (
    OnnxFix(CONSTANT_OF_SHAPE_SCALAR, ("ConstantOfShape",), _empty_constant_shape, _scalar_constant),
    OnnxFix(RESHAPE_SCALAR_SHAPE_VALUE, ("Reshape",), _prim_data, _reshape_prim_as_tensor),
    OnnxFix(RESHAPE_UNKNOWN_SHAPE, ("Reshape",), _infers_on_lost_shape, _reshape_after_match_cast),
    OnnxFix(SHAPE_VALUE_AS_TENSOR, ("Gather",), _gather_from_shape_value, _shape_to_tensor_first),
    OnnxFix(GLOBAL_POOL_UNKNOWN_SHAPE, ("GlobalAveragePool",), _global_pool_lost_shape,
            _global_pool_by_rank("GlobalAveragePool")),
    OnnxFix(GLOBAL_POOL_UNKNOWN_SHAPE, ("GlobalMaxPool",), _global_pool_lost_shape,
            _global_pool_by_rank("GlobalMaxPool")),
)


def onnx_fix_for(op_name: str, inputs: list, attrs: dict) -> OnnxFix | None:
    """The ONNX fix for this node's construct, or None when TVM's converter handles it."""
    for candidate in ONNX_FIXES:
        if op_name in candidate.ops and inputs and inputs[0] is not None and candidate.matches(inputs, attrs):
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
