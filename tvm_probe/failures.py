"""TVM's failures and warnings, named the way the source model names things.

TVM's messages speak of Relax values and kernels (``lv12``, ``fused_reshape5_divide1_equal_where``),
never of the source model's ops, and TVM prints its warnings on stderr.  This module finds where
TVM failed or warned and names that place in source terms:

* a **pass fails** (``LegalizeOps`` on an ONNX ``Slice`` with a negative step): the pass is the
  one the pass instrument saw start and not finish (:class:`PassLog`).  A pass that treats each
  binding on its own (:data:`OP_LOCAL_PASSES`) is run again on one binding at a time, each in a
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

import contextlib
import gc
import logging
import math
import os
import re
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Callable, Iterable, Iterator

from .errors import TVMCompileError, TVMRunError

log = logging.getLogger(__name__)

#: Passes that treat each binding on its own, so that running one on a single binding shows
#: whether that binding is what makes it fail or warn.  Name → factory of the pass.
OP_LOCAL_PASSES: dict[str, Callable[[], Any]] = {
    "LegalizeOps": lambda: _relax_transform().LegalizeOps(),
    "FoldConstant": lambda: _relax_transform().FoldConstant(),
}

#: What TVM logs as a "Warning" about its own objects, not about the model (e.g. as a failed
#: pass's BlockBuilder is freed).
_NOT_ABOUT_THE_MODEL = ("BlockBuilder destroyed with remaining blocks!",)

_MESSAGE_LIMIT = 400   # characters of TVM's message on the one-line error
_SHOWN_OPS = 3         # source ops named on one line before "and N more"


def _relax_transform():
    from tvm.relax import transform

    return transform


# ------------------------------------------------------------------------------ plain data
@dataclass(frozen=True)
class CompileWarning:
    """A warning TVM printed while compiling, and the source ops it concerns.

    Attributes:
        message: TVM's words, e.g. ``Detected pow(x, y) where y >= 3, ...``.
        keys: the source values (keys of the SourceMap) of the ops that make TVM print it, in
            source order; empty when it could not be attributed to ops (see ``where``).
        where: the pass that printed it (``LegalizeOps``) or ``build`` (code generation).
        ops: the Relax ops of those bindings (``relax.power``); empty when not attributed.
    """

    message: str
    keys: tuple[str, ...] = ()
    where: str = ""
    ops: tuple[str, ...] = ()

    def summary(self, sources=None) -> str:
        """One line: ``TVM warns at source op 'cube' (Pow): Detected pow(x, y) ...`` (names from ``sources``)."""
        if not self.keys:
            return f"TVM warns ({self.where}, not tied to a source op): {self.message}"
        return f"TVM warns at {describe_ops(self.keys, sources)}: {self.message}"

    def to_record(self) -> dict:
        """A JSON-friendly dict (the inverse of :meth:`from_record`)."""
        return {"message": self.message, "keys": list(self.keys), "where": self.where, "ops": list(self.ops)}

    @classmethod
    def from_record(cls, rec: dict) -> "CompileWarning":
        return cls(message=str(rec["message"]), keys=tuple(str(k) for k in rec.get("keys", ())),
                   where=str(rec.get("where", "")), ops=tuple(str(o) for o in rec.get("ops", ())))


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


# ------------------------------------------------------------------------------ TVM's words
_DEBUG_INFO = re.compile(r",?\s*!dbg !\d+")
_EMPTY_CLAUSE = re.compile(r": +:")  # TVM's "is false: : why" (not C++'s "::")
_NATIVE_LINE = re.compile(r"^\[[\d:.]+\] (?P<file>[^\s:]+):(?P<line>\d+): (?P<level>[A-Za-z]+): (?P<text>.*)$")


def tvm_message(err: BaseException) -> tuple[str, str]:
    """TVM's message as ``(one line, every line)``.

    The one line keeps every meaningful line of TVM's text: LLVM's verifier writes its verdict
    on the lines after "failed with the following errors:", which the first line alone drops.
    Debug annotations (``!dbg !169``) and empty clauses (``: :``) are removed.
    """
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if lines and lines[0].startswith("Traceback"):  # a traceback in the text: the message is last
        lines = lines[-1:]
    details = "\n".join(lines)
    head = ""
    for line in lines:
        line = _DEBUG_INFO.sub("", line)
        head = line if not head else head + (" " if head.endswith(":") else "; ") + line
    head = _EMPTY_CLAUSE.sub(":", head)
    if len(head) > _MESSAGE_LIMIT:
        head = head[: _MESSAGE_LIMIT - 3] + "..."
    return head or type(err).__name__, details


def _normalized(err: BaseException) -> str:
    """The failure's identity: type and text without numbers (register, Var and line numbers
    differ between the whole module and a part of it)."""
    return type(err).__name__ + ":" + re.sub(r"\d+", "#", tvm_message(err)[0])


def release_native(err: BaseException | None, collect: bool = True) -> None:
    """Free the TVM objects that ``err``'s traceback keeps alive, now.

    A failed import or pass leaves TVM objects in the frames of the traceback — a BlockBuilder
    with open blocks, which logs "BlockBuilder destroyed with remaining blocks!" on stderr when
    it is freed.  Freed later, that line would follow the one-line error; call this inside
    :func:`native_log_to_logging` so that it goes to the log instead.  ``collect=False`` skips
    the garbage collection (slow with PyTorch loaded) for exceptions without reference cycles.
    """
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__
    if collect:
        gc.collect()


# ------------------------------------------------------------------------------ native log
@dataclass
class NativeLog:
    """What TVM's C++ code wrote to stderr while :func:`native_log_to_logging` captured it.

    Attributes:
        entries: ``(offset, line)`` per non-empty line, offset in bytes from the start of the
            capture (filled when the capture ends).
    """

    entries: list[tuple[int, str]] = field(default_factory=list)
    _sink: Any = None

    def tell(self) -> int:
        """Bytes captured so far (0 when stderr could not be captured)."""
        if self._sink is None:
            return 0
        _flush_stderr()
        return os.fstat(self._sink.fileno()).st_size

    def warnings(self) -> list[tuple[int, str]]:
        """``(offset, text)`` of each warning TVM logged (``[time] file.cc:line: Warning: text``;
        continuation lines are joined to their warning)."""
        found: list[list] = []
        last_level = ""
        for offset, line in self.entries:
            match = _NATIVE_LINE.match(line)
            if match is not None:
                last_level = match["level"]
                if last_level == "Warning":
                    found.append([offset, match["text"].strip()])
            elif last_level == "Warning" and found:
                found[-1][1] += " " + line
        return [(offset, text) for offset, text in found if text not in _NOT_ABOUT_THE_MODEL]


_STDERR = 2


def _flush_stderr() -> None:
    """Flush what Python buffered for stderr, so that it lands on the right side of a redirect."""
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


@contextlib.contextmanager
def native_log_to_logging(forward: bool = True) -> Iterator[NativeLog]:
    """Send what TVM's C++ code prints to stderr while compiling to ``logging`` instead.

    TVM logs warnings such as "Fast mode segfaults when there are out-of-bounds indices" for
    every Gather; on a terminal they bury tvm_probe's own one-line messages.  They go to the
    ``tvm_probe.build`` logger at INFO level (``tvm-probe -v`` shows them); with
    ``forward=False`` they are only kept in the yielded :class:`NativeLog`.  One thread at a time
    (a build alongside a run is another thread): file descriptor 2 belongs to the process.
    """
    with _REDIRECTING:
        yield from _redirect_native_log(forward)


_REDIRECTING = threading.RLock()


def _redirect_native_log(forward: bool) -> Iterator[NativeLog]:
    native = NativeLog()
    _flush_stderr()
    try:
        saved = os.dup(_STDERR)  # TVM's C++ log writes to file descriptor 2, whatever sys.stderr is
    except OSError:  # no stderr at all: nothing to capture
        yield native
        return
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), _STDERR)
        native._sink = sink
        try:
            yield native
        finally:
            _flush_stderr()
            os.dup2(saved, _STDERR)
            os.close(saved)
            native._sink = None
            sink.seek(0)
            offset = 0
            for raw in sink.read().splitlines(keepends=True):
                line = raw.decode("utf-8", "replace").strip()
                if line:
                    native.entries.append((offset, line))
                    if forward:
                        logging.getLogger("tvm_probe.build").info("TVM: %s", line)
                offset += len(raw)


# ------------------------------------------------------------------------------ passes
@dataclass
class PassRun:
    """One run of one pass, as the pass instrument saw it.

    ``module`` is the module the pass received; it is kept while the pass runs and afterwards
    only for :data:`OP_LOCAL_PASSES` (IRModules are immutable: keeping one costs a reference).
    """

    name: str
    depth: int
    module: Any
    log_start: int
    log_end: int | None = None  # None: still running (or it raised)


class PassLog:
    """The passes a pipeline ran, nested as they ran, with the stderr offsets of each.

    Fed by a pass instrument (:meth:`before` / :meth:`after`); afterwards :attr:`failing` is the
    innermost pass that started and never finished, and :meth:`run_at` says which pass was
    running when TVM printed something.
    """

    def __init__(self, native: NativeLog | None = None):
        self.native = native
        self.runs: list[PassRun] = []
        self._open: list[PassRun] = []

    def _tell(self) -> int:
        return self.native.tell() if self.native is not None else 0

    def before(self, mod, name: str) -> None:
        run = PassRun(name, len(self._open), mod, self._tell())
        self._open.append(run)
        self.runs.append(run)

    def after(self, name: str) -> None:
        while self._open:
            run = self._open.pop()
            run.log_end = self._tell()
            if run.name not in OP_LOCAL_PASSES:
                run.module = None
            if run.name == name:
                break

    @property
    def failing(self) -> PassRun | None:
        """The innermost pass still running (the one that raised, after a failure)."""
        return self._open[-1] if self._open else None

    def run_at(self, offset: int) -> PassRun | None:
        """The innermost pass that was running when ``offset`` bytes had been logged."""
        best = None
        for run in self.runs:
            end = run.log_end if run.log_end is not None else float("inf")
            if run.log_start <= offset < end and (best is None or run.depth >= best.depth):
                best = run
        return best


# ------------------------------------------------------------------------------ one binding at a time
@dataclass
class _Binding:
    """One binding of a Relax function of the module a pass received, with its tiny module."""

    var: Any
    op: str
    module: Any            # a module holding only a function that makes this one binding


def _op_name(value) -> str:
    import tvm

    op = getattr(value, "op", None)
    if isinstance(op, tvm.ir.Op):
        return str(op.name)
    return str(getattr(op, "name_hint", "") or type(value).__name__)


def _single_binding_module(mod, binding, dataflow: bool, is_pure: bool):
    """A module whose only Relax function computes ``binding`` from parameters of the same types.

    The free Vars of the bound value are bound to fresh parameters inside the function, so the
    value itself is used unchanged; the functions it calls (PrimFuncs, Relax functions) come along.
    """
    import tvm
    from tvm import relax

    value = binding.value
    free = list(relax.analysis.free_vars(value))
    params = [relax.Var(v.name, v.ty) for v in free]
    bindings = [relax.VarBinding(v, p) for v, p in zip(free, params)]
    out = relax.Var("out", binding.var.ty)
    bindings += [relax.VarBinding(binding.var, value), relax.VarBinding(out, binding.var)]
    block = relax.DataflowBlock(bindings) if dataflow else relax.BindingBlock(bindings)
    func = relax.Function(params, relax.SeqExpr([block], out), binding.var.ty, is_pure=is_pure)
    funcs = {"main": func}
    for gvar in relax.analysis.all_global_vars(value):
        funcs[gvar] = mod[gvar]
    return tvm.IRModule(funcs, attrs=mod.attrs)


def _bindings(mod) -> Iterator[_Binding]:
    """Every call bound in a Relax function of ``mod``, with its single-binding module."""
    from tvm import relax

    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding) or not isinstance(binding.value, relax.Call):
                    continue
                try:
                    small = _single_binding_module(mod, binding, isinstance(block, relax.DataflowBlock),
                                                   bool(getattr(func, "is_pure", True)))
                except Exception:  # a binding that cannot be isolated is not tried (nor blamed)
                    continue
                yield _Binding(binding.var, _op_name(binding.value), small)


class _Deduplicated:
    """Runs ``fn`` once per structurally distinct single-binding module (layers repeat ops).

    With ``exact=False`` the values of constants with more than :data:`_SMALL` elements (weights)
    are not compared — legalization reads the shapes of weights, never their values — while
    small constants (a ``pow`` exponent) are; comparing every weight of every layer would cost
    more than the pass itself.
    """

    def __init__(self, fn: Callable[[Any], Any], exact: bool = True):
        self.fn, self.exact = fn, exact
        self._done: dict[tuple, list[tuple[Any, Any]]] = {}

    def __call__(self, small) -> Any:
        import tvm_ffi

        main = small["main"]
        skip = not self.exact
        key = (tvm_ffi.structural_hash(main, skip_tensor_content=skip), _small_constants(main) if skip else ())
        bucket = self._done.setdefault(key, [])
        for seen, result in bucket:
            if tvm_ffi.structural_equal(seen, main, skip_tensor_content=skip):
                return result
        result = self.fn(small)
        bucket.append((main, result))
        return result


_SMALL = 16


def _small_constants(func) -> tuple:
    """``(dtype, bytes)`` of every constant of ``func`` with at most :data:`_SMALL` elements."""
    import tvm
    from tvm import relax

    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.expr.GenericConst):
            if math.prod(int(d) for d in expr.value.shape) <= _SMALL:  # weights are not copied
                array = expr.value.numpy()
                found.append((str(array.dtype), array.tobytes()))
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                visit(arg)
        elif isinstance(expr, relax.Tuple):
            for item in expr.fields:
                visit(item)

    for block in func.body.blocks:
        for binding in block.bindings:
            visit(binding.value)
    return tuple(found)


def _failing_bindings(run: PassRun, target, original: BaseException) -> list[_Binding] | None:
    """The bindings on which ``run``'s pass, run on that binding alone, fails as ``original`` did.

    None when the pass is not op-local (running it per binding would prove nothing).
    """
    factory = OP_LOCAL_PASSES.get(run.name)
    if factory is None or run.module is None:
        return None
    want = _normalized(original)

    def fails(small) -> bool:
        try:
            with target:
                factory()(small)
        except Exception as err:
            same = _normalized(err) == want
            release_native(err, collect=False)
            return same
        return False

    check = _Deduplicated(fails)
    with native_log_to_logging(forward=False):
        return [b for b in _bindings(run.module) if check(b.module)]


# ------------------------------------------------------------------------------ source names
class BindingNames:
    """The source values each binding of an imported module computes, or belongs to.

    A Var the importer tagged names itself.  A converter may emit helper bindings before the
    one it returns (Gather normalises negative indices first); an untagged binding of the
    imported module belongs to the op of the binding that first uses it (and so on, to a tagged
    one).  A binding a pass created is not in the imported module: it has no source name.
    """

    def __init__(self, imported):
        from tvm import relax

        self.var_keys = imported.var_keys
        self.first_user: dict = {}
        for _, func in imported.mod.functions.items():
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            for block in func.body.blocks:
                for binding in block.bindings:
                    self.first_user.setdefault(binding.var, None)
                    for used in relax.analysis.free_vars(binding.value):
                        if self.first_user.get(used, binding.var) is None:
                            self.first_user[used] = binding.var

    def of(self, var) -> tuple[str, ...]:
        """The keys of the source values ``var`` computes or belongs to (empty when none)."""
        seen = set()
        while var is not None and var not in self.var_keys and var not in seen:
            seen.add(var)
            var = self.first_user.get(var)
        return tuple(self.var_keys[var]) if var is not None and var in self.var_keys else ()


def _source_order(keys: Iterable[str], sources) -> tuple[str, ...]:
    keys = list(dict.fromkeys(keys))
    if sources is None:
        return tuple(keys)
    order = {key: i for i, key in enumerate(v.key for v in sources)}
    return tuple(sorted(keys, key=lambda k: order.get(k, len(order))))


def describe_op(key: str, sources=None) -> str:
    """``'bug/slice' (Slice)``; for PyTorch ``'eq' (aten.eq.Scalar at model.py:51, module m)``."""
    value = sources[key] if sources is not None and key in sources else None
    if value is None:
        return f"'{key}'"
    facts = value.op_type
    if value.origin:
        facts += f" at {PurePath(value.origin).name}"
    if value.modules:
        facts += f", module {value.modules[0]}" + (f" (+{len(value.modules) - 1})" if len(value.modules) > 1 else "")
    return f"'{value.display_name}' ({facts})" if facts else f"'{value.display_name}'"


def describe_ops(keys: Iterable[str], sources=None) -> str:
    """``source op 'a' (...)`` or ``source ops 'a' (...), 'b' (...) and 3 more``."""
    keys = list(keys)
    shown = ", ".join(describe_op(k, sources) for k in keys[:_SHOWN_OPS])
    more = f" and {len(keys) - _SHOWN_OPS} more" if len(keys) > _SHOWN_OPS else ""
    return f"source op{'s' if len(keys) > 1 else ''} {shown}{more}"


def stack_origin(stack_trace: str | None) -> str:
    """``file:line`` of the user's code in an fx node's ``meta["stack_trace"]``, or ''.

    The trace lists frames outermost first; the innermost frame outside PyTorch itself is where
    the user's code made the value (``masked_fill(mask == 0, ...)``, or the ``self.token(x)``
    that called ``nn.Embedding``).
    """
    frames = re.findall(r'File "([^"]+)", line (\d+)', stack_trace or "")
    for path, line in reversed(frames):
        if not path.startswith("<") and not _in_torch(path):
            return f"{path}:{line}"
    return ""


def _in_torch(path: str) -> bool:
    torch = sys.modules.get("torch")
    root = os.path.dirname(getattr(torch, "__file__", "") or "")
    if root and os.path.abspath(path).startswith(root + os.sep):
        return True
    parts = PurePath(path).parts
    return any(p in ("site-packages", "dist-packages") for p in parts) and "torch" in parts


def _unfixed_note(imported, keys: Iterable[str]) -> str:
    """The import-fix hint when the model kept a construct a fix rewrites (fixes off)."""
    unfixed = getattr(imported, "unfixed", None) or []
    if not unfixed:
        return ""
    from .importer.fixes import unfixed_hint

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
        found = _failing_bindings(run, target, err)
        if found is None:
            unknown = f"{run.name} works on the whole module, so no single source op can be named"
        elif not found:
            unknown = f"no single op makes {run.name} fail on its own"
        elif imported is None:
            unknown = "source names unknown: compile_with_snapshots was not given the ImportedModel"
        else:
            names = BindingNames(imported)
            keys = _source_order((k for b in found for k in names.of(b.var)), imported.sources)
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
        same = _normalized(err) == want
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
    want = _normalized(original)
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
            if isinstance(value, relax.Call) and _op_name(value) == "relax.call_tir":
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
            from .kernel_map import build_kernel_map

            sites, keys = _kernel_sources(build_kernel_map(imported, snapshots), kernels)
        except Exception as map_err:  # the map is a help here, not a requirement
            unknown = f"the kernel map could not be built ({tvm_message(map_err)[0]})"
        if not unknown and not keys:
            unknown = "the kernel computes no value with a source name"
        if keys and snapshots.post_fusion is None:
            culprits = keys  # unfused: each kernel is one op
        elif keys:
            culprits = _ops_failing_alone(keys, imported, snapshots, target, _normalized(err))
    sources = imported.sources if imported is not None else None
    keys_t, culprits_t = _source_order(keys, sources), _source_order(culprits, sources)
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
    more = f" and {len(names) - _SHOWN_OPS} more" if len(names) > _SHOWN_OPS else ""
    return ", ".join(f"'{n}'" for n in names[:_SHOWN_OPS]) + more


def _display(keys, sources) -> list[str]:
    return [sources[k].display_name if sources is not None and k in sources else k for k in keys]


# ------------------------------------------------------------------------------ warnings
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
    found: dict[str, dict] = {}  # message → {"keys": [...], "ops": [...], "where": pass}
    rerun = {id(run): run for _, run in printed if run is not None and run.name in OP_LOCAL_PASSES}
    names = BindingNames(imported) if imported is not None else None
    for run in rerun.values():
        for message, bindings in _warnings_per_binding(run, target).items():
            entry = found.setdefault(message, {"keys": [], "ops": [], "where": run.name, "attributed": False})
            for b in bindings:
                keys = names.of(b.var) if names is not None else ()
                entry["keys"].extend(keys)
                entry["ops"].append(b.op)
                entry["attributed"] = True
    result: list[CompileWarning] = []
    listed = set()
    for text, run in printed:
        if text in listed:
            continue
        listed.add(text)
        entry = found.get(text)
        if entry is not None and entry["attributed"]:
            sources = imported.sources if imported is not None else None
            result.append(CompileWarning(text, _source_order(entry["keys"], sources), entry["where"],
                                         tuple(dict.fromkeys(entry["ops"]))))
        else:
            result.append(CompileWarning(text, (), run.name if run is not None else "build"))
    return result


def _warnings_per_binding(run: PassRun, target) -> dict[str, list[_Binding]]:
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

    check = _Deduplicated(printed, exact=run.name != "LegalizeOps")
    by_message: dict[str, list[_Binding]] = {}
    for binding in _bindings(run.module):
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
        keys = _source_order([k for outs in call.output_keys for k in outs] + list(call.interior_keys), sources)
        ops = describe_ops(keys, sources) if keys else "no source name"
        doing = "in the VM just before, or while running," if finished else "while running"
        where = f" {doing} kernel call #{site} '{call.symbol}' ({ops})"
    error = TVMRunError(f"the compiled model failed{where}: {message}")
    error.failure = TVMFailure("run", message, details, type(err).__name__, kernels=kernels,
                               sites=(site,) if kernels else (), keys=keys, unknown=unknown)
    error.details = details
    return error
