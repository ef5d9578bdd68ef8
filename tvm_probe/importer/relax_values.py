"""Reading what a Relax frontend produced: which Var each expression was bound to, constants,
shapes and dtypes.  Shared by every importer (ONNX, torch, TFLite, Relax)."""
from __future__ import annotations

import numpy as np


def const_value(expr) -> np.ndarray | None:
    """numpy value of an import-time constant expression, or None when it has none."""
    from tvm import relax

    if isinstance(expr, relax.ShapeExpr):
        try:
            return np.array([int(v) for v in expr.values], dtype=np.int64)
        except TypeError:  # symbolic dimension
            return None
    value = getattr(expr, "value", None)
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(value, (int, float, bool)):
        return np.array(value)
    return None


def tensor_info(expr) -> tuple[tuple[int | str, ...] | None, str | None]:
    """Shape (a symbolic dimension as its name or expression, e.g. ``'batch'``) and dtype."""
    return type_info(getattr(expr, "ty", None))


def type_info(ty) -> tuple[tuple[int | str, ...] | None, str | None]:
    """:func:`tensor_info` of a Relax type (a tuple's field)."""
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    dims = tuple(dim_of(v) for v in values) if values is not None else None
    dtype = getattr(ty, "dtype", None)
    return dims, (str(dtype) if dtype is not None and str(dtype) else None)


def dim_of(value) -> int | str:
    """One dimension of a Relax shape: an int, or the text of a symbolic one (``'batch'``)."""
    try:
        return int(value)
    except TypeError:
        return str(value)


def binding_of_value(mod, function: str = "main") -> dict:
    """Bound expression → the Var it is bound to, for every binding of ``main``.

    The importer leaves each converted op as an unbound Call; normalisation binds it where it is
    first used.  Tagging through this map (rather than binding eagerly) keeps the binding order,
    and so the kernel order, exactly that of a plain import.
    """
    found = {}
    for block in mod[function].body.blocks:
        for binding in block.bindings:
            found.setdefault(binding.value, binding.var)
    return found


def follow_aliases(mod, var_keys: dict, function: str = "main") -> None:
    """Give ``b``'s names to ``a`` for every ``a = b`` binding (e.g. the function's output var).

    Passes such as CanonicalizeBindings keep only one of the two Vars; either must answer.
    """
    from tvm import relax

    for block in mod[function].body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if isinstance(value, relax.Var) and value in var_keys:
                var_keys.setdefault(binding.var, []).extend(var_keys[value])
