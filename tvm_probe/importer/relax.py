"""Relax IRModules as models: every binding of every function answers to its binding name.

Design (issue 25; ``docs/architecture.md`` has the whole picture)::

    IRModule ──compile once (the user's pipeline, snapshots)──▶ one executable, one VM
        └─ per public Relax function f:
             FunctionModel (an ImportedModel whose modules are *views*: f re-keyed as "main")
             + BuiltModel with view snapshots ──build_kernel_map (unchanged)──▶ KernelMap of f

A *view* is a new IRModule holding the very same function objects, with ``f`` under the name
``main`` (and the module's own ``main``, if another, left out).  Var identity — what the kernel
map follows from the imported module to the compiled one — is therefore that of the real
module, and every stage written for ``main`` works for ``f`` as it is.  The VM runs the one real
executable and calls ``f`` by its own name (:attr:`FunctionModel.function`).

Names: a tensor binding answers to its binding name (``matmul3``; a repeated name gets ``#k``
as its key and answers to the bare name as an alias, which resolution reports as ambiguous);
parameters to their names.  Weights given with ``params=`` are *not* bound into the module
(that would change what is compiled and deployed): the probe keeps them and passes them in
their place at every call (:attr:`FunctionModel.held`).  Tuple parameters (``packed`` weights)
serve their elements by name from the call's arguments (:attr:`FunctionModel.param_items`).
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, NamedTuple

import numpy as np

from ..core.errors import ModelError
from ..core.sources import Kind, Served, Serving, SourceMap, SourceValue
from .adapter import ImportedFunctions, ModelAdapter
from .kv_cache import opaque_notes
from .model import ImportedModel, InputSpec
from .relax_values import tensor_info

#: Parameter kinds that are not tensors; an InputSpec of one has this as its dtype.
OBJECT, TUPLE, SHAPE, PRIM = "object", "tuple", "shape", "prim"


class ParamItem(NamedTuple):
    """Element ``element`` of the tuple passed as parameter ``param`` (by position)."""

    param: int
    element: int


@dataclass
class FunctionModel(ImportedModel):
    """One Relax function of a multi-function module, as the map and capture stages see it.

    ``inputs`` lists *every* parameter (graph input node ``i`` is parameter ``i``, objects and
    held weights included); :meth:`Probe.call` takes those not in :attr:`held`.

    Attributes:
        function: the function's name in the executable (what ``vm[...]`` is called with).
        params: every parameter of the function, in order: ``(name, InputSpec)``.
        held: parameter position → the weight the probe passes there (``params=``); the
            caller passes the other parameters, in order (:attr:`inputs`).
        param_items: source key → :class:`ParamItem` for the elements of tuple parameters that
            have names (packed weights).
        module_paths: ``{path: key}`` of the module paths recorded for this function (nn).
    """

    function: str = "main"
    params: list = field(default_factory=list)
    held: dict = field(default_factory=dict)
    param_items: dict = field(default_factory=dict)
    module_paths: dict = field(default_factory=dict)


def public_functions(mod) -> list[str]:
    """Names of the Relax functions the executable exposes, ``main`` first.

    Those with a ``global_symbol``, and those without one that no function of the module calls:
    ``tvm.IRModule({"main": func})`` (as bug reports build modules) is built and run by
    ``tvm.compile``, whose AttachGlobalSymbol names every function after its GlobalVar.  A
    function another one calls and that has no ``global_symbol`` (TVMScript's ``private=True``)
    is a helper, not an entry point (AttachGlobalSymbol exposes it too; calling it alone is not
    what the module is for)."""
    from tvm import relax

    functions = {gv.name_hint: func for gv, func in mod.functions.items() if isinstance(func, relax.Function)}
    called = {gv.name_hint for func in functions.values() for gv in relax.analysis.all_global_vars(func)}
    names = [name for name, func in functions.items()
             if (func.attrs is not None and "global_symbol" in func.attrs) or name not in called]
    return sorted(names, key=lambda n: (n != "main", n))


def function_view(mod, function: str):
    """``mod`` with ``function`` as its ``main`` (same function objects; see module docstring)."""
    import tvm

    if mod is None or function == "main":
        return mod
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint not in ("main", function)}
    funcs[tvm.ir.GlobalVar("main")] = mod[function]
    return tvm.IRModule(funcs, attrs=mod.attrs)


def final_view(mod, function: str):
    """The final module's view for ``function``: it and only the kernels it calls, so that the
    shape functions lowering added for *other* functions are not taken for this one's."""
    import tvm
    from tvm import relax

    if mod is None:
        return None
    func = mod[function]
    called = {gv.name_hint for gv in relax.analysis.all_global_vars(func)}
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint in called and gv.name_hint != "main"}
    funcs[tvm.ir.GlobalVar("main")] = func
    return tvm.IRModule(funcs)


def import_relax(mod, params: Mapping[str, Any] | None = None, function: str = "main",
                 param_names: Mapping[int, str] | None = None, item_names: Mapping[int, list] | None = None,
                 model_hash: str | None = None) -> FunctionModel:
    """Source values of one Relax function of ``mod``.

    Args:
        mod: the Relax IRModule (as imported: before any pass of the pipeline).
        params: ``{parameter name: array}`` weights the probe holds and passes (see module
            docstring); a name that is no parameter of any function is refused by the caller.
        function: which function.
        param_names: parameter position → the name it answers to instead of its Var name
            (``from_nn``: ``model.layers.0.mlp.down_proj.weight``); the Var name stays an alias.
        item_names: parameter position → names of the elements of a tuple parameter (packed).
        model_hash: what dumps record; by default the sha256 of the module's text.
    """
    from tvm import relax

    if function not in [gv.name_hint for gv in mod.functions]:
        raise ModelError(f"the module has no function {function!r}: it has {', '.join(public_functions(mod))}")
    func = mod[function]
    if not isinstance(func, relax.Function):
        raise ModelError(f"{function!r} is a {type(func).__name__}, not a Relax function")
    found = _Found(function, dict(item_names or {}))
    found.add_params(func, dict(params or {}), dict(param_names or {}))
    for topo, binding in enumerate(b for block in func.body.blocks for b in block.bindings):
        found.add_binding(func, topo, binding)
    sources = found.sources
    sources.model_outputs = list(dict.fromkeys(k for v in relax.analysis.free_vars(func.body.body)
                                               for k in found.var_keys.get(v, ())))
    for name, why in opaque_notes(mod).items():
        sources.notes.setdefault(name, why)
    text_hash = model_hash
    return FunctionModel(
        mod=function_view(mod, function), sources=sources, var_keys=found.var_keys, constants=found.constants,
        inputs=[spec for _, spec in found.specs],  # every parameter: graph input node i is parameter i
        hash_model=(lambda: text_hash) if text_hash else (lambda: _module_hash(mod)),
        function=function, params=found.specs, held=found.held, param_items=found.items)


@dataclass
class _Found:
    """What :func:`import_relax` collects while it walks one function."""

    function: str
    item_names: dict
    sources: SourceMap = field(default_factory=SourceMap)
    var_keys: dict = field(default_factory=dict)
    constants: dict = field(default_factory=dict)
    specs: list = field(default_factory=list)
    held: dict = field(default_factory=dict)
    items: dict = field(default_factory=dict)

    def new_key(self, name: str) -> str:
        """``name``, or ``name#k`` when a value already has it (Relax allows repeated names)."""
        key, k = name, 1
        while key in self.sources:
            key, k = f"{name}#{k}", k + 1
        return key

    def add_params(self, func, params: dict, param_names: dict) -> None:
        """Parameters: inputs the caller passes, weights the probe holds, objects (no values)."""
        for i, p in enumerate(func.params):
            name = param_names.get(i, p.name)
            spec = _spec(name, p)
            self.specs.append((name, spec))
            given = params.get(name, params.get(p.name))
            if given is not None:
                self.held[i] = given
            if self.item_names.get(i):
                continue  # a tuple of weights: its elements are values of their own (bindings)
            key = self.new_key(name)
            aliases = (p.name,) if p.name != name else ()
            if given is not None:
                shape, dtype = tensor_info(p)
                self.sources.add(SourceValue(key=key, op_type="Initializer", kind=Kind.PARAM, shape=shape,
                                             dtype=dtype, aliases=aliases))
                self.constants[key] = _host(given)
            elif spec.dtype not in (OBJECT, TUPLE, SHAPE, PRIM):
                self.sources.add(SourceValue(key=key, op_type="Input", kind=Kind.INPUT, shape=spec.shape,
                                             dtype=spec.dtype, aliases=aliases))
                self.sources.model_inputs.append(key)
            else:
                self.sources.notes[name] = f"parameter {name!r} of {self.function} is a {spec.dtype}, not a tensor"
                continue
            self.var_keys[p] = [key]

    def add_binding(self, func, topo: int, binding) -> None:
        """One binding: a tensor value named after its Var (or a named element of packed weights)."""
        from tvm import relax

        var, value = binding.var, binding.value
        if not isinstance(var.ty, relax.TensorType):
            self.sources.notes.setdefault(var.name, f"binding {var.name!r} of {self.function} is not a tensor "
                                                    f"({type(var.ty).__name__}): tvm_probe serves tensors")
            return
        shape, dtype = tensor_info(var)
        item = _param_item(func, value, self.item_names)
        if item is not None:  # a named element of a tuple of weights (packed)
            owner, j = item
            key = self.new_key(self.item_names[owner][j])
            given = self.held.get(owner)
            self.sources.add(SourceValue(key=key, op_type="Initializer",
                                         kind=Kind.PARAM if given is not None else Kind.VALUE,
                                         shape=shape, dtype=dtype, aliases=(var.name,)))
            if given is not None:
                self.constants[key] = _host(given[j])
            else:
                self.items[key] = item  # served from the call's arguments
            self.var_keys[var] = [key]
            return
        key = self.new_key(var.name)
        inputs = tuple(dict.fromkeys(k for v in relax.analysis.free_vars(value) for k in self.var_keys.get(v, ())))
        self.sources.add(SourceValue(key=key, node=var.name if key == var.name else "", op_type=_op_type(value),
                                     topo_index=topo, inputs=inputs, shape=shape, dtype=dtype,
                                     aliases=(var.name,) if key != var.name else ()))
        self.var_keys[var] = [key]
        if isinstance(value, relax.Var) and value in self.var_keys:  # `a = b`: passes may keep either
            self.var_keys[var] = self.var_keys[value] + [key]


def with_module_paths(model: FunctionModel, paths: Mapping[str, Any]) -> FunctionModel:
    """``model`` whose values also answer to module paths: ``{path: Relax Var it returned}``.

    A path whose Var is not a tensor binding of this function is left out (it was recorded for
    another function, or the module returned something other than a tensor).
    """
    key_of = {var: keys[-1] for var, keys in model.var_keys.items()}  # a Var's own key is its last
    by_key: dict[str, list[str]] = {}
    found = {}
    for path, var in paths.items():
        key = key_of.get(var)
        if key is None or model.sources[key].kind is not Kind.VALUE:
            continue
        by_key.setdefault(key, []).append(path)
        found[path] = key
    for key, ps in by_key.items():
        value = model.sources[key]
        # innermost module first: the name closest to the op that computed it
        value.modules = tuple(sorted(ps, key=lambda s: -s.count(".")))
    return replace(model, module_paths=found)


def _param_item(func, value, item_names) -> ParamItem | None:
    """The parameter element ``value`` reads, when it reads a named element of a tuple parameter."""
    from tvm import relax

    if not isinstance(value, relax.TupleGetItem) or not isinstance(value.tuple_value, relax.Var):
        return None
    owner = next((i for i, p in enumerate(func.params) if p.same_as(value.tuple_value)), None)
    if owner is None or not item_names.get(owner) or int(value.index) >= len(item_names[owner]):
        return None
    return ParamItem(owner, int(value.index))


def _spec(name: str, param) -> InputSpec:
    from tvm import relax

    ty = param.ty
    if isinstance(ty, relax.TensorType):
        shape, dtype = tensor_info(param)
        return InputSpec(name=name, shape=shape or (), dtype=dtype or OBJECT)
    import tvm

    kind = {relax.TupleType: TUPLE, relax.ShapeType: SHAPE, tvm.ir.PrimType: PRIM}.get(type(ty), OBJECT)
    return InputSpec(name=name, shape=(), dtype=kind)


def _op_type(value) -> str:
    """What computes a binding: the Relax op, the called kernel or packed function, or the expression kind."""
    import tvm
    from tvm import relax

    if isinstance(value, relax.Call):
        if isinstance(value.op, tvm.ir.Op):
            if value.op.name in ("relax.call_tir", "relax.call_dps_packed") and value.args:
                callee = value.args[0]
                return getattr(callee, "name_hint", None) or str(getattr(callee, "global_symbol", callee))
            return value.op.name
        return getattr(value.op, "name_hint", None) or getattr(value.op, "global_symbol", None) or "call"
    return type(value).__name__


def _host(value) -> np.ndarray:
    """A weight as numpy (given as numpy, or as a device tensor)."""
    return value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else np.asarray(value)


def _module_hash(mod) -> str:
    return hashlib.sha256(mod.script(show_meta=False).encode()).hexdigest()


def check_params(mod, functions: list[str], params: Mapping[str, Any] | None) -> None:
    """Every name of ``params`` must be a parameter of some function (one-line error otherwise)."""
    if not params:
        return
    if not isinstance(params, Mapping):
        raise ModelError(f"params must be a dict {{parameter name: array}}, got a {type(params).__name__}")
    known = {p.name for f in functions for p in mod[f].params}
    unknown = [n for n in params if n not in known]
    if unknown:
        raise ModelError(f"params names no parameter: {', '.join(map(repr, unknown[:5]))}; the functions' "
                         f"parameters are {', '.join(sorted(known)[:8])}{'...' if len(known) > 8 else ''}")


def hold_on_device(models: Mapping[str, FunctionModel], device) -> None:
    """The weights each model holds, copied to ``device`` once (shared by all functions)."""
    import tvm

    copies: dict[int, Any] = {}

    def on_device(value):
        if isinstance(value, (list, tuple)):
            return [on_device(v) for v in value]
        if id(value) not in copies:
            copies[id(value)] = value if not isinstance(value, np.ndarray) and hasattr(value, "numpy") \
                else tvm.runtime.tensor(np.asarray(value, order="C"), device)  # (0-d stays 0-d)
        return copies[id(value)]

    for model in models.values():
        model.held = {i: on_device(v) for i, v in model.held.items()}


def replace_held(model: FunctionModel, values: Mapping[str, Any]) -> dict[int, Any]:
    """``{position: value}`` for the held weights of ``model`` that ``values`` names (by
    parameter name), set in ``model.held`` and in what it serves (``constants``); a value
    whose shape or dtype differs from its parameter's is refused in one line.  ``values``:
    ``{name: (device tensor, the same as a numpy array)}``."""
    found = {}
    for i, (name, spec) in enumerate(model.params):
        if name not in values or i not in model.held:
            continue
        value, host = values[name]
        if tuple(host.shape) != tuple(spec.shape) or str(host.dtype) != spec.dtype:
            raise ModelError(f"set_params: {name} takes {spec.dtype}{list(spec.shape)}, got "
                             f"{host.dtype}{list(host.shape)}")
        model.held[i] = found[i] = value
        for key in model.var_keys.get(model.mod["main"].params[i], ()):
            model.constants[key] = host
    return found


def place_arguments(model: FunctionModel, kmap, servings) -> None:
    """After ``classify``, in its table ``servings``: inputs are read from the call's arguments
    by parameter position (a function's arguments include objects, which are no source values),
    and the named elements of a tuple of weights from that tuple."""
    position = {keys[0]: i for i, p in enumerate(model.mod["main"].params)
                for keys in [model.var_keys.get(p)] if keys}
    for value in model.sources:
        if value.kind is Kind.INPUT and value.key in position:
            servings[value.key] = Serving(servings[value.key].served, position[value.key])
    for key, item in model.param_items.items():
        servings[key] = Serving(Served.INPUT, item.param)
        kmap.lost.pop(key, None)


class RelaxAdapter(ModelAdapter):
    """Relax IRModules (one function or several), as built or imported: every binding by its name."""

    kind, described, functions = "relax", "a Relax IRModule", True

    def owns(self, model) -> bool:
        tvm = sys.modules.get("tvm")
        return tvm is not None and isinstance(model, tvm.IRModule)

    def import_functions(self, model, params: Mapping[str, Any] | None = None) -> ImportedFunctions:
        """Every public function of the module ``model``; ``params``: weights the probe holds."""
        names = public_functions(model)
        check_params(model, names, params)
        return ImportedFunctions(mod=model, models={f: import_relax(model, params, f) for f in names})
