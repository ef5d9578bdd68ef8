"""Generate the TensorFlow test models of ``tests/models/test_tflite.py`` (needs TensorFlow; CI does not).

The models are shipped next to this script, so the tests need neither TensorFlow nor tf2onnx.
Run it only to change the models, in a virtual environment of its own (installing TensorFlow
into tvm_probe's environment would change its numpy and protobuf):

    python -m venv /tmp/tfvenv
    /tmp/tfvenv/bin/pip install "tensorflow-cpu==2.18.*" tf2onnx
    /tmp/tfvenv/bin/python tests/support/tflite_models/make_models.py

TF 2.18 on purpose: TF >= 2.19 writes exact GELU with ``Erfc``, which tf2onnx 1.17 cannot
convert (see docs/tensorflow.md).  Run with TF >= 2.19 (``tensorflow-cpu==2.21.*``), the script
writes only ``gelu_erfc.tflite`` and ``gelu_erfc.onnx``: that trap, reproduced.

For each model ``NAME`` it writes:

* ``NAME.tflite``: the TFLite converter's float32 model (tensors keep TF's op names, some
  merged by the converter as ``a;b``);
* ``NAME.onnx``: tf2onnx's conversion of the same function (opset 17), for comparing with
  onnxruntime when no TFLite interpreter is installed;
* ``NAME_tf.npz``: the model inputs (``input:<name>``) and what TensorFlow itself computes for
  every op output of the frozen graph (``<op name>:<k>``), a reference keyed by TF names.

The models are built from raw TF ops under name scopes, so their op names are those of
``TFBertForSequenceClassification`` (``.../layer_._0/attention/self/MatMul``) without
depending on transformers.  Weights are random with a fixed seed; the classifier bias is zero
on purpose (tf2onnx drops a BiasAdd of zeros, so its TF name vanishes from the ONNX model).
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

HERE = Path(__file__).parent
SEQ, HIDDEN, HEADS, FFN, VOCAB, LAYERS, LABELS = 8, 32, 2, 64, 50, 2, 3
BERT_SCOPE = "tf_bert_for_sequence_classification/bert"


class _Weights:
    """Random weights from one seeded generator, as TF constants (frozen into the model)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def __call__(self, *shape, scale: float = 0.2, name: str = "kernel") -> tf.Tensor:
        return tf.constant(self.rng.normal(0.0, scale, shape).astype(np.float32), name=name)

    def zeros(self, *shape, name: str = "bias") -> tf.Tensor:
        return tf.constant(np.zeros(shape, np.float32), name=name)


def _dense(x, w: _Weights, n_in: int, n_out: int, scope: str, zero_bias: bool = False):
    """x @ kernel + bias, named as Keras' Dense names its ops (``MatMul``, ``BiasAdd``)."""
    with tf.name_scope(scope):
        kernel = w(n_in, n_out)
        bias = w.zeros(n_out) if zero_bias else w(n_out, scale=0.1, name="bias")
        flat = tf.reshape(x, [-1, n_in], name="Reshape") if len(x.shape) > 2 else x
        y = tf.nn.bias_add(tf.matmul(flat, kernel, name="MatMul"), bias, name="BiasAdd")
        return tf.reshape(y, [*x.shape[:-1], n_out], name="Reshape_1") if len(x.shape) > 2 else y


def _layer_norm(x, w: _Weights, scope: str):
    """Keras 2's LayerNormalization: tf.nn.moments then batch_normalization's arithmetic."""
    with tf.name_scope(scope):
        gamma = tf.constant(1.0 + w.rng.normal(0, 0.1, x.shape[-1]).astype(np.float32), name="gamma")
        beta = w(x.shape[-1], scale=0.1, name="beta")
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True, name="moments")
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-12, name="batchnorm")


def _attention(x, mask_bias, w: _Weights, scope: str):
    head = HIDDEN // HEADS
    with tf.name_scope(scope):
        with tf.name_scope("self"):
            def heads(name):
                y = _dense(x, w, HIDDEN, HIDDEN, name)
                return tf.transpose(tf.reshape(y, [1, SEQ, HEADS, head]), [0, 2, 1, 3])

            q, k, v = heads("query"), heads("key"), heads("value")
            scores = tf.matmul(q, k, transpose_b=True, name="MatMul")
            scores = tf.math.truediv(scores, math.sqrt(head), name="truediv")
            scores = tf.add(scores, mask_bias, name="Add")
            probs = tf.nn.softmax(scores, axis=-1, name="Softmax")
            context = tf.matmul(probs, v, name="MatMul_1")
            context = tf.reshape(tf.transpose(context, [0, 2, 1, 3], name="transpose_3"), [1, SEQ, HIDDEN],
                                 name="Reshape_3")
        with tf.name_scope("output"):
            y = _dense(context, w, HIDDEN, HIDDEN, "dense")
            return _layer_norm(tf.add(y, x, name="add"), w, "LayerNorm")


def _layer(x, mask_bias, w: _Weights, index: int):
    with tf.name_scope(f"layer_._{index}"):
        x = _attention(x, mask_bias, w, "attention")
        with tf.name_scope("intermediate"):
            h = tf.nn.gelu(_dense(x, w, HIDDEN, FFN, "dense"), approximate=False, name="Gelu")
        with tf.name_scope("output"):
            y = _dense(h, w, FFN, HIDDEN, "dense")
            return _layer_norm(tf.add(y, x, name="add"), w, "LayerNorm")


def bert_function():
    """A two-layer BERT-like encoder with a classifier, op names as in TFBertForSequenceClassification."""
    @tf.function(input_signature=[tf.TensorSpec([1, SEQ], tf.int32, name="input_ids"),
                                  tf.TensorSpec([1, SEQ], tf.int32, name="attention_mask")])
    def bert(input_ids, attention_mask):
        # weights are made while tracing, so they are constants of the graph (not captures,
        # which tf2onnx would turn into graph inputs)
        w = _Weights(0)
        with tf.name_scope(BERT_SCOPE):
            with tf.name_scope("embeddings"):
                word = w(VOCAB, HIDDEN, scale=0.5, name="weight")
                position = w(SEQ, HIDDEN, scale=0.1, name="position_embeddings")
                x = tf.gather(word, input_ids, name="Gather")
                x = tf.add(x, position, name="add")
                x = _layer_norm(x, w, "LayerNorm")
            mask = tf.cast(tf.reshape(attention_mask, [1, 1, 1, SEQ]), tf.float32, name="Cast")
            mask_bias = tf.multiply(tf.subtract(1.0, mask, name="Sub"), -10000.0, name="Mul")
            with tf.name_scope("encoder"):
                for i in range(LAYERS):
                    x = _layer(x, mask_bias, w, i)
            with tf.name_scope("pooler"):
                first = tf.reshape(x[:, 0], [1, HIDDEN], name="Reshape")
                pooled = tf.tanh(_dense(first, w, HIDDEN, HIDDEN, "dense"), name="Tanh")
        with tf.name_scope("tf_bert_for_sequence_classification/classifier"):
            return _dense(pooled, w, HIDDEN, LABELS, "dense", zero_bias=True)

    return bert


def bert_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, (1, SEQ)).astype(np.int32)
    mask = np.ones((1, SEQ), np.int32)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def cnn_function():
    """A small image classifier: conv, depthwise conv, pools, concat, dense, softmax."""
    @tf.function(input_signature=[tf.TensorSpec([1, 16, 16, 3], tf.float32, name="image")])
    def cnn(image):
        w = _Weights(2)
        with tf.name_scope("cnn"):
            with tf.name_scope("conv1"):
                x = tf.nn.conv2d(image, w(3, 3, 3, 8), 1, "SAME", name="Conv2D")
                x = tf.nn.relu(tf.nn.bias_add(x, w(8, scale=0.1, name="bias"), name="BiasAdd"), name="Relu")
            with tf.name_scope("pool1"):
                x = tf.nn.max_pool2d(x, 2, 2, "VALID", name="MaxPool")
            with tf.name_scope("dw"):
                d = tf.nn.depthwise_conv2d(x, w(3, 3, 8, 1), [1, 1, 1, 1], "SAME", name="depthwise")
                d = tf.nn.relu6(tf.nn.bias_add(d, w(8, scale=0.1, name="bias"), name="BiasAdd"), name="Relu6")
            with tf.name_scope("bn"):
                s = tf.add(tf.multiply(x, w(8, scale=0.1, name="scale") + 1.0, name="mul"),
                           w(8, scale=0.1, name="offset"), name="add")
            x = tf.concat([d, s], axis=-1, name="concat")
            with tf.name_scope("conv2"):
                x = tf.nn.conv2d(x, w(3, 3, 16, 16), 2, "SAME", name="Conv2D")
                x = tf.nn.relu(tf.nn.bias_add(x, w(16, scale=0.1, name="bias"), name="BiasAdd"), name="Relu")
            with tf.name_scope("pool2"):
                x = tf.nn.avg_pool2d(x, 2, 2, "VALID", name="AvgPool")
            with tf.name_scope("head"):
                x = tf.reduce_mean(x, axis=[1, 2], name="Mean")
                logits = _dense(x, w, 16, 10, "dense")
                return tf.nn.softmax(logits, name="Softmax")

    return cnn


def cnn_inputs() -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(3).normal(0, 1, (1, 16, 16, 3)).astype(np.float32)}


def write_tflite(function, path: Path) -> None:
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    path.write_bytes(converter.convert())


def write_onnx(function, path: Path) -> None:
    import tf2onnx

    tf2onnx.convert.from_function(function, input_signature=function.input_signature, opset=17,
                                  output_path=str(path))


def tf_values(function, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every op output of the frozen graph, as TensorFlow computes it, keyed ``<op name>:<k>``."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    frozen = convert_variables_to_constants_v2(function.get_concrete_function())
    graph_def = frozen.graph.as_graph_def()
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    feeds, fetches = {}, {}
    for op in graph.get_operations():
        if op.type == "Placeholder":
            feeds[op.outputs[0]] = inputs[op.name]
        elif op.type not in ("Const", "NoOp", "Identity"):
            fetches.update({t.name: t for t in op.outputs if t.dtype.is_numpy_compatible})
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run(fetches, feeds)
    return {name: np.asarray(v) for name, v in values.items()}


def gelu_function():
    """Exact GELU alone: TF >= 2.19 writes it with Erfc, which tf2onnx 1.17 cannot convert."""
    @tf.function(input_signature=[tf.TensorSpec([2, 4], tf.float32, name="x")])
    def gelu(x):
        with tf.name_scope("model"):
            return tf.nn.gelu(x, approximate=False, name="Gelu")

    return gelu


def _tf_version() -> tuple[int, int]:
    major, minor = tf.__version__.split(".")[:2]
    return int(major), int(minor)


def main() -> int:
    """With TF <= 2.18, the test models; with TF >= 2.19, the Erfc trap (tf2onnx writes an
    invalid ONNX model, the TFLite converter a GELU op)."""
    print(f"TensorFlow {tf.__version__}", file=sys.stderr)
    if _tf_version() >= (2, 19):
        function = gelu_function()
        write_tflite(function, HERE / "gelu_erfc.tflite")
        write_onnx(function, HERE / "gelu_erfc.onnx")
        print("wrote gelu_erfc.tflite, gelu_erfc.onnx", file=sys.stderr)
        return 0
    for name, make, inputs in (("bert", bert_function, bert_inputs()), ("cnn", cnn_function, cnn_inputs())):
        function = make()
        write_tflite(function, HERE / f"{name}.tflite")
        write_onnx(function, HERE / f"{name}.onnx")
        arrays = {f"input:{k}": v for k, v in inputs.items()}
        arrays.update(tf_values(function, inputs))
        np.savez_compressed(HERE / f"{name}_tf.npz", **arrays)
        print(f"wrote {name}.tflite, {name}.onnx, {name}_tf.npz ({len(arrays)} arrays)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
