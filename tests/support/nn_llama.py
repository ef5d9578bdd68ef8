"""A tiny Llama written with ``tvm.relax.frontend.nn`` and TVM's paged KV cache, for the tests.

Our own code (in the shape MLC-LLM's models have: one nn.Module with ``prefill``, ``decode``
and ``create_paged_kv_cache``), with the weights of a seeded Hugging Face ``LlamaForCausalLM``
loaded as MLC's loader does: q/k/v concatenated into ``qkv_proj``, gate/up into
``gate_up_proj``.  Module paths follow HF's (``model.layers.0.self_attn``), so HF forward hooks
give the reference for each one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor, op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 128
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rms_norm_eps: float = 1e-6
    rope_theta: int = 10000
    max_position_embeddings: int = 64

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class LlamaMLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.intermediate_size = c.intermediate_size
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
    def __init__(self, c: LlamaConfig):
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = nn.RMSNorm(c.hidden_size, -1, c.rms_norm_eps, bias=False)

    def forward(self, ids: Tensor, cache: PagedKVCache) -> Tensor:
        x = self.embed_tokens(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cache, i)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c: LlamaConfig):
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def prefill(self, input_ids: Tensor, paged_kv_cache: PagedKVCache):
        return self.lm_head(self.model(input_ids, paged_kv_cache)), paged_kv_cache

    def decode(self, input_ids: Tensor, paged_kv_cache: PagedKVCache):
        return self.lm_head(self.model(input_ids, paged_kv_cache)), paged_kv_cache

    def create_paged_kv_cache(self, max_batch_size: tirx.Var, max_total_seq_len: tirx.Var,
                              prefill_chunk_size: tirx.Var, page_size: tirx.Var,
                              support_sliding_window: tirx.Var) -> PagedKVCache:
        import tvm
        from tvm import relax

        c = self.config
        return TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=relax.ShapeExpr([0, c.num_hidden_layers]),
            num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads, qk_head_dim=c.head_dim, v_head_dim=c.head_dim,
            mla_original_qk_head_dim=0, mla_original_v_head_dim=0, rope_mode=RopeMode.NORMAL,
            rope_scale=1, rope_theta=c.rope_theta, rope_scaling={}, rope_ext_factors=relax.prim_value(0),
            rotary_dim=c.head_dim, enable_disaggregation=False, dtype="float32",
            target=tvm.target.Target("llvm"))

    def get_default_spec(self, param_mode: str = "plain"):
        mode = {"$": {"param_mode": param_mode, "effect_mode": "none"}}
        return nn.spec.ModuleSpec.from_raw({
            "prefill": {"input_ids": nn.spec.Tensor([1, "seq_len"], "int32"),
                        "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache), **mode},
            "decode": {"input_ids": nn.spec.Tensor([1, 1], "int32"),
                       "paged_kv_cache": nn.spec.Object(object_type=PagedKVCache), **mode},
            "create_paged_kv_cache": {"max_batch_size": int, "max_total_seq_len": int,
                                      "prefill_chunk_size": int, "page_size": int,
                                      "support_sliding_window": int,
                                      "$": {"param_mode": "none", "effect_mode": "none"}},
        }, self)


# -- the reference: a seeded Hugging Face model, and its weights as MLC's loader maps them ------
def hf_llama(c: LlamaConfig = LlamaConfig(), seed: int = 0):
    """A seeded ``transformers.LlamaForCausalLM`` of config ``c`` (random weights, eval mode)."""
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
    with torch.no_grad():  # HF initialises norms to ones: random ones make a sharper test
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model


def mlc_weights(hf_model) -> dict[str, np.ndarray]:
    """HF weights under our parameter names: q/k/v and gate/up concatenated (MLC's loader)."""
    sd = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    out = {}
    for name, array in sd.items():
        if ".q_proj." in name:
            prefix = name.split(".q_proj.")[0]
            out[prefix + ".qkv_proj.weight"] = np.concatenate(
                [sd[f"{prefix}.{p}_proj.weight"] for p in "qkv"], axis=0)
        elif ".gate_proj." in name:
            prefix = name.split(".gate_proj.")[0]
            out[prefix + ".gate_up_proj.weight"] = np.concatenate(
                [sd[f"{prefix}.gate_proj.weight"], sd[f"{prefix}.up_proj.weight"]], axis=0)
        elif not any(f".{p}_proj." in name for p in ("k", "v", "up")):
            out[name] = array
    return {k: np.ascontiguousarray(v, dtype="float32") for k, v in out.items()}
