"""Symbolic shapes through the native hooks (issue 35): a call whose shapes are symbolic (an HF
decode step's past length, an nn prefill's sequence length) copies the selected kernel outputs
into an arena the native session sizes from that call's shapes, with no Python between kernels,
and later calls of a selection take the prepared call (FastCall), "everything" included.

Each call is made twice with the same arguments and the same selection: through the new paths,
then through TVM's instrument (the path that checks every call against the kernel map, copying
every value itself); every value selected must be equal, byte for byte — those computed from the
weights alone too, which calls of everything serve from an earlier call's capture once two calls
captured them alike, and capture again after ``set_params``.  Selections are drawn at random (seeded) from
nothing, everything and a few values, and repeat, so the same shapes come back (the layout made
for them is reused) and new ones come (a past one longer each decode step).
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tvm

from tvm_probe import Probe, load_dump
from tvm_probe.capture.fast_call import DirectCall
from tvm_probe.capture import native
from tvm_probe.capture.kernel_hook import HOOK
from tvm_probe.capture.result import ArenaOutputs, Capture, LayoutOutputs
from tvm_probe.capture.weights_only import ServedOutputs
from tvm_probe.core.errors import InputError
from tvm_probe.core.sources import Served
from tvm_probe.kernel_map import ArgKind

from support.hf_models import decoder_ids, hf_decoder
from support.nn_llama import LlamaConfig, LlamaForCausalLM, hf_llama, mlc_weights

pytest.importorskip("transformers")

SERVED = (Served.CAPTURED, Served.RECOMPUTED)
ST = tvm.runtime.ShapeTuple
PIPELINES = ["default", "fused"]
CHECKED_OF_ALL = 40  # values compared per call that captured everything (recomputing all is slow)


@contextlib.contextmanager
def instrumented(probe):
    """Every function's calls through TVM's instrument while the block runs (no hooks, no
    prepared calls); what was prepared comes back after."""
    functions = list(probe.functions.values())
    executors = [p._executor for p in functions]
    saved = [(e._hook_allowed, dict(e.fast_calls)) for e in executors]
    # nothing served from an earlier call either: the instrument copies the weights-only outputs
    weights, calls = [p._weights for p in functions], dict(probe._fast_calls)
    for e, p in zip(executors, functions):
        e._hook_allowed = False
        e.fast_calls.clear()
        p._weights = None
    probe._fast_calls.clear()
    try:
        yield
    finally:
        for e, (allowed, fast) in zip(executors, saved):
            e._hook_allowed = allowed
            e.fast_calls.clear()
            e.fast_calls.update(fast)
        for p, w in zip(functions, weights):
            p._weights = w
        probe._fast_calls.clear()
        probe._fast_calls.update(calls)


def served_keys(probe, function: str) -> list[str]:
    fp = probe.functions[function]
    return sorted(v.key for v in fp.sources_map if fp.servings[v.key].served in SERVED)


def selections(rng, keys: list[str], count: int) -> list:
    """``count`` selections drawn from: nothing, everything, and two sets of a few values."""
    few = [sorted(rng.choice(keys, size=min(3, len(keys)), replace=False).tolist()) for _ in range(2)]
    choices = [None, "all", *few]
    return [choices[i] for i in rng.integers(0, len(choices), size=count)]


def weights_only_keys(probe, function: str) -> list[str]:
    """The served keys of ``function`` whose kernel output depends on the weights alone."""
    fp = probe.functions[function]
    sites = fp._weights.sites if fp._weights is not None else ()
    return [k for k in served_keys(probe, function)
            if fp.kernel_map.places.get(k) is not None and fp.kernel_map.places[k].site in sites]


def assert_same_values(probe, rng, keys: list[str], selection, fast: int, slow: int, made=None) -> None:
    """Call ``fast`` (the new paths) serves what call ``slow`` (the instrument) serves (``made``
    gets the pair, to check again once later calls ran: an arena a kept capture uses must not be
    written into again)."""
    if made is not None:
        made.append((keys, selection, fast, slow))
    record = probe.call_record(fast)
    assert probe.call_record(slow).capture.instrument != HOOK
    outputs = record.capture.outputs
    if isinstance(outputs, ServedOutputs):  # the weights-only outputs served from an earlier call
        outputs = outputs._own
    if record.capture.instrument == HOOK and selection:  # copied by the native hooks, into an arena
        assert isinstance(outputs, (ArenaOutputs, LayoutOutputs)) and record.capture.copied_bytes > 0
    names = list(selection or [])
    if selection == "all":  # a sample, and every value of the weights alone (served or copied)
        names = sorted(rng.choice(keys, size=min(CHECKED_OF_ALL, len(keys)), replace=False).tolist())
        names += weights_only_keys(probe, record.function)
    for name in names:
        got, want = probe.get(name, call=fast), probe.get(name, call=slow)
        assert got.shape == want.shape and got.dtype == want.dtype, (name, fast)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} at call {fast} ({record.function})")


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_hf_llama_prefill_and_decode_steps_capture_as_the_instrument_does(pipeline, monkeypatch):
    rng = np.random.default_rng(35)
    probe = Probe.from_hf(hf_decoder("llama"), pipeline=pipeline, max_len=32)
    shape = probe.hf.shape
    empty = [np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for _ in range(2 * shape.layers)]
    keys = {f: served_keys(probe, f) for f in ("prefill", "decode")}
    ids = decoder_ids(0, batch=1, seq=8).numpy()

    def twice(function, selection, *args):
        out = probe.call(function, *args, capture=selection)
        fast = probe.num_calls - 1
        with instrumented(probe):
            again = probe.call(function, *args, capture=selection)
        np.testing.assert_array_equal(out[0].numpy(), again[0].numpy())  # the logits
        assert_same_values(probe, rng, keys[function], selection, fast, probe.num_calls - 1, made)
        return out, fast

    made = []

    # prompts of three lengths, one of them twice (its layout is made once, then reused)
    for length, selection in zip((5, 8, 5, 8), selections(rng, keys["prefill"], 4)):
        out, _ = twice("prefill", selection, ids[:, :length], np.arange(length, dtype=np.int64)[None, :], *empty)
    token = int(out[0].numpy()[0, -1].argmax())
    hooked = []
    for k, selection in enumerate(selections(rng, keys["decode"], 8)):  # a longer past at every step
        out, fast = twice("decode", selection, np.array([[token]], np.int64), np.array([[8 + k]], np.int64),
                          *out[1:])
        hooked.append(probe.call_record(fast).capture.instrument == HOOK)
        token = int(out[0].numpy()[0, -1].argmax())
    served, runs = [], counting_direct_calls(monkeypatch)
    for k in range(4):  # four more of everything: the weights-only values are served by the last two at least
        out, fast = twice("decode", "all", np.array([[token]], np.int64), np.array([[16 + k]], np.int64), *out[1:])
        served.append(probe.call_record(fast).capture.served_from)
        token = int(out[0].numpy()[0, -1].argmax())
    assert_served_from_an_earlier_call(probe, "decode", served, fast)
    # once served, a call of everything runs in one native call, hooked (its record made when read)
    assert served[-1] is None or runs[-1:] == [True], (served, runs)
    assert all(hooked[1:]), hooked  # (the first decode step checks every call through the instrument)
    assert probe.functions["decode"]._executor.fast_calls, "no decode step took the prepared call"
    for pair in made:  # every call's values still as they were
        assert_same_values(probe, rng, *pair)
    assert_each_call_kept_its_kernel_times(probe, [c for _, s, c, _ in made if s == "all"])


def counting_direct_calls(monkeypatch) -> list[bool]:
    """Every run of a call in one native call (DirectCall) from now on: True when hooked."""
    runs, real = [], DirectCall.__call__

    def counted(self, args):
        out = real(self, args)
        if type(out) is tuple:  # (it ran)
            runs.append(out[1][1] is not None)
        return out

    monkeypatch.setattr(DirectCall, "__call__", counted)
    return runs


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_decode_steps_in_one_native_call_serve_what_the_instrument_serves(pipeline, monkeypatch):
    """From a selection's second decode step on, a call runs in one native call (DirectCall: the
    numpy token and position checked and copied there, the hooks pointed at the selection's
    session, the record made when read): each such call serves what the same call through TVM's
    instrument serves, read after later calls ran and after earlier ones were forgotten; a token
    the native call refuses gets the checked path's one-line error, and the loop goes on."""
    rng = np.random.default_rng(37)
    probe = Probe.from_hf(hf_decoder("llama"), pipeline=pipeline, max_len=32)
    shape, keys = probe.hf.shape, served_keys(probe, "decode")
    empty = [np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for _ in range(2 * shape.layers)]
    ids = decoder_ids(0, batch=1, seq=8).numpy()
    out = probe.call("prefill", ids, np.arange(8, dtype=np.int64)[None, :], *empty, capture=None)
    runs = counting_direct_calls(monkeypatch)
    few = [sorted(rng.choice(keys, size=3, replace=False).tolist()) for _ in range(2)]
    made, token = [], int(out[0].numpy()[0, -1].argmax())
    for k, selection in enumerate([None, few[0], None, few[0], few[1], few[1], None, few[0], few[1], None]):
        args = np.array([[token]], np.int64), np.array([[8 + k]], np.int64), *out[1:]
        out = probe.call("decode", *args, capture=selection)
        fast = probe.num_calls - 1
        with instrumented(probe):
            again = probe.call("decode", *args, capture=selection)
        np.testing.assert_array_equal(out[0].numpy(), again[0].numpy())
        assert_same_values(probe, rng, keys, selection, fast, probe.num_calls - 1, made)
        token = int(out[0].numpy()[0, -1].argmax())
    assert runs.count(False) >= 2 and runs.count(True) >= 3, runs  # nothing hooked, then a few values
    for pair in made:  # read again after later calls: no arena a kept call holds was written into
        assert_same_values(probe, rng, *pair)
    probe.forget_calls(keep_last=4)
    for pair in made[-2:]:
        assert_same_values(probe, rng, *pair)
    bound = probe.functions["decode"].imported.params[0][1].index_bound
    with pytest.raises(InputError, match=r"holds values outside"):
        probe.call("decode", np.array([[bound]], np.int64), np.array([[18]], np.int64), *out[1:], capture=None)
    before = len(runs)
    probe.call("decode", np.array([[token]], np.int64), np.array([[18]], np.int64), *out[1:], capture=None)
    assert len(runs) == before + 1 and probe.call_record(probe.num_calls - 1).capture.inputs[0][0, 0] == token


def assert_each_call_kept_its_kernel_times(probe, calls: list[int]) -> None:
    """Calls of everything through the hooks kept their own kernel times (in their arena's header,
    read only now, after later calls ran): every kernel timed, and no two calls alike."""
    hooked = [c for c in calls if probe.call_record(c).capture.instrument == HOOK]
    assert len(hooked) >= 2, calls
    durations = []
    for call in hooked:
        record = probe.call_record(call)
        starts, times = record.capture.kernel_times()
        kernels = [s.index for s in probe.functions[record.function].kernel_map.sites if not s.is_view]
        assert set(kernels) <= set(times), f"call {call}: kernels without a time"
        assert all(0 <= times[i] < 1e7 and 0 <= starts[i] < 1e7 for i in kernels), call
        durations.append(tuple(times[i] for i in kernels))
    assert len(set(durations)) == len(durations), "two calls hold the same kernel times"


def assert_served_from_an_earlier_call(probe, function: str, served: list, last: int) -> None:
    """The last of ``served`` (calls of everything) came from an earlier call's capture, and the
    weights-only values of call ``last`` say so; other values are that call's own.  (Under
    ``fused`` a pipeline may keep every weights-only value inside kernels: then none is served.)"""
    weights_only = weights_only_keys(probe, function)
    if not probe.functions[function]._weights.sites:
        assert served == [None] * len(served), served
        return
    assert served[-1] is not None and served[-1] < last, served
    assert weights_only, f"{function}: no source value is a weights-only kernel output"
    said = probe.provenance(weights_only[0], call=last)
    assert said.startswith(f"captured at call {served[-1]}; computed from the weights alone"), said
    others = [k for k in served_keys(probe, function) if k not in weights_only
              and probe.functions[function].servings[k].served is Served.CAPTURED]
    assert probe.provenance(others[0], call=last) == f"captured at call {last}"


def _nn_cache(probe):
    f = tvm.get_global_func
    cache = probe.call("create_paged_kv_cache", ST([1]), ST([64]), ST([32]), ST([16]), ST([0]))
    f("vm.builtin.kv_state_add_sequence")(cache, 0)
    return cache


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_nn_llama_prefill_chunks_and_decode_steps_capture_as_the_instrument_does(pipeline, tmp_path, monkeypatch):
    """Prefill (symbolic sequence length) in chunks of several lengths, then decode steps (static
    shapes: a selection's later steps run in one native call, copying into the session's own
    arenas), each call made on two caches kept alike: one through the new paths, one through
    the instrument."""
    rng = np.random.default_rng(36)
    runs = counting_direct_calls(monkeypatch)
    config = LlamaConfig()
    model = LlamaForCausalLM(config)
    weights = mlc_weights(hf_llama(config))
    probe = Probe.from_nn(model, model.get_default_spec("plain"), params=weights, pipeline=pipeline)
    begin, end = (tvm.get_global_func(f"vm.builtin.kv_state_{n}") for n in ("begin_forward", "end_forward"))
    caches = _nn_cache(probe), _nn_cache(probe)
    keys = {f: [k for k in served_keys(probe, f) if ".layers." not in k or not k.startswith("paged_kv_cache")]
            for f in ("prefill", "decode")}

    def twice(function, selection, ids):
        made = []
        for cache, path in zip(caches, (contextlib.nullcontext(), instrumented(probe))):
            with path:
                begin(cache, ST([0]), ST([ids.shape[1]]))
                probe.call(function, tvm.runtime.tensor(ids), cache, capture=selection)
                end(cache)
            made.append(probe.num_calls - 1)
        assert_same_values(probe, rng, keys[function], selection, *made, kept)
        return made[0]

    kept = []
    chunks = [rng.integers(2, 120, size=(1, n)).astype("int32") for n in (3, 2, 3, 1, 2)]
    for ids, selection in zip(chunks, selections(rng, keys["prefill"], len(chunks))):
        twice("prefill", selection, ids)
    hooked = []
    for selection in selections(rng, keys["decode"], 8) + ["all"] * 3:  # the last served from an earlier one
        fast = twice("decode", selection, rng.integers(2, 120, size=(1, 1)).astype("int32"))
        hooked.append(probe.call_record(fast).capture.instrument == HOOK)
    assert all(hooked[1:]), hooked
    assert probe.functions["decode"]._executor.fast_calls, "no decode step took the prepared call"
    assert True in runs, f"no decode step copying values ran in one native call: {runs}"
    assert_served_from_an_earlier_call(probe, "decode", [probe.call_record(fast).capture.served_from], fast)
    for pair in kept:  # every call's values still as they were
        assert_same_values(probe, rng, *pair)
    # a dump holds every call's weights-only values, those served from an earlier call included
    probe.forget_calls(keep_last=2)
    root = probe.dump(tmp_path / "dump")
    for key in weights_only_keys(probe, "decode")[:3]:
        dumped = load_dump(root / "calls" / f"{fast:04d}_decode").get_tensor(key)
        np.testing.assert_array_equal(dumped, probe.get(key, call=fast), err_msg=key)
    # new weights: what the old ones computed is served no more; two calls capture it again
    fp = probe.functions["decode"]
    used = {a.input_index for i in fp._weights.sites for a in fp.kernel_map.sites[i].args if a.kind is ArgKind.INPUT}
    name = fp.imported.params[min(used)][0]
    probe.set_params({name: weights[name] * 1.5})
    kept.clear()
    served = []
    for selection in ["all"] * 3 + selections(rng, keys["decode"], 3):
        fast = twice("decode", selection, rng.integers(2, 120, size=(1, 1)).astype("int32"))
        served.append(probe.call_record(fast).capture.served_from)
    assert served[:2] == [None, None] and served[2] is not None, served
    np.testing.assert_array_equal(probe.get(name, call=fast), weights[name] * 1.5)
    for pair in kept:
        assert_same_values(probe, rng, *pair)


def test_weights_only_outputs_that_differ_between_two_calls_warn_and_are_captured_at_every_call():
    """A nondeterministic kernel among those computed from the weights alone: the two first
    captures differ (here the first's copy is changed, as such a kernel would have written it),
    so the probe warns, names it, and every later call copies those outputs itself."""
    config = LlamaConfig()
    model = LlamaForCausalLM(config)
    probe = Probe.from_nn(model, model.get_default_spec("plain"), params=mlc_weights(hf_llama(config)),
                          pipeline="default")
    begin, end = (tvm.get_global_func(f"vm.builtin.kv_state_{n}") for n in ("begin_forward", "end_forward"))
    cache = _nn_cache(probe)

    def step(token: int):
        begin(cache, ST([0]), ST([1]))
        probe.call("decode", tvm.runtime.tensor(np.array([[token]], np.int32)), cache)
        end(cache)
        return probe.call_record(probe.num_calls - 1).capture

    step(3)
    first = probe.num_calls - 1  # (call 0 made the cache)
    weights = probe.functions["decode"]._weights
    site = sorted(weights.sites)[0]
    weights._first[1][site][0].flat[0] += 1  # what a nondeterministic kernel would have done
    with pytest.warns(RuntimeWarning, match=rf"computed from the weights alone differ between calls {first} and {first + 1} "
                                            rf"\(a nondeterministic kernel, e\.g\. call site {site}\)"):
        step(4)
    later = [step(t) for t in (5, 6, 7)]
    assert [c.served_from for c in later] == [None] * 3 and weights.next_run(False)[0] is weights.everything
    key = weights_only_keys(probe, "decode")[0]
    assert probe.provenance(key, call=probe.num_calls - 1) == f"captured at call {probe.num_calls - 1}"


def test_a_prepared_native_call_runs_only_arguments_it_accepts_and_keeps_no_memory_a_result_holds():
    """The native call under DirectCall, on a function returning what it was given: a host
    array of another dtype, shape or layout, or an id out of range, runs nothing (the caller's
    checked path then says what is wrong); an accepted one is copied into a tensor held for it,
    and a result referring to that tensor keeps it (the next call copies into a new one)."""
    import tvm_ffi

    library = native.load()
    seen = []
    identity = tvm_ffi.convert(lambda ids, weight: seen.append(weight) or ids)
    weight = tvm.runtime.tensor(np.ones(3, np.float32))
    arguments = [native.PreparedArgument(0, "int64", (1, 2), low=0, bound=10)]
    call = library.prepare_call(identity, [None, weight], arguments)
    for refused in (np.array([[1, 2]], np.int32), np.array([[1, 2, 3]], np.int64),
                    np.array([[1, 10]], np.int64), np.array([[1, 0, 2, 0]], np.int64)[:, ::2]):
        assert call.call(refused) is None and call.status[native.RAN] == 0, refused
    assert not seen, "a refused call ran the function"
    first = call.call(np.array([[3, 4]], np.int64))
    assert call.status[native.RAN] == 1 and call.status[native.NANOS] > 0 and len(seen) == 1
    second = call.call(np.array([[5, 6]], np.int64))
    assert first.numpy().tolist() == [[3, 4]] and second.numpy().tolist() == [[5, 6]]
    assert all(w.numpy().tolist() == [1.0, 1.0, 1.0] for w in seen)  # (the held weight, where it goes)


def test_a_capture_made_for_a_call_equals_the_dataclass_made_one():
    """``Capture.of_call`` (made per decode step, when its record is read) sets every field as
    the dataclass's own ``__init__`` does."""
    import dataclasses

    fast = Capture.of_call([1], HOOK, 2.5, "returned")
    made = Capture(inputs=[1], instrument=HOOK, total_us=2.5, returned="returned")
    for f in dataclasses.fields(Capture):
        assert getattr(fast, f.name) == getattr(made, f.name), f.name
    assert fast.outputs is not Capture.of_call([1], HOOK, 2.5, None).outputs  # (fresh containers)
