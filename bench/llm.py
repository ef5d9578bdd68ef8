"""What probing costs on an LLM decode step and on a generation compare (issues 24, 35).

    python bench/llm.py            # ~6 minutes on 2 cores (three of them building the larger models)
    python bench/llm.py --quick    # fewer rounds (while developing)

A tiny seeded transformers decoder (tests/support/hf_models.py) through ``Probe.from_hf`` (its
decode step has a symbolic past length).  Measured, interleaved run by run (each round in
another order), medians:

* one decode step, against the fastest plain call (``vm["decode"]`` with the token and position
  copied into input tensors made once, as a deployment loop holds them): ``probe.call("decode",
  ...)`` fed numpy token ids with ``capture=None`` (target <= 1.02x), ``["model.layers.0"]``
  (<= 1.05x) and everything (<= 1.5x); beside them, the floor of any Python API: the same call
  in another VM of the executable (as the probe's is), wrapped in a function keeping a record;
* a 16-step generation: ``probe.generate`` against ``generate`` + ``compare_generation``
  (the eager reference, teacher-forced, included; every value compared; target <= 2.5x), and
  that compare in its parts: the eager reference, judging against it, and judging each call
  alone, value by value (``compare_call`` a step at a time: how it was judged before issue 35);
* how the decode step's ratios grow with the model: seeded Llamas of hidden 256 at 2, 8 and 32
  layers, the same variants against their own fastest plain call.
* an MLC-style decode step: the built-in demo Llama (tvm_probe/importer/demo_mlc.py, weights
  packed, ``DispatchKVCacheCreation`` before the pipeline) through ``Probe.from_nn``, driven as
  MLC drives it (``kv_state_begin_forward``, ``decode(embedding, paged KV cache)``,
  ``kv_state_end_forward``; ``kv_state_popn`` takes each step's token back out): the same
  variants and targets, the decode call alone timed, each run of 50 rounds' ratios listed.

Prints the tables and writes them to bench/results.md (section "LLM decode step and generation").
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/, where the support package is


FASTEST = "fastest plain VM call (input tensors made once)"
FLOOR = "another VM of the executable, inputs moved as above, in a Python function keeping a record of the call"
TARGETS = {"probe.call, capture=None": 1.02, "probe.call, one layer": 1.05, "probe.call, everything": 1.5}
GENERATION_TARGET = 2.5  # a 16-step generation compare against the generation
SCALING = (2, 8, 32)  # layers of the models whose decode step shows how the cost grows


def _decode_args(probe, ids):
    """Arguments of the first decode step: the prefill's cache, the next token and position."""
    import numpy as np

    shape = probe.hf.shape
    past = [np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for _ in range(2 * shape.layers)]
    out = probe.call("prefill", ids, np.arange(ids.shape[1], dtype=np.int64)[None, :], *past, capture=None)
    token = np.array([[int(out[0].numpy()[0, -1].argmax())]], np.int64)
    return token, np.array([[ids.shape[1]]], np.int64), list(out[1:])


def _each_call_alone(probe, generation, reference) -> None:
    """Judging as compare_generation did before issue 35's columns: each step's values served,
    measured and recorded one by one (compare_call, a step at a time)."""
    from tvm_probe.llm.compare import _served
    from tvm_probe.probe.calls import compare_call

    resolvable: dict = {}
    for call, values in zip(generation.calls, reference.values):
        compare_call(probe, _served(probe, call, values, resolvable), call=call)


def _decode_variants(probe, ids) -> dict:
    """Each way of making the first decode step after the prefill of ``ids``, by its row name."""
    import numpy as np
    import tvm

    token, position, past = _decode_args(probe, ids)
    # what a user deploys: a VM of the same executable with no instrument (the probe's own VM keeps
    # the no-op instrument its last instrumented run left)
    # (each plain variant has a VM of its own, as the probe has: one following another in the
    # same VM would find that VM's memory warm)
    plain, fastest, floor_decode = (tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())["decode"]
                                    for _ in range(3))
    token_in, position_in = tvm.runtime.tensor(token), tvm.runtime.tensor(position)
    token_view, position_view = np.from_dlpack(token_in), np.from_dlpack(position_in)

    def fastest_plain():  # the token and position copied into tensors made once (as probe.call moves them)
        np.copyto(token_view, token)
        np.copyto(position_view, position)
        return fastest(token_in, position_in, *past)

    floor_token, floor_position = tvm.runtime.tensor(token), tvm.runtime.tensor(position)
    floor_views, kept_calls = (np.from_dlpack(floor_token), np.from_dlpack(floor_position)), []

    def floor():  # the least a Python API around the call does: move the inputs, call, keep a record
        np.copyto(floor_views[0], token)
        np.copyto(floor_views[1], position)
        result = floor_decode(floor_token, floor_position, *past)
        kept_calls.append(("decode", len(kept_calls), time.perf_counter()))
        if len(kept_calls) > 64:
            kept_calls.clear()  # a benchmark keeps no history
        return result

    return {
        # the token and position come from the host each step, as in a user's decode loop
        "plain VM call": lambda: plain(tvm.runtime.tensor(token), tvm.runtime.tensor(position), *past),
        FASTEST: fastest_plain,
        FLOOR: floor,
        "probe.call, capture=None": lambda: probe.call("decode", token, position, *past, capture=None),
        "probe.call, one layer": lambda: probe.call("decode", token, position, *past,
                                                    capture=["model.layers.0"]),
        "probe.call, everything": lambda: probe.call("decode", token, position, *past, capture="all"),
    }


def _interleaved(probe, variants: dict, repeat: int) -> dict:
    """Microseconds of each variant's runs, ``repeat`` rounds of one run each, interleaved."""
    for fn in variants.values():  # warm up (first-call instrument set-up)
        fn()
    rounds = {name: [] for name in variants}
    order = list(variants.items())
    for k in range(repeat):  # interleaved, so load on the machine hits every variant alike,
        shift = k % len(order)  # each round in another order, so none always follows the same one
        for name, fn in order[shift:] + order[:shift]:
            rounds[name].append(_median_us(fn, 1))
        if k % 64 == 0:
            probe.forget_calls(keep_last=1)  # a benchmark keeps no history
    return rounds


def _scaling_rows(options, missed: list) -> list[str]:
    """How the decode step's ratios grow with the model: Llama of hidden 256 at 2, 8, 32 layers."""
    from support.hf_models import decoder_ids, hf_decoder
    from tvm_probe import Probe

    lines = ["", f"**How the cost grows** (Llama, hidden 256, 4 heads, 2 KV heads, pipeline `{options.pipeline}`, "
             f"seeded weights; medians of {options.repeat} interleaved decode steps, past of 8 tokens)", "",
             "| layers | kernel calls | build s | fastest plain us | another VM | capture=None | one layer | everything |",
             "|---|---|---|---|---|---|---|---|"]
    ids = decoder_ids(0, batch=1, seq=8).numpy()
    for layers in SCALING:
        model = hf_decoder(options.family, hidden_size=256, intermediate_size=512, num_hidden_layers=layers)
        start = time.perf_counter()
        probe = Probe.from_hf(model, pipeline=options.pipeline, max_len=32)
        build_s = time.perf_counter() - start
        variants = {name: fn for name, fn in _decode_variants(probe, ids).items() if name != "plain VM call"}
        medians = {name: statistics.median(times) for name, times in _interleaved(probe, variants, options.repeat).items()}
        fastest, cells = medians[FASTEST], []
        for name in (FLOOR, *TARGETS):
            ratio, target = medians[name] / fastest, TARGETS.get(name)
            if target is not None and ratio > target:
                missed.append(f"{layers} layers: {name} {ratio:.3f}x")
            cells.append(f"{ratio:.3f}x" + ("" if target is None else " (met)" if ratio <= target else " (missed)"))
        kernels = len(probe.functions["decode"].kernel_map.sites)
        lines.append(f"| {layers} | {kernels} | {build_s:.0f} | {fastest:.0f} | " + " | ".join(cells) + " |")
    return lines


MLC_CREATOR = (1, 64, 32, 16, 0)  # the paged KV cache's sizes: batch 1, context 64, prefill chunk 32, page 16
MLC_BLOCKS = 8  # the rounds cut into this many runs of consecutive rounds, each run's ratios listed


def _mlc_probe(pipeline: str):
    """The built-in MLC-style demo Llama (tvm_probe/importer/demo_mlc.py) through ``Probe.from_nn``
    with its weights packed, built as MLC builds (its ``DispatchKVCacheCreation`` pass, then
    TVM's pipeline ``pipeline`` names); and the weights in the packed tuple's order."""
    import tvm
    from tvm import relax
    from tvm_probe import Probe
    from tvm_probe.importer import demo_mlc

    config = demo_mlc.LlamaConfig()
    model = demo_mlc.LlamaForCausalLM(config)
    params = demo_mlc.mlc_weights(demo_mlc.hf_llama(config))
    lowering = (relax.get_default_pipeline(tvm.target.Target("llvm")) if pipeline == "fused"
                else relax.get_pipeline(pipeline))
    probe = Probe.from_nn(model, model.get_default_spec(), params=params,
                          pipeline=tvm.transform.Sequential([demo_mlc.DispatchKVCacheCreation(config), lowering]))
    return probe, config, [params[name] for name, _ in model.named_parameters()]


def _mlc_variants(probe, config, weights, ids) -> dict:
    """Each way of making an MLC-style decode step, by its row name: ``{name: (call, its cache)}``.
    Every variant steps the same paged KV cache, made by the probe's creator and filled by one
    prefill of ``ids`` (MLC's protocol: ``embed``, then ``prefill`` between the cache's
    begin_forward and end_forward); each step decodes the token the prefill chose (its embedding
    made once, as a deployment loop holds it)."""
    import numpy as np
    import tvm

    st, f = tvm.runtime.ShapeTuple, tvm.get_global_func
    begin, end = f("vm.builtin.kv_state_begin_forward"), f("vm.builtin.kv_state_end_forward")
    prompt = (ids[0] % config.vocab_size).astype(np.int32)
    prompt_embedding = probe.call("embed", prompt, capture=None).numpy()[None]  # (1, n, hidden)

    def new_cache():
        cache = probe.call("create_tir_paged_kv_cache", *(st([size]) for size in MLC_CREATOR), capture=None)
        f("vm.builtin.kv_state_add_sequence")(cache, 0)
        begin(cache, st([0]), st([len(prompt)]))
        logits, cache = probe.call("prefill", prompt_embedding, cache, capture=None)
        end(cache)
        return cache, int(logits.numpy()[0, -1].argmax())

    names = ("plain VM call", FASTEST, FLOOR, *TARGETS)
    # one cache for every variant (each step's token is popped again): where a cache's pages lie moved a
    # decode step by 3-4 % from one cache to another, more than the 2 % a target allows
    shared, token = new_cache()
    caches = {name: shared for name in names}
    plain_cache, fastest_cache, floor_cache = caches["plain VM call"], caches[FASTEST], caches[FLOOR]
    none_cache, layer_cache, all_cache = (caches[name] for name in TARGETS)
    embedding = probe.call("embed", np.array([token], np.int32), capture=None).numpy()[None]  # (1, 1, hidden)
    # the weights as a deployment loop holds them: one packed tuple on the device, made once
    packed = tvm.runtime.convert([tvm.runtime.tensor(w) for w in weights])
    # (each plain variant has a VM of its own, as in the HF decode step)
    plain, fastest, floor_decode = (tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())["decode"]
                                    for _ in range(3))
    fastest_in, floor_in = tvm.runtime.tensor(embedding), tvm.runtime.tensor(embedding)
    fastest_view, floor_view, kept_calls = np.from_dlpack(fastest_in), np.from_dlpack(floor_in), []

    def fastest_plain():  # the embedding copied into a tensor made once (as probe.call moves it)
        np.copyto(fastest_view, embedding)
        return fastest(fastest_in, fastest_cache, packed)

    def floor():  # the least a Python API around the call does: move the input, call, keep a record
        np.copyto(floor_view, embedding)
        result = floor_decode(floor_in, floor_cache, packed)
        kept_calls.append(("decode", len(kept_calls), time.perf_counter()))
        if len(kept_calls) > 64:
            kept_calls.clear()  # a benchmark keeps no history
        return result

    calls = {
        # the embedding comes from the host each step
        "plain VM call": lambda: plain(tvm.runtime.tensor(embedding), plain_cache, packed),
        FASTEST: fastest_plain,
        FLOOR: floor,
        "probe.call, capture=None": lambda: probe.call("decode", embedding, none_cache, capture=None),
        "probe.call, one layer": lambda: probe.call("decode", embedding, layer_cache, capture=["model.layers.0"]),
        "probe.call, everything": lambda: probe.call("decode", embedding, all_cache, capture="all"),
    }
    return {name: (calls[name], caches[name]) for name in names}


def _mlc_step(fn, cache, keep: bool = False):
    """One MLC decode step of ``fn`` on ``cache``: ``kv_state_begin_forward`` (one token of
    sequence 0), the decode call (timed alone: its microseconds returned), ``kv_state_end_forward``,
    then ``kv_state_popn`` takes the token back out (``keep``: ``(the call's result, us)``)."""
    if not _MLC_STATE:  # the KV state's builtins and arguments, made once
        import tvm

        _MLC_STATE.extend([*(tvm.get_global_func(f"vm.builtin.kv_state_{name}")
                             for name in ("begin_forward", "end_forward", "popn")),
                           tvm.runtime.ShapeTuple([0]), tvm.runtime.ShapeTuple([1])])
    begin, end, popn, sequences, lengths = _MLC_STATE
    begin(cache, sequences, lengths)
    start = time.perf_counter()
    if keep:
        result = fn()
    else:
        fn()
    us = (time.perf_counter() - start) * 1e6
    end(cache)
    popn(cache, 0, 1)
    return (result, us) if keep else us


_MLC_STATE: list = []


def _mlc_interleaved(probe, variants: dict, repeat: int) -> dict:
    """Microseconds of each variant's decode call (``{name: (call, its cache)}``), ``repeat``
    rounds of one :func:`_mlc_step` each, interleaved as in :func:`_interleaved`.  The caches end
    as they began (each step's token popped): every step does the same work."""
    import tvm

    length = tvm.get_global_func("vm.builtin.attention_kv_cache_get_sequence_length")
    before = {int(length(cache, 0)) for _, cache in variants.values()}
    if len(before) != 1:
        raise RuntimeError(f"the variants' caches hold {sorted(before)} tokens: they should hold the same")
    for fn, cache in variants.values():  # warm up (first-call instrument set-up)
        _mlc_step(fn, cache)
    rounds = {name: [] for name in variants}
    order = list(variants.items())
    for k in range(repeat):  # as _interleaved: each round in another order
        shift = k % len(order)
        for name, (fn, cache) in order[shift:] + order[:shift]:
            rounds[name].append(_mlc_step(fn, cache))
        if k % 64 == 0:
            probe.forget_calls(keep_last=1)  # a benchmark keeps no history
    after = {int(length(cache, 0)) for _, cache in variants.values()}
    if after != before:
        raise RuntimeError(f"the caches held {sorted(before)} tokens before the rounds, {sorted(after)} after")
    return rounds


def _mlc_rows(options, missed: list) -> list[str]:
    """The MLC-style decode step's table: medians, ratios against the fastest plain call, and the
    ratios of each run of consecutive rounds."""
    import numpy as np

    from support.hf_models import decoder_ids

    start = time.perf_counter()
    probe, config, weights = _mlc_probe(options.pipeline)
    build_s = time.perf_counter() - start
    variants = _mlc_variants(probe, config, weights, decoder_ids(0, batch=1, seq=8).numpy())
    logits = {name: _mlc_step(*variants[name], keep=True)[0][0].numpy() for name in variants}
    for name, values in logits.items():  # every variant computes the fastest plain call's logits
        if not np.allclose(values, logits[FASTEST], rtol=1e-5, atol=1e-5):
            raise RuntimeError(f"MLC decode step: {name} computes other logits than the fastest plain call")
    rounds = _mlc_interleaved(probe, variants, options.repeat)
    fastest = statistics.median(rounds[FASTEST])
    block = max(1, options.repeat // MLC_BLOCKS)
    blocks = [slice(b, b + block) for b in range(0, options.repeat - block + 1, block)]
    kernels = len(probe.functions["decode"].kernel_map.sites)
    lines = ["", f"**MLC-style decode step** (run of {time.strftime('%Y-%m-%d')}): the built-in demo Llama (tvm_probe/importer/demo_mlc.py: hidden "
             f"{config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
             f"{config.num_key_value_heads} KV heads; weights packed, from the seeded transformers model) through "
             f"`Probe.from_nn`, pipeline `DispatchKVCacheCreation` + `{options.pipeline}` (built in {build_s:.0f} s; "
             f"{kernels} kernel calls in `decode`), TVM's paged KV cache (context {MLC_CREATOR[1]}, page "
             f"{MLC_CREATOR[3]}). Medians of {options.repeat} interleaved decode steps, past of 8 tokens in "
             "a cache filled by one prefill; a step is `kv_state_begin_forward`, "
             "`decode(embedding, cache)`, `kv_state_end_forward`, then `kv_state_popn` takes the token back out; "
             "only the decode call is timed (begin/end/popn are the same in every variant and left out). Every "
             "variant steps the same cache (a cache of each, as first measured, moved the ratios by 3-4 %: where "
             "its pages lie). The "
             "fastest plain call copies the embedding into a tensor made once and passes the packed weights "
             "held as one tuple; `probe.call` is given the numpy embedding and passes the weights itself. The "
             f"last column: the ratio in each run of {block} consecutive rounds (its median against the fastest's "
             "median in the same rounds), in order.", "",
             "| MLC decode step | median us | vs fastest plain | target | | each run of rounds |",
             "|---|---|---|---|---|---|"]
    for name, times in rounds.items():
        runs = ", ".join(f"{statistics.median(times[b]) / statistics.median(rounds[FASTEST][b]):.3f}" for b in blocks)
        lines.append(f"{_target_row(name, times, fastest, missed, 'MLC ')} {runs} |")
    return lines + ["", MLC_NOTES]


def _target_row(name: str, times: list, fastest: float, missed: list, label: str = "") -> str:
    """``| name | median us | ratio | target | met/missed |`` of a decode-step variant; a missed
    target is added to ``missed`` (``label`` before its name)."""
    us = statistics.median(times)
    target = TARGETS.get(name)
    verdict = ("met" if us / fastest <= target else "missed") if target else ""
    if verdict == "missed":
        missed.append(f"{label}{name} {us / fastest:.3f}x")
    return f"| {name} | {us:.0f} | {us / fastest:.3f}x | {f'<= {target:.2f}x' if target else ''} | {verdict} |"


MLC_NOTES = (
    "The MLC step's path (2026-12-08). A call of everything takes the prepared path (one native call, "
    "capture.DirectCall) from the third call on, as the HF step does: the transposes of the packed weights are "
    "weights-only outputs (the kernel map follows an element of a tuple parameter: `ArgSource.param_item`), "
    "captured at two calls, compared, then served; the paged KV cache's K/V are read right after each native "
    "call; the kernel times of a static plan (this decode step has no symbolic shape) are copied out of the "
    "session's buffer after each call; and the KV cache the step returns refers to no caller's tensor (TVM's "
    "`relax.vm.KVState`s hold only memory they allocated), so the tensor the numpy embedding is copied into is "
    "kept from call to call (capture/native/instrument.cc `IsKVState`, capture/transfer.py `_is_kv_state`). "
    "Every run of the day, capture=None / one layer / everything: before these changes (a cache per variant, "
    "other work loading the cores): 1.063x / 1.060x / 2.34x, 1.064x / 1.068x / 2.89x (60 rounds, these rows "
    "alone), 1.065x / 1.100x / 2.25x (--quick), 1.050x / 1.057x / 2.020x (full run): the K/V read kept every "
    "call of everything in Python's path, the embedding's tensor was made again at every call, and the 9 "
    "transposed weights (342 KB) were copied at every call. After them, these rows alone on a quiet machine: "
    "1.044x / 1.050x / 1.301x, 1.047x / 1.047x / 1.834x (the weights-only outputs not yet served natively), "
    "1.031x / 1.041x / 1.294x, 1.039x / 1.031x / 1.343x (a cache per variant), 1.035x / 1.040x / 1.238x (one "
    "cache); full runs: 1.060x / 1.079x / 1.395x (a cache per variant), then the table above (one cache). A "
    "plain VM stepping the probe's cache ran at 0.965x of the fastest plain call stepping its own, 1500 "
    "interleaved rounds: where a cache's pages lie moves a step by 3-4 %, so every variant now steps one "
    "cache. In that run probe.call with capture=None was 1.012x of the plain VM on the same cache and of "
    "the probe's own native call: what is left is the Python around the native call (finding the prepared "
    "call, the type check, reading the status, keeping the record), ~1-2 us on a step of ~110 us (the HF "
    "step's is ~140 us), where 1.02x leaves ~2 us; the 'another VM' row is the measurement's own spread.")


def _median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama")
    parser.add_argument("--pipeline", default="default")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="60 rounds and 7 generations (while developing)")
    parser.add_argument("--loaded", action="store_true", help="say in results.md that other work loaded the machine")
    options = parser.parse_args(argv)
    options.repeat = options.repeat or (60 if options.quick else 400)
    generation_rounds = 7 if options.quick else 31

    from support.hf_models import decoder_ids, hf_decoder
    from tvm_probe import Probe
    from tvm_probe.llm.hf import compare_generation
    from tvm_probe.llm.reference import reference_generate

    model = hf_decoder(options.family)
    ids = decoder_ids(0, batch=1, seq=8).numpy()
    probe = Probe.from_hf(model, pipeline=options.pipeline, max_len=32)
    rounds = _interleaved(probe, _decode_variants(probe, ids), options.repeat)
    fastest = statistics.median(rounds[FASTEST])
    missed = []
    lines = [f"Tiny seeded {options.family} (tests/support/hf_models.py) through `Probe.from_hf`, pipeline "
             f"`{options.pipeline}`; medians of {options.repeat} interleaved decode steps (past of 8 tokens; the "
             "variants take turns going first; each plain variant has a VM of its own). Ratios against the fastest "
             "plain call (input tensors made once). Targets: "
             + ", ".join(f"{n.split(', ')[1]} <= {t:.2f}x" for n, t in TARGETS.items()) + ".", "",
             "| decode step | median us | vs fastest plain | target | |", "|---|---|---|---|---|"]
    lines += [_target_row(name, times, fastest, missed) for name, times in rounds.items()]
    steps, generations, compares, ratios = 16, [], [], []
    references, judgings, alone = [], [], []
    for k in range(generation_rounds):  # each round: a generation, then its compare
        start = time.perf_counter()
        probe.generate(ids, steps=steps)
        generations.append(time.perf_counter() - start)
        start = time.perf_counter()
        result = compare_generation(probe)
        compares.append(time.perf_counter() - start)
        ratios.append((generations[-1] + compares[-1]) / generations[-1])
        probe.forget_calls()
        # then the compare in its parts, each right after a generation as in use: the eager
        # reference, then judging against it (every other round) or judging each call alone
        probe.generate(ids, steps=steps)
        generation_run = probe.hf.generations[-1]
        start = time.perf_counter()
        reference = reference_generate(probe, generation_run.prompt, steps, tokens=generation_run.tokens)
        references.append(time.perf_counter() - start)
        start = time.perf_counter()
        if k % 2:
            compare_generation(probe, reference=reference)
            judgings.append(time.perf_counter() - start)
        else:
            _each_call_alone(probe, generation_run, reference)
            alone.append(time.perf_counter() - start)
        probe.forget_calls()
    generation, compare = statistics.median(generations), statistics.median(compares)
    scaling = _scaling_rows(options, missed)  # (after the generations: their process as it was)
    mlc = _mlc_rows(options, missed)  # the MLC-style decode step (its own probe, built last)
    reference_ms, judging_ms, alone_ms = (statistics.median(t) * 1e3 for t in (references, judgings, alone))
    compared = sum(len(comparison.values) for _, _, comparison in result.calls.by_call)
    ratio = (generation + compare) / generation
    if ratio > GENERATION_TARGET:
        missed.append(f"generation compare {ratio:.2f}x")
    lines += mlc
    lines += ["", f"| {steps}-step generation (medians of {generation_rounds} rounds) | ms | ratio | target | |",
              "|---|---|---|---|---|",
              f"| generate | {generation * 1e3:.1f} | 1.000x | | |",
              f"| generate + compare_generation (eager reference included) | {(generation + compare) * 1e3:.1f} | "
              f"{ratio:.2f}x | <= {GENERATION_TARGET:.1f}x | {'met' if ratio <= GENERATION_TARGET else 'missed'} |", "",
              f"Ratios of the single rounds: {min(ratios):.2f}x to {max(ratios):.2f}x.", "",
              f"The compare in its parts (rounds of their own, each right after a generation): the eager reference "
              f"{reference_ms:.1f} ms; judging the {compared} values against it (compare_generation given the "
              f"reference) {judging_ms:.1f} ms; judging each call alone, value by value (compare_call a step at a "
              f"time, as compare_generation judged before issue 35's columns) {alone_ms:.1f} ms: "
              f"{alone_ms / judging_ms:.1f}x.", "",
              f"verdict: {result.verdict()}", *scaling, "",
              "`probe.call` moves numpy arguments into tensors it made once (a result that may refer to one gives "
              "it up), as the fastest plain call here does. A call's record keeps nothing of what the VM "
              "returned: holding each step's logits and KV tensors until forget_calls kept the VM from reusing "
              "their memory (15-27 us a step, measured twice). A decode step's shapes are symbolic (the past length): "
              "the native hooks copy the selected kernel outputs into an arena the capture session "
              "sizes from that call's shapes (grown when a call needs more; the session pools every arena it made, up "
              "to 32 MiB, so a loop that keeps its captures reuses them once forgotten), each output's place and "
              "shape, and the kernel times, written in the arena's own header (a site's views are made from it when "
              "read); no Python runs between kernels. From a function's second call on (a generation's second "
              "decode step), calls take the prepared path: a call of the same selection with arguments of the same "
              "types runs in one native call (capture.DirectCall: the numpy token and position checked and copied "
              "into tensors it holds, the hooks pointed at the session, the call count checked, a held tensor the "
              "result refers to given up), its record made only when read; calls of everything, while their "
              "weights-only outputs are checked, take capture.FastCall, Python around one native call. Kernel "
              "outputs computed from the weights alone (the transposed weights: no input, no KV cache, no past "
              "length among what they come from) are captured at the first two decode steps of everything, "
              "compared byte for byte, then served from the first (capture/weights_only.py; "
              "`probe.provenance(name, call=k)` says so). The compare's eager reference is teacher-forced with "
              "the generation's tokens: one forward over the prompt and the tokens, each step's values taken at "
              "its positions along each module's sequence axis, proved by one decode step run as the generation "
              "ran it (else step by step): two eager calls whatever the number of steps. What is left, measured on this machine (2026-12-06): the native call alone "
              "(checks, copies, the VM function) runs at 0.98-1.00x of the fastest plain call, as the floor above "
              "does; the Python around it (finding the prepared call, the type check, reading the status, keeping "
              "the record) costs ~1.3 us measured alone and two to three times that between two VM calls, whose "
              "runs leave Python's objects out of the caches: capture=None lands at 1.02-1.03x. Before this round "
              "(2026-12-05): capture=None 1.11x, one layer 1.16x, Python's checks and moves around the VM call 12 us. The "
              "\"another VM\" row is the measurement's own spread: the same call in another VM of the executable "
              "lands 0.96-1.00x of the fastest, so 1.02x and 1.05x lie within a few percent of it. The generation "
              "compare (its parts in the paragraph above the verdict line) judges as columns (issue 35, "
              "2026-12-07; tvm_probe/probe/columns.py): the values a decode step's arena holds are checked against "
              "their references with a few list operations a call and read as flat slices of the arena; decode "
              "steps 2 on take each module's references for all steps at once from the teacher-forced forward (one "
              "block a module, no slice per step: the reference's per-step dicts are made only when read); every "
              "value is measured in one numpy pass, and a call whose values all passed makes their records when "
              "first read (comparison.verdict.PassedComparison). A value the columns cannot take as it is (served "
              "otherwise than from a kernel output, not in the arena as float32 at its reference's shape, a "
              "reference that is not a float numpy array) goes the one-by-one way; tests/models/test_llm_generate.py "
              "holds every step's verdict, value by value, equal to judging each call alone. Before (2026-12-06): "
              "judging ~6.7-7.7 ms, the compare 2.84-2.90x. Right after a generation, everything costs more than "
              "measured alone (the eager reference ~5-6 ms, ~3.9 ms alone), as the VM's run leaves torch's and "
              "Python's objects out of the caches; the reference's two eager calls (the forward and the decode step "
              "proving each module's sequence axis) are most of the compare now. Also: Python's "
              "collector, which walks the millions of objects torch and transformers hold: gc.freeze() once the "
              "probe is built took 11 us off the plain step and 19 us off a one-layer step. On 2 cores PyTorch's threads compete with TVM's spinning "
              "thread pool and with any other load (see docs/llm.md): the eager forward is where a loaded "
              "machine shows most.",
              "", "Verdict: " + ("every target met" if not missed else "missed: " + "; ".join(missed))
              + ". Ratios vary by a few percent between runs on this 2-core machine."
              + (" Measured while other work loaded the machine's cores: re-measure on a quiet machine."
                 if options.loaded else ""), ""]
    sys.path.insert(0, str(HERE))
    from sections import write_section

    print(write_section("LLM decode step and generation (issue 24)", lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
