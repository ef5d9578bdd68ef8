"""Models as users have them: Hugging Face exports with dynamic axes.

The Hugging Face models are ``transformers`` classes built from a config with seeded random
weights (no hub download, nothing leaves the machine), kept tiny: hidden 32, 2 layers, 4 heads,
sequence 8.  Exported with dynamic axes they carry the constructs current exporters emit:
transformers-5 attention masks (``ConstantOfShape``/``And`` in the legacy exporter),
``view``/``reshape`` from shape arithmetic (``Shape → Gather → Concat``, ``sym_size`` in the
dynamo exporter), causal masks built from ``Range``/``Expand``.

BERT as BERT-pytorch writes it is in ``tests/support/handwritten_models.py``.

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


# -- decoder LLMs (issues 23 and 24) -----------------------------------------------------------
DECODER_VOCAB, DECODER_HIDDEN, DECODER_HEADS, DECODER_KV_HEADS = 128, 64, 4, 2
DECODER_FAMILIES = ("llama", "qwen2", "mistral", "gpt2", "phi3", "gemma")


def decoder_config(family: str, **overrides):
    """A tiny config of ``family`` built in code: vocab 128, hidden 64, 2 layers, 4 heads
    (2 KV heads where the family has grouped-query attention), seeded weights come later.
    ``overrides``: other config fields of a non-GPT-2 family (``hidden_size=256``, ``num_hidden_layers=8``)."""
    tf = _transformers()
    common = dict(vocab_size=DECODER_VOCAB, hidden_size=DECODER_HIDDEN, intermediate_size=128,
                  num_hidden_layers=LAYERS, num_attention_heads=DECODER_HEADS,
                  num_key_value_heads=DECODER_KV_HEADS, max_position_embeddings=POSITIONS,
                  bos_token_id=0, eos_token_id=1, pad_token_id=1) | overrides
    if family == "gpt2":
        if overrides:  # (its fields have other names: refused, not dropped)
            raise ValueError(f"decoder_config('gpt2') takes no overrides, got {sorted(overrides)}")
        return tf.GPT2Config(vocab_size=DECODER_VOCAB, n_embd=DECODER_HIDDEN, n_layer=LAYERS,
                             n_head=DECODER_HEADS, n_positions=POSITIONS, bos_token_id=0, eos_token_id=1)
    configs = {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "mistral": tf.MistralConfig,
               "phi3": tf.Phi3Config, "gemma": tf.GemmaConfig}
    if family == "gemma":  # (Gemma's head_dim is its own field: the others derive it from these two)
        common.setdefault("head_dim", common["hidden_size"] // common["num_attention_heads"])
    return configs[family](**common)


def hf_decoder(family: str, seed: int = 0, **overrides):
    """A seeded ``*ForCausalLM`` of ``family`` in eval mode (no download); ``overrides`` as
    :func:`decoder_config` takes them."""
    tf = _transformers()
    torch.manual_seed(seed)
    return tf.AutoModelForCausalLM.from_config(decoder_config(family, **overrides)).eval()


def decoder_ids(seed: int = 0, batch: int = 1, seq: int = SEQ) -> torch.Tensor:
    """Prompt token ids in ``[2, vocab)`` (0 and 1 are BOS/EOS)."""
    return torch.randint(2, DECODER_VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed + 1))


class LogitsOnly(torch.nn.Module):
    """``model(input_ids[, attention_mask], use_cache=False).logits``: one forward, no cache."""

    def __init__(self, model, with_mask: bool):
        super().__init__()
        self.model, self.with_mask = model, with_mask

    def forward(self, input_ids, attention_mask=None):
        if self.with_mask:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return self.model(input_ids=input_ids, use_cache=False).logits


def eager_forward_outputs(module, args) -> dict:
    """Every submodule's output in eager PyTorch, by path: ``forward`` is wrapped per instance,
    so modules whose ``forward`` is called directly (which forward hooks miss) are seen too.
    The last call wins; a tuple output gives its first tensor, as a forward hook sees it."""
    import numpy as np

    found: dict[str, np.ndarray] = {}
    wrapped = [m for path, m in module.named_modules() if path]
    for path, m in module.named_modules():
        if path:
            m.forward = _recording(path, m.forward, found)
    try:
        with torch.no_grad():
            module(*args)
    finally:
        for m in wrapped:
            del m.forward
    return found


def _recording(path, forward, found):
    def wrapper(*args, **kwargs):
        output = forward(*args, **kwargs)
        tensor = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(tensor, torch.Tensor):
            found[path] = tensor.detach().numpy().copy()
        return output
    return wrapper


def tiny_llama():
    """A factory for ``model: {hf: ...}`` configs: the seeded tiny Llama."""
    return hf_decoder("llama")


def forward_hook_outputs(model, run) -> list[dict]:
    """What forward hooks on every module of ``model`` see while ``run()`` runs: one dict per
    call of ``model`` itself (path → ``output[0]`` as a numpy array: a tuple's or a transformers
    ``ModelOutput``'s first tensor; the root under ``''``).  Independent of tvm_probe's own
    eager reference, which wraps each instance's ``forward`` instead."""
    import numpy as np

    calls: list[dict] = []
    current: dict[str, np.ndarray] = {}

    def hook(path):
        def record(_module, _args, output):
            first = output.to_tuple()[0] if hasattr(output, "to_tuple") else output
            first = first[0] if isinstance(first, (tuple, list)) and first else first
            if isinstance(first, torch.Tensor):
                current[path] = first.detach().numpy().copy()
            if path == "":
                calls.append(dict(current))
                current.clear()
        return record

    handles = [m.register_forward_hook(hook(path)) for path, m in model.named_modules()]
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return calls
