#!/usr/bin/env python3
"""$TITLE

A ${NODES_AFTER}-node ONNX model reduced (by tvm_probe) from a ${NODES_BEFORE}-node model.  Needs only
apache-tvm, onnx (TVM's ONNX frontend reads it), onnxruntime and numpy:

    python repro.py

Exit status 1: the bug reproduces; 0: TVM agrees with the reference.
"""
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

HERE = Path(__file__).resolve().parent
# -- settings: tvm_probe writes each value below for the failure it reduced ---------------------
TARGET = "llvm"
PIPELINE = "default"  # "default": tvm.compile's own; "fused": relax.get_default_pipeline(target)
REFERENCE = None  # None: onnxruntime; else the (target, pipeline) of the TVM build to compare with
REFERENCE_LABEL = "onnxruntime"
TOLERANCES = {}  # output: (atol, rtol); pass when |tvm - ref| <= atol + rtol * |ref|
# -- end of settings ---------------------------------------------------------------------------


def run_tvm(model, inputs, target, pipeline, stage):
    """Import, compile and run ``model`` with TVM; ``stage[0]`` says how far it got."""
    target = tvm.target.Target(target)
    stage[0] = "TVM's ONNX importer"
    mod = from_onnx(model)
    stage[0] = "tvm.compile"
    if pipeline == "fused":
        executable = tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))
    else:  # a name of TVM's own: what tvm.compile(relax_pipeline=NAME) runs
        executable = tvm.compile(mod, target, relax_pipeline=pipeline)
    stage[0] = "running the compiled model"
    kind = target.kind.name
    device = tvm.cpu(0) if kind in ("llvm", "c") else tvm.device(kind, 0)
    vm = relax.VirtualMachine(executable, device)
    weights = {t.name for t in model.graph.initializer}
    args = [tvm.runtime.tensor(inputs[i.name], device) for i in model.graph.input if i.name not in weights]
    result = vm["main"](*args)
    results = [result] if hasattr(result, "numpy") else list(result)
    return {o.name: r.numpy() for o, r in zip(model.graph.output, results)}


def run_onnxruntime(model, inputs):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(None, {i.name: inputs[i.name] for i in session.get_inputs()})
    return {o.name: v for o, v in zip(session.get_outputs(), values)}


def agree(got, ref, atol, rtol):
    """Elementwise agreement: within atol + rtol * |ref|; NaN agrees with NaN, inf with itself."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return None
    g, r = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(g - r) <= atol + rtol * np.abs(r)
    return (np.isnan(g) & np.isnan(r)) | (np.isinf(r) & (g == r)) | (close & np.isfinite(g) & np.isfinite(r))


def show(label, array):
    """``label`` then ``array`` (dtype, shape, values), continuation lines aligned."""
    array = np.asarray(array)
    head = f"{label}{array.dtype}{list(array.shape)} "
    return head + np.array2string(array, threshold=64, precision=6, separator=", ", prefix=head)


def main():
    print(f"tvm {tvm.__version__}, onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, "
          f"numpy {np.__version__}; target {TARGET}, pipeline {PIPELINE}")
    model = onnx.load(str(HERE / "model.onnx"))
    with np.load(HERE / "inputs.npz") as f:
        inputs = {k: f[k] for k in f.files}
    with np.load(HERE / "expected.npz") as f:
        expected = {k: f[k] for k in f.files}
    try:
        reference = (run_onnxruntime(model, inputs) if REFERENCE is None
                     else run_tvm(model, inputs, REFERENCE[0], REFERENCE[1], [""]))
    except Exception as err:
        print(f"the reference ({REFERENCE_LABEL}) fails ({type(err).__name__}: {err}); using expected.npz")
        reference = expected
    for name, value in expected.items():
        ok = agree(reference[name], value, *TOLERANCES[name])
        if ok is None or not ok.all():
            print(f"note: {REFERENCE_LABEL} now computes {name!r} differently from expected.npz")
    stage = [""]
    try:
        got = run_tvm(model, inputs, TARGET, PIPELINE, stage)
    except Exception as err:
        print(f"{stage[0]} fails: {type(err).__name__}: {err}")
        for name, value in expected.items():
            print(show(f"expected output '{name}' ({REFERENCE_LABEL}): ", value))
        print("REPRODUCED: TVM fails on the model")
        return 1
    bad = []
    for name, ref in expected.items():
        ok = agree(got[name], ref, *TOLERANCES[name])
        print(f"output '{name}'")
        print(show("  TVM:       ", got[name]))
        print(show("  reference: ", ref) + f"  ({REFERENCE_LABEL})")
        if ok is None:
            print(f"  MISMATCH output '{name}': shape {list(np.shape(got[name]))} vs {list(np.shape(ref))}")
            bad.append(name)
        elif not ok.all():
            g, r = np.asarray(got[name], np.float64), np.asarray(ref, np.float64)
            finite = ~ok & np.isfinite(g) & np.isfinite(r)
            max_abs = float(np.abs(g - r)[finite].max()) if finite.any() else 0.0
            nan = int((~ok & (np.isnan(g) != np.isnan(r))).sum())
            print(f"  MISMATCH output '{name}': {int((~ok).sum())} of {ok.size} elements differ, "
                  f"max abs error {max_abs:.6g}, NaN on one side only at {nan}")
            bad.append(name)
        else:
            print("  agree")
    if bad:
        print(f"REPRODUCED: TVM differs from {REFERENCE_LABEL} at {', '.join(bad)}")
        return 1
    print(f"NOT REPRODUCED: TVM agrees with {REFERENCE_LABEL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
