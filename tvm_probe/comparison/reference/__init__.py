"""References: independent evaluations of the source model, keyed like tvm_probe's source values.

A :class:`Reference` runs the *source* model — not anything TVM built — on the same inputs and
returns ``{source key: value}``; :func:`tvm_probe.comparison.compare` judges a probe against it.
The built-in ones are registered here by name (what YAML ``reference:`` and ``compare`` accept):

* ``onnxruntime`` — ONNX (and demo) models, every intermediate tensor (:mod:`.onnxruntime`);
* ``torch`` — eager PyTorch, the exported program interpreted node by node (:mod:`.torch`);
* ``tflite`` — the TFLite interpreter, every tensor preserved (:mod:`.tflite`).

* ``tvm`` — another TVM build of the same model (YAML ``reference: tvm`` or ``{tvm: {target:,
  pipeline:}}``): :class:`tvm_probe.probe.tvm_reference.TVMBuildReference`.  It needs the probe, which
  sits above this package, so it is registered by its own module, loaded on first use
  (:data:`_REGISTERED_ELSEWHERE`) — ``get_reference("tvm")`` and :func:`reference_names` find it.

``none`` (:data:`NO_REFERENCE`) is no reference at all: nothing is compared
(:func:`is_no_reference`).  It is a name YAML ``reference:`` accepts, never a registered reference.

Plugging in your own (an accelerator vendor's runtime, a golden file)::

    class Golden(Reference):
        name, model_kinds = "golden", ("onnx",)
        def values(self, model, inputs):
            return dict(np.load("golden.npz"))

    register_reference(Golden())      # now reference: golden in YAML, get_reference("golden")

Importing this package imports no runtime (and not TVM): each reference imports its own when it runs.
"""
from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Mapping

import numpy as np

from ...core.errors import ProbeError
from ...importer.kinds import adapter_for

__all__ = ["Reference", "register_reference", "get_reference", "configured_reference", "reference_for", "reference_names",
           "NO_REFERENCE", "is_no_reference", "TVM_BUILD"]

#: YAML ``reference: none``: compare with nothing (the run, dump and report only).  A name
#: ``reference:`` accepts, reserved: no reference can be registered under it.
NO_REFERENCE = "none"


def is_no_reference(name: str) -> bool:
    """Whether the reference name ``name`` means no reference at all (:data:`NO_REFERENCE`)."""
    return name == NO_REFERENCE


#: The built-in reference that is another TVM build of the model
#: (:class:`tvm_probe.probe.tvm_reference.TVMBuildReference`; YAML ``reference: tvm`` or
#: ``{tvm: {target: T, pipeline: P}}``).
TVM_BUILD = "tvm"


class Reference:
    """An independent evaluation of a source model.

    Subclasses set :attr:`name` (the registry key) and :attr:`model_kinds` (the model kinds of
    :class:`tvm_probe.core.schema.ModelKind` it can run), and implement :meth:`values`.
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

    def values_for(self, probe, model: Any, inputs: Mapping[str, np.ndarray]):
        """What :func:`tvm_probe.comparison.compare` judges ``probe`` against: :meth:`values` of
        ``model`` on ``inputs``.  A reference that is itself a TVM build overrides it to reuse the
        probe's imported model and return its run (compared by source name, with why a value it
        does not serve is unchecked)."""
        return self.values(model, inputs)

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

    name, model_kinds = "torch", ("torch", "hf")

    def values(self, model, inputs):
        import torch

        from .torch import torch_values

        module = model[0] if isinstance(model, tuple) else model
        return torch_values(module, tuple(torch.from_numpy(np.require(a, requirements=("C", "W"))) for a in inputs.values()))


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
        raise ProbeError(f"{reference!r} is not a usable reference: subclass tvm_probe.Reference "
                         "and set name and model_kinds")
    if is_no_reference(reference.name):
        raise ProbeError(f"reference name {reference.name!r} is reserved (no reference): pick another name")
    _load(reference.name)  # a built-in registered by its own module is taken (and replaced) too
    if reference.name in _REGISTRY and not replace:
        raise ProbeError(f"a reference named {reference.name!r} is already registered: pass replace=True "
                         "to replace it")
    _REGISTRY[reference.name] = reference
    return reference


def get_reference(name: str) -> Reference:
    """The reference registered as ``name``; ProbeError naming those there are otherwise."""
    _load(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ProbeError(f"unknown reference {name!r}: use one of {', '.join(reference_names())}") from None


def configured_reference(name: str, options: Mapping | None = None) -> Reference:
    """The reference registered as ``name``, with ``options`` — the fields of a reference that
    takes some, e.g. ``{target, pipeline}`` of the TVM build (YAML ``reference: {tvm: {...}}``)."""
    reference = get_reference(name)
    if not options:
        return reference
    if not dataclasses.is_dataclass(reference):
        raise ProbeError(f"reference {name!r} takes no options (given: {', '.join(options)})")
    fields = {f.name for f in dataclasses.fields(reference)}
    unknown = [k for k in options if k not in fields]
    if unknown:
        raise ProbeError(f"reference {name!r} has no option {unknown[0]!r}: it takes {', '.join(sorted(fields))}")
    return dataclasses.replace(reference, **options)


def reference_for(model_kind: str) -> Reference:
    """The reference that runs models of ``model_kind`` by default (the one its adapter names:
    :attr:`tvm_probe.importer.adapter.ModelAdapter.reference`; the default of ``compare``)."""
    name = adapter_for(model_kind).reference
    if name is None:
        raise ProbeError(f"no reference runs {model_kind} models: give reference: {NO_REFERENCE}, or "
                         f"{', '.join(_REGISTERED_ELSEWHERE)} (another build)")
    return get_reference(name)


def reference_names() -> tuple[str, ...]:
    """Every name YAML ``reference:`` accepts: ``none``, the registered references, ``tvm``
    (whether or not its module is loaded yet)."""
    return ((NO_REFERENCE,) + tuple(n for n in _REGISTRY if n not in _REGISTERED_ELSEWHERE)
            + tuple(_REGISTERED_ELSEWHERE))


def _load(name: str) -> None:
    """Load the module that registers the built-in ``name``, if it is one not loaded yet."""
    module = _REGISTERED_ELSEWHERE.get(name)
    if module is not None and module not in sys.modules:
        importlib.import_module(module)


#: Built-in references that need what sits above this package (the probe): name → the module
#: that defines and registers it, imported on first use (by name, so that this package imports
#: neither it nor TVM).
_REGISTERED_ELSEWHERE = {TVM_BUILD: "tvm_probe.probe.tvm_reference"}
_BUILTIN = (OnnxruntimeReference(), TorchReference(), TFLiteReference())
for _reference in _BUILTIN:
    register_reference(_reference)
