"""Name resolution: from what a user types to one source value (or a list of them).

A source value answers to its node name (``node:k`` for output k of a multi-output node) and
to its tensor name.  :meth:`NameIndex.resolve` tries, in order:

1. an exact name;
2. a unique suffix on ``/`` boundaries (``layer_._0/attention/self/MatMul`` finds
   ``tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/MatMul``).

Several matches → :class:`AmbiguousNameError` listing them; none → :class:`UnknownNameError`
with the closest names.  :meth:`NameIndex.match` takes glob patterns (``*/self/Softmax``).
"""
from __future__ import annotations

import fnmatch
from typing import Iterable

from .errors import AmbiguousNameError, UnknownNameError, closest
from .sources import SourceValue

_GLOB_CHARS = set("*?[")


def is_pattern(text: str) -> bool:
    """True when ``text`` contains glob characters."""
    return bool(_GLOB_CHARS & set(text))


class NameIndex:
    """Every name of every source value, for lookups (no TVM needed)."""

    def __init__(self, values: Iterable[SourceValue]):
        self._keys_by_name: dict[str, list[str]] = {}
        self._order: dict[str, int] = {}
        self._outputs_of_node: dict[str, list[str]] = {}  # multi-output node → its `node:k` names
        for i, value in enumerate(values):
            self._order[value.key] = i
            if value.node and value.num_outputs > 1:
                self._outputs_of_node.setdefault(value.node, []).append(value.display_name)
            for name in value.names:
                keys = self._keys_by_name.setdefault(name, [])
                if value.key not in keys:
                    keys.append(value.key)

    @property
    def names(self) -> list[str]:
        return list(self._keys_by_name)

    def resolve(self, name: str) -> str:
        """The key of the one source value ``name`` denotes (see module docstring)."""
        if not isinstance(name, str) or not name.strip():
            raise UnknownNameError(f"empty name {name!r}: give a node or tensor name (see probe.sources)")
        exact = self._keys_by_name.get(name)
        if exact is not None:
            if len(exact) == 1:
                return exact[0]
            raise self._ambiguous(name, exact)
        outputs = self._outputs_of_node.get(name)
        if outputs:
            raise AmbiguousNameError(f"node {name!r} has {len(outputs)} outputs: name one of "
                                     + ", ".join(repr(o) for o in outputs))
        suffix = "/" + name.lstrip("/")
        hits = sorted({k for n, ks in self._keys_by_name.items() if n.endswith(suffix) for k in ks},
                      key=self._order.__getitem__)
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise self._ambiguous(name, hits)
        hint = closest(name, self._keys_by_name)
        more = f"; did you mean {', '.join(repr(h) for h in hint)}?" if hint else ""
        raise UnknownNameError(f"no source value is named {name!r}{more} (list names with probe.sources)")

    def match(self, pattern: str) -> list[str]:
        """Keys of every value with a name matching the glob ``pattern``, in source order.

        A pattern without glob characters is resolved like :meth:`resolve`.
        """
        if not is_pattern(pattern):
            return [self.resolve(pattern)]
        hits = {k for n, ks in self._keys_by_name.items()
                if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(n, "*/" + pattern.lstrip("/"))
                for k in ks}
        if not hits:
            raise UnknownNameError(f"pattern {pattern!r} matches no source value (list names with probe.sources)")
        return sorted(hits, key=self._order.__getitem__)

    def _ambiguous(self, name: str, keys: list[str]) -> AmbiguousNameError:
        shown = ", ".join(repr(k) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
        return AmbiguousNameError(f"{name!r} matches {len(keys)} source values: {shown}; give a longer name")
