"""Quantization debugging: which ops' quantization breaks a model, and whether TVM builds the
quantized model as the runtime that made it runs it.

ONNX QDQ models (:mod:`.onnx_qdq`, :mod:`.qdq_graph`)::

    from tvm_probe.quantization import compare_quantized, sensitivity
    report = compare_quantized(float_model, qdq_model, inputs)   # per op: SQNR, TVM vs onnxruntime
    ranking = sensitivity(float_model, qdq_model, inputs)         # per op: outputs' SQNR with it in float
    ranking.keep_float(target_sqnr_db=30)                         # ops to leave in float
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
