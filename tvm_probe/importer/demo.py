"""Built-in demo model: a BERT-for-sequence-classification graph in ONNX.

The graph is assembled with :mod:`onnx.helper` and mimics what ``tf2onnx``
produces for the Hugging Face ``TFBertForSequenceClassification`` model:

* node names are TensorFlow scopes, e.g.
  ``tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self/MatMul``,
  and every node has a unique, non-empty name;
* a node's output tensor is its name plus ``":0"`` (as in TensorFlow), the
  final output is ``logits``; weights are initializers named like
  ``.../attention/self/query/kernel:0``;
* LayerNorm is written out (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div,
  Mul, Add) and GELU is the exact Erf form (Div, Erf, Add, Mul, Mul);
* the extended attention mask (Reshape, Cast, Sub, Mul) is computed once
  before layer 0 and added to the attention scores of every layer.

The model uses opset 17 (standard domain only), static shapes, and seeded
random float32 weights, so it is reproducible and needs no downloads.

``bert_base()`` keeps the real vocabulary size (30522, about 440 MB of
weights); pass ``vocab=8192`` or smaller to get a lighter model.

Example::

    from tvm_probe import demo
    model = demo.tiny_bert()
    inputs = demo.demo_inputs(model)   # {"input_ids": ..., "attention_mask": ...}
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .adapter import ModelAdapter, SourceGraph, static_shapes
from .model import ImportedModel
from .onnx import import_onnx

__all__ = ["PRESETS", "SIZES", "bert_base", "build", "demo_inputs", "tiny_bert"]

OPSET = 17
ROOT = "tf_bert_for_sequence_classification"
BERT = f"{ROOT}/bert"
_META_PREFIX = "tvm_probe.demo."

PRESETS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden=64, heads=4, intermediate=256, seq_len=16,
                 vocab=128, num_labels=2),
    "bert-base": dict(num_layers=12, hidden=768, heads=12, intermediate=3072,
                      seq_len=128, vocab=30522, num_labels=2),
}


class _GraphBuilder:
    """Collects nodes and initializers; names outputs ``<node name>:0``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()

    # -- primitives -------------------------------------------------------
    def node(self, op: str, inputs: list[str], name: str, output: str | None = None,
             **attrs) -> str:
        """Append one node named ``name``; return its output tensor name."""
        if not name or name in self._names:
            raise ValueError(f"node name must be unique and non-empty: {name!r}")
        self._names.add(name)
        out = output or f"{name}:0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def init(self, name: str, array: np.ndarray) -> str:
        """Add an initializer and return its name."""
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def scalar(self, name: str, value: float) -> str:
        """Add a float32 scalar initializer."""
        return self.init(name, np.array(value, dtype=np.float32))

    def shape(self, name: str, dims) -> str:
        """Add an int64 shape initializer (for Reshape)."""
        return self.init(name, np.array(dims, dtype=np.int64))

    def normal(self, name: str, shape, mean: float = 0.0, std: float = 0.02) -> str:
        """Add a seeded ``mean + std * N(0, 1)`` float32 initializer."""
        w = self.rng.standard_normal(shape, dtype=np.float32)
        w *= np.float32(std)
        w += np.float32(mean)
        return self.init(name, w)

    # -- layers -----------------------------------------------------------
    def matmul(self, x: str, scope: str, d_in: int, d_out: int) -> str:
        """``x @ kernel`` with the kernel at ``<scope>/kernel:0``."""
        w = self.normal(f"{scope}/kernel:0", (d_in, d_out))
        return self.node("MatMul", [x, w], f"{scope}/MatMul")

    def dense(self, x: str, scope: str, d_in: int, d_out: int) -> str:
        """Keras Dense: ``MatMul`` then ``BiasAdd`` (an ONNX Add)."""
        y = self.matmul(x, scope, d_in, d_out)
        b = self.normal(f"{scope}/bias:0", (d_out,))
        return self.node("Add", [y, b], f"{scope}/BiasAdd")

    def layer_norm(self, x: str, scope: str, hidden: int, eps: float = 1e-12) -> str:
        """LayerNorm over the last axis, written out op by op."""
        s = f"{scope}/LayerNorm"
        gamma = self.normal(f"{s}/gamma:0", (hidden,), mean=1.0)
        beta = self.normal(f"{s}/beta:0", (hidden,))
        mean = self.node("ReduceMean", [x], f"{s}/moments/mean", axes=[-1], keepdims=1)
        cent = self.node("Sub", [x, mean], f"{s}/moments/sub")
        sq = self.node("Pow", [cent, self.scalar(f"{s}/moments/pow/y:0", 2.0)],
                       f"{s}/moments/pow")
        var = self.node("ReduceMean", [sq], f"{s}/moments/variance", axes=[-1], keepdims=1)
        var = self.node("Add", [var, self.scalar(f"{s}/batchnorm/add/y:0", eps)],
                        f"{s}/batchnorm/add")
        std = self.node("Sqrt", [var], f"{s}/batchnorm/Sqrt")
        norm = self.node("Div", [cent, std], f"{s}/batchnorm/truediv")
        y = self.node("Mul", [norm, gamma], f"{s}/batchnorm/mul")
        return self.node("Add", [y, beta], f"{s}/batchnorm/add_1")

    def gelu(self, x: str, scope: str) -> str:
        """Exact GELU: ``x * 0.5 * (1 + erf(x / sqrt(2)))``."""
        s = f"{scope}/Gelu"
        t = self.node("Div", [x, self.scalar(f"{s}/truediv/y:0", np.sqrt(2.0))],
                      f"{s}/truediv")
        t = self.node("Erf", [t], f"{s}/Erf")
        t = self.node("Add", [t, self.scalar(f"{s}/add/x:0", 1.0)], f"{s}/add")
        t = self.node("Mul", [x, t], f"{s}/mul")
        return self.node("Mul", [t, self.scalar(f"{s}/mul_1/y:0", 0.5)], f"{s}/mul_1")


def _embeddings(g: _GraphBuilder, cfg: dict) -> str:
    """Word + position + token-type embeddings, then LayerNorm."""
    s = f"{BERT}/embeddings"
    b, n, h = cfg["batch"], cfg["seq_len"], cfg["hidden"]
    word_table = g.normal(f"{s}/word_embeddings/weight:0", (cfg["vocab"], h))
    pos_table = g.normal(f"{s}/position_embeddings/embeddings:0", (max(n, 512), h))
    type_table = g.normal(f"{s}/token_type_embeddings/embeddings:0", (2, h))
    pos_ids = g.node("Constant", [], f"{s}/range", value=numpy_helper.from_array(
        np.arange(n, dtype=np.int64)[None, :]))
    type_ids = g.node("Constant", [], f"{s}/Fill", value=numpy_helper.from_array(
        np.zeros((b, n), dtype=np.int64)))
    word = g.node("Gather", [word_table, "input_ids"], f"{s}/Gather", axis=0)
    pos = g.node("Gather", [pos_table, pos_ids], f"{s}/Gather_1", axis=0)
    typ = g.node("Gather", [type_table, type_ids], f"{s}/Gather_2", axis=0)
    x = g.node("Add", [word, pos], f"{s}/add")
    x = g.node("Add", [x, typ], f"{s}/add_1")
    return g.layer_norm(x, s, h)


def _extended_mask(g: _GraphBuilder, cfg: dict) -> str:
    """``(1 - mask) * -10000`` shaped [batch, 1, 1, seq]; computed once."""
    b, n = cfg["batch"], cfg["seq_len"]
    m = g.node("Reshape", ["attention_mask", g.shape(f"{BERT}/Reshape/shape:0", [b, 1, 1, n])],
               f"{BERT}/Reshape")
    m = g.node("Cast", [m], f"{BERT}/Cast", to=TensorProto.FLOAT)
    m = g.node("Sub", [g.scalar(f"{BERT}/Sub/x:0", 1.0), m], f"{BERT}/Sub")
    return g.node("Mul", [m, g.scalar(f"{BERT}/Mul/y:0", -10000.0)], f"{BERT}/Mul")


def _self_attention(g: _GraphBuilder, x: str, mask: str, scope: str, cfg: dict) -> str:
    """Multi-head self-attention; returns the context [batch, seq, hidden]."""
    s = f"{scope}/attention/self"
    b, n, h, nh = cfg["batch"], cfg["seq_len"], cfg["hidden"], cfg["heads"]
    dh = h // nh
    split = g.shape(f"{s}/Reshape/shape:0", [b, n, nh, dh])
    q = g.dense(x, f"{s}/query", h, h)
    k = g.dense(x, f"{s}/key", h, h)
    v = g.dense(x, f"{s}/value", h, h)
    q = g.node("Reshape", [q, split], f"{s}/Reshape")
    q = g.node("Transpose", [q], f"{s}/transpose", perm=[0, 2, 1, 3])
    k = g.node("Reshape", [k, split], f"{s}/Reshape_1")
    k = g.node("Transpose", [k], f"{s}/transpose_1", perm=[0, 2, 3, 1])  # K^T
    v = g.node("Reshape", [v, split], f"{s}/Reshape_2")
    v = g.node("Transpose", [v], f"{s}/transpose_2", perm=[0, 2, 1, 3])
    scores = g.node("MatMul", [q, k], f"{s}/MatMul")
    scores = g.node("Div", [scores, g.scalar(f"{s}/truediv/y:0", np.sqrt(dh))],
                    f"{s}/truediv")
    scores = g.node("Add", [scores, mask], f"{s}/add")
    probs = g.node("Softmax", [scores], f"{s}/Softmax", axis=-1)
    ctx = g.node("MatMul", [probs, v], f"{s}/MatMul_1")
    ctx = g.node("Transpose", [ctx], f"{s}/transpose_3", perm=[0, 2, 1, 3])
    return g.node("Reshape", [ctx, g.shape(f"{s}/Reshape_3/shape:0", [b, n, h])],
                  f"{s}/Reshape_3")


def _encoder_layer(g: _GraphBuilder, x: str, mask: str, i: int, cfg: dict) -> str:
    """One transformer block (post-LayerNorm, as in BERT)."""
    scope = f"{BERT}/encoder/layer_._{i}"
    h, ff = cfg["hidden"], cfg["intermediate"]
    ctx = _self_attention(g, x, mask, scope, cfg)
    a = f"{scope}/attention/output"
    y = g.dense(ctx, f"{a}/dense", h, h)
    y = g.node("Add", [y, x], f"{a}/add")
    x = g.layer_norm(y, a, h)
    y = g.dense(x, f"{scope}/intermediate/dense", h, ff)
    y = g.gelu(y, f"{scope}/intermediate")
    o = f"{scope}/output"
    y = g.dense(y, f"{o}/dense", ff, h)
    y = g.node("Add", [y, x], f"{o}/add")
    return g.layer_norm(y, o, h)


def _head(g: _GraphBuilder, x: str, cfg: dict) -> str:
    """Pooler (token 0, dense, tanh) and classifier; output ``logits``."""
    s = f"{BERT}/pooler"
    h = cfg["hidden"]
    cls_index = g.init(f"{s}/strided_slice/index:0", np.array(0, dtype=np.int64))
    y = g.node("Gather", [x, cls_index], f"{s}/strided_slice", axis=1)
    y = g.dense(y, f"{s}/dense", h, h)
    y = g.node("Tanh", [y], f"{s}/dense/Tanh")
    c = f"{ROOT}/classifier"
    y = g.matmul(y, c, h, cfg["num_labels"])
    b = g.normal(f"{c}/bias:0", (cfg["num_labels"],))
    return g.node("Add", [y, b], f"{c}/BiasAdd", output="logits")


def tiny_bert(num_layers=2, hidden=64, heads=4, intermediate=None, seq_len=16,
              vocab=128, num_labels=2, batch=1, seed=0) -> onnx.ModelProto:
    """Build a BERT-for-sequence-classification ONNX model.

    Inputs are ``input_ids`` and ``attention_mask`` (int64, [batch, seq_len]);
    the output is ``logits`` (float32, [batch, num_labels]).
    ``intermediate`` defaults to ``4 * hidden``; ``hidden`` must be divisible
    by ``heads``. Weights are drawn from ``numpy.random.default_rng(seed)``.
    """
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    cfg = dict(num_layers=num_layers, hidden=hidden, heads=heads,
               intermediate=intermediate or 4 * hidden, seq_len=seq_len, vocab=vocab,
               num_labels=num_labels, batch=batch, seed=seed)
    g = _GraphBuilder(seed)
    x = _embeddings(g, cfg)
    mask = _extended_mask(g, cfg)
    for i in range(num_layers):
        x = _encoder_layer(g, x, mask, i, cfg)
    _head(g, x, cfg)
    graph = helper.make_graph(
        g.nodes, ROOT,
        inputs=[helper.make_tensor_value_info(n, TensorProto.INT64, [batch, seq_len])
                for n in ("input_ids", "attention_mask")],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                               [batch, num_labels])],
        initializer=g.initializers)
    model = helper.make_model(graph, producer_name="tvm_probe.demo",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    helper.set_model_props(model, {_META_PREFIX + k: str(v) for k, v in cfg.items()})
    return model


#: The size arguments of :func:`tiny_bert` (what a config's ``model.demo`` may set).
SIZES: tuple[str, ...] = tuple(inspect.signature(tiny_bert).parameters)


def bert_base(**overrides) -> onnx.ModelProto:
    """BERT-base sized model (12 layers, hidden 768, 12 heads, seq 128).

    Uses the real vocabulary size 30522 (~440 MB of float32 weights); pass
    e.g. ``vocab=8192`` to shrink it. Any ``tiny_bert`` argument may be
    overridden.
    """
    return tiny_bert(**{**PRESETS["bert-base"], **overrides})


def build(preset_or_kwargs="tiny") -> onnx.ModelProto:
    """Build a model from a preset name (see ``PRESETS``) or a kwargs dict."""
    if isinstance(preset_or_kwargs, str):
        if preset_or_kwargs not in PRESETS:
            raise ValueError(f"unknown preset {preset_or_kwargs!r}; "
                             f"choose from {sorted(PRESETS)}")
        return tiny_bert(**PRESETS[preset_or_kwargs])
    return tiny_bert(**dict(preset_or_kwargs))


def _vocab_size(model: onnx.ModelProto) -> int:
    """Vocabulary size from the model metadata or the word-embedding table."""
    for prop in model.metadata_props:
        if prop.key == _META_PREFIX + "vocab":
            return int(prop.value)
    for init in model.graph.initializer:
        if init.name.endswith("word_embeddings/weight:0"):
            return int(init.dims[0])
    raise ValueError("cannot determine the vocabulary size of this model")


def demo_inputs(model: onnx.ModelProto, seed=0) -> dict[str, np.ndarray]:
    """Seeded inputs for a model from this module.

    ``input_ids`` are int64 in ``[0, vocab)``; ``attention_mask`` is int64
    with leading 1s and trailing 0s (padding) in each row (when seq_len > 1).
    Padded positions get token id 0.
    """
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input}
    batch, seq_len = shapes["input_ids"]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max(1, seq_len // 2), max(2, seq_len), size=batch)
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int64)
    vocab = _vocab_size(model)
    ids = rng.integers(min(1, vocab - 1), vocab, size=(batch, seq_len), dtype=np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}


class DemoAdapter(ModelAdapter):
    """The built-in demo: an ONNX BERT built in code from a preset and sizes (``model: {demo: {...}}``)."""

    kind, described, reference, config, graph = "demo", "an ONNX model", "onnxruntime", "sizes", "onnx"

    def load(self, source, shapes=None) -> onnx.ModelProto:
        sizes = dict(source or {})
        merged = {**PRESETS[sizes.pop("preset", "tiny")], **sizes}
        if "hidden" in sizes and "intermediate" not in sizes:
            merged["intermediate"] = None  # follow the new hidden size (4x), not the preset's
        return build(merged)

    def record(self, source, shapes=None) -> dict:
        return {self.kind: dict(source or {})}

    def from_record(self, record):
        return dict(record[self.kind] or {}), {}

    def source_graph(self, source, shapes=None) -> SourceGraph:
        return SourceGraph("onnx", self.load(source))

    def owns(self, model) -> bool:
        return isinstance(model, onnx.ModelProto) and any(p.key.startswith(_META_PREFIX) for p in model.metadata_props)

    def import_model(self, model, shapes=None, import_fixes: bool = True, sizes=None) -> ImportedModel:
        return import_onnx(model, static_shapes(shapes), import_fixes=import_fixes, sizes=sizes)

    def default_inputs(self, model, inputs):
        return demo_inputs(model)
