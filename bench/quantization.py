"""What a quantization sensitivity ranking costs, against one build + one run of the QDQ model.

    python bench/quantization.py          # the test model, a 16-layer stack, the demo BERT (~6 min, 2 cores)

For each model (quantized by onnxruntime's quantize_static, QDQ, per-tensor int8): the quantized
ops, the time of one build + one run of the QDQ model (a Probe, capturing nothing), of
``compare_quantized`` and of ``sensitivity`` (its one switchable build, the real builds that check
it, one run per op), and what building every variant on its own would cost (measured on the small
model, estimated as ops × one build + run on the others).  Appends (replaces) the section
"## Quantization sensitivity (bench/quantization.py)" of ``bench/results.md``.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TITLE = "Quantization sensitivity (bench/quantization.py)"
sys.path.insert(0, str(HERE.parent / "tests" / "tools"))  # test_quantization_onnx.py, whose models this measures
sys.path.insert(0, str(HERE))


def _bert():
    from onnxruntime.quantization import CalibrationDataReader

    from tvm_probe import demo

    model = demo.tiny_bert()
    inputs = demo.demo_inputs(model)

    class Once(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([inputs])

        def get_next(self):
            return next(self.batches, None)

    return model, Once(), inputs


def cases():
    from test_quantization_onnx import Reader, _inputs, outlier_model

    yield "test model (3 layers, outlier in layer 1)", outlier_model(), Reader(), _inputs(), True
    yield "16-layer stack (outlier in layer 5)", outlier_model(16, 5), Reader(), _inputs(), False
    yield "demo BERT (tiny, 2 layers)", *_bert(), False


def measure(label, model, reader, inputs, each_alone: bool, folder: Path) -> str:
    from test_quantization_onnx import _quantize
    from tvm_probe.quantization import compare_quantized, sensitivity

    from tvm_probe import Probe

    float_path, qdq_path = _quantize(model, folder, reader)
    start = time.perf_counter()
    Probe.from_onnx(qdq_path).run(inputs, capture=None)
    one = time.perf_counter() - start
    start = time.perf_counter()
    report = compare_quantized(float_path, qdq_path, inputs)
    compared = time.perf_counter() - start
    start = time.perf_counter()
    ranking = sensitivity(float_path, qdq_path, inputs, comparison=report)
    ranked = time.perf_counter() - start
    n = len(ranking.rows)
    if each_alone:  # every variant built on its own, as the switchable build is checked against
        start = time.perf_counter()
        for name in ranking.ranking():
            ranking.study.outputs_with([name])
        alone = f"{time.perf_counter() - start:.1f} s (measured)"
    else:
        alone = f"~{n * one:.0f} s (ops × one)"
    return (f"| {label} | {n} | {one:.1f} s | {compared:.1f} s | {ranked:.1f} s | {alone} | "
            f"{ranking.ranking()[0]}{' (' + ranking.note + ')' if ranking.note else ''} |")


def _warm_up(folder: Path) -> None:
    """Load TVM, onnxruntime and the native instrument once, outside every measurement."""
    from test_quantization_onnx import Reader, _inputs, _quantize, outlier_model

    from tvm_probe import Probe

    (folder / "warm").mkdir()
    _, qdq_path = _quantize(outlier_model(1, 0), folder / "warm", Reader())
    Probe.from_onnx(qdq_path).run(_inputs(), capture=None)


def main() -> None:
    logging.disable(logging.WARNING)  # onnxruntime's quantizer asks for pre-processing every time
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        _warm_up(Path(tmp))
        for i, (label, model, reader, inputs, each_alone) in enumerate(cases()):
            print(f"[{label}] ...", file=sys.stderr)
            folder = Path(tmp) / str(i)
            folder.mkdir()
            rows.append(measure(label, model, reader, inputs, each_alone, folder))
            print(rows[-1], file=sys.stderr)
    note = (f"`default` pipeline, llvm, {os.cpu_count()} cores; written on {time.strftime('%Y-%m-%d %H:%M')}. "
            "One = Probe.from_onnx of the QDQ model + one run capturing nothing (TVM compiles lazily: about half "
            "of it is the first run). compare_quantized: that build, run capturing everything, and onnxruntime "
            "on both models. sensitivity (after compare_quantized, reusing its build): the switchable build, "
            "one real build of the top-ranked op to check it, one run per op. Each alone: every single-op "
            "variant compiled as its own model.")
    lines = [note, "",
             ("| model | quantized ops | one build + run | compare_quantized | sensitivity | each variant alone "
              "| ranked first |"),
             "|---|---|---|---|---|---|---|", *rows]
    from sections import write_section  # (bench/, on sys.path above)

    print(write_section(TITLE, lines))



if __name__ == "__main__":
    main()
