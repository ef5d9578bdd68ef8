"""Built-in MLC-style demo LLM: a tiny Llama in ``tvm.relax.frontend.nn``, written in MLC-LLM's
conventions, with the weights of a seeded transformers ``LlamaForCausalLM`` (no download).

MLC-LLM is not on the package index; its models are ``nn.Module``\\ s in this shape (read from
mlc-ai/mlc-llm, ``python/mlc_llm/model/llama/llama_model.py``; the code here is our own):

* functions ``embed`` (1-D token ids → ``(n, hidden)``), ``prefill`` and ``decode`` (an
  embedding ``(1, n, hidden)`` and the paged KV cache → logits and the cache; the prefill's
  logits are the last position's only) and ``create_paged_kv_cache`` (five sizes → TVM's paged
  KV cache); the weights packed into one tuple (``param_mode="packed"``);
* q/k/v fused into ``self_attn.qkv_proj``, gate/up into ``mlp.gate_up_proj``; otherwise the module
  paths are transformers' (``model.layers.0.self_attn``, ``model.norm``, ``lm_head``), so a
  transformers model with the same weights is the reference of every block
  (:func:`mlc_weights` maps them as MLC's loader does);
* the sizes the cache is made with come from the config (``context_window_size``,
  ``prefill_chunk_size``), as MLC's ``mlc-chat-config.json`` holds them.

:class:`DispatchKVCacheCreation` is a pass of our own that does what MLC's pass of that name does
to every MLC build: it replaces ``create_paged_kv_cache`` with ``create_tir_paged_kv_cache``.

Example (docs/llm.md, "MLC-LLM models")::

    from tvm_probe.importer import demo_mlc
    config = demo_mlc.LlamaConfig()
    model = demo_mlc.LlamaForCausalLM(config)
    hf_model = demo_mlc.hf_llama(config)          # transformers, seeded
    params = demo_mlc.mlc_weights(hf_model)       # {model's parameter name: array}
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache

#: the sizes a paged KV cache is created with, in the order its creator takes them
CREATOR_SIZES = ("max_batch_size", "max_total_seq_len", "prefill_chunk_size", "page_size", "support_sliding_window")


@dataclass(frozen=True)
class LlamaConfig:
    """The model's sizes (a transformers ``LlamaConfig``'s names) and MLC's two serving sizes."""

    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: int = 10000
    max_position_embeddings: int = 64
    context_window_size: int = 64  # MLC: the longest sequence the KV cache holds
    prefill_chunk_size: int = 32  # MLC: the most tokens one prefill call takes

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class LlamaAttention(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: Tensor, cache: PagedKVCache, layer_id: int) -> Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.heads + 2 * self.kv_heads, self.head_dim))
        out = cache.attention_with_fused_qkv(layer_id, qkv, self.heads, sm_scale=self.head_dim ** -0.5)
        return self.o_proj(op.reshape(out, (b, s, self.heads * self.head_dim)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.input_layernorm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False)
        self.self_attn = LlamaAttention(c)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False)
        self.mlp = LlamaMLP(c)

    def forward(self, x: Tensor, cache: PagedKVCache, layer_id: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embedding, decoder layers and the final norm; ``forward`` takes the embedded tokens (MLC's
    ``prefill``/``decode`` receive what ``embed`` returned)."""

    def __init__(self, c: LlamaConfig):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False)

    def forward(self, x: Tensor, cache: PagedKVCache) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, cache, i)
        return self.norm(x)


def last_token(x: Tensor) -> Tensor:
    """``x[:, -1:, :]``: the hidden state whose logits give the next token (MLC's prefill)."""
    def index(t: te.Tensor):  # (the TE tensor's own sizes: its kernel takes them from the buffer)
        b, s, d = t.shape
        return te.compute((b, 1, d), lambda i, _, k: t[i, s - 1, k], name="index")

    return op.tensor_expr_op(index, "index", [x])


class LlamaForCausalLM(nn.Module):
    """The MLC-style Llama: ``embed``, ``prefill``, ``decode``, ``create_paged_kv_cache``."""

    def __init__(self, c: LlamaConfig):
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def embed(self, input_ids: Tensor):
        return self.model.embed_tokens(input_ids)

    def prefill(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        return self.lm_head(last_token(self.model(input_embed, paged_kv_cache))), paged_kv_cache

    def decode(self, input_embed: Tensor, paged_kv_cache: PagedKVCache):
        return self.lm_head(self.model(input_embed, paged_kv_cache)), paged_kv_cache

    def create_paged_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                              prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                              support_sliding_window: tirx.Var) -> PagedKVCache:
        return paged_kv_cache(self.config, max_batch_size, max_total_seq_len, prefill_chunk_size, page_size,
                              support_sliding_window)

    def get_default_spec(self, param_mode: str = "packed"):
        """MLC's spec: every function but the creator takes the weights (packed, as MLC deploys)."""
        c, mode = self.config, {"$": {"param_mode": param_mode, "effect_mode": "none"}}
        cache = nn.spec.Object(object_type=PagedKVCache)
        return nn.spec.ModuleSpec.from_raw({
            "embed": {"input_ids": nn.spec.Tensor(["seq_len"], "int32"), **mode},
            "prefill": {"input_embed": nn.spec.Tensor([1, "seq_len", c.hidden_size], "float32"),
                        "paged_kv_cache": cache, **mode},
            "decode": {"input_embed": nn.spec.Tensor([1, 1, c.hidden_size], "float32"),
                       "paged_kv_cache": cache, **mode},
            "create_paged_kv_cache": {**{size: int for size in CREATOR_SIZES},
                                      "$": {"param_mode": "none", "effect_mode": "none"}},
        }, self)


def paged_kv_cache(c: LlamaConfig, *sizes) -> PagedKVCache:
    """TVM's TIR paged KV cache for ``c``, made with the five :data:`CREATOR_SIZES`."""
    return TIRPagedKVCache(
        attn_kind="mha", **dict(zip(CREATOR_SIZES, sizes)),
        layer_partition=relax.ShapeExpr([0, c.num_hidden_layers]), num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        qk_head_dim=c.head_dim, v_head_dim=c.head_dim, mla_original_qk_head_dim=0, mla_original_v_head_dim=0,
        rope_mode=RopeMode.NORMAL, rope_scale=1, rope_theta=c.rope_theta, rope_scaling={},
        rope_ext_factors=relax.prim_value(0), rotary_dim=c.head_dim, enable_disaggregation=False,
        dtype="float32", target=tvm.target.Target("llvm"))


@tvm.transform.module_pass(opt_level=0, name="DispatchKVCacheCreation")
class DispatchKVCacheCreation:
    """Replaces ``create_paged_kv_cache`` with ``create_tir_paged_kv_cache``, as MLC-LLM's pass of
    this name does in every MLC build (ours makes the cache from the config; MLC's reads the
    generic creator's metadata).  The kernels only the old creator used go with it."""

    def __init__(self, config: LlamaConfig):
        self.config = config

    def transform_module(self, mod, _ctx):
        if "create_paged_kv_cache" not in {gv.name_hint for gv in mod.functions}:
            return mod
        others = [f for gv, f in mod.functions.items()
                  if isinstance(f, relax.Function) and gv.name_hint != "create_paged_kv_cache"]
        used = {gv.name_hint for f in others for gv in relax.analysis.all_global_vars(f)}
        only_creator = {gv.name_hint for gv in relax.analysis.all_global_vars(mod["create_paged_kv_cache"])} - used
        kept = {gv: f for gv, f in mod.functions.items()
                if gv.name_hint != "create_paged_kv_cache" and gv.name_hint not in only_creator}
        bb = relax.BlockBuilder(tvm.IRModule(kept, attrs=mod.attrs))
        sizes = [tirx.Var(name, "int64") for name in CREATOR_SIZES]
        params = [relax.Var(f"{s.name}_", relax.ShapeType([s])) for s in sizes]
        with bb.function("create_tir_paged_kv_cache", params=params):
            bb.emit_func_output(paged_kv_cache(self.config, *sizes)._expr)
        return bb.finalize()


# -- the reference: a seeded transformers model, and its weights as MLC's loader maps them --------
def hf_llama(c: LlamaConfig = LlamaConfig(), seed: int = 0):
    """A seeded transformers ``LlamaForCausalLM`` of config ``c`` (random weights, eval mode;
    norm weights drawn in [0.5, 1.5] rather than ones, which would hide a norm applied wrongly)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, rms_norm_eps=c.rms_norm_eps,
        rope_theta=float(c.rope_theta), max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model


def mlc_weights(hf_model) -> dict[str, np.ndarray]:
    """transformers' weights under the MLC-style model's names: q/k/v concatenated into
    ``qkv_proj``, gate/up into ``gate_up_proj`` (what MLC's loader does), float32."""
    sd = {k: v.detach().float().numpy() for k, v in hf_model.state_dict().items()}
    out = {}
    for name, array in sd.items():
        if ".q_proj." in name:
            prefix = name.split(".q_proj.")[0]
            out[prefix + ".qkv_proj.weight"] = np.concatenate([sd[f"{prefix}.{p}_proj.weight"] for p in "qkv"])
        elif ".gate_proj." in name:
            prefix = name.split(".gate_proj.")[0]
            out[prefix + ".gate_up_proj.weight"] = np.concatenate(
                [sd[f"{prefix}.gate_proj.weight"], sd[f"{prefix}.up_proj.weight"]])
        elif not any(f".{p}_proj." in name for p in ("k", "v", "up")) and "rotary_emb" not in name:
            out[name] = array
    return {k: np.ascontiguousarray(v, dtype="float32") for k, v in out.items()}
