"""Source ops in words: which source values a Relax binding carries, and how errors name them
(``source op 'bug/slice' (Slice)``, ``'eq' (aten.eq.Scalar at model.py:51, module m)``)."""
from __future__ import annotations

from pathlib import PurePath
from typing import Iterable

SHOWN_OPS = 3  # source ops named on one line before "and N more"


class BindingNames:
    """The source values each binding of an imported module computes, or belongs to.

    A Var the importer tagged names itself.  A converter may emit helper bindings before the
    one it returns (Gather normalises negative indices first); an untagged binding of the
    imported module belongs to the op of the binding that first uses it (and so on, to a tagged
    one).  A binding a pass created is not in the imported module: it has no source name.
    """

    def __init__(self, imported):
        from tvm import relax

        self.var_keys = imported.var_keys
        self.first_user: dict = {}
        for _, func in imported.mod.functions.items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:
                for binding in block.bindings:
                    self.first_user.setdefault(binding.var, None)
                    for used in relax.analysis.free_vars(binding.value):
                        if self.first_user.get(used, binding.var) is None:
                            self.first_user[used] = binding.var

    def of(self, var) -> tuple[str, ...]:
        """The keys of the source values ``var`` computes or belongs to (empty when none)."""
        seen = set()
        while var is not None and var not in self.var_keys and var not in seen:
            seen.add(var)
            var = self.first_user.get(var)
        return tuple(self.var_keys[var]) if var is not None and var in self.var_keys else ()


def source_order(keys: Iterable[str], sources) -> tuple[str, ...]:
    keys = list(dict.fromkeys(keys))
    if sources is None:
        return tuple(keys)
    order = {key: i for i, key in enumerate(v.key for v in sources)}
    return tuple(sorted(keys, key=lambda k: order.get(k, len(order))))


def describe_op(key: str, sources=None) -> str:
    """``'bug/slice' (Slice)``; for PyTorch ``'eq' (aten.eq.Scalar at model.py:51, module m)``."""
    value = sources[key] if sources is not None and key in sources else None
    if value is None:
        return f"'{key}'"
    facts = value.op_type
    if value.origin:
        facts += f" at {PurePath(value.origin).name}"
    if value.modules:
        facts += f", module {value.modules[0]}" + (f" (+{len(value.modules) - 1})" if len(value.modules) > 1 else "")
    return f"'{value.display_name}' ({facts})" if facts else f"'{value.display_name}'"


def describe_ops(keys: Iterable[str], sources=None) -> str:
    """``source op 'a' (...)`` or ``source ops 'a' (...), 'b' (...) and 3 more``."""
    keys = list(keys)
    shown = ", ".join(describe_op(k, sources) for k in keys[:SHOWN_OPS])
    more = f" and {len(keys) - SHOWN_OPS} more" if len(keys) > SHOWN_OPS else ""
    return f"source op{'s' if len(keys) > 1 else ''} {shown}{more}"
