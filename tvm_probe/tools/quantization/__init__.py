"""Quantization debugging: which ops' quantization breaks a model, and whether TVM builds the
quantized model as the runtime that made it runs it.

ONNX QDQ models (:mod:`.onnx_qdq`, :mod:`.qdq_graph`)::

    from tvm_probe.tools.quantization import compare_quantized, sensitivity
    report = compare_quantized(float_model, qdq_model, inputs)   # per op: SQNR, TVM vs onnxruntime
    ranking = sensitivity(float_model, qdq_model, inputs)         # per op: outputs' SQNR with it in float
    ranking.keep_float(target_sqnr_db=30)                         # ops to leave in float

LLM weight-only quantization as MLC-LLM deploys it (:mod:`.llm`; the build itself is
``Probe.from_hf(model, quantize="q4f32_1" | "q4f16_1" | QuantSpec(...))``)::

    from tvm_probe.tools.quantization import sensitivity_hf
    table = sensitivity_hf(model, "q4f32_1", prompt=ids, steps=8).table()  # per module: KL, first step off
"""

from .onnx_qdq import (  # noqa: F401
    QuantizationComparison,
    Sensitivity,
    compare_quantized,
    sensitivity,
)
from .qdq_graph import (  # noqa: F401
    QuantizationError,
    QuantizedOp,
    quantized_ops,
    switchable,
    with_float_ops,
)
from ...importer.quantize import PRESETS, QuantSpec  # noqa: F401
from .llm import ModuleSensitivity, SensitivityReport, VariantRun, sensitivity_hf  # noqa: F401
