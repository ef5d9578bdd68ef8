"""Investigations as a YAML config describes them — what each ``tvm-probe`` command does.

    outcome = investigate(load_config("configs/demo.yaml"))
    outcome.comparison.verdict(); outcome.exit_code

Each function takes plain values (a Config, a dump reader) and returns plain results; the CLI
only parses arguments, calls one of them and prints.  Everything that can be checked without
compiling (the config, input names, capture patterns, the reference) is checked first.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..capture.remote import connect
from ..comparison.reference import get_reference, is_no_reference
from ..comparison.verdict import compare
from ..core.errors import NameLookupError, UnknownNameError
from ..core.metrics import error_stats, worst
from ..core.names import NameIndex
from ..core.precision import PrecisionError, precision_tolerance
from ..core.schema import Exit
from ..core.tolerance import Tolerance, tolerance_of, within
from ..llm import investigate_generation
from ..probe.probe import Probe
from ..probe.tvm_reference import TVMBuildReference
from ..show.generation import write_generation_report
from ..show.report import write_precision_report, write_report
from ..tools.precision.search import PrecisionOutcome, find_keep_fp32
from ..tools.reduce import reduce
from ..tools.split import balance, run_pipeline, split
from .config import Config, ConfigError, ModelSpec
from .progress import Progress


@dataclass
class Outcome:
    """What one investigation produced."""

    probe: object
    inputs: dict[str, np.ndarray]
    comparison: object | None = None
    verification: object | None = None
    dump: Path | None = None
    report: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """INTERNAL when verification found a tvm_probe problem; DIVERGED when a value diverged
        or was asked for and left unchecked; else OK."""
        if self.verification is not None and not self.verification:
            return Exit.INTERNAL
        if self.comparison is not None and not self.comparison:
            return Exit.DIVERGED
        return Exit.OK


# -- models ------------------------------------------------------------------------------------
def import_model(spec: ModelSpec, model, import_fixes: bool = True):
    """The :class:`~tvm_probe.importer.ImportedModel` of ``model`` (what ``spec.load()`` gave)."""
    return spec.adapter.import_model(model, spec.shapes, import_fixes)


def build_probe(config: Config, model, progress: Progress):
    """Import ``model``, check the config against it, compile it; return the probe and inputs."""

    with progress.stage("import"):
        imported = import_model(config.model, model, config.import_fixes)
    inputs = _inputs(config, imported, model)
    _check_capture(config, imported)
    remote = None
    if config.remote is not None:  # reachable, with the instrument, before the long compile

        with progress.stage(f"connect ({config.remote.describe()})"):
            remote = connect(config.remote)
    with progress.stage(f"compile ({config.pipeline} pipeline, {config.target})"):
        probe = Probe.from_imported(imported, config.target, config.pipeline, remote=remote,
                                    precision=config.precision)
    return probe, inputs


def _check_capture(config: Config, imported) -> None:
    """Every capture pattern names something in this model (before the long compile)."""

    if config.capture in (None, "all"):
        return
    index = NameIndex(imported.sources)
    for pattern in config.capture:
        try:
            index.match(pattern)
        except UnknownNameError as err:  # no dump yet to list: the names are those `tvm-probe ls` shows
            raise ConfigError(f"{config.source}: capture: {err.listed_by('names as tvm-probe ls lists them')}") \
                from None
        except NameLookupError as err:
            raise ConfigError(f"{config.source}: capture: {err}") from None


def _inputs(config: Config, imported, model) -> dict[str, np.ndarray]:
    """Inputs from the config; the demo model or the torch factory fills in what it leaves out."""
    specs = {s.name: s for s in imported.inputs}
    given = {src.name: src for src in config.inputs}
    unknown = [n for n in given if n not in specs]
    if unknown:
        raise ConfigError(f"{config.source}: inputs.{unknown[0]}: the model has no such input; "
                          f"its inputs are {', '.join(specs)}")
    missing = [n for n in specs if n not in given]
    defaults = config.model.adapter.default_inputs(model, imported.inputs) if missing else {}
    if defaults is None:  # the model gives none of its own (the demo and a torch factory do)
        raise ConfigError(f"{config.source}: inputs.{missing[0]}: no values given: add "
                          f"'{missing[0]}: {{random: {{...}}}}' or '{{file: PATH}}' under inputs")
    return {n: (given[n].load(specs[n]) if n in given else defaults[n]) for n in specs}


# -- tvm-probe run -------------------------------------------------------------------------------
def investigate(config: Config, progress: Progress | None = None) -> Outcome:
    """Run the investigation ``config`` describes: probe, dump, compare, verify, report."""
    progress = progress or Progress(enabled=False)
    if config.generate is not None:  # model: {hf: ...}: a generation, compared step by step
        outcome = investigate_generation(config, progress)
        if config.output.report is not None:  # beside its CSV tables: the page (show/ is above llm/)
            outcome.report["html"] = write_generation_report(config.output.report, outcome.comparison)
        return outcome
    model = config.model.load()
    probe, inputs = build_probe(config, model, progress)
    capture = config.capture if config.capture in (None, "all") else list(config.capture)
    with progress.stage("run"):
        probe.run(inputs, capture=capture)
    outcome = Outcome(probe=probe, inputs=inputs)
    if config.output.dump is not None:
        with progress.stage("dump"):
            outcome.dump = probe.dump(config.output.dump, overwrite=config.output.overwrite,
                                      include_weights=config.output.weights,
                                      metadata={"model": config.model.describe()})
    reference = chosen_reference(config.reference)  # None: reference: none
    if reference is not None:
        outcome.comparison = _compare(config, probe, reference, model, inputs, progress)
    if config.verify:
        with progress.stage("verify (independent unfused build)"):
            outcome.verification = probe.verify(inputs)
    if config.output.report is not None:
        with progress.stage("report"):
            outcome.report = write_report(config.output.report, probe, outcome.comparison,
                                          formats=config.output.write)
    return outcome


def _compare(config: Config, probe, reference, model, inputs, progress):
    spec = config.reference
    with progress.stage(f"reference ({spec.runtime})"):  # another build reuses the probe's import
        reference = reference.values_for(probe, spec.model or model, inputs)
    atol, rtol = spec.atol, spec.rtol
    if config.precision is not None:  # a reduced-precision build: float16's tolerance by default

        atol, rtol = precision_tolerance(spec).atol, precision_tolerance(spec).rtol
    with progress.stage("compare") as stage:
        return compare(probe, reference, atol=atol, rtol=rtol, keys=probe.captured_keys,
                       tolerance_for=spec.tolerance_for if spec.tolerances else None, progress=stage.update)


def chosen_reference(ref_spec):
    """The :class:`~tvm_probe.comparison.reference.Reference` a config's ``reference:`` names: the TVM build
    its ``tvm:`` describes (:class:`~tvm_probe.probe.tvm_reference.TVMBuildReference`), or the
    registered one; None for ``reference: none``."""

    if is_no_reference(ref_spec.runtime):
        return None
    if ref_spec.build is not None:
        return TVMBuildReference(**ref_spec.build)
    return get_reference(ref_spec.runtime)


def reference_values(ref_spec, model, inputs) -> dict[str, np.ndarray]:
    """Reference values for every source value, from the reference ``ref_spec`` names.

    ``model`` is what :meth:`ModelSpec.load` returned; the config checked that they fit.
    """
    return chosen_reference(ref_spec).values(ref_spec.model or model, inputs)


# -- tvm-probe split -----------------------------------------------------------------------------
@dataclass
class SplitOutcome:
    """What ``tvm-probe split`` produced."""

    plan: object
    cuts: list[str]
    evenness: float | None
    max_difference: float
    within_tolerance: bool
    tolerance_rule: str

    @property
    def exit_code(self) -> int:
        return Exit.OK if self.within_tolerance else Exit.DIVERGED


def split_investigation(config: Config, atol: float | None, rtol: float | None, progress: Progress) -> SplitOutcome:
    """Cut the model where ``config.split`` says, verify the chained stages against the whole."""

    if config.split is None:
        raise ConfigError(f"{config.source}: split: missing: add 'split: {{cuts: [...]}}' or 'split: {{balance: N}}'")
    if config.model.adapter.graph != "onnx":
        raise ConfigError(f"{config.source}: split: cuts ONNX models into ONNX stages; this is a "
                          f"{config.model.kind} model: export it to ONNX first")
    model = config.model.load()
    probe, inputs = build_probe(config, model, progress)
    cuts, evenness = list(config.split.cuts), None
    if config.split.balance:
        with progress.stage("balance"):
            cuts, evenness = balance(model, config.split.balance, inputs, config.target, config.pipeline,
                                     probe=probe)
    with progress.stage(f"split into {len(cuts) + 1} stages"):
        plan = split(model, cuts, config.target, config.pipeline, dict(config.model.shapes))
    with progress.stage("verify"):
        whole = probe.run(inputs, capture=None)
        chained = run_pipeline(plan, inputs)
        plan.measure(inputs)
    return _chained_outcome(plan, cuts, evenness, whole, chained, atol, rtol)


def _chained_outcome(plan, cuts, evenness, whole, chained, atol, rtol) -> SplitOutcome:
    """The chained stages' outputs judged against the whole model's by the one tolerance rule."""

    tolerances = {k: tolerance_of(whole[k].dtype, atol, rtol) for k in whole}
    # NaN/Inf by the rule of tvm_probe.core.metrics (the same NaN on both sides agrees, on one side only
    # is inf), folded over the outputs in any order to the same figure
    diff = worst(error_stats(chained[k], whole[k]) for k in whole).max_abs
    ok = all(bool(np.all(within(chained[k], whole[k], tolerances[k]))) for k in whole)
    rule = "; ".join(sorted({f"{whole[k].dtype}: {t}" for k, t in tolerances.items()}))
    return SplitOutcome(plan=plan, cuts=cuts, evenness=evenness, max_difference=diff, within_tolerance=ok,
                        tolerance_rule=rule)


# -- tvm-probe precision (tvm_probe/precision/) ---------------------------------------------------
def precision_investigation(config, out_dir, atol=None, rtol=None, overwrite: bool = False,
                            progress=None):
    """``tvm-probe precision``: find the ops to keep in fp32 for the model ``config`` describes and
    write ``out_dir/precision.yaml`` (a ``precision:`` key), ``ranking.csv`` and ``precision.html``.

    The outputs are compared with the config's reference runtime (onnxruntime, torch, tflite), or
    with the fp32 TVM build when the reference is ``none`` or ``tvm``.
    """
    import logging


    progress = progress or Progress(enabled=False)
    if config.remote is not None:
        raise PrecisionError("tvm-probe precision rebuilds and runs the model on this machine: remove 'remote' "
                             "from the config (or give a local target)")
    out_dir = Path(out_dir)
    if (out_dir / "precision.yaml").exists() and not overwrite:
        raise PrecisionError(f"'{out_dir / 'precision.yaml'}' exists: give --overwrite or another folder")
    model = config.model.load()
    with progress.stage("import"):
        imported = import_model(config.model, model, config.import_fixes)
    inputs = _inputs(config, imported, model)
    reference, chosen = None, chosen_reference(config.reference)
    if chosen is not None and not isinstance(chosen, TVMBuildReference):  # else the search's own fp32 build
        with progress.stage(f"reference ({config.reference.runtime})"):
            values = reference_values(config.reference, model, inputs)
        reference = {k: values[k] for k in imported.sources.model_outputs if k in values}
    with progress.stage(f"search ({config.pipeline} pipeline, {config.target})"):
        search = find_keep_fp32(imported, inputs, config.target, config.pipeline, reference,
                                precision_tolerance(config.reference, atol, rtol),
                                progress=logging.getLogger("tvm_probe.precision").info)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "precision.yaml").write_text(search.yaml(), encoding="utf-8")
    files = {"precision": out_dir / "precision.yaml"}
    files.update(write_precision_report(out_dir, search))
    return PrecisionOutcome(search=search, files=files)


# -- tvm-probe reduce ----------------------------------------------------------------------------
def reduce_investigation(config: Config, out_dir: Path, overwrite: bool, progress: Progress, exact: bool = False):
    """The smallest sub-model on which the config's build still fails as on the whole model,
    written to ``out_dir`` as a standalone reproduction (see :mod:`tvm_probe.tools.reduce`);
    ``exact``: differences within a few ulps count too (by default they are rounding)."""

    if config.model.adapter.graph != "onnx":
        raise ConfigError(f"{config.source}: model: reduce cuts ONNX models; this is a {config.model.kind} "
                          "model: export it to ONNX first")
    spec = config.reference
    reference = chosen_reference(spec)
    build = reference if isinstance(reference, TVMBuildReference) else None
    if build is None and spec.runtime != "onnxruntime":
        raise ConfigError(f"{config.source}: reference: reduce compares with onnxruntime or another TVM build "
                          f"({{tvm: {{pipeline: ..., target: ...}}}}), not {spec.runtime!r}")
    model = config.model.load()
    inputs = _graph_inputs(config, model)
    tolerance = Tolerance(spec.atol, spec.rtol) if spec.atol is not None and spec.rtol is not None else None
    with progress.stage("reduce") as stage:
        return reduce(model, inputs, config.target, config.pipeline,
                      build, out_dir=out_dir,
                      overwrite=overwrite, tolerance=tolerance, exact=exact,
                      progress=lambda step: stage.update(step.total - step.best, max(step.total - 1, 1)))


def _graph_inputs(config: Config, model) -> dict[str, np.ndarray]:
    """The config's inputs for an ONNX model, read from its graph (no TVM import: it may fail)."""
    from types import SimpleNamespace

    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    specs = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        shape = tuple(config.model.shapes.get(vi.name, dims))
        dtype = str(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        specs[vi.name] = SimpleNamespace(name=vi.name, shape=shape, dtype=dtype)
    return _inputs(config, SimpleNamespace(inputs=list(specs.values())), model)
