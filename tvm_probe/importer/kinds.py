"""The model kinds: one :class:`~.adapter.ModelAdapter` per kind, found by kind or by model object.

Everything tvm_probe does differently by the kind of the source model is one method or attribute
of that kind's adapter, which lives with its importer (``OnnxAdapter`` in ``onnx.py``...)::

    from tvm_probe.importer.kinds import adapter_for, adapter_of, recorded

    adapter = adapter_for("onnx")              # a config's model: key; adapter_of(model): by the object
    model = adapter.load("bert.onnx")          # what YAML model: {onnx: bert.onnx} names
    imported = adapter.import_model(model, shapes={"input_ids": (1, 16)}, import_fixes=True)
    adapter.reference                          # "onnxruntime": get_reference(adapter.reference)
    adapter.default_inputs(model, imported.inputs)   # demo, torch: the model's own inputs; else None
    record = adapter.record("bert.onnx", {})   # a dump's metadata["model"] ...
    adapter, source, shapes = recorded(record) # ... and the model found again from it
    adapter.source_graph(source, shapes)       # SourceGraph("onnx", path): what Model Explorer shows
    adapter.graph == "onnx"                    # what split and reduce can cut
    adapter_for("relax").import_functions(mod, params=weights)  # kinds with functions=True

=========  ==============  ============  ===========  ======  =========  ===========================
kind       takes           reference     config       shapes  graph      import
=========  ==============  ============  ===========  ======  =========  ===========================
onnx       path/ModelProto onnxruntime   file         yes     onnx       import_model
demo       ModelProto      onnxruntime   sizes        no      onnx       import_model
torch      (module, args)  torch         factory      no      torch      import_model
tflite     path/bytes      tflite        file         yes     tflite     import_model
relax      IRModule        (none)        (Python)     no      (none)     import_functions(params=)
nn         nn.Module       (none)        (Python)     no      (none)     import_functions(spec=, params=)
hf         *ForCausalLM    torch         factory      no      (none)     import_functions(max_len=)
=========  ==============  ============  ===========  ======  =========  ===========================

``import tvm_probe.importer`` imports no torch, tflite or transformers (the importers import them
when they run); the demo's module builds ONNX graphs with ``onnx`` and is imported on first use.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.errors import ProbeError
from .adapter import ImportedFunctions, ModelAdapter, SourceGraph
from .hf import HFAdapter
from .nn import NNAdapter
from .onnx import OnnxAdapter
from .relax import RelaxAdapter
from .tflite import TFLiteAdapter
from .torch import TorchAdapter

__all__ = ["KINDS", "ImportedFunctions", "ModelAdapter", "SourceGraph", "adapter_for", "adapter_of", "adapters",
           "recorded"]

#: Every model kind, in the order :func:`adapter_of` asks their adapters (the demo before ONNX).
KINDS = ("relax", "nn", "hf", "torch", "tflite", "demo", "onnx")

_ADAPTERS: dict[str, ModelAdapter] = {a.kind: a for a in (RelaxAdapter(), NNAdapter(), HFAdapter(), TorchAdapter(),
                                                          TFLiteAdapter(), OnnxAdapter())}


def adapter_for(kind) -> ModelAdapter:
    """The adapter of ``kind`` (a name or a :class:`~tvm_probe.core.schema.ModelKind`)."""
    name = str(kind)
    if name == "demo" and name not in _ADAPTERS:
        from .demo import DemoAdapter  # (onnx, which the demo builds its graph with, on first use)

        _ADAPTERS[name] = DemoAdapter()
    if name not in _ADAPTERS:
        raise ProbeError(f"unknown model kind {name!r}: the kinds are {', '.join(KINDS)}")
    return _ADAPTERS[name]


def adapters() -> tuple[ModelAdapter, ...]:
    """Every kind's adapter, in :data:`KINDS` order."""
    return tuple(adapter_for(kind) for kind in KINDS)


def adapter_of(model) -> ModelAdapter:
    """The adapter whose importer takes ``model`` as it is (an ``onnx.ModelProto`` or ``.onnx``
    path, ``(torch module, example inputs)``, a ``.tflite`` path or bytes, an IRModule, an
    ``nn.Module``, a transformers causal LM)."""
    for adapter in adapters():
        if adapter.owns(model):
            return adapter
    raise ProbeError(f"no model kind takes a {type(model).__name__}: the kinds are {', '.join(KINDS)}")


def recorded(record: Mapping | None) -> tuple[ModelAdapter, Any, dict]:
    """``(adapter, source, shapes)`` of the model a dump records (its ``metadata["model"]``,
    :meth:`~.adapter.ModelAdapter.record`'s output); a one-line ProbeError when it records none
    or one that cannot be rebuilt here."""
    if not record:
        raise ProbeError("this dump does not record its model: give it with --model PATH")
    kind = next((k for k in KINDS if k in record), None)
    adapter = adapter_for(kind) if kind is not None else ModelAdapter()
    source, shapes = adapter.from_record(record)
    return adapter, source, shapes
