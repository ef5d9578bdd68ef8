"""Reduce: the smallest ONNX sub-model on which TVM still fails the same way, written as a
standalone reproduction ready to paste into a TVM issue.

    from tvm_probe.reduce import reduce
    result = reduce("model.onnx", inputs, pipeline="fused", out_dir="repro/")
    result.summary()   # "reduced 23 nodes to 1 (Relu 'bug/relu') in 6.1 s, 4 sub-models tried: ..."

**The same failure.**  A debugger must never call a different failure the same, so "same" is
strict:

* a *divergence*: the first value, in model order, that is out of tolerance against the
  reference is the same tensor, with the same kinds of disagreement (finite values out of
  tolerance, NaN the reference has and TVM lacks, NaN TVM adds, infinities, shape) and the NaN
  disagreements at the same positions;
* a *compile failure*: TVM's ONNX importer (or ``tvm.compile``) raises the same exception type
  with the same message, up to its numbers (Relax temporaries, registers, addresses, source
  lines: :func:`tvm_probe.errors.failure_identity`, the rule the compile diagnosis uses too).

**How.**  ONNX stores nodes in topological order.  The search first checks that the whole
model, rebuilt as a sub-model, still fails; for a divergence it then tries the failing node
alone.  Otherwise it bisects a window of consecutive nodes, from the input side and then from
the output side (as Polygraphy's ``debug reduce`` does), and then removes single nodes one at a
time while the failure persists.  Every candidate is compiled and run for real.

**Sub-models.**  A sub-model reads each tensor whose producer it dropped as a graph input, fed
with the value onnxruntime computed for it on the whole model — so a divergence deep in the
model reproduces without its prefix.  Tensors that were constants in the whole model (TVM's
importer folded them: shape arithmetic, ``Constant`` nodes) become initializers instead, as TVM
saw them.  The outputs of a sub-model are the tensors its nodes hand to dropped nodes, the model
outputs it still computes, and the failing tensor.  Graph inputs are declared with the static
shapes of the values fed.

**The reproduction folder** (``out_dir`` or :meth:`Reduction.write`): ``model.onnx``,
``inputs.npz``, ``expected.npz`` (the reference's outputs), ``repro.py`` (needs only tvm,
onnx, onnxruntime and numpy) and ``README.md``.  It is written to a temporary sibling folder;
``repro.py`` is run there in a fresh Python process and must reproduce the failure, then the
folder is renamed into place.  An existing folder is replaced only with ``overwrite=True``.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import shutil
import string
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..build.compile import compile_plain, parse_target, resolve_pipeline
from ..comparison.reference import Reference, get_reference
from ..comparison.reference.onnxruntime import onnxruntime_values
from ..core.errors import InputError, ProbeError, TVMBehaviourChanged, TVMRunError, failure_identity, one_line
from ..core.metrics import error_stats
from ..core.native_log import native_log_to_logging
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, PIPELINES
from ..core.sources import Kind
from ..core.tolerance import EXACT, Tolerance, default_tolerance, describe_defaults, within
from ..importer.onnx import load_onnx
from ..importer.onnx_graph import (
    node_inputs,  # every tensor a node reads, subgraphs included
    sub_model,
)
from ..probe.probe import Probe
from ..probe.tvm_reference import TVMBuildReference, build_label, pipeline_label, target_label
from ..store.atomic import replace_folder

log = logging.getLogger(__name__)

FILES = ("model.onnx", "inputs.npz", "expected.npz", "repro.py", "README.md")
REPRO_TIMEOUT_S = 600


class ReduceError(ProbeError):
    """Nothing to reduce, the failure does not reproduce on a sub-model, or the reproduction
    folder cannot be written."""


# ------------------------------------------------------------------------------ what failed
@dataclass(frozen=True)
class Divergence:
    """TVM's value of one tensor is out of tolerance against the reference's.

    Attributes:
        tensor, node, op_type: the tensor and the node that produced it.
        counts: ``(kind, elements)`` per kind of disagreement, kinds among ``shape``,
            ``nan-missing`` (the reference has NaN, TVM a number), ``nan-extra`` (the
            reverse), ``inf`` and ``value`` (finite values out of tolerance).
        size: elements of the reference value.
        max_abs: largest absolute error among the finite values out of tolerance.
        shape, ref_shape: shapes on TVM's side and on the reference's.
        nan_digest: fingerprint of the positions where NaN disagrees.
        tolerance: the tolerance used, as text.
    """

    tensor: str
    node: str
    op_type: str
    counts: tuple[tuple[str, int], ...]
    size: int
    max_abs: float
    shape: tuple[int, ...]
    ref_shape: tuple[int, ...]
    nan_digest: str
    tolerance: str

    kind = "divergence"

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.counts)

    @property
    def where(self) -> str:
        """``Relu 'bug/relu'`` (the node), or the tensor for unnamed nodes."""
        return f"{self.op_type} '{self.node or self.tensor}'"

    def same_as(self, other) -> bool:
        """Same tensor, same kinds of disagreement, same shapes, NaN disagreeing at the same places."""
        return (isinstance(other, Divergence) and self.tensor == other.tensor and self.kinds == other.kinds
                and self.shape == other.shape and self.ref_shape == other.ref_shape
                and self.nan_digest == other.nan_digest)

    def headline(self, reference: str) -> str:
        """A title for a bug report: what is wrong, in a few words."""
        if "shape" in self.kinds:
            return f"{self.op_type} gives shape {list(self.shape)}, {reference} gives {list(self.ref_shape)}"
        if self.kinds == ("nan-missing",):
            return f"{self.op_type} drops NaN ({reference} keeps it)"
        if self.kinds == ("nan-extra",):
            return f"{self.op_type} produces NaN where {reference} does not"
        if set(self.kinds) == {"nan-missing", "nan-extra"}:
            return f"{self.op_type} puts NaN in other places than {reference}"
        return f"{self.op_type} gives different values from {reference}"

    def statement(self, tvm: str, reference: str) -> str:
        """One sentence: who disagrees with whom, where and how."""
        parts = []
        for kind, n in self.counts:
            if kind == "shape":
                parts.append(f"TVM gives shape {list(self.shape)}, {reference} gives {list(self.ref_shape)}")
            elif kind == "nan-missing":
                parts.append(f"{n} of {self.size} elements are NaN in {reference} and numbers in TVM")
            elif kind == "nan-extra":
                parts.append(f"{n} of {self.size} elements are NaN in TVM and numbers in {reference}")
            elif kind == "inf":
                parts.append(f"{n} of {self.size} elements disagree on infinities")
            elif self.tolerance == str(EXACT):
                parts.append(f"{n} of {self.size} elements differ (compared exactly)")
            else:
                parts.append(f"{n} of {self.size} elements are out of tolerance ({self.tolerance}), "
                             f"max abs error {self.max_abs:.3g}")
        return f"{tvm} computes {self.where} (output '{self.tensor}') unlike {reference}: {'; '.join(parts)}"


@dataclass(frozen=True)
class CompileFailure:
    """TVM cannot import or compile the model.

    Attributes:
        stage: ``import`` (TVM's ONNX frontend) or ``compile`` (``tvm.compile``).
        error_type: the exception's class name, e.g. ``InternalError``.
        message: the exception's message.
    """

    stage: str
    error_type: str
    message: str

    kind = "compile"

    @classmethod
    def from_error(cls, stage: str, err: BaseException) -> "CompileFailure":
        return cls(stage, type(err).__name__, str(err).strip())

    @property
    def core(self) -> str:
        """The failure's identity: type and message without what varies between equal failures
        (:func:`tvm_probe.errors.failure_identity`, the one rule)."""

        return failure_identity(self.error_type, self.message)

    @property
    def short_message(self) -> str:
        return one_line(self.message)

    def same_as(self, other) -> bool:
        """Same stage, same failure identity (exception type and message core)."""
        return isinstance(other, CompileFailure) and self.stage == other.stage and self.core == other.core

    def headline(self, reference: str) -> str:
        doing = "import" if self.stage == "import" else "compile"
        return f"fails to {doing} ({self.error_type})"

    def statement(self, tvm: str, reference: str) -> str:
        doing = "TVM's ONNX importer" if self.stage == "import" else "tvm.compile"
        return f"{tvm}: {doing} fails with {self.error_type}: {self.short_message}"


Failure = Divergence | CompileFailure


# -------------------------------------------------------------------------------- references
#: A TVM build of the model (target and pipeline, as for :meth:`Probe.from_onnx`): the reference
#: when two builds are compared — the registered reference ``tvm``, under reduce's name for it.
TVMBuild = TVMBuildReference


class _RuntimeReference:
    """A registered reference (:mod:`tvm_probe.reference`) that runs ONNX models."""

    def __init__(self, reference):
        if not reference.runs("onnx"):
            raise ReduceError(f"reference {reference.name!r} cannot run ONNX models, which reduce carves: "
                              "use onnxruntime or a TVM build")
        self.reference, self.label = reference, reference.name

    def values(self, model, feeds) -> dict[str, np.ndarray]:
        return self.reference.values(model, feeds)


def _onnxruntime() -> _RuntimeReference:
    return _RuntimeReference(get_reference("onnxruntime"))


def _is_onnxruntime(reference) -> bool:
    """Whether ``reference`` is onnxruntime (whose values of the whole model can be reused)."""
    return isinstance(reference, _RuntimeReference) and reference.reference.name == "onnxruntime"


def _as_reference(reference):
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
    return _RuntimeReference(reference)


# ----------------------------------------------------------------------------- comparisons
def find_divergence(value, got, ref, tolerance: Tolerance | None = None) -> Divergence | None:
    """How ``got`` (TVM) disagrees with ``ref`` for source value ``value``; None when it agrees.

    ``tolerance`` defaults to the dtype's (:func:`~tvm_probe.tolerance.default_tolerance`).
    """
    got, ref = np.asarray(got), np.asarray(ref)
    tol = tolerance or default_tolerance(ref.dtype)
    base = dict(tensor=value.key, node=value.node, op_type=value.op_type, size=int(ref.size),
                shape=tuple(got.shape), ref_shape=tuple(ref.shape), tolerance=str(tol))
    if got.shape != ref.shape:
        return Divergence(**base, counts=(("shape", int(ref.size)),), max_abs=float("inf"), nan_digest="")
    bad = ~within(got, ref, tol)
    if not bad.any():
        return None
    masks = _disagreements(got, ref, bad)
    counts = tuple((kind, int(mask.sum())) for kind, mask in masks.items() if mask.any())
    # max_abs over the failing finite elements only (NaN/Inf disagreements are counted by kind
    # above), all finite on both sides: the rule's max abs and the finite one coincide there
    value_bad = masks["value"]
    max_abs = error_stats(got[value_bad], ref[value_bad]).max_abs
    digest = hashlib.sha1(np.packbits(masks["nan-missing"]).tobytes() + b"|"
                          + np.packbits(masks["nan-extra"]).tobytes()).hexdigest()[:16]
    return Divergence(**base, counts=counts, max_abs=max_abs, nan_digest=digest)


def _disagreements(got: np.ndarray, ref: np.ndarray, bad: np.ndarray) -> dict[str, np.ndarray]:
    """Split the failing elements ``bad`` by kind (see :class:`Divergence`)."""
    none = np.zeros(bad.shape, dtype=bool)
    if got.dtype.kind not in "fc" and ref.dtype.kind not in "fc":
        return {"nan-missing": none, "nan-extra": none, "inf": none, "value": bad}
    g, r = got.astype(np.float64), ref.astype(np.float64)
    missing = bad & np.isnan(r) & ~np.isnan(g)
    extra = bad & np.isnan(g) & ~np.isnan(r)
    inf = bad & ~missing & ~extra & (np.isinf(g) | np.isinf(r))
    return {"nan-missing": missing, "nan-extra": extra, "inf": inf, "value": bad & ~(missing | extra | inf)}


# ------------------------------------------------------------------------------ sub-models
class CannotCut(Exception):
    """A node set cannot be made a sub-model (a tensor it reads has no tensor value)."""


class SubModels:
    """The nodes of a model in topological order, and sub-models made of any subset of them.

    ``values`` holds a value for every tensor a sub-model may have to read from outside: the
    model inputs and every node output (from onnxruntime on the whole model).  ``constants``
    names the tensors that become initializers rather than inputs (set once known).
    """

    def __init__(self, proto, values: Mapping[str, np.ndarray]):
        self.proto = proto
        self.nodes = list(proto.graph.node)
        self.reads = [node_inputs(node) for node in self.nodes]
        self.producer = {out: i for i, node in enumerate(self.nodes) for out in node.output if out}
        self.readers: dict[str, set[int]] = {}
        for i, names in enumerate(self.reads):
            for name in names:
                self.readers.setdefault(name, set()).add(i)
        self.initializers = {t.name: t for t in proto.graph.initializer}
        self.outputs = [o.name for o in proto.graph.output]
        self.values = values
        self.constants: set[str] = set()

    def __len__(self) -> int:
        return len(self.nodes)

    def model(self, keep: Iterable[int], extra_outputs: Iterable[str] = ()):
        """The sub-model of the nodes ``keep`` (see the module docstring for its inputs and outputs).

        Raises:
            CannotCut: a tensor it must read or return has no tensor value.
        """
        from onnx import numpy_helper


        kept = sorted(set(keep))
        kept_set = set(kept)
        produced = {out for i in kept for out in self.nodes[i].output if out}
        inputs, weights = [], []
        for name in dict.fromkeys(n for i in kept for n in self.reads[i]):
            if name in produced:
                continue
            if name in self.initializers:
                weights.append(self.initializers[name])
            elif name in self.constants:
                weights.append(numpy_helper.from_array(self._value(name), name))
            else:
                inputs.append(self._info(name))
        handed_on = [out for i in kept for out in self.nodes[i].output
                     if out and self.readers.get(out, set()) - kept_set]
        wanted = [o for o in self.outputs if o in produced] + handed_on + [o for o in extra_outputs if o in produced]
        outputs = [self._info(name) for name in dict.fromkeys(wanted)]
        if not outputs:
            raise CannotCut("the nodes compute no output")
        return sub_model(self.proto, [self.nodes[i] for i in kept], inputs, outputs, weights,
                         name=self.proto.graph.name or "reduced", check=False)

    def feeds(self, model) -> dict[str, np.ndarray]:
        """The values that feed the graph inputs of a sub-model."""
        return {vi.name: self.values[vi.name] for vi in model.graph.input}

    def constant_tensors(self, sources=None) -> set[str]:
        """Tensors that were constants in the whole model: those TVM's importer folded (from
        ``sources``, the SourceMap of an import), else those computed from weights and shapes alone."""

        if sources is not None:
            return {v.key for v in sources if v.kind is Kind.CONSTANT}
        constant = set(self.initializers)
        for node, reads in zip(self.nodes, self.reads):
            if node.op_type in ("Shape", "Size") or (not node.op_type.startswith("Random")
                                                     and all(r in constant for r in reads)):
                constant.update(out for out in node.output if out)
        return constant - set(self.initializers)

    def _value(self, name: str) -> np.ndarray:
        value = self.values.get(name)
        if not isinstance(value, np.ndarray):
            raise CannotCut(f"tensor {name!r} has no tensor value")
        return value

    def _info(self, name: str):
        from onnx import helper

        value = self._value(name)
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))


# --------------------------------------------------------------------------------- checking
class Checker:
    """Compiles and runs a (sub-)model the way the failure was seen; says what fails first."""

    def __init__(self, target, pipeline, reference, tolerance: Tolerance | None):
        self.target, self.pipeline = target, pipeline
        self.reference = reference
        self.tolerance = tolerance
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
        """Whether ``model`` fails exactly as ``failure`` (see the module docstring)."""
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
            if value.kind not in (Kind.VALUE, Kind.CONSTANT) or value.key not in reference:
                continue
            try:
                got = probe.get_tensor(value.key)
            except ProbeError:
                continue
            found = find_divergence(value, got, reference[value.key], self.tolerance)
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


# --------------------------------------------------------------------------------- search
@dataclass(frozen=True)
class ReduceStep:
    """One sub-model tried, for progress displays.

    Attributes:
        phase: ``check`` (the whole model), ``isolate`` (the failing node alone), ``bisect``
            or ``linear``.
        tried: sub-models tried so far.
        nodes: nodes of this sub-model; reproduced: whether it shows the failure.
        best: nodes of the smallest sub-model that showed it so far; total: nodes of the model.
        seconds: since the search started.
    """

    phase: str
    tried: int
    nodes: int
    reproduced: bool
    best: int
    total: int
    seconds: float


class Search:
    """Finds a small node set for which ``test(frozenset of node indices)`` is true.

    Pure: knows nothing of ONNX or TVM.  ``pinned`` is a node every candidate must keep (the
    failing node of a divergence).  Each node set is tested once.  After ``max_seconds`` no
    further set is tested (each counts as not reproducing, so what is returned was still
    verified) and :attr:`stopped` is set.
    """

    def __init__(self, total: int, test: Callable[[frozenset], bool], pinned: int | None = None,
                 progress: Callable[[ReduceStep], None] | None = None, max_seconds: float | None = None):
        self.total, self.test, self.pinned, self.progress = total, test, pinned, progress
        self.tried: dict[frozenset, bool] = {}
        self.best = total
        self.phase = "check"
        self.stopped = False
        self.result: list[int] | None = None
        self._start = time.perf_counter()
        self._deadline = None if max_seconds is None else self._start + max_seconds

    def run(self) -> list[int] | None:
        """The node indices found, sorted (also kept in :attr:`result`); None when even the
        whole model does not reproduce."""
        self.result = self._find()
        return self.result

    def _find(self) -> list[int] | None:
        if not self.reproduces(range(self.total)):
            return None
        if self.pinned is not None:
            self.phase = "isolate"
            if self.reproduces([self.pinned]):
                return [self.pinned]
        self.phase = "bisect"
        lo, hi = self.bisect()
        self.phase = "linear"
        return self.linear(list(range(lo, hi + 1)))

    def reproduces(self, keep: Iterable[int]) -> bool:
        key = frozenset(keep)
        if not key or (self.pinned is not None and self.pinned not in key):
            return False
        if key not in self.tried and self._out_of_time():
            return False
        if key not in self.tried:
            self.tried[key] = ok = bool(self.test(key))
            if ok:
                self.best = min(self.best, len(key))
            if self.progress is not None:
                self.progress(ReduceStep(self.phase, len(self.tried), len(key), ok, self.best, self.total,
                                         time.perf_counter() - self._start))
        return self.tried[key]

    def _out_of_time(self) -> bool:
        if self.phase != "check" and self._deadline is not None and time.perf_counter() > self._deadline:
            self.stopped = True
        return self.stopped

    def bisect(self) -> tuple[int, int]:
        """The window ``[lo, hi]`` found by bisecting from the input side, then the output side."""
        hi = self.total - 1
        top = hi if self.pinned is None else self.pinned
        good, bad = 0, top + 1          # [good, hi] reproduces; [bad, hi] is not worth testing
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.reproduces(range(mid, hi + 1)) else (good, mid)
        lo = good
        bottom = lo if self.pinned is None else self.pinned
        good, bad = hi, bottom - 1      # [lo, good] reproduces; [lo, bad] is not worth testing
        while good - bad > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if self.reproduces(range(lo, mid + 1)) else (good, mid)
        return lo, good

    def linear(self, keep: list[int]) -> list[int]:
        """Remove single nodes, last first, while the failure persists; repeat until none goes."""
        changed = True
        while changed:
            changed = False
            for node in reversed(list(keep)):
                if node == self.pinned or len(keep) == 1:
                    continue
                trial = [k for k in keep if k != node]
                if self.reproduces(trial):
                    keep, changed = trial, True
        return sorted(keep)


# --------------------------------------------------------------------------------- results
@dataclass
class Reduction:
    """A reduced model that fails as the whole model did.

    Attributes:
        model: the reduced ``onnx.ModelProto``.
        inputs: its inputs: the whole model's inputs, or the values onnxruntime computed for
            them on the whole model.
        expected: the reference's outputs of the reduced model.
        actual: TVM's outputs of the reduced model (None for a compile failure).
        failure: a :class:`Divergence` or :class:`CompileFailure`.
        nodes_before: nodes of the whole model.  ``nodes_after`` is the reduced model's.
        seconds: how long the reduction took; tried: how many sub-models it compiled.
        target, pipeline, reference: the build that fails and what it was compared with
            (None: onnxruntime).
        expected_from: what computed ``expected``.
        complete: False when ``max_seconds`` stopped the search (the model may reduce further).
        tolerance: the tolerance given (None: the dtype's default).
        out_dir: the reproduction folder, once written.
    """

    model: Any
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    actual: dict[str, np.ndarray] | None
    failure: Failure
    nodes_before: int
    seconds: float
    tried: int
    target: Any
    pipeline: Any
    reference: TVMBuild | None
    expected_from: str
    complete: bool = True
    tolerance: Tolerance | None = None
    tvm_version: str = ""
    out_dir: Path | None = None

    @property
    def nodes_after(self) -> int:
        return len(self.model.graph.node)

    @property
    def kept(self) -> list[str]:
        """``Relu 'bug/relu'`` for each node left."""
        return [f"{n.op_type} '{n.name or n.output[0]}'" for n in self.model.graph.node]

    @property
    def tvm_label(self) -> str:
        return build_label(self.target, self.pipeline, self.tvm_version)

    @property
    def reference_label(self) -> str:
        return self.reference.label if self.reference is not None else "onnxruntime"

    def headline(self) -> str:
        """A title for the bug report."""
        if isinstance(self.failure, CompileFailure):
            ops = " + ".join(dict.fromkeys(n.op_type for n in self.model.graph.node))
            return f"{ops} {self.failure.headline(self.reference_label)}"
        return self.failure.headline(self.reference_label)

    def statement(self) -> str:
        """One sentence stating the bug."""
        return self.failure.statement(self.tvm_label, self.reference_label)

    def summary(self) -> str:
        """One line: nodes before and after, time, sub-models tried, the bug."""
        stopped = "" if self.complete else " (stopped at the time limit: it may reduce further)"
        return (f"reduced {self.nodes_before} nodes to {self.nodes_after} ({', '.join(self.kept)}) in "
                f"{self.seconds:.1f} s, {self.tried} sub-models tried{stopped}: {self.statement()}")

    def write(self, out_dir, overwrite: bool = False, verify: bool = True) -> Path:
        """Write the reproduction folder (see the module docstring); returns its path.

        Args:
            overwrite: replace an existing folder (it is removed only once the new one is complete).
            verify: run ``repro.py`` in a fresh Python process first and refuse to write a
                folder that does not reproduce the failure.

        Raises:
            ReduceError: the folder exists, the pipeline is a custom pass (a standalone script
                cannot rebuild it), or ``repro.py`` does not reproduce the failure.
        """
        self.out_dir = write_repro(self, Path(out_dir), overwrite=overwrite, verify=verify)
        return self.out_dir


# --------------------------------------------------------------------------------- reduce
def reduce(model, inputs: Mapping[str, np.ndarray], target=DEFAULT_TARGET, pipeline=DEFAULT_PIPELINE, reference=None,
           out_dir=None, *, overwrite: bool = False, tolerance: Tolerance | None = None,
           progress: Callable[[ReduceStep], None] | None = None, verify: bool = True,
           max_seconds: float | None = None) -> Reduction:
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
        tolerance: one :class:`~tvm_probe.tolerance.Tolerance` for every value; defaults to
            the dtype's.
        progress: called with a :class:`ReduceStep` after each sub-model tried; a bar can
            show ``step.total - step.best`` of ``step.total - 1`` nodes removed.
        max_seconds: stop searching after this long and return the smallest sub-model found so
            far (``Reduction.complete`` is then False); default: search to the end.

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
        _check_out_dir(Path(out_dir), overwrite)  # before the search, not after it
    proto = load_onnx(model)
    resolve_pipeline(pipeline, parse_target(target))
    ref = _as_reference(reference)
    graph = SubModels(proto, _whole_model_values(proto, _check_inputs(proto, inputs)))
    if not len(graph):
        raise ReduceError("nothing to reduce: the model has no nodes")
    checker = Checker(target, pipeline, ref, tolerance)
    try:
        whole = graph.model(range(len(graph)))
    except CannotCut as err:
        raise ReduceError(f"cannot rebuild the model from its nodes ({err}): reduce needs tensor values") from None
    known = graph.values if _is_onnxruntime(ref) else None  # onnxruntime ran the same model already
    failure, sources = checker.first_failure(whole, graph.feeds(whole), known)
    if failure is None:
        raise ReduceError(f"nothing to reduce: {build_label(target, pipeline)} builds the model and agrees with "
                          f"{ref.label} on every value within tolerance ({_tolerance_text(tolerance)})")
    log.info("failure to reduce: %s", failure.statement(build_label(target, pipeline), ref.label))
    graph.constants = graph.constant_tensors(sources)
    search = _search(graph, checker, failure, progress, max_seconds)
    return _result(graph, checker, failure, search, start, out_dir, overwrite, verify)


def _search(graph: SubModels, checker: Checker, failure: Failure, progress, max_seconds=None) -> Search:
    """The finished search: ``.result`` holds the nodes a minimal reproduction keeps."""
    extra = (failure.tensor,) if isinstance(failure, Divergence) else ()
    pinned = graph.producer.get(failure.tensor) if isinstance(failure, Divergence) else None

    def test(keep) -> bool:
        try:
            sub = graph.model(keep, extra)
        except CannotCut as err:
            log.info("cannot cut: %s", err)
            return False
        ok = checker.reproduces(sub, graph.feeds(sub), failure)
        log.info("%d nodes: %s", len(keep), "reproduces" if ok else "does not reproduce")
        return ok

    search = Search(len(graph), test, pinned, progress, max_seconds)
    if search.run() is None:
        raise ReduceError(f"the failure does not reproduce on any sub-model, not even the whole model with "
                          f"{'its failing tensor as an output' if extra else 'static input shapes'}: "
                          f"{failure.statement('TVM', checker.reference.label)}")
    return search


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
        if _is_onnxruntime(checker.reference):
            raise ReduceError(f"onnxruntime cannot run the reduced model: {err}") from None
        log.info("the reference build cannot run the reduced model (%s): expected values from onnxruntime", err)
    values = _onnxruntime().values(model, feeds)
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


def _tolerance_text(tolerance: Tolerance | None) -> str:
    return str(tolerance) if tolerance is not None else describe_defaults()


# ------------------------------------------------------------------------ the repro folder
def write_repro(result: Reduction, out_dir: Path, overwrite: bool = False, verify: bool = True) -> Path:
    """Write ``result`` as a reproduction folder (see :meth:`Reduction.write`)."""
    import onnx

    out_dir = Path(out_dir)
    _check_out_dir(out_dir, overwrite)
    script = repro_script(result)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as err:
        raise ReduceError(f"cannot write '{out_dir}': {err.strerror or err}") from None
    try:
        onnx.save(result.model, str(tmp / "model.onnx"))
        save_npz(tmp / "inputs.npz", result.inputs)
        save_npz(tmp / "expected.npz", result.expected)
        (tmp / "repro.py").write_text(script)
        transcript = run_repro(tmp, result.failure) if verify else None
        (tmp / "README.md").write_text(readme(result, transcript))
        replace_folder(tmp, out_dir)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError):
            raise ReduceError(f"cannot write '{out_dir}': {err.strerror or err}") from None
        raise
    return out_dir


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not overwrite:
        raise ReduceError(f"'{out_dir}' already exists: choose another folder or pass overwrite=True")
    if out_dir.exists() and not out_dir.is_dir():
        raise ReduceError(f"'{out_dir}' exists and is not a folder: choose another path")


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` for any tensor names (``np.savez`` takes them as keywords: no ``file``)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)


def run_repro(folder: Path, failure: Failure) -> str:
    """Run ``repro.py`` of ``folder`` in a fresh Python process; its output when it reproduces
    ``failure``, else ReduceError."""
    try:
        done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                              timeout=REPRO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReduceError(f"repro.py did not finish within {REPRO_TIMEOUT_S} s") from None
    out = done.stdout
    if isinstance(failure, Divergence):
        shown = f"MISMATCH output '{failure.tensor}'" in out
    else:
        shown = f"{failure.error_type}: " in out and failure.short_message[:80] in out
    if done.returncode != 1 or not shown:
        last = one_line((done.stderr or out).strip().splitlines()[-1] if (done.stderr or out).strip() else "")
        raise ReduceError(f"the reduced model does not reproduce the failure in a plain TVM run (repro.py exit "
                          f"status {done.returncode}: {last}); nothing was written. Please report this")
    return out


def repro_script(result: Reduction) -> str:
    """The text of ``repro.py`` (standalone: tvm, onnx, onnxruntime and numpy only)."""
    build = (result.target, result.pipeline)
    builds = [build] + ([(result.reference.target, result.reference.pipeline)] if result.reference else [])
    for target, pipeline in builds:
        if not isinstance(pipeline, str) or pipeline not in PIPELINES:
            raise ReduceError(f"repro.py needs a named pipeline ('default' or 'fused'), not the custom pass "
                              f"{pipeline_label(pipeline, target)!r}: a standalone script cannot rebuild it")
    tolerances = {name: _tolerance_for(result, value) for name, value in result.expected.items()}
    reference = (None if result.reference is None
                 else (_target_literal(result.reference.target), result.reference.pipeline))
    script = string.Template(repro_template()).safe_substitute(
        TITLE=f"TVM {result.tvm_version}: {result.headline()}",
        NODES_BEFORE=result.nodes_before, NODES_AFTER=result.nodes_after)
    return _set_settings(script, {
        "TARGET": _target_literal(result.target), "PIPELINE": repr(result.pipeline),
        "REFERENCE": "None" if reference is None else f"({reference[0]}, {reference[1]!r})",
        "REFERENCE_LABEL": repr(result.reference_label), "TOLERANCES": repr(tolerances)})


REPRO_TEMPLATE = "templates/repro.py"
"""The package file ``repro.py`` is written from: a runnable script whose settings block holds
placeholder values, and whose docstring has ``$TITLE``, ``$NODES_AFTER`` and ``$NODES_BEFORE``."""


def repro_template() -> str:
    """The text of :data:`REPRO_TEMPLATE` (read from the installed package)."""
    from importlib import resources

    return resources.files("tvm_probe.tools").joinpath(REPRO_TEMPLATE).read_text(encoding="utf-8")


def _set_settings(script: str, values: Mapping[str, str]) -> str:
    """``script`` with each ``NAME = ...`` line of its settings block set to ``values[NAME]``
    (Python source), keeping the line's comment."""
    lines = script.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("# -- settings"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# -- end of settings"))
    missing = set(values)
    for i in range(start + 1, end):
        name, _, rest = lines[i].partition(" = ")
        if name in values:
            comment = rest[rest.index("  # "):] if "  # " in rest else ""
            lines[i] = f"{name} = {values[name]}{comment}"
            missing.discard(name)
    if missing:  # the template and this writer disagree: a tvm_probe bug
        raise AssertionError(f"{REPRO_TEMPLATE} has no setting {sorted(missing)}")
    return "\n".join(lines)


def _tolerance_for(result: Reduction, value: np.ndarray) -> tuple[float, float]:
    tol = result.tolerance or default_tolerance(np.asarray(value).dtype)
    return (float(tol.atol), float(tol.rtol))


def _target_literal(target) -> str:
    """Python source for ``target`` that ``tvm.target.Target()`` accepts."""
    if isinstance(target, (str, Mapping)):
        return repr(target if isinstance(target, str) else dict(target))
    return repr(str(target))  # a Target: its JSON form


def readme(result: Reduction, transcript: str | None) -> str:
    """README.md of the folder: versions, build, the bug in one sentence, how to run, its output."""
    import onnx
    import onnxruntime

    pipeline = {"default": "`default` — `tvm.compile(mod, target)`",
                "fused": "`fused` — `tvm.compile(mod, target, relax_pipeline=relax.get_default_pipeline(target))`"}
    rows = [("TVM", result.tvm_version), ("onnxruntime", onnxruntime.__version__), ("onnx", onnx.__version__),
            ("numpy", np.__version__), ("Python", sys.version.split()[0]),
            ("target", f"`{target_label(result.target)}`"),
            ("pipeline", pipeline.get(result.pipeline, f"`{result.pipeline}`")),
            ("compared with", result.reference_label), ("expected.npz from", result.expected_from),
            ("model", f"{result.nodes_after} node(s): {', '.join(result.kept)} (reduced by tvm_probe from "
                      f"{result.nodes_before} nodes in {result.seconds:.1f} s)")]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    graph = onnx.helper.printable_graph(result.model.graph) if result.nodes_after <= 20 else ""
    output = (f"Output of `python repro.py` when this folder was written:\n\n```\n{transcript.rstrip()}\n```\n"
              if transcript else "")
    return (f"# [Bug][Relax][ONNX] {result.headline()}\n\n"
            f"{result.statement()}.\n\n| | |\n|---|---|\n{table}\n\n"
            "## Reproduce\n\n```bash\npip install apache-tvm onnx onnxruntime numpy\npython repro.py   "
            "# exit status 1 while the bug is present\n```\n\n"
            "`model.onnx` is the reduced model; `inputs.npz` holds its inputs (the original model's "
            "inputs, or the values the original model computed for them in onnxruntime); `expected.npz` "
            "holds the outputs "
            f"{result.expected_from} computes from them.\n\n"
            + (f"## The model\n\n```\n{graph}\n```\n\n" if graph else "") + output)
