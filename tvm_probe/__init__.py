"""tvm_probe: read any intermediate tensor of a TVM-compiled model by its source name.

    from tvm_probe import Probe, demo
    model = demo.tiny_bert()
    probe = Probe.from_onnx(model, target="llvm", pipeline="fused")
    probe.run(demo.demo_inputs(model))
    probe.get("layer_._0/attention/self/MatMul")

Importing this package imports neither TVM nor onnx; reading a dump needs numpy alone.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .core.errors import (  # noqa: E402  (version first: the dump writer records it)
    AmbiguousNameError, CorruptDumpError, DumpError, DumpExistsError, InputError, InternalError, ModelError,
    NameLookupError, NotCapturedError, NotRunError, PipelineError, ProbeError, TVMBehaviourChanged,
    TVMCompileError, TVMError, TVMRunError, UnknownNameError, UnsupportedOpError, ValueUnavailableError,
)

#: What a user imports from ``tvm_probe``: the probe and dumps, comparison, references, errors.
#: Everything here is loaded on first use (see __getattr__).
_LAZY = {
    "Probe": ".probe", "load_dump": ".store.dump", "compare": ".comparison.verdict", "Comparison": ".comparison",
    "Status": ".comparison", "Tolerance": ".core.tolerance", "Reference": ".comparison.reference",
    "register_reference": ".comparison.reference", "get_reference": ".comparison.reference",
    "onnxruntime_values": ".comparison.reference.onnxruntime", "torch_values": ".comparison.reference.torch",
    "tflite_values": ".comparison.reference.tflite", "Instrument": ".capture.instrument",
    "QuantSpec": ".importer.quantize",
}

#: the stages a user reaches as attributes (``tvm_probe.llm``, ``tvm_probe.tools``), imported on first use
_STAGES = ("llm", "tools", "show", "comparison", "importer", "probe", "store", "core")

__all__ = [
    *_LAZY, "demo", "ProbeError", "ModelError", "UnsupportedOpError", "PipelineError",
    "InputError", "NameLookupError", "UnknownNameError", "AmbiguousNameError", "NotRunError",
    "NotCapturedError", "ValueUnavailableError", "DumpError", "DumpExistsError", "CorruptDumpError",
    "TVMBehaviourChanged", "InternalError", "TVMError", "TVMCompileError", "TVMRunError", "__version__",
]


def __getattr__(name):  # lazy: keep `import tvm_probe` light
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    if name == "demo":
        return importlib.import_module(".importer.demo", __name__)
    if name in _STAGES:  # (``tvm_probe.llm.compare_generation`` after ``import tvm_probe``)
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tvm_probe' has no attribute {name!r}")
