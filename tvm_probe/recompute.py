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

import threading

import numpy as np

from .build import device_for, native_log_to_logging
from .errors import ProbeError, TVMBehaviourChanged, one_line
from .kernel_map import CallSite


class Recomputer:
    """Builds and caches cut modules; see the module docstring."""

    def __init__(self, target):
        self._target = target
        self._cuts: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def interior_values(self, site: CallSite, site_inputs: list[np.ndarray]) -> dict:
        """Every tensor ``site``'s grouped function binds (by its Var), from the site's inputs."""
        group = site.group
        vm, returned = self._cut(group)
        feed = []
        for i, pos in enumerate(group.param_args):
            if pos is not None:
                feed.append(site_inputs[pos])
            elif i in group.param_consts:
                feed.append(group.param_consts[i].value.numpy())
            else:  # FuseTIR fed this parameter from something the call site does not pass
                raise TVMBehaviourChanged(f"cannot recompute inside kernel {group.name}: its parameter {i} "
                                          "matches no argument of the compiled call")
        import tvm

        dev = device_for(self._target)
        results = vm["main"](*[tvm.runtime.tensor(a, dev) for a in feed])
        return dict(zip(returned, (r.numpy() for r in results)))

    def _cut(self, group):
        with self._lock:
            if group.name not in self._cuts:
                self._cuts[group.name] = self._build_cut(group)
            return self._cuts[group.name]

    def _build_cut(self, group):
        import tvm
        from tvm import relax

        func = group.function
        block = func.body.blocks[0]
        tensors = [b.var for b in block.bindings if isinstance(b.var.ty, relax.TensorType)]
        outs = [relax.Var(f"out{i}", v.ty) for i, v in enumerate(tensors)]
        bindings = list(block.bindings) + [relax.VarBinding(o, v) for o, v in zip(outs, tensors)]
        body = relax.SeqExpr([relax.DataflowBlock(bindings)], relax.Tuple(outs))
        cut = relax.Function(list(func.params), body, relax.TupleType([v.ty for v in tensors]))
        mod = tvm.IRModule({"main": cut})
        for gvar, f in group.prim_funcs.items():
            mod[gvar] = f
        try:
            with native_log_to_logging():
                ex = tvm.compile(mod, self._target)
        except Exception as err:
            raise ProbeError(f"cannot recompute values inside kernel {group.name}: {one_line(err)}") from None
        return relax.VirtualMachine(ex, device_for(self._target)), tensors


def _slice(main, variables) -> list | None:
    """The bindings of ``main`` that compute ``variables``, in order; None if any needs a parameter."""
    from tvm import relax

    order = {}
    for i, b in enumerate(b for blk in main.body.blocks for b in blk.bindings):
        order[b.var] = (i, b)
    params = set(main.params)
    needed, stack, seen = [], list(variables), set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in params or v not in order:
            return None
        needed.append(order[v])
        stack.extend(relax.analysis.free_vars(order[v][1].value))
    return [b for _, b in sorted(needed, key=lambda ib: ib[0])]


def depends_on_params(main, var) -> bool:
    """True when computing ``var`` needs a model input (so it cannot have been folded)."""
    return _slice(main, [var]) is None


def evaluate_folded(module, variables, target) -> list[np.ndarray]:
    """Values of Vars that the pipeline's ``FoldConstant`` turned into constants, in one build.

    ``module`` is the module just before FoldConstant; the slice of its ``main`` that computes
    ``variables`` is built once with the same legalized kernels and run, as FoldConstant does
    (one build for all of them: each build costs seconds).
    """
    import tvm
    from tvm import relax

    needed = _slice(module["main"], variables)
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
