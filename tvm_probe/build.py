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
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Union

from .errors import PipelineError, one_line

log = logging.getLogger(__name__)

PIPELINES = ("default", "fused")
PipelineLike = Union[str, Any]  # a name from PIPELINES or a tvm.transform.Pass

_CALL_GRAPH_PASSES = ("ToNonDataflow", "CallTIRRewrite")


@dataclass
class Snapshots:
    """The module at the points of the pipeline the kernel map needs (see module docstring)."""

    pre_fold: Any = None
    pre_fusion: Any = None
    post_fusion: Any = None
    call_graph: Any = None
    passes: list[str] = field(default_factory=list)


@dataclass
class BuiltModel:
    """The deployed executable and what was seen while it was compiled."""

    executable: Any
    target: Any
    pipeline: str
    snapshots: Snapshots

    @property
    def device(self):
        """The TVM device the executable runs on."""
        return device_for(self.target)


def device_for(target):
    """The TVM device (index 0) that code built for ``target`` runs on."""
    import tvm

    kind = str(target.kind.name)
    return tvm.device("cpu" if kind in ("llvm", "c") else kind, 0)


def parse_target(target) -> Any:
    """A ``tvm.target.Target`` from a string or Target, with a clear error."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    try:
        return tvm.target.Target(target)
    except Exception as err:
        raise PipelineError(f"target {target!r} is not a TVM target ({one_line(err)}): try 'llvm' or 'cuda'") from None


def resolve_pipeline(pipeline: PipelineLike, target) -> tuple[Any, str]:
    """The pass that ``pipeline`` names for ``target``, and a label for reports.

    ``"default"`` is what ``tvm.compile`` uses (unfused on CPU, dlight + fusion on GPU);
    ``"fused"`` is ``relax.get_default_pipeline(target)``; a ``tvm.transform.Pass`` is used as is.
    """
    import tvm
    from tvm import relax

    if isinstance(pipeline, tvm.transform.Pass):
        return pipeline, getattr(pipeline.info, "name", "custom") or "custom"
    if pipeline == "default":
        if "gpu" in target.keys:  # the same choice tvm.compile makes
            return relax.get_default_pipeline(target), "default"
        return relax.get_pipeline("default"), "default"
    if pipeline == "fused":
        return relax.get_default_pipeline(target), "fused"
    raise PipelineError(
        f"unknown pipeline {pipeline!r}: use one of {', '.join(PIPELINES)} or a tvm.transform.Pass")


def _instrument(snaps: Snapshots):
    import tvm

    @tvm.ir.instrument.pass_instrument
    class _Snapshot:
        def run_before_pass(self, mod, info):
            snaps.passes.append(info.name)
            if info.name == "FoldConstant" and snaps.pre_fold is None:
                snaps.pre_fold = mod
            if info.name == "FuseOps" and snaps.pre_fusion is None:
                snaps.pre_fusion = mod
            if info.name in _CALL_GRAPH_PASSES and snaps.call_graph is None:
                snaps.call_graph = mod

        def run_after_pass(self, mod, info):
            if info.name == "FuseOps" and snaps.post_fusion is None:
                snaps.post_fusion = mod

    return _Snapshot()


def _context_with(instrument):
    """The current PassContext (opt level, config, instruments) plus ``instrument``."""
    import tvm

    cur = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=cur.opt_level, required_pass=list(cur.required_pass),
        disabled_pass=list(cur.disabled_pass), instruments=list(cur.instruments) + [instrument],
        config=dict(cur.config))


def compile_with_snapshots(mod, target, pipeline: PipelineLike = "default") -> BuiltModel:
    """Run ``pipeline`` on ``mod`` for ``target`` once, keep snapshots, build the result.

    Raises:
        PipelineError: unknown pipeline or target, the pipeline failed, or it does not lower
            ``main`` through ``ToNonDataflow``/``CallTIRRewrite`` (then it is not a VM pipeline).
    """
    from tvm import relax

    target = parse_target(target)
    pass_, label = resolve_pipeline(pipeline, target)
    snaps = Snapshots()
    try:
        with native_log_to_logging(), target, _context_with(_instrument(snaps)):
            lowered = pass_(mod)
    except Exception as err:
        raise PipelineError(f"pipeline {label!r} failed for target {target.kind.name}: {one_line(err)}") from None
    if snaps.call_graph is None:
        raise PipelineError(
            f"pipeline {label!r} never ran ToNonDataflow or CallTIRRewrite: give a complete Relax "
            "VM pipeline such as relax.get_default_pipeline(target)")
    try:
        with native_log_to_logging():
            executable = relax.build(lowered, target, relax_pipeline=None)
    except Exception as err:
        raise PipelineError(f"building for {target.kind.name} failed: {one_line(err)}") from None
    return BuiltModel(executable=executable, target=target, pipeline=label, snapshots=snaps)


@contextlib.contextmanager
def native_log_to_logging():
    """Send what TVM's C++ code prints to stderr while compiling to ``logging`` instead.

    TVM logs warnings such as "Fast mode segfaults when there are out-of-bounds indices" for
    every Gather; on a terminal they bury tvm_probe's own one-line messages.  They go to the
    ``tvm_probe.build`` logger at INFO level (``tvm-probe -v`` shows them).
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced (e.g. a notebook): leave it
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode("utf-8", "replace").splitlines():
                if line.strip():
                    log.info("TVM: %s", line.strip())


def compile_plain(mod, target, pipeline: PipelineLike = "default"):
    """What a user without tvm_probe deploys: ``tvm.compile`` with the same pipeline."""
    import tvm

    target = parse_target(target)
    pass_, _ = resolve_pipeline(pipeline, target)
    return tvm.compile(mod, target, relax_pipeline=pass_)
