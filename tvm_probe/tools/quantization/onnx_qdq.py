"""Which ops' quantization breaks an ONNX QDQ model, and whether TVM builds the quantized model right.

    report = compare_quantized(float_model, qdq_model, inputs)
    report.table()                  # per quantized op: sqnr_db, max_abs, cosine, tvm_vs_runtime
    report.first_tvm_divergence     # the first op where TVM's build differs from onnxruntime's run
    ranking = sensitivity(float_model, qdq_model, inputs)
    ranking.table()                 # per quantized op: the outputs' SQNR with only that op in float
    ranking.keep_float(target_sqnr_db=30)
    ranking.quantized_model_with(keep_float=[...], path="model.keep.onnx")

**The reference for the float model is onnxruntime**, not a TVM float build: the float values
are then what the float model means (an independent runtime), so ``sqnr_db`` is what the
deployed TVM build loses against the model the user trained — quantization's cost plus anything
TVM gets wrong — and ``tvm_vs_runtime`` (TVM's quantized build against onnxruntime's run of the
same QDQ model) isolates the part TVM gets wrong.  It also saves one TVM build.

Numbers come from :func:`tvm_probe.core.metrics.error_stats` (``snr_db`` is the SQNR: the float
value is the signal, the difference the quantization noise); several outputs fold to their
worst (:func:`tvm_probe.core.metrics.worst`).  Values are each op's first output; ops are those
of :func:`~.qdq_graph.quantized_ops`.

**Cost.** ``compare_quantized`` builds the QDQ model once (with the probe) and runs onnxruntime
twice.  ``sensitivity`` does not compile one model per op: it builds once a model holding every
variant (:func:`~.qdq_graph.switchable`: each quantized tensor read through a ``Where`` on the
boolean inputs of the ops that quantize it, so the variant is chosen when the model runs) and
runs it once per op.  That build is trusted only as far as it is checked against real builds,
bit for bit: with no op in float (the QDQ model itself), with the top-ranked op in float, with
every op in float (every activation the quantizer folded brought back) and with the set
``keep_float`` returns; if one differs, every variant is built on its own instead (logged, and
:attr:`Sensitivity.note` says so).
``bench/quantization.py`` measures both ways.

**Kept in float** is what onnxruntime's ``quantize_static(nodes_to_exclude=[op])`` writes
(:mod:`.qdq_graph`); with every op kept the outputs are the float model's
(:attr:`Sensitivity.float_sqnr_db`), else the ranking says it is not to be trusted.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...comparison.reference import get_reference
from ...comparison.verdict import Comparison, compare
from ...core.errors import ProbeError, one_line
from ...core.metrics import ErrorStats, error_stats, worst
from ...core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ...importer.onnx import load_onnx
from ...probe.probe import Probe
from .qdq_graph import (
    QDQPair,
    QuantizationError,
    QuantizedOp,
    output_names,
    switchable,
    with_float_ops,
)

log = logging.getLogger(__name__)
#: The outputs' SQNR against the float model at or above which a build of it is the float model:
#: TVM's float32 kernels against onnxruntime's differ by rounding alone (measured: 130-140 dB on
#: the test MLPs, 115.7 dB on PP-OCR's 50-conv classifier).
FLOAT_MODEL_DB = 100.0


class _Study:
    """The two models, the inputs, onnxruntime's values of both and the TVM builds made so far
    (by the set of ops kept in float): what a comparison and a sensitivity ranking share."""

    def __init__(self, float_model, quantized_model, inputs, pipeline, target, shapes=None, import_fixes=True):
        self.float_model, self.quantized_model = load_onnx(float_model), load_onnx(quantized_model)
        self.pair = QDQPair(self.float_model, self.quantized_model)
        self.ops = self.pair.ops
        self.outputs = output_names(self.float_model, self.quantized_model)
        self.inputs = {k: np.asarray(v) for k, v in dict(inputs).items()}
        self.pipeline, self.target = pipeline, target
        self.build_options = {"shapes": dict(shapes) if shapes else None, "import_fixes": import_fixes}
        runtime = get_reference("onnxruntime")
        self.float_values = runtime.values(self.float_model, self.inputs)
        self._runtime_q: dict | None = None
        self.builds: dict[frozenset, dict[str, np.ndarray]] = {}  # ops in float -> TVM's outputs
        self.probe = None
        self._switch = None   # (probe, flags) of the model holding every variant, once built and trusted
        self.switch_note = ""  # why the variants are built one by one ('' while the switch is used)

    @property
    def runtime_values(self) -> dict[str, np.ndarray]:
        """onnxruntime's values of the QDQ model (every node output), computed once."""
        if self._runtime_q is None:
            self._runtime_q = get_reference("onnxruntime").values(self.quantized_model, self.inputs)
        return self._runtime_q

    def quantized_probe(self) -> Probe:
        """The QDQ model built by TVM as a probe, run once capturing everything."""
        if self.probe is None:
            self.probe = self.build(self.quantized_model)
            self.builds[frozenset()] = self.probe.run(self.inputs)
        return self.probe

    def outputs_with(self, kept: Iterable[str]) -> dict[str, np.ndarray]:
        """TVM's outputs of the QDQ model with ``kept`` in float, built as that model (one build per
        set, kept)."""
        key = frozenset(kept)
        if key not in self.builds:
            model = with_float_ops(self.float_model, self.quantized_model, sorted(key)) if key else self.quantized_model
            self.builds[key] = self.build(model).run(self.inputs, capture=None)
        return self.builds[key]

    def build(self, model) -> Probe:
        """``model`` built by TVM as the user's ``Probe.from_onnx`` arguments say."""
        return Probe.from_onnx(model, self.target, self.pipeline, **self.build_options)

    def variant_outputs(self, kept: Iterable[str]) -> dict[str, np.ndarray]:
        """TVM's outputs with ``kept`` in float: a run of the switchable build (one build for every
        variant) while it reproduces the real builds, else :meth:`outputs_with`."""
        switch = self._switch_probe()
        if switch is None:
            return self.outputs_with(kept)
        probe, flags = switch
        kept = set(kept)
        feed = dict(self.inputs, **{flag: np.array(name in kept) for name, flag in flags.items()})
        return {k: np.array(v) for k, v in probe.run(feed, capture=None).items()}  # ours, whatever runs next

    def _switch_probe(self):
        """The switchable build (:func:`~.qdq_graph.switchable`), trusted only while its outputs
        equal the plain QDQ build's bit for bit; None once they did not (then noted)."""
        if self._switch is None and not self.switch_note:
            model, flags = switchable(self.float_model, self.quantized_model)
            self._switch = (self.build(model), flags)
            self.check_switch(())
        return self._switch

    def check_switch(self, kept: Iterable[str]) -> bool:
        """Whether the switchable build gives what the real build of ``kept`` in float gives;
        when not, the variants are built one by one from now on (and :attr:`switch_note` says why)."""
        if self._switch is None:
            return not self.switch_note
        kept = sorted(kept)
        switched, real = self.variant_outputs(kept), self.outputs_with(kept)
        same = all(_identical(switched[q], real[q]) for _, q in self.outputs)
        if not same:
            self._switch = None
            self.switch_note = (f"the switchable build differs from the build of the QDQ model with "
                                f"{', '.join(kept) or 'no op'} in float: every variant is built on its own")
            log.warning(self.switch_note)
        return same

    def output_stats(self, outputs: Mapping[str, np.ndarray]) -> ErrorStats:
        """The outputs against the float model's (onnxruntime), folded to the worst."""
        return worst(error_stats(outputs[q], self.float_values[f]) for f, q in self.outputs)


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit the same values (NaN where the other has NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


# -- compare_quantized -----------------------------------------------------------------------
@dataclass
class QuantizationComparison:
    """TVM's build of a QDQ model, op by op, against the float model and against onnxruntime.

    Attributes:
        rows: one dict per quantized op (see :meth:`table`).
        first_tvm_divergence: the node (of the QDQ model, in its order; Q/DQ nodes included) whose
            TVM value first differs from onnxruntime's run of the same QDQ model beyond the
            house tolerance (exact for integers); None when none does.  When some values could
            not be compared, :attr:`runtime` says which, and None means none of the others.
        runtime: the whole comparison of TVM's build with onnxruntime on the QDQ model
            (:class:`~tvm_probe.comparison.verdict.Comparison`).
        output_sqnr_db: the model outputs' SQNR against the float model.
    """

    rows: list[dict]
    first_tvm_divergence: str | None
    runtime: Comparison
    output_sqnr_db: float
    study: _Study = field(repr=False, default=None)

    COLUMNS = ("name", "op_type", "folded", "sqnr_db", "max_abs", "cosine", "tvm_vs_runtime", "note")

    @property
    def probe(self) -> Probe:
        """TVM's build of the QDQ model, after its run on the inputs: every value by its name."""
        return self.study.probe

    @property
    def ops(self) -> list[QuantizedOp]:
        """The quantized ops, as the rows list them (with their tensors in both models)."""
        return list(self.study.ops)

    @property
    def float_model(self):
        """The float model (an ``onnx.ModelProto``)."""
        return self.study.float_model

    def table(self):
        """DataFrame, one row per op of the float model the QDQ model quantizes, in graph order:
        ``folded``, the float model's activations the quantizer folded into the op's output
        quantization (the op's row holds them; its value is the op's own output, before them, in
        both models); ``sqnr_db``, ``max_abs``, ``cosine`` of TVM's quantized build against the
        float model (onnxruntime), ``tvm_vs_runtime``: the max abs difference between TVM's build
        and onnxruntime's run of the QDQ model (0 where they agree); ``note`` why a figure is NaN."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(self.COLUMNS))

    def lines(self, n: int = 5) -> list[str]:
        """A few lines: the output SQNR, the ops that lose most, TVM against onnxruntime."""
        worst_ops = sorted((r for r in self.rows if not math.isnan(r["sqnr_db"])), key=lambda r: r["sqnr_db"])[:n]
        lines = [f"model outputs: SQNR {self.output_sqnr_db:.1f} dB against the float model (onnxruntime)",
                 "lowest SQNR: " + ", ".join(f"{r['name']} {r['sqnr_db']:.1f} dB" for r in worst_ops)]
        if self.first_tvm_divergence is None:
            unchecked = len(self.runtime.unchecked)
            lines.append("TVM's build equals onnxruntime's run of the quantized model"
                         + (f" ({unchecked} values not compared: see .runtime)" if unchecked else ""))
        else:
            lines.append(f"TVM differs from onnxruntime on the quantized model from {self.first_tvm_divergence} "
                         f"({self.runtime.first_divergent.describe()})")
        return lines


def compare_quantized(float_model, quantized_model, inputs: Mapping[str, np.ndarray],
                      pipeline=DEFAULT_PIPELINE, target=DEFAULT_TARGET, shapes=None,
                      import_fixes: bool = True) -> QuantizationComparison:
    """Compare TVM's build of ``quantized_model`` (the QDQ model of ``float_model``) op by op with
    the float model and with onnxruntime's run of the same QDQ model.

    Args:
        float_model, quantized_model: ONNX models (paths or ``onnx.ModelProto``); the quantized
            one in the QDQ format, its ops named as in the float model.
        inputs: ``{input name: array}``.
        pipeline, target, shapes, import_fixes: how TVM builds the QDQ model, as for
            :meth:`tvm_probe.Probe.from_onnx` (``shapes``: sizes for inputs declared with symbolic
            dimensions, as the inputs have them; onnxruntime runs the models as they are).

    Raises:
        QuantizationError: the models are not a float model and its QDQ model.
    """
    study = _Study(float_model, quantized_model, inputs, pipeline, target, shapes, import_fixes)
    probe = study.quantized_probe()
    runtime = study.runtime_values
    rows = [_row(op, probe, runtime, study.float_values) for op in study.ops]
    verdict = compare(probe, runtime)
    first = verdict.first_divergent.name if verdict.first_divergent is not None else None
    return QuantizationComparison(rows=rows, first_tvm_divergence=first, runtime=verdict,
                                  output_sqnr_db=study.output_stats(study.builds[frozenset()]).snr_db, study=study)


def _row(op: QuantizedOp, probe, runtime, float_values) -> dict:
    row = {"name": op.name, "op_type": op.op_type, "folded": ", ".join(op.folded), "sqnr_db": math.nan,
           "max_abs": math.nan, "cosine": math.nan, "tvm_vs_runtime": math.nan, "note": ""}
    try:
        tvm = probe.get_tensor(op.tensor)
    except ProbeError as err:
        row["note"] = f"TVM's value is not served: {one_line(err)}"
        return row
    if op.float_tensor in float_values:
        stats = error_stats(tvm, float_values[op.float_tensor])
        row.update(sqnr_db=stats.snr_db, max_abs=stats.max_abs, cosine=stats.cosine)
    else:
        row["note"] = "onnxruntime gave no value for it in the float model"
    if op.tensor in runtime:
        row["tvm_vs_runtime"] = error_stats(tvm, runtime[op.tensor]).max_abs
    return row


# -- sensitivity -----------------------------------------------------------------------------
@dataclass
class Sensitivity:
    """Each quantized op ranked by the outputs' SQNR when only it is kept in float (best first).

    Attributes:
        rows: one dict per op (see :meth:`table`).
        baseline_sqnr_db: the outputs' SQNR of the QDQ model as given (no op in float).
        float_sqnr_db: the outputs' SQNR with every quantized op in float, which is the float
            model: inf or at least :data:`FLOAT_MODEL_DB` (float32 rounding), else :attr:`note`
            says the variants do not compute the float model's ops and the ranking is not to be
            trusted.
    """

    rows: list[dict]
    baseline_sqnr_db: float
    float_sqnr_db: float = math.nan
    study: _Study = field(repr=False, default=None)

    @property
    def note(self) -> str:
        """What to know before trusting the ranking: why the variants were built one by one,
        and whether every op in float gave back the float model ('' when all is as it should be:
        see the module docstring)."""
        notes = [self.study.switch_note] if self.study.switch_note else []
        if not self.float_sqnr_db >= FLOAT_MODEL_DB:
            notes.append(f"with every quantized op in float the outputs reach {self.float_sqnr_db:.1f} dB against "
                         f"the float model, not the float model itself (>= {FLOAT_MODEL_DB:g} dB): the variants do "
                         "not compute the float model's ops, so this ranking is not to be trusted")
        return "; ".join(notes)

    COLUMNS = ("rank", "name", "op_type", "folded", "sqnr_db", "gain_db", "max_abs", "cosine", "note")

    def table(self):
        """DataFrame, best first: per quantized op, the model outputs against the float model
        (onnxruntime) when only that op is in float (with the activations ``folded`` into it):
        ``sqnr_db`` (worst output), ``gain_db`` (over the QDQ model as given), ``max_abs``,
        ``cosine``; ``note`` where onnxruntime's own exclusion of the op could differ (an op type
        it does not quantize; a tensor it would calibrate anew)."""
        import pandas as pd

        return pd.DataFrame(self.rows, columns=list(self.COLUMNS))

    def ranking(self) -> list[str]:
        """The op names, best first (the op whose float version helps most first)."""
        return [r["name"] for r in self.rows]

    def keep_float(self, target_sqnr_db: float) -> list[str]:
        """The ops to leave in float so that the outputs' SQNR reaches ``target_sqnr_db``: the
        shortest prefix of the ranking that does (greedy: each prefix built and run by TVM);
        ``[]`` when the QDQ model as given does.

        Raises:
            QuantizationError: even every quantized op in float stays below the target.
        """
        if self.baseline_sqnr_db >= target_sqnr_db:
            return []
        names = self.ranking()
        reached = -math.inf
        for n in range(1, len(names) + 1):
            reached = self.study.output_stats(self.study.variant_outputs(names[:n])).snr_db
            if reached >= target_sqnr_db and self.study.check_switch(names[:n]):  # the answer, built for real
                return names[:n]
            if reached >= target_sqnr_db:  # the switchable build was wrong: search again, building each set
                return self.keep_float(target_sqnr_db)
        raise QuantizationError(f"the outputs reach {reached:.1f} dB with every quantized op in float, below the "
                                f"target {target_sqnr_db:g} dB: lower the target (the QDQ model as given has "
                                f"{self.baseline_sqnr_db:.1f} dB)")

    def quantized_model_with(self, keep_float: Iterable[str], path=None):
        """The QDQ model with the ops ``keep_float`` in float (an ``onnx.ModelProto``; also saved
        to ``path`` when given).  See :mod:`.qdq_graph` for what keeping an op in float means."""
        import onnx

        model = with_float_ops(self.study.float_model, self.study.quantized_model, keep_float)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            onnx.save(model, str(path))
        return model

    def lines(self, n: int = 10) -> list[str]:
        """The ranking as text (the first ``n`` ops)."""
        lines = [f"note: {self.note}"] if self.note else []
        lines += [(f"QDQ model as given: outputs' SQNR {self.baseline_sqnr_db:.1f} dB; every op in float: "
                   f"{self.float_sqnr_db:.1f} dB; with one op in float (best first):")]
        lines += [f"  {r['rank']:>3}. {r['name']} ({r['op_type']}{' + ' + r['folded'] if r['folded'] else ''}): "
                  f"{r['sqnr_db']:.1f} dB ({r['gain_db']:+.1f}){' - ' + r['note'] if r['note'] else ''}"
                  for r in self.rows[:n]]
        return lines


def sensitivity(float_model, quantized_model, inputs: Mapping[str, np.ndarray], pipeline=DEFAULT_PIPELINE,
                target=DEFAULT_TARGET, comparison: QuantizationComparison | None = None, shapes=None,
                import_fixes: bool = True) -> Sensitivity:
    """Rank the ops ``quantized_model`` quantizes by the model outputs' SQNR (against the float
    model, onnxruntime) when only that op is kept in float — as onnxruntime's
    ``quantize_static(nodes_to_exclude=[op])`` would quantize it (see :mod:`.qdq_graph`); every
    variant is built by TVM.

    Args:
        float_model, quantized_model, inputs, pipeline, target, shapes, import_fixes: as
            :func:`compare_quantized`.
        comparison: a :func:`compare_quantized` report of the same models and inputs, whose
            builds and float values are reused (else made here).
    """
    study = comparison.study if comparison is not None else _Study(float_model, quantized_model, inputs,
                                                                    pipeline, target, shapes, import_fixes)
    baseline = study.output_stats(study.outputs_with(())).snr_db
    rows = [_ranked(op, study, baseline) for op in study.ops]
    rows.sort(key=lambda r: -r["sqnr_db"] if not math.isnan(r["sqnr_db"]) else math.inf)
    every_op = [op.name for op in study.ops]
    float_sqnr = study.output_stats(study.variant_outputs(every_op)).snr_db
    # checked against real builds: the best variant, and every op in float (every folded activation back)
    if rows and not (study.check_switch([rows[0]["name"]]) and study.check_switch(every_op)):
        return sensitivity(float_model, quantized_model, inputs, pipeline, target, comparison=_Again(study))
    for i, row in enumerate(rows):
        row["rank"] = i + 1
    return Sensitivity(rows=rows, baseline_sqnr_db=baseline, float_sqnr_db=float_sqnr, study=study)


def _ranked(op: QuantizedOp, study: _Study, baseline: float) -> dict:
    """The outputs with ``op`` alone in float, as a row of :meth:`Sensitivity.table`."""
    stats = study.output_stats(study.variant_outputs([op.name]))
    note = ""
    if study.pair.drops_nothing(op.name):
        note = f"onnxruntime does not quantize {op.op_type} ops: in float it computes what the QDQ model does"
    elif recalibrated := study.pair.recalibrated([op.name]):
        note = (f"onnxruntime, excluding it, would calibrate the quantization of {', '.join(recalibrated)} anew "
                "(not recorded in the QDQ model: this variant keeps the parameters it has)")
    return {"name": op.name, "op_type": op.op_type, "folded": ", ".join(op.folded), "sqnr_db": stats.snr_db,
            "gain_db": stats.snr_db - baseline, "max_abs": stats.max_abs, "cosine": stats.cosine, "note": note}


@dataclass
class _Again:
    """A study handed back to :func:`sensitivity` (its builds reused)."""

    study: _Study
