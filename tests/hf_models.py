"""Models as users have them: Hugging Face exports with dynamic axes.

The Hugging Face models are ``transformers`` classes built from a config with seeded random
weights (no hub download, nothing leaves the machine), kept tiny: hidden 32, 2 layers, 4 heads,
sequence 8.  Exported with dynamic axes they carry the constructs current exporters emit:
transformers-5 attention masks (``ConstantOfShape``/``And`` in the legacy exporter),
``view``/``reshape`` from shape arithmetic (``Shape → Gather → Concat``, ``sym_size`` in the
dynamo exporter), causal masks built from ``Range``/``Expand``.

BERT as BERT-pytorch writes it is in ``tests/handwritten_models.py``.

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
