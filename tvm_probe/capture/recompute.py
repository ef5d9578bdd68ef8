"""Recompute stage: values the deployed module never materialises.

* **Fused-away values** live only inside a fused kernel.  The grouped (pre-FuseTIR) function of
  that call site is *cut*: a copy whose body is unchanged but which returns every tensor it
  binds.  The cut is compiled on its own, once per grouped function (sites that share a function
  share the build), and fed the inputs that call site received in the captured run.  The main
  executable is never touched.
* **Folded values** were turned into constants by the pipeline's ``FoldConstant``.  The slice of
  the imported ``main`` that computes one is compiled with no parameters and run — the same
  legalized kernels FoldConstant evaluates.
"""
from __future__ import annotations

import logging
import threading

import numpy as np

from ..core.device import device_for, on_host
from ..core.errors import ProbeError, ValueUnavailableError, one_line
from ..core.native_log import native_log_to_logging
from ..kernel_map import CallSite
from ..kernel_map.relax_analysis import bindings_computing
from .kernel_hook import registry_settled

log = logging.getLogger(__name__)


class Recomputer:
    """Builds cut modules and runs them; see the module docstring.

    Every cut a kernel map needs is compiled into one module on first use (one build instead of
    one per grouped function: a build costs a second or so, a run of a cut about what its
    kernel costs).  When that build fails, each cut is built on its own, so the error names the
    kernel whose cut fails.  Where the cuts run is :meth:`_load` / :meth:`_to_device` (a
    subclass runs them on a remote device).
    """

    def __init__(self, target, groups=()):
        self._target = target
        self._groups = {g.name: g for g in groups}
        self._executable = None  # every known group's cut, compiled
        self._names: set[str] = set()
        self._vm = None  # the executable, loaded where the cuts run
        self._lock = threading.Lock()
        self._tried_alongside = False

    def interior_values(self, site: CallSite, site_inputs: list[np.ndarray], wanted=None,
                        input_shapes=None) -> dict:
        """The tensors ``site``'s grouped function binds (by its Var; only those in ``wanted``
        when given), from the inputs the site received (``input_shapes``: the shapes of the
        run's model inputs, which give the symbolic sizes the call passes)."""
        group = site.group
        feed = cut_feed(group, site_inputs, input_shapes)
        return self._run_cut(self._built(group), group, feed, wanted)

    def _run_cut(self, vm, group, feed: list[np.ndarray], wanted) -> dict:
        """``group``'s cut in ``vm`` on ``feed``: the tensors in ``wanted`` (None: all), as numpy."""
        return wanted_arrays(group, vm[_cut_name(group)](*self._to_device(feed)), wanted)

    def build_alongside(self) -> threading.Thread | None:
        """Start building the cuts on a thread, for a run that will need them, so the build
        overlaps the run (TVM's compiler releases the GIL): a full compare then costs one build
        less.  The cuts are compiled, and loaded where :meth:`_loads_alongside` allows.

        Once per recomputer; the caller joins the thread before its run returns (the build sends
        file descriptor 2 to the log while it lasts).  A build that fails here is left for the
        first :meth:`interior_values` to repeat and report.  None when nothing is to build.
        """
        if self._executable is not None or self._tried_alongside or not self._groups:
            return None
        self._tried_alongside = True
        thread = threading.Thread(target=self._build_quietly, name="tvm_probe cut build")
        thread.start()
        return thread

    def _build_quietly(self) -> None:
        try:
            with self._lock:
                if self._executable is None:
                    self._compile_all()
                if self._vm is None and self._loads_alongside():
                    self._vm = self._load(self._executable)
        except Exception as err:  # noqa: BLE001 - reported by the foreground build that repeats it
            log.debug("building the cut modules alongside the run failed: %s", one_line(err))

    def _built(self, group):
        with self._lock:
            self._groups.setdefault(group.name, group)
            if self._executable is None or _cut_name(group) not in self._names:
                self._compile_all()
            if self._vm is None:
                self._vm = self._load(self._executable)
            return self._vm

    def _compile_all(self) -> None:
        """One executable with the cut of every known group (call with the lock held)."""
        groups = list(self._groups.values())
        self._vm, self._executable = None, compile_cuts(groups, self._target)
        self._names = {_cut_name(g) for g in groups}

    def _loads_alongside(self) -> bool:
        """Whether the cuts may be loaded while a run goes on: on the host, yes (LLVM's JIT is
        half the build); onto a GPU, no: that would touch the device the run is timed on."""
        return on_host(device_for(self._target))

    def _load(self, executable):
        """A VM of the cuts' executable, on the target's local device."""
        from tvm import relax

        with registry_settled():  # (this may run on the build thread while the run sets up hooks)
            return relax.VirtualMachine(executable, device_for(self._target))

    def _to_device(self, arrays: list[np.ndarray]) -> list:
        import tvm

        dev = device_for(self._target)  # (shapes and scalars go as they are)
        return [tvm.runtime.tensor(a, dev) if isinstance(a, np.ndarray) else a for a in arrays]


def cut_feed(group, site_inputs: list[np.ndarray], input_shapes=None) -> list[np.ndarray]:
    """The cut function's arguments: the call site's inputs and the constants it was fused with
    (shapes whose symbols are input sizes take this run's sizes, from ``input_shapes``)."""
    sizes = {var: int(input_shapes[i][axis]) for var, (i, axis) in group.param_symbols.items()
             if input_shapes and input_shapes[i] is not None}
    feed = []
    for i, pos in enumerate(group.param_args):
        if pos is not None:
            feed.append(site_inputs[pos])
        elif i in group.param_consts:
            feed.append(_constant_argument(group, i, group.param_consts[i], sizes))
        else:  # FuseTIR fed this parameter from something the call site does not pass
            raise ValueUnavailableError(
                f"cannot recompute inside kernel {group.name}: its parameter {i} matches no argument of the "
                "compiled call (a pass fed it from elsewhere); build with pipeline='default' to read it, and "
                "please report the model")
    return feed


def _constant_argument(group, i: int, expr, sizes: dict):
    """A grouped function's parameter FuseTIR bound to an expression the call does not pass:
    a constant, or a shape or scalar whose values are known at compile time or from the run's
    input sizes (``sizes``: symbol → size); another symbolic one (its value lives only in the
    run that computed it) is a one-line refusal."""
    import tvm

    value = getattr(expr, "value", None)
    if hasattr(value, "numpy"):  # a constant
        return value.numpy()
    if type(expr).__name__ == "ShapeExpr":
        known = [_size(dim, sizes) for dim in expr.values]
        if None not in known:
            return tvm.runtime.ShapeTuple(known)
    if type(expr).__name__ in ("IntImm", "FloatImm"):  # a scalar argument (R.prim_value)
        return expr.value
    raise ValueUnavailableError(
        f"cannot recompute inside kernel {group.name}: its parameter {i} is {one_line(str(expr))}, a "
        "symbolic value the compiled call computes and does not pass; import with shapes= (static "
        "shapes) or build with pipeline='default' to read it")


_ARITHMETIC = {"Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
               "FloorDiv": lambda a, b: a // b, "FloorMod": lambda a, b: a % b, "Min": min, "Max": max}


def _size(dim, sizes: dict) -> int | None:
    """The value of one shape dimension: a number, a symbol in ``sizes``, or integer arithmetic
    on those (``past + 1``); None for anything else."""
    kind = type(dim).__name__
    if kind == "IntImm":
        return int(dim.value)
    if kind == "Var":
        return sizes.get(dim)
    if kind in _ARITHMETIC:
        a, b = _size(dim.a, sizes), _size(dim.b, sizes)
        if a is None or b is None or (kind in ("FloorDiv", "FloorMod") and b == 0):
            return None
        return int(_ARITHMETIC[kind](a, b))
    return None


def wanted_arrays(group, results, wanted) -> dict:
    """The results of ``group``'s cut by the Var each is, as numpy: those in ``wanted`` (None: all)."""
    return {var: r.numpy() for var, r in zip(_tensors(group), results) if wanted is None or var in wanted}


def compile_cuts(groups, target):
    """One executable with the cut of every group; when that fails, the group whose cut fails
    alone is named in a ProbeError."""
    try:
        return _compile_cuts(groups, target)
    except Exception:
        for group in groups:
            try:
                _compile_cuts([group], target)
            except Exception as err:
                raise ProbeError(f"cannot recompute values inside kernel {group.name}: {one_line(err)}") from None
        raise


def _cut_name(group) -> str:
    return f"cut_{group.name}"


def _tensors(group) -> list:
    """The tensors a grouped function binds, in order: what its cut returns."""
    from tvm import relax

    return [b.var for b in group.function.body.blocks[0].bindings if isinstance(b.var.ty, relax.TensorType)]


def _cut(group):
    """The grouped function, returning every tensor it binds instead of its result."""
    from tvm import relax

    func = group.function
    tensors = _tensors(group)
    outs = [relax.Var(f"out{i}", v.ty) for i, v in enumerate(tensors)]
    bindings = list(func.body.blocks[0].bindings) + [relax.VarBinding(o, v) for o, v in zip(outs, tensors)]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], relax.Tuple(outs))
    return relax.Function(list(func.params), body, relax.TupleType([v.ty for v in tensors]))


def _compile_cuts(groups, target):
    """One executable holding the cut of every group (function ``cut_<name>``), built quietly."""
    import tvm

    mod = tvm.IRModule({_cut_name(g): _cut(g) for g in groups})
    for group in groups:
        for gvar, prim in group.prim_funcs.items():
            mod[gvar] = prim
    with native_log_to_logging():
        return tvm.compile(mod, target)


def evaluate_folded(module, variables, target) -> list[np.ndarray]:
    """Values of Vars that the pipeline's ``FoldConstant`` turned into constants, in one build.

    ``module`` is the module just before FoldConstant; the slice of its ``main`` that computes
    ``variables`` is built once with the same legalized kernels and run, as FoldConstant does
    (one build for all of them: each build costs seconds).
    """
    import tvm
    from tvm import relax

    needed = bindings_computing(module["main"], variables)
    outs = [relax.Var(f"folded{i}", v.ty) for i, v in enumerate(variables)]
    bindings = needed + [relax.VarBinding(o, v) for o, v in zip(outs, variables)]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], relax.Tuple(outs))
    mod = tvm.IRModule({"main": relax.Function([], body, relax.TupleType([v.ty for v in variables]))})
    for gvar, func in module.functions.items():
        if not isinstance(func, relax.Function):  # the legalized PrimFuncs the slice calls
            mod[gvar] = func
    try:
        with native_log_to_logging():
            ex = tvm.compile(mod, target)
    except Exception as err:
        raise ProbeError(f"cannot re-evaluate the values FoldConstant folded: {one_line(err)}") from None
    vm = relax.VirtualMachine(ex, device_for(target))
    return [r.numpy() for r in vm["main"]()]
