"""Small ONNX models of one op class each, built with ``onnx.helper``, and the three ways of
running them a test compares: tvm_probe, plain TVM (imported, compiled and run as a user would,
with no tvm_probe code on the way) and onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def tensor(name: str, dtype: int, shape) -> onnx.ValueInfoProto:
    """A graph input or output (``shape``: ints and dim names)."""
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, initializers=(), opset: int = 18) -> onnx.ModelProto:
    """A checked one-graph model."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


def plain_tvm_outputs(proto: onnx.ModelProto, feeds: dict, pipeline: str) -> list[np.ndarray]:
    """The model's outputs as plain TVM computes them: TVM's ONNX importer, ``tvm.compile`` with
    the pipeline of that name, the Relax VM (a shape comes back as an int64 array)."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(proto, keep_params_in_input=False)
    passes = relax.get_default_pipeline(tvm.target.Target("llvm")) if pipeline == "fused" else "default"
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm", relax_pipeline=passes), tvm.cpu())
    names = [i.name for i in proto.graph.input]
    result = vm["main"](*(tvm.runtime.tensor(feeds[n]) for n in names))
    return _flat(result)


def _flat(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    if value is None:
        return []
    if type(value).__name__ == "Shape":
        return [np.array(list(value), dtype="int64")]
    if isinstance(value, (int, float)):
        return [np.array(value)]
    return [a for item in value for a in _flat(item)]


def check_model(probe, proto: onnx.ModelProto, feeds: dict, pipeline: str, served: set[str] | None = None):
    """Run ``probe`` on ``feeds``; its outputs must equal plain TVM's and onnxruntime's, and every
    value it serves (or, with ``served``, at least those names) onnxruntime's value.  Returns
    ``{name: value}`` of what it served."""
    outputs = probe.run(feeds)
    tvm_out = plain_tvm_outputs(proto, feeds, pipeline)
    names = [o.name for o in proto.graph.output]
    reference = onnxruntime_values(proto, feeds)
    assert list(outputs) == names
    for name, ours, theirs in zip(names, outputs.values(), tvm_out):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=f"{name}: tvm_probe's output is not plain TVM's")
        np.testing.assert_allclose(ours, reference[name], rtol=1e-5, atol=1e-6, err_msg=name)
    got = {}
    for key, serving in probe.servings.items():
        if serving.served.value in ("unknown", "unavailable"):
            assert served is None or key not in served, f"{key} is not served: {probe.kernel_map.lost.get(key)}"
            continue
        got[key] = value = probe.get(key)
        if key in reference:
            assert np.shape(value) == np.shape(reference[key]), (key, np.shape(value), np.shape(reference[key]))
            np.testing.assert_allclose(value, reference[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key} ({serving.served.value})")
    missing = (served or set()) - set(got)
    assert not missing, f"not served: {sorted(missing)}"
    return got
