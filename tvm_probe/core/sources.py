"""Source values: every tensor of the source model, and how tvm_probe serves it.

This module is plain data (no TVM), shared by the live probe and by a dump read back from
disk.  A :class:`SourceValue` is one tensor of the source graph, keyed by its tensor name
(unique in ONNX).  It answers to several names: the tensor name and, when the producing node has
a name, the node name (``node:k`` for output ``k`` of a multi-output node).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Kind(str, Enum):
    """Where a source value comes from in the source model."""

    INPUT = "input"        # a graph input the user feeds
    PARAM = "param"        # an initializer (weight)
    CONSTANT = "constant"  # computed at import time (shape arithmetic, Constant, Identity of a weight)
    VALUE = "value"        # computed at run time by the compiled module


class Served(str, Enum):
    """How ``get()`` obtains a value of the compiled model."""

    INPUT = "input"            # the run's own input
    SHAPE = "shape"            # a symbolic dimension (dynamic axes): a size of this run's inputs
    CONSTANT = "constant"      # a weight or a value folded at import time
    FOLDED = "folded"          # folded by the pipeline's FoldConstant; re-evaluated the same way
    CAPTURED = "captured"      # a kernel output copied while the model ran
    VIEW = "view"              # a zero-copy builtin view (reshape) copied while the model ran
    RECOMPUTED = "recomputed"  # kept inside a fused kernel; recomputed from its captured inputs
    PASSED = "passed"          # computed outside any kernel (an If's result, whichever branch ran):
                               # copied where the VM passes it on, into a kernel or out as an output
    SEQUENCE = "sequence"      # a sequence (a tuple of tensors): its elements, each served as it is
    UNAVAILABLE = "unavailable"  # dead code: no model output depends on it in the source graph
    UNKNOWN = "unknown"        # live, but tvm_probe cannot tell where the compiled module holds it


@dataclass
class SourceValue:
    """One tensor of the source model.

    Attributes:
        key: the tensor name, unique in the model; the primary key everywhere.
        node: name of the node that produced it ('' for graph inputs, weights and unnamed nodes).
        op_type: the producing op ('Input' / 'Initializer' for graph inputs and weights).
        output_index: which output of ``node`` this tensor is.
        kind: see :class:`Kind`.
        topo_index: position of the producing node in the source graph (-1 for inputs/weights).
        inputs: keys of the source values the producing node consumed.
        shape, dtype: as compiled; a symbolic dimension (dynamic axes) is its name, e.g. ``'batch'``.
        aliases: further names it answers to (e.g. parts of a name a converter merged).
        modules: module paths whose output it is (PyTorch models and their dynamo ONNX exports).
        origin: where the user's code made it (``file.py:line`` from PyTorch's stack trace), or ''.
    """

    key: str
    node: str = ""
    op_type: str = ""
    output_index: int = 0
    kind: Kind = Kind.VALUE
    topo_index: int = -1
    inputs: tuple[str, ...] = ()
    shape: tuple[int | str, ...] | None = None
    dtype: str | None = None
    num_outputs: int = 1
    aliases: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    origin: str = ""

    @property
    def names(self) -> list[str]:
        """Every name this value answers to: display name first, then the tensor name."""
        names = [self.display_name]
        for name in (self.key, *self.aliases, *self.modules):
            if name not in names:
                names.append(name)
        return names

    @property
    def display_name(self) -> str:
        """The node name (``node:k`` for output k of a multi-output node), else the tensor name."""
        if not self.node:
            return self.key
        return self.node if self.num_outputs == 1 else f"{self.node}:{self.output_index}"

    def to_record(self) -> dict:
        """A JSON-friendly dict (the inverse of :meth:`from_record`)."""
        return {
            "key": self.key, "node": self.node, "op_type": self.op_type,
            "output_index": self.output_index, "num_outputs": self.num_outputs,
            "kind": self.kind.value, "topo_index": self.topo_index, "inputs": list(self.inputs),
            "shape": None if self.shape is None else list(self.shape), "dtype": self.dtype,
            "aliases": list(self.aliases),
            "modules": list(self.modules), "origin": self.origin,
        }

    @classmethod
    def from_record(cls, rec: dict) -> "SourceValue":
        """Rebuild from :meth:`to_record` output (raises KeyError/ValueError/TypeError if malformed)."""
        return cls(
            key=str(rec["key"]), node=str(rec["node"]), op_type=str(rec["op_type"]),
            output_index=int(rec["output_index"]), num_outputs=int(rec["num_outputs"]),
            kind=Kind(rec["kind"]), topo_index=int(rec["topo_index"]),
            inputs=tuple(str(i) for i in rec["inputs"]),
            shape=None if rec["shape"] is None else tuple(d if isinstance(d, str) else int(d) for d in rec["shape"]),
            dtype=None if rec["dtype"] is None else str(rec["dtype"]),
            aliases=tuple(str(a) for a in rec.get("aliases", ())),
            modules=tuple(str(m) for m in rec.get("modules", ())), origin=str(rec.get("origin", "")),
        )


@dataclass(frozen=True)
class Serving:
    """How one build serves one source value: a fact of the build, not of the source model.

    One imported model compiled with two pipelines serves a value in two ways (captured in one,
    recomputed inside a fused kernel in the other), so this is kept in a table per build
    (:func:`tvm_probe.kernel_map.classify`; a dump records the one of its run), never on the
    :class:`SourceValue`.

    Attributes:
        served: see :class:`Served`.
        node_index: the graph node that outputs it or holds it inside (for an input, its input
            node), or -1.
    """

    served: Served
    node_index: int = -1

    def to_record(self) -> dict:
        """The two fields of a dump's source record (the inverse of :meth:`from_record`)."""
        return {"served": self.served.value, "node_index": self.node_index}

    @classmethod
    def from_record(cls, rec: dict) -> "Serving":
        """Read from a dump's source record (raises KeyError/ValueError/TypeError if malformed)."""
        # (a record without a classification would be a value the build never placed)
        served = Served.UNKNOWN if rec["served"] is None else Served(rec["served"])
        return cls(served, int(rec["node_index"]))


#: Source key → how one build serves it (see :class:`Serving`).
Servings = dict[str, Serving]


@dataclass
class SourceMap:
    """All source values of a model, in source-graph order, by tensor name."""

    values: dict[str, SourceValue] = field(default_factory=dict)
    model_inputs: list[str] = field(default_factory=list)   # keys of the inputs the user feeds
    model_outputs: list[str] = field(default_factory=list)  # keys of the graph outputs
    notes: dict[str, str] = field(default_factory=dict)     # a name with no value → why
    #: a sequence value (ONNX SplitToSequence, SequenceConstruct: a Relax tuple of tensors) →
    #: the keys of its elements, ``seq[0]``, ``seq[1]``..., each a source value of its own
    sequences: dict[str, list[str]] = field(default_factory=dict)

    def add(self, value: SourceValue) -> None:
        self.values[value.key] = value
        self.__dict__.pop("_positions", None)

    def in_order(self, keys) -> list[SourceValue]:
        """The values of ``keys`` present here, in source order (without a pass over every
        value: a generation compare asks for a few dozen of a few hundred, many times)."""
        positions = self.__dict__.get("_positions")
        if positions is None or len(positions) != len(self.values):
            positions = self.__dict__["_positions"] = {k: i for i, k in enumerate(self.values)}
        return [self.values[k] for k in sorted((k for k in keys if k in positions), key=positions.__getitem__)]

    def __getitem__(self, key: str) -> SourceValue:
        return self.values[key]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def __iter__(self):
        return iter(self.values.values())

    def __len__(self) -> int:
        return len(self.values)

    def copy(self) -> "SourceMap":
        """An independent copy (to change some values without touching the original's)."""
        from dataclasses import replace

        out = SourceMap(model_inputs=list(self.model_inputs), model_outputs=list(self.model_outputs),
                        notes=dict(self.notes), sequences={k: list(v) for k, v in self.sequences.items()})
        for value in self.values.values():
            out.add(replace(value))
        return out

    def live_keys(self) -> set[str]:
        """Keys of the values some model output depends on, judged on the source graph itself.

        This is what "dead code" means: a value outside this set is never needed, whatever
        the compiler does.  Computed from ``inputs`` alone, so it holds for dumps too.
        """
        live, stack = set(), [k for k in self.model_outputs if k in self.values]
        while stack:
            key = stack.pop()
            if key in live:
                continue
            live.add(key)
            stack.extend(k for k in self.values[key].inputs if k in self.values and k not in live)
            stack.extend(self.sequences.get(key, ()))  # a sequence needs its elements
        return live

    def output_values(self, arrays: list) -> dict:
        """The model outputs, by key, from the arrays of a run's result in order (the VM's
        result flattened): a sequence output takes as many arrays as it has elements, a list of
        them.  (A result of another length, such as torch's ``(x, None)``, is paired as it comes.)"""
        counts = [len(self.sequences[k]) if k in self.sequences else 1 for k in self.model_outputs]
        if sum(counts) != len(arrays) or not self.sequences:
            return dict(zip(self.model_outputs, arrays))
        out, at = {}, 0
        for key, count in zip(self.model_outputs, counts):
            out[key] = list(arrays[at:at + count]) if key in self.sequences else arrays[at]
            at += count
        return out

    def element_of(self, key: str) -> tuple[str, int] | None:
        """``(sequence key, position)`` when ``key`` is an element of a sequence, else None."""
        found = self.__dict__.get("_elements")
        if found is None or len(found) != sum(len(v) for v in self.sequences.values()):
            found = self.__dict__["_elements"] = {e: (s, k) for s, elements in self.sequences.items()
                                                  for k, e in enumerate(elements)}
        return found.get(key)
