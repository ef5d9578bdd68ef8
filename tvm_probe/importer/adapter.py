"""The interface every model kind implements (:class:`ModelAdapter`); the registry is :mod:`.kinds`.

Each kind's adapter lives with its importer (``onnx.py``, ``torch.py``, ``tflite.py``, ``relax.py``,
``nn.py``, ``hf.py``, ``demo.py``); this module holds what they share and imports none of them.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..core.errors import ModelError, ProbeError
from .model import ImportedModel, InputSpec


@dataclass
class ImportedFunctions:
    """A module of several Relax functions, each imported: what ``Probe.from_functions`` compiles
    once, one function probe per entry of :attr:`models` (the first is the probe returned).

    Attributes:
        mod: the IRModule compiled (every function as imported, before any pass).
        models: function name → its :class:`~tvm_probe.importer.relax.FunctionModel`.
        hf: for a transformers causal LM, what generation needs (:class:`~tvm_probe.importer.hf.HFModel`).
        serving: for an nn model, what its config says about serving it as MLC-LLM does
            (``context_window_size``, ``prefill_chunk_size``, ``vocab_size``...: :func:`~.nn.serving_config`).
    """

    mod: Any
    models: dict = field(default_factory=dict)
    hf: Any = None
    serving: dict = field(default_factory=dict)


class SourceGraph(NamedTuple):
    """What Model Explorer shows as the source graph: ``format`` is ``"onnx"`` (``model`` a path or an
    ``onnx.ModelProto``), ``"tflite"`` (a path) or ``"torch"`` (``(module, example_inputs)``)."""

    format: str
    model: Any


class ModelAdapter:
    """Everything tvm_probe does differently by the kind of the source model.

    Class attributes:
        kind: the registry key (``model: {KIND: ...}`` in YAML).
        described: the kind in a sentence (``"an ONNX model"``).
        reference: the name of the reference that runs it by default
            (``tvm_probe.comparison.reference.get_reference(name)``), or None: none does.
        config: what YAML ``model: {KIND: VALUE}`` takes: ``"file"`` (a path), ``"factory"``
            (``"file.py:function"`` or ``"package.module:function"``), ``"sizes"`` (a mapping),
            or ``""`` (given in Python only).
        shapes: whether it takes ``shapes:`` (static shapes for the inputs).
        graph: the format of its source graph (``"onnx"``: what ``split`` and ``reduce`` cut;
            ``"tflite"``, ``"torch"``), or None (nothing Model Explorer reads).
        functions: imported as several functions (:meth:`import_functions`, run with
            ``probe.call``), not as one :class:`ImportedModel` (:meth:`import_model`, ``probe.run``).
    """

    kind: str = ""
    described: str = ""
    reference: str | None = None
    config: str = ""
    shapes: bool = False
    graph: str | None = None
    functions: bool = False

    # -- from a config or a dump record ---------------------------------------------------------
    def load(self, source, shapes: Mapping[str, Sequence[int]] | None = None) -> Any:
        """The model ``source`` (the YAML ``model:`` value) names, as :meth:`import_model` takes it."""
        raise ProbeError(f"{self.described} is given in Python, not by a config or a dump")

    def record(self, source, shapes: Mapping[str, Sequence[int]] | None = None) -> dict:
        """JSON-friendly record of ``source`` (dumps keep it as ``metadata["model"]``)."""
        raise ProbeError(f"{self.described} given in Python cannot be recorded in a dump")

    def from_record(self, record: Mapping) -> tuple[Any, dict]:
        """``(source, shapes)`` from :meth:`record`'s output: the model to rebuild for a dump."""
        raise ProbeError(f"this dump records a model tvm_probe cannot rebuild here ({', '.join(record)}): "
                         "give an ONNX export of it with --model PATH")

    def source_graph(self, source, shapes: Mapping[str, Sequence[int]] | None = None) -> SourceGraph:
        """The source graph Model Explorer shows for the model ``source`` names."""
        raise ProbeError(f"{self.described} has no source graph Model Explorer can show: give it with --model PATH")

    # -- importing -----------------------------------------------------------------------------
    def owns(self, model) -> bool:
        """Whether ``model`` (an object as :meth:`import_model` takes it) is of this kind."""
        return False

    def import_model(self, model, shapes: Mapping[str, Sequence[int]] | None = None,
                     import_fixes: bool = True, sizes: Mapping[str, Sequence[int]] | None = None) -> ImportedModel:
        """The :class:`ImportedModel` of ``model`` (one function: ``main``).  ``sizes``: the shapes
        of the arrays the run will feed, for dimensions the import must pin (ONNX, see
        :func:`~tvm_probe.importer.onnx.import_onnx`); kinds with static shapes ignore them."""
        raise ProbeError(f"{self.described} has several functions: import it with import_functions "
                         f"(Probe.from_{self.kind})")

    def import_functions(self, model, **options) -> ImportedFunctions:
        """Every public function of ``model``, imported (kinds with :attr:`functions`)."""
        raise ProbeError(f"{self.described} has one function: import it with import_model")

    def default_inputs(self, model, inputs: Sequence[InputSpec]) -> dict[str, np.ndarray] | None:
        """Input values the model itself provides (by name, for ``inputs`` in order), or None: the
        caller must give every input."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind!r}>"


def static_shapes(shapes: Mapping[str, Sequence[int]] | None) -> dict[str, tuple[int, ...]]:
    """``shapes=`` as the importers take it: ``{input: (dims)}``."""
    return {k: tuple(v) for k, v in (shapes or {}).items()}


def load_factory(name: str, key: str):
    """The function ``name`` (``"file.py:function"`` or ``"package.module:function"``) names;
    ``key`` (``torch``, ``hf``) names the config key in errors."""
    where, _, func = name.rpartition(":")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        return getattr(module, func)
    except Exception as err:
        raise ModelError(f"model.{key}: cannot load {name!r} ({type(err).__name__}: {err}): "
                         "give 'file.py:function' or 'package.module:function'") from None


def file_record(kind: str, source, shapes) -> dict:
    """The record of a model file (ONNX, TFLite): its absolute path and the shapes given."""
    return {kind: str(Path(source).resolve()), "shapes": {k: list(v) for k, v in (shapes or {}).items()}}


def file_from_record(kind: str, record: Mapping) -> tuple[Path, dict]:
    return Path(record[kind]), {k: tuple(v) for k, v in (record.get("shapes") or {}).items()}
