"""TVM's failures and warnings, named the way the source model names things.

TVM's messages speak of Relax values and kernels (``lv12``, ``fused_reshape5_divide1_equal_where``),
never of the source model's ops, and TVM prints its warnings on stderr.  This module finds where
TVM failed or warned and names that place in source terms:

* a **pass fails** (``LegalizeOps`` on an ONNX ``Slice`` with a negative step): the pass is the
  one the pass instrument saw start and not finish (:class:`~tvm_probe.build.passes.PassLog`).  A pass that treats each
  binding on its own (:data:`~tvm_probe.build.passes.OP_LOCAL_PASSES`) is run again on one binding at a time, each in a
  tiny function with the same argument types; the bindings that fail the same way are the ops.
* the **build fails** (LLVM rejects the code of one kernel): the kernels (PrimFuncs) are built
  again in halves until single kernels are left that fail the same way; the kernel map names
  the source ops of their call sites and, in a fused kernel, which of them fail on their own.
* TVM **warns** while compiling (``pow(x, y)`` with ``y >= 3``, ``Gather`` in fast mode): a
  warning printed by an op-local pass is attributed by running that pass again on one binding at
  a time with stderr captured (:func:`attribute_warnings`).
* a **run fails** (the VM raises): the call site being run names the kernel and its source ops
  (:func:`run_failure`).

All of this work happens only after TVM failed or warned, on the modules the pipeline saw
(IRModules are immutable): the module a probe deploys is never changed.  What cannot be pinned
down is said to be unknown, never guessed.  TVM is imported lazily.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..build.passes import OP_LOCAL_PASSES, Binding, Deduplicated, PassLog, PassRun, bindings, failing_bindings, op_name
from ..core.describe import SHOWN_OPS, BindingNames, describe_ops, source_order
from ..core.errors import TVMCompileError, TVMRunError, same_failure_as, tvm_message
from ..core.native_log import NativeLog, native_log_to_logging, release_native
from ..core.records import CompileWarning  # noqa: F401  (made here, kept there)
from ..importer.fixes import unfixed_hint
from ..kernel_map import build_kernel_map

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------ plain data
@dataclass(frozen=True)
class TVMFailure:
    """Where TVM failed on a model, in source terms (attached to the error as ``err.failure``).

    Attributes:
        stage: ``"pipeline"`` (a pass raised), ``"build"`` (code generation) or ``"run"``.
        message: TVM's own message on one line (what the error shows).
        details: TVM's whole message, every line (also logged at INFO).
        error_type: the class of TVM's exception, e.g. ``InternalError``.
        pass_name: the pass that raised (stage ``pipeline``).
        kernels: the kernels (PrimFunc symbols) that fail to build, or the one being run.
        sites: the call sites (kernel-map indices) of those kernels.
        keys: source values of the ops that fail (each fails on its own).
        context_keys: further source ops inside the failing kernels.
        unknown: why the kernel or the source op is not known ('' when it is).
    """

    stage: str
    message: str
    details: str = ""
    error_type: str = ""
    pass_name: str = ""
    kernels: tuple[str, ...] = ()
    sites: tuple[int, ...] = ()
    keys: tuple[str, ...] = ()
    context_keys: tuple[str, ...] = ()
    unknown: str = ""


def _unfixed_note(imported, keys: Iterable[str]) -> str:
    """The import-fix hint when the model kept a construct a fix rewrites (fixes off)."""
    unfixed = getattr(imported, "unfixed", None) or []
    if not unfixed:
        return ""

    labels = set()
    for key in keys:
        value = imported.sources[key] if key in imported.sources else None
        labels.update({key} | ({value.node} if value is not None and value.node else set()))
    relevant = [f for f in unfixed if labels & set(f.sources)] or unfixed
    return unfixed_hint(relevant)


# ------------------------------------------------------------------------------ pipeline failures
def pipeline_failure(err: BaseException, passes: PassLog, target, label: str, imported=None,
                     snapshots=None) -> TVMCompileError:
    """The error for a pipeline that raised ``err``: the pass, the source ops, TVM's message.

    Call it inside :func:`native_log_to_logging` (it runs TVM again); log the error's
    ``details`` after that (a log line written inside the capture would land in it).
    """
    message, details = tvm_message(err)
    run = passes.failing
    keys: tuple[str, ...] = ()
    unknown = ""
    if run is None:
        where, unknown = "", "no pass was running: the pipeline itself raised"
    else:
        where = f" in pass {run.name}"
        found = failing_bindings(run, target, err)
        if found is None:
            unknown = f"{run.name} works on the whole module, so no single source op can be named"
        elif not found:
            unknown = f"no single op makes {run.name} fail on its own"
        elif imported is None:
            unknown = "source names unknown: compile_with_snapshots was not given the ImportedModel"
        else:
            names = BindingNames(imported)
            keys = source_order((k for b in found for k in names.of(b.var)), imported.sources)
            if not keys:
                ops = ", ".join(sorted({b.op for b in found}))
                unknown = f"the failing op ({ops}) has no source name"
    at = f" at {describe_ops(keys, imported.sources)}" if keys else f" ({unknown})" if unknown else ""
    note = _unfixed_note(imported, keys) if imported is not None else ""
    text = f"pipeline {label!r} failed for target {target.kind.name}{where}{at}: {message}"
    text += f"; {note}" if note else ""
    failure = TVMFailure("pipeline", message, details, type(err).__name__,
                         pass_name=run.name if run is not None else "", keys=keys, unknown=unknown)
    return _compile_error(text, failure, snapshots)


def log_details(error) -> None:
    """Log TVM's whole message of a :class:`TVMCompileError` / :class:`TVMRunError` at INFO."""
    failure = getattr(error, "failure", None)
    if failure is not None:
        log.info("TVM's message (%s):\n%s", failure.error_type, failure.details)


def _compile_error(text: str, failure: TVMFailure, snapshots) -> TVMCompileError:
    error = TVMCompileError(text)
    error.failure = failure
    error.details = failure.details
    error.snapshots = snapshots
    return error


# ------------------------------------------------------------------------------ build failures
def _prim_funcs(mod) -> list[tuple[Any, Any]]:
    from tvm import tirx

    return [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]


def _builds(funcs: list[tuple[Any, Any]], target, want: str, attrs=None) -> bool:
    """Whether the kernels build together; False only when they fail the way ``want`` says."""
    import tvm

    # private PrimFuncs (from before the pipeline exported them) need a symbol to build
    exported = {gv: f if f.attrs is not None and "global_symbol" in f.attrs
                else f.with_attr("global_symbol", gv.name_hint) for gv, f in funcs}
    try:
        tvm.tirx.build(tvm.IRModule(exported, attrs=attrs), target=target)
    except Exception as err:
        same = same_failure_as(err) == want
        release_native(err, collect=False)
        return not same
    return True


def failing_kernels(lowered, target, original: BaseException) -> tuple[list[str], bool]:
    """The kernels (PrimFunc names) of ``lowered`` that fail to build on their own as ``original``,
    and whether the kernels fail that way at all when built together.

    Halves are built until single kernels are left: about ``2 log2 n`` builds for one bad kernel
    instead of ``n``.  No kernel is named when the failure needs several kernels together, or
    is not in kernel code at all.
    """
    want = same_failure_as(original)
    funcs = _prim_funcs(lowered)
    found: list[str] = []

    def search(part) -> bool:
        if _builds(part, target, want, lowered.attrs):
            return False
        if len(part) == 1:
            found.append(part[0][0].name_hint)
        else:
            half = len(part) // 2
            search(part[:half])
            search(part[half:])
        return True

    with native_log_to_logging(forward=False):
        in_kernels = bool(funcs) and search(funcs)
    return found, in_kernels


def _kernel_sources(kmap, kernels: list[str]) -> tuple[list[int], list[str]]:
    """The call sites of ``kernels`` and the source values they output or keep inside."""
    sites = [s for s in kmap.sites if s.symbol in kernels]
    keys = [k for s in sites for outs in s.output_keys for k in outs] + [k for s in sites for k in s.interior_keys]
    return [s.index for s in sites], keys


def _ops_failing_alone(keys: list[str], imported, snapshots, target, want: str) -> list[str]:
    """Among the source values of a fused kernel, those whose own kernel (before FuseOps)
    fails to build the same way."""
    from tvm import relax

    if snapshots.pre_fusion is None:
        return []
    var_of = {}
    for var, tags in imported.var_keys.items():
        for key in tags:
            var_of.setdefault(key, var)
    callee = {}
    for block in snapshots.pre_fusion["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and op_name(value) == "relax.call_tir":
                callee[binding.var] = value.args[0]
    verdict: dict = {}
    failing = []
    with native_log_to_logging(forward=False):
        for key in keys:
            gvar = callee.get(var_of.get(key))
            if gvar is None:
                continue
            if gvar not in verdict:
                verdict[gvar] = not _builds([(gvar, snapshots.pre_fusion[gvar])], target, want)
            if verdict[gvar]:
                failing.append(key)
    return failing


def build_failure(err: BaseException, lowered, target, snapshots, imported=None) -> TVMCompileError:
    """The error for ``relax.build`` raising ``err``: the kernel, its source ops, TVM's message.

    Call it inside :func:`native_log_to_logging`, like :func:`pipeline_failure`.
    """
    message, details = tvm_message(err)
    kernels, in_kernels = failing_kernels(lowered, target, err)
    sites: list[int] = []
    keys: list[str] = []
    culprits: list[str] = []
    unknown = ""
    if not in_kernels:
        unknown = "every kernel builds: the failure is not in kernel code"
    elif not kernels:
        unknown = "no single kernel fails to build on its own"
    elif imported is None:
        unknown = "source names unknown: compile_with_snapshots was not given the ImportedModel"
    else:
        try:
            sites, keys = _kernel_sources(build_kernel_map(imported, snapshots), kernels)
        except Exception as map_err:  # the map is a help here, not a requirement
            unknown = f"the kernel map could not be built ({tvm_message(map_err)[0]})"
        if not unknown and not keys:
            unknown = "the kernel computes no value with a source name"
        if keys and snapshots.post_fusion is None:
            culprits = keys  # unfused: each kernel is one op
        elif keys:
            culprits = _ops_failing_alone(keys, imported, snapshots, target, same_failure_as(err))
    sources = imported.sources if imported is not None else None
    keys_t, culprits_t = source_order(keys, sources), source_order(culprits, sources)
    context = tuple(k for k in keys_t if k not in culprits_t)
    text = f"building for {target.kind.name} failed" + _kernel_phrase(kernels, culprits_t, context, unknown, sources)
    note = _unfixed_note(imported, culprits_t or keys_t) if imported is not None else ""
    text += f": {message}" + (f"; {note}" if note else "")
    failure = TVMFailure("build", message, details, type(err).__name__, kernels=tuple(kernels),
                         sites=tuple(sites), keys=culprits_t, context_keys=context, unknown=unknown)
    return _compile_error(text, failure, snapshots)


def _kernel_phrase(kernels, culprits, context, unknown, sources) -> str:
    """`` in kernel 'k' at source op 'a' (...) (the kernel also computes 'b', 'c')``, or why not."""
    if not kernels:
        return f" ({unknown})"
    text = f" in kernel{'s' if len(kernels) > 1 else ''} {_names(kernels)}"
    if culprits:
        text += f" at {describe_ops(culprits, sources)}"
        if context:
            text += f" (the kernel also computes {_names(_display(context, sources))})"
    elif context:
        text += f" (it computes {describe_ops(context, sources)}; none of them fails to build on its own)"
    elif unknown:
        text += f" ({unknown})"
    return text


def _names(names: list[str]) -> str:
    """``'a', 'b', 'c' and 2 more``."""
    more = f" and {len(names) - SHOWN_OPS} more" if len(names) > SHOWN_OPS else ""
    return ", ".join(f"'{n}'" for n in names[:SHOWN_OPS]) + more


def _display(keys, sources) -> list[str]:
    return [sources[k].display_name if sources is not None and k in sources else k for k in keys]


# ------------------------------------------------------------------------------ warnings
@dataclass
class _Attribution:
    """What re-running one op-local pass binding by binding found for one warning message.

    Attributes:
        where: the pass that printed it.
        keys: source values of the bindings whose re-run prints it (a binding may have none).
        ops: the Relax ops of those bindings.
        attributed: some binding printed it (its ops are known, even when none has a source name).
    """

    where: str
    keys: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    attributed: bool = False


def attribute_warnings(native: NativeLog, passes: PassLog, target, imported=None,
                       build_log: NativeLog | None = None) -> list[CompileWarning]:
    """TVM's compile warnings, each with the source ops that made TVM print it.

    A warning printed while an op-local pass ran is attributed by running that pass again on
    one binding at a time, stderr captured: the bindings whose run prints the same warning are
    its ops.  A warning printed elsewhere (another pass, code generation) that repeats one
    already attributed is not listed again; any other is listed without ops.
    """
    printed = [(text, passes.run_at(offset)) for offset, text in native.warnings()]
    printed += [(text, None) for _, text in (build_log.warnings() if build_log is not None else [])]
    if not printed:
        return []
    found: dict[str, _Attribution] = {}  # message → the bindings whose re-run prints it
    rerun = {id(run): run for _, run in printed if run is not None and run.name in OP_LOCAL_PASSES}
    names = BindingNames(imported) if imported is not None else None
    for run in rerun.values():
        for message, culprits in _warnings_per_binding(run, target).items():
            entry = found.setdefault(message, _Attribution(where=run.name))
            for b in culprits:
                entry.keys.extend(names.of(b.var) if names is not None else ())
                entry.ops.append(b.op)
                entry.attributed = True
    result: list[CompileWarning] = []
    listed = set()
    for text, run in printed:
        if text in listed:
            continue
        listed.add(text)
        entry = found.get(text)
        if entry is not None and entry.attributed:
            sources = imported.sources if imported is not None else None
            result.append(CompileWarning(text, source_order(entry.keys, sources), entry.where,
                                         tuple(dict.fromkeys(entry.ops))))
        else:
            result.append(CompileWarning(text, (), run.name if run is not None else "build"))
    return result


def _warnings_per_binding(run: PassRun, target) -> dict[str, list[Binding]]:
    """Warning message → the bindings on which ``run``'s pass, alone, prints it."""
    factory = OP_LOCAL_PASSES[run.name]

    def printed(small) -> tuple[str, ...]:
        with native_log_to_logging(forward=False) as native:
            try:
                with target:
                    factory()(small)
            except Exception as err:  # it fails alone: not a warning (the pipeline did not fail)
                release_native(err, collect=False)
        return tuple(dict.fromkeys(text for _, text in native.warnings()))

    check = Deduplicated(printed, exact=run.name != "LegalizeOps")
    by_message: dict[str, list[Binding]] = {}
    for binding in bindings(run.module):
        for message in check(binding.module):
            by_message.setdefault(message, []).append(binding)
    return by_message


# ------------------------------------------------------------------------------ run failures
def run_failure(err: BaseException, kernel_map, site: int | None, sources=None, finished: bool = False) -> TVMRunError:
    """The error for the VM raising ``err`` while running a compiled model.

    Args:
        err: what the VM raised.
        kernel_map: the model's :class:`~tvm_probe.kernel_map.KernelMap`.
        site: the call site being run when it raised (its before-hook ran, its after-hook did
            not), or the first call site that had not finished when that is all the instrument
            knows (then pass ``finished=True``: the VM may have failed in a builtin between the
            previous kernel and this one); None when not known.
        sources: the SourceMap, for op types and origins in the message.
    """
    message, details = tvm_message(err)
    log.info("TVM's message (%s):\n%s", type(err).__name__, details)
    kernels: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    unknown = ""
    if site is None or kernel_map is None or not 0 <= site < len(kernel_map.sites):
        where, unknown = " (the kernel being run is not known)", "the kernel being run is not known"
    else:
        call = kernel_map.sites[site]
        kernels = (call.symbol,)
        keys = source_order([k for outs in call.output_keys for k in outs] + list(call.interior_keys), sources)
        ops = describe_ops(keys, sources) if keys else "no source name"
        doing = "in the VM just before, or while running," if finished else "while running"
        where = f" {doing} kernel call #{site} '{call.symbol}' ({ops})"
    error = TVMRunError(f"the compiled model failed{where}: {message}")
    error.failure = TVMFailure("run", message, details, type(err).__name__, kernels=kernels,
                               sites=(site,) if kernels else (), keys=keys, unknown=unknown)
    error.details = details
    return error
