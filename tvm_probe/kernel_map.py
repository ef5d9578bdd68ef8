"""Map every kernel call site of the compiled ``main`` back to the source values inside it.

Inputs: the importer's Var tags and the compile stage's snapshots (see :mod:`tvm_probe.build`).

1. Index the pre-fusion bindings by ``(callee, identity of args)`` → Var.
2. For each call of a grouped function in the post-fusion ``main``, bind the function's
   parameters to that call's arguments and replay its body against the index: each binding
   inside resolves to the pre-fusion Var it computes, hence to its source names.  This is done
   per *call site*: FuseOps shares one grouped function between structurally equal groups
   (every BERT layer), so names found in the function itself belong to its first caller only.
3. Walk the ``call_graph`` snapshot's ``main`` in order: each ``call_tir`` is one kernel call the
   VM makes (a node), each ``R.reshape`` one ``vm.builtin.reshape`` (a zero-copy view node).

The result is plain data (:class:`CallSite`) plus, for fused sites, what the recompute stage
needs (:class:`GroupPlan`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import TVMBehaviourChanged

VIEW_SYMBOL = "vm.builtin.reshape"
_KERNEL_OPS = {"relax.call_tir", "relax.call_dps_packed"}


@dataclass
class ArgSource:
    """Where the value of one kernel argument comes from.

    ``kind`` is ``"node"`` (output ``output`` of node ``node``), ``"input"`` (model input
    ``input_index``), ``"const"`` (``const`` holds the Relax constant) or ``"untracked"`` (the
    executor copies it before the call when it is needed).
    """

    kind: str
    node: int = -1
    output: int = 0
    input_index: int = -1
    const: Any = None


@dataclass
class GroupPlan:
    """How to recompute the values a fused call site keeps inside.

    Attributes:
        function: the grouped Relax function (post-fusion) this site calls.
        name: its global name (cut modules are cached per name).
        interior: ``(var inside function, source keys)`` for every tagged interior binding.
        param_args: per function parameter, the position of the site argument that feeds it,
            or ``None`` when it is a constant (then ``param_consts`` has it).
    """

    function: Any
    name: str
    interior: list[tuple[Any, list[str]]]
    param_args: list[int | None]
    param_consts: dict[int, Any] = field(default_factory=dict)
    prim_funcs: dict = field(default_factory=dict)   # GlobalVar → PrimFunc the function calls


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
    output_keys: list[list[str]]
    interior_keys: list[str] = field(default_factory=list)
    group: GroupPlan | None = None

    @property
    def num_inputs(self) -> int:
        return len(self.args)

    @property
    def num_outputs(self) -> int:
        return len(self.out_shapes)


@dataclass
class KernelMap:
    """Every call site in execution order, and the source value → site index."""

    sites: list[CallSite]
    output_of: dict[str, tuple[int, int]]   # key → (site, output k)
    interior_of: dict[str, int]             # key → site whose grouped function computes it


# ---------------------------------------------------------------------------------------------
def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _op_name(call) -> str:
    op = getattr(call, "op", None)
    return getattr(op, "name", "") if op is not None and type(op).__name__ == "Op" else ""


def _arg_key(expr, resolve):
    """A hashable identity for a call argument (Vars and constants by identity)."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        expr = resolve(expr)  # a grouped function's parameter resolves to its call's argument
        if isinstance(expr, relax.Var):
            return ("var", expr)
    if isinstance(expr, relax.ShapeExpr):
        return ("shape", tuple(str(v) for v in expr.values))
    if isinstance(expr, relax.Tuple):
        return ("tuple",) + tuple(_arg_key(f, resolve) for f in expr.fields)
    return ("obj", expr)


def _call_key(call, resolve):
    from tvm import relax

    if not isinstance(call, relax.Call):
        return None
    name = _op_name(call)
    if name in _KERNEL_OPS:
        callee = call.args[0]
        return (name, getattr(callee, "name_hint", str(callee)), _arg_key(call.args[1], resolve))
    if name:
        return (name, str(call.attrs) if call.attrs is not None else "",
                tuple(_arg_key(a, resolve) for a in call.args))
    return None


def _index(func) -> dict:
    """Pre-fusion ``main``: call key → the Var it is bound to."""
    index = {}
    for b in _bindings(func):
        key = _call_key(b.value, lambda v: v)
        if key is not None:
            index.setdefault(key, b.var)
    return index


def _types(ty) -> tuple[list[tuple[int, ...]], list[str]]:
    fields = list(ty.fields) if hasattr(ty, "fields") else [ty]
    shapes, dtypes = [], []
    for f in fields:
        try:
            shapes.append(tuple(int(v) for v in f.shape.values))
        except (TypeError, AttributeError):
            raise TVMBehaviourChanged(f"kernel output type {f} has no static shape") from None
        dtypes.append(str(f.dtype))
    return shapes, dtypes


def _replay(func, site_args, index, tags):
    """Resolve a grouped function's bindings, for one call site, to pre-fusion Vars.

    Returns (output pre-fusion exprs per output, [(inner var, source keys)] for interiors).
    """
    from tvm import relax

    env = {p: a for p, a in zip(func.params, site_args)}

    def resolve(v):
        return env.get(v, v)

    interior = []
    for b in _bindings(func):
        value = b.value
        if isinstance(value, relax.Var):
            env[b.var] = resolve(value)
            continue
        if isinstance(value, relax.TupleGetItem):
            key = ("tgi", resolve(value.tuple_value) if isinstance(value.tuple_value, relax.Var) else None, value.index)
            hit = index.get(key)
        else:
            key = _call_key(value, resolve)
            hit = index.get(key) if key is not None else None
        if hit is not None:
            env[b.var] = hit
            if tags.get(hit):
                interior.append((b.var, hit))
    body = func.body.body
    outs = [resolve(f) for f in body.fields] if isinstance(body, relax.Tuple) else [resolve(body)]
    out_set = set(o for o in outs if isinstance(o, relax.Var))
    inner = [(var, list(tags[hit])) for var, hit in interior if hit not in out_set]
    return outs, inner


def _index_with_tuples(func) -> dict:
    from tvm import relax

    index = _index(func)
    for b in _bindings(func):
        if isinstance(b.value, relax.TupleGetItem) and isinstance(b.value.tuple_value, relax.Var):
            index.setdefault(("tgi", b.value.tuple_value, b.value.index), b.var)
    return index


def _group_calls(post_mod, pre_index, tags) -> dict:
    """Post-fusion ``main``: site Var → (grouped function, its name, call args, replay result).

    A site's arguments are often outputs of earlier sites, bound to Vars FuseOps created; they
    resolve to the pre-fusion Vars those sites output (``main_env``).
    """
    from tvm import relax

    groups, main_env = {}, {}

    def resolve(expr):
        return main_env.get(expr, expr) if isinstance(expr, relax.Var) else expr

    for b in _bindings(post_mod["main"]):
        call = b.value
        if isinstance(call, relax.Var) and call in groups:
            groups[b.var] = groups[call]  # `gv = lv`: later passes may keep either Var
            continue
        if isinstance(call, relax.TupleGetItem) and call.tuple_value in groups:
            outs = groups[call.tuple_value][3]
            if call.index < len(outs):
                main_env[b.var] = outs[call.index]
            continue
        if not (isinstance(call, relax.Call) and isinstance(call.op, relax.GlobalVar)):
            continue
        func = post_mod[call.op]
        if not isinstance(func, relax.Function):
            continue
        outs, inner = _replay(func, [resolve(a) for a in call.args], pre_index, tags)
        if len(outs) == 1:
            main_env[b.var] = outs[0]
        groups[b.var] = (func, call.op.name_hint, list(call.args), outs, inner, _callees(post_mod, func))
    return groups


def _callees(mod, func) -> dict:
    from tvm import relax

    found = {}
    for b in _bindings(func):
        if isinstance(b.value, relax.Call) and _op_name(b.value) in _KERNEL_OPS:
            gvar = b.value.args[0]
            if isinstance(gvar, relax.GlobalVar):
                found[gvar] = mod[gvar]
    return found


def _plan_group(func, name, group_args, site_args, inner, prim_funcs) -> GroupPlan:
    """Which site argument feeds each grouped-function parameter (FuseTIR may drop some)."""
    from tvm import relax

    param_args, consts = [], {}
    for i, arg in enumerate(group_args):
        j = next((k for k, a in enumerate(site_args) if a.same_as(arg)), None)
        if j is None and not isinstance(arg, relax.Var):
            consts[i] = arg
        param_args.append(j)
    return GroupPlan(function=func, name=name, interior=inner, param_args=param_args,
                     param_consts=consts, prim_funcs=prim_funcs)


def build_kernel_map(imported, snapshots) -> KernelMap:
    """Map each kernel call of the compiled ``main`` to source values (see module docstring)."""
    from tvm import relax

    tags = imported.var_keys
    main = snapshots.call_graph["main"]
    params = {p: i for i, p in enumerate(main.params)}
    groups = {}
    if snapshots.post_fusion is not None:
        pre_index = _index_with_tuples(snapshots.pre_fusion["main"])
        groups = _group_calls(snapshots.post_fusion, pre_index, tags)

    sites: list[CallSite] = []
    produced: dict = {}          # Var → (site index, output k)
    seen: dict[str, int] = {}

    def arg_source(expr) -> ArgSource:
        if isinstance(expr, relax.Var):
            if expr in produced:
                node, k = produced[expr]
                return ArgSource("node", node=node, output=k)
            if expr in params:
                return ArgSource("input", input_index=params[expr])
            return ArgSource("untracked")
        if type(expr).__name__ == "GenericConst":
            return ArgSource("const", const=expr)
        return ArgSource("untracked")

    for b in _bindings(main):
        value, var = b.value, b.var
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in produced:
            node, _ = produced[value.tuple_value]
            produced[var] = (node, value.index)
            sites[node].output_keys[value.index] += tags.get(var, [])
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
                        out_shapes=shapes, out_dtypes=dtypes, output_keys=[[] for _ in shapes])
        seen[symbol] = site.occurrence + 1
        if var in groups:
            func, gname, gargs, outs, inner, callees = groups[var]
            for k, out in enumerate(outs[: len(shapes)]):
                site.output_keys[k] += tags.get(out, [])
            site.interior_keys = [key for _, keys in inner for key in keys]
            if inner:
                site.group = _plan_group(func, gname, gargs, arg_exprs, inner, callees)
        if len(shapes) == 1:
            site.output_keys[0] += [k for k in tags.get(var, []) if k not in site.output_keys[0]]
        produced[var] = (site.index, 0)
        sites.append(site)

    output_of, interior_of = {}, {}
    for site in sites:
        for k, keys in enumerate(site.output_keys):
            for key in keys:
                output_of.setdefault(key, (site.index, k))
        for key in site.interior_keys:
            if key not in output_of:
                interior_of.setdefault(key, site.index)
    return KernelMap(sites=sites, output_of=output_of, interior_of=interior_of)
