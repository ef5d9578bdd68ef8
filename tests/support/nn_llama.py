"""A tiny Llama written with ``tvm.relax.frontend.nn`` and TVM's paged KV cache, for the tests.

The layers are the built-in MLC-style demo's (:mod:`tvm_probe.importer.demo_mlc`: fused
``qkv_proj`` / ``gate_up_proj``, transformers' module paths); this variant takes token ids in
``prefill`` and ``decode`` (no ``embed`` function, logits at every position) and its weights one
by one (``param_mode="plain"``): the shape of a hand-written nn model, driven by hand.
"""
from __future__ import annotations

from tvm import tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import Tensor
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

from tvm_probe.importer import demo_mlc
from tvm_probe.importer.demo_mlc import LlamaConfig, hf_llama, mlc_weights  # noqa: F401  (the tests' names)


class LlamaModel(demo_mlc.LlamaModel):
    def forward(self, ids: Tensor, cache: PagedKVCache) -> Tensor:
        return super().forward(self.embed_tokens(ids), cache)


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
        return demo_mlc.paged_kv_cache(self.config, max_batch_size, max_total_seq_len, prefill_chunk_size,
                                       page_size, support_sliding_window)

    def get_default_spec(self, param_mode: str = "plain"):
        mode = {"$": {"param_mode": param_mode, "effect_mode": "none"}}
        cache = nn.spec.Object(object_type=PagedKVCache)
        return nn.spec.ModuleSpec.from_raw({
            "prefill": {"input_ids": nn.spec.Tensor([1, "seq_len"], "int32"), "paged_kv_cache": cache, **mode},
            "decode": {"input_ids": nn.spec.Tensor([1, 1], "int32"), "paged_kv_cache": cache, **mode},
            "create_paged_kv_cache": {**{size: int for size in demo_mlc.CREATOR_SIZES},
                                      "$": {"param_mode": "none", "effect_mode": "none"}},
        }, self)
