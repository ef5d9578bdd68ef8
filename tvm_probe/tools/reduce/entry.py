"""``reduce()``: from a model and its inputs to a :class:`~.repro.Reduction` — checks the
arguments, finds the failure on the whole model, runs the search and assembles the result."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from ...build.compile import parse_target, resolve_pipeline
from ...comparison.reference.onnxruntime import onnxruntime_values
from ...core.errors import InputError, ProbeError
from ...core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ...core.tolerance import ROUNDING_ULPS, Tolerance, describe_defaults
from ...importer.onnx import load_onnx
from ...probe.tvm_reference import build_label
from .check import Checker, TVMBuild, as_reference, is_onnxruntime, onnxruntime_reference
from .failure import Divergence, Failure, ReduceError
from .repro import Reduction, check_out_dir
from .search import ReduceStep, Search, run_search
from .submodels import CannotCut, SubModels

log = logging.getLogger(__package__)


def reduce(model, inputs: Mapping[str, np.ndarray], target=DEFAULT_TARGET, pipeline=DEFAULT_PIPELINE, reference=None,
           out_dir=None, *, overwrite: bool = False, tolerance: Tolerance | None = None,
           progress: Callable[[ReduceStep], None] | None = None, verify: bool = True,
           max_seconds: float | None = None, exact: bool = False) -> Reduction:
    """The smallest sub-model of ``model`` on which TVM fails as on the whole model.

    Args:
        model: an ONNX path or ``onnx.ModelProto``.
        inputs: ``{input name: array}`` for every graph input.
        target, pipeline: the TVM build that fails, as for :meth:`Probe.from_onnx`.
        reference: what TVM is compared with: None or ``"onnxruntime"`` (default), another
            registered reference that runs ONNX models (a name or the object), or another TVM
            build — a :class:`TVMBuild` (the registered reference ``tvm``,
            :class:`~tvm_probe.probe.tvm_reference.TVMBuildReference`) or
            ``{"tvm": {"target": ..., "pipeline": ...}}``.
        out_dir: write the reproduction folder there (see :meth:`Reduction.write`).
        overwrite, verify: passed to :meth:`Reduction.write`.
        tolerance: one :class:`~tvm_probe.core.tolerance.Tolerance` for every value; defaults to
            the dtype's.
        progress: called with a :class:`ReduceStep` after each sub-model tried; a bar can
            show ``step.total - step.best`` of ``step.total - 1`` nodes removed.
        max_seconds: stop searching after this long and return the smallest sub-model found so
            far (``Reduction.complete`` is then False); default: search to the end.
        exact: count every difference beyond ``tolerance``; by default floating-point values within
            :data:`~tvm_probe.core.tolerance.ROUNDING_ULPS` units in the last place of the tensor's
            magnitude agree (rounding is no TVM bug to report), whatever the tolerance.

    Returns:
        A :class:`Reduction`; ``.summary()`` is one line.

    Raises:
        ReduceError: TVM agrees with the reference and builds (nothing to reduce), the failure
            does not reproduce on a sub-model, onnxruntime cannot run the model, or the folder
            cannot be written.
        InputError, ModelError, PipelineError: bad inputs, model, target or pipeline.
    """

    start = time.perf_counter()
    if out_dir is not None:
        check_out_dir(Path(out_dir), overwrite)  # before the search, not after it
    proto = load_onnx(model)
    resolve_pipeline(pipeline, parse_target(target))
    ref = as_reference(reference)
    graph = SubModels(proto, _whole_model_values(proto, _check_inputs(proto, inputs)))
    if not len(graph):
        raise ReduceError("nothing to reduce: the model has no nodes")
    checker = Checker(target, pipeline, ref, tolerance, exact)
    try:
        whole = graph.model(range(len(graph)))
    except CannotCut as err:
        raise ReduceError(f"cannot rebuild the model from its nodes ({err}): reduce needs tensor values") from None
    known = graph.values if is_onnxruntime(ref) else None  # onnxruntime ran the same model already
    failure, sources = checker.first_failure(whole, graph.feeds(whole), known)
    if failure is None:
        raise ReduceError(f"nothing to reduce: {build_label(target, pipeline)} builds the model and agrees with "
                          f"{ref.label} on every value within tolerance ({_tolerance_text(tolerance, exact)})")
    log.info("failure to reduce: %s", failure.statement(build_label(target, pipeline), ref.label))
    graph.constants = graph.constant_tensors(sources)
    search = run_search(graph, checker, failure, progress, max_seconds)
    return _result(graph, checker, failure, search, start, out_dir, overwrite, verify)


def _result(graph: SubModels, checker: Checker, failure: Failure, search: Search, start: float,
            out_dir, overwrite: bool, verify: bool) -> Reduction:
    import tvm

    extra = (failure.tensor,) if isinstance(failure, Divergence) else ()
    reduced = graph.model(search.result, extra)
    feeds = graph.feeds(reduced)
    if isinstance(failure, Divergence):  # computed when this sub-model was checked
        (actual, expected), expected_from = checker.reproduced, checker.reference.label
    else:
        actual, (expected, expected_from) = None, _expected(checker, reduced, feeds)
    result = Reduction(model=reduced, inputs=feeds, expected=expected, actual=actual, failure=failure,
                       nodes_before=len(graph), seconds=time.perf_counter() - start, tried=len(search.tried),
                       target=checker.target, pipeline=checker.pipeline,
                       reference=checker.reference if isinstance(checker.reference, TVMBuild) else None,
                       expected_from=expected_from, complete=not search.stopped, tolerance=checker.tolerance,
                       tvm_version=tvm.__version__)
    log.info(result.summary())
    if out_dir is not None:
        result.write(out_dir, overwrite=overwrite, verify=verify)
    return result


def _expected(checker: Checker, model, feeds) -> tuple[dict[str, np.ndarray], str]:
    """The reference's outputs of ``model``, and what computed them.  A TVM reference that
    cannot build the model (possible for compile failures) is replaced by onnxruntime."""
    names = [o.name for o in model.graph.output]
    try:
        values = checker.reference.values(model, feeds)
        return {n: values[n] for n in names}, checker.reference.label
    except (ProbeError, KeyError) as err:
        if is_onnxruntime(checker.reference):
            raise ReduceError(f"onnxruntime cannot run the reduced model: {err}") from None
        log.info("the reference build cannot run the reduced model (%s): expected values from onnxruntime", err)
    values = onnxruntime_reference().values(model, feeds)
    return {n: values[n] for n in names}, f"onnxruntime (the reference, {checker.reference.label}, cannot run it)"


def _check_inputs(proto, inputs) -> dict[str, np.ndarray]:
    weights = {t.name for t in proto.graph.initializer}
    names = [vi.name for vi in proto.graph.input if vi.name not in weights]
    expected = ", ".join(names) or "no inputs"
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a mapping {{input name: array}}; the model takes {expected}")
    missing = [n for n in names if n not in inputs]
    if missing:
        raise InputError(f"input {missing[0]!r} is missing: the model takes {expected}")
    unknown = [k for k in inputs if k not in names]
    if unknown:
        raise InputError(f"the model has no input {unknown[0]!r}: it takes {expected}")
    return {n: np.asarray(inputs[n]) for n in names}


def _whole_model_values(proto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs and every node output of the whole model, from onnxruntime."""

    try:
        computed = onnxruntime_values(proto, inputs)
    except ProbeError as err:
        raise ReduceError(f"{err}: reduce feeds sub-models with the values onnxruntime computes") from None
    return {**inputs, **computed}


def _tolerance_text(tolerance: Tolerance | None, exact: bool = True) -> str:
    text = str(tolerance) if tolerance is not None else describe_defaults()
    return text if exact else f"{text}; differences within {ROUNDING_ULPS} ulps count as rounding: --exact counts them"
