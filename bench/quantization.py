"""What a quantization sensitivity ranking costs, against one build + one run of the QDQ model, and
whether it ranks as onnxruntime's own quantizer does.

    python bench/quantization.py          # the issue's MLP, a 16-layer MLP, PP-OCR's classifier, the demo BERT

For each model (quantized by onnxruntime's quantize_static, QDQ, default options): the quantized
ops, the time of one build + one run of the QDQ model (a Probe, capturing nothing), of
``compare_quantized`` and of ``sensitivity`` (its one switchable build, the real builds that check
it, one run per op), and what building every variant on its own would cost (measured on the small
model, estimated as ops × one build + run on the others).  Then the ground truth: every op
excluded in turn by onnxruntime's quantizer (``nodes_to_exclude=[op]``, run by onnxruntime with no
graph optimization), its best op and whether each row's SQNR is that exclusion's.  Appends
(replaces) the section "## Quantization sensitivity (bench/quantization.py)" of
``bench/results.md``.
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
sys.path.insert(0, str(HERE.parent / "tests"))  # support.quantized_models: the models the tests quantize
sys.path.insert(0, str(HERE))


def cases():
    """(label, float model, input shape, inputs, calibration on uniform data, measure each variant alone)."""
    import onnx
    from support import quantized_models as qm

    from tvm_probe import demo

    mlp = qm.mlp("Relu")
    yield "the issue's MLP (Relu folded, outlier in fc2)", mlp, (8, qm.D), {"x": qm.draw((8, qm.D), 5)}, False, True
    deep = qm.mlp("Relu", layers=16, outlier=5)
    yield "16-layer MLP (outlier in fc6)", deep, (8, qm.D), {"x": qm.draw((8, qm.D), 5)}, False, False
    shape = (4, 3, 48, 96)
    yield ("PP-OCR mobile classifier (dynamic batch and width)", onnx.load(qm.PPOCR_CLS), shape,
           {"x": qm.draw(shape, 5, uniform=True)}, True, False)
    bert = demo.tiny_bert()
    yield "demo BERT (tiny, 2 layers)", bert, None, demo.demo_inputs(bert), False, False


def _quantize(model, folder: Path, shape, inputs, uniform: bool, exclude=()):
    """The float model saved and quantized with default options (the BERT calibrated on its inputs)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    from support import quantized_models as qm

    float_path = folder / "float.onnx"
    if not float_path.exists():
        onnx.save(model, float_path)
    out = folder / ("excluded.onnx" if exclude else "qdq.onnx")
    if shape is not None:
        return float_path, qm.quantize(float_path, out, shape, exclude=exclude, batches=4 if uniform else 8,
                                       uniform=uniform)

    class Once(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([inputs])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(float_path), str(out), Once(), quant_format=QuantFormat.QDQ, nodes_to_exclude=list(exclude))
    return float_path, out


def _unfused(model_path, inputs):
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in onnx.load(str(model_path)).graph.output]
    return dict(zip(names, session.run(names, {k: v for k, v in inputs.items()
                                              if k in {i.name for i in session.get_inputs()}})))


def measure(label, model, shape, inputs, uniform, each_alone: bool, folder: Path) -> tuple[str, str]:
    from tvm_probe.tools.quantization import compare_quantized, sensitivity

    from tvm_probe import Probe
    from tvm_probe.core.metrics import error_stats, worst

    float_path, qdq_path = _quantize(model, folder, shape, inputs, uniform)
    shapes = {"x": shape} if shape is not None and len(shape) == 4 else None
    start = time.perf_counter()
    Probe.from_onnx(qdq_path, shapes=shapes).run(inputs, capture=None)
    one = time.perf_counter() - start
    start = time.perf_counter()
    report = compare_quantized(float_path, qdq_path, inputs, shapes=shapes)
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
    cost = (f"| {label} | {n} | {sum(len(op.folded) for op in ranking.study.ops)} | {one:.1f} s | {compared:.1f} s "
            f"| {ranked:.1f} s | {alone} | {ranking.float_sqnr_db:.1f} dB |")
    reference = _unfused(float_path, inputs)
    truth = {}
    for name in ranking.ranking():
        _, excluded = _quantize(model, folder, shape, inputs, uniform, exclude=[name])
        values = _unfused(excluded, inputs)
        truth[name] = worst(error_stats(values[k], reference[k]) for k in reference).snr_db
    best = max(truth, key=truth.get)
    worst_gap = max(abs(row["sqnr_db"] - truth[row["name"]]) for row in ranking.rows)
    agree = (f"| {label} | {ranking.ranking()[0]} ({ranking.rows[0]['sqnr_db']:.2f} dB) | {best} "
             f"({truth[best]:.2f} dB) | {worst_gap:.3f} dB | {ranking.baseline_sqnr_db:.2f} dB |")
    return cost, agree


def _warm_up(folder: Path) -> None:
    """Load TVM, onnxruntime and the native instrument once, outside every measurement."""
    from support import quantized_models as qm

    from tvm_probe import Probe

    (folder / "warm").mkdir()
    _, qdq_path = _quantize(qm.mlp("Relu", layers=2, outlier=0), folder / "warm", (8, qm.D), None, False)
    Probe.from_onnx(qdq_path).run({"x": qm.draw((8, qm.D), 5)}, capture=None)


def main() -> None:
    logging.disable(logging.WARNING)  # onnxruntime's quantizer asks for pre-processing every time
    costs, agreements = [], []
    with tempfile.TemporaryDirectory() as tmp:
        _warm_up(Path(tmp))
        for i, (label, model, shape, inputs, uniform, each_alone) in enumerate(cases()):
            print(f"[{label}] ...", file=sys.stderr)
            folder = Path(tmp) / str(i)
            folder.mkdir()
            cost, agree = measure(label, model, shape, inputs, uniform, each_alone, folder)
            costs.append(cost)
            agreements.append(agree)
            print(cost, agree, sep="\n", file=sys.stderr)
    note = (f"`default` pipeline, llvm, {os.cpu_count()} cores; written on {time.strftime('%Y-%m-%d %H:%M')}; one "
            "run. One = Probe.from_onnx of the QDQ model + one run capturing nothing (TVM compiles lazily: about "
            "half of it is the first run). compare_quantized: that build, run capturing everything, and "
            "onnxruntime on both models. sensitivity (after compare_quantized, reusing its build): the switchable "
            "build, real builds of the top-ranked op and of every op in float to check it, one run per op. Each "
            "alone: every single-op variant compiled as its own model. Every op in float: the outputs' SQNR "
            "against the float model (onnxruntime), which is the float model (>= 100 dB).")
    truth_note = ("Against onnxruntime's own quantizer: each op excluded in turn "
                  "(`quantize_static(nodes_to_exclude=[op])`, the same calibration), run by onnxruntime with no "
                  "graph optimization, outputs' SQNR against the float model. Largest gap: between a ranking row "
                  "(TVM's build) and that exclusion (onnxruntime), over all ops. On the deep models the gaps are "
                  "the two runtimes' float32 roundings crossing QuantizeLinear boundaries, not the variants: each "
                  "variant is onnxruntime's exclusion model itself (the tests run both in onnxruntime, to the bit; "
                  "docs/quantization.md, 'Which runtime measures the ranking').")
    lines = [note, "",
             ("| model | quantized ops | activations folded | one build + run | compare_quantized | sensitivity "
              "| each variant alone | every op in float |"),
             "|---|---|---|---|---|---|---|---|", *costs, "", truth_note, "",
             "| model | ranked first | onnxruntime's best exclusion | largest gap | QDQ model as given |",
             "|---|---|---|---|---|", *agreements]
    from sections import write_section  # (bench/, on sys.path above)

    print(write_section(TITLE, lines))


if __name__ == "__main__":
    main()
