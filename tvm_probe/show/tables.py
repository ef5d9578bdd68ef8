"""The report's tables as DataFrames: one row per graph node, one per value compared.

The CSV files hold them whole; the HTML page shows the columns a reader needs and keeps the
rest behind a toggle (:mod:`.page`).
"""
from __future__ import annotations

from .graph import node_status


def nodes_table(results, comparison=None):
    """DataFrame, one row per graph node: :attr:`Results.nodes` plus ``view`` and ``inputs``.

    ``inputs`` lists the producing node of each argument.  With a ``comparison``, ``status``
    (passed / first divergent / diverged / unchecked: the words of :class:`~tvm_probe.comparison.Status`)
    and ``max_abs`` (worst error of the node's values) say how the node's values compared.
    """
    table = results.nodes  # a fresh DataFrame each time: safe to extend
    table["view"] = [n.is_view for n in results.node_infos]
    table["inputs"] = [[i for i, _ in n.inputs] for n in results.node_infos]
    if comparison is not None:
        status, worst = node_status(results, comparison)
        table.insert(2, "status", [status[n.index] for n in results.node_infos])
        table["max_abs"] = [worst.get(n.index) for n in results.node_infos]
    return table


def compare_table(comparison):
    """DataFrame, one row per value asked about in source order (:meth:`Comparison.table`).

    Its ``status`` column is passed / diverged / unchecked / dead code, ``served`` says how the
    TVM value was obtained and ``first_divergent`` marks the value where divergence starts.
    """
    table = comparison.table()
    first = comparison.first_divergent
    table["first_divergent"] = table["key"] == first.key if first is not None else False
    return table


def flat(table, sep="; "):
    """Lists (names) joined with ``sep``, tuples (shapes) as ``[1, 16, 64]``: one cell, one string."""
    def cell(x):
        if isinstance(x, list):
            return sep.join(str(i) for i in x)
        return str(list(x)) if isinstance(x, tuple) else x
    return table.apply(lambda col: col.map(cell) if col.dtype == object else col)
