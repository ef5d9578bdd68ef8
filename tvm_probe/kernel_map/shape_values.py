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


#: Sizes a symbolic dimension is given when two shape expressions are compared.
_SAMPLES = (1, 2, 3, 4, 5, 7, 8, 11, 16, 31, 64, 97)


def _value(expr, env: dict) -> int | None:
    """``expr`` (a PrimExpr) with its symbolic dims set by ``env`` (TIR Var → int), or None."""
    name = type(expr).__name__
    if name == "IntImm" or isinstance(expr, int):
        return int(expr)
    if name == "Cast":
        return _value(expr.value, env)
    if name in _BINARY:
        a, b = _value(expr.a, env), _value(expr.b, env)
        if a is None or b is None or name in ("FloorDiv", "FloorMod") and b == 0:
            return None
        return int(_BINARY[name](a, b))
    return env.get(expr)


def _symbols(expr, found: list) -> None:
    name = type(expr).__name__
    if name == "Cast":
        _symbols(expr.value, found)
    elif name in _BINARY:
        _symbols(expr.a, found)
        _symbols(expr.b, found)
    elif name != "IntImm" and not isinstance(expr, int) and expr not in found:
        found.append(expr)


def same_sizes(dims_a, dims_b, sizes_of_run=()) -> bool:
    """Whether two lists of dimensions (PrimExprs) are equal for every size of their symbolic
    dimensions tried (TVM writes one size as ``(n + 2) // 3`` in one pass and
    ``(n + 3 - 1) // 3`` in the next).

    ``sizes_of_run``: sizes that any run computing ``dims_b`` gives a tensor (the sizes of the
    call that produces it); the symbols' values where one of them is below zero are no run
    (TVM cannot allocate that tensor), so they are not tried.  Legalizing ``R.split`` of an
    ``n``-length axis at ``[2]`` writes its parts' sizes ``T.min(2, n)``, ``T.max(n - 2, 0)`` as
    ``2``, ``n - 2``: equal wherever the split kernel can run (``n >= 2``).  At least one tried
    value must be a run."""
    if len(dims_a) != len(dims_b):
        return False
    symbols: list = []
    for d in list(dims_a) + list(dims_b) + list(sizes_of_run):
        _symbols(d, symbols)
    tried = False
    for k, size in enumerate(_SAMPLES):
        env = {s: _SAMPLES[(k + 5 * i) % len(_SAMPLES)] for i, s in enumerate(symbols)} if symbols else {}
        if any((v := _value(d, env)) is not None and v < 0 for d in sizes_of_run):
            continue
        tried = True
        for a, b in zip(dims_a, dims_b):
            va, vb = _value(a, env), _value(b, env)
            if va is None or va != vb:
                return False
        if not symbols:
            break
    return tried
