"""Small ONNX models built with ``onnx.helper`` for the test-suite.

``small_cnn`` imitates an old (PyTorch 1.x era) exporter on purpose:

* every node has an EMPTY name, so tools must fall back to tensor names
  (``conv1_out``, ``bn1_out``, ``relu1_out``, ...);
* every weight is BOTH a graph input (with its type and shape) and an
  initializer of the same name. The only "real" input is ``image``.

This module is a helper, not a test file.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 13


class _CnnBuilder:
    """Collects unnamed nodes and weights (stored as initializer + input)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        """Register a float32 weight; returns its name."""
        self.weights.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attrs) -> str:
        """Append a node with an empty name; returns ``output``."""
        self.nodes.append(helper.make_node(op, inputs, [output], name="", **attrs))
        return output

    def conv(self, x: str, name: str, c_in: int, c_out: int) -> str:
        """3x3 convolution, stride 1, padding 1, with bias."""
        fan_in = c_in * 9
        w = self.weight(f"{name}.weight",
                        self.rng.standard_normal((c_out, c_in, 3, 3)) / np.sqrt(fan_in))
        b = self.weight(f"{name}.bias", 0.1 * self.rng.standard_normal(c_out))
        return self.node("Conv", [x, w, b], f"{name}_out", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[1, 1])

    def batch_norm(self, x: str, name: str, channels: int) -> str:
        """Inference BatchNormalization with non-trivial seeded statistics."""
        r = self.rng
        params = [self.weight(f"{name}.weight", r.uniform(0.5, 1.5, channels)),
                  self.weight(f"{name}.bias", 0.1 * r.standard_normal(channels)),
                  self.weight(f"{name}.running_mean", 0.1 * r.standard_normal(channels)),
                  self.weight(f"{name}.running_var", r.uniform(0.5, 2.0, channels))]
        return self.node("BatchNormalization", [x, *params], f"{name}_out", epsilon=1e-5)


def small_cnn(seed=0, batch=1, channels=8, image=16, num_classes=10) -> onnx.ModelProto:
    """Conv-BN-ReLU stem, one residual block, pooling and a Gemm classifier.

    Input ``image`` float32 [batch, 3, image, image]; output ``logits``
    float32 [batch, num_classes]. All node names are empty and all weights
    are listed in ``graph.input`` as well as in ``graph.initializer``.
    """
    g = _CnnBuilder(seed)
    c = channels
    x = g.node("Relu", [g.batch_norm(g.conv("image", "conv1", 3, c), "bn1", c)], "relu1_out")
    y = g.node("Relu", [g.batch_norm(g.conv(x, "conv2", c, c), "bn2", c)], "relu2_out")
    y = g.batch_norm(g.conv(y, "conv3", c, c), "bn3", c)
    y = g.node("Relu", [g.node("Add", [y, x], "add_out")], "relu3_out")
    y = g.node("MaxPool", [y], "maxpool_out", kernel_shape=[2, 2], strides=[2, 2])
    y = g.node("GlobalAveragePool", [y], "gap_out")
    y = g.node("Flatten", [y], "flatten_out", axis=1)
    w = g.weight("fc.weight", g.rng.standard_normal((num_classes, c)) / np.sqrt(c))
    b = g.weight("fc.bias", 0.1 * g.rng.standard_normal(num_classes))
    g.node("Gemm", [y, w, b], "logits", transB=1)

    inputs = [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                            [batch, 3, image, image])]
    inputs += [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims))
               for t in g.weights]
    graph = helper.make_graph(
        g.nodes, "small_cnn", inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, num_classes])],
        initializer=g.weights)
    model = helper.make_model(graph, producer_name="tests.models",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 7
    return model


def cnn_inputs(model, seed=0) -> dict[str, np.ndarray]:
    """Seeded float32 values for the model's real (non-initializer) inputs."""
    weights = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        if inp.name in weights:
            continue
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        out[inp.name] = rng.standard_normal(shape, dtype=np.float32)
    return out


def folding_model(seed=0):
    """A tiny graph whose values exercise every way of serving a value.

    ``Wt`` is folded at import, ``Wr = Relu(Wt)`` only by the fused pipeline's FoldConstant,
    ``xi = Identity(x)`` aliases the input, and ``unused`` is dead code that the fused
    pipeline removes.  Returns ``(model, inputs)``.
    """
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(size=(8, 16)).astype(np.float32), "W")
    nodes = [
        helper.make_node("Transpose", ["W"], ["Wt"], name="wt", perm=[1, 0]),
        helper.make_node("Relu", ["Wt"], ["Wr"], name="wr"),
        helper.make_node("MatMul", ["x", "Wr"], ["y"], name="mm"),
        helper.make_node("Identity", ["x"], ["xi"], name="ident"),
        helper.make_node("MatMul", ["xi", "Wr"], ["xi2"], name="mm2"),
        helper.make_node("Relu", ["x"], ["unused"], name="dead"),
        helper.make_node("Add", ["y", "xi2"], ["z"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "folding", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.normal(size=(2, 16)).astype(np.float32)}


def split_model(seed=0):
    """``Split`` (one node, two outputs) → Relu → Mul: names ``blk/split:0`` / ``blk/split:1``.

    Returns ``(model, inputs)``.
    """
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], name="blk/split", axis=1),
        helper.make_node("Relu", ["a"], ["ra"], name="blk/relu"),
        helper.make_node("Mul", ["ra", "b"], ["y"], name="blk/mul"),
    ]
    sizes = numpy_helper.from_array(np.array([4, 4], dtype=np.int64), "sizes")
    graph = helper.make_graph(
        nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.normal(size=(2, 8)).astype(np.float32)}


def chained_matmuls(layers=6, n=512, seed=0):
    """``layers`` chained MatMuls of ``n × n`` (untuned kernels: tens of ms each), a run long
    enough to interrupt or kill a server in the middle.  Returns ``(model, inputs)``."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32) / n, f"w{i}")
             for i in range(layers)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}"], name=f"mm{i}")
             for i in range(layers)]
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info(f"h{layers - 1}", TensorProto.FLOAT, [n, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((n, n)).astype(np.float32)}
