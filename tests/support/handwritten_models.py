"""Models written the way people write them by hand, not the way our other test models are.

``codertimo_bert`` follows the structure of the widely copied BERT of codertimo/BERT-pytorch
(written here from its design, with seeded random weights): a LayerNorm that computes
``a_2 * (x - mean) / (std + eps) + b_2`` — ``x.std()`` computes the same mean again —, a tanh
GELU with ``torch.pow``, a boolean padding mask built once and compared with 0 in every block,
blocks called through ``.forward`` directly, and a Q/K/V projection through a list comprehension.
These gave the first kernel map several pre-fusion calls on identical arguments, which it
mapped wrongly.

``merged_qkv_bert`` is an ONNX BERT layer whose Q/K/V projections are one Gemm followed by
Split(3), what onnxsim and several exporters produce.

This module is a helper, not a test file.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class Attention(nn.Module):
    def __init__(self, mask_style: str):
        super().__init__()
        self.mask_style = mask_style

    def forward(self, query, key, value, mask):
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))
        hidden = (mask == 0) if self.mask_style == "eq0" else torch.logical_not(mask)
        scores = scores.masked_fill(hidden, -1e9)
        p_attn = torch.softmax(scores, dim=-1)
        return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int, mask_style: str):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linear_layers = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.output_linear = nn.Linear(d_model, d_model)
        self.attention = Attention(mask_style)
        self.dropout = nn.Dropout(0.1)

    def forward(self, query, key, value, mask):
        batch = query.size(0)
        query, key, value = [layer(x).view(batch, -1, self.h, self.d_k).transpose(1, 2)
                             for layer, x in zip(self.linear_layers, (query, key, value))]
        x, _ = self.attention(query, key, value, mask=mask)
        x = x.transpose(1, 2).contiguous().view(batch, -1, self.h * self.d_k)
        return self.output_linear(x)


class SublayerConnection(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout, self.activation = nn.Dropout(0.1), GELU()

    def forward(self, x):
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class TransformerBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mask_style: str):
        super().__init__()
        self.attention = MultiHeadedAttention(heads, hidden, mask_style)
        self.feed_forward = PositionwiseFeedForward(hidden, 4 * hidden)
        self.input_sublayer = SublayerConnection(hidden)
        self.output_sublayer = SublayerConnection(hidden)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x, mask):
        x = self.input_sublayer(x, lambda _x: self.attention.forward(_x, _x, _x, mask=mask))
        x = self.output_sublayer(x, self.feed_forward)
        return self.dropout(x)


class PositionalEmbedding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).float().unsqueeze(1)
        div_term = (torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model)).exp()
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.pe[:, :x.size(1)]


class BERTEmbedding(nn.Module):
    def __init__(self, vocab_size: int, embed_size: int):
        super().__init__()
        self.token = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.position = PositionalEmbedding(embed_size)
        self.segment = nn.Embedding(3, embed_size, padding_idx=0)
        self.dropout = nn.Dropout(0.1)

    def forward(self, sequence, segment_label):
        x = self.token(sequence) + self.position(sequence) + self.segment(segment_label)
        return self.dropout(x)


class BERT(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, n_layers: int, attn_heads: int, mask_style: str):
        super().__init__()
        self.embedding = BERTEmbedding(vocab_size, hidden)
        self.transformer_blocks = nn.ModuleList(
            [TransformerBlock(hidden, attn_heads, mask_style) for _ in range(n_layers)])

    def forward(self, x, segment_info):
        mask = (x > 0).unsqueeze(1).repeat(1, x.size(1), 1).unsqueeze(1)
        x = self.embedding(x, segment_info)
        for transformer in self.transformer_blocks:
            x = transformer.forward(x, mask)
        return x


def codertimo_bert(layers=2, hidden=32, heads=4, vocab=15, batch=2, seq=8, mask_style="logical_not", seed=0):
    """The hand-written BERT in eval mode and padded example inputs ``(tokens, segments)``.

    ``mask_style="eq0"`` is upstream's ``mask == 0`` on a boolean mask (TVM 0.27 cannot build
    it without an import fix); ``"logical_not"`` is the equivalent that builds.
    """
    torch.manual_seed(seed)
    model = BERT(vocab, hidden, layers, heads, mask_style).eval()
    with torch.no_grad():  # LayerNorm's ones/zeros would hide a wrong a_2/b_2
        for module in model.modules():
            if isinstance(module, LayerNorm):
                module.a_2.uniform_(0.5, 1.5)
                module.b_2.normal_(0.0, 0.1)
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(1, vocab, (batch, seq), generator=gen)
    tokens[-1, -3:] = 0  # padding: the mask matters
    segments = torch.ones(batch, seq, dtype=torch.int64)
    segments[:, seq // 2:] = 2
    segments[tokens == 0] = 0
    return model, (tokens, segments)


def merged_qkv_bert(hidden=16, heads=2, seq=4, seed=0):
    """One BERT attention layer in ONNX whose Q/K/V come from one Gemm and a Split(3).

    Node names follow the TF export the README uses (``layer_._0/attention/self/MatMul``).
    Returns ``(model, inputs)``.
    """
    rng = np.random.default_rng(seed)
    d = hidden // heads
    scope = "bert/encoder/layer_._0/attention/self"
    weights = {
        "qkv_w": rng.normal(size=(hidden, 3 * hidden)) / np.sqrt(hidden),
        "qkv_b": rng.normal(size=(3 * hidden,)) * 0.1,
        "heads_shape": np.array([seq, heads, d]),
        "out_w": rng.normal(size=(hidden, hidden)) / np.sqrt(hidden),
        "scale": np.array(1 / np.sqrt(d)),
    }
    inits = [numpy_helper.from_array(v.astype(np.int64 if k == "heads_shape" else np.float32), k)
             for k, v in weights.items()]
    n = helper.make_node
    nodes = [
        n("Gemm", ["x", "qkv_w", "qkv_b"], ["qkv"], name=f"{scope}/qkv/Gemm"),
        n("Split", ["qkv"], ["q", "k", "v"], name=f"{scope}/Split", axis=1),
    ]
    for t in "qkv":
        nodes.append(n("Reshape", [t, "heads_shape"], [f"{t}h"], name=f"{scope}/{t}/Reshape"))
        perm = [1, 2, 0] if t == "k" else [1, 0, 2]
        nodes.append(n("Transpose", [f"{t}h"], [f"{t}t"], name=f"{scope}/{t}/Transpose", perm=perm))
    nodes += [
        n("MatMul", ["qt", "kt"], ["scores"], name=f"{scope}/MatMul"),
        n("Mul", ["scores", "scale"], ["scaled"], name=f"{scope}/Mul"),
        n("Softmax", ["scaled"], ["probs"], name=f"{scope}/Softmax", axis=-1),
        n("MatMul", ["probs", "vt"], ["context"], name=f"{scope}/MatMul_1"),
        n("Transpose", ["context"], ["context_t"], name=f"{scope}/Transpose", perm=[1, 0, 2]),
        n("Reshape", ["context_t", "x_shape"], ["merged"], name=f"{scope}/Reshape"),
        n("MatMul", ["merged", "out_w"], ["y"], name="bert/encoder/layer_._0/attention/output/MatMul"),
    ]
    inits.append(numpy_helper.from_array(np.array([seq, hidden], dtype=np.int64), "x_shape"))
    graph = helper.make_graph(nodes, "merged_qkv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model, {"x": rng.normal(size=(seq, hidden)).astype(np.float32)}
