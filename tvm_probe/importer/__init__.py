"""Import stage: source model → Relax module whose runtime values carry source names.

One adapter per model kind (:mod:`.kinds`) says how each kind is loaded, imported, recorded and
shown; :func:`import_model` is the one dispatch from a kind to its importer.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..core.schema import ModelKind
from .adapter import ImportedFunctions, ModelAdapter
from .kinds import adapter_for, adapter_of
from .model import ImportedModel, InputSpec

__all__ = ["ImportedFunctions", "ImportedModel", "InputSpec", "ModelAdapter", "adapter_for", "adapter_of",
           "import_model"]


def import_model(kind: ModelKind | str, model: Any, shapes: Mapping[str, Sequence[int]] | None = None,
                 import_fixes: bool = True) -> ImportedModel:
    """The :class:`ImportedModel` of ``model``, by the importer of its ``kind``.

    ``model`` is what that importer takes: an ``onnx.ModelProto`` or path (``onnx``, ``demo``), a
    ``.tflite`` path or bytes, or ``(torch module, example inputs)``.
    """
    return adapter_for(kind).import_model(model, shapes, import_fixes)
