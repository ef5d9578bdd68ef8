"""What every importer hands to the compile stage."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sources import SourceMap


@dataclass(frozen=True)
class InputSpec:
    """One input the user must feed: its source name, static shape and numpy dtype.

    ``index_bound`` is set when the input indexes a weight directly (the ids of an embedding
    ``Gather``): valid values are ``-index_bound <= v < index_bound``.  TVM's compiled Gather
    does not check bounds, so out-of-range ids would read out of memory; ``run`` refuses them.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    index_bound: int | None = None
    indexes: str = ""


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
        model_hash: identifies the source model (stored in dumps).
    """

    mod: Any
    sources: SourceMap
    var_keys: dict = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    inputs: list[InputSpec] = field(default_factory=list)
    model_hash: str = ""
