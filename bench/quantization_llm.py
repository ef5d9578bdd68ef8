"""What a weight-only quantization sensitivity analysis costs (issue 34).

    python bench/quantization_llm.py [--family llama] [--steps 8] [--pipeline default]

A tiny seeded transformers decoder (tests/support/hf_models.py).  Measured, wall clock, once
each (builds dominate and take tens of seconds here; the ratios are what matter):

* the float build (``Probe.from_hf``) and one generation of ``steps`` tokens;
* the q4f32_1 build and one generation: the unit the analysis is compared against;
* ``sensitivity_hf(model, "q4f32_1", steps=)``: its one build (the float-switch layout) and its
  ``2 * modules + 2`` teacher-forced runs; then ``keep_float()``;
* what one rebuild per variant would cost instead (the variants times one build, estimated).

Prints the table and writes it to bench/results.md (section "LLM quantization sensitivity").
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]  # the tree's tvm_probe; tests/support


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="llama")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--pipeline", default="default")
    options = parser.parse_args(argv)

    from sections import write_section
    from support.hf_models import decoder_ids, hf_decoder
    from tvm_probe import Probe
    from tvm_probe.tools.quantization.llm import sensitivity_hf

    model, ids, steps = hf_decoder(options.family), decoder_ids(0, batch=1, seq=8).numpy(), options.steps
    max_len = max(64, ids.shape[1] + steps)
    rows = []
    for label, quantize in [("float", None), ("q4f32_1", "q4f32_1")]:
        probe, build_s = _timed(lambda: Probe.from_hf(model, pipeline=options.pipeline, quantize=quantize,
                                                      max_len=max_len))
        _, generate_s = _timed(lambda: probe.generate(ids, steps=steps, capture=None))
        rows.append((f"{label}: build", build_s))
        rows.append((f"{label}: one generation of {steps} tokens", generate_s))
    unit = rows[2][1] + rows[3][1]
    report, total_s = _timed(lambda: sensitivity_hf(model, "q4f32_1", prompt=ids, steps=steps,
                                                    pipeline=options.pipeline, max_len=max_len))
    timings = dict(report.timings)
    kept, keep_s = _timed(lambda: report.keep_float())
    variants = timings["runs"]
    rows += [("sensitivity_hf: its one build (float-switch layout)", timings["build_s"]),
             (f"sensitivity_hf: {variants} teacher-forced runs of {steps} steps", timings["run_s"]),
             ("sensitivity_hf: total", total_s),
             (f"keep_float(): {report.timings['keep_float_runs']} more runs", keep_s),
             (f"one rebuild per variant instead (estimated: {variants} x the q4f32_1 build)", variants * rows[2][1])]
    lines = [f"`python bench/quantization_llm.py --family {options.family} --steps {steps} --pipeline "
             f"{options.pipeline}`: a tiny seeded {options.family} ({len(report.modules)} quantized modules), "
             "2 busy CPU cores, wall clock, once each.", "",
             "| what | seconds | x (q4f32_1 build + one generation) |", "|---|---|---|"]
    lines += [f"| {what} | {s:.3f} | {s / unit:.2f}x |" for what, s in rows]
    lines += ["", f"The analysis costs one build plus {variants} runs of {steps} calls: "
              f"{total_s / unit:.2f}x one build and one generation, where rebuilding per variant would cost "
              f"~{variants * rows[2][1] / unit:.0f}x.  The float-switch layout's build is "
              f"{timings['build_s'] / rows[2][1]:.2f}x the plain q4f32_1 build (it also holds the float weights "
              "and a `where` per module).  Most sensitive alone: "
              f"{report.modules[0].path}; keep_float({steps}) = {kept}."]
    print(write_section("LLM quantization sensitivity (issue 34)", lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
