"""What failed, and when two failures are the same one: a value diverging from the reference
(:class:`Divergence`, found by :func:`find_divergence`) or TVM failing to import or compile the
model (:class:`CompileFailure`).  The identity these define decides what the search keeps."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ...core.errors import ProbeError, failure_identity, one_line
from ...core.metrics import agreement, error_stats
from ...core.tolerance import EXACT, ROUNDING_ULPS, Tolerance, default_tolerance, rounding, within


class ReduceError(ProbeError):
    """Nothing to reduce, the failure does not reproduce on a sub-model, or the reproduction
    folder cannot be written."""


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
        (:func:`tvm_probe.core.errors.failure_identity`, the one rule)."""

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


def find_divergence(value, got, ref, tolerance: Tolerance | None = None, exact: bool = True) -> Divergence | None:
    """How ``got`` (TVM) disagrees with ``ref`` for source value ``value``; None when it agrees.

    ``tolerance`` defaults to the dtype's (:func:`~tvm_probe.core.tolerance.default_tolerance`);
    unless ``exact``, floating-point values within :data:`~tvm_probe.core.tolerance.ROUNDING_ULPS`
    units in the last place of the tensor's magnitude agree too (rounding, not a TVM bug).
    """
    got, ref = np.asarray(got), np.asarray(ref)
    tol = tolerance or default_tolerance(ref.dtype)
    forgive = not exact and ref.dtype.kind == "f"  # rounding: floating-point values only
    text = f"{tol}, or within {ROUNDING_ULPS} ulps (rounding)" if forgive else str(tol)
    base = dict(tensor=value.key, node=value.node, op_type=value.op_type, size=int(ref.size),
                shape=tuple(got.shape), ref_shape=tuple(ref.shape), tolerance=text)
    if got.shape != ref.shape:
        return Divergence(**base, counts=(("shape", int(ref.size)),), max_abs=float("inf"), nan_digest="")
    bad = ~within(got, ref, tol)
    if forgive:
        bad &= ~rounding(got, ref)
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
    """Split the failing elements ``bad`` (``~within(got, ref, tol)``) by kind (see :class:`Divergence`).

    The NaN/Inf rule is :func:`tvm_probe.core.metrics.agreement`'s, the one ``within`` passes
    by: a failing element is either finite on both sides (``value``: out of tolerance) or one the
    rule calls different — NaN on one side only (``nan-missing``, ``nan-extra``) or else an
    infinity the other side does not share (``inf``).
    """
    if got.dtype.kind not in "fc" and ref.dtype.kind not in "fc":  # integers, booleans: all finite
        none = np.zeros(bad.shape, dtype=bool)
        return {"nan-missing": none, "nan-extra": none, "inf": none, "value": bad}
    g, r = got.astype(np.float64), ref.astype(np.float64)
    rule = agreement(g, r)
    nan_g, nan_r = np.isnan(g), np.isnan(r)
    missing = bad & nan_r & ~nan_g
    extra = bad & nan_g & ~nan_r
    return {"nan-missing": missing, "nan-extra": extra, "inf": bad & rule.differ & ~(missing | extra),
            "value": bad & rule.finite}
