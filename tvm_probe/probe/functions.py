"""Multi-function executables (issue 25): a function's view of the one build, the functions of
the executable as the pipeline left them (issue 53), and the paged KV caches a function attends
with (read after each call that asks for their K/V).

A pipeline may rename, add and remove functions (MLC-LLM's ``DispatchKVCacheCreation`` replaces
``create_paged_kv_cache`` with ``create_tir_paged_kv_cache``).  The probe follows the executable
as built (:func:`as_built`): its functions are the Relax functions of the final module that are
entry points.  A function the pipeline removed is none; one it renamed keeps its values' names
under its new name when the rename is proven (:func:`same_function`); one it added is imported
from the first snapshot that has it (its bindings by the names the pipeline gave them, served
where the kernel map follows them, like any function's).  Nothing is paired by guess.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from ..build.compile import Snapshots
from ..core.errors import PipelineError
from ..importer.kv_cache import cache_layouts, cache_names, opaque_notes, read_kv
from ..importer.relax import FunctionModel, final_view, function_view, import_relax


def function_built(built, function: str, imported_as: str | None = None):
    """``built`` (the whole executable) as the map stage sees ``function``: view snapshots.

    ``imported_as``: the function's name before the pipeline renamed it (a snapshot taken before
    the rename has it by that name).  A snapshot without the function (taken before a pass added
    it) is left out, as a pipeline without that point leaves it out."""
    s = built.snapshots

    def view(mod):
        if mod is None:
            return None
        names = {gv.name_hint for gv in mod.functions}
        name = function if function in names else imported_as if imported_as in names else None
        return function_view(mod, name) if name is not None else None

    views = Snapshots(pre_fold=view(s.pre_fold), pre_fusion=view(s.pre_fusion), post_fusion=view(s.post_fusion),
                      call_graph=view(s.call_graph), final=final_view(s.final, function), passes=s.passes)
    views.whole_final = s.final  # every function's kernels (a VM made by hand must resolve them all)
    return replace(built, snapshots=views)


@dataclass
class BuiltFunctions:
    """The functions of one executable and what the pipeline did to those imported.

    Attributes:
        models: executable function name → the :class:`FunctionModel` its probe serves, in the
            imported order, then those the pipeline added.
        renamed: imported name → its name in the executable (proven: :func:`same_function`).
        proofs: imported name → what proves the rename (words of :func:`same_function`).
        removed: imported names the executable lacks (and that no proven rename explains).
        added: functions of the executable the imported module lacks, not renamed ones.
    """

    models: dict = field(default_factory=dict)
    renamed: dict = field(default_factory=dict)
    proofs: dict = field(default_factory=dict)
    removed: tuple = ()
    added: tuple = ()

    def explain(self, name: str, kernel_map) -> None:
        """Values of ``name``'s function that its kernel map could not follow: where the function
        was added by the pipeline, their reasons say so."""
        if name in self.added:
            for key, why in kernel_map.lost.items():
                kernel_map.lost[key] = f"computed inside {name}, which the pipeline added: {why}"

    def became(self, name: str) -> str | None:
        """What became of the imported function ``name`` if the executable lacks it (one line), else None."""
        if name in self.renamed:
            return (f"the pipeline renamed {name} to {self.renamed[name]} (the same function: "
                    f"{self.proofs.get(name, 'proven')}): call {self.renamed[name]}, whose values keep their names")
        if name in self.removed:
            instead = f" and added {', '.join(self.added)}" if self.added else ""
            return f"the pipeline removed {name}{instead}; the executable has {', '.join(self.models)}"
        return None


def as_built(imported: Mapping[str, FunctionModel], mod, built) -> BuiltFunctions:
    """The functions of ``built``'s executable, each with the model its probe serves (see the
    module docstring); ``imported``: the models of ``mod``'s functions, by name.

    Every model gets notes (copied sources: one import may be compiled by several pipelines) for
    the names that have no value in this build: the kernels inside a paged KV cache the built
    module creates, and the imported functions the executable lacks."""
    from tvm import relax

    s = built.snapshots
    final = {gv.name_hint: f for gv, f in s.final.functions.items() if isinstance(f, relax.Function)}
    called = {gv.name_hint for f in final.values() for gv in relax.analysis.all_global_vars(f)}
    known = {gv.name_hint for gv in mod.functions}
    added = [n for n in final if n not in known and n not in called]  # new entry points
    removed = [n for n in imported if n not in final]
    renamed, proofs = {}, {}
    for old in removed:
        found = [(n, why) for n in added if n not in renamed.values()
                 for why in [same_function(mod[old], _first(s, n))] if why]
        if len(found) == 1:
            renamed[old], proofs[old] = found[0]
    out = BuiltFunctions(renamed=renamed, proofs=proofs, removed=tuple(n for n in removed if n not in renamed),
                         added=tuple(n for n in added if n not in renamed.values()))
    for name, model in imported.items():
        if name in final or name in renamed:
            out.models[renamed.get(name, name)] = replace(model, function=renamed.get(name, name))
    for name in out.added:
        out.models[name] = _added_model(s, name)
    notes, stale = _build_notes(s.final, out, imported), opaque_notes(mod)  # (the imported creator's kernels)
    for name, model in out.models.items():
        kept = {k: v for k, v in model.sources.notes.items() if k not in stale}
        out.models[name] = replace(model, sources=replace(model.sources, notes={**kept, **notes}))
    return out


def same_function(imported, later) -> str | None:
    """What proves that ``later`` (a function of a snapshot, under another name) is ``imported``,
    in words, or None: the same object; a function with the very same parameter objects (Relax
    variables are unique: a pass that moved the function under another GlobalVar, changed its
    attributes or rewrote its body in place keeps them; every pass of TVM's pipelines before the
    call graph does); or one structurally equal to it but for attributes (a copy made before any
    pass rewrote it).  Functions that compute the same thing from new parameters are not paired:
    that would be a guess."""
    import tvm_ffi

    if later is None:
        return None
    if later.same_as(imported):
        return "the same function object"
    if len(imported.params) and len(imported.params) == len(later.params) and \
            all(a.same_as(b) for a, b in zip(imported.params, later.params)):
        return "its parameters are the same Relax variables"
    if tvm_ffi.structural_equal(_bare(imported), _bare(later)):
        return "structurally equal to it, attributes aside"
    return None


def _bare(func):
    """``func`` without attributes (a renamed copy's ``global_symbol`` differs)."""
    for key in list(func.attrs.keys()) if func.attrs is not None else []:
        func = func.without_attr(key)
    return func


def _first(snapshots, name: str):
    """``name``'s function in the first snapshot that has it (before the pipeline changed it more)."""
    mod = _first_module(snapshots, name)
    return mod[name] if mod is not None else None


def _first_module(snapshots, name: str):
    s = snapshots
    for mod in (s.pre_fold, s.pre_fusion, s.post_fusion, s.call_graph):
        if mod is not None and name in {gv.name_hint for gv in mod.functions}:
            return mod
    return None


def _added_model(snapshots, name: str) -> FunctionModel:
    """The model of a function the pipeline added: its bindings as the first snapshot that has it
    names them (served where the kernel map follows them to the kernels that compute them)."""
    mod = _first_module(snapshots, name)
    if mod is None:
        raise PipelineError(f"the pipeline added the function {name} after lowering (after ToNonDataflow or "
                            "CallTIRRewrite): tvm_probe maps a function from the module just before them, so it "
                            "cannot run this executable; add functions before TVM's pipeline, as MLC-LLM does")
    model = import_relax(mod, None, name)
    return replace(model, sources=replace(model.sources, notes={**model.sources.notes, **{
        n: why for n, why in _inside_added(mod[name], name).items() if n not in model.sources}}))


def _inside_added(func, name: str) -> dict[str, str]:
    """``{binding name: why}`` for the bindings of an added function that are no tensors."""
    from tvm import relax

    why = (f"computed inside {name}, which the pipeline added (it is not in the module tvm_probe imported), "
           "and not a tensor: tvm_probe serves tensors")
    return {b.var.name: why for block in func.body.blocks for b in block.bindings
            if not isinstance(b.var.ty, relax.TensorType)}


def _build_notes(final, out: BuiltFunctions, imported: Mapping[str, FunctionModel]) -> dict[str, str]:
    """Why names have no value in this build: the kernels inside the paged KV caches ``final``
    creates, the imported functions it lacks."""
    attention = next((p for m in imported.values() for p in m.module_paths
                      if p.endswith(".attention_with_fused_qkv")), None)
    # the K/V by the names the imported functions give them (the built ones call the cache's builtins)
    kv = next((n for m in imported.values() for n in cache_names(m.mod)), None)
    notes = opaque_notes(final, added=out.added, kv=kv, attention=attention)
    for name in (*out.renamed, *out.removed):
        notes[name] = f"{name} is no function of the executable: {out.became(name)}"
    return notes


class KVCaches:
    """The paged KV caches of one function (:class:`tvm_probe.importer.kv_cache.CacheLayout`s) and the
    names of their keys and values (``paged_kv_cache.layers.0.k``...)."""

    def __init__(self, func):
        self.layouts = cache_layouts(func)
        self.names = frozenset(n for layout in self.layouts for n in layout.names())

    def split(self, capture):
        """The caches whose K/V a call with ``capture`` reads afterwards, and ``capture`` less
        the K/V names (which are no kernel outputs)."""
        if not self.layouts or capture is None:
            return [], capture
        if capture == "all":
            return self.layouts, capture
        names = [capture] if isinstance(capture, str) else list(capture)
        if not self.names.intersection(names):
            return [], capture
        chosen = [l for l in self.layouts if any(n in self.names and n.startswith(l.name + ".") for n in names)]
        return chosen, [n for n in names if n not in self.names]

    @staticmethod
    def read(arguments, layouts) -> Mapping:
        """What the caches ``layouts`` hold now, by name (``arguments``: the call's, by parameter)."""
        if len(layouts) == 1:  # (the usual case: one cache, read as it is)
            return read_kv(arguments[layouts[0].param], layouts[0])
        found = {}
        for layout in layouts:
            found.update(read_kv(arguments[layout.param], layout))
        return found
