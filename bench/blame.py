"""The cost of a blame: builds and seconds per real TVM 0.27 bug (tests/support), every run printed.

    python bench/blame.py [--repeat N]     # a Markdown table on stdout, for bench/results.md

Each row is one ``blame()`` of one bug: the stage it names, how many TVM builds it took (the
pipeline run, the deployed build, one per snapshot or ablation checked) and the wall time, every
repetition listed (no best-of)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.tvm_bugs import BUGS  # noqa: E402
from support.tvm_pass_bugs import BUGS as PASS_BUGS  # noqa: E402
from tvm_probe.tools.blame import blame  # noqa: E402


def cases():
    for name, bug in PASS_BUGS.items():
        yield name, lambda bug=bug: blame(bug.build(), bug.inputs(), pipeline=bug.pipeline(), target=bug.target or "llvm")
    for name, bug in BUGS.items():
        yield name, lambda bug=bug: blame(*bug.build())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print("| bug | blame | builds | seconds (each run) |\n|---|---|---|---|")
    for name, run in cases():
        times, found = [], None
        for _ in range(args.repeat):
            start = time.perf_counter()
            found = run()
            times.append(time.perf_counter() - start)
        where = f" {found.kernel}" if found.stage in ("kernel", "runtime-crash") else f" {found.pass_name or ''}"
        print(f"| {name} | {found.stage}{where} | {found.builds} | {', '.join(f'{t:.2f}' for t in times)} |", flush=True)


if __name__ == "__main__":
    main()
