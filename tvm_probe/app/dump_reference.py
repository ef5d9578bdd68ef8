"""A dump compared with the reference of the model it records, on the dump's own inputs
(``tvm-probe compare DUMP``, ``tvm-probe view DUMP``, ``load_dump(...).view()``)."""
from __future__ import annotations

from pathlib import Path

from ..comparison.reference import reference_for
from ..comparison.verdict import compare
from ..core.errors import ProbeError
from ..importer import import_model
from .config import ModelSpec


def compare_dump(reader, model_path=None, atol=None, rtol=None, progress=None):
    """Compare a dump with the reference of the model it records, run on the dump's own inputs.

    ONNX, TFLite and demo dumps are compared with onnxruntime (TFLite: the TFLite interpreter),
    PyTorch dumps with eager PyTorch.  ``model_path`` (an ONNX file) replaces the recorded model.
    """

    if not reader.source_names_known:
        raise ProbeError("this dump was written by TVM's debug executor: it has no source names to match "
                         "the reference by; compare a dump written by tvm_probe")
    spec = recorded_model(reader, model_path)
    model = spec.load()
    imported_hash = _model_hash(spec, model)
    if reader.model_hash and imported_hash != reader.model_hash:
        raise ProbeError("the model differs from the one the dump was made with (hash mismatch): "
                         "give the original with --model PATH")

    reference = reference_for(spec.kind).values(model, reader.inputs)
    return compare(reader, reference, atol=atol, rtol=rtol, keys=reader.captured_keys, progress=progress)


def recorded_model(reader, model_path=None) -> ModelSpec:
    """The model a dump records (``metadata.model``, as ``tvm-probe run`` writes it), or the ONNX
    file ``model_path``; the one reading of that record (``compare DUMP``, ``view DUMP``)."""
    if model_path is not None:
        return ModelSpec(onnx=Path(model_path))
    described = reader.metadata.get("model")
    if not described:
        raise ProbeError("this dump does not record its model: give it with --model PATH")
    if "torch" in described:
        return ModelSpec(torch=described["torch"])
    shapes = {k: tuple(v) for k, v in (described.get("shapes") or {}).items()}
    for kind in ("onnx", "tflite"):
        if kind in described:
            return ModelSpec(shapes=shapes, **{kind: Path(described[kind])})
    if "demo" in described:
        return ModelSpec(demo=dict(described["demo"] or {}))
    raise ProbeError(f"this dump records a model tvm_probe cannot rebuild here ({', '.join(described)}): "
                     "give an ONNX export of it with --model PATH")


def _model_hash(spec: ModelSpec, model) -> str:
    """The hash the importer records for ``model`` (what dumps store), without compiling."""

    return import_model(spec.kind, model, spec.shapes).model_hash
