"""Small PyTorch models for the test-suite, written in plain PyTorch (no downloads).

``tiny_torch_bert`` mirrors the module layout of Hugging Face's ``BertForSequenceClassification``
(``bert.embeddings``, ``bert.encoder.layer.0.attention.self.query``, ``bert.pooler.dense``,
``classifier``) so that module paths in the tests read like those users know, while staying
small enough to compile in seconds.  ``tiny_torch_cnn`` exercises BatchNorm in eval mode, which
``torch.export`` turns into a multi-output op read through ``getitem`` nodes.

Weights are initialised from a fixed seed, so every call returns the same model.
This module is a helper, not a test file.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class BertSelfAttention(nn.Module):
    """Multi-head self-attention: scores = Q Kᵀ / √d + mask, softmax, times V."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(0.1)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        return x.view(batch, seq, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q = self._split(self.query(hidden_states))
        k = self._split(self.key(hidden_states))
        v = self._split(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        probs = self.dropout(torch.softmax(scores, dim=-1))
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)


class BertOutput(nn.Module):
    """dense → dropout → + residual → LayerNorm (HF uses it after attention and after the MLP)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.dense = nn.Linear(intermediate, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertSelfOutput(BertOutput):
    def __init__(self, hidden: int):
        super().__init__(hidden, hidden)


class BertAttention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.self = BertSelfAttention(hidden, heads)
        self.output = BertSelfOutput(hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.dense = nn.Linear(hidden, intermediate)
        self.intermediate_act_fn = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.attention = BertAttention(hidden, heads)
        self.intermediate = BertIntermediate(hidden, intermediate)
        self.output = BertOutput(hidden, intermediate)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attended = self.attention(x, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, layers: int, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_positions: int, type_vocab: int = 2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("position_ids", torch.arange(max_positions).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        seq = input_ids.shape[1]
        positions = self.position_ids[:, :seq]
        token_types = torch.zeros_like(input_ids)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(token_types))
        return self.dropout(self.LayerNorm(x))


class BertPooler(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x[:, 0]))


class BertModel(nn.Module):
    def __init__(self, vocab, hidden, layers, heads, intermediate, max_positions):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, max_positions)
        self.encoder = BertEncoder(layers, hidden, heads, intermediate)
        self.pooler = BertPooler(hidden)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # The additive mask: 0 where attended, a large negative number where masked.
        mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        return self.pooler(self.encoder(self.embeddings(input_ids), mask))


class BertForSequenceClassification(nn.Module):
    def __init__(self, vocab=100, hidden=32, layers=2, heads=4, intermediate=64, max_positions=64,
                 num_labels=3):
        super().__init__()
        self.bert = BertModel(vocab, hidden, layers, heads, intermediate, max_positions)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.bert(input_ids, attention_mask)))


def tiny_torch_bert(seed=0, batch=2, seq=8, **sizes):
    """A seeded BERT classifier in eval mode and its example inputs ``(input_ids, attention_mask)``.

    The mask hides the last two positions of the second sequence, so the mask path matters.
    """
    torch.manual_seed(seed)
    model = BertForSequenceClassification(**sizes).eval()
    vocab = model.bert.embeddings.word_embeddings.num_embeddings
    input_ids = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))
    attention_mask = torch.ones(batch, seq, dtype=torch.int64)
    attention_mask[-1, -2:] = 0
    return model, (input_ids, attention_mask)


class SmallCNN(nn.Module):
    """Conv-BN-ReLU stem, one residual block, max-pool, global average pool, linear classifier."""

    def __init__(self, channels=8, num_classes=10):
        super().__init__()
        c = channels
        self.conv1, self.bn1 = nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv3, self.bn3 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.act = nn.ReLU()  # called three times: its path names the last call
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn1(self.conv1(image)))
        y = self.act(self.bn2(self.conv2(x)))
        y = self.act(self.bn3(self.conv3(y)) + x)
        return self.fc(torch.flatten(self.gap(self.pool(y)), 1))


def tiny_torch_cnn(seed=0, batch=1, image=16, **sizes):
    """A seeded CNN in eval mode, with non-trivial BatchNorm statistics, and its example input."""
    torch.manual_seed(seed)
    model = SmallCNN(**sizes)
    with torch.no_grad():  # default running stats (0, 1) would hide a wrong BatchNorm
        for bn in (model.bn1, model.bn2, model.bn3):
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_(0.0, 0.1)
            bn.running_mean.normal_(0.0, 0.1)
            bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    return model, (torch.randn(batch, 3, image, image, generator=torch.Generator().manual_seed(seed + 1)),)


def eager_module_outputs(module, args, paths=None) -> dict:
    """Each module's output in eager PyTorch, by path, from forward hooks (the last call wins;
    a tuple output gives its first tensor).  ``paths`` defaults to every submodule."""
    import numpy as np

    modules = dict(module.named_modules())
    paths = [p for p in modules if p] if paths is None else list(paths)
    found: dict[str, np.ndarray] = {}

    def keep(path):
        def hook(mod, inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if isinstance(tensor, torch.Tensor):
                found[path] = tensor.detach().numpy().copy()
        return hook

    handles = [modules[p].register_forward_hook(keep(p)) for p in paths]
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for handle in handles:
            handle.remove()
    return found
