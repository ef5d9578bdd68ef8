"""What probing costs on an LLM decode step and on a generation compare (issue 24).

    python bench/llm.py [--family llama] [--pipeline default] [--repeat 30]

A tiny seeded transformers decoder (tests/hf_models.py) through ``Probe.from_hf``.  Measured,
interleaved run by run, medians:

* one decode step: the plain VM call (``vm["decode"]`` on the same arguments) against
  ``probe.call("decode", ..., capture=None)`` and ``capture=["model.model.layers.0"]``
  (target <= 1.05x);
* a 16-step generation: ``probe.generate`` against ``generate`` + ``compare_generation``
  (the eager reference included; target <= 3x).

Prints a Markdown table; nothing is written.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def _decode_args(probe, ids):
    """Arguments of the first decode step: the prefill's cache, the next token and position."""
    import numpy as np

    shape = probe.hf.shape
    past = [np.zeros((1, shape.kv_heads, 0, shape.head_dim), np.float32) for _ in range(2 * shape.layers)]
    out = probe.call("prefill", ids, np.arange(ids.shape[1], dtype=np.int64)[None, :], *past, capture=None)
    token = np.array([[int(out[0].numpy()[0, -1].argmax())]], np.int64)
    return token, np.array([[ids.shape[1]]], np.int64), list(out[1:])


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
    parser.add_argument("--repeat", type=int, default=30)
    options = parser.parse_args(argv)

    import tvm
    from hf_models import decoder_ids, hf_decoder
    from tvm_probe import Probe
    from tvm_probe.hf import compare_generation

    model = hf_decoder(options.family)
    ids = decoder_ids(0, batch=1, seq=8).numpy()
    probe = Probe.from_hf(model, pipeline=options.pipeline, max_len=32)
    token, position, past = _decode_args(probe, ids)
    # what a user deploys: a VM of the same executable with no instrument (the probe's own VM keeps
    # the no-op instrument its last instrumented run left)
    plain = tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())["decode"]
    variants = {
        # the token and position come from the host each step, as in a user's decode loop
        "plain VM call": lambda: plain(tvm.runtime.tensor(token), tvm.runtime.tensor(position), *past),
        "probe.call, capture=None": lambda: probe.call("decode", token, position, *past, capture=None),
        "probe.call, one layer": lambda: probe.call("decode", token, position, *past,
                                                    capture=["model.model.layers.0"]),
    }
    for fn in variants.values():  # warm up (first-call instrument set-up)
        fn()
    rounds = {name: [] for name in variants}
    for _ in range(options.repeat):  # interleaved, so load on the machine hits every variant alike
        for name, fn in variants.items():
            rounds[name].append(_median_us(fn, 1))
    base = statistics.median(rounds["plain VM call"])
    print(f"| decode step ({options.family}, {options.pipeline}) | median us | ratio |\n|---|---|---|")
    for name, times in rounds.items():
        print(f"| {name} | {statistics.median(times):.0f} | {statistics.median(times) / base:.3f}x |")

    steps = 16
    start = time.perf_counter()
    probe.generate(ids, steps=steps)
    generation = time.perf_counter() - start
    start = time.perf_counter()
    result = compare_generation(probe)
    compare = time.perf_counter() - start
    print(f"\n| {steps}-step generation | s |\n|---|---|\n| generate | {generation:.2f} |\n"
          f"| generate + compare_generation | {generation + compare:.2f} ({(generation + compare) / generation:.2f}x) |\n"
          f"\nverdict: {result.verdict()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
