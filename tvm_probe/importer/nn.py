"""``tvm.relax.frontend.nn`` models: values by module path, parameters by dotted name.

``export_tvm`` names bindings by op (``matmul``, ``add1``) and keeps no module paths, so while
it exports we wrap ``nn.Module.__call__``: each submodule call records its dotted path
(``model.layers.0.self_attn``) and the Relax Var its output is bound to — a binding of the
function being exported.  A module called several times in one function answers with its last
call (the rule :mod:`.module_paths` uses for PyTorch); a parent whose output is its last
child's answers with the same value (both names are kept).  Parameters answer to the dotted
names ``export_tvm`` returns (``model.layers.0.mlp.down_proj.weight``), whether passed one by
one (``param_mode="plain"``) or as one tuple (``"packed"``, what MLC-LLM deploys).

Everything else is :mod:`.relax`'s: one :class:`~.relax.FunctionModel` per exported function.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Mapping

import numpy as np

from ..core.errors import ModelError, one_line
from .adapter import ImportedFunctions, ModelAdapter
from .relax import FunctionModel, import_relax, public_functions, with_module_paths
from .tensor_cache import load_tensor_cache


def import_nn(module, spec, params: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, FunctionModel]]:
    """Export ``module`` with ``spec``; return the IRModule and a FunctionModel per function.

    Raises:
        ModelError: ``export_tvm`` failed, or ``params`` names weights the model lacks, or (packed)
            leaves some out.
    """
    from tvm.relax.frontend import nn

    if not isinstance(module, nn.Module):
        raise ModelError(f"cannot export a {type(module).__name__}: pass a tvm.relax.frontend.nn.Module")
    if isinstance(params, (str, os.PathLike)):  # MLC's weights on disk
        params = _fitting(load_tensor_cache(params), module, params)
    params = _check_params(dict(params or {}), [n for n, _ in module.named_parameters()])
    paths = _module_paths(module)
    calls: list[tuple[str, Any]] = []
    with _recording(paths, calls):
        try:
            mod, named = module.export_tvm(spec=spec)
        except ModelError:
            raise
        except Exception as err:
            raise ModelError(f"export_tvm failed on {type(module).__name__}: {one_line(err)}") from None
    names = [n for n, _ in named]
    models = {}
    for function in public_functions(mod):
        func = mod[function]
        num_input = int(func.attrs["num_input"]) if func.attrs is not None and "num_input" in func.attrs \
            else len(func.params)
        extra = list(func.params)[num_input:]
        param_names, item_names, given = {}, {}, {}
        if len(extra) == 1 and hasattr(extra[0].ty, "fields") and len(extra[0].ty.fields) == len(names):
            item_names[num_input] = names  # packed: one tuple of every weight
            if params:
                given[extra[0].name] = [params[n] for n in names]
        elif len(extra) == len(names):
            param_names = {num_input + j: n for j, n in enumerate(names)}
            given = {n: params[n] for n in names if n in params}
        model = import_relax(mod, given, function, param_names=param_names, item_names=item_names)
        models[function] = with_module_paths(model, _last_per_function(calls, model))
    return mod, models


def _fitting(weights: dict, module, path) -> dict:
    """The weights of a tensor cache, each checked against the parameter of ``module`` it fills:
    every parameter is there, with its shape and dtype."""
    for name, param in module.named_parameters():
        if name not in weights:
            raise ModelError(f"params: the tensor cache '{path}' has no weight '{name}' (it has "
                             f"{len(weights)} weights, e.g. {', '.join(list(weights)[:3])})")
        want = (tuple(param.shape), str(param.dtype))
        got = (weights[name].shape, str(weights[name].dtype))
        if all(isinstance(d, int) for d in want[0]) and got != want:
            raise ModelError(f"params: '{name}' in the tensor cache '{path}' is {got[1]} {list(got[0])}; the model's "
                             f"parameter is {want[1]} {list(want[0])}")
    return weights


def _check_params(params: dict, names: list[str]) -> dict:
    unknown = [n for n in params if n not in names]
    if unknown:
        raise ModelError(f"params has weights the model does not: {', '.join(map(repr, unknown[:5]))} "
                         f"(its parameters are {', '.join(names[:4])}...)")
    return {n: np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v for n, v in params.items()}


def _module_paths(root) -> dict[int, str]:
    """``id(submodule) → dotted path`` for every submodule (ModuleList items by index)."""
    from tvm.relax.frontend import nn

    found: dict[int, str] = {}

    def walk(module, prefix: str) -> None:
        if id(module) in found:
            return
        found[id(module)] = prefix
        children = (enumerate(module.modules) if isinstance(module, nn.ModuleList)
                    else vars(module).items())
        for name, child in children:
            if isinstance(child, nn.Module):
                walk(child, f"{prefix}.{name}" if prefix else str(name))

    walk(root, "")
    return found


@contextlib.contextmanager
def _recording(paths: dict[int, str], calls: list):
    """Wrap ``nn.Module.__call__`` while exporting: ``calls`` gets ``(path, output Var)``.

    The paged KV cache's ``attention_with_fused_qkv`` is wrapped too: its output (the layer's
    attention, before the output projection) answers to ``<calling module>.attention_with_fused_qkv``.
    """
    from tvm import relax
    from tvm.relax.frontend import nn
    from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache

    original, attention = nn.Module.__call__, PagedKVCache.attention_with_fused_qkv
    stack: list[str] = []

    def record(path, out):
        expr = getattr(out, "_expr", None)
        if path and isinstance(expr, relax.Var):
            calls.append((path, expr))

    def recording_call(self, *args, **kwargs):
        stack.append(paths.get(id(self), ""))
        try:
            out = original(self, *args, **kwargs)
        finally:
            stack.pop()
        record(paths.get(id(self)), out)
        return out

    def recording_attention(self, *args, **kwargs):
        out = attention(self, *args, **kwargs)
        if stack and stack[-1]:
            record(f"{stack[-1]}.attention_with_fused_qkv", out)
        return out

    nn.Module.__call__ = recording_call
    PagedKVCache.attention_with_fused_qkv = recording_attention
    try:
        yield
    finally:
        nn.Module.__call__ = original
        PagedKVCache.attention_with_fused_qkv = attention


def _last_per_function(calls: list, model: FunctionModel) -> dict[str, Any]:
    """``{path: Var}``: each module's last recorded call among this function's bindings."""
    last = {}
    for path, var in calls:
        if var in model.var_keys:
            last[path] = var
    return last


#: the config entries MLC-LLM's runtime serves a model with (``mlc-chat-config.json``'s names)
SERVING_KEYS = ("context_window_size", "max_position_embeddings", "max_sequence_length", "prefill_chunk_size",
                "max_batch_size", "sliding_window_size", "attention_sink_size", "vocab_size")


def serving_config(module) -> dict[str, int]:
    """The :data:`SERVING_KEYS` the module's ``config`` (else the module itself, as MLC's models
    keep ``vocab_size``) gives as integers: what generation makes the KV cache with."""
    config = getattr(module, "config", None)
    found = {}
    for key in SERVING_KEYS:
        value = getattr(config, key, None) if config is not None else None
        value = getattr(module, key, None) if value is None else value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            found[key] = int(value)
    return found


class NNAdapter(ModelAdapter):
    """``tvm.relax.frontend.nn`` modules, exported with ``export_tvm``: values by module path."""

    kind, described, functions = "nn", "a tvm.relax.frontend.nn module", True

    def owns(self, model) -> bool:
        nn = sys.modules.get("tvm.relax.frontend.nn")
        return nn is not None and isinstance(model, nn.Module)

    def import_functions(self, model, spec=None, params: Mapping[str, Any] | None = None) -> ImportedFunctions:
        """Every function ``export_tvm(spec=spec)`` makes of the module ``model`` (see :func:`import_nn`)."""
        mod, models = import_nn(model, spec, params)
        return ImportedFunctions(mod=mod, models=models, serving=serving_config(model))
