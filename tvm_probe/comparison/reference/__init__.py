"""References: independent evaluations of the source model, keyed like tvm_probe's source values.

A :class:`Reference` runs the *source* model — not anything TVM built — on the same inputs and
returns ``{source key: value}``; :func:`tvm_probe.compare.compare` judges a probe against it.
The built-in ones are registered here by name (what YAML ``reference:`` and ``compare`` accept):

* ``onnxruntime`` — ONNX (and demo) models, every intermediate tensor (:mod:`.onnxruntime`);
* ``torch`` — eager PyTorch, the exported program interpreted node by node (:mod:`.torch`);
* ``tflite`` — the TFLite interpreter, every tensor preserved (:mod:`.tflite`).

Another TVM build of the same model (YAML ``reference: tvm``) is a probe, not a runtime, and is
handled where builds are (``investigate.reference_build``, ``reduce.TVMBuild``).

Plugging in your own (an accelerator vendor's runtime, a golden file)::

    class Golden(Reference):
        name, model_kinds = "golden", ("onnx",)
        def values(self, model, inputs):
            return dict(np.load("golden.npz"))

    register_reference(Golden())      # now reference: golden in YAML, get_reference("golden")

Importing this package imports no runtime: each reference imports its own when it runs.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ...core.errors import ProbeError

__all__ = ["Reference", "register_reference", "get_reference", "reference_for", "reference_names"]


class Reference:
    """An independent evaluation of a source model.

    Subclasses set :attr:`name` (the registry key) and :attr:`model_kinds` (the model kinds of
    :class:`tvm_probe.schema.ModelKind` it can run), and implement :meth:`values`.
    """

    #: the name it is registered and chosen under (``reference: NAME`` in YAML)
    name: str = ""
    #: the kinds of source model it can run (``"onnx"``, ``"torch"``, ``"tflite"``, ``"demo"``)
    model_kinds: tuple[str, ...] = ()

    def values(self, model: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``{source key: value}`` of ``model`` run on ``inputs`` (``{input name: array}``).

        ``model`` is what the model's importer took: an ``onnx.ModelProto`` or path, a
        ``(torch module, example inputs)`` pair, a ``.tflite`` path or bytes.  Return every value
        you can; what is missing is reported as unchecked, never as passed.
        """
        raise NotImplementedError

    def runs(self, model_kind: str) -> bool:
        """Whether this reference can run models of ``model_kind``."""
        return str(model_kind) in self.model_kinds

    def __repr__(self) -> str:
        return f"<Reference {self.name!r} for {', '.join(self.model_kinds) or 'no models'}>"


class OnnxruntimeReference(Reference):
    """onnxruntime (CPU): every node output of the ONNX model."""

    name, model_kinds = "onnxruntime", ("onnx", "demo")

    def values(self, model, inputs):
        from .onnxruntime import onnxruntime_values

        return onnxruntime_values(model, inputs)


class TorchReference(Reference):
    """Eager PyTorch: the exported program run node by node."""

    name, model_kinds = "torch", ("torch",)

    def values(self, model, inputs):
        import torch

        from .torch import torch_values

        module = model[0] if isinstance(model, tuple) else model
        return torch_values(module, tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.values()))


class TFLiteReference(Reference):
    """The TFLite interpreter, every tensor preserved."""

    name, model_kinds = "tflite", ("tflite",)

    def values(self, model, inputs):
        from .tflite import tflite_values

        return tflite_values(model, inputs)


_REGISTRY: dict[str, Reference] = {}


def register_reference(reference: Reference, replace: bool = False) -> Reference:
    """Make ``reference`` available by its name (YAML ``reference: NAME``, :func:`get_reference`).

    Raises:
        ProbeError: it has no name or model kinds, or the name is taken (``replace=True`` to
            replace it on purpose).
    """
    if not isinstance(reference, Reference) or not reference.name or not reference.model_kinds:
        raise ProbeError(f"{reference!r} is not a usable reference: subclass tvm_probe.reference.Reference "
                         "and set name and model_kinds")
    if reference.name in _RESERVED:
        raise ProbeError(f"reference name {reference.name!r} is reserved: pick another name")
    if reference.name in _REGISTRY and not replace:
        raise ProbeError(f"a reference named {reference.name!r} is already registered: pass replace=True "
                         "to replace it")
    _REGISTRY[reference.name] = reference
    return reference


def get_reference(name: str) -> Reference:
    """The reference registered as ``name``; ProbeError naming those there are otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ProbeError(f"unknown reference {name!r}: use one of {', '.join(reference_names())}") from None


def reference_for(model_kind: str) -> Reference:
    """The built-in reference that runs models of ``model_kind`` (the default of ``compare``)."""
    for reference in _BUILTIN:
        if reference.runs(model_kind):
            return reference
    raise ProbeError(f"no reference runs {model_kind} models: give reference: none, or tvm (another build)")


def reference_names() -> tuple[str, ...]:
    """Every name YAML ``reference:`` accepts: the registered references, ``none`` and ``tvm``."""
    return _RESERVED[:1] + tuple(_REGISTRY) + _RESERVED[1:]


_RESERVED = ("none", "tvm")  # no reference; another TVM build of the model
_BUILTIN = (OnnxruntimeReference(), TorchReference(), TFLiteReference())
for _reference in _BUILTIN:
    register_reference(_reference)
