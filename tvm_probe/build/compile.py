"""Compile stage: run the user's Relax pipeline unchanged, keeping snapshots of the module.

The probe never builds a module other than the one it inspected: the pipeline runs once under a
``PassInstrument`` that keeps references to the module at three points, and the module the
pipeline returns is handed to ``relax.build(..., relax_pipeline=None)`` — exactly what
``tvm.compile(mod, target, relax_pipeline=pipeline)`` does in one call.

Snapshots (each an ``IRModule``; keeping them costs a reference, IRModules are immutable):

* ``pre_fold``    — just before the first ``FoldConstant``: legalized; what it folds is
  re-evaluated from here.
* ``pre_fusion``  — just before the first ``FuseOps``: legalized, constants folded, call sites
  still one op each, bound to the Vars the importer tagged.
* ``post_fusion`` — just after that ``FuseOps``: ``main`` calls grouped functions.
* ``call_graph``  — just before ``ToNonDataflow`` (else ``CallTIRRewrite``): the last module whose
  ``main`` still binds each kernel call to a Var that the earlier snapshots share.  Its kernel
  calls, in order, are the kernel calls the VM makes.

The same instrument records which pass runs when (:class:`~tvm_probe.build.passes.PassLog`), and
what TVM prints on stderr goes to ``logging``.  When a pass or the build fails, or TVM warns,
:mod:`tvm_probe.diagnose.failures` names the pass or kernel and the source ops concerned.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Union

from ..core.device import device_for
from ..core.errors import PipelineError, TVMCompileError, one_line, tvm_message
from ..core.native_log import native_log_to_logging, release_native
from ..core.records import CompileWarning
from ..core.schema import DEFAULT_PIPELINE, PIPELINE_NAMES
from .passes import PassLog

log = logging.getLogger(__name__)

PipelineLike = Union[str, Any]  # a name from PIPELINE_NAMES or a tvm.transform.Pass

CALL_GRAPH_PASSES = ("ToNonDataflow", "CallTIRRewrite")


class Diagnosis(Protocol):
    """How a compile's failures and warnings are named in source terms.

    :mod:`tvm_probe.diagnose.failures` implements it (it needs the kernel map, which is made from
    what this stage builds, so it sits above this stage and is handed in).  Without one, a failure
    carries TVM's own words and warnings are not attributed to ops.
    """

    def pipeline_failure(self, err, passes: PassLog, target, label: str, imported, snapshots) -> TVMCompileError: ...
    def build_failure(self, err, lowered, target, snapshots, imported) -> TVMCompileError: ...
    def attribute_warnings(self, pipeline_log, passes: PassLog, target, imported, build_log) -> list: ...
    def log_details(self, error) -> None: ...


class _TVMWords:
    """The :class:`Diagnosis` used when none is given: TVM's message, no source ops."""

    @staticmethod
    def pipeline_failure(err, passes, target, label, imported, snapshots):
        return TVMCompileError(f"pipeline {label!r} failed for {target.kind.name}: {tvm_message(err)}")

    @staticmethod
    def build_failure(err, lowered, target, snapshots, imported):
        return TVMCompileError(f"building for {target.kind.name} failed: {tvm_message(err)}")

    @staticmethod
    def attribute_warnings(pipeline_log, passes, target, imported, build_log):
        return [CompileWarning(message=text, where="build" if log_ is build_log else "")
                for log_ in (pipeline_log, build_log) if log_ is not None for _, text in log_.warnings()]

    @staticmethod
    def log_details(error):
        pass


@dataclass
class Snapshots:
    """The module at the points of the pipeline the kernel map needs (see module docstring)."""

    pre_fold: Any = None
    pre_fusion: Any = None
    post_fusion: Any = None
    call_graph: Any = None
    final: Any = None       # what the pipeline returned: the module that is built
    passes: list[str] = field(default_factory=list)


@dataclass
class BuiltModel:
    """The deployed executable and what was seen while it was compiled.

    ``warnings`` are TVM's compile warnings, each with the source ops it concerns; they are
    attributed on first access (that re-runs LegalizeOps one binding at a time: ~0.3 s on
    BERT-base), so a probe that never looks at them does not pay for it.
    """

    executable: Any
    target: Any
    pipeline: str
    snapshots: Snapshots
    find_warnings: Callable[[], list[CompileWarning]] | None = field(default=None, repr=False)
    _warnings: list[CompileWarning] | None = field(default=None, repr=False)

    @property
    def device(self):
        """The TVM device the executable runs on."""
        return device_for(self.target)

    @property
    def warnings(self) -> list[CompileWarning]:
        """TVM's compile warnings with the source ops they concern (see the class docstring)."""
        if self._warnings is None:
            self._warnings = self.find_warnings() if self.find_warnings is not None else []
            self.find_warnings = None  # drop what it kept (modules, logs)
        return self._warnings


def parse_target(target) -> Any:
    """A ``tvm.target.Target`` from a kind (``"llvm"``, ``"cuda"``), a dict or JSON string with
    options (``{"kind": "cuda", "arch": "sm_90"}``) or a Target, with a clear error.

    TVM 0.27 no longer reads command-line style strings (``"cuda -arch=sm_90"``): one is refused
    with the JSON form that says the same.
    """
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and _cli_style(target):
        raise PipelineError(f"target {target!r}: TVM 0.27 takes a target with options in JSON form, not as a "
                            f"command line: use {_as_json(target)} (a dict in Python, a quoted string in YAML)")
    try:
        return tvm.target.Target(target)
    except Exception as err:
        raise PipelineError(f"target {target!r} is not a TVM target ({one_line(err)}): try 'llvm', 'cuda' or "
                            "a JSON form such as {\"kind\": \"cuda\", \"arch\": \"sm_90\"}") from None


def target_literal(target) -> str:
    """Python source for ``target`` that ``tvm.target.Target()`` accepts."""
    if isinstance(target, (str, Mapping)):
        return repr(target if isinstance(target, str) else dict(target))
    import json

    return repr(json.dumps(_plain(target.export())))  # a Target: its JSON form


def _plain(value):
    """A target's exported attributes as JSON data (TVM maps and arrays as dicts and lists)."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_plain(v) for v in value]
    return value if isinstance(value, (bool, int, float)) else str(value)


def _cli_style(text: str) -> bool:
    """``"cuda -arch=sm_90"``: a kind followed by ``-option`` words."""
    words = text.split()
    return not text.lstrip().startswith("{") and len(words) > 1 and all(w.startswith("-") for w in words[1:])


def _as_json(text: str) -> str:
    """The JSON target equivalent to a command-line style one (numbers as numbers, bare flags true)."""
    import json

    kind, *options = text.split()
    target: dict = {"kind": kind}
    for option in options:
        key, eq, value = option.lstrip("-").partition("=")
        target[key] = (int(value) if value.lstrip("-").isdigit() else value) if eq else True
    return json.dumps(target)


def resolve_pipeline(pipeline: PipelineLike, target) -> tuple[Any, str]:
    """The pass that ``pipeline`` names for ``target``, and a label for reports.

    A name of TVM's (``relax.pipeline.PIPELINE_MAP``: ``default``, ``default_build``, ``zero``,
    ``static_shape_tuning``) means what ``tvm.compile(relax_pipeline=NAME)`` runs — ``"default"``
    unfused on CPU, dlight + fusion on GPU; ``"fused"`` is ``relax.get_default_pipeline(target)``;
    a ``tvm.transform.Pass`` is used as is.  A pipeline that needs arguments
    (``static_shape_tuning``) is built by the user with ``relax.get_pipeline(NAME, ...)``.
    """
    import tvm
    from tvm import relax

    if isinstance(pipeline, tvm.transform.Pass):
        return pipeline, getattr(pipeline.info, "name", "custom") or "custom"
    if pipeline == "fused" or (pipeline == "default" and "gpu" in target.keys):  # default: as tvm.compile chooses
        return relax.get_default_pipeline(target), pipeline
    if isinstance(pipeline, str) and pipeline in relax.pipeline.PIPELINE_MAP:
        try:
            return relax.get_pipeline(pipeline), pipeline
        except TypeError as err:  # e.g. static_shape_tuning's total_trials and target
            needs = str(err).partition("missing ")[2] or str(err)
            raise PipelineError(f"pipeline {pipeline!r} takes arguments (missing {needs}): build it with "
                                f"relax.get_pipeline({pipeline!r}, ...) and pass that pass as pipeline= "
                                "(tvm.compile cannot take the name alone either)") from None
    raise PipelineError(
        f"unknown pipeline {pipeline!r}: use one of {', '.join(PIPELINE_NAMES)} or a tvm.transform.Pass")


def _instrument(snaps: Snapshots, passes: PassLog | None = None):
    import tvm

    @tvm.ir.instrument.pass_instrument
    class _Snapshot:
        def run_before_pass(self, mod, info):
            snaps.passes.append(info.name)
            if passes is not None:
                passes.before(mod, info.name)
            if info.name == "FoldConstant" and snaps.pre_fold is None:
                snaps.pre_fold = mod
            if info.name == "FuseOps" and snaps.pre_fusion is None:
                snaps.pre_fusion = mod
            if info.name in CALL_GRAPH_PASSES and snaps.call_graph is None:
                snaps.call_graph = mod

        def run_after_pass(self, mod, info):
            if passes is not None:
                passes.after(info.name, mod)
            if info.name == "FuseOps" and snaps.post_fusion is None:
                snaps.post_fusion = mod

    return _Snapshot()


def _context_with(instrument=None):
    """The current PassContext (opt level, config, instruments) plus ``instrument``; with None,
    the current settings without any instrument (for tvm_probe's own re-runs of passes)."""
    import tvm

    cur = tvm.transform.PassContext.current()
    instruments = list(cur.instruments) + [instrument] if instrument is not None else []
    return tvm.transform.PassContext(
        opt_level=cur.opt_level, required_pass=list(cur.required_pass),
        disabled_pass=list(cur.disabled_pass), instruments=instruments, config=dict(cur.config))


def compile_with_snapshots(mod, target, pipeline: PipelineLike = DEFAULT_PIPELINE, imported=None,
                           diagnosis: Diagnosis | None = None) -> BuiltModel:
    """Run ``pipeline`` on ``mod`` for ``target`` once, keep snapshots, build the result.

    Args:
        mod: the Relax module (``imported.mod`` for a model tvm_probe imported).
        target, pipeline: see :func:`parse_target` and :func:`resolve_pipeline`.
        imported: the :class:`~tvm_probe.importer.ImportedModel` ``mod`` comes from; with it,
            failures and :attr:`BuiltModel.warnings` name source ops (without it, passes and
            kernels only).
        diagnosis: what names failures and warnings (:class:`Diagnosis`);
            :func:`tvm_probe.diagnose.compile_with_snapshots` passes the one that uses source terms.

    Raises:
        PipelineError: unknown pipeline or target, or a pipeline that does not lower ``main``
            through ``ToNonDataflow``/``CallTIRRewrite`` (then it is not a VM pipeline).
        TVMCompileError: a pass of the pipeline or the build failed on this model.  The message
            names the pass or kernel, the source ops and TVM's own words; the error carries
            ``failure`` (:class:`~tvm_probe.diagnose.failures.TVMFailure`), ``details`` (TVM's whole
            message) and ``snapshots`` (what the pipeline produced before it failed).
    """
    failures = diagnosis or _TVMWords
    target = parse_target(target)
    pass_, label = resolve_pipeline(pipeline, target)
    snaps = Snapshots()
    settings = _context_with()  # for re-running passes: the user's settings, no instruments
    error = None
    with native_log_to_logging() as pipeline_log:
        passes = PassLog(pipeline_log)
        try:
            with target, _context_with(_instrument(snaps, passes)):
                lowered = pass_(mod)
        except Exception as err:
            with settings:
                error = failures.pipeline_failure(err, passes, target, label, imported, snaps)
            release_native(err)  # what TVM logs as its objects go is logged here
    if error is not None:
        failures.log_details(error)
        raise _with_shape_hint(error, imported)
    snaps.final = lowered
    if snaps.call_graph is None:
        raise PipelineError(
            f"pipeline {label!r} never ran ToNonDataflow or CallTIRRewrite: it does not lower the model for "
            "the VM (tvm.compile fails on it too); give a complete Relax VM pipeline such as "
            "relax.get_default_pipeline(target)")
    try:
        executable, build_log = _build(lowered, target, snaps, imported, settings, failures)
    except TVMCompileError as err:
        raise _with_shape_hint(err, imported) from None
    built = BuiltModel(executable=executable, target=target, pipeline=label, snapshots=snaps)
    if pipeline_log.warnings() or build_log.warnings():
        def find_warnings():
            with native_log_to_logging(), settings:
                return failures.attribute_warnings(pipeline_log, passes, target, imported, build_log)
        built.find_warnings = find_warnings
    return built


def _with_shape_hint(error, imported):
    """``error``, saying what to do when the model was compiled with symbolic dimensions."""
    symbolic = [s.name for s in getattr(imported, "inputs", ()) if s.shape is None or any(isinstance(d, str) for d in s.shape)]
    if symbolic:
        error.args = (f"{error}; this model has symbolic dimensions (inputs {', '.join(symbolic)}), which "
                      "TVM 0.27 cannot compile here: pass shapes= (YAML model.shapes) to compile it for fixed "
                      "sizes",)
    return error


def _build(lowered, target, snaps: Snapshots, imported, settings, failures: Diagnosis):
    """``relax.build`` of the lowered module (exactly what the pipeline produced), and what TVM
    logged meanwhile."""
    from tvm import relax

    error = None
    with native_log_to_logging() as build_log:
        try:
            executable = relax.build(lowered, target, relax_pipeline=None)
        except Exception as err:
            with settings:
                error = failures.build_failure(err, lowered, target, snaps, imported)
            release_native(err)
    if error is not None:
        failures.log_details(error)
        raise error
    return executable, build_log


def compile_plain(mod, target, pipeline: PipelineLike = DEFAULT_PIPELINE):
    """What a user without tvm_probe deploys: ``tvm.compile`` with the same pipeline."""
    import tvm

    target = parse_target(target)
    pass_, _ = resolve_pipeline(pipeline, target)
    return tvm.compile(mod, target, relax_pipeline=pass_)


@dataclass
class RecordedPipeline:
    """One run of a pipeline with every pass's module kept (:class:`PassLog` with
    ``keep_modules``): what bisecting over the pipeline's passes needs.

    ``lowered`` is what the pipeline returned (None when a pass raised); ``error`` the exception
    a pass raised (its words kept: ``error_type``, ``message``), ``failing`` the innermost pass
    still running then — its :attr:`~tvm_probe.build.passes.PassRun.path` is where it sat.
    """

    lowered: Any
    passes: PassLog
    target: Any
    error: BaseException | None = None  # its traceback's frames cleared
    error_type: str = ""
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.lowered is None

    @property
    def failing(self):
        return self.passes.failing


def run_pipeline_recorded(mod, target, pipeline: PipelineLike = DEFAULT_PIPELINE) -> RecordedPipeline:
    """Run ``pipeline`` on ``mod`` for ``target`` once, keeping the module every pass received
    and returned; a pass that raises is recorded, not raised (the module before it is what a
    reproduction starts from).  Nothing is built."""
    target = parse_target(target)
    pass_, _ = resolve_pipeline(pipeline, target)
    passes = PassLog(keep_modules=True)
    record = RecordedPipeline(None, passes, target)
    with native_log_to_logging():
        try:
            with target, _context_with(_instrument(Snapshots(), passes)):
                record.lowered = pass_(mod)
        except Exception as err:
            record.error, record.error_type, record.message = err, type(err).__name__, tvm_message(err)[0]
            release_native(err)
    return record
