"""MLC-LLM models as deployed (issue 53): an MLC-style nn Llama (tvm_probe.importer.demo_mlc: fused
qkv_proj / gate_up_proj, embed / prefill / decode / create_paged_kv_cache, packed weights) built
with a pipeline that swaps its cache creator as MLC's DispatchKVCacheCreation does, driven by
``probe.generate`` with MLC's protocol and compared with eager transformers (the same weights) by
``compare_generation(probe, reference=hf_model)``.

The tokens are checked against transformers' own greedy loop; the values against transformers'
modules (teacher-forced eager, forward-wrapped: tvm_probe.llm.reference) and, for the weights read
from disk, bit for bit against a plain VM fed ``tvmjs.load_tensor_cache``'s arrays.
"""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvm import relax  # noqa: E402

from tvm_probe import InputError, Probe, ProbeError  # noqa: E402
from tvm_probe.importer import demo_mlc  # noqa: E402
from tvm_probe.llm import compare_generation  # noqa: E402

CONFIG = demo_mlc.LlamaConfig()
PROMPT = np.array([[5, 17, 99, 3, 64]])
STEPS = 5
ST = tvm.runtime.ShapeTuple
LAYERS = range(CONFIG.num_hidden_layers)


def mlc_pipeline():
    return tvm.transform.Sequential([demo_mlc.DispatchKVCacheCreation(CONFIG), relax.get_pipeline("default")])


def build(params):
    model = demo_mlc.LlamaForCausalLM(CONFIG)
    return Probe.from_nn(model, model.get_default_spec(), params=params, pipeline=mlc_pipeline())


@pytest.fixture(scope="module")
def hf():
    return demo_mlc.hf_llama(CONFIG, seed=0)


@pytest.fixture(scope="module")
def probe(hf):
    probe = build(demo_mlc.mlc_weights(hf))
    probe.generate(PROMPT, STEPS)
    return probe


def hf_greedy(hf, prompt, steps: int) -> list[int]:
    """transformers' own greedy tokens (the whole sequence run again at each step: no cache)."""
    seq, tokens = torch.tensor(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(hf(seq).logits[0, -1].argmax()))
            seq = torch.cat([seq, torch.tensor([[tokens[-1]]])], dim=1)
    return tokens


def test_generate_drives_the_mlc_protocol(probe, hf):
    assert set(probe.functions) == {"embed", "prefill", "decode", "create_tir_paged_kv_cache"}
    generation = probe.generations[-1]
    assert generation.tokens == hf_greedy(hf, PROMPT, STEPS)
    # the cache made once, from the config's sizes; then per step embed and prefill/decode
    assert generation.cache_call == 0
    assert generation.kv_cache == {"max_batch_size": 1, "max_total_seq_len": CONFIG.context_window_size,
                                   "prefill_chunk_size": CONFIG.prefill_chunk_size, "page_size": 16,
                                   "support_sliding_window": 0}
    assert generation.embed_calls == [1, 3, 5, 7, 9] and generation.calls == [2, 4, 6, 8, 10]
    assert list(probe.calls["function"]) == ["create_tir_paged_kv_cache"] + ["embed", "prefill"] + \
        ["embed", "decode"] * (STEPS - 1)
    # the KV cache after the last step holds the prompt and every token fed back
    assert probe.get("paged_kv_cache.layers.0.k", step=STEPS - 1).shape == \
        (PROMPT.shape[1] + STEPS - 1, CONFIG.num_key_value_heads, CONFIG.head_dim)


def test_the_kv_cache_and_kernel_times_of_every_step(probe, hf):
    """Later decode steps run in one native call each (their weights-only outputs served): the K/V
    read after each one and its kernel times are that step's own."""
    from transformers import DynamicCache

    generation = probe.generations[-1]
    assert probe.call_record(generation.calls[-1]).capture.instrument == "kernel hook"
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():  # transformers' cache after the prompt and the tokens fed back
        hf(torch.tensor([list(PROMPT[0]) + generation.tokens[:-1]]), past_key_values=cache, use_cache=True)
    for i in LAYERS:  # (transformers: (batch, kv heads, length, head dim); TVM's: (length, kv heads, head dim))
        for kv, held in (("k", cache.layers[i].keys), ("v", cache.layers[i].values)):
            np.testing.assert_allclose(probe.get(f"paged_kv_cache.layers.{i}.{kv}", step=STEPS - 1),
                                       held[0].numpy().transpose(1, 0, 2), atol=1e-5, rtol=1e-4)
    assert probe.get("paged_kv_cache.layers.0.k", step=2).shape[0] == PROMPT.shape[1] + 2  # (after that step)
    times = [probe.call_record(k).capture.kernel_times()[1] for k in generation.calls[-2:]]
    assert times[0].keys() == times[1].keys() and times[0] != times[1]  # (each call's own, not a shared buffer)


def test_values_are_found_by_step(probe, hf):
    generation = probe.generations[-1]
    # model.embed_tokens at the step's embed call (1-D ids: (n, hidden)), the rest at its prefill/decode call
    table = hf.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(probe.get("model.embed_tokens", step=0), table[PROMPT[0]])
    np.testing.assert_array_equal(probe.get("model.embed_tokens", step=2), table[[generation.tokens[1]]])
    np.testing.assert_array_equal(probe.get("model.embed_tokens", step=2),
                                  probe.get("model.embed_tokens", call=generation.embed_calls[2]))
    np.testing.assert_array_equal(probe.get("model.layers.1.mlp", step=3),
                                  probe.get("model.layers.1.mlp", call=generation.calls[3]))
    assert probe.get("model.layers.0.self_attn", step=0).shape == (1, PROMPT.shape[1], CONFIG.hidden_size)
    assert probe.get("lm_head", step=0).shape == (1, 1, CONFIG.vocab_size)  # MLC's prefill: the last position
    with pytest.raises(InputError, match=r"step=9: this generation has steps 0\.\.4"):
        probe.get("lm_head", step=9)
    with pytest.raises(InputError, match="give call= or step=, not both"):
        probe.get("lm_head", call=2, step=0)


def test_compare_generation_against_transformers(probe, hf):
    result = compare_generation(probe, reference=hf)
    assert result, result.verdict()
    table = result.table()
    shared = 1 + 7 * CONFIG.num_hidden_layers + 3  # embed_tokens; per layer 7 blocks; model.norm, model, lm_head
    assert list(table["compared"]) == [shared] * STEPS
    assert list(table["function"]) == ["embed+prefill"] + ["embed+decode"] * (STEPS - 1)
    assert table["note"][0] == "lm_head: the last 1 of 5 positions" and not table["note"][1]
    assert result.only_probe == sorted(f"model.layers.{i}.{p}" for i in LAYERS for p in (
        "mlp.gate_up_proj", "self_attn.attention_with_fused_qkv", "self_attn.qkv_proj"))
    assert result.only_reference == sorted([f"model.layers.{i}.{p}" for i in LAYERS for p in (
        "mlp.act_fn", "mlp.gate_proj", "mlp.up_proj", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")]
        + ["model.rotary_emb"])
    assert "only the probe has 6 paths" in result.verdict()
    # skip= leaves shared paths out (where two implementations define a path differently)
    skipped = compare_generation(probe, reference=hf, skip=["model.embed_tokens", "*.mlp"])
    assert skipped.skipped == ["model.embed_tokens"] + [f"model.layers.{i}.mlp" for i in LAYERS]
    assert list(skipped.table()["compared"]) == [shared - 1 - CONFIG.num_hidden_layers] * STEPS


def test_a_wrong_weight_is_found_at_its_path(hf):
    """The comparison can fail: one layer's down projection perturbed in the build only."""
    weights = demo_mlc.mlc_weights(hf)
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"] * 1.05
    probe = build(weights)
    probe.generate(PROMPT, 2)
    result = compare_generation(probe, reference=hf)
    assert not result
    assert result.first_divergent == (0, "module:model.layers.1.mlp.down_proj")
    assert result.by_path()["path"][0] == "model.layers.1.mlp.down_proj"


def test_kv_cache_arguments_and_refusals(probe):
    tokens = probe.generations[-1].tokens
    assert probe.generate(PROMPT, 3, kv_cache={"prefill_chunk_size": 8, "max_total_seq_len": 16}) == tokens[:3]
    assert probe.generations[-1].kv_cache["max_total_seq_len"] == 16
    # a config with a sliding window: the cache made with one, the sequence's window enabled as MLC's
    # runtime does (a window longer than the sequence: the same tokens)
    probe.serving["sliding_window_size"] = 32
    try:
        assert probe.generate(PROMPT, 3) == tokens[:3]
        assert probe.generations[-1].kv_cache["support_sliding_window"] == 1
    finally:
        del probe.serving["sliding_window_size"]
    with pytest.raises(InputError, match=r"kv_cache=\{'pages': \.\.\.\}: create_tir_paged_kv_cache takes "
                                         r"max_batch_size, max_total_seq_len"):
        probe.generate(PROMPT, 2, kv_cache={"pages": 8})
    with pytest.raises(InputError, match="longer than the KV cache holds .max_total_seq_len=6.: pass kv_cache="):
        probe.generate(PROMPT, 2, kv_cache={"max_total_seq_len": 6})
    with pytest.raises(InputError, match="longer than the prefill chunk .4.: pass kv_cache="):
        probe.generate(PROMPT, 2, kv_cache={"prefill_chunk_size": 4})
    with pytest.raises(InputError, match=r"token id 128 is outside the vocabulary \(0\.\.127"):
        probe.generate(np.array([[5, 128]]), 2)


def test_a_model_without_mlc_functions_is_refused_in_one_line():
    from support.nn_llama import LlamaForCausalLM

    model = LlamaForCausalLM(CONFIG)  # prefill/decode take token ids; no embed
    probe = Probe.from_nn(model, model.get_default_spec(), pipeline="default")
    with pytest.raises(ProbeError, match="lacks embed$"):
        probe.generate(PROMPT, 2)
    with pytest.raises(InputError, match="pass reference=hf_model"):
        compare_generation(probe)


def plain_vm_logits(probe, weights: list, tokens: list[int]) -> list[np.ndarray]:
    """MLC's protocol through a plain VM of the same executable: each step's logits."""
    vm = relax.VirtualMachine(probe.built.executable, tvm.cpu())
    f = tvm.get_global_func
    cache = vm["create_tir_paged_kv_cache"](ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    logits, feed = [], PROMPT[0].astype("int32")
    for i in range(len(tokens)):
        embedding = vm["embed"](tvm.runtime.tensor(feed), weights)
        n = embedding.shape[0]
        f("vm.builtin.kv_state_begin_forward")(cache, ST([0]), ST([n]))
        out = vm["prefill" if i == 0 else "decode"](embedding._create_view((1, n, CONFIG.hidden_size)), cache,
                                                     weights)
        f("vm.builtin.kv_state_end_forward")(cache)
        logits.append(out[0].numpy())
        feed = np.array([tokens[i]], "int32")
    return logits


@pytest.mark.slow
@pytest.mark.parametrize("encode_format", ["raw", "f32-to-bf16"])
def test_weights_from_a_tensor_cache_bit_exact_against_a_plain_vm(hf, tmp_path, encode_format):
    from tvm.contrib import tvmjs

    folder = tmp_path / "weights"
    tvmjs.dump_tensor_cache(demo_mlc.mlc_weights(hf), str(folder), encode_format=encode_format,
                            show_progress=False)
    probe = build(folder)
    tokens = probe.generate(PROMPT, 3)
    loaded, _ = tvmjs.load_tensor_cache(str(folder / "tensor-cache.json"), tvm.cpu())
    model = demo_mlc.LlamaForCausalLM(CONFIG)
    weights = [loaded[name] for name, _ in model.named_parameters()]
    for step, logits in enumerate(plain_vm_logits(probe, weights, tokens)):
        np.testing.assert_array_equal(probe.get("lm_head", step=step), logits)
    if encode_format == "raw":  # the float weights: transformers' tokens
        assert tokens == hf_greedy(hf, PROMPT, 3)
