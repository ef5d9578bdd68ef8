"""Float ONNX models to quantize with onnxruntime's own ``quantize_static``, as users do: MLPs with each
activation onnxruntime treats differently (Relu and Clip/Relu6 it folds into a QuantizeLinear, LeakyRelu
and Sigmoid it quantizes as ops), Gemm, and small CNNs (a ResNet block, a MobileNet-style depthwise block);
seeded random weights, one planted outlier channel each.  Also PP-OCR's mobile text-direction classifier
(``ppocr_cls``: a real CNN nobody here wrote, dynamic batch and width).

The ground truth of "these ops kept in float" is onnxruntime's quantizer run again with
``nodes_to_exclude`` (:func:`quantize`'s ``exclude``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 16
PPOCR_CLS = Path(__file__).parent / "onnx_models" / "ppocr_mobile_v2.0_cls.onnx"
#: quantize_static's options users pick, each a name and its keyword arguments
OPTIONS = {
    "default": {},
    "per_channel": {"per_channel": True},
    "quint8_symmetric_weights": {"activation_type": "QUInt8", "weight_type": "QInt8",
                                 "extra_options": {"WeightSymmetric": True}},
    "symmetric_activations": {"activation_type": "QInt8", "extra_options": {"ActivationSymmetric": True}},
    "qint8_per_channel_asymmetric_weights": {"activation_type": "QInt8", "weight_type": "QInt8", "per_channel": True,
                                             "extra_options": {"WeightSymmetric": False}},
}


def _activation(kind: str, x: str, out: str, name: str) -> tuple[list, dict]:
    """One activation node (and the constants it reads)."""
    if kind == "Relu6":
        return ([helper.make_node("Clip", [x, f"{name}_min", f"{name}_max"], [out], name=name)],
                {f"{name}_min": np.array(0, np.float32), f"{name}_max": np.array(6, np.float32)})
    if kind == "LeakyRelu":
        return [helper.make_node("LeakyRelu", [x], [out], name=name, alpha=0.1)], {}
    return [helper.make_node(kind, [x], [out], name=name)], {}


def _model(nodes, weights, inputs, outputs, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(a), n)
                                                              for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def mlp(activation: str = "Relu", layers: int = 4, outlier: int = 1, factor: float = 40.0, gemm: bool = False):
    """``fc{k}`` (MatMul, or Gemm with a bias) → ``act{k}`` for each layer but the last.  Layer ``outlier``'s
    output channel 0 is ``factor`` times larger and the next layer's row 0 as much smaller: the float model
    computes the same function, its quantization does not."""
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((D, D)) / 4).astype(np.float32) for _ in range(layers)]
    ws[outlier][:, 0] *= factor
    ws[outlier + 1][0, :] /= factor
    nodes, weights, x = [], {}, "x"
    for k, w in enumerate(ws, start=1):
        out = "y" if k == layers else f"h{k}"
        if gemm:
            weights[f"w{k}"], weights[f"b{k}"] = w.T.copy(), (rng.standard_normal(D) / 8).astype(np.float32)
            nodes.append(helper.make_node("Gemm", [x, f"w{k}", f"b{k}"], [out], name=f"fc{k}", transB=1))
        else:
            weights[f"w{k}"] = w
            nodes.append(helper.make_node("MatMul", [x, f"w{k}"], [out], name=f"fc{k}"))
        if k < layers:
            extra_nodes, extra = _activation(activation, out, f"a{k}", f"act{k}")
            nodes += extra_nodes
            weights.update(extra)
            x = f"a{k}"
    return _model(nodes, weights, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, D])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, D])])


def _conv(nodes, weights, rng, name, x, out, c_in, c_out, kernel=3, group=1, scale=1.0):
    w = rng.standard_normal((c_out, c_in // group, kernel, kernel)) / np.sqrt(c_in // group * kernel * kernel)
    weights[f"{name}.weight"] = (w * scale).astype(np.float32)
    weights[f"{name}.bias"] = (rng.standard_normal(c_out) / 8).astype(np.float32)
    nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [out], name=name,
                                  pads=[kernel // 2] * 4, group=group))


def resnet_block(channels: int = 8, size: int = 8):
    """A ResNet basic block and a classifier: ``conv1`` → Relu → ``conv2`` → ``add`` (the block's input) →
    Relu → GlobalAveragePool → Flatten → ``fc`` (Gemm).  conv1's channel 0 is 30x larger, conv2's weights
    reading it 30x smaller."""
    rng = np.random.default_rng(3)
    nodes, weights = [], {}
    _conv(nodes, weights, rng, "stem", "x", "s", 3, channels)
    nodes.append(helper.make_node("Relu", ["s"], ["s_relu"], name="stem_relu"))
    _conv(nodes, weights, rng, "conv1", "s_relu", "c1", channels, channels)
    weights["conv1.weight"][0] *= 30
    weights["conv1.bias"][0] *= 30
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    _conv(nodes, weights, rng, "conv2", "r1", "c2", channels, channels)
    weights["conv2.weight"][:, 0] /= 30
    nodes += [helper.make_node("Add", ["c2", "s_relu"], ["sum"], name="add"),
              helper.make_node("Relu", ["sum"], ["r2"], name="relu2"),
              helper.make_node("GlobalAveragePool", ["r2"], ["pooled"], name="pool"),
              helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
              helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["y"], name="fc", transB=1)]
    weights["fc.weight"] = (rng.standard_normal((4, channels)) / 2).astype(np.float32)
    weights["fc.bias"] = np.zeros(4, np.float32)
    return _model(nodes, weights, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])


def mobilenet_block(channels: int = 8, expand: int = 4, size: int = 8):
    """A MobileNetV2 inverted residual: ``expand`` (1x1) → Relu6 → ``depthwise`` (3x3, one group per
    channel) → Relu6 → ``project`` (1x1) → ``add`` (the block's input) → ``head`` (1x1 Conv) → Sigmoid.
    The depthwise conv's channel 0 is 25x larger, project's weights reading it 25x smaller."""
    rng = np.random.default_rng(4)
    hidden = channels * expand
    nodes, weights = [], {}
    _conv(nodes, weights, rng, "stem", "x", "s", 3, channels)
    _conv(nodes, weights, rng, "expand", "s", "e", channels, hidden, kernel=1)
    extra_nodes, extra = _activation("Relu6", "e", "e6", "expand_relu6")
    nodes += extra_nodes
    weights.update(extra)
    _conv(nodes, weights, rng, "depthwise", "e6", "d", hidden, hidden, group=hidden)
    weights["depthwise.weight"][0] *= 25
    weights["depthwise.bias"][0] *= 25
    nodes.append(helper.make_node("Relu", ["d"], ["d_relu"], name="depthwise_relu"))
    _conv(nodes, weights, rng, "project", "d_relu", "p", hidden, channels, kernel=1)
    weights["project.weight"][:, 0] /= 25
    nodes.append(helper.make_node("Add", ["p", "s"], ["sum"], name="add"))
    _conv(nodes, weights, rng, "head", "sum", "h", channels, 4, kernel=1)
    nodes.append(helper.make_node("Sigmoid", ["h"], ["y"], name="sigmoid"))
    return _model(nodes, weights, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, size, size])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, size, size])])


def input_shape(model: onnx.ModelProto, fixed: dict | None = None) -> tuple[int, ...]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    fixed = fixed or {}
    return tuple(fixed.get(i, d.dim_value) for i, d in enumerate(dims))


def draw(shape, seed: int, uniform: bool = False) -> np.ndarray:
    """Seeded data for input ``x``: standard normal, or uniform in [-1, 1) (a normalized image)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, shape) if uniform else rng.standard_normal(shape)).astype(np.float32)


def calibration(shape, batches: int = 8, seed: int = 1, uniform: bool = False):
    """A seeded calibration reader of ``batches`` batches of :func:`draw` for input ``x``."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": draw(shape, seed * 1000 + k, uniform)} for k in range(batches)])

        def get_next(self):
            return next(self.batches, None)

    return Reader()


def quantize(float_path, out_path, shape, options: dict | None = None, exclude=(), batches: int = 8,
             uniform: bool = False):
    """``quantize_static`` as a user calls it (QDQ; ``options`` as in :data:`OPTIONS`; calibrated on
    :func:`calibration`), ``exclude`` as its ``nodes_to_exclude``; returns ``out_path``."""
    import logging

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    options = dict(options or {})
    for key in ("activation_type", "weight_type"):
        if isinstance(options.get(key), str):
            options[key] = getattr(QuantType, options[key])
    reader = calibration(shape, batches, uniform=uniform)
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice to pre-process, at every call
    quantize_static(str(float_path), str(out_path), reader, quant_format=QuantFormat.QDQ,
                    nodes_to_exclude=list(exclude), **options)
    return out_path

