"""Reference values from onnxruntime: every intermediate tensor of an ONNX model.

onnxruntime returns any intermediate when its tensor name is added to ``graph.output`` of a
copy of the model.  That changes onnxruntime's graph (it may fuse less), which is fine for a
reference: it is the unfused value the source model defines.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from ...core.errors import ModelError, one_line
from ...importer.onnx import load_onnx


def onnxruntime_values(model, inputs: Mapping[str, np.ndarray],
                       names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Run ``model`` in onnxruntime (CPU) and return ``{tensor name: value}``.

    Args:
        model: an ``onnx.ModelProto`` or a path.
        inputs: ``{input name: array}``.
        names: tensor names to return; default every node output of the graph.
    """
    import onnx
    import onnxruntime as ort

    proto = onnx.ModelProto()
    proto.CopyFrom(load_onnx(model))
    wanted = list(names) if names is not None else [o for n in proto.graph.node for o in n.output if o]
    present = {o.name for o in proto.graph.output}
    for name in wanted:
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # weights listed as inputs make ORT warn once per weight
    try:
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed_names = {i.name for i in session.get_inputs()}
        values = session.run(None, {k: v for k, v in inputs.items() if k in feed_names})
    except Exception as err:
        raise ModelError(f"onnxruntime cannot run the model: {one_line(err)}") from None
    return dict(zip((o.name for o in session.get_outputs()), values))
