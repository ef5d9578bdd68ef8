"""Investigations as a YAML config describes them — what each ``tvm-probe`` command does.

    outcome = investigate(load_config("configs/demo.yaml"))
    outcome.comparison.verdict(); outcome.exit_code

Each function takes plain values (a Config, a dump reader) and returns plain results; the CLI
only parses arguments, calls one of them and prints.  Everything that can be checked without
compiling (the config, input names, capture patterns, the reference) is checked first.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..capture.remote import connect
from ..comparison.reference import configured_reference, is_no_reference
from ..comparison.terms import METADATA_KEY as TERMS_KEY
from ..comparison.verdict import compare
from ..core.errors import NameLookupError, UnknownNameError
from ..core.metrics import error_stats, worst
from ..core.names import NameIndex
from ..core.precision import PrecisionError, precision_tolerance
from ..core.records import PinnedInput
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, Exit
from ..core.tolerance import Tolerance, tolerance_of, within
from ..importer.onnx import load_onnx
from ..llm import investigate_generation
from ..probe.probe import Probe
from ..probe.tvm_reference import TVMBuildReference
from ..show.generation import write_generation_report
from ..show.report import write_precision_report, write_report
from ..show.view import export_quantization
from ..tools.precision.search import PrecisionOutcome, find_keep_fp32
from ..tools.quantization import QuantizationError, compare_quantized, sensitivity
from ..tools.blame import blame
from ..tools.reduce import reduce
from ..tools.split import balance, run_pipeline, split
from .config import Config, ConfigError, InputSource, ModelSpec
from .progress import Progress

log = logging.getLogger(__name__)


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
def import_model(spec: ModelSpec, model, import_fixes: bool = True, sizes=None):
    """The :class:`~tvm_probe.importer.ImportedModel` of ``model`` (what ``spec.load()`` gave);
    ``sizes``: the shapes of the arrays the run will feed (for dimensions the import must pin)."""
    return spec.adapter.import_model(model, spec.shapes, import_fixes, sizes=sizes)


def build_probe(config: Config, model, progress: Progress):
    """Import ``model``, check the config against it, compile it; return the probe and inputs."""

    files = _file_inputs(config)
    sizes = {**{src.name: src.random["shape"] for src in config.inputs if (src.random or {}).get("shape")},
             **{name: array.shape for name, array in files.items()}}
    with progress.stage("import"):
        imported = import_model(config.model, model, config.import_fixes, sizes)
    inputs = _inputs(config, imported, model, files)
    _check_capture(config, imported)
    remote = None
    if config.remote is not None:  # reachable, with the instrument, before the long compile

        with progress.stage(f"connect ({config.remote.describe()})"):
            remote = connect(config.remote)
    with progress.stage(f"compile ({config.pipeline} pipeline, {config.target})"):
        probe = Probe.from_imported(imported, config.target, config.pipeline, remote=remote,
                                    precision=config.precision)
    return probe, inputs


def _file_inputs(config: Config) -> dict[str, np.ndarray]:
    """The config's inputs given as files, read."""
    return {src.name: src.load() for src in config.inputs if src.file is not None}


def _check_capture(config: Config, imported) -> None:
    """Every capture pattern names something in this model (before the long compile)."""

    if config.capture in (None, "all"):
        return
    index = NameIndex(imported.sources)
    for pattern in config.capture:
        try:
            index.match(pattern)
        except UnknownNameError as err:  # no dump yet to list: the names are those `tvm-probe ls` shows
            raise ConfigError(f"{config.at('capture')}: {err.listed_by('names as tvm-probe ls lists them')}") \
                from None
        except NameLookupError as err:
            raise ConfigError(f"{config.at('capture')}: {err}") from None


def _inputs(config: Config, imported, model, files: dict | None = None) -> dict[str, np.ndarray]:
    """Inputs from the config (``files``: those read from files already, else read here); the demo
    model or the torch factory fills in what it leaves out, or ``inputs: random`` draws them."""
    files = _file_inputs(config) if files is None else files
    specs = {s.name: s for s in imported.inputs}
    given = {src.name: src for src in config.inputs}
    unknown = [n for n in given if n not in specs]
    if unknown:
        raise ConfigError(f"{config.at('inputs', unknown[0])}: the model has no such input; "
                          f"its inputs are {', '.join(specs)}")
    if config.random_inputs:  # seeds 0, 1, ... in input order
        given = {n: InputSource(n, random={"seed": i}) for i, n in enumerate(specs)}
    missing = [n for n in specs if n not in given]
    defaults = config.model.adapter.default_inputs(model, imported.inputs) if missing else {}
    if defaults is None:  # the model gives none of its own (the demo and a torch factory do)
        raise ConfigError(f"{config.at('inputs', missing[0])}: no values given: add "
                          f"'{missing[0]}: {{random: {{...}}}}' or '{{file: PATH}}' under inputs, or "
                          "'inputs: random'")
    drawn = _sized_for_drawing(specs, given, files)
    return {n: files[n] if n in files else given[n].load(drawn[n]) if n in given else defaults[n] for n in specs}


def _sized_for_drawing(specs: dict, given: dict, files: dict) -> dict:
    """The specs random inputs are drawn from: a model built with symbolic dimensions takes any
    size, so a dimension the config sizes nowhere takes the size a file input gives its name,
    else 1 — said as the import says what it pins (the flag or key that chooses it)."""
    named = {d: size for n, array in files.items() for d, size in zip(specs[n].shape or (), array.shape)
             if isinstance(d, str)}
    drawn = dict(specs)
    for name, spec in specs.items():
        source = given.get(name)
        if source is None or source.random is None or source.random.get("shape") or spec.shape is None:
            continue
        unknown = [(axis, d) for axis, d in enumerate(spec.shape) if isinstance(d, str)]
        if not unknown:
            continue
        shape = tuple(named.setdefault(d, 1) if isinstance(d, str) else d for d in spec.shape)
        drawn[name] = replace(spec, shape=shape)
        chosen = PinnedInput(name, shape, tuple(unknown))
        log.warning("%s", chosen.notice(), extra={"notice": chosen})
    return drawn


# -- tvm-probe run -------------------------------------------------------------------------------
def investigate(config: Config, progress: Progress | None = None) -> Outcome:
    """Run the investigation ``config`` describes: probe, dump, compare, verify, report."""
    progress = progress or Progress(enabled=False)
    if config.generate is not None:  # model: {hf: ...}: a generation, compared step by step
        outcome = investigate_generation(config, progress)
        if config.output.report is not None:  # beside its CSV tables: the page (show/ is above llm/)
            outcome.report["html"] = write_generation_report(config.output.report, outcome.comparison)
        return outcome
    if config.quantization is not None:  # the float model against its QDQ model, op by op
        return config_quantization(config, progress)
    model = config.model.load()
    probe, inputs = build_probe(config, model, progress)
    capture = config.capture if config.capture in (None, "all") else list(config.capture)
    with progress.stage("run"):
        probe.run(inputs, capture=capture)
    outcome = Outcome(probe=probe, inputs=inputs)
    terms = config.reference.terms(_selection(config.capture), precision=config.precision is not None)
    if config.output.dump is not None:
        with progress.stage("dump"):
            outcome.dump = probe.dump(config.output.dump, overwrite=config.output.overwrite,
                                      include_weights=config.output.weights,
                                      metadata={"model": _built_spec(config.model, probe).describe(),
                                                TERMS_KEY: terms.to_json()})
    reference = chosen_reference(config.reference)  # None: reference: none
    if reference is not None:
        outcome.comparison = _compare(config, probe, reference, terms, model, inputs, progress)
    if config.verify:
        with progress.stage("verify (independent unfused build)"):
            outcome.verification = probe.verify(inputs)
    if config.output.report is not None:
        with progress.stage("report"):
            outcome.report = write_report(config.output.report, probe, outcome.comparison,
                                          formats=config.output.write)
    return outcome


def _built_spec(spec: ModelSpec, probe) -> ModelSpec:
    """``spec`` with the sizes the import chose for unknown dimensions (a dump's record rebuilds
    the model as it was built)."""
    pinned = {chosen.name: list(chosen.shape) for chosen in probe.imported.pinned}
    return replace(spec, shapes={**pinned, **spec.shapes}) if pinned else spec


def _compare(config: Config, probe, reference, terms, model, inputs, progress):
    with progress.stage(f"reference ({terms.reference})"):  # another build reuses the probe's import
        reference = reference.values_for(probe, config.reference.model or model, inputs)
    with progress.stage("compare") as stage:
        return compare(probe, reference, atol=terms.atol, rtol=terms.rtol, keys=probe.captured_keys,
                       tolerance_for=terms.tolerance_for if terms.tolerances else None, progress=stage.update)


def _selection(capture) -> str | tuple[str, ...]:
    """What a config's ``capture:`` selected, as the verdict terms record it."""
    return "default" if capture is None else capture if isinstance(capture, str) else tuple(capture)


def chosen_reference(ref_spec):
    """The :class:`~tvm_probe.comparison.reference.Reference` a config's ``reference:`` names: the TVM build
    its ``tvm:`` describes (:class:`~tvm_probe.probe.tvm_reference.TVMBuildReference`), or the
    registered one; None for ``reference: none``."""

    if is_no_reference(ref_spec.runtime):
        return None
    return configured_reference(ref_spec.runtime, ref_spec.build)


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
        raise ConfigError(f"{config.at('split')}: missing: add 'split: {{cuts: [...]}}' or 'split: {{balance: N}}'")
    if config.model.adapter.graph != "onnx":
        raise ConfigError(f"{config.at('split')}: cuts ONNX models into ONNX stages; this is a "
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


# -- tvm-probe precision (tvm_probe/tools/precision/) ---------------------------------------------------
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
                                progress=logging.getLogger("tvm_probe.tools.precision").info)
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
        raise ConfigError(f"{config.at('model')}: reduce cuts ONNX models; this is a {config.model.kind} "
                          "model: export it to ONNX first")
    spec = config.reference
    reference = chosen_reference(spec)
    build = reference if isinstance(reference, TVMBuildReference) else None
    if build is None and spec.runtime != "onnxruntime":
        raise ConfigError(f"{config.at('reference')}: reduce compares with onnxruntime or another TVM build "
                          f"({{tvm: {{pipeline: ..., target: ...}}}}), not {spec.runtime!r}")
    model = config.model.load()
    inputs = _graph_inputs(config, model)
    tolerance = Tolerance(spec.atol, spec.rtol) if spec.atol is not None and spec.rtol is not None else None
    with progress.stage("reduce") as stage:
        return reduce(model, inputs, config.target, config.pipeline,
                      build, out_dir=out_dir,
                      overwrite=overwrite, tolerance=tolerance, exact=exact,
                      progress=lambda step: stage.update(step.total - step.best, max(step.total - 1, 1)))


def blame_investigation(config: Config, out_dir: Path, overwrite: bool, progress: Progress):
    """Which stage of TVM is responsible for the config's failure (see :mod:`tvm_probe.tools.blame`);
    where a pass is blamed, its standalone reproduction is written to ``out_dir``.  Returns the
    :class:`~tvm_probe.tools.blame.Blame` and the folder written (None: no reproduction, and why
    is in ``blame.repro``)."""
    spec = config.reference
    if is_no_reference(spec.runtime):
        raise ConfigError(f"{config.at('reference')}: blame needs a reference to tell a wrong value "
                          "(onnxruntime, torch, tflite): 'none' compares nothing")
    model = config.model.load()
    if config.model.adapter.graph == "onnx":
        inputs = _graph_inputs(config, model)
    else:
        inputs = _inputs(config, config.model.adapter.import_model(model), model)
    options = {"shapes": dict(config.model.shapes)} if config.model.shapes else {}
    with progress.stage("blame"):
        found = blame(model, inputs, reference=spec.runtime, pipeline=config.pipeline, target=config.target,
                      kind=config.model.kind, **options)
    written = None
    if found.repro is not None and not getattr(found.repro, "why_not", ""):
        written = found.write_repro(out_dir, overwrite=overwrite)
    return found, written


def _graph_inputs(config: Config, model) -> dict[str, np.ndarray]:
    """The config's inputs for an ONNX model, read from its graph (no TVM import: it may fail)."""
    from types import SimpleNamespace

    specs = _onnx_input_specs(model)
    for spec in specs:
        spec.shape = tuple(config.model.shapes.get(spec.name, spec.shape))
    return _inputs(config, SimpleNamespace(inputs=specs), model)


# -- tvm-probe quantization (tvm_probe/tools/quantization/) ----------------------------------------
@dataclass
class QuantizationOutcome:
    """What ``tvm-probe quantization`` (and ``run`` with a ``quantization:`` key) produced."""

    comparison: object
    sensitivity: object
    keep_float: list[str] | None = None
    unreachable: str = ""   # why no set of ops in float reaches the target ('' when one does)
    files: dict[str, Path] = field(default_factory=dict)
    view_commands: list[str] = field(default_factory=list)  # model-explorer command lines (view=True)

    @property
    def exit_code(self) -> int:
        """DIVERGED when TVM differs from onnxruntime on the quantized model, or the target SQNR
        cannot be reached; else OK."""
        if self.comparison.first_tvm_divergence is not None or self.unreachable:
            return Exit.DIVERGED
        return Exit.OK

    def lines(self) -> list[str]:
        lines = self.comparison.lines() + self.sensitivity.lines()
        if self.keep_float is not None:
            lines.append("keep in float: " + (", ".join(self.keep_float) or "nothing (the QDQ model as given "
                                                                              "reaches the target)"))
        if self.unreachable:
            lines.append(self.unreachable)
        lines += [f"{kind}: {path}" for kind, path in self.files.items()]
        return lines + [f"view: {command}" for command in self.view_commands]


def quantization_investigation(float_model, quantized_model, inputs: dict[str, np.ndarray], out_dir,
                               target_sqnr: float | None = None, pipeline: str = DEFAULT_PIPELINE,
                               target: str = DEFAULT_TARGET, progress: Progress | None = None,
                               view: bool = False, shapes: dict | None = None,
                               import_fixes: bool = True) -> QuantizationOutcome:
    """Compare TVM's build of the QDQ model ``quantized_model`` with the float model and with
    onnxruntime, rank its ops by the outputs' SQNR with each kept in float, and (with
    ``target_sqnr``) find the ops to keep in float.  Writes ``out_dir/quantization.csv``,
    ``sensitivity.csv``, with a target ``keep_float.onnx`` (the QDQ model with them in float),
    and with ``view`` the Model Explorer overlays of the float model in ``out_dir/view``.
    ``shapes`` and ``import_fixes`` go to TVM's builds as for ``Probe.from_onnx`` (inputs declared
    with symbolic dimensions and not in ``shapes`` are built for the sizes of ``inputs``)."""
    progress = progress or Progress(enabled=False)
    shapes = {**_symbolic_input_sizes(float_model, inputs), **(shapes or {})}
    with progress.stage(f"compare ({pipeline} pipeline, {target})"):
        comparison = compare_quantized(float_model, quantized_model, inputs, pipeline=pipeline, target=target,
                                       shapes=shapes, import_fixes=import_fixes)
    with progress.stage("sensitivity (one build per quantized op)"):
        ranking = sensitivity(float_model, quantized_model, inputs, comparison=comparison)
    outcome = QuantizationOutcome(comparison=comparison, sensitivity=ranking)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if target_sqnr is not None:
        with progress.stage(f"keep float (target {target_sqnr:g} dB)"):
            try:
                outcome.keep_float = ranking.keep_float(target_sqnr)
            except QuantizationError as err:
                outcome.unreachable = str(err)
        if outcome.keep_float:
            outcome.files["keep_float"] = out_dir / "keep_float.onnx"
            ranking.quantized_model_with(outcome.keep_float, path=outcome.files["keep_float"])
    for kind, table in (("quantization", comparison.table()), ("sensitivity", ranking.table())):
        outcome.files[kind] = out_dir / f"{kind}.csv"
        table.to_csv(outcome.files[kind], index=False)
    if view:
        outcome.view_commands = export_quantization(comparison, out_dir / "view", ranking, overwrite=True)
    return outcome


def _symbolic_input_sizes(model, inputs: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """The sizes ``inputs`` have for the model's inputs declared with symbolic dimensions."""
    specs = {s.name: s for s in _onnx_input_specs(load_onnx(model))}
    return {name: tuple(np.shape(value)) for name, value in inputs.items()
            if name in specs and any(d is None or d <= 0 for d in specs[name].shape)}


def model_inputs(model, given: dict[str, np.ndarray] | None = None,
                 shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """Inputs for an ONNX model: ``given`` checked against its graph inputs, or (``None``) random
    ones as a config's ``{random: {}}`` draws them (uniform in [-1, 1), seed 0), of the sizes
    ``shapes`` gives an input declared with symbolic dimensions."""
    specs = {s.name: s for s in _onnx_input_specs(model)}
    unknown = [n for n in (shapes or {}) if n not in specs]
    if unknown:
        raise ConfigError(f"--shapes {unknown[0]}: the model has no input {unknown[0]!r}; its inputs are "
                          f"{', '.join(specs)}")
    for name, dims in (shapes or {}).items():
        specs[name].shape = tuple(dims)
    if given is not None:
        unknown = [n for n in given if n not in specs]
        missing = [n for n in specs if n not in given]
        if unknown or missing:
            raise ConfigError(f"inputs: the model's inputs are {', '.join(specs)}; "
                              + (f"it has no input {unknown[0]!r}" if unknown else f"no value for {missing[0]!r}"))
        return dict(given)
    for spec in specs.values():
        if any(not isinstance(d, int) or d <= 0 for d in spec.shape):
            raise ConfigError(f"input {spec.name!r} has symbolic dimensions {spec.declared}: give its sizes "
                              f"(--shapes {spec.name}=AxB) or the inputs (--inputs FILE.npz)")
    return {n: InputSource(n, random={}).load(s) for n, s in specs.items()}


def _onnx_input_specs(model) -> list:
    from types import SimpleNamespace

    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        declared = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                    for d in vi.type.tensor_type.shape.dim]
        specs.append(SimpleNamespace(name=vi.name, shape=tuple(d if isinstance(d, int) else None for d in declared),
                                     declared=declared,
                                     dtype=str(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))))
    return specs


def config_quantization(config: Config, progress: Progress | None = None) -> QuantizationOutcome:
    """``tvm-probe run`` of a config with ``quantization:``: :func:`quantization_investigation` of
    its float model and ``quantization.model``, on its inputs, writing to ``output.report`` (else
    ``quantization/`` beside the config)."""
    float_model = config.model.load()
    out_dir = config.output.report or (config.source.parent if config.source else Path(".")) / "quantization"
    return quantization_investigation(float_model, config.quantization.model, _graph_inputs(config, float_model),
                                      out_dir, config.quantization.target_sqnr, config.pipeline, config.target,
                                      progress, shapes=config.model.shapes or None, import_fixes=config.import_fixes)
