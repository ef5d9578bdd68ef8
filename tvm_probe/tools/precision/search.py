"""The search for the ops to keep in fp32, and ``tvm-probe precision`` (see :mod:`tvm_probe.tools.precision`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.metrics import error_stats
from ...core.minimize import ddmin
from ...core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, Exit
from ...core.tolerance import default_tolerance, within
from ...probe.probe import Probe
from ...probe.tvm_reference import TVMBuildReference
from .analysis import PrecisionAnalysis, analyse


@dataclass
class OutputCheck:
    """The model outputs of one build against the reference outputs, under one tolerance."""

    passed: bool
    errors: dict[str, float]  # output name → max abs error, NaN/Inf by the rule of tvm_probe.core.metrics

    def describe(self) -> str:
        worst = max(self.errors.values(), default=0.0)
        return f"max abs error of the outputs {worst:.3g} ({'within' if self.passed else 'out of'} tolerance)"


def check_outputs(outputs: dict, reference: dict, tolerance) -> OutputCheck:
    """``outputs`` against ``reference`` (both by output name) under ``tolerance``
    (the rule of :mod:`tvm_probe.core.tolerance`: a NaN or infinity on one side only fails); each
    output's error is :attr:`tvm_probe.core.metrics.ErrorStats.max_abs` (inf for a NaN or infinity on
    one side only or another shape)."""

    errors, passed = {}, True
    for name, ref in reference.items():
        got, ref = np.asarray(outputs[name]), np.asarray(ref)
        passed &= got.shape == ref.shape and bool(within(got, ref, tolerance).all())
        errors[name] = error_stats(got, ref).max_abs
    return OutputCheck(passed=passed, errors=errors)


@dataclass
class Search:
    """What :func:`find_keep_fp32` found.

    Attributes:
        found: whether some set of ops kept in fp32 makes the outputs meet the tolerance.
        keep_fp32: that set (display names; empty when plain fp16 passes).
        rebuilds: reduced-precision builds checked (the plain one included).
        num_ops: source ops that could be kept (float values computed at run time).
        plain, kept, all_fp32: output checks of the plain build, of the build with ``keep_fp32``,
            and of every op kept (None where not built).
        analysis: the local-error ranking of the plain build.
        tolerance: what the outputs were held to.
        reference: what they were compared with.
    """

    found: bool
    keep_fp32: list[str]
    rebuilds: int
    num_ops: int
    plain: OutputCheck
    kept: OutputCheck | None
    all_fp32: OutputCheck | None
    analysis: PrecisionAnalysis
    tolerance: Any
    reference: str
    dtype: str = "float16"

    def lines(self) -> list[str]:
        """What ``tvm-probe precision`` prints."""
        out = [(f"plain {self.dtype} build against {self.reference}: {self.plain.describe()}; tolerance "
                f"{self.tolerance}"), self.analysis.summary()]
        if self.all_fp32 is not None and not self.all_fp32.passed:
            out.append(f"every op kept in float32: {self.all_fp32.describe()}: no set of ops can meet the "
                       "tolerance (the float32 build itself does not)")
            return out
        out.append(f"search: {self.rebuilds} rebuilds for {self.num_ops} ops")
        if self.kept is not None:
            out.append(f"keep_fp32 [{', '.join(self.keep_fp32)}]: {self.kept.describe()}")
        else:
            out.append(f"keep_fp32 []: the plain {self.dtype} build meets the tolerance")
        return out

    def yaml(self) -> str:
        """``precision.yaml``: a ``precision:`` key for a config, with the numbers as comments."""
        import yaml

        head = "".join(f"# {line}\n" for line in self.lines())
        body = yaml.safe_dump({"precision": {"dtype": "fp16", "keep_fp32": list(self.keep_fp32)}},
                              sort_keys=False, default_flow_style=False)
        return f"# written by tvm-probe precision\n{head}{body}"


def find_keep_fp32(imported, inputs, target=DEFAULT_TARGET, pipeline=DEFAULT_PIPELINE, reference: dict | None = None,
                   tolerance=None, progress: Callable[[str], None] | None = None, rank_passing: bool = True) -> Search:
    """A small set of source ops to keep in fp32 so that the fp16 build's outputs meet ``tolerance``.

    The plain fp16 build is probed and ranked by local error (:func:`analyse`); the smallest
    prefix of that ranking that passes is found by bisection (each candidate a rebuild), then
    shrunk by delta debugging, so that removing any one op from the result fails.

    Args:
        imported: the imported model (``import_onnx(...)``, ...), reused by every rebuild.
        inputs: the inputs every build runs on.
        target, pipeline: as for :meth:`Probe.from_onnx`.
        reference: expected model outputs by name (onnxruntime's, ...); defaults to the fp32
            TVM build's (:class:`~tvm_probe.probe.tvm_reference.TVMBuildReference` of ``target`` and
            ``pipeline``, the build the local errors are measured against too).
        tolerance: a :class:`~tvm_probe.core.tolerance.Tolerance`; defaults to float16's default.
        progress: called with a short text before each build.
        rank_passing: rank the ops by local error even when the plain build passes (one more
            build: the module of every op's slices); without it, a passing build has no ranking.
    """

    say = progress or (lambda text: None)
    tolerance = tolerance or default_tolerance("float16")
    say("fp32 build")
    fp32 = TVMBuildReference(target, pipeline).probe(imported)
    fp32_out = fp32.run(inputs)
    what = "the fp32 TVM build" if reference is None else "the reference"
    reference = {k: np.asarray(v) for k, v in (reference or fp32_out).items() if k in fp32_out}
    say("fp16 build")
    plain_probe = Probe.from_imported(imported, target, pipeline, precision="fp16")
    plain = check_outputs(plain_probe.run(inputs), reference, tolerance)
    if plain.passed and not rank_passing:
        return Search(found=True, keep_fp32=[], rebuilds=1, num_ops=0, plain=plain, kept=None, all_fp32=None,
                      analysis=PrecisionAnalysis(ops=[]), tolerance=tolerance, reference=what)
    say("local errors")
    analysis = analyse(plain_probe, fp32)
    candidates = [op.name for op in analysis.ops]
    checks: dict[frozenset, OutputCheck] = {frozenset(): plain}  # every build checked, the plain one first

    def check(keep) -> OutputCheck:
        key = frozenset(keep)
        if key not in checks:
            say(f"rebuild {len(checks) + 1}: {len(keep)} ops in fp32")
            probe = Probe.from_imported(imported, target, pipeline,
                                        precision={"dtype": "fp16", "keep_fp32": list(keep)})
            checks[key] = check_outputs(probe.run(inputs, capture=None), reference, tolerance)
        return checks[key]

    base = {"num_ops": len(candidates), "plain": plain, "analysis": analysis, "tolerance": tolerance,
            "reference": what}
    if plain.passed:
        return Search(found=True, keep_fp32=[], rebuilds=1, kept=None, all_fp32=None, **base)
    everything = check(candidates)
    if not everything.passed:
        return Search(found=False, keep_fp32=[], rebuilds=len(checks), kept=None, all_fp32=everything, **base)
    lo, hi = 0, len(candidates)  # the prefix of length lo fails (the plain build), hi passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(candidates[:mid]).passed:
            hi = mid
        else:
            lo = mid
    keep = ddmin(candidates[:hi], lambda subset: check(subset).passed)
    return Search(found=True, keep_fp32=keep, rebuilds=len(checks), kept=check(keep),
                  all_fp32=everything, **base)


# -- tvm-probe precision CONFIG -o DIR -------------------------------------------------------------
@dataclass
class PrecisionOutcome:
    """What ``tvm-probe precision`` produced: the search and the files written."""

    search: Search
    files: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """OK when a set of ops was found (possibly empty), DIVERGED when even all-fp32 fails."""

        return Exit.OK if self.search.found else Exit.DIVERGED
