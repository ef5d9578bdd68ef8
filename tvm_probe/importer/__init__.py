"""Import stage: source model → Relax module whose runtime values carry source names."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..core.schema import ModelKind
from .model import ImportedModel, InputSpec

__all__ = ["ImportedModel", "InputSpec", "import_model"]


def import_model(kind: ModelKind | str, model: Any, shapes: Mapping[str, Sequence[int]] | None = None,
                 import_fixes: bool = True) -> ImportedModel:
    """The :class:`ImportedModel` of ``model``, by the importer of its ``kind``.

    ``model`` is what that importer takes: an ``onnx.ModelProto`` or path (``onnx``, ``demo``), a
    ``.tflite`` path or bytes, or ``(torch module, example inputs)``.
    """
    kind = ModelKind(kind)
    shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
    if kind is ModelKind.TORCH:
        from .torch import import_torch

        return import_torch(*model, import_fixes=import_fixes)
    if kind is ModelKind.TFLITE:
        from .tflite import import_tflite

        return import_tflite(model, shapes)
    from .onnx import import_onnx

    return import_onnx(model, shapes, import_fixes=import_fixes)
