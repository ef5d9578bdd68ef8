"""Analyses of Relax functions that more than one stage needs (TVM imported lazily)."""
from __future__ import annotations


def bindings_computing(main, variables) -> list | None:
    """The bindings of ``main`` that compute ``variables``, in order; None if any needs a parameter."""
    from tvm import relax

    order = {}
    for i, b in enumerate(b for blk in main.body.blocks for b in blk.bindings):
        order[b.var] = (i, b)
    params = set(main.params)
    needed, stack, seen = [], list(variables), set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in params or v not in order:
            return None
        needed.append(order[v])
        stack.extend(relax.analysis.free_vars(order[v][1].value))
    return [b for _, b in sorted(needed, key=lambda ib: ib[0])]


def depends_on_params(main, var) -> bool:
    """True when computing ``var`` needs a model input (so it cannot have been folded)."""
    return bindings_computing(main, [var]) is None
