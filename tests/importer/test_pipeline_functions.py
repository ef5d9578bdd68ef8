"""Pipelines that rename, add and remove functions (issue 53): the probe follows the executable
as built.

MLC-LLM's ``DispatchKVCacheCreation`` (run by every MLC build) drops the exported
``create_paged_kv_cache`` and adds ``create_tir_paged_kv_cache``, which creates TVM's paged KV
cache with its TIR kernels.  The pass is our own (``tvm_probe.importer.demo_mlc``), written as
MLC's is (a module pass that takes the creator out and builds the new one with a BlockBuilder); the model is the project's nn
Llama (tests/support/nn_llama.py), built with and without the pass in front of TVM's
``default`` pipeline: every module path served without the pass is served with it, equal.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from support.nn_llama import LlamaConfig, LlamaForCausalLM  # noqa: E402
from tvm_probe import Probe  # noqa: E402
from tvm_probe.importer.demo_mlc import DispatchKVCacheCreation as SwapKVCacheCreator  # noqa: E402
from tvm_probe.core.errors import UnknownNameError  # noqa: E402
from tvm_probe.core.sources import Kind, Served  # noqa: E402

CONFIG = LlamaConfig()
ST = tvm.runtime.ShapeTuple
CREATOR_ARGS = (ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
PROMPT = np.array([[5, 17, 99, 3, 64]], dtype="int32")
TOKENS = [PROMPT, np.array([[11]], dtype="int32"), np.array([[42]], dtype="int32")]
NOT_SERVED = (Served.UNKNOWN, Served.UNAVAILABLE)


def renaming(copy: bool):
    """A pass binding ``create_paged_kv_cache`` under the name ``create_tir_paged_kv_cache``:
    the same function with its new global symbol (``copy=False``: its parameters are the same
    Relax variables), or a copy with new variables (structurally equal, but nothing proves it is
    the same function once the pipeline has rewritten it: legalized, before the first snapshot)."""

    @tvm.transform.module_pass(opt_level=0, name="RenameKVCacheCreator")
    def rename(mod, _ctx):
        funcs = {}
        for gv, func in mod.functions.items():
            if gv.name_hint == "create_paged_kv_cache":
                if copy:
                    func = relax.utils.copy_with_new_vars(func)
                gv, func = tvm.ir.GlobalVar("create_tir_paged_kv_cache"), func.with_attr(
                    "global_symbol", "create_tir_paged_kv_cache")
            funcs[gv] = func
        return tvm.IRModule(funcs, attrs=mod.attrs)

    return rename


@pytest.fixture(scope="module")
def weights():
    """Seeded weights under the model's parameter names (no transformers needed)."""
    rng = np.random.default_rng(0)
    model = LlamaForCausalLM(CONFIG)
    return {n: rng.normal(0, 0.3, [int(d) for d in p.shape]).astype("float32") for n, p in model.named_parameters()}


def build(weights, *passes):
    model = LlamaForCausalLM(CONFIG)
    pipeline = tvm.transform.Sequential([*passes, relax.get_pipeline("default")])
    return Probe.from_nn(model, model.get_default_spec("plain"), params=weights, pipeline=pipeline)


def run(probe, creator: str):
    """The creator, then prefill and decode steps with the cache protocol around each."""
    f = tvm.get_global_func
    cache = probe.call(creator, *CREATOR_ARGS)
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    for k, ids in enumerate(TOKENS):
        f("vm.builtin.kv_state_begin_forward")(cache, ST([0]), ST([ids.shape[1]]))
        _, cache = probe.call("prefill" if k == 0 else "decode", ids, cache)
        f("vm.builtin.kv_state_end_forward")(cache)


@pytest.fixture(scope="module")
def plain(weights):
    probe = build(weights)
    run(probe, "create_paged_kv_cache")
    return probe


@pytest.fixture(scope="module")
def swapped(weights):
    probe = build(weights, SwapKVCacheCreator(CONFIG))
    run(probe, "create_tir_paged_kv_cache")
    return probe


def executable_functions(probe) -> set[str]:
    """The functions the VM executable holds, read off its own listing (``@name:``)."""
    return set(re.findall(r"^@(\w+):", probe.built.executable.as_text(), flags=re.M))


def test_functions_are_those_of_the_executable(plain, swapped):
    assert set(plain.functions) == executable_functions(plain) == {"create_paged_kv_cache", "prefill", "decode"}
    assert set(swapped.functions) == executable_functions(swapped) == {"create_tir_paged_kv_cache", "prefill",
                                                                       "decode"}
    assert list(swapped.calls["function"]) == ["create_tir_paged_kv_cache", "prefill", "decode", "decode"]


def test_every_module_path_served_without_the_pass_is_served_and_equal_with_it(plain, swapped):
    compared = 0
    for call, function in enumerate(["create", "prefill", "decode", "decode"]):
        if function == "create":
            continue
        before, after = plain.functions[function], swapped.functions[function]
        paths = before.imported.module_paths
        assert paths, "the nn model records module paths"
        for path in paths:
            if before.served(path) in NOT_SERVED:
                continue
            assert after.served(path) == before.served(path), path
            np.testing.assert_array_equal(swapped.get(path, call=call), plain.get(path, call=call), err_msg=path)
            compared += 1
        for layer in range(CONFIG.num_hidden_layers):  # what the cache holds after the call, by name
            for kv in "kv":
                name = f"paged_kv_cache.layers.{layer}.{kv}"
                np.testing.assert_array_equal(swapped.get(name, call=call), plain.get(name, call=call))
    assert compared >= 3 * CONFIG.num_hidden_layers * 10


def test_a_kernel_of_the_added_creator_is_named_with_what_to_read_instead(swapped):
    with pytest.raises(UnknownNameError) as err:
        swapped.get("fused_rope")
    message = str(err.value)
    assert "\n" not in message
    assert "fused_rope is a TIR kernel inside TVM's paged KV cache, not a source value" in message
    assert "create_tir_paged_kv_cache, a function the pipeline added" in message
    assert "paged_kv_cache.layers.0.k" in message
    assert "model.layers.0.self_attn.attention_with_fused_qkv" in message
    # in every function, whatever call is served
    with pytest.raises(UnknownNameError, match="fused_rope is a TIR kernel"):
        swapped.get("fused_rope", call=1)


def test_the_removed_creator_names_what_the_pipeline_added(swapped):
    said = "the pipeline removed create_paged_kv_cache and added create_tir_paged_kv_cache"
    with pytest.raises(UnknownNameError, match=said):
        swapped.call("create_paged_kv_cache", *CREATOR_ARGS)
    with pytest.raises(KeyError, match=said):
        swapped.functions["create_paged_kv_cache"]
    with pytest.raises(UnknownNameError, match=said):
        swapped.get("create_paged_kv_cache")


def test_values_of_the_added_creator_are_served_by_the_names_the_pipeline_gave_them(swapped):
    creator = swapped.functions["create_tir_paged_kv_cache"]
    tensors = [v.key for v in creator.imported.sources if v.kind is Kind.VALUE]
    assert tensors, "the new creator computes a tensor (the cache's zero RoPE factors)"
    for key in tensors:
        assert creator.served(key) not in NOT_SERVED, key
        np.testing.assert_array_equal(swapped.get(key, call=0), 0)
    with pytest.raises(UnknownNameError, match="computed inside create_tir_paged_kv_cache, which the pipeline added"):
        swapped.get("paged_kv_cache", call=0)  # the cache object it returns: no tensor


def test_a_proven_rename_keeps_the_function_and_its_values_names(weights, plain):
    probe = build(weights, renaming(copy=False))
    assert set(probe.functions) == executable_functions(probe) == {"create_tir_paged_kv_cache", "prefill", "decode"}
    run(probe, "create_tir_paged_kv_cache")
    creator = plain.functions["create_paged_kv_cache"]
    renamed = probe.functions["create_tir_paged_kv_cache"]
    assert set(renamed.imported.sources.values) == set(creator.imported.sources.values)  # the imported names
    for key in creator.imported.sources.values:
        assert renamed.served(key) == creator.served(key), key
    np.testing.assert_array_equal(probe.get("model.layers.1.mlp", call=3), plain.get("model.layers.1.mlp", call=3))
    assert probe.functions.executable.renamed == {"create_paged_kv_cache": "create_tir_paged_kv_cache"}
    with pytest.raises(UnknownNameError, match="the pipeline renamed create_paged_kv_cache to create_tir_paged_kv_cache "
                                               r"\(the same function: its parameters are the same Relax variables\)"):
        probe.call("create_paged_kv_cache", *CREATOR_ARGS)


def test_a_copy_under_another_name_is_not_taken_for_the_same_function(weights):
    """New variables, and a body the pipeline legalized before the first snapshot: nothing
    proves it is the old creator, so it is a function the pipeline added (never a guess)."""
    probe = build(weights, renaming(copy=True))
    assert set(probe.functions) == {"create_tir_paged_kv_cache", "prefill", "decode"}
    executable = probe.functions.executable
    assert executable.renamed == {} and executable.removed == ("create_paged_kv_cache",)
    assert executable.added == ("create_tir_paged_kv_cache",)
    with pytest.raises(UnknownNameError, match="the pipeline removed create_paged_kv_cache and added"):
        probe.call("create_paged_kv_cache", *CREATOR_ARGS)
