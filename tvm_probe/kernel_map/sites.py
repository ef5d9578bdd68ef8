"""The kernel calls of the compiled ``main`` in VM order (its call sites), the calls inside If
branches, and the helper kernels lowering adds."""
from __future__ import annotations

from typing import NamedTuple

from ..core.errors import TVMBehaviourChanged
from ..importer.relax_values import dim_of
from .types import _KERNEL_OPS, PACKED_OPS, VIEW_SYMBOL, ArgKind, ArgSource, BranchCalls, CallSite
from .valuenum import FunctionValues, shape_dims


def subroutines(mod) -> dict:
    """Name → Relax function, for the functions of ``mod`` besides ``main`` that the VM calls
    as functions of their own (``torch.cond``'s branches, ``cond_true_branch_0``): the VM's
    instrument sees each such call, and the kernel calls inside it."""
    from tvm import relax

    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and gv.name_hint != "main"}


def helper_symbols(snapshots) -> frozenset[str]:
    """Kernels of the final module the call graph does not have: lowering's own (``shape_func``);
    and what ``main`` calls inside If branches (kernels, and functions of the module with the
    kernels they call)."""
    conditional = branch_symbols(snapshots.call_graph["main"], subroutines(snapshots.call_graph))
    final = getattr(snapshots, "final", None)
    if final is None:
        return conditional
    known = {gv.name_hint for gv in snapshots.call_graph.functions}
    return conditional | frozenset(gv.name_hint for gv, f in final.functions.items()
                                   if gv.name_hint not in known and type(f).__name__ == "PrimFunc")


def fixed_helper_calls(snapshots, helpers) -> dict[str, int]:
    """``{helper: calls per run}`` when the final ``main`` calls every helper at its top level
    (no If anywhere, so each run makes exactly these calls); else ``{}``."""
    from tvm import relax

    final = getattr(snapshots, "final", None)
    if not helpers or final is None:
        return {}
    counts = dict.fromkeys(helpers, 0)
    for b in _bindings(final["main"]):
        if isinstance(b.value, relax.If):
            return {}
        op = getattr(b.value, "op", None)
        if isinstance(b.value, relax.Call) and isinstance(op, relax.GlobalVar) and op.name_hint in counts:
            counts[op.name_hint] += 1
    return counts if all(counts.values()) else {}


def branch_symbols(main, functions=None) -> frozenset[str]:
    """Kernels that ``main`` calls inside the branches of an ``If`` (nested ones too), and the
    module's ``functions`` it calls there (``torch.cond``'s branches) with their kernels.

    Which branch runs is known only at run time, so a call inside a branch is no call site: the
    instrument lets the calls of such a kernel pass where no call site has its occurrence (see
    :class:`BranchCalls`), and the values computed inside branches are not served.
    """
    from tvm import relax

    found: set[str] = set()
    functions = functions or {}
    visiting: list[str] = []

    def visit(expr, inside: bool) -> None:
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for b in block.bindings:
                    visit(b.value, inside)
            visit(expr.body, inside)
        elif isinstance(expr, relax.If):
            visit(expr.true_branch, True)
            visit(expr.false_branch, True)
        elif isinstance(expr, relax.Call) and _subroutine(expr, functions) not in ("", *visiting):
            name = _subroutine(expr, functions)  # a function of the module: the calls it makes too
            if inside:
                found.add(name)
            visiting.append(name)
            visit(functions[name].body, inside)
            visiting.pop()
        elif inside and isinstance(expr, relax.Call):
            symbol = _kernel_symbol(expr)
            if symbol:
                found.add(symbol)

    visit(main.body, False)
    return frozenset(found)


def _subroutine(call, functions) -> str:
    """The name of the module function ``call`` calls as a function of its own, else ''."""
    name = getattr(call.op, "name_hint", None)
    return name if name in functions else ""


def _conditional_numbers(main, values: FunctionValues, functions=None) -> dict[int, str]:
    """Value number → why it has no place, for what ``main`` computes only at run-time-chosen
    calls: an ``If``'s results, and calls no call site matches (:class:`BranchCalls`)."""
    from tvm import relax

    if not any(isinstance(b.value, relax.If) for b in _bindings(main)):
        return {}
    skipped = branch_calls(main, functions).skipped
    branch_result = ("it is a result of an If that main passes to no kernel call it makes whichever branch ran, "
                     "and does not return as a tensor: which branch ran is known only at run time, and tvm_probe "
                     "does not follow values through If branches")
    found, results = {}, if_results(main)
    for b in _bindings(main):
        why = None
        if b.var in results:
            why = branch_result
        elif b.var in skipped:
            why = (f"kernel '{skipped[b.var]}' computes it after an If whose branches call that kernel unequally "
                   "often, so which call is this one depends on the branch that ran")
        number = values.of_var.get(b.var) if why else None
        if number is not None:
            found.setdefault(number, why)
    return found


def if_results(main) -> dict:
    """The Vars of ``main`` bound to the result of an ``If`` (its items, when it is a tuple, and
    aliases of either), as keys of a dict in binding order: values the VM computes outside any
    kernel call, in whichever branch ran."""
    from tvm import relax

    results: dict = {}
    for b in _bindings(main):
        value = b.value
        if isinstance(value, relax.If) or (isinstance(value, relax.TupleGetItem) and value.tuple_value in results) \
                or (isinstance(value, relax.Var) and value in results):
            results[b.var] = True
    return results


def _kernel_symbol(call) -> str:
    """The symbol the VM calls for ``call`` (a kernel, the reshape view, or a packed function
    such as ``relax.run.nonzero``), else ''."""
    name = _op_name(call)
    if name in _KERNEL_OPS:
        callee = call.args[0]
        return getattr(callee, "name_hint", None) or str(getattr(callee, "global_symbol", callee))
    if name == "relax.reshape":
        return VIEW_SYMBOL
    return _packed_symbol(call)


def _packed_callee(call):
    """The ExternFunc a packed call calls: ``R.call_pure_packed(f, ...)`` (an op whose first
    argument is ``f``) or ``R.call_packed(f, ...)`` (a call of ``f`` itself); else None."""
    from tvm import relax

    if isinstance(getattr(call, "op", None), relax.ExternFunc):
        return call.op
    if _op_name(call) in PACKED_OPS and call.args and isinstance(call.args[0], relax.ExternFunc):
        return call.args[0]
    return None


def _packed_symbol(call) -> str:
    """The packed function ``call`` calls, unless it is one of the VM's own builtins
    (``vm.builtin.*``: shape and tuple plumbing, which lowering adds more of, so they are
    never counted as call sites)."""
    callee = _packed_callee(call)
    symbol = str(callee.global_symbol) if callee is not None else ""
    return "" if symbol.startswith("vm.builtin.") else symbol


def is_packed(call) -> bool:
    """Whether ``call`` calls a packed function that returns its result (a call site)."""
    return bool(_packed_symbol(call))


# -- call sites ---------------------------------------------------------------------------------
def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _op_name(call) -> str:
    import tvm

    op = getattr(call, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else ""


def _is_tuple(var) -> bool:
    return hasattr(var.ty, "fields")


def _is_tensor(var) -> bool:
    from tvm import relax

    return isinstance(var.ty, relax.TensorType)


#: A dimension known only once the call ran (the output of a data-dependent op such as NonZero).
RUNTIME_DIM = "?"


def _types(ty, packed: bool = False) -> tuple[list[tuple[int | str, ...]], list[str]]:
    """Output shapes (a symbolic dimension as its text, e.g. ``'batch'``) and dtypes of a call.

    A packed function's output may have no shape before it runs (``R.Tensor(ndim=2)``): its
    dimensions are :data:`RUNTIME_DIM` (one, for an unknown rank)."""

    fields = list(ty.fields) if hasattr(ty, "fields") else [ty]
    shapes, dtypes = [], []
    for f in fields:
        values = shape_dims(f)
        if values is None and packed:
            values = [RUNTIME_DIM] * max(int(getattr(f, "ndim", -1)), 1)
        if values is None:
            raise TVMBehaviourChanged(f"kernel output type {f} has no known rank")
        shapes.append(tuple(v if isinstance(v, str) else dim_of(v) for v in values))
        dtypes.append(str(getattr(f, "dtype", "")))
    return shapes, dtypes


class SiteOutput(NamedTuple):
    """Output ``output`` of the kernel call at call site ``site``."""

    site: int
    output: int


class MainCalls(NamedTuple):
    """The kernel calls of a compiled ``main`` (what :func:`call_sites` finds).

    Attributes:
        sites: the call sites, in VM order.
        site_vars: the Var each site is bound to.
        produced: every Var that holds a kernel output (the call's own Var, its tuple elements,
            aliases) → its :class:`SiteOutput`.
    """

    sites: list[CallSite]
    site_vars: list
    produced: dict


def call_sites(main, functions=None) -> MainCalls:
    """The kernel calls of ``main`` in order, the Var each is bound to, and the kernel output
    every Var holds (see :class:`MainCalls`)."""
    import tvm
    from tvm import relax

    params = {p: i for i, p in enumerate(main.params)}
    sites: list[CallSite] = []
    site_vars = []
    produced: dict = {}          # Var → SiteOutput
    items: dict = {}             # Var → (parameter position, element index): an element of a tuple parameter

    def arg_source(expr) -> ArgSource:
        if isinstance(expr, relax.Var):
            if expr in produced:
                node, k = produced[expr]
                return ArgSource(ArgKind.NODE, node=node, output=k)
            if expr in params:
                return ArgSource(ArgKind.INPUT, input_index=params[expr])
            return ArgSource(ArgKind.UNTRACKED, param_item=items.get(expr))
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return ArgSource(ArgKind.CONST, const=expr)
        return ArgSource(ArgKind.UNTRACKED)

    for b, symbol, occurrence in _main_calls(main, BranchCalls(), functions or {}):
        value, var = b.value, b.var
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in produced:
            node, _ = produced[value.tuple_value]
            produced[var] = SiteOutput(node, int(value.index))
            continue
        if isinstance(value, relax.Var) and value in produced:
            produced[var] = produced[value]
            continue
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in params:
            items[var] = (params[value.tuple_value], int(value.index))
            continue
        if not symbol:
            continue  # not a kernel: shape plumbing, tuples, packed builtins, Ifs
        if isinstance(value, relax.If):
            # the call that computes the If's result in whichever branch runs (see _result_call):
            # its arguments differ by branch, so none is tracked
            call = _result_call(value.true_branch)[0]
            args, arg_exprs = [ArgSource(ArgKind.UNTRACKED) for _ in _call_args(call, symbol)], []
        else:
            call = value
            arg_exprs = _call_args(value, symbol)
            args = [arg_source(a) for a in arg_exprs]
        packed = is_packed(call)
        shapes, dtypes = _types(var.ty, packed)
        site = CallSite(index=len(sites), symbol=symbol, occurrence=occurrence,
                        is_view=symbol == VIEW_SYMBOL, args=args,
                        out_shapes=shapes, out_dtypes=dtypes, output_keys=[[] for _ in shapes],
                        call_args=arg_exprs, packed=packed)
        produced[var] = SiteOutput(site.index, 0)
        sites.append(site)
        site_vars.append(var)
    return MainCalls(sites, site_vars, produced)


def _call_args(call, symbol: str) -> list:
    """The Relax arguments the VM passes to the call (a kernel's inputs; a view's tensor; every
    argument of a packed function)."""
    if symbol == VIEW_SYMBOL:
        return [call.args[0]]
    if is_packed(call):
        return list(call.args[1:] if _op_name(call) in PACKED_OPS else call.args)
    return list(call.args[1].fields)


def branch_calls(main, functions=None) -> BranchCalls:
    """The :class:`BranchCalls` of ``main`` (empty without ``If``); ``functions``: the module's
    other functions (:func:`subroutines`), whose calls are counted where ``main`` calls them."""
    found = BranchCalls()
    for _ in _main_calls(main, found, functions or {}):
        pass
    return found


def _main_calls(main, branches: BranchCalls, functions: dict):
    """``(binding, kernel symbol or '', occurrence)`` for every binding of ``main`` that is no
    call inside or after an If which the call-site matching cannot follow; fills ``branches``.

    A call's occurrence counts the calls of its symbol before it, those inside earlier If
    branches included (both branches of each call it equally often: see :class:`BranchCalls`).
    """
    from tvm import relax

    seen: dict[str, int] = {}
    for b in _bindings(main):
        if isinstance(b.value, relax.If) or isinstance(b.value, relax.Call) and _subroutine(b.value, functions):
            # (a function of the module: its calls count as those of a branch both ways run)
            counts, unequal = _if_calls(b.value, functions)
            branches.open_symbols |= unequal
            result = then_result = else_result = None
            if isinstance(b.value, relax.If):
                then_result, else_result = _result_call(b.value.true_branch), _result_call(b.value.false_branch)
            if then_result is not None and then_result[1:] == (else_result or (None,))[1:] \
                    and then_result[1] not in branches.open_symbols:
                result = then_result[1], seen.get(then_result[1], 0) + then_result[2]
            for symbol, n in counts.items():
                if symbol not in branches.open_symbols:
                    start = seen.get(symbol, 0)
                    inside = [o for o in range(start, start + n) if (symbol, o) != result]
                    branches.occurrences.setdefault(symbol, []).extend(inside)
                    seen[symbol] = start + n
            yield (b, *result) if result is not None else (b, "", -1)
            continue
        symbol = _kernel_symbol(b.value) if isinstance(b.value, relax.Call) else ""
        if symbol in branches.open_symbols:
            branches.skipped[b.var] = symbol
            continue
        occurrence = seen.get(symbol, 0)
        if symbol:
            seen[symbol] = occurrence + 1
        yield b, symbol, occurrence


def _result_call(branch) -> tuple | None:
    """``(call, symbol, occurrence in the branch)`` of the kernel call whose output is the result
    of an If ``branch`` (a SeqExpr), or None (a tuple, a value from outside, a nested If first).

    When both branches end with the same kernel at the same occurrence, that occurrence is the
    If's result whichever branch runs: a call site.
    """
    from tvm import relax

    bindings = [b for block in branch.blocks for b in block.bindings]
    result = branch.body
    for b in reversed(bindings):  # follow `r = v` to the binding that computes it
        if b.var.same_as(result) and isinstance(b.value, relax.Var):
            result = b.value
    seen: dict[str, int] = {}
    for b in bindings:
        if isinstance(b.value, relax.If):
            return None  # calls before it may depend on its branches
        symbol = _kernel_symbol(b.value) if isinstance(b.value, relax.Call) else ""
        if b.var.same_as(result):
            return (b.value, symbol, seen.get(symbol, 0)) if symbol and not _is_tuple(b.var) else None
        if symbol:
            seen[symbol] = seen.get(symbol, 0) + 1
    return None


def _if_calls(expr, functions=None) -> tuple[dict[str, int], set[str]]:
    """Kernel calls per symbol that running ``expr`` makes whichever way its Ifs go, and the
    symbols whose number of calls depends on the way they go (``functions``: the module's
    functions the VM calls, counted with the calls they make)."""
    from tvm import relax

    functions = functions or {}
    if isinstance(expr, relax.Call) and _subroutine(expr, functions):
        name = _subroutine(expr, functions)
        calls, unequal = _if_calls(functions[name].body, {k: f for k, f in functions.items() if k != name})
        calls[name] = calls.get(name, 0) + 1
        return calls, unequal
    if isinstance(expr, relax.If):
        then_calls, then_unequal = _if_calls(expr.true_branch, functions)
        else_calls, else_unequal = _if_calls(expr.false_branch, functions)
        unequal = then_unequal | else_unequal | {
            s for s in set(then_calls) | set(else_calls) if then_calls.get(s, 0) != else_calls.get(s, 0)}
        return {s: n for s, n in then_calls.items() if s not in unequal}, unequal
    if isinstance(expr, relax.SeqExpr):
        counts: dict[str, int] = {}
        unequal: set[str] = set()
        parts = [b.value for block in expr.blocks for b in block.bindings] + [expr.body]
        for part in parts:
            calls, part_unequal = _if_calls(part, functions)
            unequal |= part_unequal
            for symbol, n in calls.items():
                counts[symbol] = counts.get(symbol, 0) + n
        return {s: n for s, n in counts.items() if s not in unequal}, unequal
    symbol = _kernel_symbol(expr) if isinstance(expr, relax.Call) else ""
    return ({symbol: 1} if symbol else {}), set()
