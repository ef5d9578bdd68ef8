"""How many rebuilds ``tvm-probe precision``'s search needs, against the number of ops.

    python bench/precision.py            # test models, stacks of 4 to 32 blocks, the demo BERT (~10 min, 2 cores)

For each model: the source ops that could be kept in fp32, the rebuilds the search made (the
plain fp16 build counted), the set it found, and the wall time.  Appends (replaces) the section
"## Precision search (bench/precision.py)" of ``bench/results.md``.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TITLE = "Precision search (bench/precision.py)"
TARGET = {"kind": "llvm", "opt-level": 0}  # LLVM's optimizer takes minutes on fp16 erf kernels (docs/precision.md)
sys.path.insert(0, str(HERE.parent / "tests" / "tools"))  # test_precision.py, whose models this measures
sys.path.insert(0, str(HERE))


def layer_stack(layers: int, overflow_at=(1,)):
    """``layers`` blocks of MatMul → Add (bias) → LayerNormalization → Relu (4 ops each, seeded
    weights); the projection of each block in ``overflow_at`` has weights that take it beyond
    65504, so exactly those MatMuls must stay in fp32."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    h, nodes, weights, x = 64, [], {}, "x"
    for i in range(layers):
        scale = 20000.0 if i in overflow_at else 1.0 / np.sqrt(h)
        weights[f"w{i}"] = (rng.standard_normal((h, h)) * scale).astype(np.float32)
        weights[f"b{i}"] = (rng.standard_normal(h) * 0.1).astype(np.float32)
        weights[f"g{i}"], weights[f"z{i}"] = np.ones(h, np.float32), np.zeros(h, np.float32)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"block{i}/MatMul"),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"block{i}/Add"),
                  helper.make_node("LayerNormalization", [f"add{i}", f"g{i}", f"z{i}"], [f"ln{i}"],
                                   name=f"block{i}/LayerNorm", axis=-1),
                  helper.make_node("Relu", [f"ln{i}"], [f"y{i}"], name=f"block{i}/Relu")]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, h])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, h])],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((4, h)).astype(np.float32)}


def overflowing_bert(factor: float = 1e6):
    """The demo BERT with layer 1's FFN output kernel scaled so that its MatMul leaves fp16's range."""
    from onnx import numpy_helper

    from tvm_probe import demo

    model = demo.tiny_bert()
    for i, t in enumerate(model.graph.initializer):
        if "layer_._1/output/dense/kernel" in t.name:
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * factor, t.name))
    return model, demo.demo_inputs(model)


def cases():
    from test_precision import _x, attention_model, projection_layernorm_model

    from tvm_probe import demo

    yield "projection → LayerNorm (test model)", projection_layernorm_model(), _x((4, 64))
    yield "attention, scores > 65504 (test model)", attention_model(), _x((8, 16))
    for layers, bad in ((4, (1,)), (16, (3,)), (16, (3, 11)), (32, (7, 20))):
        yield f"{layers}-block stack, overflow in blocks {list(bad)}", *layer_stack(layers, bad)
    bert = demo.tiny_bert()
    yield "demo BERT (tiny, 2 layers)", bert, demo.demo_inputs(bert)
    yield "demo BERT, layer 1 FFN output kernel x1e6", *overflowing_bert()


def main() -> None:
    from tvm_probe.importer.onnx import import_onnx
    from tvm_probe.tools.precision import find_keep_fp32
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    rows = []
    for label, model, inputs in cases():
        print(f"[{label}] ...", file=sys.stderr)
        imported = import_onnx(model)
        ref = onnxruntime_values(model, inputs)
        outputs = {k: ref[k] for k in imported.sources.model_outputs}
        start = time.perf_counter()
        search = find_keep_fp32(imported, inputs, target=TARGET, pipeline="fused", reference=outputs)
        seconds = time.perf_counter() - start
        found = ", ".join(search.keep_fp32) if search.found else "none (all-fp32 fails)"
        rows.append(f"| {label} | {search.num_ops} | {search.rebuilds} | {found or '(empty)'} | "
                    f"{max(search.plain.errors.values()):.3g} | "
                    f"{max(search.kept.errors.values()) if search.kept else float('nan'):.3g} | {seconds:.1f} s |")
        print(rows[-1], file=sys.stderr)
    note = (f"`fused` pipeline, llvm at opt-level 0, {os.cpu_count()} cores; written on "
            f"{time.strftime('%Y-%m-%d %H:%M')}. Rebuilds count every reduced-precision build the search compiled "
            "and ran, the plain fp16 one included; the fp32 build and the one module of local-error slices are not "
            "counted. Output error: max abs error of the model outputs against onnxruntime (tolerance atol 5e-3, "
            "rtol 5e-3).")
    lines = [note, "",
             "| model | ops | rebuilds | keep_fp32 found | plain fp16 output error | with keep_fp32 | search time |",
             "|---|---|---|---|---|---|---|", *rows]
    from sections import write_section  # (bench/, on sys.path above)

    print(write_section(TITLE, lines))



if __name__ == "__main__":
    np.seterr(over="ignore")
    main()
