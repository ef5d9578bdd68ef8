"""Run the kernel-map fuzzer on many graphs and add how many passed to bench/fuzz_results.md.

    python bench/fuzz.py --graphs 5000 [--start 0] [--max-ops 10]

Each graph (``tests/support/fuzz_graphs.py``, seeded by its number) is probed under the ``default`` and
``fused`` pipelines and every served value checked against onnxruntime.  A failing seed is
printed with its problems; replay it with ``--start SEED --graphs 1`` and turn it into a test in
``tests/kernel_map/test_kernel_map_regressions.py``.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/, where the support package is

from support.fuzz_graphs import RandomChooser, check_probe, random_graph, random_inputs  # noqa: E402

PIPELINES = ("default", "fused")


def check_seed(seed: int, max_ops: int) -> list[str]:
    """Problems of graph ``seed`` under both pipelines (empty when everything is right)."""
    from tvm_probe import Probe

    model, inputs = random_graph(RandomChooser(seed), max_ops=max_ops)
    other = random_inputs(model, np.random.default_rng(seed + 1))
    problems = []
    for pipeline in PIPELINES:
        try:
            probe = Probe.from_onnx(model, pipeline=pipeline)
            probe.run(inputs)
            problems += [f"{pipeline}: {p}" for p in check_probe(probe, model, inputs, other)]
        except Exception as err:  # a crash is a finding too
            problems.append(f"{pipeline}: {type(err).__name__}: {err}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--max-ops", type=int, default=10, help="op groups per graph")
    parser.add_argument("--out", type=Path, default=HERE / "fuzz_results.md")
    args = parser.parse_args(argv)
    failed, t0 = {}, time.perf_counter()
    for seed in range(args.start, args.start + args.graphs):
        problems = check_seed(seed, args.max_ops)
        if problems:
            failed[seed] = problems
            print(f"seed {seed}: {problems[:3]}", flush=True)
    seconds = time.perf_counter() - t0
    passed = args.graphs - len(failed)
    summary = (f"{passed} of {args.graphs} graphs passed under both pipelines "
               f"(seeds {args.start}..{args.start + args.graphs - 1}, max {args.max_ops} op groups, "
               f"{seconds:.0f} s)")
    print(summary)
    earlier = args.out.read_text() if args.out.exists() else "# Kernel-map fuzzer results\n\n"
    lines = [f"Run on {date.today()} with `python bench/fuzz.py --graphs {args.graphs} --start {args.start} "
             f"--max-ops {args.max_ops}`:", "", summary, ""]
    lines += [f"- seed {s}: {'; '.join(p[:3])}" for s, p in failed.items()]
    args.out.write_text(earlier.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")  # earlier runs are kept
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
