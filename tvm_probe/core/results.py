"""The read API shared by a live :class:`~tvm_probe.Probe` and a dump read back from disk.

Both hold the same plain data — source values, graph nodes, captured tensors — and answer
``get(name)``, ``get_all(pattern)``, ``get_node_output(i)``, ``sources`` and ``nodes`` the
same way.  Subclasses implement only :meth:`Results._value` and :meth:`Results._node_output`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .dtypes import nbytes as dtype_nbytes
from .errors import ProbeError, UnknownNameError, ValueUnavailableError, closest
from .names import NameIndex, names_of
from .schema import name_matches
from .sources import Kind, Served, Servings, SourceMap


@dataclass
class NodeInfo:
    """One graph node: a kernel call (``op='tvm_op'``) or a model input (``op='null'``).

    ``inputs`` holds ``(node index, output k)`` of each argument produced by a node (k is -1,
    not known, where a dump TVM wrote names a producer with several outputs); constant
    arguments (weights) are counted in ``const_inputs``.
    """

    index: int
    name: str
    op: str
    symbol: str = ""
    occurrence: int = 0
    is_view: bool = False
    inputs: list[tuple[int, int]] = field(default_factory=list)
    const_inputs: int = 0
    out_shapes: list[tuple[int, ...]] = field(default_factory=list)
    out_dtypes: list[str] = field(default_factory=list)
    output_keys: list[list[str]] = field(default_factory=list)
    interior_keys: list[str] = field(default_factory=list)
    time_us: float | None = None
    start_us: float | None = None


class Results:
    """Values of one run, by source name.  See the module docstring."""

    sources_map: SourceMap
    #: how each source value is served, by key: this build's (a dump's: the dumped run's build)
    servings: Servings
    node_infos: list[NodeInfo]
    #: a dump read back (:class:`~tvm_probe.store.dump.DumpReader`), not a live run
    is_dump: bool = False

    def _init_results(self, sources: SourceMap, servings: Servings, nodes: list[NodeInfo]) -> None:
        self.sources_map, self.servings = sources, servings
        self.node_infos = nodes
        self._names = NameIndex(sources, sources.notes)

    # -- implemented by subclasses ------------------------------------------------------------
    def _value(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def _node_output(self, index: int, output: int) -> np.ndarray:
        raise NotImplementedError

    @property
    def import_fixes(self) -> list:
        """Import fixes the model needed (rewrites of constructs TVM cannot build), each with
        the source ops it touched; empty for most models."""
        return []

    @property
    def compile_warnings(self) -> list:
        """Warnings TVM printed while compiling, each with the source ops it concerns."""
        return []

    def findings(self) -> list[str]:
        """One line per import fix used and per compile warning, for summaries and reports."""
        lines = [f"import fix '{f.name}' applied at {', '.join(f.sources[:3])}"
                 f"{f' and {len(f.sources) - 3} more' if len(f.sources) > 3 else ''}: {f.does}"
                 for f in self.import_fixes]
        return lines + [w.summary(self.sources_map) for w in self.compile_warnings]

    @property
    def captured_keys(self) -> set[str] | None:
        """Keys of the values the run was asked to capture; None when it captured everything."""
        return None

    # -- the public API -----------------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """The tensor name (key) that ``name`` denotes; raises a NameLookupError otherwise."""
        return self._names.resolve(name)

    def get(self, name: str) -> np.ndarray | list[np.ndarray]:
        """The value of the source tensor ``name`` (node name, ``node:k``, tensor name or suffix).

        A sequence (ONNX ``SplitToSequence``, ``SequenceConstruct``: a tuple of tensors in TVM)
        answers a list of numpy arrays, its elements in order (as onnxruntime returns it); each
        element is a value of its own too, named ``seq[0]``, ``seq[1]``..."""
        return self._served_value(self.resolve(name))

    def _served_value(self, key: str) -> np.ndarray | list[np.ndarray]:
        """:meth:`_value`, or for a sequence the list of its elements' values."""
        if self.servings[key].served is Served.SEQUENCE:
            return [self._value(k) for k in self.sources_map.sequences[key]]
        return self._value(key)

    def get_tensor(self, key: str) -> np.ndarray:
        """The value whose tensor name (the ``tensor`` column of :attr:`sources`) is ``key``.

        No name resolution: for tools that walk :attr:`sources` and must not be redirected by
        a node name equal to another value's tensor name.
        """
        if key not in self.sources_map:
            raise UnknownNameError(f"no source value has the tensor name {key!r}", hint="see the tensor column of sources")
        return self._served_value(key)

    def serve_many(self, keys: list[str]) -> list:
        """:meth:`get_tensor` of each of ``keys`` (tensor names of values that are not
        sequences), in order: each the array, or the :class:`ProbeError` that says why it
        cannot be served.  What a comparison of hundreds of values asks at once; a live probe
        serves the captured ones without the per-value path."""
        out = []
        for key in keys:
            try:
                out.append(self._value(key))
            except ProbeError as err:
                out.append(err)
        return out

    def get_all(self, pattern: str) -> dict[str, np.ndarray]:
        """Every value whose name matches the glob ``pattern``, by display name, in model order
        (a sequence as the list of its elements, see :meth:`get`)."""
        return {self.sources_map[k].display_name: self._served_value(k) for k in self._names.match(pattern)}

    def get_node_output(self, index: int, output: int = 0) -> np.ndarray:
        """Output ``output`` of graph node ``index`` (see :attr:`nodes`)."""
        if not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.node_infos):
            raise ProbeError(f"node index {index!r} is out of range: the graph has nodes 0..{len(self.node_infos) - 1}")
        node = self.node_infos[index]
        if not 0 <= output < max(1, len(node.out_shapes)):
            raise ProbeError(f"node {index} ({node.name}) has {len(node.out_shapes)} output(s), not output {output}")
        return self._node_output(int(index), output)

    def first_nonfinite(self) -> str | None:
        """Name of the first value, in model order, holding NaN or Inf (None if there is none).

        Needs no reference: where a NaN first appears is where to look.  Values the run cannot
        serve (not captured, dead code) are skipped.
        """

        for value in self.sources_map:
            if value.kind is not Kind.VALUE or value.key in self.sources_map.sequences:
                continue  # (a sequence's elements are values of their own)
            try:
                array = self._value(value.key)
            except ProbeError:
                continue
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                return value.display_name
        return None

    def served(self, name: str) -> Served:
        """How the value of ``name`` is obtained: a :class:`~tvm_probe.core.sources.Served`
        (captured, view, recomputed, constant, ...; equal to its word: ``== "recomputed"``)."""
        return self.servings[self.resolve(name)].served

    @property
    def sources(self):
        """DataFrame: one row per source value — name, tensor, op type, kind, how served, node."""
        import pandas as pd


        rows = [{
            "name": v.display_name, "tensor": v.key, "op_type": v.op_type, "kind": v.kind.value,
            "served": s.served.value, "node": s.node_index, "shape": v.shape, "dtype": v.dtype,
            "other_names": [f"{kind}:{n}" for kind, n in names_of(v) if n not in (v.display_name, v.key)],
        } for v in self.sources_map for s in [self.servings[v.key]]]
        return pd.DataFrame(rows, columns=["name", "tensor", "op_type", "kind", "served", "node", "shape",
                                           "dtype", "other_names"])

    def find(self, pattern: str = "*", op: str | None = None):
        """:attr:`sources` rows of the values with any name matching ``pattern`` (glob or name)
        and, with ``op``, made by an op of that type: the type Netron shows (``"Einsum"``), as the
        model names it (``"aten.bmm.default"``) or a part of it (``"bmm"``); any case, globs too.

        Raises:
            UnknownNameError: nothing matches; a pattern that names an op type says to use ``op=``.
        """
        table = every = self.sources
        if op is not None:
            table = every[[op_type_matches(t, op) for t in every["op_type"]]]
            if not len(table):
                types = sorted({t for t in every["op_type"] if t})
                hint = closest(op, types)
                raise UnknownNameError(f"no source value comes from an op of type {op!r}"
                                       + (f"; did you mean {', '.join(repr(h) for h in hint)}?" if hint else "")
                                       + f" (the op types here: {', '.join(types[:20])}"
                                       + (", ...)" if len(types) > 20 else ")"), hint=None)
        if pattern == "*":
            return table
        try:
            keys = set(self._names.match(pattern))
        except UnknownNameError as err:
            raise _op_type_hint(pattern, err, every["op_type"]) from None
        return table[table["tensor"].isin(keys)]


    @property
    def nodes(self):
        """DataFrame: one row per graph node — kernel symbol, source names, shape, dtype, time."""
        import pandas as pd

        total = sum(n.time_us or 0.0 for n in self.node_infos) or None
        rows = []
        for n in self.node_infos:
            nbytes = sum(dtype_nbytes(s, d) for s, d in zip(n.out_shapes, n.out_dtypes))
            names = [self.sources_map[k].display_name for ks in n.output_keys for k in ks]
            rows.append({
                "index": n.index, "op": n.op, "symbol": n.symbol, "occurrence": n.occurrence,
                "name": n.name, "source_names": names,
                "interior": [self.sources_map[k].display_name for k in n.interior_keys],
                "shape": n.out_shapes[0] if n.out_shapes else None,
                "dtype": n.out_dtypes[0] if n.out_dtypes else None, "bytes": nbytes,
                "time_us": n.time_us,
                "time_share": (n.time_us / total) if (total and n.time_us is not None) else None,
            })
        table = pd.DataFrame(rows)
        # which capture instrument timed the run ("native" or "python"; None when not known)
        table.attrs["instrument"] = getattr(self, "instrument", None)
        return table


def not_computed(value, served: Served, why_unknown: str = "", known_limit: bool = False) -> ValueUnavailableError:
    """The error for a value the compiled module does not hold: dead code (``UNAVAILABLE``), or
    a value tvm_probe could not place (``UNKNOWN``, with ``why_unknown``; ``known_limit``: a limit
    tvm_probe knows it has, not a surprise to report).  One wording for a probe and a dump."""
    if served is Served.UNKNOWN:
        report = "" if known_limit else ": please report this with the model"
        return ValueUnavailableError(
            f"tvm_probe cannot tell where the compiled module holds {value.display_name!r} "
            f"({why_unknown or 'no place found'}); rather than guess, it serves nothing{report}")
    return ValueUnavailableError(
        f"{value.display_name!r} is dead code: no output of the source model depends on it, so the "
        "compiled module never computes it")


def _op_type_hint(pattern: str, err: UnknownNameError, op_types) -> UnknownNameError:
    """``err``, saying where the words of ``pattern`` name one of ``op_types`` (Netron shows op
    types first: ``*GlobalMaxPool*`` where the node is ``.../Max``)."""
    word = pattern.strip("*?[]").rsplit("/", 1)[-1]
    if not word or not any(op_type_matches(t, word) for t in op_types if t):
        return err
    return UnknownNameError(f"{err.what}; {word!r} is an op type here: list its values by type", hint=None,
                            op_type=word)


def op_type_matches(op_type: str, wanted: str) -> bool:
    """Whether ``op_type`` is the op type ``wanted`` names: equal or matching as a glob, in any
    case, or one of its dotted parts (``bmm`` for ``aten.bmm.default``)."""
    have, want = (op_type or "").lower(), wanted.lower()
    return have == want or name_matches(have, want) or want in have.split(".")
