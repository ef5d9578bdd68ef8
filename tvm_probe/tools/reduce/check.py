"""Checking a (sub-)model: the references TVM is compared with (another TVM build, or a registered
reference that runs ONNX models) and :class:`Checker`, which compiles and runs a model the way
the failure was seen and says whether it fails the same way."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Mapping

import numpy as np

from ...build.compile import compile_plain, parse_target, resolve_pipeline
from ...comparison.reference import Reference, get_reference
from ...core.errors import ProbeError, TVMBehaviourChanged, TVMRunError, one_line
from ...core.native_log import native_log_to_logging
from ...core.sources import Kind
from ...core.tolerance import Tolerance
from ...probe.probe import Probe
from ...probe.tvm_reference import TVMBuildReference
from .failure import CompileFailure, Divergence, Failure, ReduceError, find_divergence

log = logging.getLogger(__package__)

#: A TVM build of the model (target and pipeline, as for :meth:`Probe.from_onnx`): the reference
#: when two builds are compared — the registered reference ``tvm``, under reduce's name for it.
TVMBuild = TVMBuildReference


class RuntimeReference:
    """A registered reference (:mod:`tvm_probe.comparison.reference`) that runs ONNX models."""

    def __init__(self, reference):
        if not reference.runs("onnx"):
            raise ReduceError(f"reference {reference.name!r} cannot run ONNX models, which reduce carves: "
                              "use onnxruntime or a TVM build")
        self.reference, self.label = reference, reference.name

    def values(self, model, feeds) -> dict[str, np.ndarray]:
        return self.reference.values(model, feeds)


def onnxruntime_reference() -> RuntimeReference:
    """onnxruntime, the default reference."""
    return RuntimeReference(get_reference("onnxruntime"))


def is_onnxruntime(reference) -> bool:
    """Whether ``reference`` is onnxruntime (whose values of the whole model can be reused)."""
    return isinstance(reference, RuntimeReference) and reference.reference.name == "onnxruntime"


def as_reference(reference):
    """The reference object for ``reference`` (None, a reference name, a TVMBuild or a mapping):
    a TVMBuild (its pipeline checked), or a registered reference that runs ONNX models."""

    if reference is None or isinstance(reference, str):
        reference = get_reference(reference or "onnxruntime")
    elif isinstance(reference, Mapping):
        spec = reference.get(TVMBuild.name, reference)
        if not isinstance(spec, Mapping) or not set(spec) <= {"target", "pipeline"}:
            raise ReduceError(f"reference {dict(reference)!r} is not a build: give "
                              "{'tvm': {'target': ..., 'pipeline': ...}}")
        reference = TVMBuild(**spec)
    if isinstance(reference, TVMBuild):
        resolve_pipeline(reference.pipeline, parse_target(reference.target))  # PipelineError if unusable
        return reference
    if not isinstance(reference, Reference):
        raise ReduceError(f"reference must be None, a reference name ('onnxruntime'), a TVMBuild or "
                          f"{{'tvm': {{'target': ..., 'pipeline': ...}}}}, got {reference!r}")
    return RuntimeReference(reference)


class Checker:
    """Compiles and runs a (sub-)model the way the failure was seen; says what fails first."""

    def __init__(self, target, pipeline, reference, tolerance: Tolerance | None, exact: bool = True):
        self.target, self.pipeline = target, pipeline
        self.reference = reference
        self.tolerance, self.exact = tolerance, exact
        # Outputs of TVM and of the reference on the last sub-model that reproduced a divergence.
        # Reproducing sub-models only shrink, so the last one is the result.
        self.reproduced: tuple[dict, dict] | None = None
        self._outputs: dict = {}

    def first_failure(self, model, feeds, reference: Mapping[str, np.ndarray] | None = None):
        """``(failure or None, SourceMap of the import or None)`` for the whole model.

        ``reference``: the reference's values when already known.  A model tvm_probe cannot
        import although plain TVM compiles it is not a TVM failure: the tvm_probe error is raised.
        """

        try:
            probe = Probe.from_onnx(model, target=self.target, pipeline=self.pipeline)
        except ProbeError:
            failure = self.compile_failure(model)
            if failure is None:
                raise
            return failure, None
        try:
            reference = reference if reference is not None else self.reference.values(model, feeds)
        except ProbeError as err:
            raise ReduceError(f"the reference ({self.reference.label}) cannot run the model: {err}") from None
        try:
            return self.first_divergence(probe, feeds, reference), probe.imported.sources
        except TVMRunError as err:  # the VM raised while running: not a divergence, not a compile failure
            raise ReduceError(f"TVM raises while running the model ({err}): "
                              "reduce handles value divergences and import or compile failures") from None
        except (ProbeError, TVMBehaviourChanged):
            raise
        except Exception as err:  # the VM raised while running: not a divergence, not a compile failure
            raise ReduceError(f"TVM raises while running the model ({type(err).__name__}: {one_line(err)}): "
                              "reduce handles value divergences and import or compile failures") from None

    def reproduces(self, model, feeds, failure: Failure) -> bool:
        """Whether ``model`` fails exactly as ``failure`` (see :mod:`tvm_probe.tools.reduce`)."""
        if isinstance(failure, CompileFailure):
            seen = self.compile_failure(model)
            return seen is not None and seen.same_as(failure)

        try:
            probe = Probe.from_onnx(model, target=self.target, pipeline=self.pipeline)
            reference = self.reference.values(model, feeds)
            seen = self.first_divergence(probe, feeds, reference, last=failure.tensor)
        except TVMBehaviourChanged:
            raise
        except Exception as err:  # it does not build or run: a different failure
            log.info("sub-model rejected: %s: %s", type(err).__name__, one_line(err))
            return False
        if seen is None or not seen.same_as(failure):
            return False
        self.reproduced = (self._outputs, {o.name: reference[o.name] for o in model.graph.output})
        return True

    def first_divergence(self, probe, feeds, reference, last: str | None = None) -> Divergence | None:
        """Run ``probe`` on ``feeds``; the first value, in model order, out of tolerance against
        ``reference`` (values after the tensor ``last`` are not looked at)."""

        self._outputs = probe.run(feeds, allow_nonfinite=True)
        for value in probe.sources_map:
            if value.kind not in (Kind.VALUE, Kind.CONSTANT) or value.key not in reference \
                    or value.key in probe.sources_map.sequences:  # (its elements are looked at)
                continue
            try:
                got = probe.get_tensor(value.key)
            except ProbeError:
                continue
            found = find_divergence(value, got, reference[value.key], self.tolerance, self.exact)
            if found is not None or value.key == last:
                return found
        return None

    def compile_failure(self, model) -> CompileFailure | None:
        """How plain TVM (its ONNX frontend, then ``tvm.compile``) fails on ``model``; None if it builds."""
        from tvm.relax.frontend.onnx import from_onnx


        with native_log_to_logging(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            try:
                mod = from_onnx(model)
            except Exception as err:  # whatever TVM raises is the failure being reduced
                return CompileFailure.from_error("import", err)
            try:
                compile_plain(mod, self.target, self.pipeline)
            except Exception as err:
                return CompileFailure.from_error("compile", err)
        return None
