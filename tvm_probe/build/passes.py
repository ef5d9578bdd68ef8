"""The passes of a pipeline as they ran (:class:`PassLog`), and running one op-local pass on one
binding at a time, to find which source op makes it fail or warn.

TVM is imported lazily; every module here is one the pipeline already produced (IRModules are
immutable): the module a probe deploys is never changed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..core.errors import same_failure_as
from ..core.native_log import NativeLog, native_log_to_logging, release_native

#: Passes that treat each binding on its own, so that running one on a single binding shows
#: whether that binding is what makes it fail or warn.  Name → factory of the pass.
OP_LOCAL_PASSES: dict[str, Callable[[], Any]] = {
    "LegalizeOps": lambda: _relax_transform().LegalizeOps(),
    "FoldConstant": lambda: _relax_transform().FoldConstant(),
}


def _relax_transform():
    from tvm.relax import transform

    return transform


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
    parent: "PassRun | None" = None  # the pass that ran this one (a Sequential, FuseTIR...)
    result: Any = None               # the module it returned, kept by a PassLog(keep_modules=True)

    @property
    def path(self) -> str:
        """The names of the passes open when this one ran, outermost first, and its own, joined
        by ``>``: ``_pipeline>sequential>FuseTIR`` (how a pass is found in a nested pipeline)."""
        names, run = [], self
        while run is not None:
            names.append(run.name)
            run = run.parent
        return ">".join(reversed(names))


class PassLog:
    """The passes a pipeline ran, nested as they ran, with the stderr offsets of each.

    Fed by a pass instrument (:meth:`before` / :meth:`after`); afterwards :attr:`failing` is the
    innermost pass that started and never finished, and :meth:`run_at` says which pass was
    running when TVM printed something.  With ``keep_modules``, every run keeps the module it
    received and the one it returned (references: IRModules are immutable), so that
    :meth:`steps` can be rebuilt one by one.
    """

    def __init__(self, native: NativeLog | None = None, keep_modules: bool = False):
        self.native = native
        self.keep_modules = keep_modules
        self.runs: list[PassRun] = []
        self._open: list[PassRun] = []

    def _tell(self) -> int:
        return self.native.tell() if self.native is not None else 0

    def before(self, mod, name: str) -> None:
        run = PassRun(name, len(self._open), mod, self._tell(), parent=self._open[-1] if self._open else None)
        self._open.append(run)
        self.runs.append(run)

    def after(self, name: str, mod=None) -> None:
        while self._open:
            run = self._open.pop()
            run.log_end = self._tell()
            if self.keep_modules:
                run.result = mod if run.name == name else None
            elif run.name not in OP_LOCAL_PASSES:
                run.module = None
            if run.name == name:
                break

    def steps(self) -> list[PassRun]:
        """The passes that each received the whole module from a ``Sequential`` (or ran on their
        own), in order: the pipeline's own steps.  A ``Sequential``, or a pass that runs one
        (TVM's ``_pipeline`` functions), is not a step — its children are; the passes a step
        runs inside itself (FuseTIR's ``FuseTIRInner``) see partial modules and are not steps."""
        containers = {id(run.parent) for run in self.runs if run.name == "sequential" and run.parent is not None}
        return [run for run in self.runs
                if (run.parent is None or run.parent.name == "sequential")
                and run.name != "sequential" and id(run) not in containers]

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
class Binding:
    """One binding of a Relax function of the module a pass received, with its tiny module."""

    var: Any
    op: str
    module: Any            # a module holding only a function that makes this one binding


def op_name(value) -> str:
    import tvm

    op = getattr(value, "op", None)
    if isinstance(op, tvm.ir.Op):
        return str(op.name)
    return str(getattr(op, "name_hint", "") or type(value).__name__)


def single_binding_module(mod, binding, dataflow: bool, is_pure: bool):
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


def bindings(mod) -> Iterator[Binding]:
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
                    small = single_binding_module(mod, binding, isinstance(block, relax.DataflowBlock),
                                                   bool(getattr(func, "is_pure", True)))
                except Exception:  # a binding that cannot be isolated is not tried (nor blamed)
                    continue
                yield Binding(binding.var, op_name(binding.value), small)


class Deduplicated:
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
        key = (tvm_ffi.structural_hash(main, skip_tensor_content=skip), small_constants(main) if skip else ())
        bucket = self._done.setdefault(key, [])
        for seen, result in bucket:
            if tvm_ffi.structural_equal(seen, main, skip_tensor_content=skip):
                return result
        result = self.fn(small)
        bucket.append((main, result))
        return result


_SMALL = 16


def small_constants(func) -> tuple:
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


def failing_bindings(run: PassRun, target, original: BaseException) -> list[Binding] | None:
    """The bindings on which ``run``'s pass, run on that binding alone, fails as ``original`` did.

    None when the pass is not op-local (running it per binding would prove nothing).
    """
    factory = OP_LOCAL_PASSES.get(run.name)
    if factory is None or run.module is None:
        return None
    want = same_failure_as(original)

    def fails(small) -> bool:
        try:
            with target:
                factory()(small)
        except Exception as err:
            same = same_failure_as(err) == want
            release_native(err, collect=False)
            return same
        return False

    check = Deduplicated(fails)
    with native_log_to_logging(forward=False):
        return [b for b in bindings(run.module) if check(b.module)]
