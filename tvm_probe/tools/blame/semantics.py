"""What a Relax op means, in numpy: the independent evaluation that tells the importer from the kernel.

When the module as imported already computes a wrong value, either the importer wrote Relax that
means something else than the source op, or TVM's kernel for that Relax computes something other
than what it means.  To tell them apart, the Relax bindings that make the value are evaluated
here — with numpy, never with TVM's kernels — on the reference's values of their inputs: the
result agrees with the reference → the Relax is right and the kernel is wrong; it agrees with TVM
→ the Relax already says the wrong thing, the importer's doing.

The meaning of an op is the one TVM itself gives it where it says: its docstring in
``tvm.relax.op`` and, for NaN, its PyTorch counterpart in ``tvm.relax.relax_to_pyfunc_converter``
(``relax.maximum`` is ``torch.maximum``, which propagates NaN, as numpy does).  Only the ops below
have a meaning here; an op without one (or an attribute value not covered) is
:class:`NoMeaning` — the stage then stays undecided rather than guessed.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np


class NoMeaning(Exception):
    """The op (or one of its attribute values) has no independent evaluation here."""


def _unary(fn: Callable) -> Callable:
    return lambda call, args: fn(args[0])


def _binary(fn: Callable) -> Callable:
    return lambda call, args: fn(args[0], args[1])


def _ints(value) -> list[int] | None:
    return None if value is None else [int(v) for v in value]


def _reduce(fn: Callable) -> Callable:
    def evaluate(call, args):
        axis = _ints(call.attrs.axis)
        return fn(args[0], axis=None if axis is None else tuple(axis), keepdims=bool(call.attrs.keepdims))
    return evaluate


def _clip(call, args):
    low, high = (_scalar(a) for a in call.args[1:3])
    return np.clip(args[0], low, high)


def _scalar(expr) -> float:
    value = getattr(expr, "value", None)
    if value is None:
        raise NoMeaning(f"a bound that is not a constant ({type(expr).__name__})")
    return value.value if hasattr(value, "value") else float(value)


def _astype(call, args):
    return args[0].astype(str(call.attrs.dtype))


def _resize2d(call, args):
    """Nearest-neighbour resize of an NCHW tensor to ``size`` (the modes TVM's ONNX importer
    writes for Resize; others have no meaning here)."""
    attrs = call.attrs
    if str(attrs.method) != "nearest_neighbor" or str(attrs.layout) != "NCHW":
        raise NoMeaning(f"resize2d {attrs.method} in layout {attrs.layout}")
    size = [int(v) for v in getattr(call.args[1], "values", ())]
    if len(size) != 2:
        raise NoMeaning("resize2d to a size that is not a constant shape")
    x = args[0]
    rows = _nearest(x.shape[2], size[0], str(attrs.coordinate_transformation_mode), str(attrs.rounding_method))
    cols = _nearest(x.shape[3], size[1], str(attrs.coordinate_transformation_mode), str(attrs.rounding_method))
    return x[:, :, rows][:, :, :, cols]


def _nearest(in_size: int, out_size: int, mode: str, rounding: str) -> np.ndarray:
    """The source index of every output index (ONNX Resize's formulas, scale = out / in)."""
    i = np.arange(out_size, dtype=np.float64)
    scale = out_size / in_size
    if mode == "half_pixel":
        x = (i + 0.5) / scale - 0.5
    elif mode == "asymmetric":
        x = i / scale
    elif mode == "align_corners":
        x = i * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(i)
    else:
        raise NoMeaning(f"resize2d coordinate_transformation_mode {mode}")
    if rounding == "round_prefer_floor":
        index = np.ceil(x - 0.5)
    elif rounding in ("round_prefer_ceil", "round"):
        index = np.floor(x + 0.5)
    elif rounding == "floor":
        index = np.floor(x)
    elif rounding == "ceil":
        index = np.ceil(x)
    else:
        raise NoMeaning(f"resize2d rounding_method {rounding}")
    return np.clip(index, 0, in_size - 1).astype(np.int64)


def _sequence(fn: Callable) -> Callable:
    """An op on a tuple of tensors (``stack``, ``concat``) along ``attrs.axis``."""
    def evaluate(call, args):
        return fn(list(args[0]), axis=int(call.attrs.axis))
    return evaluate


def _expand_dims(call, args):
    out = args[0]
    for axis in sorted(int(a) for a in call.attrs.axis):
        out = np.expand_dims(out, axis)
    return out


def _permute_dims(call, args):
    axes = _ints(call.attrs.axes)
    return np.transpose(args[0], axes)


def _constant_shape(call) -> list[int]:
    values = getattr(call.args[1], "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        raise NoMeaning(f"{call.op.name} to a shape that is not constant")
    return [int(v.value) for v in values]


def _reshape(call, args):
    return np.reshape(args[0], _constant_shape(call))


def _broadcast_to(call, args):
    return np.broadcast_to(args[0], _constant_shape(call))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


#: Relax op name → its meaning, ``fn(call, argument arrays) -> array``.
MEANINGS: dict[str, Callable[[Any, list[np.ndarray]], np.ndarray]] = {
    "relax.nn.relu": _unary(lambda x: np.maximum(x, np.zeros((), x.dtype))),
    "relax.maximum": _binary(np.maximum),
    "relax.minimum": _binary(np.minimum),
    "relax.add": _binary(np.add),
    "relax.subtract": _binary(np.subtract),
    "relax.multiply": _binary(np.multiply),
    "relax.divide": _binary(np.divide),
    "relax.sign": _unary(np.sign),
    "relax.abs": _unary(np.abs),
    "relax.negative": _unary(np.negative),
    "relax.exp": _unary(np.exp),
    "relax.log": _unary(np.log),
    "relax.sqrt": _unary(np.sqrt),
    "relax.tanh": _unary(np.tanh),
    "relax.sigmoid": _unary(_sigmoid),
    "relax.floor": _unary(np.floor),
    "relax.ceil": _unary(np.ceil),
    "relax.clip": _clip,
    "relax.max": _reduce(np.max),
    "relax.min": _reduce(np.min),
    "relax.sum": _reduce(np.sum),
    "relax.mean": _reduce(np.mean),
    "relax.astype": _astype,
    "relax.equal": _binary(np.equal),
    "relax.less": _binary(np.less),
    "relax.greater": _binary(np.greater),
    "relax.image.resize2d": _resize2d,
    "relax.stack": _sequence(np.stack),
    "relax.concat": _sequence(np.concatenate),
    "relax.expand_dims": _expand_dims,
    "relax.permute_dims": _permute_dims,
    "relax.reshape": _reshape,
    "relax.broadcast_to": _broadcast_to,
}


def meaning(call, args: list[np.ndarray]) -> np.ndarray:
    """What the Relax ``call`` computes from ``args`` (numpy arrays for its tensor arguments).

    Raises:
        NoMeaning: no independent evaluation of this op (or attribute) here.
    """
    name = str(getattr(call.op, "name", ""))
    fn = MEANINGS.get(name)
    if fn is None:
        raise NoMeaning(f"no independent evaluation of {name or type(call).__name__}")
    with np.errstate(all="ignore"):
        return np.asarray(fn(call, args))
