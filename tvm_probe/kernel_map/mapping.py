"""Map stage: where the compiled module holds every source value, per kernel *call site*.

Inputs: the importer's Var tags and the compile stage's snapshots (see :mod:`tvm_probe.build`).

1. **Call sites.**  The ``call_graph`` snapshot's ``main`` lists the kernel calls the VM makes, in
   order: each ``call_tir`` is one kernel call (a node of the dump), each ``R.reshape`` one
   ``vm.builtin.reshape`` (a zero-copy view node).  The VM's calls are matched to these sites by
   ``(symbol, occurrence)``.
2. **Places.**  The module FuseOps produced is value-numbered (:mod:`tvm_probe.kernel_map.valuenum`), every
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

from dataclasses import dataclass
from typing import Any

from ..core.sources import Kind, Served, Serving, Servings
from .relax_analysis import depends_on_params
from .shape_values import same_sizes, shape_formulas
from .sites import (
    _bindings,
    _conditional_numbers,
    _is_tensor,
    _is_tuple,
    _op_name,
    branch_calls,
    call_sites,
    fixed_helper_calls,
    helper_symbols,
    if_results,
    subroutines,
)
from .types import _KERNEL_OPS, ArgKind, GroupPlan, KernelMap, Place, PlaceKind
from .valuenum import FunctionValues, ValueNumbering, shape_dims


# ---------------------------------------------------------------------------------------------
def build_kernel_map(imported, snapshots) -> KernelMap:
    """Map each kernel call of the compiled ``main`` to source values (see module docstring)."""
    main = snapshots.call_graph["main"]
    functions = subroutines(snapshots.call_graph)
    calls = call_sites(main, functions)
    sites, site_vars = calls.sites, calls.site_vars
    vn = ValueNumbering()
    fused = snapshots.post_fusion is not None
    runtime = vn.main(snapshots.post_fusion if fused else snapshots.call_graph, inline=fused)
    numbers, untrusted = _site_numbers(vn, runtime, snapshots, site_vars)
    by_number = _runtime_places(vn, runtime, sites, site_vars, numbers, len(main.params))
    for number, place in _passed_places(runtime, sites, if_results(main)).items():
        by_number.setdefault(number, place)  # (a kernel output wins: an If that ends in a call site)
    stages = [(name, vn.main(mod)) for name, mod in (("imported", imported.mod), ("before FoldConstant",
              snapshots.pre_fold), ("before FuseOps", snapshots.pre_fusion)) if mod is not None]
    follower = _Follower(stages + [("after FuseOps" if fused else "compiled", runtime)],
                         set(_input_dims(imported.mod["main"])))
    kmap = KernelMap(sites=sites, helper_symbols=helper_symbols(snapshots), branches=branch_calls(main, functions))
    kmap.fixed_helpers = fixed_helper_calls(snapshots, kmap.helper_symbols)
    conditional = _conditional_numbers(main, runtime, functions)
    dims = _input_dims(imported.mod["main"])
    overwritten = imported.overwritten
    shape_values = _shape_values(imported.mod["main"], dims)
    returned = {key: k for k, key in enumerate(imported.sources.model_outputs)}
    for key, var in _var_of_key(imported).items():
        if var in dims:  # a value that is a symbolic dimension (Shape → Gather of dynamic axes)
            kmap.places[key] = dims[var]
            continue
        if var in shape_values:  # a shape or scalar value (ONNX Shape): built from input sizes
            kmap.places[key] = shape_values[var]
            continue
        trace = follower.follow(var)
        if key in imported.sources.sequences:  # its elements are the values placed
            _place_elements(kmap, imported.sources.sequences[key], trace, by_number, vn.terms, untrusted)
            continue
        place, why = _locate(trace, by_number, vn.terms, untrusted, snapshots.pre_fold)
        if place is not None:
            kmap.places[key] = place
        elif trace.number in conditional and key in returned and _is_tensor(var):  # the VM returns it
            kmap.places[key] = Place(PlaceKind.RETURNED, output=returned[key])
        elif trace.number in conditional and key in returned:
            kmap.lost[key] = ("it is a sequence (a tuple of tensors) an If returns: tvm_probe serves an If's "
                              "result as the model returns it only when it is one tensor")
            kmap.known_limits.add(key)
        else:
            kmap.lost[key] = conditional.get(trace.number, why)
            if trace.number in conditional:
                kmap.known_limits.add(key)
            elif key in overwritten:  # only an in-place op's destination read it (y of y.copy_(w))
                kmap.lost[key] = f"{overwritten[key]}: {why}"
                kmap.known_limits.add(key)
    for key, expr in getattr(imported, "shape_values", {}).items():
        _place_shape_value(kmap, key, expr, dims, imported.sources)
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


def _place_elements(kmap: KernelMap, elements: list[str], trace, by_number, terms, untrusted) -> None:
    """Each element of a followed sequence (a tuple value) where the compiled module holds it:
    element ``k`` has the number of item ``k`` of the tuple (a kernel's output ``k``, or the
    value a tuple literal holds there)."""
    for k, key in enumerate(elements):
        if trace.number is None:
            kmap.lost[key] = (f"it is element {k} of a sequence that was lost between the module "
                              f"{trace.lost_after} and the one {trace.lost_before}")
            continue
        item = _Trace(number=terms.tuple_item(trace.number, k))
        place, why = _locate(item, by_number, terms, untrusted, None)
        if place is not None:
            kmap.places[key] = place
        else:
            kmap.lost[key] = f"it is element {k} of a sequence, and {why}"


def _shape_values(main, dims: dict) -> dict:
    """Var → DIMS place, for each binding of ``main`` to a shape or scalar value that the input
    sizes (``dims``: :func:`_input_dims`) give."""
    input_dims = {var: (place.input_index, place.output) for var, place in dims.items()}
    found = {}
    for b in _bindings(main):
        formulas = shape_formulas(b.value, input_dims)
        if formulas is not None:
            found[b.var] = Place(PlaceKind.DIMS, inner=formulas[0], output=int(formulas[1]))
    return found


def _place_shape_value(kmap: KernelMap, key: str, expr, dims: dict, sources) -> None:
    """A shape value the import left as an expression (no Var): placed when input sizes give it,
    else lost with the importer's note."""
    input_dims = {var: (place.input_index, place.output) for var, place in dims.items()}
    formulas = shape_formulas(expr, input_dims)
    if formulas is not None:
        kmap.places[key] = Place(PlaceKind.DIMS, inner=formulas[0], output=int(formulas[1]))
    else:
        kmap.lost[key] = (sources.notes.get(key)
                          or "TVM computes it as a shape expression that is not made of input sizes")
        kmap.known_limits.add(key)


def _input_dims(main) -> dict:
    """Symbolic dimension (a TIR Var) → the SHAPE place of the first input axis it sizes."""
    import tvm

    found = {}
    for i, param in enumerate(main.params):
        for axis, dim in enumerate(shape_dims(param.ty) or ()):
            if isinstance(dim, tvm.ir.expr.Var) and dim not in found:
                found[dim] = Place(PlaceKind.SHAPE, input_index=i, output=axis)
    return found


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

    def __init__(self, stages: list[tuple[str, FunctionValues]], input_symbols=frozenset()):
        self.stages = stages
        self.input_symbols = input_symbols  # the symbolic dims the model inputs define
        self.present = []   # per stage: every number it computes
        self.holders = []   # per stage: number → Vars bound to it
        self.names = []     # per stage: Var name → how many Vars have it
        self.named = []     # per stage: Var name → a Var of that name
        for _, values in stages:
            present = set(values.of_var.values())
            for call in values.inlined.values():
                present.update(call.inner.values())
            holders: dict[int, list] = {}
            for var, number in values.of_var.items():
                holders.setdefault(number, []).append(var)
            self.present.append(present)
            self.holders.append(holders)
            names: dict[str, int] = {}
            for var in values.of_var:
                names[var.name] = names.get(var.name, 0) + 1
            self.names.append(names)
            self.named.append({var.name: var for var in values.of_var})

    def _rebound(self, var, stage: int):
        """The Var of ``stage`` that re-binds ``var`` after a pass gave it a new type: the only
        Var of that name there, of the same kind, dtype and sizes (written differently, e.g.
        ``(n + 2) // 3`` and ``(n + 3 - 1) // 3``: TVM's normalizer re-creates a binding's Var,
        keeping its name, when the pass derived a type that is not structurally equal).  With
        static shapes passes keep the Var itself; this is for symbolic ones."""
        if self.names[stage - 1].get(var.name) != 1 or self.names[stage].get(var.name) != 1:
            return None
        other = self.named[stage][var.name]
        sizes = _sizes_of_run(other, self.stages[stage][1].bound.get(other))
        return other if _same_type(var.ty, other.ty, self.input_symbols, sizes) else None

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
            if kept is None and var is not None:
                kept = self._rebound(var, i + 1)
            if kept is None:
                return _Trace(lost_after=self.stages[i][0], lost_before=self.stages[i + 1][0],
                              var=var if var is not None else next(iter(holders), None))
            var, number = kept, there.of_var[kept]
        return _Trace(number=number)


def _sizes_of_run(var, value) -> list:
    """The sizes a run that computes ``var`` (bound to ``value``) gives tensors: those of its own
    type and of the Vars its value reads (``lv1 = lv[0]`` exists only where the call ``lv`` ran):
    none of them is below zero in any run."""
    from tvm import relax

    types = [var.ty] + ([v.ty for v in relax.analysis.free_vars(value)] if value is not None else [])
    return [d for ty in types for d in _all_dims(ty)]


def _all_dims(ty) -> list:
    """Every size of a Relax type (tuple fields in turn)."""
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return [d for f in fields for d in _all_dims(f)]
    return list(shape_dims(ty) or ())


def _same_type(a, b, input_symbols, sizes_of_run=()) -> bool:
    """Equal Relax types, tuple fields in turn, sizes compared by value (:func:`same_sizes`, at
    the sizes where ``sizes_of_run`` say ``b`` can be computed); a size of ``b`` known only at
    run time (a symbol the model inputs do not define: what a data-dependent op such as
    NonMaxSuppression produced, matched after it) equals any size."""
    fields_a, fields_b = getattr(a, "fields", None), getattr(b, "fields", None)
    if fields_a is not None or fields_b is not None:
        return (fields_a is not None and fields_b is not None and len(fields_a) == len(fields_b)
                and all(_same_type(x, y, input_symbols, sizes_of_run) for x, y in zip(fields_a, fields_b)))
    dims_a, dims_b = shape_dims(a), shape_dims(b)
    if dims_a is None and dims_b is not None and type(a) is type(b) and str(getattr(a, "dtype", "")) == str(
            getattr(b, "dtype", "")) and getattr(a, "ndim", -1) == len(dims_b):
        # sizes the import left unknown (``R.Tensor(ndim=3)``: a Slice with run-time bounds) that
        # legalization names with symbols of their own, all known only at run time
        return all(_runtime_size(d, input_symbols) for d in dims_b)
    if type(a) is not type(b) or str(getattr(a, "dtype", "")) != str(getattr(b, "dtype", "")) \
            or dims_a is None or dims_b is None or len(dims_a) != len(dims_b):
        return False
    fixed = [(x, y) for x, y in zip(dims_a, dims_b) if not _runtime_size(y, input_symbols)]
    return same_sizes([x for x, _ in fixed], [y for _, y in fixed], sizes_of_run)


def _runtime_size(dim, input_symbols) -> bool:
    """A dimension that is a symbol no model input defines: its size is known only at run time."""
    import tvm

    return isinstance(dim, tvm.ir.expr.Var) and dim not in input_symbols


def _folded_place(var, pre_fold) -> Place | None:
    """A FOLDED place when FoldConstant removed ``var`` because it needs no model input."""

    if var is None or pre_fold is None or depends_on_params(pre_fold["main"], var):
        return None
    return Place(PlaceKind.FOLDED, var=var)


def _dead_vars(main) -> set:
    """Vars bound in ``main`` that the result does not need, directly or through other bindings."""
    from tvm import relax

    live = set(relax.analysis.free_vars(main.body.body))
    dead = set()
    for b in reversed(list(_bindings(main))):
        if b.var in live or _is_impure(b.value):  # (an assert runs whether or not its result is used)
            live.update(relax.analysis.free_vars(b.value))
        else:
            dead.add(b.var)
    return dead


def _is_impure(value) -> bool:
    """Whether ``value`` is a call the VM makes for its effect (``R.call_packed``: an assert)."""
    from tvm import relax

    return isinstance(value, relax.Call) and isinstance(value.op, relax.ExternFunc)


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


def _passed_places(runtime, sites, results: dict) -> dict[int, Place]:
    """Value number → ARGUMENT place, for each If result (``results``: Vars of the compiled
    ``main``) that a call site takes as an input: the VM hands the branch's value to that call,
    which the instruments copy before it runs (an untracked input)."""
    places: dict[int, Place] = {}
    for site in sites:
        for j, expr in enumerate(site.call_args):
            if j < len(site.args) and site.args[j].kind is ArgKind.UNTRACKED and expr in results \
                    and _is_tensor(expr) and runtime.of_var.get(expr) is not None:
                places.setdefault(runtime.of_var[expr], Place(PlaceKind.ARGUMENT, site=site.index, output=j))
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
    bound = _bindings_of(post_fusion["main"]) if post_fusion is not None else {}
    for site in kmap.sites:
        if not site.interior_keys:
            continue
        var = site_vars[site.index]
        call = runtime.inlined[var].call
        func = post_fusion[call.op]
        args = [_constant_behind(a, bound) for a in call.args]
        site.group = _plan_group(func, call.op.name_hint, args, site.call_args,
                                 _callees(post_fusion, func), input_dims)


def _bindings_of(func) -> dict:
    """Var → the expression it is bound to, in ``func`` (Relax's own table)."""
    from tvm import relax

    return dict(relax.analysis.get_var2val(func))


def _constant_behind(arg, bound: dict):
    """The Constant a Var stands for when its binding is one (``a = c``, ``a = t[k]`` of a tuple
    literal of constants: FoldConstant leaves a folded ``split`` so), else ``arg``.  Later
    passes put that constant in the compiled call in the Var's place, so the grouped function's
    parameter is fed the constant, not a call argument (nn.GRU's gates, fused)."""
    expr = _resolve(arg, bound)
    return expr if hasattr(getattr(expr, "value", None), "numpy") else arg  # a tensor constant


def _resolve(expr, bound: dict):
    """``expr`` followed through rebindings and tuple items of tuple literals."""
    from tvm import relax

    for _ in range(32):  # a chain of rebindings; bounded, as any walk of user IR
        if isinstance(expr, relax.Var) and expr in bound:
            expr = bound[expr]
        elif isinstance(expr, relax.TupleGetItem):
            tup = _resolve(expr.tuple_value, bound)
            if not isinstance(tup, relax.Tuple):
                return expr
            expr = tup.fields[expr.index]
        else:
            break
    return expr


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

    The table is the build's own (the :class:`~tvm_probe.core.sources.SourceMap` is not touched), so
    one imported model can be compiled and served by several probes.  "Dead code" (UNAVAILABLE)
    is said only of values no model output depends on in the source graph; a live value without
    a place is UNKNOWN (and ``kmap.lost`` says why).
    """
    live = sources.live_keys()
    input_index = {key: i for i, key in enumerate(sources.model_inputs)}
    servings = {}
    for value in sources:
        servings[value.key] = serving = _serving(value, kmap.places.get(value.key), kmap, live, input_index, num_inputs)
        if serving.served is Served.UNKNOWN and value.key not in kmap.lost and value.key not in sources.sequences:
            kmap.lost[value.key] = "TVM's importer produced no run-time value for it"
    for key, elements in sources.sequences.items():
        servings[key] = _sequence_serving(key, elements, servings, kmap)
    return servings


def _sequence_serving(key: str, elements: list[str], servings: Servings, kmap: KernelMap) -> Serving:
    """A sequence is served when each of its elements is (``get`` answers them all, in order);
    else it is as unknown (or dead) as its first element that is not served, for that reason."""
    for k, element in enumerate(elements):
        served = servings[element].served
        if served in (Served.UNKNOWN, Served.UNAVAILABLE):
            if served is Served.UNKNOWN:
                kmap.lost[key] = f"its element {k} is unknown: {kmap.lost.get(element, 'no place found')}"
                if element in kmap.known_limits:
                    kmap.known_limits.add(key)
            return Serving(served)
    kmap.lost.pop(key, None)
    return Serving(Served.SEQUENCE, servings[elements[0]].node_index if elements else -1)


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
    if place.kind in (PlaceKind.SHAPE, PlaceKind.DIMS):
        return Serving(Served.SHAPE, place.input_index)
    if place.kind is PlaceKind.OUTPUT:
        return Serving(Served.VIEW if kmap.sites[place.site].is_view else Served.CAPTURED, num_inputs + place.site)
    if place.kind is PlaceKind.INTERIOR:
        return Serving(Served.RECOMPUTED, num_inputs + place.site)
    if place.kind in (PlaceKind.ARGUMENT, PlaceKind.RETURNED):
        return Serving(Served.PASSED)
    return Serving(Served.FOLDED)
