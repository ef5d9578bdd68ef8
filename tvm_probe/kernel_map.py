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

Invariants (checked by ``tests/test_fuzz_kernel_map.py`` on random graphs and by
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
from typing import Any

from .errors import TVMBehaviourChanged
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
    """

    function: Any
    name: str
    param_args: list[int | None]
    param_consts: dict[int, Any] = field(default_factory=dict)
    prim_funcs: dict = field(default_factory=dict)


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
        helper_symbols: kernels the VM calls that passes after the call graph added (the shape
            functions of symbolic shapes); they compute no source value.
    """

    sites: list[CallSite]
    places: dict[str, Place] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    helper_symbols: frozenset[str] = frozenset()  # kernels lowering added (shape functions): no source values

    def site_of(self, key: str) -> int | None:
        """The call site whose output or interior holds ``key`` (None for other places)."""
        place = self.places.get(key)
        return place.site if place is not None and place.kind in (PlaceKind.OUTPUT, PlaceKind.INTERIOR) else None


# ---------------------------------------------------------------------------------------------
def build_kernel_map(imported, snapshots) -> KernelMap:
    """Map each kernel call of the compiled ``main`` to source values (see module docstring)."""
    main = snapshots.call_graph["main"]
    sites, site_vars, _ = call_sites(main)
    vn = ValueNumbering()
    fused = snapshots.post_fusion is not None
    runtime = vn.main(snapshots.post_fusion if fused else snapshots.call_graph, inline=fused)
    numbers, untrusted = _site_numbers(vn, runtime, snapshots, site_vars)
    by_number = _runtime_places(vn, runtime, sites, site_vars, numbers, len(main.params))
    stages = [(name, vn.main(mod)) for name, mod in (("imported", imported.mod), ("before FoldConstant",
              snapshots.pre_fold), ("before FuseOps", snapshots.pre_fusion)) if mod is not None]
    follower = _Follower(stages + [("after FuseOps" if fused else "compiled", runtime)])
    kmap = KernelMap(sites=sites, helper_symbols=helper_symbols(snapshots))
    dims = _input_dims(imported.mod["main"])
    for key, var in _var_of_key(imported).items():
        if var in dims:  # a value that is a symbolic dimension (Shape → Gather of dynamic axes)
            kmap.places[key] = dims[var]
            continue
        place, why = _locate(follower.follow(var), by_number, vn.terms, untrusted, snapshots.pre_fold)
        if place is not None:
            kmap.places[key] = place
        else:
            kmap.lost[key] = why
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
    final = getattr(snapshots, "final", None)
    if final is None:
        return frozenset()
    known = {gv.name_hint for gv in snapshots.call_graph.functions}
    return frozenset(gv.name_hint for gv, f in final.functions.items()
                     if gv.name_hint not in known and type(f).__name__ == "PrimFunc")


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
    from .recompute import depends_on_params

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
    for site in kmap.sites:
        if not site.interior_keys:
            continue
        var = site_vars[site.index]
        call = runtime.inlined[var].call
        func = post_fusion[call.op]
        site.group = _plan_group(func, call.op.name_hint, list(call.args), site.call_args,
                                 _callees(post_fusion, func))


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
    from .importer.onnx import dim_of

    fields = list(ty.fields) if hasattr(ty, "fields") else [ty]
    shapes, dtypes = [], []
    for f in fields:
        values = shape_dims(f)
        if values is None:
            raise TVMBehaviourChanged(f"kernel output type {f} has no known rank")
        shapes.append(tuple(dim_of(v) for v in values))
        dtypes.append(str(f.dtype))
    return shapes, dtypes


def call_sites(main) -> tuple[list[CallSite], list, dict]:
    """The kernel calls of ``main`` in order, the Var each is bound to, and every Var that holds a
    kernel output (the call's own Var, its tuple elements, aliases) → ``(site, output k)``."""
    import tvm
    from tvm import relax

    params = {p: i for i, p in enumerate(main.params)}
    sites: list[CallSite] = []
    site_vars = []
    produced: dict = {}          # Var → (site index, output k)
    seen: dict[str, int] = {}

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

    for b in _bindings(main):
        value, var = b.value, b.var
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in produced:
            node, _ = produced[value.tuple_value]
            produced[var] = (node, int(value.index))
            continue
        if isinstance(value, relax.Var) and value in produced:
            produced[var] = produced[value]
            continue
        name = _op_name(value) if isinstance(value, relax.Call) else ""
        if name in _KERNEL_OPS:
            callee = value.args[0]
            symbol = getattr(callee, "name_hint", None) or str(getattr(callee, "global_symbol", callee))
            arg_exprs = list(value.args[1].fields)
        elif name == "relax.reshape":
            symbol, arg_exprs = VIEW_SYMBOL, [value.args[0]]
        else:
            continue  # not a kernel: shape plumbing, tuples, packed builtins
        shapes, dtypes = _types(var.ty)
        site = CallSite(index=len(sites), symbol=symbol, occurrence=seen.get(symbol, 0),
                        is_view=symbol == VIEW_SYMBOL, args=[arg_source(a) for a in arg_exprs],
                        out_shapes=shapes, out_dtypes=dtypes, output_keys=[[] for _ in shapes],
                        call_args=arg_exprs)
        seen[symbol] = site.occurrence + 1
        produced[var] = (site.index, 0)
        sites.append(site)
        site_vars.append(var)
    return sites, site_vars, produced


def _callees(mod, func) -> dict:
    from tvm import relax

    found = {}
    for b in _bindings(func):
        if isinstance(b.value, relax.Call) and _op_name(b.value) in _KERNEL_OPS:
            gvar = b.value.args[0]
            if isinstance(gvar, relax.GlobalVar):
                found[gvar] = mod[gvar]
    return found


def _plan_group(func, name, group_args, site_args, prim_funcs) -> GroupPlan:
    """Which site argument feeds each grouped-function parameter (FuseTIR may drop some)."""
    from tvm import relax

    param_args, consts = [], {}
    for i, arg in enumerate(group_args):
        j = next((k for k, a in enumerate(site_args) if a.same_as(arg)), None)
        if j is None and not isinstance(arg, relax.Var):
            consts[i] = arg
        param_args.append(j)
    return GroupPlan(function=func, name=name, param_args=param_args, param_consts=consts,
                     prim_funcs=prim_funcs)


# -- how each source value is served ------------------------------------------------------------
def classify(sources, kmap: KernelMap, num_inputs: int) -> None:
    """Set ``served`` and ``node_index`` of every source value from where ``kmap`` placed it.

    "Dead code" (UNAVAILABLE) is said only of values no model output depends on in the source
    graph; a live value without a place is UNKNOWN (and ``kmap.lost`` says why).
    """
    from .sources import Kind, Served

    live = sources.live_keys()
    input_index = {key: i for i, key in enumerate(sources.model_inputs)}
    for value in sources:
        place = kmap.places.get(value.key)
        value.node_index = -1
        if value.kind is Kind.INPUT:
            value.served, value.node_index = Served.INPUT, input_index[value.key]
        elif value.kind in (Kind.PARAM, Kind.CONSTANT):
            value.served = Served.CONSTANT
        elif place is None:
            value.served = Served.UNKNOWN if value.key in live else Served.UNAVAILABLE
            if value.served is Served.UNKNOWN and value.key not in kmap.lost:
                kmap.lost[value.key] = "TVM's importer produced no run-time value for it"
        elif place.kind is PlaceKind.INPUT:
            value.served, value.node_index = Served.INPUT, place.input_index
        elif place.kind is PlaceKind.SHAPE:
            value.served, value.node_index = Served.SHAPE, place.input_index
        elif place.kind is PlaceKind.OUTPUT:
            is_view = kmap.sites[place.site].is_view
            value.served, value.node_index = (Served.VIEW if is_view else Served.CAPTURED), num_inputs + place.site
        elif place.kind is PlaceKind.INTERIOR:
            value.served, value.node_index = Served.RECOMPUTED, num_inputs + place.site
        else:
            value.served = Served.FOLDED
