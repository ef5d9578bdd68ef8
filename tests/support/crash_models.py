"""Models whose TVM build crashes the process running them, and their harmless twins.

An ONNX ``Gather`` given an index far past its table: onnxruntime refuses it ("indices element
out of data bounds"), while TVM 0.27's ``take`` kernel (mode "fast", no bounds check) reads
``2**30`` rows past the table and dies of SIGSEGV, on llvm with both pipelines (measured: every
run).  Run such a model only in a child process (:func:`tvm_probe.capture.watch.run_watched`,
``tvm-probe`` on the command line), never in the test process.

    x [4, 8] ─ Relu 'relu_node' ─ Gather 'gather_node' (constant indices) ─ Add 'add_node' (+ weight) ─ y [3, 8]

The Gather's call site is kernel call #6 of the "default" pipeline (unfused: the import
normalises negative indices first) and #1 of the "fused" one; its kernel is ``take1`` in both.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: An index 2**30 rows past a table of 4: the read lands far outside any mapping.
OUT_OF_RANGE = 2 ** 30
#: Where the Gather runs, per pipeline: (kernel symbol, kernel call).
CRASHING_CALL = {"default": ("take1", 6), "fused": ("take1", 1)}


def gather_model(index: int = OUT_OF_RANGE, seed: int = 0) -> onnx.ModelProto:
    """The Gather model; ``index`` is its middle index (0..3 keeps it within the table)."""
    rng = np.random.default_rng(seed)
    indices = numpy_helper.from_array(np.array([0, index, 1], dtype=np.int64), "indices")
    weight = numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "weight")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu_node"),
             helper.make_node("Gather", ["r", "indices"], ["g"], name="gather_node", axis=0),
             helper.make_node("Add", ["g", "weight"], ["y"], name="add_node")]
    graph = helper.make_graph(nodes, "gather_past_the_table",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])], [indices, weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def crashing_gather(seed: int = 0) -> onnx.ModelProto:
    """The Gather model reading 2**30 rows past its table: TVM's kernel segfaults."""
    return gather_model(OUT_OF_RANGE, seed)


def harmless_gather(seed: int = 0) -> onnx.ModelProto:
    """The same graph with its indices within the table: runs, and matches onnxruntime."""
    return gather_model(2, seed)
