"""Another TVM build of the same model as the reference: YAML ``reference: tvm`` (or
``{tvm: {target: T, pipeline: P}}``), ``reduce(reference=TVMBuild(...))``, the fp32 build the
fp16 search is held to.

:class:`TVMBuildReference` is the registered reference ``tvm``.  It builds the model with its own
target and pipeline and serves every value a run of that build serves, keyed by source name like
any reference.  It needs the :class:`~tvm_probe.probe.Probe`, above :mod:`tvm_probe.comparison.reference` in
the layer order, so it lives here and registers itself when :func:`~tvm_probe.comparison.reference.get_reference`
first asks for ``tvm`` (importing this module imports no TVM either).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..build.compile import parse_target, resolve_pipeline
from ..comparison.reference import TVM_BUILD, Reference, register_reference
from ..core.errors import ProbeError
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ..core.sources import Kind
from ..importer import ImportedModel
from ..importer.kinds import KINDS, adapter_of
from .probe import Probe

__all__ = ["TVMBuildReference", "build_label", "pipeline_label", "served_values", "target_label"]


@dataclass(frozen=True)
class TVMBuildReference(Reference):
    """A TVM build of the model (``target`` and ``pipeline``, as for :meth:`Probe.from_onnx`)
    as the reference: what two builds of one model are compared with.

    ``values(model, inputs)`` builds ``model`` — what an importer takes, or an
    :class:`~tvm_probe.importer.ImportedModel`, which is reused as it is — runs it on ``inputs``
    and returns every value it serves (:func:`served_values`).  :meth:`probe` and :meth:`run` give
    the build itself, for callers that compare run to run or need the probe.
    """

    target: Any = DEFAULT_TARGET
    pipeline: Any = DEFAULT_PIPELINE

    name = TVM_BUILD
    model_kinds = KINDS  # whatever tvm_probe imports

    @property
    def label(self) -> str:
        """How reports name this build: ``TVM (llvm, pipeline default)``."""
        return build_label(self.target, self.pipeline)

    def probe(self, model) -> Probe:
        """This build of ``model`` (not run yet); an ImportedModel is compiled without importing again."""
        return Probe.from_imported(_imported(model), self.target, self.pipeline)

    def run(self, model, inputs: Mapping[str, np.ndarray]) -> Probe:
        """:meth:`probe` run on ``inputs`` (NaN and Inf accepted: they are the inputs of the build
        compared with it, which judged them already)."""
        probe = self.probe(model)
        probe.run(inputs, allow_nonfinite=True)
        return probe

    def values(self, model, inputs):
        return served_values(self.run(model, inputs))

    def values_for(self, probe, model, inputs):
        """The run of this build of ``probe``'s imported model: compared value by value by
        source name (:class:`~tvm_probe.comparison.ResultsReference`)."""
        return self.run(probe.imported, inputs)


def _imported(model) -> ImportedModel:
    """``model`` imported by the importer of its kind (:func:`~tvm_probe.importer.kinds.adapter_of`);
    an ImportedModel as it is."""
    return model if isinstance(model, ImportedModel) else adapter_of(model).import_model(model)


def served_values(probe) -> dict[str, np.ndarray]:
    """Every value a run of ``probe`` can serve that TVM computed (not inputs, not weights)."""
    out = {}
    for value in probe.sources_map:
        if value.kind in (Kind.VALUE, Kind.CONSTANT) and value.key not in probe.sources_map.sequences:
            try:
                out[value.key] = probe.get_tensor(value.key)
            except ProbeError:
                continue
    return out


def target_label(target) -> str:
    """How reports name a target: the user's string, or the JSON form."""
    if isinstance(target, str):
        return target
    if isinstance(target, Mapping):
        return json.dumps(dict(target))
    return str(target)


def build_label(target, pipeline, version: str = "") -> str:
    """``TVM 0.27.0 (llvm, pipeline fused)``: how reports name a build."""
    name = f"TVM {version}" if version else "TVM"
    return f"{name} ({target_label(target)}, pipeline {pipeline_label(pipeline, target)})"


def pipeline_label(pipeline, target=DEFAULT_TARGET) -> str:
    """How reports name a pipeline: ``default``, ``fused`` or a custom pass's name."""

    return resolve_pipeline(pipeline, parse_target(target))[1]


register_reference(TVMBuildReference())
