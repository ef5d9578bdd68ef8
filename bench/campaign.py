"""Run the op campaign (tests/support/campaign.py) and write bench/campaign_results.md.

    nice -n 10 python bench/campaign.py [--only onnx|torch] [--match SUBSTRING] [--limit N]
                                         [--pipelines default,fused] [--workers N] [--out PATH]

Every case (each ONNX node test whose ops TVM 0.27 converts, static and with symbolic input
dimensions, the extra ONNX models, the torch.export cases) is run by plain TVM and by tvm_probe
under each pipeline, in a worker process (a crash or a hang costs one case, not the run).  The
file counts per class: built by plain TVM, run by tvm_probe, values compared / equal / unknown
(with reasons), and lists every failure in one line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import random
import re
import threading
import sys
import time
from collections import Counter, defaultdict
from datetime import date
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # this checkout's tvm_probe, tests/support

from support.campaign import PIPELINES, Outcome, one_line, reason_class  # noqa: E402

CASE_TIMEOUT_S = 300


def all_cases(only: str | None = None):
    from support.campaign_onnx import onnx_cases
    from support.campaign_torch import torch_cases

    cases = []
    if only in (None, "onnx"):
        cases += onnx_cases()
    if only in (None, "torch"):
        cases += torch_cases()
    return cases


def _worker(conn, only):
    sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from support.campaign import run_case

    cases = {c.name: c for c in all_cases(only)}
    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        name, pipeline = job
        conn.send(run_case(cases[name], pipeline))


def _plain_worker(name, pipeline, only):
    sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    from support.campaign import run_plain

    case = next(c for c in all_cases(only) if c.name == name)
    try:
        run_plain(case, pipeline)
    except Exception:  # noqa: BLE001, S110 - a Python error of plain TVM: run_case records those itself
        pass


def plain_crashes(name, pipeline, only) -> str:
    """Why plain TVM alone, in a process of its own, does not finish ``name`` ('' if it does)."""
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_plain_worker, args=(name, pipeline, only), daemon=True)
    proc.start()
    proc.join(CASE_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return f"plain TVM alone did not finish in {CASE_TIMEOUT_S} s"
    return f"plain TVM alone crashed: its process died (exit {proc.exitcode})" if proc.exitcode else ""


class Worker:
    """A process that runs cases; restarted after a crash or a timeout."""

    def __init__(self, only):
        self.only, self.proc = only, None

    def start(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, self.only), daemon=True)
        self.proc.start()
        self.conn.recv()

    def run(self, case, pipeline) -> Outcome:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send((case.name, pipeline))
        if self.conn.poll(CASE_TIMEOUT_S):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        self.proc.join(60)  # a crash closes the pipe before the process is gone (its handler still prints)
        why = "timed out" if self.proc.is_alive() else f"the process died (exit {self.proc.exitcode})"
        self.proc.kill()
        self.proc.join()
        self.proc = None
        plain = plain_crashes(case.name, pipeline, self.only)  # whose crash or hang it was
        if plain:
            return Outcome(case.name, case.cls, pipeline, plain=plain)
        return Outcome(case.name, case.cls, pipeline, probe=f"campaign worker: {why}")

    def stop(self):
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(10)


# whose work a problem or an unknown is: (pattern in its one line, area); the first match wins
AREAS = (
    ("relax.run.", "data-dependent ops / non-kernel calls (other branch: dataops)"),
    ("'int' object is not iterable", "shape values (other branch: dataops)"),
    ("'NoneType' object is not iterable", "None outputs (other branch: dataops)"),
    ("plain TVM returns", "sequence or shape outputs returned wrongly (other branch: dataops)"),
    ("outside any kernel call", "sequence / shape values (other branch: dataops)"),
    ("lost between the module imported", "outputs lost on symbolic shapes, Split above all (other branch: dataops)"),
    ("writes into it in place", "an in-place copy's destination (explicit unknown by design)"),
)


def area_of(text: str) -> str:
    return next((area for pattern, area in AREAS if pattern in text), "this branch: to look at")


def summarize(outcomes: list[Outcome], seconds: float, command: str) -> str:
    by_cls = defaultdict(list)
    for o in outcomes:
        by_cls[(o.case.split("/")[0], o.cls)].append(o)
    ran = [o for o in outcomes if o.ran_plain]
    failing = [o for o in ran if o.problems]
    lines = [
        f"Run on {date.today()} with `{command}` ({seconds:.0f} s).", "",
        f"- runs (case × pipeline): {len(outcomes)}; built and run by plain TVM: {len(ran)}; "
        f"run by tvm_probe: {sum(1 for o in ran if not o.probe)}; with a problem: {len(failing)}",
        f"- values compared: {sum(o.compared for o in ran)}; equal: {sum(o.equal for o in ran)} "
        f"(of which equal to plain TVM where the reference differs: {sum(o.via_tvm for o in ran)}); "
        f"held to plain TVM's own value (built with it as an output): {sum(o.against_tvm for o in ran)}; "
        f"unknown (with why): {sum(len(o.unknown) for o in ran)}; dead: {sum(o.dead for o in ran)}; "
        f"served without a reference value: {sum(o.uncompared for o in ran)}; "
        f"wrong or get() raising: {sum(len(o.wrong) for o in ran)}", "",
        "| family | class | runs | plain TVM ran | tvm_probe ran | compared | equal | unknown | problems |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (family, cls), group in sorted(by_cls.items()):
        r = [o for o in group if o.ran_plain]
        lines.append(f"| {family} | {cls} | {len(group)} | {len(r)} | {sum(1 for o in r if not o.probe)} | "
                     f"{sum(o.compared for o in r)} | {sum(o.equal for o in r)} | "
                     f"{sum(len(o.unknown) for o in r)} | {sum(1 for o in r if o.problems)} |")
    reasons = Counter(reason_class(why) for o in ran for why in o.unknown.values())
    lines += ["", "Unknown values, by reason:", ""]
    lines += [f"- {n} × {why}" for why, n in reasons.most_common()] or ["- none"]
    areas = Counter(area_of(p) for o in failing for p in o.problems)
    unknown_areas = Counter(area_of(why) for o in ran for why in o.unknown.values())
    lines += ["", "Problems, by area (runs with a problem):", ""]
    lines += [f"- {n} × {area}" for area, n in areas.most_common()] or ["- none"]
    lines += ["", "Unknown values, by area:", ""]
    lines += [f"- {n} × {area}" for area, n in unknown_areas.most_common()] or ["- none"]
    kinds = Counter(reason_class(p) for o in failing for p in o.problems)
    lines += ["", "Problems, by kind:", ""]
    lines += [f"- {n} × {why}" for why, n in kinds.most_common()] or ["- none"]
    lines += ["", "Failures (case, pipeline: first problem):", ""]
    lines += [f"- {o.case} [{o.pipeline}]: {one_line(o.problems[0], 240)}"
              + (f" (+{len(o.problems) - 1} more)" if len(o.problems) > 1 else "") for o in failing] or ["- none"]
    plain = Counter(reason_class(o.plain) for o in outcomes if not o.ran_plain)
    lines += ["", "Not built or run by plain TVM (not ours to run), by reason:", ""]
    lines += [f"- {n} × {why}" for why, n in plain.most_common()] or ["- none"]
    return "\n".join(lines) + "\n"


def resummarize(out: Path, only, redo: bool) -> int:
    """Write ``out`` again from the outcomes its run logged (``out.jsonl``): a run stopped early,
    or (``redo``) one whose failing cases were run again after a fix, replacing their outcomes."""
    log = out.with_suffix(".jsonl")
    outcomes = [Outcome(**json.loads(line)) for line in log.read_text().splitlines() if line]
    if redo:
        worker = Worker(only)
        try:
            cases = {c.name: c for c in all_cases(only)}
            outcomes = [worker.run(cases[o.case], o.pipeline) if o.problems else o for o in outcomes]
        finally:
            worker.stop()
        log.write_text("".join(json.dumps(dataclasses.asdict(o)) + "\n" for o in outcomes))
    header = out.read_text().split("\n\n")
    run = next((h for h in header if h.startswith("Run on")), "")
    command = (run.split("`")[1:2] or ["?"])[0]
    seconds = float((re.findall(r"\((\d+) s\)", run) or ["0"])[0])
    partial = next((h for h in header if h.startswith("Partial:")), "")
    note = " Failing runs were run again after the fixes since (`--redo-problems`)." if redo else ""
    text = summarize(outcomes, seconds, command)
    out.write_text("# Op campaign results\n\n" + (partial + note + "\n\n" if partial or note else "") + text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("onnx", "torch"))
    parser.add_argument("--match", default="", help="run only cases whose name contains this")
    parser.add_argument("--limit", type=int, default=0, help="at most this many cases (0: all)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--workers", type=int, default=1, help="worker processes (each runs its share)")
    parser.add_argument("--out", type=Path, default=HERE / "campaign_results.md")
    parser.add_argument("--summarize", action="store_true",
                        help="only write the results file again from the outcomes a run logged (PATH.jsonl)")
    parser.add_argument("--redo-problems", action="store_true",
                        help="as --summarize, after running again every logged outcome with a problem")
    args = parser.parse_args(argv)
    if args.summarize or args.redo_problems:
        return resummarize(args.out, args.only, args.redo_problems)
    cases = [c for c in all_cases(args.only) if args.match in c.name]
    random.Random(0).shuffle(cases)  # a run stopped early is a uniform sample of each part:
    ours = [c for c in cases if "/test_" not in c.name]  # the torch cases and ONNX extras,
    node = [c for c in cases if "/test_" in c.name]      # ONNX's node tests, taken in turn
    cases = [c for pair in zip(ours, node) for c in pair] + ours[len(node):] + node[len(ours):]
    cases = cases[:args.limit] if args.limit else cases
    command = ("python bench/campaign.py " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    outcomes, t0, lock, done = [], time.perf_counter(), threading.Lock(), [0]
    log = args.out.with_suffix(".jsonl").open("w")  # every outcome as it comes (to summarize again)

    def write(finished: bool) -> str:
        text = summarize(outcomes, time.perf_counter() - t0, command)
        progress = "" if finished else f"Partial: {done[0]} of {len(cases)} cases run so far.\n\n"
        args.out.write_text("# Op campaign results\n\n" + progress + text)
        return text

    def drive(share):
        worker = Worker(args.only)
        try:
            for case in share:
                for pipeline in args.pipelines.split(","):
                    outcome = worker.run(case, pipeline)
                    with lock:
                        outcomes.append(outcome)
                        log.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
                        log.flush()
                    if outcome.problems:
                        print(f"{case.name} {pipeline}: {outcome.problems[:2]}", flush=True)
                with lock:
                    done[0] += 1
                    if done[0] % 10 == 0:
                        write(False)
        finally:
            worker.stop()

    threads = [threading.Thread(target=drive, args=(cases[k::args.workers],)) for k in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(write(True).split("\n\n")[1])
    return 1 if any(o.problems for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
