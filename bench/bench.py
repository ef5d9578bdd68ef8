"""tvm_probe benchmarks: what capturing costs, measured side by side in one process.

    python bench/bench.py                 # demo BERT and bert-base, both pipelines (~20 min on 2 cores)
    python bench/bench.py --quick         # demo BERT only (~1 min)

Writes ``bench/results.md``.  Each comparison interleaves its variants run by run and reports
medians and their ratio; peak memory is measured in a fresh subprocess per mode, as the
high-water mark of resident memory during the run alone (``/proc/self/clear_refs``).
Targets: full capture <= 1.10x a plain run, selective <= 1.02x, build <= 1.15x, disk-mode peak
<= plain peak + 2 x the largest captured tensor + 64 MiB.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SELECTIVE = "layer_._0/attention/self/MatMul"   # fused away under "fused": needs its kernel's inputs
TARGETS = {"full (memory)": 1.10, "full (disk)": 1.10, "selective (one name)": 1.02, "build": 1.15}


def model_for(name: str):
    from tvm_probe import demo

    model = demo.tiny_bert() if name == "demo" else demo.bert_base()
    return model, demo.demo_inputs(model)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleave(variants: dict, rounds: int) -> dict[str, float]:
    """Median seconds of each variant, running them in turn ``rounds`` times."""
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(timed(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


# ------------------------------------------------------------------------------ measurements
def bench_build(model, pipeline: str, rounds: int) -> dict[str, float]:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from tvm_probe import Probe
    from tvm_probe.build import compile_plain

    def plain():
        relax.VirtualMachine(compile_plain(from_onnx(model), "llvm", pipeline), tvm.cpu())

    def probe():
        Probe.from_onnx(model, pipeline=pipeline)

    return interleave({"plain import + tvm.compile": plain, "probe build": probe}, rounds)


def bench_runs(probe, inputs, rounds: int, tmp: Path) -> dict[str, float]:
    import tvm

    vm = tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())  # no instrument at all

    def plain():  # what a user does without tvm_probe: numpy in, run, numpy out
        vm["main"](*[tvm.runtime.tensor(inputs[s.name]) for s in probe.inputs]).numpy()

    hooked = tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())
    hooked.set_instrument(lambda *args: 0)

    def plain_noop_hook():  # TVM's own price for any instrument: a Python call per VM instruction
        hooked["main"](*[tvm.runtime.tensor(inputs[s.name]) for s in probe.inputs]).numpy()

    variants = {
        "plain": plain,
        "plain + no-op instrument": plain_noop_hook,
        "full (memory)": lambda: probe.run(inputs, capture="all"),
        "full (disk)": lambda: probe.run(inputs, capture="all", stream_to=tmp / "stream", overwrite=True,
                                         recomputed=False),
        "selective (one name)": lambda: probe.run(inputs, capture=[SELECTIVE]),
    }
    if any(v.served.value == "recomputed" for v in probe.sources_map):
        # the same, plus recomputing every fused-away value into the dump (an extra pass over
        # the fused kernels, unfused): what a complete, TVM-free dump costs
        variants["full (disk) + recomputed values"] = lambda: probe.run(
            inputs, capture="all", stream_to=tmp / "stream", overwrite=True)
    variants["plain"]()  # warm-up: first calls allocate
    return interleave(variants, rounds)


def bench_recompute(model, inputs, pipeline) -> dict[str, float]:
    from tvm_probe import Probe

    probe = Probe.from_onnx(model, pipeline=pipeline)  # fresh: no cut module compiled yet
    key = probe.resolve(SELECTIVE)
    probe.run(inputs)
    site = probe.kernel_map.site_of(key)
    if site is None or probe.served(SELECTIVE) != "recomputed":
        return {}
    first = timed(lambda: probe.get(SELECTIVE))           # compiles the cut module
    probe.run(inputs)                                     # new run: value cache cleared, cut cached
    cached = timed(lambda: probe.get(SELECTIVE))
    kernel = probe.node_infos[probe.num_input_nodes + site].time_us / 1e6
    return {"first get": first, "cached get (new run)": cached, "its kernel in the run": kernel}


def bench_onnxruntime(model, inputs, rounds: int) -> dict[str, float]:
    import onnx
    import onnxruntime as ort

    everything = onnx.ModelProto()
    everything.CopyFrom(model)
    for name in [o for n in everything.graph.node for o in n.output if o]:
        if name not in {o.name for o in everything.graph.output}:
            everything.graph.output.append(onnx.ValueInfoProto(name=name))
    plain = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    full = ort.InferenceSession(everything.SerializeToString(), providers=["CPUExecutionProvider"])
    plain.run(None, inputs), full.run(None, inputs)
    return interleave({"onnxruntime": lambda: plain.run(None, inputs),
                       "onnxruntime, every intermediate as output": lambda: full.run(None, inputs)}, rounds)


def peak_memory(model_name: str, pipeline: str, mode: str) -> dict:
    """Run one mode in a fresh process; its peak resident memory during the run alone."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench; bench._peak_child({model_name!r}, {pipeline!r}, {mode!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _vm_hwm() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _peak_child(model_name: str, pipeline: str, mode: str) -> None:
    import tvm

    from tvm_probe import Probe

    model, inputs = model_for(model_name)
    probe = Probe.from_onnx(model, pipeline=pipeline)
    arrays = [tvm.runtime.tensor(inputs[s.name]) for s in probe.inputs]
    vm = tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())
    vm["main"](*arrays)
    largest = max(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize
                  for site in probe.kernel_map.sites for s, d in zip(site.out_shapes, site.out_dtypes))
    with tempfile.TemporaryDirectory() as tmp:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current resident size
        before = _vm_hwm()
        if mode == "plain":
            vm["main"](*arrays)
        elif mode == "full (memory)":
            probe.run(inputs, capture="all")
        elif mode == "full (disk)":
            probe.run(inputs, capture="all", stream_to=Path(tmp) / "d", recomputed=False)
        else:
            probe.run(inputs, capture=[SELECTIVE])
        print(json.dumps({"peak": _vm_hwm(), "start": before, "largest": largest}))


# ------------------------------------------------------------------------------ report
def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def ratio_row(name: str, seconds: float, base: float, target: float | None) -> str:
    r = seconds / base if base else float("nan")
    verdict = "" if target is None else ("met" if r <= target else f"**missed by {100 * (r / target - 1):.0f}%**")
    return f"| {name} | {seconds * 1e3:.2f} ms | {r:.3f}x | {'' if target is None else f'<= {target:.2f}x'} | {verdict} |"


NOTES = """## Why targets are missed where they are

- **Demo BERT runs (under 1 ms).** TVM's VM calls an instrument before and after every VM
  instruction (about 160 in the demo, kernels and builtins alike), and each call crosses into
  Python; the "plain + no-op instrument" row is that price alone, before tvm_probe does anything.
  `Probe.run` adds fixed per-run work (input checks, occurrence bookkeeping, result conversion).
  Together that is well under a millisecond, which is most of a demo run but below 1% of a
  bert-base run, where every target is met. Selective capture cannot skip the instrument: TVM
  has no per-kernel hook, and the VM must be stopped exactly after the kernel of interest.
- **Full capture to disk on the demo.** A complete dump has fixed costs (six files, fsync, a
  sha256 manifest: about 10 ms) that dwarf a sub-millisecond run. On bert-base streaming costs
  about what capturing to memory costs, with a bounded peak.
- **"+ recomputed values".** Writing every fused-away value into the dump runs each fused
  kernel's group once more, unfused, so it costs about one more model run; it is optional
  (`recomputed=False`) and `get` recomputes single values on demand (the recompute line).
- **Build.** Probe build can be *faster* than plain: TVM's `from_onnx` runs `onnx.checker` over the
  whole model first, which tvm_probe's import does not; weights are converted and the model is
  hashed only when a dump needs them.
""".splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="demo BERT only")
    parser.add_argument("--out", type=Path, default=HERE / "results.md")
    args = parser.parse_args()
    models = ["demo"] if args.quick else ["demo", "bert-base"]
    lines = ["# tvm_probe benchmark results", "",
             f"Machine: {os.cpu_count()} cores, {sys.platform}; python {sys.version.split()[0]}; "
             f"written by `bench/bench.py` on {time.strftime('%Y-%m-%d %H:%M')}.", "",
             "Medians of interleaved runs; ratios are against the plain run of the same executable "
             "without an instrument (numpy inputs in, model output back as numpy, as a user runs it).",
             ""]
    for model_name in models:
        model, inputs = model_for(model_name)
        rounds = 9 if model_name == "demo" else 3
        for pipeline in ("default", "fused"):
            lines += bench_one(model_name, model, inputs, pipeline, rounds)
        lines += ["### onnxruntime anchor", "", "| variant | median | ratio |", "|---|---|---|"]
        ort_times = bench_onnxruntime(model, inputs, rounds)
        base = ort_times["onnxruntime"]
        lines += [f"| {k} | {v * 1e3:.2f} ms | {v / base:.3f}x |" for k, v in ort_times.items()] + [""]
    lines += NOTES
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def bench_one(model_name, model, inputs, pipeline, rounds) -> list[str]:
    from tvm_probe import Probe

    print(f"[{model_name}, {pipeline}] ...", file=sys.stderr)
    lines = [f"## {model_name} BERT, `{pipeline}` pipeline", ""]
    build = bench_build(model, pipeline, 3 if model_name == "demo" else 1)
    lines += ["| build | median | ratio | target | |", "|---|---|---|---|---|"]
    base = build["plain import + tvm.compile"]
    lines += [ratio_row(k, v, base, TARGETS["build"] if k == "probe build" else None) for k, v in build.items()]
    probe = Probe.from_onnx(model, pipeline=pipeline)
    with tempfile.TemporaryDirectory() as tmp:
        runs = bench_runs(probe, inputs, rounds, Path(tmp))
    lines += ["", "| run | median | ratio | target | |", "|---|---|---|---|---|"]
    lines += [ratio_row(k, v, runs["plain"], TARGETS.get(k)) for k, v in runs.items()]
    rec = bench_recompute(model, inputs, pipeline)
    if rec:
        lines += ["", f"Recomputing `{SELECTIVE}` (fused away): "
                  + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in rec.items()) + "."]
    lines += ["", "| peak memory during the run | peak RSS | above plain | bound |", "|---|---|---|---|"]
    peaks = {mode: peak_memory(model_name, pipeline, mode) for mode in runs if "recomputed" not in mode}
    plain = peaks["plain"]["peak"]
    largest = peaks["plain"]["largest"]
    for mode, p in peaks.items():
        bound = ""
        if mode == "full (disk)":
            limit = plain + 2 * largest + 64 * 2**20
            bound = f"<= {mib(limit)}: " + ("met" if p["peak"] <= limit else f"**missed by {mib(p['peak'] - limit)}**")
        lines.append(f"| {mode} | {mib(p['peak'])} | {mib(p['peak'] - plain)} | {bound} |")
    lines += ["", f"Largest kernel output: {mib(largest)}.", ""]
    return lines


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    main()
