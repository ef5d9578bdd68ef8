"""Name resolution: from what a user types to one source value (or a list of them).

A source value answers to several kinds of names:

* ``node`` — its node name (``node:k`` for output k of a multi-output node; fx node names);
* ``tensor`` — its tensor name (the key: unique in the model);
* ``module`` — the module paths whose output it is (PyTorch, dynamo-exported ONNX);
* ``alias`` — other names (e.g. each part of a name a converter merged as ``a;b``).

:meth:`NameIndex.resolve` tries, in order: the exact name; a unique suffix on ``/`` boundaries
(``layer_._0/attention/self/MatMul`` finds ``tf_bert_for_sequence_classification/bert/encoder/
layer_._0/attention/self/MatMul``).  A name that means several values is ambiguous — never
silently one of them: :class:`AmbiguousNameError` lists them with explicit spellings
(``node:embedding``, ``module:embedding``, ``tensor:...``), which restrict a lookup to one kind.
None → :class:`UnknownNameError` with the closest names, or the reason a known name has no
value (e.g. a module whose ``forward`` was called directly).  :meth:`NameIndex.match` takes glob
patterns (``*/self/Softmax``) over every name of every value.
"""
from __future__ import annotations

from typing import Iterable

from .errors import AmbiguousNameError, UnknownNameError, closest
from .schema import name_matches
from .sources import SourceValue

KINDS = ("node", "tensor", "module", "alias")
_GLOB_CHARS = set("*?[")


def is_pattern(text: str) -> bool:
    """True when ``text`` contains glob characters."""
    return bool(_GLOB_CHARS & set(text))


def split_kind(name: str) -> tuple[str | None, str]:
    """``("module", "embedding")`` for ``"module:embedding"``; ``(None, name)`` without a kind."""
    kind, sep, rest = name.partition(":")
    return (kind, rest) if sep and kind in KINDS and rest else (None, name)


class NameIndex:
    """Every name of every source value, by kind, for lookups (no TVM needed).

    Args:
        values: the source values, in model order.
        notes: names that have no value, with the reason (shown when one is looked up).
    """

    def __init__(self, values: Iterable[SourceValue], notes: dict[str, str] | None = None):
        self._keys: dict[str, dict[str, list[str]]] = {kind: {} for kind in KINDS}
        self._order: dict[str, int] = {}
        self._outputs_of_node: dict[str, list[str]] = {}  # multi-output node → its `node:k` names
        self._notes = dict(notes or {})
        self._resolved: dict[str, str] = {}  # name → key, for names resolved before (the index is fixed)
        for i, value in enumerate(values):
            self._order[value.key] = i
            if value.node and value.num_outputs > 1:
                self._outputs_of_node.setdefault(value.node, []).append(value.display_name)
            for kind, name in names_of(value):
                keys = self._keys[kind].setdefault(name, [])
                if value.key not in keys:
                    keys.append(value.key)

    @property
    def names(self) -> list[str]:
        """Every name of every kind (each once)."""
        return list(dict.fromkeys(n for by_name in self._keys.values() for n in by_name))

    def resolve(self, name: str) -> str:
        """The key of the one source value ``name`` denotes (see module docstring)."""
        found = self._resolved.get(name) if type(name) is str else None
        if found is None:
            found = self._resolved[name] = self._resolve(name)
        return found

    def _resolve(self, name: str) -> str:
        if not isinstance(name, str) or not name.strip():
            raise UnknownNameError(f"empty name {name!r}: give a node or tensor name")
        kind, bare = split_kind(name)
        kinds = (kind,) if kind else KINDS
        exact = self._exact(bare, kinds)
        if len(exact) == 1:
            return exact[0]
        if exact:
            raise self._ambiguous(name, exact, kinds)
        outputs = self._outputs_of_node.get(bare) if kind in (None, "node") else None
        if outputs:
            raise AmbiguousNameError(f"node {bare!r} has {len(outputs)} outputs: name one of "
                                     + ", ".join(repr(o) for o in outputs))
        suffix = "/" + bare.lstrip("/")
        hits = self._lookup(bare, kinds, lambda n: n.endswith(suffix))
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise self._ambiguous(name, hits, kinds)
        raise self._unknown(name, bare)

    def match(self, pattern: str) -> list[str]:
        """Keys of every value with a name matching the glob ``pattern``, in source order.

        A pattern without glob characters is resolved like :meth:`resolve`.
        """
        if not is_pattern(pattern):
            return [self.resolve(pattern)]
        kind, bare = split_kind(pattern)
        hits = self._lookup(bare, (kind,) if kind else KINDS, lambda n: name_matches(n, bare))
        if not hits:
            raise UnknownNameError(f"pattern {pattern!r} matches no source value (the model has {len(self._order)})")
        return hits

    # -- helpers --------------------------------------------------------------------------------
    def _lookup(self, bare: str, kinds, test) -> list[str]:
        """Keys with a name of one of ``kinds`` passing ``test``, in source order."""
        keys = {k for kind in kinds for n, ks in self._keys[kind].items() if test(n) for k in ks}
        return sorted(keys, key=self._order.__getitem__)

    def _exact(self, bare: str, kinds) -> list[str]:
        """Keys with the name ``bare`` of one of ``kinds``, in source order (:meth:`_lookup` with
        equality, by dict: a generation compare resolves hundreds of names a step)."""
        keys = [k for kind in kinds for k in self._keys[kind].get(bare, ())]
        return keys if len(keys) <= 1 else sorted(set(keys), key=self._order.__getitem__)

    def _spellings(self, key: str, name: str, kinds) -> list[str]:
        return [f"{kind}:{n}" for kind in kinds for n, ks in self._keys[kind].items()
                if key in ks and (n == name or n.endswith("/" + name.lstrip("/")))]

    def _ambiguous(self, name: str, keys: list[str], kinds) -> AmbiguousNameError:
        _, bare = split_kind(name)
        shown = [(self._spellings(k, bare, kinds) or [f"tensor:{k}"])[0] for k in keys[:5]]
        more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
        return AmbiguousNameError(f"{name!r} names {len(keys)} different values: {'; '.join(shown)}{more}: "
                                  "give one of these spellings, or a longer name")

    def _unknown(self, name: str, bare: str) -> UnknownNameError:
        if bare in self._notes:
            return UnknownNameError(f"{name!r} has no value: {self._notes[bare]}", hint=None)
        hint = closest(bare, self.names)
        more = f"; did you mean {', '.join(repr(h) for h in hint)}?" if hint else ""
        return UnknownNameError(f"no source value is named {name!r}{more}")


def names_of(value: SourceValue) -> list[tuple[str, str]]:
    """``(kind, name)`` for every name ``value`` answers to."""
    found = []
    if value.node:
        found.append(("node", value.display_name))
    found.append(("tensor", value.key))
    found += [("module", m) for m in value.modules]
    found += [("alias", a) for a in value.aliases]
    return found
