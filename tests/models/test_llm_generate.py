"""LLMs generating with a KV cache (issue 24): ``Probe.from_hf``, ``generate``, per-call comparison.

The models are tiny transformers decoders built from configs in code (tests/support/hf_models.py).  The
references are independent of TVM: transformers' own ``generate`` (greedy) for the tokens, and
the eager model run through the same functional cache for every module's output per call.
Values answer to the model's own names (``model.layers.0.self_attn``, ``lm_head``,
``model.embed_tokens.weight``: its ``named_modules()`` / ``named_parameters()``), never to
those of the wrapper ``Probe.from_hf`` exports it in.
"""
from __future__ import annotations

import gc
import re
import types
import weakref

import numpy as np
import pytest
from support.processes import run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvm_probe import InputError, ModelError, Probe, UnknownNameError, ValueUnavailableError  # noqa: E402
from tvm_probe.probe import calls as probe_calls  # noqa: E402
from tvm_probe.probe.calls import CallArguments, compare_call, compare_calls  # noqa: E402
from tvm_probe.comparison.verdict import PassedComparison, compare  # noqa: E402
from tvm_probe.llm import compare_generation, reference_generate  # noqa: E402

from support import SUPPORT  # noqa: E402
from support.hf_models import decoder_ids, forward_hook_outputs, hf_decoder  # noqa: E402

STEPS, PROMPT = 6, 8


def _hf_tokens(model, ids, steps: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def _check_generation(family: str, probe) -> None:
    model, ids = hf_decoder(family), decoder_ids(0, batch=1, seq=PROMPT)
    tokens = probe.generate(ids, steps=STEPS)
    assert tokens == _hf_tokens(model, ids, STEPS), family
    assert list(probe.calls["function"])[-STEPS:] == ["prefill"] + ["decode"] * (STEPS - 1)
    result = compare_generation(probe)
    assert result, result.verdict()
    table = result.table()
    layers = model.config.num_hidden_layers
    for call, comparison in [(k, c) for k, _, c in result.calls.by_call]:
        names = {v.name for v in comparison.values}
        # every decoder layer and its attention, at every step, against the eager model
        stack, attention = ("transformer.h", "attn") if family == "gpt2" else ("model.layers", "self_attn")
        for i in range(layers):
            assert {f"module:{stack}.{i}", f"module:{stack}.{i}.{attention}"} <= names, (call, i)
        assert "module:lm_head" in names
    assert (table["compared"] > 20).all() and (table["diverged"] == 0).all()


@pytest.fixture(scope="module")
def family_probe():
    """``family_probe(family)``: one ``default`` probe per family, built on its first use and
    shared by this module's tests (a build is most of a test's time; each test checks its own
    generation, by the calls that generation made)."""
    made = {}

    def probe(family: str):
        if family not in made:
            made[family] = Probe.from_hf(hf_decoder(family), pipeline="default", max_len=32)
        return made[family]
    return probe


@pytest.fixture(scope="module")
def llama_probe(family_probe):
    return family_probe("llama")


@pytest.fixture(scope="module")
def fused_llama_probe():
    return Probe.from_hf(hf_decoder("llama"), pipeline="fused", max_len=32)


@pytest.mark.slow
def test_llama_under_the_fused_pipeline_serves_every_value_of_every_step(llama_probe, fused_llama_probe):
    """The fused decode step's kernels take the past length as ``R.Shape([past])`` (FuseOps gives
    each fused function symbols of its own): the kernel map follows every value through it and
    recomputation feeds that run's length.  Every module path of every step equals eager, and
    every value (fx names included) equals the unfused build's (the ``default`` pipeline, where
    each value is its own kernel's output), nothing left unchecked."""
    model, ids, probe = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT), fused_llama_probe
    steps = 3  # the prefill and two decode steps: the second decode reads a past the first wrote
    assert probe.generate(ids, steps=steps) == _hf_tokens(model, ids, steps)
    result = compare_generation(probe)
    assert result, result.verdict()
    assert (result.table()["compared"] >= 30).all()  # every module path, at every step
    assert llama_probe.generate(ids, steps=steps) == probe.generate(ids, steps=steps)
    for fused_call, default_call in zip(probe.hf.generations[-1].calls, llama_probe.hf.generations[-1].calls):
        with probe.in_call(fused_call) as fused, llama_probe.in_call(default_call) as unfused:
            against_unfused = compare(fused, unfused)
            assert against_unfused and len(against_unfused.values) > 250, (fused_call, against_unfused.verdict())


def _served_references(probe, generation, reference) -> list[dict]:
    """Each step's eager values by the names they have in that call (as compare_generation asks them)."""
    from tvm_probe.llm.compare import _served

    return [_served(probe, k, values, {}) for k, values in zip(generation.calls, reference.values)]


def _assert_same_comparison(got, expected, where) -> None:
    """Two Comparisons of one call hold the same verdict, value by value (the figures to 1e-12:
    numpy may sum a value's elements in another order where it starts elsewhere in a pass)."""
    assert bool(got) == bool(expected) and len(got.values) == len(expected.values), where
    for a, b in zip(got.values, expected.values):
        for field, x in a.__dict__.items():
            y = b.__dict__[field]
            if isinstance(x, float):
                assert x == pytest.approx(y, rel=1e-12, abs=1e-300, nan_ok=True), (where, a.name, field)
            else:
                assert x == y, (where, a.name, field)
    assert (got.unchecked, got.dead, got.names, got.tolerance_rule) == \
        (expected.unchecked, expected.dead, expected.names, expected.tolerance_rule), where
    for first in ("first_divergent", "first_nonfinite"):
        assert getattr(getattr(got, first), "name", None) == getattr(getattr(expected, first), "name", None), where


def _spoiled(reference: dict, rng) -> dict:
    """A random part of ``reference``, some values made what the columns must not take as they
    are: out of tolerance, a NaN, float64, another shape, a torch tensor, integers."""
    names = [n for n in reference if rng.random() < 0.7]
    out = {n: reference[n] for n in names}
    spoil = {
        "off": lambda a: a + np.float32(0.01),
        "nan": lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.float32(np.nan), a),
        "float64": lambda a: a.astype(np.float64),
        "reshaped": lambda a: a.reshape(-1),
        "torch": lambda a: torch.from_numpy(np.ascontiguousarray(a)),
        "int": lambda a: a.astype(np.int32),
    }
    for how, name in zip(rng.permutation(list(spoil)), rng.permutation(names)):
        if rng.random() < 0.6:
            out[name] = spoil[how](out[name])
    return out


@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_calls_compared_as_columns_equal_each_call_compared_alone(pipeline, llama_probe, fused_llama_probe,
                                                                   monkeypatch):
    """compare_calls reads the kernel outputs a decode step's arena holds as columns and makes
    their records when read (issue 35); each call's Comparison equals compare_call's, which
    serves and measures value by value: on the generation as it is (every value taken as a
    column from the second decode step on), and on random selections of each step's values
    with some spoiled (out of tolerance, NaN, float64, reshaped, torch, int) across steps."""
    probe = llama_probe if pipeline == "default" else fused_llama_probe
    ids = decoder_ids(0, batch=1, seq=PROMPT)
    probe.generate(ids, steps=5)
    generation = probe.hf.generations[-1]
    references = _served_references(probe, generation, reference_generate(probe, ids, 5, tokens=generation.tokens))
    as_columns = []
    measure = probe_calls.measure_columns
    monkeypatch.setattr(probe_calls, "measure_columns",
                        lambda parts: as_columns.append(sum(len(p.refs) for p in parts)) or measure(parts))
    together = compare_calls(probe, references, calls=generation.calls)
    # (unfused, every value is a kernel's output: decode steps 2-4 take all as columns; fused, most
    # are recomputed from a fused kernel's inputs, served one by one)
    assert together and as_columns[-1] >= (3 * 25 if pipeline == "default" else 3), as_columns
    for (k, _, comparison), reference in zip(together.by_call, references):
        alone = compare_call(probe, reference, call=k)
        if pipeline == "default" and k >= generation.calls[2]:
            assert type(comparison) is PassedComparison, k  # (its records made when read: now)
        _assert_same_comparison(comparison, alone, k)
    rng, verdicts = np.random.default_rng(35), set()
    for trial in range(3):
        spoiled = [_spoiled(reference, rng) for reference in references]
        together = compare_calls(probe, spoiled, calls=generation.calls)
        assert as_columns[-1] > 0, as_columns
        for (k, _, comparison), reference in zip(together.by_call, spoiled):
            _assert_same_comparison(comparison, compare_call(probe, reference, call=k), (trial, k))
            verdicts |= {value.passed for value in comparison.values}
    assert verdicts == {True, False}  # (the spoiled values were there to be found, among those that pass)


@pytest.mark.parametrize("pipeline", ["default", "fused"])
def test_a_generation_compare_reads_its_decode_steps_from_the_forward_as_each_step_alone_would(
        pipeline, llama_probe, fused_llama_probe, monkeypatch):
    """compare_generation takes decode steps 2 on from the teacher-forced forward at once, each
    module's steps one block (issue 35): every step's Comparison equals compare_calls' of that
    step's own reference dict, as generated, and with one module's value spoiled at one step
    (out of tolerance at step 3, a NaN at step 4).  Fused, most values are recomputed: the steps
    are compared one at a time, and equal too."""
    from tvm_probe.llm import compare as llm_compare

    probe = llama_probe if pipeline == "default" else fused_llama_probe
    ids, steps = decoder_ids(0, batch=1, seq=PROMPT), 6
    probe.generate(ids, steps=steps)
    generation = probe.hf.generations[-1]
    stacked = []
    at_once = llm_compare.compare_stacked
    monkeypatch.setattr(llm_compare, "compare_stacked", lambda *a: stacked.append(at_once(*a)) or stacked[-1])
    for spoil in (None, ("model.layers.1.mlp.down_proj", 3, 0.01), ("model.layers.0.self_attn.q_proj", 4, np.nan)):
        reference = reference_generate(probe, ids, steps, tokens=generation.tokens)
        prompt_len, outputs = reference.forward
        if spoil is not None:
            path, step, value = spoil
            array, axis = outputs[path]
            array[(0,) * axis + (prompt_len + step - 1,)].flat[0] += value
        result = compare_generation(probe, reference=reference)
        assert (stacked[-1] is not None) == (pipeline == "default"), pipeline
        expected = compare_calls(probe, _served_references(probe, generation, reference), calls=generation.calls)
        assert [k for k, _, _ in result.calls.by_call] == generation.calls
        for (k, _, got), (_, _, alone) in zip(result.calls.by_call, expected.by_call, strict=True):
            _assert_same_comparison(got, alone, (spoil, k))
        assert result.first_divergent == (None if spoil is None else (spoil[1], f"module:{spoil[0]}"))
        if spoil is not None and np.isnan(spoil[2]):  # (said where it is: measured one by one)
            assert "NaN" in result.calls.by_call[spoil[1]].comparison.first_divergent.note
    # a comparison kept after its calls are forgotten holds none of their captures
    probe.generate(ids, steps=steps)
    result = compare_generation(probe)
    outputs = probe.call_record(probe.hf.generations[-1].calls[-1]).capture.outputs
    outputs = weakref.ref(getattr(outputs, "own", outputs))
    probe.forget_calls()
    gc.collect()
    assert outputs() is None
    assert result and len(result.calls.by_call[-1].comparison.values) > 25


def test_llama_generates_transformers_tokens_and_every_step_equals_eager(llama_probe):
    _check_generation("llama", llama_probe)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "mistral", "gpt2"])
def test_every_family_generates_transformers_tokens_and_every_step_equals_eager(family, family_probe):
    _check_generation(family, family_probe(family))


def test_values_answer_by_call_to_module_paths_fx_names_and_parameters(llama_probe):
    model, ids, probe = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT), llama_probe
    probe.generate(ids, steps=3)
    first = len(probe.calls) - 3
    reference = reference_generate(model, ids, 3)
    for step in range(3):
        expected = reference.values[step]["model.layers.0.self_attn"]
        got = probe.get("model.layers.0.self_attn", call=first + step)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert probe.get("model.layers.1", call=first + 2).shape == (1, 1, 64)  # a decode step: one token
    assert probe.get("model.layers.1", call=first).shape == (1, PROMPT, 64)
    weight = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(probe.get(weight, call=first + 1), model.state_dict()[weight].numpy())
    with pytest.raises(InputError, match=r"longer than max_len=32"):
        probe.generate(ids, steps=25)


#: The names of each model (``named_modules()``) that had no value when the probe named values
#: by its wrapper (``model.`` + the name; measured at commit 23b5875, before the names became the
#: model's own): the ``ModuleList`` of layers, and GPT-2's attention dropouts, which its SDPA
#: attention never calls.  Every other name, module, parameter or buffer, answered.
NO_VALUE_BEFORE = {"gpt2": {"transformer.h", "transformer.h.0.attn.attn_dropout", "transformer.h.1.attn.attn_dropout"}}
NAME_STEPS = 3  # the prefill and two decode steps
#: torch's own marker for nodes its passes add without a module stack (``sym_size``): no module
#: of the model, and not the wrapper's; the importer lists it as it is (as for any torch model).
TORCH_NO_STACK = "_empty_nn_module_stack_from_metadata_hook"


def _check_the_models_own_names(family: str, probe) -> int:
    """Every name ``named_modules()``, ``named_parameters()`` and ``named_buffers()`` of the model
    give answers at every step of a generation: a module with the output a forward hook sees
    there, a weight with its tensor; the model itself (``''``) names nothing, its logits are
    ``lm_head``'s.  The names with no value (each with its reason) are the eager model's modules
    no forward hook fires on, and exactly those that had none under the wrapper's names.
    Returns how many (name, step) lookups answered (and prints it, per kind of name)."""
    model = probe.hf.step.model  # the model given to from_hf
    ids = decoder_ids(0, batch=1, seq=PROMPT)
    tokens = probe.generate(ids, steps=NAME_STEPS)
    calls = probe.hf.generations[-1].calls
    hooked = forward_hook_outputs(model, lambda: reference_generate(probe, ids, NAME_STEPS))
    assert len(hooked) == NAME_STEPS
    modules = [path for path, _ in model.named_modules() if path]
    weights = {name: t.detach().numpy() for name, t in [*model.named_parameters(remove_duplicate=False),
                                                         *model.named_buffers()]}
    answered, no_value = 0, set()
    for step, call in enumerate(calls):
        for name in modules + list(weights):
            try:
                got = probe.get(name, call=call)
            except (UnknownNameError, ValueUnavailableError) as err:
                assert isinstance(err, ValueUnavailableError) or " has no value: " in str(err), (family, str(err))
                no_value.add(name)
                continue
            if name in weights:
                np.testing.assert_array_equal(got, weights[name], err_msg=f"{family} {name}")
            else:
                assert name in hooked[step], f"{family} step {step}: {name} answers, but eager never ran it"
                np.testing.assert_allclose(got, hooked[step][name], atol=1e-4, err_msg=f"{family} step {step} {name}")
            answered += 1
        np.testing.assert_allclose(probe.get("lm_head", call=call), hooked[step][""], atol=1e-4)
    print(f"{family}: {len(modules) + len(weights)} names a step ({len(modules)} modules, {len(weights)} "
          f"parameters and buffers), {answered} lookups over {NAME_STEPS} steps answered, no value: {sorted(no_value)}")
    never_ran = {path for path in modules if not any(path in values for values in hooked)}
    assert no_value == never_ran == NO_VALUE_BEFORE.get(family, {"model.layers"}), family
    assert tokens == reference_generate(probe, ids, NAME_STEPS).tokens
    _assert_no_wrapper_name_is_listed(probe, model, family)
    return answered


def _assert_no_wrapper_name_is_listed(probe, model, family: str) -> None:
    """Listings (each function's sources, a generation's comparison) name the model's own modules
    and weights, the weights' fx names as exporting the model itself gives them
    (``p_model_norm_weight``): nothing of the wrapper.  GPT-2's own names hold no ``model``, so
    there the word appears nowhere."""
    modules = {path for path, _ in model.named_modules()}
    weights = {n for n, _ in [*model.named_parameters(remove_duplicate=False), *model.named_buffers()]}
    result = compare_generation(probe)
    assert result, result.verdict()
    compared = {v.name for _, _, c in result.calls.by_call for v in c.values}
    assert {n.removeprefix("module:") for n in compared} <= modules
    for function, function_probe in probe.functions.items():
        table = function_probe.sources
        paths = {n.removeprefix("module:") for names in table["other_names"] for n in names if n.startswith("module:")}
        assert paths - {TORCH_NO_STACK} <= modules, (function, sorted(paths - modules))
        params = table[table["kind"] == "param"]
        assert set(params["tensor"]) <= weights, (function, sorted(set(params["tensor"]) - weights))
        for name, tensor in zip(params["name"], params["tensor"]):
            assert name in (f"p_{re.sub(r'[^a-zA-Z0-9]', '_', tensor).lower()}",
                            f"b_{re.sub(r'[^a-zA-Z0-9]', '_', tensor).lower()}"), (name, tensor)
        if family == "gpt2":
            listed = " ".join(map(str, table.values.ravel())) + result.table().to_string()
            assert "model" not in listed, function


def test_llama_answers_to_its_own_module_and_parameter_names_at_every_step(llama_probe):
    assert _check_the_models_own_names("llama", llama_probe) == NAME_STEPS * (31 + 21 + 2)  # modules, weights, buffers


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2", "mistral", "gpt2", "phi3", "gemma"])
def test_every_family_answers_to_its_own_module_and_parameter_names_at_every_step(family, family_probe):
    assert _check_the_models_own_names(family, family_probe(family)) >= NAME_STEPS * 40


def test_a_decode_loop_fed_numpy_takes_the_prepared_call_and_equals_eager(llama_probe, monkeypatch):
    """A user's own decode loop with ``capture=None`` (token and position as numpy, the cache as
    the tensors the last call returned): the later steps take the prepared call, which copies
    the numpy arguments into tensors it holds; the logits still equal the eager model's at
    every step, and a bad argument still gets its one-line error."""
    model, ids, probe = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT), llama_probe
    shape = probe.hf.shape
    past = [np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for _ in range(2 * shape.layers)]
    out = probe.call("prefill", ids.numpy(), np.arange(PROMPT, dtype=np.int64)[None, :], *past, capture=None)
    tokens = [int(out[0].numpy()[0, -1].argmax())]
    logits, converted = [], []  # the steps whose arguments went through the slow path's conversion
    slow = CallArguments.__call__
    monkeypatch.setattr(CallArguments, "__call__", lambda self, args: converted.append(len(logits)) or slow(self, args))
    for k in range(5):
        out = probe.call("decode", np.array([[tokens[-1]]], np.int64), np.array([[PROMPT + k]], np.int64),
                         *out[1:], capture=None)
        logits.append(out[0].numpy()[0, -1])
        tokens.append(int(logits[-1].argmax()))
    # a function's first call runs through TVM's instrument, the next through the hooks, which
    # prepares the call the later ones take (the probe may have made those calls before)
    assert not [k for k in converted if k >= 2], f"steps {converted} did not take the prepared call"
    with torch.no_grad():
        eager = model(torch.tensor(np.concatenate([ids.numpy()[0], tokens[:-1]])[None, :])).logits[0]
    for k, got in enumerate(logits):
        np.testing.assert_allclose(got, eager[PROMPT + k].numpy(), atol=1e-4, err_msg=f"decode step {k}")
    with pytest.raises(InputError, match=r"int64"):
        probe.call("decode", np.array([[tokens[-1]]], np.int32), np.array([[PROMPT + 5]], np.int64), *out[1:],
                   capture=None)


def _perturb_decode(monkeypatch, model, scale: float) -> None:
    """Make ``Probe.from_hf`` build the decode function (not prefill) with layer 1's
    ``mlp.down_proj`` weight scaled by ``scale``."""
    import tvm_probe.importer.hf as hf  # where Probe.from_hf imports decode from

    projection = model.model.layers[1].mlp.down_proj
    weight, plain_import = projection.weight, hf.import_decode

    def perturbed(step, *args, **kwargs):
        # a new tensor, not an in-place change: the import may keep views of the weights it read
        projection.weight = torch.nn.Parameter(weight.detach() * scale)
        try:
            return plain_import(step, *args, **kwargs)
        finally:
            projection.weight = weight

    monkeypatch.setattr(hf, "import_decode", perturbed)


def test_a_perturbed_decode_function_is_reported_at_its_step_and_op(monkeypatch):
    """The decode function is built with one weight scaled (prefill is not): step 0 passes, step 1
    is the first divergent call, at that projection; the tokens may or may not change."""
    model, ids = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT)
    _perturb_decode(monkeypatch, model, 1.5)
    probe = Probe.from_hf(model, pipeline="default", max_len=16)
    probe.generate(ids, steps=3)
    result = compare_generation(probe)
    assert not result
    table = result.table()
    assert list(table["diverged"] > 0) == [False, True, True]
    step, name = result.first_divergent
    assert step == 1 and name.startswith("module:model.layers.1.mlp"), name  # the model's own path
    # this probe's first calls ran through TVM's instrument (their outputs copied arrays): references of
    # another Mapping type, one holding a NaN, are judged as each call alone judges them
    generation = probe.hf.generations[-1]
    assert type(probe.call_record(generation.calls[0]).capture.outputs) is dict
    references = _served_references(probe, generation, reference_generate(probe, ids, 3, tokens=generation.tokens))
    name = next(iter(references[0]))
    references[0][name] = np.where(np.arange(references[0][name].size).reshape(references[0][name].shape) == 0,
                                   np.float32(np.nan), references[0][name])
    proxied = compare_calls(probe, [types.MappingProxyType(r) for r in references], calls=generation.calls)
    for (k, _, comparison), reference in zip(proxied.by_call, references):
        _assert_same_comparison(comparison, compare_call(probe, reference, call=k), k)
    assert "NaN" in proxied.by_call[0].comparison.first_divergent.note


@pytest.mark.parametrize("family", ["llama", *(pytest.param(f, marks=pytest.mark.slow)
                                               for f in ("qwen2", "mistral", "gpt2", "phi3", "gemma"))])
def test_the_teacher_forced_reference_equals_the_step_by_step_one(family):
    """Fed eager's own tokens, the two-call teacher-forced reference (one forward over the whole
    sequence sliced per step, one decode step proving each module's sequence axis) gives the
    tokens and, at every step, the same module paths with the same values as eager stepping
    token by token; no module of these families needed stepping."""
    from tvm_probe.llm.reference import sequence_axis

    model, ids = hf_decoder(family), decoder_ids(0, batch=1, seq=PROMPT)
    stepwise = reference_generate(model, ids, STEPS)
    forced = reference_generate(model, ids, STEPS, tokens=stepwise.tokens)
    assert forced.tokens == stepwise.tokens and forced.stepwise == []
    for step, (got, expected) in enumerate(zip(forced.values, stepwise.values, strict=True)):
        assert set(got) == set(expected) and len(got) > 25, step
        for path, array in expected.items():
            np.testing.assert_allclose(got[path], array, atol=1e-5, err_msg=f"step {step} {path}")
    # the sequence axis is proved or refused, never guessed
    assert sequence_axis((1, 1, 64), (1, 13, 64), 13) == 1
    assert sequence_axis((1, 2, 9, 16), (1, 2, 13, 16), 13) is None  # grows with the cache, past included
    assert sequence_axis((1, 1, 9), (1, 13, 13), 13) is None  # two axes move
    assert sequence_axis((1, 64), (1, 64), 13) is None  # not per token


def test_a_perturbed_decode_is_found_at_the_same_step_and_value_by_both_references(monkeypatch):
    """Decode built with one weight slightly scaled: the teacher-forced reference (the default,
    its later steps sliced from one forward) finds, at every step, the same first divergent value
    as the step-by-step reference, from step 1 on (the prefill passes)."""
    model, ids = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT)
    _perturb_decode(monkeypatch, model, 1.02)
    probe = Probe.from_hf(model, pipeline="default", max_len=16)
    tokens = probe.generate(ids, steps=STEPS)
    forced, stepwise = compare_generation(probe), compare_generation(probe, reference=reference_generate(model, ids, STEPS))
    assert forced.tokens == stepwise.tokens == tokens and forced.reference_tokens == stepwise.reference_tokens
    firsts = [[n if isinstance(n, str) else None for n in r.table()["first_divergent"]] for r in (forced, stepwise)]
    assert firsts[0] == firsts[1], firsts
    assert firsts[0][0] is None and all(str(n).startswith("module:model.layers.1.mlp") for n in firsts[0][1:]), firsts
    assert forced.first_divergent == stepwise.first_divergent == (1, firsts[0][1])


class _Counter(torch.nn.Module):
    """A buffer updated in place every call (as a static KV cache's ``index_put``)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 2


def test_a_program_that_mutates_buffers_is_refused_naming_them():
    """TVM binds the buffer as a constant and drops the update: the second call would be wrong."""
    from tvm_probe.importer.torch import export_program

    module, x = _Counter(), torch.ones(3)
    with pytest.raises(ModelError, match=r"^_Counter mutates 1 buffer\(s\) \(total\), whose updates "
                                         r"TVM's importer drops"):
        Probe.from_torch(module, (x,))
    # what would have happened: TVM's own import runs, and its second call repeats the first
    import tvm
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    vm = relax.VirtualMachine(tvm.compile(from_exported_program(export_program(_Counter(), (x,))), "llvm"), tvm.cpu())
    first, second = (vm["main"](tvm.runtime.tensor(x.numpy()))[0].numpy() for _ in range(2))
    eager = _Counter()
    eager(x)
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(second, eager(x).numpy())


def test_transformers_static_cache_export_module_is_refused_in_one_line():
    """transformers' own static-cache module (its K/V caches are buffers updated in place) never
    becomes a build that drops the updates: Probe.from_torch refuses it in one line, whether it
    is given as it is or behind a wrapper that passes ``cache_position`` on."""
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model = hf_decoder("llama")
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    static = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.static = static

        def forward(self, input_ids, cache_position):
            return self.static(input_ids=input_ids, cache_position=cache_position)

    ids, position = torch.tensor([[3]]), torch.tensor([0])
    for module, inputs in ((static, (ids,)), (Step(), (ids, position))):
        with pytest.raises(ModelError) as caught:
            Probe.from_torch(module, inputs)
        assert "\n" not in str(caught.value) and type(module).__name__ in str(caught.value), str(caught.value)


def test_a_token_id_outside_the_vocabulary_is_refused_in_one_line_before_tvm_reads_past_the_table(llama_probe):
    """TVM's take does not check bounds: such an id crashed the process (a segfault)."""
    refused = ("input 'input_ids' holds values outside [0, 128) but indexes 'model.embed_tokens.weight', "
               "which has 128 rows (TVM's Gather does not check bounds): fix the ids")
    with pytest.raises(InputError) as err:
        llama_probe.generate(np.array([[5, 128]]), steps=2)
    assert str(err.value) == refused
    llama_probe.generate(decoder_ids(0, batch=1, seq=4).numpy(), steps=2)
    last = llama_probe.call_record(-1)
    for bad in (-1, 128, 10**6):  # a decode step's one token (the single-element check), numpy as users feed it
        with pytest.raises(InputError) as err:
            llama_probe.call("decode", np.array([[bad]], np.int64), *last.capture.inputs[1:])
        assert str(err.value) == refused, bad
    assert llama_probe.call_record(-1) is last, "a refused call is not a call"


def test_bad_generate_arguments_are_one_line_errors():
    probe = Probe.from_torch(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
    with pytest.raises(Exception, match=r"^generate\(\) needs a probe made by Probe.from_hf, or by Probe.from_nn "
                                        r"of a model with MLC-LLM's functions \(embed, prefill, decode and a KV "
                                        r"cache creator\)$"):
        probe.generate(np.array([[1, 2]]), steps=2)
    with pytest.raises(ModelError, match=r"^from_hf takes a transformers \*ForCausalLM model, not a Linear$"):
        Probe.from_hf(torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_a_generate_config_compares_every_step_through_the_cli(tmp_path):
    factory = SUPPORT / "hf_models.py"
    config = tmp_path / "llm.yaml"
    config.write_text(f"model: {{hf: '{factory}:tiny_llama'}}\ngenerate: {{prompt: random, steps: 4, length: 5}}\n"
                      f"output: {{report: {tmp_path / 'report'}}}\n")
    run = run_cli("run", str(config))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert lines[-1] == "all 4 steps within tolerance; the same 4 tokens"
    assert lines[0].startswith("tokens: [") and lines[1].startswith("transformers (eager, same cache, fed the tokens above): [")
    import pandas as pd

    table = pd.read_csv(tmp_path / "report" / "step_layer_errors.csv", index_col="step")
    assert list(table.columns) == ["layer 0", "layer 1"] and len(table) == 4 and (table < 1e-4).all().all()
    assert (tmp_path / "report" / "step_layer_errors.svg").read_text().startswith("<svg")
    config.write_text(f"model: {{torch: '{factory}:tiny_llama'}}\ngenerate: {{steps: 4}}\n")
    wrong = run_cli("run", str(config))
    assert wrong.returncode == 2 and "generate: needs model: {hf: FILE.py:FUNCTION}" in wrong.stderr
