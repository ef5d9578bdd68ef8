"""What every importer hands to the compile stage."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..core.sources import SourceMap
from .fixes import AppliedFix


@dataclass(frozen=True)
class InputSpec:
    """One input the user must feed: its source name, shape and numpy dtype.

    A dimension of ``shape`` is an int, or a name (``'batch'``) when the model is compiled with
    symbolic dimensions: then any size goes, the same size wherever the name appears.  ``shape``
    is None for an input declared without a rank (ONNX), which TVM compiles as such.

    ``index_bound`` is set when the input indexes a weight directly (the ids of an embedding
    ``Gather``): valid values are ``-index_bound <= v < index_bound`` (ONNX), or
    ``0 <= v < index_bound`` when ``negative_ids`` is False (TFLite, PyTorch's ``aten.embedding``).  TVM's compiled Gather
    does not check bounds, so out-of-range ids would read out of memory; ``run`` refuses them.

    ``aliases`` are further names ``run`` accepts for it (a TFLite signature's input key).
    ``pinned``: the axes whose size tvm_probe chose because the model leaves them unknown (see
    :attr:`ImportedModel.pinned`).
    """

    name: str
    shape: tuple[int | str, ...] | None
    dtype: str
    index_bound: int | None = None
    indexes: str = ""
    negative_ids: bool = True
    aliases: tuple[str, ...] = ()
    pinned: tuple[int, ...] = ()


@dataclass
class ImportedModel:
    """A Relax module plus the source names of its values.

    Attributes:
        mod: the imported ``tvm.IRModule`` (the ops are exactly those of a plain import).
        sources: every source value, by tensor name.
        var_keys: Relax ``Var`` → keys of the source values it holds (one Var may hold several:
            identity ops return their input).  Var identity survives legalization and folding,
            which is what the kernel map relies on.
        constants: values known without running (weights, import-time folded values).
        inputs: what :meth:`Probe.run` must be fed, in the order of ``main``'s parameters.
        hash_model: computes a string identifying the source model (stored in dumps); called
            once, when first needed, because hashing hundreds of MB of weights is not free.
        fixes: the import fixes the model needed (:mod:`tvm_probe.importer.fixes`), each with the
            source ops it rewrote; empty for a plain import.  Reports and dumps list them.
        unfixed: with ``import_fixes=False``, the constructs a fix would have rewritten (left as
            TVM imports them), so that a build failure can name them.
        overwritten: source key → why the compiled module may not compute it: an in-place op's
            converter wrote its result into the value's place (``y.copy_(w)`` for ``y``), so
            TVM's module reads the written value wherever ``y`` is used afterwards.  The kernel
            map gives it as the reason when the value is lost.
        pinned: the inputs built with sizes chosen for dimensions the model leaves unknown
            (:class:`~tvm_probe.core.records.PinnedInput`), where TVM's importer could not
            follow them symbolically.
        shape_values: source key → the shape or scalar expression TVM's import computed it as
            (``R.shape([n, 3])``, ``n + 1``), bound to no Var: the kernel map serves it from the
            run's input sizes when only they enter it (else it stays unknown, with its note).
    """

    mod: Any
    sources: SourceMap
    var_keys: dict = field(default_factory=dict)
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    inputs: list[InputSpec] = field(default_factory=list)
    hash_model: Callable[[], str] = lambda: ""
    fixes: list[AppliedFix] = field(default_factory=list)
    unfixed: list[AppliedFix] = field(default_factory=list)
    overwritten: dict[str, str] = field(default_factory=dict)
    shape_values: dict = field(default_factory=dict)
    pinned: list = field(default_factory=list)

    @property
    def model_hash(self) -> str:
        if not hasattr(self, "_hash"):
            self._hash = self.hash_model()
        return self._hash


class LazyArrays(Mapping):
    """``name → numpy array``, converting each value on first access (weights: no copy up front)."""

    def __init__(self, convert: Callable[[Any], np.ndarray], sources: dict[str, Any]):
        self._convert, self._sources, self._done = convert, sources, {}

    def __setitem__(self, name: str, array: np.ndarray) -> None:
        self._done[name] = array

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._done:
            self._done[name] = self._convert(self._sources[name])
        return self._done[name]

    def __iter__(self):
        return iter({**self._sources, **self._done})

    def __len__(self) -> int:
        return len({**self._sources, **self._done})
