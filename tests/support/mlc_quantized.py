"""MLC-LLM-style group quantization ("q4f32_1") of the MLC-style demo Llama
(:mod:`tvm_probe.importer.demo_mlc`), as test support.

MLC-LLM's ``GroupQuantize`` (``python/mlc_llm/quantization/group_quantization.py``; the code here
is our own, written to its conventions) swaps every ``nn.Linear`` and the ``nn.Embedding`` of a
model for a module holding two parameters and dequantizing them *inside the module's forward*:

* ``q_weight``: uint32, shape ``(out, in * 4 / 32)``: eight 4-bit values per word, value ``i`` of
  a word in bits ``[4i, 4i + 4)`` (weight layout ``NK``: ``(out, in)``, as ``nn.Linear`` holds it);
* ``q_scale``: float32, shape ``(out, in / group_size)``: one scale per ``group_size`` consecutive
  weights along the input (reduction) dimension.

Quantization is symmetric (``max_int = 2**(bits - 1) - 1 = 7``)::

    scale = max|w_group| / 7
    q     = clip(round(w / scale) + 7, 0, 14)        (a group of zeros: scale 0, q = 7)
    w'    = (q - 7) * scale

The dequantization is a ``te.compute`` (unpack: shift, mask, cast; then subtract and scale)
made an op with ``nn.op.tensor_expr_op``, then ``matmul(x, permute_dims(w'))``, as MLC's module
does.  The embedding dequantizes the *whole table*, then takes the rows (``op.take``), which is
what MLC's ``GroupQuantizeEmbedding.forward`` writes (TVM's fusion may then compute only the
rows taken).

:func:`quantize_model` swaps the modules in place at the same attributes, so module paths stay
``model.layers.0.self_attn.qkv_proj``; :func:`quantize_weights` / :func:`dequantize_weights` are
the numpy quantizer and the ground truth; :func:`plant_outliers` makes one layer quantize badly.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op

from tvm_probe.importer import demo_mlc

BITS = 4
PER_WORD = 32 // BITS  # 4-bit values per uint32
MAX_INT = 2 ** (BITS - 1) - 1  # 7
MASK = (1 << BITS) - 1


def _dequantize_te(q_weight: te.Tensor, q_scale: te.Tensor, rows: int, cols: int, group_size: int) -> te.Tensor:
    """``(rows, cols)`` float32 from the packed words and the group scales."""
    def element(i, j):
        word = q_weight[i, j // PER_WORD]
        shift = ((j % PER_WORD) * BITS).astype("uint32")
        level = tirx.bitwise_and(tirx.shift_right(word, shift), tirx.const(MASK, "uint32")).astype("float32")
        return (level - tirx.const(MAX_INT, "float32")) * q_scale[i, j // group_size]

    shape = (tirx.IntImm("int64", rows), tirx.IntImm("int64", cols))
    return te.compute(shape, element, name="dequantize")


def _check_sizes(cols: int, group_size: int, what: str) -> None:
    if group_size % PER_WORD or cols % group_size:
        raise ValueError(f"{what}: group_size {group_size} must be a multiple of {PER_WORD} and divide {cols}")


class GroupQuantizeLinear(nn.Module):
    """``nn.Linear`` (no bias) with q4f32_1 group-quantized weights, dequantized in ``forward``."""

    def __init__(self, in_features: int, out_features: int, group_size: int = 32):
        _check_sizes(in_features, group_size, "GroupQuantizeLinear")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.q_weight = nn.Parameter((out_features, in_features // PER_WORD), "uint32")
        self.q_scale = nn.Parameter((out_features, in_features // group_size), "float32")

    @staticmethod
    def from_linear(linear: nn.Linear, group_size: int = 32) -> "GroupQuantizeLinear":
        if getattr(linear, "bias", None) is not None:
            raise ValueError("GroupQuantizeLinear: a Linear with a bias is not supported here")
        return GroupQuantizeLinear(linear.in_features, linear.out_features, group_size)

    def forward(self, x: Tensor) -> Tensor:
        w = op.tensor_expr_op(
            lambda q, s: _dequantize_te(q, s, self.out_features, self.in_features, self.group_size),
            "dequantize", [self.q_weight, self.q_scale])
        return op.matmul(x, op.permute_dims(w))


class GroupQuantizeEmbedding(nn.Module):
    """``nn.Embedding`` with q4f32_1 group-quantized rows: dequantizes the whole table, then takes
    the rows of the ids (MLC's order).  Takes 1-D ids (the demo's ``embed``) or any shape."""

    def __init__(self, num: int, dim: int, group_size: int = 32):
        _check_sizes(dim, group_size, "GroupQuantizeEmbedding")
        self.num, self.dim, self.group_size = num, dim, group_size
        self.q_weight = nn.Parameter((num, dim // PER_WORD), "uint32")
        self.q_scale = nn.Parameter((num, dim // group_size), "float32")

    @staticmethod
    def from_embedding(embedding: nn.Embedding, group_size: int = 32) -> "GroupQuantizeEmbedding":
        num, dim = embedding.weight.shape
        return GroupQuantizeEmbedding(int(num), int(dim), group_size)

    def forward(self, ids: Tensor) -> Tensor:
        w = op.tensor_expr_op(lambda q, s: _dequantize_te(q, s, self.num, self.dim, self.group_size),
                              "dequantize", [self.q_weight, self.q_scale])
        if ids.ndim == 1:
            return op.take(w, ids, axis=0)
        return op.reshape(op.take(w, op.reshape(ids, [-1]), axis=0), [*ids.shape, self.dim])


def quantize_model(model: demo_mlc.LlamaForCausalLM, group_size: int = 32,
                   embedding: bool = True) -> demo_mlc.LlamaForCausalLM:
    """``model`` itself, every ``nn.Linear`` (qkv_proj, o_proj, gate_up_proj, down_proj,
    lm_head) replaced in place by a :class:`GroupQuantizeLinear` at the same attribute, and (with
    ``embedding``) ``model.embed_tokens`` by a :class:`GroupQuantizeEmbedding`: what MLC's
    ``quantize_model`` mutator does.  Parameter names become ``<path>.q_weight`` / ``.q_scale``."""
    def visit(module: nn.Module) -> None:
        children = (list(enumerate(module.modules)) if isinstance(module, nn.ModuleList)
                    else list(vars(module).items()))
        for name, child in children:
            new = None
            if isinstance(child, nn.Linear):
                new = GroupQuantizeLinear.from_linear(child, group_size)
            elif isinstance(child, nn.Embedding) and embedding:
                new = GroupQuantizeEmbedding.from_embedding(child, group_size)
            elif isinstance(child, nn.Module):
                visit(child)
            if new is not None:
                if isinstance(module, nn.ModuleList):
                    module.modules[name] = new
                else:
                    setattr(module, name, new)

    visit(model)
    return model


# -- numpy: the quantizer and the ground truth -------------------------------------------------
def _quantized_names(weights: dict, embedding: bool) -> list[str]:
    """The ``.weight`` entries quantize_model swaps: 2-D weights (Linear, and the embedding)."""
    return [n for n, w in weights.items() if n.endswith(".weight") and np.ndim(w) == 2
            and (embedding or not n.endswith("embed_tokens.weight"))]


def pack(q: np.ndarray) -> np.ndarray:
    """``(rows, cols)`` levels in [0, 15] → ``(rows, cols / 8)`` uint32, value ``i`` of a word in
    bits ``[4i, 4i + 4)``."""
    rows, cols = q.shape
    parts = q.astype(np.uint32).reshape(rows, cols // PER_WORD, PER_WORD)
    shifts = (np.arange(PER_WORD, dtype=np.uint32) * BITS)
    return np.bitwise_or.reduce(parts << shifts, axis=-1).astype(np.uint32)


def unpack(words: np.ndarray) -> np.ndarray:
    """The inverse of :func:`pack`: ``(rows, words)`` uint32 → ``(rows, words * 8)`` uint32 levels."""
    shifts = (np.arange(PER_WORD, dtype=np.uint32) * BITS)
    levels = (words[..., None] >> shifts) & np.uint32(MASK)
    return levels.reshape(words.shape[0], -1)


def quantize_weight(w: np.ndarray, group_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """One ``(out, in)`` float weight → ``(q_weight uint32, q_scale float32)``."""
    out, cols = w.shape
    _check_sizes(cols, group_size, "quantize_weight")
    groups = w.astype(np.float32).reshape(out, cols // group_size, group_size)
    scale = (np.abs(groups).max(axis=-1) / np.float32(MAX_INT)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)[..., None]
    q = np.clip(np.round(groups / safe) + MAX_INT, 0, 2 * MAX_INT)
    q = np.where(scale[..., None] == 0, MAX_INT, q)
    return pack(q.reshape(out, cols).astype(np.uint32)), scale


def quantize_weights(weights: dict[str, np.ndarray], group_size: int = 32,
                     embedding: bool = True) -> dict[str, np.ndarray]:
    """``<path>.weight`` of each Linear (and, with ``embedding``, the token embedding) →
    ``<path>.q_weight`` / ``<path>.q_scale``; other weights (the norms) unchanged."""
    names = set(_quantized_names(weights, embedding))
    out = {}
    for name, w in weights.items():
        if name in names:
            path = name[: -len(".weight")]
            out[f"{path}.q_weight"], out[f"{path}.q_scale"] = quantize_weight(np.asarray(w), group_size)
        else:
            out[name] = w
    return out


def dequantize_weights(qweights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float ``<path>.weight`` = (level - 7) * scale, from each ``q_weight``/``q_scale`` pair (float32,
    the same arithmetic as the compiled kernel); other weights unchanged."""
    out = {}
    for name, value in qweights.items():
        if name.endswith(".q_scale"):
            continue
        if name.endswith(".q_weight"):
            path = name[: -len(".q_weight")]
            scale = qweights[f"{path}.q_scale"]
            levels = unpack(value).astype(np.float32) - np.float32(MAX_INT)
            group_size = levels.shape[1] // scale.shape[1]
            out[f"{path}.weight"] = (levels * np.repeat(scale, group_size, axis=1)).astype(np.float32)
        else:
            out[name] = value
    return out


def hf_state_dict(weights: dict[str, np.ndarray], config: demo_mlc.LlamaConfig) -> dict:
    """MLC-named float weights back under transformers' names (qkv → q/k/v, gate_up → gate/up):
    the inverse of :func:`demo_mlc.mlc_weights`, as torch tensors."""
    import torch

    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    out = {}
    for name, w in weights.items():
        if ".qkv_proj." in name:
            p = name.split(".qkv_proj.")[0]
            q, k, v = np.split(w, [q_rows, q_rows + kv_rows])
            out.update({f"{p}.q_proj.weight": q, f"{p}.k_proj.weight": k, f"{p}.v_proj.weight": v})
        elif ".gate_up_proj." in name:
            p = name.split(".gate_up_proj.")[0]
            gate, up = np.split(w, 2)
            out.update({f"{p}.gate_proj.weight": gate, f"{p}.up_proj.weight": up})
        else:
            out[name] = w
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def dequantized_hf(hf_model, qweights: dict[str, np.ndarray], config: demo_mlc.LlamaConfig):
    """A copy of ``hf_model`` holding the dequantized weights (the reference of the quantized build)."""
    import copy

    twin = copy.deepcopy(hf_model)
    missing, unexpected = twin.load_state_dict(hf_state_dict(dequantize_weights(qweights), config), strict=False)
    missing = [m for m in missing if "rotary_emb" not in m]
    if missing or unexpected:
        raise ValueError(f"dequantized weights do not fit: missing {missing}, unexpected {unexpected}")
    return twin.eval()


def plant_outliers(hf_model, path: str = "model.layers.1.mlp.down_proj", factor: float = 10.0,
                   group_size: int = 32, seed: int = 1):
    """Make group quantization of the ``mlp.down_proj`` at ``path`` (a transformers module path)
    hurt, *without changing the float model*: in each group of ``group_size`` input columns one
    (seeded) column ``j`` is multiplied by ``c_j`` and row ``j`` of the sibling ``up_proj`` divided
    by it (down_proj's input channel ``j`` is ``silu(gate_j) * up_j``, linear in ``up_j``, so the
    float function is the same up to rounding).  ``c_j`` makes the column's typical magnitude
    ``factor`` times the typical largest magnitude of a row's group: each row's group scale
    follows the outlier, and the other 31 weights of the group, ``<= 7 / factor`` levels, round
    to 0 or +-1.  up_proj's rows are quantized along the hidden size, so dividing a row only
    divides its scales: it quantizes as well as before.  Returns ``hf_model`` (changed in place)."""
    import torch

    if not path.endswith("mlp.down_proj"):
        raise ValueError(f"plant_outliers: {path!r} is not an mlp.down_proj (the compensation is up_proj's)")
    down = hf_model.get_submodule(path)
    up = hf_model.get_submodule(path[: -len("down_proj")] + "up_proj")
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        w = down.weight
        rows, cols = w.shape
        for g in range(0, cols, group_size):
            j = int(rng.integers(g, g + group_size))
            group_max = w[:, g:g + group_size].abs().amax(dim=1)
            c = factor * group_max.median() / w[:, j].abs().median()
            w[:, j] *= c
            up.weight[j, :] /= c
    return hf_model
