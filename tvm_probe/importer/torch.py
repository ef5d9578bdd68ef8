"""Import a PyTorch module into Relax, tagging every runtime value with its fx node name.

PyTorch users name tensors two ways: by fx node name (``bmm_3``, what ``torch.export`` prints)
and by module path (``bert.encoder.layer.0.attention.self.query``).  TVM's
``from_exported_program`` keeps neither, but its importer fills ``env: fx.Node → Relax expr``
as it converts, and every converter emits its result with the block builder, so each fx node's
value is a Relax Var of ``main`` whose identity survives the pipeline (see docs/architecture.md).
We therefore run TVM's own :class:`ExportedProgramImporter` unchanged and keep what ``env``
binds to each node when that node is converted (:class:`OwnValues`: converters of in-place ops
such as ``copy_`` later write *another* value into their destination's slot) — no extra
bindings, so the module is structurally identical to a plain import.  The only addition wraps
each converter so that a failure names the fx node and aten op.

The program imported is ``torch.export.export(module, args).run_decompositions()``: exactly
what ``from_exported_program`` converts (it runs the default decompositions itself), built by
:func:`export_program`, which the eager reference (:mod:`tvm_probe.comparison.reference.torch`) uses too.

torch is imported lazily: ``import tvm_probe`` must work without it.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import re
import sys
import warnings
from dataclasses import dataclass, field, replace

import numpy as np

from ..core.errors import ModelError, ProbeError, TVMBehaviourChanged, TVMImportError, UnsupportedOpError, one_line
from ..core.sources import Kind, SourceMap, SourceValue
from .adapter import ModelAdapter, SourceGraph, load_factory
from .fixes import BOOL_COMPARE_CONSTANT, BOOL_COMPARE_CONVERTERS, TORCH_FIXES, FixLog, bool_compare_rewrite, off_hint
from .model import ImportedModel, InputSpec
from .module_paths import module_outputs, module_path, relative_to, unrecorded_modules
from .relax_values import binding_of_value, const_value, follow_aliases, tensor_info
from .torch_export import _FIRST_OUTPUTS, export_program, require_torch, stack_origin


def import_torch(module, example_inputs, import_fixes: bool = True, dynamic_shapes=None,
                 names_root: str = "", keep_params_as_input: bool = False) -> ImportedModel:
    """Export ``module`` with ``torch.export`` and import it with every fx node's value tagged.

    Keys: fx node names for computed values and user inputs (``input_ids``, ``bmm_3``),
    state-dict names for parameters and buffers (``bert.embeddings.LayerNorm.weight``).  A value
    also answers to the module paths whose output it is (see :func:`module_outputs`).

    Args:
        module: a ``torch.nn.Module`` (in ``eval()`` mode for inference behaviour).
        example_inputs: a tuple of tensors, the positional arguments of ``forward``; their
            shapes are compiled statically.
        import_fixes: rewrite the constructs TVM 0.27 cannot build (see
            :mod:`tvm_probe.importer.fixes`); those used are listed in ``ImportedModel.fixes``.
        dynamic_shapes: what ``torch.export.export`` takes (``Dim`` per axis): those axes are
            compiled as symbolic dimensions (``tvm_probe.importer.hf`` uses it for the KV cache length).
        names_root: the path of the submodule whose names the values take, when ``module`` is
            a wrapper around the user's model (``Probe.from_hf``: ``"model"``): module paths,
            parameter and buffer names (and their placeholders' fx names) are that submodule's
            own, by :func:`~tvm_probe.importer.module_paths.relative_to`; its own path names
            nothing.  Default '': ``module``'s names.
        keep_params_as_input: leave the module's parameters as parameters of ``main`` (after
            the user's inputs, ``attrs["num_input"]`` of them), each tagged with its name in
            ``var_keys``, instead of binding them as constants (what
            :mod:`tvm_probe.importer.quantize` rewrites).  Default False.

    Raises:
        ModelError: torch is missing, ``torch.export`` cannot trace the module, or TVM's
            importer fails on an fx node whose op it converts (the node and TVM's message named);
        UnsupportedOpError: the module uses an op TVM's importer cannot convert.
    """
    program = export_program(module, example_inputs, dynamic_shapes)
    check_no_mutations(program, type(module).__name__)
    importer = _make_importer(import_fixes)
    _check_ops_supported(program, importer)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            mod = importer.from_exported_program(  # the defaults of from_exported_program
                program, keep_params_as_input=keep_params_as_input, unwrap_unit_return_tuple=False,
                no_bind_return_tuple=False, custom_convert_map=None)
        except ProbeError:
            raise
        except Exception as err:
            raise ModelError(f"TVM's PyTorch importer failed: {one_line(err)}") from None
    imported = _collect(program, mod, own_values(importer), module, names_root)
    imported.fixes, imported.unfixed = importer.fixes.applied(), importer.unfixed.applied()
    return imported



def check_no_mutations(program, name: str) -> None:
    """Refuse, in one line naming them, a program that mutates buffers.

    TVM's ``from_exported_program`` binds buffers as constants and drops the mutation outputs
    ("Only user-facing outputs should be returned"): a static KV cache or BatchNorm's running
    statistics would silently keep their first value, every later call wrong.  Measured on
    transformers' ``TorchExportableModuleWithStaticCache`` (6 mutations: decode logits off by
    0.2, other tokens, no error), so tvm_probe never builds such a program.

    An in-place op on a *user input* (``x.add_(1)``, ``F.relu6(x, inplace=True)``) drops no
    state: ``torch.export`` functionalizes it (the input's new value is an fx node like any
    other) and the caller passes the input again at each call, so it is probed as plain TVM
    runs it; only the write-back into the caller's tensor is left out, as TVM leaves it out.
    """
    mutated = list(program.graph_signature.buffers_to_mutate.values())
    if mutated:
        shown = ", ".join(mutated[:4]) + (f" and {len(mutated) - 4} more" if len(mutated) > 4 else "")
        raise ModelError(f"{name} mutates {len(mutated)} buffer(s) ({shown}), whose updates TVM's "
                         "importer drops (it binds buffers as constants): pass that state as inputs and return "
                         "it as outputs (Probe.from_hf does this for KV caches)")


def _make_importer(import_fixes: bool = True):
    """TVM's ``ExportedProgramImporter``, its converters wrapped to name failing fx nodes and to
    apply the import fixes (:mod:`.fixes`) where an fx node's construct needs one."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    class _NamingImporter(ExportedProgramImporter):
        def __init__(self):
            self.fixes = FixLog()    # fixes applied
            self.unfixed = FixLog()  # constructs a fix would rewrite, left alone (fixes off)
            self.converting = None   # the fx node whose converter runs
            super().__init__()       # builds the convert map, which the fixes wrap
            self.env = OwnValues(lambda: self.converting)  # each fx node's own value, kept

        def create_convert_map(self):
            converters = super().create_convert_map()
            for name in BOOL_COMPARE_CONVERTERS:
                if name in converters:
                    converters[name] = self._bool_compare(name, converters[name])
            for fix in TORCH_FIXES:
                for name in fix.converters:
                    if name in converters:
                        converters[name] = self._fixed(fix, converters[name])
            return {name: self._noting_node(_naming_failures(convert)) for name, convert in converters.items()}

        def _noting_node(self, convert):
            """``convert`` with ``self.converting`` set to its node while it runs."""
            def converter(node, *rest):
                outer, self.converting = self.converting, node
                try:
                    return convert(node, *rest)
                finally:
                    self.converting = outer
            return converter

        def _bool_compare(self, name, convert):
            """``bool_compare_constant``: ``mask == 0`` → ``logical_not(mask)``, ``mask == 1`` → ``mask``."""
            from tvm import relax

            def converter(node, *rest):
                lhs = self.env.get(node.args[0]) if len(node.args) == 2 and hasattr(node.args[0], "op") else None
                how = bool_compare_rewrite(name, lhs, node.args[1] if lhs is not None else None)
                if how is None:
                    return convert(node, *rest)
                if not import_fixes:
                    self.unfixed.add(BOOL_COMPARE_CONSTANT, node.name)
                    return convert(node, *rest)
                self.fixes.add(BOOL_COMPARE_CONSTANT, node.name)
                return lhs if how == "identity" else self.block_builder.emit(relax.op.logical_not(lhs))
            return converter

        def _fixed(self, fix, convert):
            """``convert`` with ``fix`` applied to exactly the fx nodes it matches."""
            def converter(node, *rest):
                if not fix.matches(self, node):
                    return convert(node, *rest)
                if not import_fixes:
                    self.unfixed.add(fix.fix, node.name)
                    try:
                        return convert(node, *rest)
                    except Exception as err:  # the import itself fails: say which fix rewrites it
                        raise TVMImportError(f"TVM's PyTorch importer failed on fx node '{node.name}' "
                                             f"({op_type(node)}): {one_line(err)}; {off_hint(fix.fix)}") from None
                self.fixes.add(fix.fix, node.name)
                return fix.rewrite(self, node)
            return converter

    return _NamingImporter()



class OwnValues(dict):
    """The importer's ``env`` (fx node → Relax expr), remembering each node's *own* value.

    TVM's converters of in-place ops (``copy_`` and the functional ``aten.copy.default`` that
    export makes of it, ``fill_``, ``masked_fill_``, ``zero_``, ``index_put_``) also write their
    result into the slot of their destination node, so that later converters read the written
    value.  At the end of the import, ``env[mul]`` of ``y = x * 2; y.copy_(w)`` is ``w``: a name
    read from there serves the copied value for ``mul``.  A node is bound first by its own
    conversion (later nodes, which take it as an argument, write its slot afterwards), so the
    first value bound to each node is the value of *its* op on *its* operands: ``own`` keeps it,
    and ``overwritten`` the node whose converter wrote another value into the slot.

    Args:
        converting: returns the fx node whose converter is running (None outside converters).
    """

    def __init__(self, converting=lambda: None):
        super().__init__()
        self.own: dict = {}
        self.overwritten: dict = {}
        self._converting = converting

    def __setitem__(self, node, value):
        if node not in self.own:
            self.own[node] = value
        elif value is not self.own[node] and node not in self.overwritten:
            writer = self._converting()
            if writer is not None and writer is not node:
                self.overwritten[node] = writer
        super().__setitem__(node, value)



def own_values(importer) -> OwnValues:
    """The importer's record of each fx node's own value (see :class:`OwnValues`)."""
    env = importer.env
    if not isinstance(env, OwnValues):
        raise TVMBehaviourChanged(
            "TVM's ExportedProgramImporter replaced its env during the import: tvm_probe cannot tell each fx "
            "node's own value from the values in-place converters wrote into its slot")
    return env



def _naming_failures(convert):
    """``convert`` with any exception turned into one line naming its fx node and aten op.

    What TVM declares unsupported (``NotImplementedError``, TVM's ``OpError`` family) is an
    UnsupportedOpError; any other failure is a ModelError: TVM converts this op, yet failed here.
    """
    def wrapped(node, *rest):
        try:
            return convert(node, *rest)
        except ProbeError:
            raise
        except Exception as err:
            import tvm

            kind = UnsupportedOpError if isinstance(err, (NotImplementedError, tvm.error.OpError)) else TVMImportError
            raise kind(f"TVM's PyTorch importer failed on fx node '{node.name}' ({op_type(node)}): "
                       f"{one_line(err)}") from None
    return wrapped



def op_type(node) -> str:
    """The aten op of an fx node (``aten.bmm.default``), or the function name (``getitem``)."""
    target = node.target
    if node.op != "call_function":
        return node.op
    text = str(target)
    return text if text.startswith(("aten.", "prims.")) else getattr(target, "__name__", text)



def _check_ops_supported(program, importer) -> None:
    bad = [n for n in program.graph.nodes
           if n.op == "call_function" and n.target.__name__ not in importer.convert_map]
    if bad:
        others = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UnsupportedOpError(
            f"fx node '{bad[0].name}' calls {op_type(bad[0])}, which TVM's PyTorch importer cannot "
            f"convert{others}: rewrite that part of the model with supported ops")



@dataclass
class _Collected:
    """What :func:`_collect` builds, filled node by node."""

    env: dict
    sources: SourceMap = field(default_factory=SourceMap)
    constants: dict = field(default_factory=dict)
    var_keys: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)

    def tag(self, var, key: str) -> None:
        self.var_keys.setdefault(var, []).append(key)



def _collect(program, mod, values: OwnValues, module=None, root: str = "") -> ImportedModel:
    """Turn each fx node's own value (``values.own``, never the importer's final ``env``, where
    in-place converters overwrote their destinations) into a SourceMap, Var tags and constants
    (``module``: the nn.Module exported, to note modules export never saw called; ``root``: see
    ``import_torch``'s ``names_root``)."""
    keys, weights = node_keys(program, root), placeholder_tensors(program, root)
    targets = _targets(program)
    env = values.own
    out = _Collected(env)
    # a weight's placeholder Var is replaced by a constant (BindParams): identities of it too
    weight_of_var = {env[n]: keys[n] for n in keys if n.op == "placeholder" and keys[n] in weights and n in env}
    bound_to = binding_of_value(mod)
    user = _user_input_names(program)
    for topo, node in enumerate(program.graph.nodes):
        if node not in keys:
            continue
        name = _placeholder_name(node.name, targets[node.name], keys[node]) if node.name in targets else node.name
        value = SourceValue(key=keys[node], node=name, op_type=op_type(node), topo_index=topo,
                            inputs=tuple(keys[a] for a in node.all_input_nodes if a in keys),
                            origin=stack_origin(node.meta.get("stack_trace")))
        if node.op == "placeholder":
            found = _add_placeholder(value, node, node.name in user, weights, out)
        else:
            expr = env.get(node)
            expr = bound_to.get(expr, expr)  # a converter's unbound Call, bound where first used
            found = _add_computed(value, expr, weight_of_var, out)
        if found:
            out.sources.add(value)
    kept = set(mod["main"].params)  # weights kept as parameters (keep_params_as_input) answer by Var too
    for var, key in weight_of_var.items():
        if var in kept:
            out.tag(var, key)
    _add_module_paths(program, keys, out.sources, module, root)
    follow_aliases(mod, out.var_keys)
    _follow_tuple_fields(mod, out.var_keys)
    order = {p.name: i for i, p in enumerate(mod["main"].params)}
    out.inputs.sort(key=lambda s: order.get(s.name, len(order)))
    out.inputs = _with_index_bounds(program, keys, weights, out.inputs)
    out.sources.model_inputs = [s.name for s in out.inputs]
    out.sources.model_outputs = [keys[n] for n in _user_outputs(program) if n in keys]
    overwritten = {keys[n]: (f"fx node '{w.name}' ({op_type(w)}) writes into it in place and TVM's importer "
                             "uses the written value from there on, so nothing needs the value before the write")
                   for n, w in values.overwritten.items() if n in keys}
    return ImportedModel(mod=mod, sources=out.sources, var_keys=out.var_keys, constants=out.constants,
                         inputs=out.inputs, hash_model=lambda: model_hash(program, weights),
                         overwritten=overwritten)



def _with_index_bounds(program, keys: dict, weights: dict, inputs: list[InputSpec]) -> list[InputSpec]:
    """Inputs that index an embedding table directly (``aten.embedding``'s ids) get its row
    count as ``index_bound``, ids from 0 (PyTorch refuses negative ones): TVM's ``take`` does not
    check bounds, and an id past the table reads out of memory (a token id >= the vocabulary
    crashed the process)."""
    bounds: dict[str, tuple[int, str]] = {}
    for node in program.graph.nodes:
        if op_type(node) != "aten.embedding.default" or len(node.args) < 2:
            continue
        table, ids = (keys.get(a) if hasattr(a, "op") else None for a in node.args[:2])
        if table in weights and ids is not None:
            rows = int(weights[table][0].shape[0])
            if ids not in bounds or rows < bounds[ids][0]:
                bounds[ids] = rows, table
    return [replace(s, index_bound=bounds[s.name][0], indexes=bounds[s.name][1], negative_ids=False)
            if s.name in bounds else s for s in inputs]


def _follow_tuple_fields(mod, var_keys: dict) -> None:
    """Give ``v``'s names to ``x`` for every ``v = t[i]`` where ``t = (..., x, ...)`` is bound.

    Some converters build a tuple literal (``max_pool2d_with_indices`` → ``(pool, zeros)``) that
    ``getitem`` reads; the pipeline then replaces ``v`` by ``x`` itself, so ``x`` must answer too.
    """
    from tvm import relax

    tuples = {}
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Tuple):
                tuples[binding.var] = value
            elif (isinstance(value, relax.TupleGetItem) and value.tuple_value in tuples
                  and binding.var in var_keys):
                item = tuples[value.tuple_value].fields[value.index]
                if isinstance(item, relax.Var):
                    var_keys.setdefault(item, []).extend(var_keys[binding.var])



def _add_placeholder(value: SourceValue, node, is_user_input: bool, weights: dict, out: _Collected) -> bool:
    """Fill in a user input, weight or lifted constant; False for other placeholders."""
    if is_user_input:
        var = out.env[node]
        shape, dtype = tensor_info(var)
        value.kind, value.op_type, value.shape, value.dtype = Kind.INPUT, "Input", shape, dtype
        out.tag(var, value.key)
        out.inputs.append(InputSpec(value.key, shape, dtype))
        return True
    if value.key not in weights:
        return False  # tokens, custom objects: nothing to read
    tensor, kind = weights[value.key]
    _set_constant(value, tensor, out, kind)
    value.op_type = "Parameter" if kind is Kind.PARAM else "Constant"
    return True



def _add_computed(value: SourceValue, expr, weight_of_var: dict, out: _Collected) -> bool:
    """Fill in a call_function node's value; False when it has none."""
    from tvm import relax

    if expr in weight_of_var:  # e.g. a clone of a weight: a constant after BindParams
        value.inputs = (weight_of_var[expr],)
        _set_constant(value, out.constants[weight_of_var[expr]], out)
    elif isinstance(expr, relax.Var):
        value.kind = Kind.VALUE
        value.shape, value.dtype = tensor_info(expr)
        out.tag(expr, value.key)
    elif isinstance(expr, relax.Call):  # never bound: the import dropped it
        value.shape, value.dtype = tensor_info(expr)
    else:
        const = const_value(expr) if isinstance(expr, relax.Expr) else _python_scalar(expr)
        if const is None:
            return False
        _set_constant(value, const, out)
    return True



def _set_constant(value: SourceValue, array: np.ndarray, out: _Collected, kind: Kind = Kind.CONSTANT) -> None:
    value.kind, value.shape, value.dtype = kind, array.shape, str(array.dtype)
    out.constants[value.key] = array



def _python_scalar(value) -> np.ndarray | None:
    return np.array(value) if isinstance(value, (bool, int, float)) else None



def node_keys(program, root: str = "") -> dict:
    """fx node → source key, for every node that holds a tensor or scalar.

    User inputs and computed values keep their fx node name; parameters, buffers and lifted
    constants take their state-dict name (``target`` in the graph signature), relative to the
    submodule ``root`` (:func:`_weight_names`).  Nodes without a value of their own are left
    out: ``_assert_*`` checks (value ``None``) and multi-output ops (a tuple; each ``getitem`` on
    it is a value).
    """
    target_of = _targets(program)
    names = _weight_names(program, root)
    keys = {}
    for node in program.graph.nodes:
        if node.op == "placeholder":
            keys[node] = names.get(target_of.get(node.name), node.name)
        elif node.op == "call_function" and _has_value(node):
            keys[node] = node.name
    return keys


def _targets(program) -> dict[str, str]:
    """Placeholder name → state-dict name (``target``), for weights, buffers and constants."""
    return {spec.arg.name: spec.target for spec in program.graph_signature.input_specs
            if getattr(spec.arg, "name", None) and spec.target}


def _weight_names(program, root: str = "") -> dict[str, str]:
    """State-dict name (``target``) → the name its value takes: relative to ``root``
    (:func:`~tvm_probe.importer.module_paths.relative_to`), unless that would be the name of a
    user input or of an fx node (a parameter of the root itself named like an op: kept whole)."""
    targets = _targets(program)
    if not root:
        return {t: t for t in targets.values()}
    taken = {n.name for n in program.graph.nodes if n.name not in targets}
    taken |= {t for t in targets.values() if relative_to(t, root) == t}
    found = {}
    for target in targets.values():
        short = relative_to(target, root)
        found[target] = short if short and (short == target or short not in taken) else target
    return found


def _placeholder_name(name: str, target: str, key: str) -> str:
    """A weight placeholder's fx name for its value's name ``key``: torch names it
    ``p_``/``b_``/``c_`` + ``target`` lowercased, non-alphanumerics as ``_``
    (``p_model_model_norm_weight``); a key relative to a root drops that root there too
    (``p_model_norm_weight``, what exporting the root module itself would name it).  A name of
    another form (torch's suffix against collisions) is kept."""
    if key == target:
        return name
    def mangled(text: str) -> str:
        return re.sub(r"[^a-zA-Z0-9]", "_", text).lower()
    long, short = mangled(target), mangled(key)
    return name[:-len(long)] + short if name.endswith(long) and name != long else name



def _has_value(node) -> bool:
    if "val" in node.meta:
        val = node.meta["val"]
        return val is not None and not isinstance(val, (tuple, list))
    schema = getattr(node.target, "_schema", None)  # no fake value recorded (asserts): ask the op
    return schema is None or len(schema.returns) == 1



def placeholder_tensors(program, root: str = "") -> dict:
    """State-dict name (relative to ``root``, as :func:`node_keys` names it) → (numpy value,
    Kind) for parameters, buffers and lifted constants."""
    import torch

    kinds = torch.export.graph_signature.InputKind
    tensors = lifted_tensors(program)
    names = _weight_names(program, root)
    found = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind in (kinds.PARAMETER, kinds.BUFFER, kinds.CONSTANT_TENSOR) and spec.target in tensors:
            kind = Kind.CONSTANT if spec.kind is kinds.CONSTANT_TENSOR else Kind.PARAM
            found[names.get(spec.target, spec.target)] = (tensors[spec.target].detach().cpu().numpy(), kind)
    return found



def lifted_tensors(program) -> dict:
    """State-dict name → torch tensor for every weight, buffer and constant export lifted.

    Non-persistent buffers are not in ``state_dict``; export keeps them in ``constants``.
    """
    return {**program.state_dict, **program.constants}



def _user_input_names(program) -> set[str]:
    import torch

    user = torch.export.graph_signature.InputKind.USER_INPUT
    return {s.arg.name for s in program.graph_signature.input_specs if s.kind is user}



def _user_outputs(program) -> list:
    """fx nodes the module returns (mutated buffers, which export also returns, left out)."""
    import torch
    from torch.utils._pytree import tree_leaves

    kinds = torch.export.graph_signature.OutputKind
    output = next(n for n in program.graph.nodes if n.op == "output")
    leaves = tree_leaves(output.args[0])
    specs = program.graph_signature.output_specs
    if len(specs) == len(leaves):
        leaves = [leaf for leaf, s in zip(leaves, specs) if s.kind in (kinds.USER_OUTPUT, kinds.LOSS_OUTPUT)]
    return [leaf for leaf in leaves if hasattr(leaf, "op")]



def _add_module_paths(program, keys, sources: SourceMap, module=None, root: str = "") -> None:
    """Give each value the module paths whose output it is (rule: :func:`module_outputs`), and
    note the modules of ``module`` that export never saw called and its containers (so ``get``
    can say why); every path relative to the submodule ``root`` (:func:`relative_to`).

    ``nn_module_stack`` maps one key per module *call* (``L__self___relu@1`` for the second
    call) to ``(path, type)``, so "used outside the module" is judged per call; a module called
    several times answers with its last call.  Users without a value (asserts) do not count.
    """
    def stack(node) -> dict:
        return {k: v[0] for k, v in (node.meta.get("nn_module_stack") or {}).items()}

    values, recorded = [], set()
    for node in program.graph.nodes:
        recorded.update(module_path(raw, root) for raw in stack(node).values())
        if node.op != "call_function" or keys.get(node) not in sources:
            continue
        uses = [None if u.op == "output" else stack(u) for u in node.users
                if u.op == "output" or u in keys or _is_tuple(u)]
        values.append((keys[node], stack(node), uses))
    first = {relative_to(path, root): found for path, found in _first_output_keys(program, keys).items()}
    for key, paths in module_outputs(values, first, root).items():
        sources[key].modules = paths
    if module is not None:
        import torch

        containers = (torch.nn.ModuleList, torch.nn.ModuleDict)  # no forward of their own
        paths = [(relative_to(path, root), isinstance(m, containers)) for path, m in module.named_modules()]
        sources.notes.update(unrecorded_modules([p for p, c in paths if not c], recorded,
                                                containers=[p for p, c in paths if c]))



def _first_output_keys(program, keys) -> dict[str, set[str]]:
    """``{module path: keys}`` of the decomposed nodes that come from the first tensor a module
    returned (recorded by :func:`visible_module_calls`; ``from_node`` leads back to it)."""
    chains = program.graph_module.meta.get(_FIRST_OUTPUTS) or {}
    from_name: dict[str, set[str]] = {}
    for node in program.graph.nodes:
        if node in keys:
            for name in _origins(node.meta.get("from_node") or ()):
                from_name.setdefault(name, set()).add(keys[node])
    found: dict[str, set[str]] = {}
    for path, chain in chains.items():
        hit = next((from_name[name] for name in chain if name in from_name), None)
        if hit:
            found[path] = hit
    return found



def _origins(sources) -> set[str]:
    """Every node name in a ``from_node`` provenance chain."""
    names = set()
    for source in sources:
        names.add(getattr(source, "name", None))
        names |= _origins(getattr(source, "from_node", None) or ())
    return names - {None}



def _is_tuple(node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))



def model_hash(program, weights: dict | None = None) -> str:
    """sha256 of the exported graph's Python code, its weights and input specs.

    The graph code holds every op, node name and static shape argument; the weights are
    hashed by name, dtype, shape and bytes.  Re-exporting the same module gives the same hash.
    """
    digest = hashlib.sha256(program.graph_module.code.encode())
    weights = placeholder_tensors(program) if weights is None else weights
    for name, (value, _) in sorted(weights.items()):
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    for node in program.graph.nodes:
        if node.op == "placeholder" and hasattr(node.meta.get("val"), "shape"):
            digest.update(f"{node.name}:{node.meta['val'].dtype}:{tuple(node.meta['val'].shape)}".encode())
    return digest.hexdigest()



def load_saved_program(path) -> tuple:
    """``(module, example_inputs)`` of a program saved with ``torch.export.save`` (``.pt2``): the
    program's module (its submodules keep their paths) and the inputs it was exported with."""
    torch = require_torch()
    try:
        program = torch.export.load(str(path))
    except Exception as err:  # not a saved program, or saved by another torch
        raise ModelError(f"torch.export.load cannot read '{path}': {one_line(err)}") from None
    args, kwargs = program.example_inputs or ((), {})
    if kwargs or not args:
        raise ModelError(f"'{path}' holds no positional example inputs (kwargs: {sorted(kwargs)}): export it "
                         "with torch.export.export(module, args) and save that")
    return program.module(), tuple(args)


class TorchAdapter(ModelAdapter):
    """PyTorch modules: ``(module, example_inputs)``; in a config, a factory returning them or a
    program saved with ``torch.export.save`` (``.pt2``)."""

    kind, described, reference, config, graph = "torch", "a PyTorch model", "torch", "factory", "torch"

    def load(self, source, shapes=None):
        if str(source).endswith(".pt2"):
            return load_saved_program(source)
        result = load_factory(source, self.kind)()
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ModelError(f"model.torch: {source!r} must return (module, example_inputs), "
                             f"got {type(result).__name__}")
        return result

    def record(self, source, shapes=None) -> dict:
        return {self.kind: source}

    def from_record(self, record):
        return record[self.kind], {}

    def source_graph(self, source, shapes=None) -> SourceGraph:
        return SourceGraph("torch", self.load(source))

    def owns(self, model) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(model, tuple) and len(model) == 2 \
            and isinstance(model[0], torch.nn.Module)

    def import_model(self, model, shapes=None, import_fixes: bool = True, sizes=None) -> ImportedModel:
        return import_torch(*model, import_fixes=import_fixes)

    def default_inputs(self, model, inputs):
        """The factory's example inputs, in input order."""
        return {spec.name: np.asarray(t.detach().cpu().numpy()) for spec, t in zip(inputs, model[1])}
