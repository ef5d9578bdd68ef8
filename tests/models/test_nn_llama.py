"""A 2-layer Llama written with relax.frontend.nn and TVM's paged KV cache (tests/support/nn_llama.py),
weights from a seeded HF LlamaForCausalLM: prefill + 3 decode steps through Probe.from_nn,
every decoder-layer module path against HF forward hooks at every step, both pipelines."""
import os

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from support.nn_llama import LlamaConfig, LlamaForCausalLM, hf_llama, mlc_weights  # noqa: E402
from tvm_probe import Probe  # noqa: E402
from tvm_probe.probe.calls import compare_calls  # noqa: E402
from tvm_probe.core.errors import ModelError, UnknownNameError  # noqa: E402

CONFIG = LlamaConfig()


def native_available() -> bool:
    from tvm_probe.capture import native

    try:
        native.load()
    except native.NativeUnavailable:
        return False
    return True


PROMPT = np.array([[5, 17, 99, 3, 64]], dtype="int32")
DECODE_STEPS = 3
ST = tvm.runtime.ShapeTuple


@pytest.fixture(scope="module")
def hf():
    return hf_llama(CONFIG, seed=0)


def hf_steps(hf, tokens):
    """Per step (prefill, then one token each): ``{module path: output}`` from forward hooks,
    the qkv projection as MLC's model computes it (q, k, v concatenated) and the attention
    output (the input of o_proj, per head), plus the K/V HF's cache holds after the step."""
    from transformers import DynamicCache

    records, handles = {}, []
    for path, module in hf.named_modules():
        if not path:
            continue

        def hook(_m, inputs, output, path=path):
            out = output[0] if isinstance(output, tuple) else output
            if not isinstance(out, torch.Tensor):  # the whole model: a ModelOutput
                return
            records[path] = out.detach().numpy().copy()
            if path.endswith(".o_proj"):
                x = inputs[0].detach().numpy()
                records[path + ":input"] = x.reshape(*x.shape[:2], CONFIG.num_attention_heads, -1)
        handles.append(module.register_forward_hook(hook))
    steps, cache = [], DynamicCache(config=hf.config)
    try:
        with torch.no_grad():
            for ids in tokens:
                records.clear()
                hf(torch.tensor(ids.astype("int64")), cache=cache, use_cache=True)
                step = dict(records)
                for i in range(CONFIG.num_hidden_layers):
                    p = f"model.layers.{i}.self_attn"
                    step[f"{p}.qkv_proj"] = np.concatenate([step[f"{p}.{x}_proj"] for x in "qkv"], axis=-1)
                    step[f"model.layers.{i}.mlp.gate_up_proj"] = np.concatenate(
                        [step[f"model.layers.{i}.mlp.gate_proj"], step[f"model.layers.{i}.mlp.up_proj"]], axis=-1)
                    layer = cache.layers[i]
                    # HF: (batch, kv heads, length, head dim); TVM's cache: (length, kv heads, head dim)
                    step[f"paged_kv_cache.layers.{i}.k"] = layer.keys[0].numpy().transpose(1, 0, 2)
                    step[f"paged_kv_cache.layers.{i}.v"] = layer.values[0].numpy().transpose(1, 0, 2)
                steps.append(step)
    finally:
        for h in handles:
            h.remove()
    return steps


def run_tvm(probe, tokens):
    """create_paged_kv_cache, then prefill and decode steps with the cache protocol around each."""
    f = tvm.get_global_func
    cache = probe.call("create_paged_kv_cache", ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    logits = []
    for k, ids in enumerate(tokens):
        f("vm.builtin.kv_state_begin_forward")(cache, ST([0]), ST([ids.shape[1]]))
        out, cache = probe.call("prefill" if k == 0 else "decode", ids, cache)
        f("vm.builtin.kv_state_end_forward")(cache)
        logits.append(out.numpy())
    return logits


def greedy_tokens(hf):
    """The prompt, then the tokens HF's greedy decoding picks (one per decode step)."""
    tokens, seq = [PROMPT], PROMPT.astype("int64")
    with torch.no_grad():
        for _ in range(DECODE_STEPS):
            nxt = hf(torch.tensor(seq)).logits[0, -1].argmax().item()
            seq = np.concatenate([seq, [[nxt]]], axis=1)
            tokens.append(np.array([[nxt]], dtype="int32"))
    return tokens


# HF has no module for the attention core: the input of o_proj is the same tensor
NAME_MAP = {f"model.layers.{i}.self_attn.o_proj:input": f"model.layers.{i}.self_attn.attention_with_fused_qkv"
            for i in range(CONFIG.num_hidden_layers)}


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_llama_every_layer_path_matches_hf_at_every_step(hf, pipeline):
    model = LlamaForCausalLM(CONFIG)
    probe = Probe.from_nn(model, model.get_default_spec("plain"), params=mlc_weights(hf), pipeline=pipeline)
    assert set(probe.functions) == {"create_paged_kv_cache", "prefill", "decode"}
    tokens = greedy_tokens(hf)
    logits = run_tvm(probe, tokens)
    steps = hf_steps(hf, tokens)
    assert list(probe.calls["function"]) == ["create_paged_kv_cache", "prefill"] + ["decode"] * DECODE_STEPS

    layer_paths = sorted({p for p in probe.functions["decode"].imported.module_paths if p.startswith("model.layers.")})
    # every decoder-layer module of our model (qkv_proj and gate_up_proj as MLC fuses them)
    assert len(layer_paths) == CONFIG.num_hidden_layers * 10, layer_paths
    references = []
    for step in steps:
        ref = {p: step[p] for p in layer_paths if not p.endswith(".attention_with_fused_qkv")}
        ref.update({p: step[p] for p in ("model.embed_tokens", "model.norm", "lm_head")})
        ref.update({name: step[name] for name in NAME_MAP})
        ref.update({k: v for k, v in step.items() if k.startswith("paged_kv_cache.")})
        references.append(ref)
    kv_names = [k for k in references[0] if k.startswith("paged_kv_cache.")]
    module_refs = [{k: v for k, v in r.items() if k not in kv_names} for r in references]
    report = compare_calls(probe, module_refs, name_map=NAME_MAP, atol=1e-5, rtol=1e-4)
    assert report, report.verdict()
    table = report.table()
    assert list(table["compared"]) == [len(module_refs[0])] * len(tokens)
    for k, (got, step) in enumerate(zip(logits, steps)):
        np.testing.assert_allclose(got, step["lm_head"], atol=1e-5, rtol=1e-4)
        for name in kv_names:  # the cache's K/V after each call, by name
            np.testing.assert_allclose(probe.get(name, call=k + 1), references[k][name], atol=1e-5, rtol=1e-4)
    # names resolve within the call's function; parameters by their dotted names
    np.testing.assert_array_equal(probe.get("model.layers.1.mlp.down_proj.weight", call=2),
                                  mlc_weights(hf)["model.layers.1.mlp.down_proj.weight"])
    assert probe.get("model.layers.0.self_attn", call=1).shape == (1, PROMPT.shape[1], CONFIG.hidden_size)
    assert probe.get("model.layers.0.self_attn").shape == (1, 1, CONFIG.hidden_size)  # last call: decode
    # decode's shapes are static: the native instrument runs it, lowering's helper kernel (the
    # attention's sm_scale as compute_symbolic_expr, once per layer) timed as extra plan sites
    decode = probe.functions["decode"]
    assert decode.kernel_map.fixed_helpers == {"compute_symbolic_expr": CONFIG.num_hidden_layers}
    if native_available() and os.environ.get("TVM_PROBE_INSTRUMENT", "auto") != "python":
        assert probe.call_record(2).capture.instrument == "native"  # the first decode checks every call
        # later ones run through native hooks (the KV cache's attention builtin among them)
        assert probe.call_record().capture.instrument == "kernel hook"
    with pytest.raises(UnknownNameError, match="inside TVM's paged KV cache"):
        probe.get("fused_rope")  # the cache's RoPE kernel, called from C++


@pytest.mark.slow
def test_llama_packed_weights_passed_by_the_caller(hf):
    """param_mode packed, no params=: the caller passes the weights as one list (as MLC does)."""
    model = LlamaForCausalLM(CONFIG)
    probe = Probe.from_nn(model, model.get_default_spec("packed"), pipeline="fused")
    weights = mlc_weights(hf)
    names = [n for n, _ in model.named_parameters()]
    packed = [tvm.runtime.tensor(weights[n]) for n in names]
    f = tvm.get_global_func
    cache = probe.call("create_paged_kv_cache", ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    f("vm.builtin.kv_state_begin_forward")(cache, ST([0]), ST([PROMPT.shape[1]]))
    out, cache = probe.call("prefill", PROMPT, cache, packed)
    f("vm.builtin.kv_state_end_forward")(cache)
    step = hf_steps(hf, [PROMPT])[0]
    np.testing.assert_allclose(out.numpy(), step["lm_head"], atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(probe.get("model.layers.1"), step["model.layers.1"], atol=1e-5, rtol=1e-4)
    # a packed weight, by its dotted name, from the list the call was given
    np.testing.assert_array_equal(probe.get("model.layers.0.self_attn.o_proj.weight"),
                                  weights["model.layers.0.self_attn.o_proj.weight"])


def test_from_nn_bad_params_are_one_line_errors():
    model = LlamaForCausalLM(CONFIG)
    with pytest.raises(ModelError, match="params has weights the model does not: 'model.layers.9.w'"):
        Probe.from_nn(model, model.get_default_spec("plain"), params={"model.layers.9.w": np.zeros(1)})
    with pytest.raises(ModelError, match="pass a tvm.relax.frontend.nn.Module"):
        Probe.from_nn(object(), {})


@pytest.mark.slow
def test_llama_dump_keeps_every_call(hf, tmp_path):
    """A dump after prefill + decode: one single-run dump per call, read back without TVM's VM."""
    import json

    from tvm_probe import load_dump

    model = LlamaForCausalLM(CONFIG)
    probe = Probe.from_nn(model, model.get_default_spec("plain"), params=mlc_weights(hf), pipeline="fused")
    tokens = greedy_tokens(hf)[:2]
    run_tvm(probe, tokens)
    root = probe.dump(tmp_path / "llama")
    listed = json.loads((root / "calls.json").read_text())["calls"]
    assert [c["function"] for c in listed] == ["create_paged_kv_cache", "prefill", "decode"]
    steps = hf_steps(hf, tokens)
    for k, step in ((1, steps[0]), (2, steps[1])):
        dump = load_dump(root / listed[k]["folder"])
        np.testing.assert_allclose(dump.get("model.layers.1.mlp"), step["model.layers.1.mlp"], atol=1e-5, rtol=1e-4)
        # symbolic seq_len: the prefill dump's nodes have that call's sizes
        assert dump.get("model.layers.0.self_attn").shape == probe.get("model.layers.0.self_attn", call=k).shape


@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_selected_layers_through_prepared_calls_match_hf_at_every_step(hf, pipeline):
    """A decode loop as deployments write it (token ids as device tensors, one selection at every
    step) runs its later steps through the call its first hooked step prepared (FastCall); every
    selected module path at every step still equals HF's forward hooks."""
    model = LlamaForCausalLM(CONFIG)
    probe = Probe.from_nn(model, model.get_default_spec("plain"), params=mlc_weights(hf), pipeline=pipeline)
    # more steps than the capture's pool of two arenas, so later steps' copies are cut from chunks
    tokens = greedy_tokens(hf) + [np.array([[t]], dtype="int32") for t in (11, 42, 77, 5)]
    selected = ["model.layers.0.self_attn", "model.layers.1.mlp", "model.layers.1.self_attn.qkv_proj"]
    f = tvm.get_global_func
    cache = probe.call("create_paged_kv_cache", ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    for k, ids in enumerate(tokens):
        f("vm.builtin.kv_state_begin_forward")(cache, ST([0]), ST([ids.shape[1]]))
        probe.call("prefill" if k == 0 else "decode", tvm.runtime.tensor(ids), cache, capture=selected)
        f("vm.builtin.kv_state_end_forward")(cache)
    assert probe.functions["decode"]._executor.fast_calls, "the later decode steps did not take the prepared call"
    report = compare_calls(probe, [{p: step[p] for p in selected} for step in hf_steps(hf, tokens)],
                           atol=1e-5, rtol=1e-4)
    assert report, report.verdict()
    assert list(report.table()["compared"]) == [len(selected)] * len(tokens)
