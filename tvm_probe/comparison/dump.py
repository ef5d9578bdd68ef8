"""A dump compared with the reference of the model it records, on the dump's own inputs
(``tvm-probe compare DUMP``, ``tvm-probe view DUMP``, ``load_dump(...).view()``).

The model is found again from the dump's record through its kind's adapter
(:func:`tvm_probe.importer.kinds.recorded`), and so is the reference that runs it.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..core.errors import ProbeError
from ..importer.kinds import adapter_for, recorded
from .reference import configured_reference, is_no_reference, reference_for
from .terms import VerdictTerms, recorded_terms
from .verdict import Comparison, compare


def compare_dump(reader, model_path=None, atol=None, rtol=None, progress=None) -> Comparison:
    """Compare a dump with the reference of the model it records, run on the dump's own inputs,
    on the terms its run was judged on.

    The reference and tolerance are those the dump records (``tvm-probe run`` writes them:
    :mod:`tvm_probe.comparison.terms`); ``atol`` / ``rtol`` given replace the recorded
    tolerance, and the verdict says which terms it used.  A dump without recorded terms, or whose
    run compared with nothing, is compared with the reference its model kind's adapter names
    (onnxruntime for ONNX and demo dumps, the TFLite interpreter, eager PyTorch) at the default
    tolerance.  ``model_path`` (an ONNX file) replaces the recorded model.
    """
    if not reader.source_names_known:
        raise ProbeError("this dump was written by TVM's debug executor: it has no source names to match "
                         "the reference by; compare a dump written by tvm_probe")
    adapter, source, shapes = recorded_model(reader, model_path)
    model = adapter.load(source, shapes)
    if reader.model_hash and adapter.import_model(model, shapes).model_hash != reader.model_hash:
        raise ProbeError("the model differs from the one the dump was made with (hash mismatch): "
                         "give the original with --model PATH")
    terms, note = _terms_for(recorded_terms(reader), adapter.kind, atol, rtol)
    reference = configured_reference(terms.reference, terms.reference_options).values(model, reader.inputs)
    comparison = compare(reader, reference, atol=terms.atol, rtol=terms.rtol, keys=reader.captured_keys,
                         tolerance_for=terms.tolerance_for if terms.tolerances else None, progress=progress)
    comparison.terms_note = note
    return comparison


def _terms_for(recorded: VerdictTerms | None, kind: str, atol, rtol) -> tuple[VerdictTerms, str]:
    """The terms a dump is judged on, and the words that say where they came from."""
    default = VerdictTerms(reference=reference_for(kind).name)
    if recorded is not None and is_no_reference(recorded.reference):
        recorded = replace(recorded, reference=default.reference)
        origin = f"the run compared with no reference: compared here with {default.reference}, its model kind's"
    elif recorded is not None:
        origin = f"reference {recorded.reference} and tolerance as recorded in the dump"
    else:
        origin = f"the dump records no verdict terms: compared with {default.reference}, its model kind's reference"
    if atol is None and rtol is None:
        return recorded or default, origin
    given = (recorded or default).with_tolerance(atol, rtol)
    was = recorded.describe_tolerance() if recorded else "not recorded"
    return given, f"tolerance given on the command line (the run's: {was}); {origin.replace(' and tolerance', '')}"


def recorded_model(reader, model_path=None):
    """``(adapter, source, shapes)`` of the model a dump records (``metadata.model``, as ``tvm-probe
    run`` writes it), or of the ONNX file ``model_path``; the one reading of that record
    (``compare DUMP``, ``view DUMP``)."""
    if model_path is not None:
        return adapter_for("onnx"), Path(model_path), {}
    return recorded(reader.metadata.get("model"))
