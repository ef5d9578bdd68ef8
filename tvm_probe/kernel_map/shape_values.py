"""Shape and scalar values (``R.shape([n, 3])``, ``R.prim_value(n)``) that a model computes from
its inputs' sizes: the VM builds them from the shapes it matched, outside any kernel call.

A dimension is kept as a plain formula (an int; ``("dim", input, axis)``, a size of a model
input; ``(op, a, b)`` for the arithmetic TVM writes), so that a run's input shapes give its value
with no TVM at hand (a dump is read with numpy alone).
"""
from __future__ import annotations

import operator

#: TVM's binary PrimExpr classes → what they compute on ints.
_BINARY = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "FloorDiv": operator.floordiv,
           "FloorMod": operator.mod, "Min": min, "Max": max}


def dim_formula(expr, input_dims: dict):
    """``expr`` (a PrimExpr) as a formula, or None when it reads anything but input sizes
    (``input_dims``: TIR Var → ``(input, axis)``)."""
    name = type(expr).__name__
    if name == "IntImm" or isinstance(expr, int):
        return int(expr)
    if expr in input_dims:
        return ("dim", *input_dims[expr])
    if name in _BINARY:
        a, b = dim_formula(expr.a, input_dims), dim_formula(expr.b, input_dims)
        return None if a is None or b is None else (name, a, b)
    if name == "Cast":
        return dim_formula(expr.value, input_dims)
    return None


def shape_formulas(value, input_dims: dict) -> tuple | None:
    """The formulas of a shape or scalar Relax value (``R.shape([...])``, ``R.prim_value(...)``):
    ``(dims, is_scalar)``, or None when it is no such value or reads more than input sizes."""
    name = type(value).__name__
    if name == "ShapeExpr":
        dims = [dim_formula(v, input_dims) for v in value.values]
        return None if any(d is None for d in dims) else (tuple(dims), False)
    if name == "PrimValue":
        value = value.value
    if name in ("PrimValue", "IntImm", "Cast", "Var") or name in _BINARY:
        dim = dim_formula(value, input_dims)
        return None if dim is None else ((dim,), True)
    return None


def evaluate(formula, input_shapes) -> int:
    """A formula's value for inputs of ``input_shapes``."""
    if isinstance(formula, int):
        return formula
    if formula[0] == "dim":
        return int(input_shapes[formula[1]][formula[2]])
    return int(_BINARY[formula[0]](evaluate(formula[1], input_shapes), evaluate(formula[2], input_shapes)))
