"""Models as users have them: Hugging Face exports with dynamic axes, BERT as BERT-pytorch writes it.

The Hugging Face models are ``transformers`` classes built from a config with seeded random
weights (no hub download, nothing leaves the machine), kept tiny: hidden 32, 2 layers, 4 heads,
sequence 8.  Exported with dynamic axes they carry the constructs current exporters emit:
transformers-5 attention masks (``ConstantOfShape``/``And`` in the legacy exporter),
``view``/``reshape`` from shape arithmetic (``Shape → Gather → Concat``, ``sym_size`` in the
dynamo exporter), causal masks built from ``Range``/``Expand``.

:class:`UpstreamBERT` is codertimo/BERT-pytorch's architecture, written here, whose attention
masks with ``masked_fill(mask == 0, ...)`` on a bool mask (the ``bool_compare_constant`` fix).

This module is a helper, not a test file.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

VOCAB, HIDDEN, LAYERS, HEADS, INTERMEDIATE, POSITIONS = 100, 32, 2, 4, 64, 64
BATCH, SEQ = 2, 8
TEXT_AXES = {0: "batch", 1: "seq"}


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()  # config chatter on stderr
    return transformers


def _ids(seed: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))


def hf_bert(seed: int = 0, batch: int = BATCH, seq: int = SEQ):
    """``transformers.BertForSequenceClassification`` (eval, seeded) and ``(input_ids, attention_mask)``.

    The mask hides the last two positions of the last sequence, so the mask path matters.
    """
    tf = _transformers()
    torch.manual_seed(seed)
    config = tf.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                           max_position_embeddings=POSITIONS, return_dict=False)
    model = tf.BertForSequenceClassification(config).eval()
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, -2:] = 0
    return model, (_ids(seed, batch, seq), mask)


def hf_gpt2(seed: int = 0, batch: int = BATCH, seq: int = SEQ):
    """``transformers.GPT2LMHeadModel`` (eval, seeded, no KV cache) and ``(input_ids,)``.

    It returns a ``CausalLMOutput`` (``return_dict=False`` breaks its dynamo export in
    transformers 5.24); :func:`logits` reads either form.
    """
    tf = _transformers()
    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                           n_positions=POSITIONS, bos_token_id=0, eos_token_id=0, use_cache=False)
    return tf.GPT2LMHeadModel(config).eval(), (_ids(seed, batch, seq),)


def logits(output) -> torch.Tensor:
    """The logits of a model's output: a tensor, a tuple or a transformers ``ModelOutput``."""
    if isinstance(output, torch.Tensor):
        return output
    return output.logits if hasattr(output, "logits") else output[0]


def export_legacy(model, args, path: Path, names: list[str], axes: dict[str, dict[int, str]]) -> Path:
    """``torch.onnx.export(..., dynamo=False, dynamic_axes=axes)`` (the TorchScript exporter)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, input_names=names, output_names=["logits"],
                          dynamic_axes={**axes, "logits": {0: "batch"}}, opset_version=17)
    return path


def export_dynamo(model, args, path: Path, names: list[str], axes: dict[str, dict[int, str]]) -> Path:
    """``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)``: one ``Dim`` per axis name."""
    dims: dict[str, torch.export.Dim] = {}
    shapes = tuple({axis: dims.setdefault(label, torch.export.Dim(label, max=POSITIONS))
                    for axis, label in axes.get(name, {}).items()} for name in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=True, input_names=names, output_names=["logits"],
                          dynamic_shapes=shapes, verbose=False)
    return path


# -- BERT as BERT-pytorch (codertimo) writes it ---------------------------------------------
# Written here from the architecture that repository describes (module names as upstream), small.
# Its attention masks with `scores.masked_fill(mask == 0, -1e9)` on a *bool* mask, which TVM 0.27
# imports as R.equal(mask, False) and LLVM then rejects: the construct of the
# `bool_compare_constant` import fix.

class _LayerNorm(torch.nn.Module):
    """``a_2 * (x - mean) / (std + eps) + b_2`` with the unbiased std, as upstream."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.a_2, self.b_2 = torch.nn.Parameter(torch.ones(size)), torch.nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x):
        return self.a_2 * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class _Attention(torch.nn.Module):
    def forward(self, query, key, value, mask):
        scores = torch.matmul(query, key.transpose(-2, -1)) / query.size(-1) ** 0.5
        scores = scores.masked_fill(mask == 0, -1e9)
        return torch.matmul(torch.softmax(scores, dim=-1), value)


class _MultiHeadedAttention(torch.nn.Module):
    def __init__(self, heads: int, hidden: int):
        super().__init__()
        self.h, self.d_k = heads, hidden // heads
        self.linear_layers = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.output_linear = torch.nn.Linear(hidden, hidden)
        self.attention = _Attention()

    def forward(self, x, mask):
        batch = x.size(0)
        q, k, v = (layer(x).view(batch, -1, self.h, self.d_k).transpose(1, 2) for layer in self.linear_layers)
        context = self.attention(q, k, v, mask).transpose(1, 2).contiguous().view(batch, -1, self.h * self.d_k)
        return self.output_linear(context)


class _SublayerConnection(torch.nn.Module):
    """``x + sublayer(norm(x))``."""

    def __init__(self, size: int):
        super().__init__()
        self.norm = _LayerNorm(size)

    def forward(self, x, sublayer):
        return x + sublayer(self.norm(x))


class _FeedForward(torch.nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.w_1, self.w_2 = torch.nn.Linear(hidden, inner), torch.nn.Linear(inner, hidden)
        self.activation = torch.nn.GELU("tanh")

    def forward(self, x):
        return self.w_2(self.activation(self.w_1(x)))


class _TransformerBlock(torch.nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.attention = _MultiHeadedAttention(heads, hidden)
        self.feed_forward = _FeedForward(hidden, 4 * hidden)
        self.input_sublayer, self.output_sublayer = _SublayerConnection(hidden), _SublayerConnection(hidden)

    def forward(self, x, mask):
        x = self.input_sublayer(x, lambda h: self.attention(h, mask))
        return self.output_sublayer(x, self.feed_forward)


class _BERTEmbedding(torch.nn.Module):
    """Token + sinusoidal position + segment embeddings."""

    def __init__(self, vocab: int, hidden: int, max_len: int = POSITIONS):
        super().__init__()
        self.token = torch.nn.Embedding(vocab, hidden, padding_idx=0)
        self.segment = torch.nn.Embedding(3, hidden, padding_idx=0)
        position = torch.arange(max_len, dtype=torch.float32)[:, None]
        rate = torch.exp(torch.arange(0, hidden, 2, dtype=torch.float32) * -(torch.log(torch.tensor(1e4)) / hidden))
        pe = torch.zeros(max_len, hidden)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
        self.register_buffer("pe", pe[None])

    def forward(self, sequence, segment_label):
        return self.token(sequence) + self.pe[:, :sequence.size(1)] + self.segment(segment_label)


class UpstreamBERT(torch.nn.Module):
    """BERT-pytorch's ``BERT``: embedding, then blocks attending under a bool padding mask."""

    def __init__(self, vocab: int = 15, hidden: int = HIDDEN, n_layers: int = LAYERS, attn_heads: int = HEADS):
        super().__init__()
        self.embedding = _BERTEmbedding(vocab, hidden)
        self.transformer_blocks = torch.nn.ModuleList(_TransformerBlock(hidden, attn_heads) for _ in range(n_layers))

    def forward(self, x, segment_info):
        mask = (x > 0).unsqueeze(1).repeat(1, x.size(1), 1).unsqueeze(1)
        x = self.embedding(x, segment_info)
        for block in self.transformer_blocks:
            x = block(x, mask)
        return x


def upstream_bert(seed: int = 0, batch: int = BATCH, seq: int = SEQ, **sizes):
    """A seeded :class:`UpstreamBERT` (eval) and padded inputs ``(tokens, segments)`` (0 = padding)."""
    torch.manual_seed(seed)
    model = UpstreamBERT(**sizes).eval()
    vocab = model.embedding.token.num_embeddings
    tokens = torch.randint(1, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))
    tokens[-1, -3:] = 0  # padding
    segments = (tokens > 0).long() + (torch.arange(seq) >= seq // 2).long() * (tokens > 0).long()
    return model, (tokens, segments)
