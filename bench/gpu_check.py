"""GPU check (issue 15): tvm_probe on a CUDA device, every value against onnxruntime on the CPU.

    python bench/gpu_check.py                 # demo BERT + a bert-base sized BERT (4 layers): minutes
    python bench/gpu_check.py --layers 12     # bert-base with all of its 12 layers
    python bench/gpu_check.py --cpu-dry-run --output /tmp/gpu_check.md   # the same steps on the CPU

NOT YET RUN ON A GPU.  It was written on a machine without one: its steps have only been run with
``--cpu-dry-run`` (same code, target ``llvm``, the CPU as the device).  The first run on a GPU is
the first real check of tvm_probe's CUDA path; read its results before trusting that path.

Per model (built for CUDA, ``sm_XY`` of device 0, with the fused GPU pipeline, dlight schedules):

1. **instruments**: a run with the Python instrument and one with the native instrument
   (``TVM_PROBE_INSTRUMENT=native``: on GPUs the native one is opt-in until this check passes)
   must write byte-identical dumps (``timings=False``), ``_tvmdbg_device_CUDA_0`` inside;
2. **values**: every value tvm_probe serves (captured, views, recomputed on the GPU, folded, ...)
   compared with onnxruntime on the CPU, per-dtype tolerances; the verdict line is recorded;
3. **overhead**: medians over interleaved rounds of a plain run (what a user does: inputs to the
   device, ``main``, outputs back, which waits for the device) against ``probe.run`` with no
   capture and with everything captured, per instrument.  Kernel times under the probe are device
   times (host clock around a device sync before and after each kernel), so the probe's runs
   include one sync per kernel; the plain run has none.

Writes ``bench/gpu_results.md`` (``--output`` for another path; a dry run writes only there).
Exit status: 0 every check passed, 1 some check failed (the file says which), 2 no GPU here.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import instrument_env  # noqa: E402  (one definition, shared with bench.py)


def gpu_target(dry_run: bool):
    """The target and device to check: CUDA device 0 with its own arch, or the CPU for a dry run."""
    import tvm

    if dry_run:
        return {"kind": "llvm"}, tvm.cpu(0)
    device = tvm.cuda(0)
    if not device.exist:
        return None, None
    arch = "sm_" + device.compute_version.replace(".", "")
    return {"kind": "cuda", "arch": arch}, device


def probes(model, target) -> dict:
    """One compiled model, with a probe per instrument on it (compiled once)."""
    from tvm_probe import Probe

    with instrument_env("python"):
        python = Probe.from_onnx(model, target=target, pipeline="fused")
    with instrument_env("native"):
        native = Probe(python.imported, python.built, python.kernel_map)
    assert python._executor.instrument == "python" and native._executor.instrument == "native"
    return {"python": python, "native": native}


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def check_instruments(pair: dict, inputs, tmp: Path) -> tuple[bool, str]:
    """Both instruments' dumps of one run, byte for byte."""
    for name, probe in pair.items():
        probe.run(inputs)
        probe.dump(tmp / name, timings=False)
    a, b = tree(tmp / "python"), tree(tmp / "native")
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    device = pair["python"].device_label
    named = any(k.startswith(f"_tvmdbg_device_{device}/") for k in a)
    ok = not differ and named
    return ok, (f"dumps byte-identical ({len(a)} files, device folder _tvmdbg_device_{device})" if ok
                else f"dumps differ in {differ[:5]}" + ("" if named else f"; no _tvmdbg_device_{device} folder"))


def check_values(probe, model, inputs) -> tuple[bool, str, list[str]]:
    """Every served value against onnxruntime on the CPU; the verdict and the worst values."""
    from tvm_probe.comparison.verdict import compare
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    probe.run(inputs)
    comparison = compare(probe, onnxruntime_values(model, inputs))
    table = comparison.table()
    checked = table[table["status"].isin(["passed", "diverged"])]
    worst = checked.sort_values("max_abs", ascending=False).head(5)
    rows = [f"| {r['name'][-70:]} | {r['served']} | {r['status']} | {r['max_abs']:.3g} |" for _, r in worst.iterrows()]
    return bool(comparison), comparison.verdict(), rows


def to_numpy(value) -> None:
    """Copy a VM result (a tensor or nested tuples of them) to the host."""
    if hasattr(value, "numpy"):
        value.numpy()
    else:
        for item in value:
            to_numpy(item)


def overhead(pair: dict, inputs, device, rounds: int) -> dict[str, float]:
    """Median seconds of a plain run and of probe runs, interleaved in a shuffled order per round."""
    import tvm

    probe = pair["python"]
    vm = tvm.relax.VirtualMachine(probe.built.executable, device)
    names = [s.name for s in probe.inputs]

    def plain():  # what a user does: numpy in, run, numpy out (which waits for the device)
        to_numpy(vm["main"](*[tvm.runtime.tensor(inputs[n], device) for n in names]))

    variants = {"plain run": plain}
    for name, p in pair.items():
        variants[f"probe, {name} instrument, capture=None"] = lambda p=p: p.run(inputs, capture=None)
        variants[f"probe, {name} instrument, capture='all'"] = lambda p=p: p.run(inputs, capture="all")
    for fn in variants.values():  # warm-up: first runs allocate
        fn()
    samples = {k: [] for k in variants}
    order = list(variants)
    for _ in range(rounds):
        random.Random(len(samples[order[0]])).shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            variants[name]()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def check_model(label: str, model, inputs, target, device, rounds: int) -> tuple[bool, list[str]]:
    """All checks on one model; (passed, markdown lines)."""
    t0 = time.perf_counter()
    pair = probes(model, target)
    build_s = time.perf_counter() - t0
    probe = pair["python"]
    lines = [f"## {label}", "", f"{len(probe.kernel_map.sites)} kernel calls, {len(probe.sources_map)} source values, "
             f"built in {build_s:.1f} s (target {probe.built.target.kind.name}, pipeline fused)", ""]
    with tempfile.TemporaryDirectory() as tmp:
        same, said = check_instruments(pair, inputs, Path(tmp))
    lines.append(f"- instruments: {'PASS' if same else 'FAIL'}: {said}")
    passed, verdict, worst = check_values(probe, model, inputs)
    lines.append(f"- values against onnxruntime (CPU): {'PASS' if passed else 'FAIL'}: {verdict}")
    lines += ["", "| largest errors | served | status | max abs |", "|---|---|---|---|", *worst, ""]
    times = overhead(pair, inputs, device, rounds)
    base = times["plain run"]
    lines += [f"Overhead (median of {rounds} interleaved rounds):", "",
              "| run | ms | ratio to plain |", "|---|---|---|"]
    lines += [f"| {k} | {v * 1e3:.2f} | {v / base:.2f}x |" for k, v in times.items()]
    lines.append("")
    return same and passed, lines


def environment(device, dry_run: bool) -> list[str]:
    import tvm

    import tvm_probe

    what = "CPU (dry run: llvm, not a GPU)" if dry_run else f"{device.device_name} (compute {device.compute_version})"
    return [f"- device: {what}", f"- TVM {tvm.__version__}, tvm_probe {tvm_probe.__version__}, Python "
            f"{platform.python_version()}, {platform.machine()}",
            f"- run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, `{' '.join(sys.argv)}`"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4, help="layers of the bert-base sized model (default 4)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per timing (default 10)")
    parser.add_argument("--output", type=Path, help="results file (default bench/gpu_results.md)")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="run every step on the CPU (llvm, tiny sizes) to check the script; writes only --output")
    args = parser.parse_args(argv)

    from tvm_probe import demo

    target, device = gpu_target(args.cpu_dry_run)
    if target is None:
        print("gpu_check: no CUDA device here (tvm.cuda(0).exist is False): run it on a machine with an NVIDIA GPU "
              "(or --cpu-dry-run to check the script)", file=sys.stderr)
        return 2
    output = args.output or (None if args.cpu_dry_run else HERE / "gpu_results.md")
    tiny = demo.tiny_bert()
    big = (demo.tiny_bert(num_layers=1, hidden=128, heads=4, seq_len=32) if args.cpu_dry_run
           else demo.bert_base(num_layers=args.layers, vocab=8192))
    big_label = ("small BERT (dry run)" if args.cpu_dry_run
                 else f"bert-base sized BERT ({args.layers} layers, hidden 768, 12 heads, seq 128, vocab 8192)")
    lines = ["# GPU check (bench/gpu_check.py)", "", *environment(device, args.cpu_dry_run), ""]
    ok = True
    for label, model in (("demo BERT (tvm_probe.demo.tiny_bert)", tiny), (big_label, big)):
        print(f"gpu_check: {label} ...", file=sys.stderr, flush=True)
        passed, section = check_model(label, model, demo.demo_inputs(model), target, device, args.rounds)
        ok &= passed
        lines += section
    lines.insert(2, f"**{'ALL CHECKS PASSED' if ok else 'SOME CHECK FAILED'}**\n")
    text = "\n".join(lines) + "\n"
    if output is not None:
        output.write_text(text)
        print(f"gpu_check: results in {output}", file=sys.stderr)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
