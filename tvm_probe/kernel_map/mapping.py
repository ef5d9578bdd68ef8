"""Map stage: where the compiled module holds every source value, per kernel *call site*.

Inputs: the importer's Var tags and the compile stage's snapshots (see :mod:`tvm_probe.build`).

1. **Call sites.**  The ``call_graph`` snapshot's ``main`` lists the kernel calls the VM makes, in
   order: each ``call_tir`` is one kernel call (a node of the dump), each ``R.reshape`` one
   ``vm.builtin.reshape`` (a zero-copy view node).  The VM's calls are matched to these sites by
   ``(symbol, occurrence)``.
2. **Places.**  The module FuseOps produced is value-numbered (:mod:`tvm_probe.valuenum`), every
   grouped function inlined *per call site* with that site's arguments.  So each kernel output,
   and each tensor a fused kernel keeps inside, has a number that says what it computes.
3. **Source values.**  Each tagged Var of the imported module is followed through the snapshots
   (imported → before FoldConstant → before FuseOps → after FuseOps): by Var identity where a
   pass kept the Var, else by its value number.  The number it ends with is looked up among the
   places.

Invariants (checked by ``tests/kernel_map/test_fuzz_kernel_map.py`` on random graphs and by
:meth:`tvm_probe.Probe.verify` on any model):

* a value is placed only where a kernel computes *the same op on the same values* — equal
  computations share one place, whether or not TVM merged them;
* every output of a multi-output kernel is placed (tuple elements have numbers of their own);
* a value that cannot be followed is *lost*, with the step where it was lost; the probe never
  guesses a place for it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from ..core.errors import TVMBehaviourChanged
from ..core.sources import Kind, Served, Serving, Servings
from .valuenum import FunctionValues, ValueNumbering, shape_dims

VIEW_SYMBOL = "vm.builtin.reshape"
_KERNEL_OPS = {"relax.call_tir", "relax.call_dps_packed"}


class ArgKind(str, Enum):
    """Where the value of one kernel argument comes from."""

    NODE = "node"            # an output of an earlier kernel call
    INPUT = "input"          # a model input
    CONST = "const"          # a constant of the module (a weight, a folded value)
    UNTRACKED = "untracked"  # anything else; copied before the call when it is needed


@dataclass(frozen=True)
class ArgSource:
    """One kernel argument: ``kind`` and, by kind, ``node``/``output``, ``input_index`` or ``const``."""

    kind: ArgKind
    node: int = -1
    output: int = 0
    input_index: int = -1
    const: Any = None


class PlaceKind(str, Enum):
    """How the compiled module holds a value."""

    INPUT = "input"        # a model input (or an identity of one)
    OUTPUT = "output"      # an output of a kernel call (or of a reshape view)
    INTERIOR = "interior"  # a tensor a fused kernel computes and keeps inside
    CONSTANT = "constant"  # a constant of the compiled module (folded by the pipeline)
    FOLDED = "folded"      # folded away by FoldConstant; re-evaluated from the module before it
    SHAPE = "shape"        # a symbolic dimension: a size of a model input (``output`` is the axis)


@dataclass(frozen=True)
class Place:
    """Where one value lives at run time.

    Attributes:
        kind: see :class:`PlaceKind`.
        site: the call site (OUTPUT, INTERIOR).
        output: which output of the site (OUTPUT).
        input_index: which model input (INPUT).
        inner: the binding Var inside the site's grouped function (INTERIOR).
        const: the Relax constant (CONSTANT).
        var: the Var of the module before FoldConstant that computes it (FOLDED).
    """

    kind: PlaceKind
    site: int = -1
    output: int = 0
    input_index: int = -1
    inner: Any = None
    const: Any = None
    var: Any = None


@dataclass
class GroupPlan:
    """How to recompute the tensors a fused call site keeps inside.

    Attributes:
        function: the grouped Relax function (post-fusion) this site calls.
        name: its global name (cut modules are cached per name).
        param_args: per function parameter, the position of the site argument that feeds it,
            or ``None`` when it is a constant (then ``param_consts`` has it).
        prim_funcs: GlobalVar → PrimFunc for every kernel the function calls.
        param_symbols: symbolic dimension (TIR Var) in ``param_consts`` → ``(input, axis)``,
            the model input axis whose size it is (a decode step's past length), so a run's
            input shapes give its value.
    """

    function: Any
    name: str
    param_args: list[int | None]
    param_consts: dict[int, Any] = field(default_factory=dict)
    prim_funcs: dict = field(default_factory=dict)
    param_symbols: dict = field(default_factory=dict)


@dataclass
class CallSite:
    """One kernel call of ``main`` (a graph node of the dump)."""

    index: int
    symbol: str
    occurrence: int
    is_view: bool
    args: list[ArgSource]
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[str]
    output_keys: list[list[str]] = field(default_factory=list)
    interior_keys: list[str] = field(default_factory=list)
    group: GroupPlan | None = None
    call_args: list = field(default_factory=list, repr=False)  # the Relax arguments of the call

    @property
    def num_inputs(self) -> int:
        return len(self.args)

    @property
    def num_outputs(self) -> int:
        return len(self.out_shapes)


@dataclass
class KernelMap:
    """Every call site in execution order, and where each source value is.

    Attributes:
        sites: the kernel calls of one run, in order.
        places: source key → :class:`Place`, for every value the compiled module holds.
        lost: source key → why it has no place (for tagged values that could not be followed).
        known_limits: the keys of ``lost`` whose reason is a known limit of tvm_probe (values an
            If decides), not a surprise to report.
        helper_symbols: kernels the VM calls that passes after the call graph added (the shape
            functions of symbolic shapes), and kernels called only inside If branches; they
            compute no source value tvm_probe serves.
        branches: calls inside If branches that match no call site (see :class:`BranchCalls`).
        fixed_helpers: helper symbol → how many times every run calls it, when the final
            ``main`` calls each helper a fixed number of times (no If, e.g. the
            ``compute_symbolic_expr`` lowering makes for a ``T.float64`` argument); empty otherwise.
    """

    sites: list[CallSite]
    places: dict[str, Place] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    known_limits: set[str] = field(default_factory=set)
    helper_symbols: frozenset[str] = frozenset()  # kernels lowering added (shape functions): no source values
    branches: BranchCalls | None = None  # kernel calls inside If branches (None: no If)
    fixed_helpers: dict[str, int] = field(default_factory=dict)

    def site_of(self, key: str) -> int | None:
        """The call site whose output or interior holds ``key`` (None for other places)."""
        place = self.places.get(key)
        return place.site if place is not None and place.kind in (PlaceKind.OUTPUT, PlaceKind.INTERIOR) else None


# ---------------------------------------------------------------------------------------------
def build_kernel_map(imported, snapshots) -> KernelMap:
    """Map each kernel call of the compiled ``main`` to source values (see module docstring)."""
    main = snapshots.call_graph["main"]
    calls = call_sites(main)
    sites, site_vars = calls.sites, calls.site_vars
    vn = ValueNumbering()
    fused = snapshots.post_fusion is not None
    runtime = vn.main(snapshots.post_fusion if fused else snapshots.call_graph, inline=fused)
    numbers, untrusted = _site_numbers(vn, runtime, snapshots, site_vars)
    by_number = _runtime_places(vn, runtime, sites, site_vars, numbers, len(main.params))
    stages = [(name, vn.main(mod)) for name, mod in (("imported", imported.mod), ("before FoldConstant",
              snapshots.pre_fold), ("before FuseOps", snapshots.pre_fusion)) if mod is not None]
    follower = _Follower(stages + [("after FuseOps" if fused else "compiled", runtime)])
    kmap = KernelMap(sites=sites, helper_symbols=helper_symbols(snapshots), branches=branch_calls(main))
    kmap.fixed_helpers = fixed_helper_calls(snapshots, kmap.helper_symbols)
    conditional = _conditional_numbers(main, runtime)
    dims = _input_dims(imported.mod["main"])
    for key, var in _var_of_key(imported).items():
        if var in dims:  # a value that is a symbolic dimension (Shape → Gather of dynamic axes)
            kmap.places[key] = dims[var]
            continue
        trace = follower.follow(var)
        place, why = _locate(trace, by_number, vn.terms, untrusted, snapshots.pre_fold)
        if place is not None:
            kmap.places[key] = place
        else:
            kmap.lost[key] = conditional.get(trace.number, why)
            if trace.number in conditional:
                kmap.known_limits.add(key)
    _name_sites(kmap, imported.sources)
    _plan_groups(kmap, runtime, snapshots.post_fusion, site_vars)
    return kmap


def _site_numbers(vn, runtime, snapshots, site_vars) -> tuple[list, set]:
    """Each call site's value number (None where it cannot be trusted), and the numbers of the
    calls left out because the result does not need them."""
    call_graph = None
    numbers = []
    for var in site_vars:
        if var not in runtime.of_var and call_graph is None:
            call_graph = vn.main(snapshots.call_graph)  # FuseTIR made a new Var: it matches nothing
        numbers.append(runtime.of_var.get(var, call_graph.of_var.get(var) if call_graph else None))
    dead, untrusted = _dead_vars(snapshots.call_graph["main"]), set()
    for i, var in enumerate(site_vars):
        if var in dead:
            # TVM's memory planner ignores what the result does not need: the storage a dead
            # call reads (or a dead view aliases) may be reused before the VM makes the call, so
            # what it shows need not be the value.  Place nothing there.
            untrusted.add(numbers[i])
            numbers[i] = None
    return numbers, untrusted


def _locate(trace, by_number, terms, untrusted, pre_fold) -> tuple[Place | None, str]:
    """Where a followed value is at run time, or why it has no place."""
    place = by_number.get(trace.number) if trace.number is not None else None
    if place is None and trace.number is not None and terms.is_constant(trace.number):
        place = Place(PlaceKind.CONSTANT, const=terms.term(trace.number)[1])
    if place is None and trace.lost_after == "before FoldConstant":
        place = _folded_place(trace.var, pre_fold)
    if place is not None:
        return place, ""
    if trace.number in untrusted:
        return None, ("the compiled module computes it only in a call whose result nothing needs, "
                      "so the memory it reads may already be reused")
    if trace.number is not None:
        return None, "the compiled module computes it outside any kernel call"
    return None, f"it was lost between the module {trace.lost_after} and the one {trace.lost_before}"


def _input_dims(main) -> dict:
    """Symbolic dimension (a TIR Var) → the SHAPE place of the first input axis it sizes."""
    import tvm

    found = {}
    for i, param in enumerate(main.params):
        for axis, dim in enumerate(shape_dims(param.ty) or ()):
            if isinstance(dim, tvm.ir.expr.Var) and dim not in found:
                found[dim] = Place(PlaceKind.SHAPE, input_index=i, output=axis)
    return found


def helper_symbols(snapshots) -> frozenset[str]:
    """Kernels of the final module the call graph does not have: lowering's own (``shape_func``)."""
    conditional = branch_symbols(snapshots.call_graph["main"])
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


def branch_symbols(main) -> frozenset[str]:
    """Kernels that ``main`` calls inside the branches of an ``If`` (nested ones too).

    Which branch runs is known only at run time, so a call inside a branch is no call site: the
    instrument lets the calls of such a kernel pass where no call site has its occurrence (see
    :class:`BranchCalls`), and the values computed inside branches are not served.
    """
    from tvm import relax

    found: set[str] = set()

    def visit(expr, inside: bool) -> None:
        if isinstance(expr, relax.SeqExpr):
            for block in expr.blocks:
                for b in block.bindings:
                    visit(b.value, inside)
            visit(expr.body, inside)
        elif isinstance(expr, relax.If):
            visit(expr.true_branch, True)
            visit(expr.false_branch, True)
        elif inside and isinstance(expr, relax.Call):
            symbol = _kernel_symbol(expr)
            if symbol:
                found.add(symbol)

    visit(main.body, False)
    return frozenset(found)


def _conditional_numbers(main, values: FunctionValues) -> dict[int, str]:
    """Value number → why it has no place, for what ``main`` computes only at run-time-chosen
    calls: an ``If``'s results, and calls no call site matches (:class:`BranchCalls`)."""
    from tvm import relax

    if not any(isinstance(b.value, relax.If) for b in _bindings(main)):
        return {}
    skipped = branch_calls(main).skipped
    branch_result = ("it is a result of an If: which branch ran is known only at run time, and tvm_probe "
                     "does not follow values through If branches")
    found, results = {}, set()
    for b in _bindings(main):
        value, why = b.value, None
        if isinstance(value, relax.If) or (isinstance(value, relax.TupleGetItem) and value.tuple_value in results) \
                or (isinstance(value, relax.Var) and value in results):
            results.add(b.var)
            why = branch_result
        elif b.var in skipped:
            why = (f"kernel '{skipped[b.var]}' computes it after an If whose branches call that kernel unequally "
                   "often, so which call is this one depends on the branch that ran")
        number = values.of_var.get(b.var) if why else None
        if number is not None:
            found.setdefault(number, why)
    return found


def _kernel_symbol(call) -> str:
    """The symbol the VM calls for ``call`` (a kernel or the reshape view), else ''."""
    name = _op_name(call)
    if name in _KERNEL_OPS:
        callee = call.args[0]
        return getattr(callee, "name_hint", None) or str(getattr(callee, "global_symbol", callee))
    return VIEW_SYMBOL if name == "relax.reshape" else ""


def _var_of_key(imported) -> dict:
    """Source key → the (first) Var tagged with it, in source order."""
    var_of = {}
    for var, keys in imported.var_keys.items():
        for key in keys:
            var_of.setdefault(key, var)
    return {v.key: var_of[v.key] for v in imported.sources if v.key in var_of}


@dataclass
class _Trace:
    """Where following one Var ended: its number in the last stage, or the step it was lost at."""

    number: int | None = None
    lost_after: str = ""    # the stage it was last seen in
    lost_before: str = ""   # the stage it was not found in
    var: Any = None         # a Var holding it in ``lost_after`` (None if it was followed by number)


class _Follower:
    """Follows a Var of the imported module to its value number in the last stage.

    At each pass boundary: the same Var if the pass kept it; else the same number if the next
    stage computes it; else a Var with the same number that the pass kept; else it is lost.
    """

    def __init__(self, stages: list[tuple[str, FunctionValues]]):
        self.stages = stages
        self.present = []   # per stage: every number it computes
        self.holders = []   # per stage: number → Vars bound to it
        for _, values in stages:
            present = set(values.of_var.values())
            for call in values.inlined.values():
                present.update(call.inner.values())
            holders: dict[int, list] = {}
            for var, number in values.of_var.items():
                holders.setdefault(number, []).append(var)
            self.present.append(present)
            self.holders.append(holders)

    def follow(self, var) -> _Trace:
        start = next((i for i, (_, v) in enumerate(self.stages) if var in v.of_var), None)
        if start is None:
            return _Trace(lost_after="imported (it is not a Relax value of it)", lost_before="compiled")
        number = self.stages[start][1].of_var[var]
        for i in range(start, len(self.stages) - 1):
            there = self.stages[i + 1][1]
            if var is not None and var in there.of_var:       # the pass kept the Var
                number = there.of_var[var]
                continue
            if number in self.present[i + 1]:                 # the next stage computes the same
                var = None
                continue
            holders = self.holders[i].get(number, ())
            kept = next((w for w in holders if w in there.of_var), None)
            if kept is None:
                return _Trace(lost_after=self.stages[i][0], lost_before=self.stages[i + 1][0],
                              var=var if var is not None else next(iter(holders), None))
            var, number = kept, there.of_var[kept]
        return _Trace(number=number)


def _folded_place(var, pre_fold) -> Place | None:
    """A FOLDED place when FoldConstant removed ``var`` because it needs no model input."""
    from .relax_analysis import depends_on_params

    if var is None or pre_fold is None or depends_on_params(pre_fold["main"], var):
        return None
    return Place(PlaceKind.FOLDED, var=var)


def _dead_vars(main) -> set:
    """Vars bound in ``main`` that the result does not need, directly or through other bindings."""
    from tvm import relax

    live = set(relax.analysis.free_vars(main.body.body))
    dead = set()
    for b in reversed(list(_bindings(main))):
        if b.var in live:
            live.update(relax.analysis.free_vars(b.value))
        else:
            dead.add(b.var)
    return dead


def _runtime_places(vn, runtime, sites, site_vars, numbers, num_params) -> dict[int, Place]:
    """Value number → where it is at run time; outputs first, so a kernel output wins."""
    places: dict[int, Place] = {}
    for i in range(num_params):
        places.setdefault(vn.terms.param(i), Place(PlaceKind.INPUT, input_index=i))
    for site, number in zip(sites, numbers):
        if number is None:
            continue
        if _is_tuple(site_vars[site.index]):
            for k in range(site.num_outputs):
                places.setdefault(vn.terms.tuple_item(number, k), Place(PlaceKind.OUTPUT, site=site.index, output=k))
        else:
            places.setdefault(number, Place(PlaceKind.OUTPUT, site=site.index))
    for site, var, number in zip(sites, site_vars, numbers):
        call = runtime.inlined.get(var) if number is not None else None
        for inner, number in (call.inner.items() if call is not None else ()):
            if _is_tensor(inner):
                places.setdefault(number, Place(PlaceKind.INTERIOR, site=site.index, inner=inner))
    return places


def _name_sites(kmap: KernelMap, sources) -> None:
    """Fill each site's ``output_keys`` / ``interior_keys`` in source order."""
    for value in sources:
        place = kmap.places.get(value.key)
        if place is None:
            continue
        if place.kind is PlaceKind.OUTPUT:
            kmap.sites[place.site].output_keys[place.output].append(value.key)
        elif place.kind is PlaceKind.INTERIOR:
            kmap.sites[place.site].interior_keys.append(value.key)


def _plan_groups(kmap: KernelMap, runtime: FunctionValues, post_fusion, site_vars) -> None:
    """A recompute plan for every site that holds a source value inside."""
    input_dims = _input_dims(post_fusion["main"]) if post_fusion is not None else {}
    for site in kmap.sites:
        if not site.interior_keys:
            continue
        var = site_vars[site.index]
        call = runtime.inlined[var].call
        func = post_fusion[call.op]
        site.group = _plan_group(func, call.op.name_hint, list(call.args), site.call_args,
                                 _callees(post_fusion, func), input_dims)


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


def _types(ty) -> tuple[list[tuple[int | str, ...]], list[str]]:
    """Output shapes (a symbolic dimension as its text, e.g. ``'batch'``) and dtypes of a call."""
    from ..importer.relax_values import dim_of

    fields = list(ty.fields) if hasattr(ty, "fields") else [ty]
    shapes, dtypes = [], []
    for f in fields:
        values = shape_dims(f)
        if values is None:
            raise TVMBehaviourChanged(f"kernel output type {f} has no known rank")
        shapes.append(tuple(dim_of(v) for v in values))
        dtypes.append(str(f.dtype))
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


def call_sites(main) -> MainCalls:
    """The kernel calls of ``main`` in order, the Var each is bound to, and the kernel output
    every Var holds (see :class:`MainCalls`)."""
    import tvm
    from tvm import relax

    params = {p: i for i, p in enumerate(main.params)}
    sites: list[CallSite] = []
    site_vars = []
    produced: dict = {}          # Var → SiteOutput

    def arg_source(expr) -> ArgSource:
        if isinstance(expr, relax.Var):
            if expr in produced:
                node, k = produced[expr]
                return ArgSource(ArgKind.NODE, node=node, output=k)
            if expr in params:
                return ArgSource(ArgKind.INPUT, input_index=params[expr])
            return ArgSource(ArgKind.UNTRACKED)
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return ArgSource(ArgKind.CONST, const=expr)
        return ArgSource(ArgKind.UNTRACKED)

    for b, symbol, occurrence in _main_calls(main, BranchCalls()):
        value, var = b.value, b.var
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in produced:
            node, _ = produced[value.tuple_value]
            produced[var] = SiteOutput(node, int(value.index))
            continue
        if isinstance(value, relax.Var) and value in produced:
            produced[var] = produced[value]
            continue
        if not symbol:
            continue  # not a kernel: shape plumbing, tuples, packed builtins, Ifs
        if isinstance(value, relax.If):
            # the call that computes the If's result in whichever branch runs (see _result_call):
            # its arguments differ by branch, so none is tracked
            call = _result_call(value.true_branch)[0]
            arg_exprs = [call.args[0]] if symbol == VIEW_SYMBOL else list(call.args[1].fields)
            args, arg_exprs = [ArgSource(ArgKind.UNTRACKED) for _ in arg_exprs], []
        else:
            arg_exprs = [value.args[0]] if symbol == VIEW_SYMBOL else list(value.args[1].fields)
            args = [arg_source(a) for a in arg_exprs]
        shapes, dtypes = _types(var.ty)
        site = CallSite(index=len(sites), symbol=symbol, occurrence=occurrence,
                        is_view=symbol == VIEW_SYMBOL, args=args,
                        out_shapes=shapes, out_dtypes=dtypes, output_keys=[[] for _ in shapes],
                        call_args=arg_exprs)
        produced[var] = SiteOutput(site.index, 0)
        sites.append(site)
        site_vars.append(var)
    return MainCalls(sites, site_vars, produced)


@dataclass
class BranchCalls:
    """The kernel calls ``main`` makes inside ``If`` branches, for matching calls to call sites.

    Attributes:
        occurrences: symbol → the occurrences of its calls that run inside an If branch, where
            both branches call it equally often (so every later call keeps its occurrence).
            They match no call site: a branch call belongs to whichever branch ran.
        open_symbols: kernels an If's branches call unequally often: which of their calls comes
            after the If depends on the branch, so calls of them after the first such If match
            no call site (the instrument ignores them; what they compute is unknown, with why).
        skipped: Vars of ``main`` bound to such calls, by symbol.
    """

    occurrences: dict[str, list[int]] = field(default_factory=dict)
    open_symbols: set[str] = field(default_factory=set)
    skipped: dict = field(default_factory=dict)


def branch_calls(main) -> BranchCalls:
    """The :class:`BranchCalls` of ``main`` (empty without ``If``)."""
    found = BranchCalls()
    for _ in _main_calls(main, found):
        pass
    return found


def _main_calls(main, branches: BranchCalls):
    """``(binding, kernel symbol or '', occurrence)`` for every binding of ``main`` that is no
    call inside or after an If which the call-site matching cannot follow; fills ``branches``.

    A call's occurrence counts the calls of its symbol before it, those inside earlier If
    branches included (both branches of each call it equally often: see :class:`BranchCalls`).
    """
    from tvm import relax

    seen: dict[str, int] = {}
    for b in _bindings(main):
        if isinstance(b.value, relax.If):
            counts, unequal = _if_calls(b.value)
            branches.open_symbols |= unequal
            then_result, else_result = _result_call(b.value.true_branch), _result_call(b.value.false_branch)
            result = None
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


def _if_calls(expr) -> tuple[dict[str, int], set[str]]:
    """Kernel calls per symbol that running ``expr`` makes whichever way its Ifs go, and the
    symbols whose number of calls depends on the way they go."""
    from tvm import relax

    if isinstance(expr, relax.If):
        then_calls, then_unequal = _if_calls(expr.true_branch)
        else_calls, else_unequal = _if_calls(expr.false_branch)
        unequal = then_unequal | else_unequal | {
            s for s in set(then_calls) | set(else_calls) if then_calls.get(s, 0) != else_calls.get(s, 0)}
        return {s: n for s, n in then_calls.items() if s not in unequal}, unequal
    if isinstance(expr, relax.SeqExpr):
        counts: dict[str, int] = {}
        unequal: set[str] = set()
        parts = [b.value for block in expr.blocks for b in block.bindings] + [expr.body]
        for part in parts:
            calls, part_unequal = _if_calls(part)
            unequal |= part_unequal
            for symbol, n in calls.items():
                counts[symbol] = counts.get(symbol, 0) + n
        return {s: n for s, n in counts.items() if s not in unequal}, unequal
    symbol = _kernel_symbol(expr) if isinstance(expr, relax.Call) else ""
    return ({symbol: 1} if symbol else {}), set()


def _callees(mod, func) -> dict:
    from tvm import relax

    found = {}
    for b in _bindings(func):
        if isinstance(b.value, relax.Call) and _op_name(b.value) in _KERNEL_OPS:
            gvar = b.value.args[0]
            if isinstance(gvar, relax.GlobalVar):
                found[gvar] = mod[gvar]
    return found


def _plan_group(func, name, group_args, site_args, prim_funcs, input_dims) -> GroupPlan:
    """Which site argument feeds each grouped-function parameter (FuseTIR may drop some), and
    which input axis sizes each symbol of the others (``input_dims``: :func:`_input_dims`)."""
    from tvm import relax

    param_args, consts, symbols = [], {}, {}
    for i, arg in enumerate(group_args):
        j = next((k for k, a in enumerate(site_args) if a.same_as(arg)), None)
        if j is None and not isinstance(arg, relax.Var):
            consts[i] = arg
            for var in _symbols_in(getattr(arg, "values", None) or ()):
                if var in input_dims:
                    symbols[var] = (input_dims[var].input_index, input_dims[var].output)
        param_args.append(j)
    return GroupPlan(function=func, name=name, param_args=param_args, param_consts=consts,
                     prim_funcs=prim_funcs, param_symbols=symbols)


def _symbols_in(dims) -> list:
    """The TIR Vars in shape dimensions (``past``, ``past + 1``)."""
    import tvm

    found, stack = [], list(dims)
    while stack:
        dim = stack.pop()
        if isinstance(dim, tvm.ir.expr.Var):
            found.append(dim)
        elif isinstance(dim, (tvm.ir.prim.expr.BinaryOpExpr, tvm.ir.prim.expr.CmpExpr)):
            stack += [dim.a, dim.b]
    return found


# -- how each source value is served ------------------------------------------------------------
def classify(sources, kmap: KernelMap, num_inputs: int) -> Servings:
    """How this build serves every source value, from where ``kmap`` placed it.

    The table is the build's own (the :class:`~tvm_probe.sources.SourceMap` is not touched), so
    one imported model can be compiled and served by several probes.  "Dead code" (UNAVAILABLE)
    is said only of values no model output depends on in the source graph; a live value without
    a place is UNKNOWN (and ``kmap.lost`` says why).
    """
    live = sources.live_keys()
    input_index = {key: i for i, key in enumerate(sources.model_inputs)}
    servings = {}
    for value in sources:
        servings[value.key] = serving = _serving(value, kmap.places.get(value.key), kmap, live, input_index, num_inputs)
        if serving.served is Served.UNKNOWN and value.key not in kmap.lost:
            kmap.lost[value.key] = "TVM's importer produced no run-time value for it"
    return servings


def _serving(value, place, kmap: KernelMap, live: set, input_index: dict, num_inputs: int) -> Serving:
    """How one source value is served (see :func:`classify`)."""
    if value.kind is Kind.INPUT:
        return Serving(Served.INPUT, input_index[value.key])
    if value.kind in (Kind.PARAM, Kind.CONSTANT):
        return Serving(Served.CONSTANT)
    if place is None:
        return Serving(Served.UNKNOWN if value.key in live else Served.UNAVAILABLE)
    if place.kind is PlaceKind.INPUT:
        return Serving(Served.INPUT, place.input_index)
    if place.kind is PlaceKind.SHAPE:
        return Serving(Served.SHAPE, place.input_index)
    if place.kind is PlaceKind.OUTPUT:
        return Serving(Served.VIEW if kmap.sites[place.site].is_view else Served.CAPTURED, num_inputs + place.site)
    if place.kind is PlaceKind.INTERIOR:
        return Serving(Served.RECOMPUTED, num_inputs + place.site)
    return Serving(Served.FOLDED)
