"""A dump compared with the reference of the model it records, on the dump's own inputs
(``tvm-probe compare DUMP``, ``tvm-probe view DUMP``, ``load_dump(...).view()``).

The model is found again from the dump's record through its kind's adapter
(:func:`tvm_probe.importer.kinds.recorded`), and so is the reference that runs it.
"""
from __future__ import annotations

from pathlib import Path

from ..core.errors import ProbeError
from ..importer.kinds import adapter_for, recorded
from .reference import reference_for
from .verdict import Comparison, compare


def compare_dump(reader, model_path=None, atol=None, rtol=None, progress=None) -> Comparison:
    """Compare a dump with the reference of the model it records, run on the dump's own inputs.

    ONNX, TFLite and demo dumps are compared with onnxruntime (TFLite: the TFLite interpreter),
    PyTorch dumps with eager PyTorch: the reference each kind's adapter names.  ``model_path``
    (an ONNX file) replaces the recorded model.
    """
    if not reader.source_names_known:
        raise ProbeError("this dump was written by TVM's debug executor: it has no source names to match "
                         "the reference by; compare a dump written by tvm_probe")
    adapter, source, shapes = recorded_model(reader, model_path)
    model = adapter.load(source, shapes)
    if reader.model_hash and adapter.import_model(model, shapes).model_hash != reader.model_hash:
        raise ProbeError("the model differs from the one the dump was made with (hash mismatch): "
                         "give the original with --model PATH")
    reference = reference_for(adapter.kind).values(model, reader.inputs)
    return compare(reader, reference, atol=atol, rtol=rtol, keys=reader.captured_keys, progress=progress)


def recorded_model(reader, model_path=None):
    """``(adapter, source, shapes)`` of the model a dump records (``metadata.model``, as ``tvm-probe
    run`` writes it), or of the ONNX file ``model_path``; the one reading of that record
    (``compare DUMP``, ``view DUMP``)."""
    if model_path is not None:
        return adapter_for("onnx"), Path(model_path), {}
    return recorded(reader.metadata.get("model"))
