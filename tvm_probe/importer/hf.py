"""Hugging Face causal LMs exported with an explicit, functional KV cache: prefill and decode (issue 24).

transformers' own caches are Python objects that mutate themselves; ``torch.export`` either
cannot trace them or records buffer mutations that TVM's importer drops (see
:func:`tvm_probe.importer.torch.check_no_mutations`).  tvm_probe therefore exports the model
through ``CacheStep`` (:func:`cache_step_class`), whose
``forward(input_ids, position_ids, k0, v0, k1, v1, ...)`` returns
``(logits, k0', v0', ...)``: the cache is plain tensors in and out, nothing is mutated, and the
compiled program is exactly the model's computation.  Two programs come from it:

* ``prefill``: the prompt, with an empty past: 4-D tensors ``(batch, kv_heads, 0, head_dim)``
  (transformers' ``DynamicLayer.lazy_initialization`` would concatenate a 1-D empty tensor with
  the 4-D keys, which TVM's concat refuses; ``CacheStep`` fills the layers itself);
* ``decode``: one token, with a past whose length is a symbolic dimension (``Dim``), so one
  executable serves every step.

Both are imported with the usual tagging (fx node names, module paths, parameter names) and
merged into one module of two functions (:func:`import_hf`), which ``Probe.from_hf`` compiles
once (the multi-function API of :mod:`tvm_probe.probe.calls`).

Names are the user's model's own, as its ``named_modules()`` and ``named_parameters()`` spell
them: ``model.layers.0.self_attn``, ``lm_head``, ``model.embed_tokens.weight`` (GPT-2:
``transformer.h.0``).  torch records the wrapper's paths (``CacheStep`` holds the model as
``self.model``: ``model.model.layers.0``, ``model.lm_head.weight``); the import takes every
name relative to that attribute (``import_torch(..., names_root=WRAPPED)``, the one rule being
:func:`tvm_probe.importer.module_paths.relative_to`), so the wrapper's prefix names nothing.
The model itself (path ``''`` in ``named_modules()``) names nothing either: its output, the
logits, is the program's first output (``probe.call`` returns it) and answers to ``lm_head``
and to its fx node name.  Generation is :mod:`tvm_probe.probe.generate`'s; the eager
reference and the comparison are :mod:`tvm_probe.llm`'s.

torch and transformers are imported lazily.
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.errors import InputError, ModelError, ProbeError
from ..core.install import install_hint
from .adapter import ImportedFunctions, ModelAdapter, load_factory
from .quantize import (QuantSpec, check_weights_found, quant_spec, quantize_function, quantize_weights,
                       quantized_modules)
from .relax import FunctionModel, function_view
from .torch import import_torch
from .torch_export import require_torch

#: The two functions of the executable.
PREFILL, DECODE = "prefill", "decode"

#: The attribute of :class:`CacheStep` that holds the user's model: the root of every name.
WRAPPED = "model"


def _torch():
    return require_torch()


def _cache_class():
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        raise ModelError(f"transformers is not installed: {install_hint('hf')}") from None
    return DynamicCache, DynamicLayer


def make_cache_step(model):
    """A :class:`CacheStep` around ``model`` (a transformers ``*ForCausalLM``), checked."""
    torch = _torch()
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ModelError(f"from_hf takes a transformers *ForCausalLM model, not a {type(model).__name__}")
    layers = getattr(model.config.get_text_config(decoder=True), "num_hidden_layers", None)
    if not layers:
        raise ModelError(f"{type(model).__name__}'s config has no num_hidden_layers: is it a causal LM?")
    return cache_step_class()(model.eval(), layers)


_CACHE_STEP = []


def cache_step_class():
    """:class:`CacheStep`, defined on first use (it subclasses ``torch.nn.Module``)."""
    if not _CACHE_STEP:
        torch = _torch()

        class CacheStep(torch.nn.Module):
            """``forward(input_ids, position_ids, *past) → (logits, *present)`` of a causal LM.

            ``past`` is ``k0, v0, k1, v1, ...``: per layer, keys and values ``(batch, kv_heads,
            past_len, head_dim)``; ``present`` the same with the new tokens appended.  The wrapped
            model is ``self.model`` (:data:`WRAPPED`): torch records ``model.model.layers.0``,
            which the import names ``model.layers.0``, as the model does.
            """

            def __init__(self, model, layers: int):
                super().__init__()
                self.model, self.layers = model, layers
                assert getattr(self, WRAPPED) is model

            def forward(self, input_ids, position_ids, *past):
                cache = _filled_cache(past, self.layers)
                out = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True)
                present = [t for layer in _returned_cache(out).layers for t in (layer.keys, layer.values)]
                return (out.logits, *present)

        _CACHE_STEP.append(CacheStep)
    return _CACHE_STEP[0]


def _returned_cache(out):
    """The cache a transformers output carries (``cache``; ``past_key_values`` before 5.x)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _filled_cache(past: Sequence, layers: int):
    """A DynamicCache whose layers already hold ``past`` (4-D, possibly of length 0)."""
    DynamicCache, DynamicLayer = _cache_class()
    if len(past) != 2 * layers:
        raise InputError(f"the cache has {len(past)} tensors; this model needs {2 * layers} (keys and values "
                         f"of {layers} layers)")
    cache = DynamicCache()
    cache.layers = []
    for i in range(layers):
        layer = DynamicLayer()
        layer.keys, layer.values = past[2 * i], past[2 * i + 1]
        layer.device, layer.dtype, layer.is_initialized = layer.keys.device, layer.keys.dtype, True
        cache.layers.append(layer)
    return cache


@dataclass(frozen=True)
class CacheShape:
    """The KV cache layout of a model: per layer one K and one V of (batch, kv_heads, len, head_dim)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: Any

    def empty(self, batch: int = 1) -> list:
        """The 4-D, zero-length past of a prefill."""
        torch = _torch()
        return [torch.zeros(batch, self.kv_heads, 0, self.head_dim, dtype=self.dtype)
                for _ in range(2 * self.layers)]

    def names(self) -> list[str]:
        """Names of the cache tensors, in argument order: ``k0, v0, k1, v1, ...``."""
        return [f"{kv}{i}" for i in range(self.layers) for kv in "kv"]


def cache_shape(step) -> CacheShape:
    """Measured, not guessed from the config: one eager token through ``step``."""
    torch = _torch()
    with torch.no_grad():
        out = step.model(input_ids=torch.zeros(1, 1, dtype=torch.long), use_cache=True)
    keys = _returned_cache(out).layers[0].keys
    return CacheShape(layers=step.layers, kv_heads=int(keys.shape[1]), head_dim=int(keys.shape[3]), dtype=keys.dtype)


def positions(start: int, count: int, batch: int):
    """``position_ids`` of ``count`` tokens from ``start``, for each of ``batch`` sequences."""
    torch = _torch()
    return torch.arange(start, start + count, dtype=torch.long).unsqueeze(0).expand(batch, count).contiguous()


def example_decode(shape: CacheShape, batch: int, past: int) -> tuple:
    """Arguments of a decode step (one token) after a past of ``past`` tokens, seeded random."""
    torch = _torch()
    gen = torch.Generator().manual_seed(0)
    kv = [torch.randn(batch, shape.kv_heads, past, shape.head_dim, generator=gen, dtype=shape.dtype)
          for _ in range(2 * shape.layers)]
    return (torch.zeros(batch, 1, dtype=torch.long), positions(past, 1, batch), *kv)


def import_prefill(step, shape: CacheShape, prompt_len: int | None = None, batch: int = 1,
                   import_fixes: bool = True, keep_params_as_input: bool = False):
    """The prefill program, imported with an empty 4-D past: for prompts of ``prompt_len``
    tokens, or (None) of any length (a symbolic dimension); ``keep_params_as_input``: as
    :func:`~tvm_probe.importer.torch.import_torch` takes it."""
    torch = _torch()
    length = 4 if prompt_len is None else prompt_len
    args = (torch.zeros(batch, length, dtype=torch.long), positions(0, length, batch), *shape.empty(batch))
    dynamic = None
    if prompt_len is None:
        prompt = torch.export.Dim.DYNAMIC
        dynamic = ({1: prompt}, {1: prompt}, tuple(None for _ in range(2 * shape.layers)))
    return import_torch(step, args, import_fixes=import_fixes, dynamic_shapes=dynamic, names_root=WRAPPED,
                        keep_params_as_input=keep_params_as_input)


def import_decode(step, shape: CacheShape, max_len: int, batch: int = 1, import_fixes: bool = True,
                  keep_params_as_input: bool = False):
    """The decode program, imported with a symbolic past length ``1 <= past < max_len``."""
    torch = _torch()
    past = torch.export.Dim.DYNAMIC  # named ranges trip the model's own guards; export infers them
    args = example_decode(shape, batch, past=2)
    dynamic = (None, None, tuple({2: past} for _ in range(2 * shape.layers)))  # *past is one tuple
    return import_torch(step, args, import_fixes=import_fixes, dynamic_shapes=dynamic, names_root=WRAPPED,
                        keep_params_as_input=keep_params_as_input)


@dataclass
class HFModel:
    """What a probe made by ``Probe.from_hf`` knows of its model (``probe.hf``); ``generations``:
    each ``probe.generate``'s :class:`~tvm_probe.probe.generate.Generation`, in order.

    ``step`` wraps the user's model as given (the default eager reference); ``shape`` is the
    cache layout of the build.  With ``quantize=``: ``quantize`` is the
    :class:`~tvm_probe.importer.quantize.QuantSpec`, ``quantized`` the module paths quantized,
    and ``reference_shape`` the cache layout of ``step`` where the build computes in another
    dtype (q4f16_1)."""

    step: Any
    shape: CacheShape
    max_len: int
    generations: list = field(default_factory=list)
    quantize: QuantSpec | None = None
    quantized: tuple = ()
    reference_shape: CacheShape | None = None


def import_hf(model, max_len: int = 64, import_fixes: bool = True, quantize=None) -> ImportedFunctions:
    """Prefill and decode of ``model`` imported, merged into one module of two functions (see
    module doc); ``quantize``: weight-only quantization (:mod:`tvm_probe.importer.quantize`)."""
    if not isinstance(max_len, int) or max_len < 2:
        raise InputError(f"max_len={max_len!r}: give the longest prompt + generated length, an int >= 2")
    spec = quant_spec(quantize)
    step = make_cache_step(model)
    if spec is not None:
        quantized_modules(model, spec)  # a bad skip= or group size fails now, not after the export
    built = step
    if spec is not None and spec.scale_dtype == "float16":  # computes in fp16, as deployed: a copy
        built = make_cache_step(copy.deepcopy(model).to(_torch().float16))
    shape = cache_shape(built)
    kept = spec is not None
    imports = {PREFILL: import_prefill(built, shape, None, import_fixes=import_fixes, keep_params_as_input=kept),
               DECODE: import_decode(built, shape, max_len, import_fixes=import_fixes, keep_params_as_input=kept)}
    added = {name: [] for name in imports}
    hf = HFModel(step=step, shape=shape, max_len=max_len)
    if spec is not None:
        weights = quantize_weights(getattr(built, WRAPPED), spec)
        for name, imp in imports.items():
            check_weights_found(weights, imp.sources.values)
            rewritten = quantize_function(imp, weights, spec)
            imp.mod, added[name] = rewritten.mod, rewritten.params
        hf.quantize, hf.quantized = spec, tuple(w.path for w in weights.values())
        hf.reference_shape = cache_shape(step) if built is not step else None
    merged = merge_functions(imports)
    models = {name: _function_model(merged, name, imp, added[name]) for name, imp in imports.items()}
    return ImportedFunctions(mod=merged, models=models, hf=hf)


def _function_model(merged, name: str, imp, added: list) -> FunctionModel:
    """One function of the merged module; ``added``: ``(name, InputSpec, array)`` of the weights
    the probe holds (the quantized ones), after the caller's inputs."""
    inputs = list(imp.inputs) + [spec for _, spec, _ in added]
    held = {len(imp.inputs) + j: array for j, (_, _, array) in enumerate(added)}
    return FunctionModel(mod=function_view(merged, name), sources=imp.sources, var_keys=imp.var_keys,
                         constants=imp.constants, inputs=inputs, hash_model=imp.hash_model, fixes=imp.fixes,
                         unfixed=imp.unfixed, function=name, params=[(s.name, s) for s in inputs], held=held)


def merge_functions(imports: dict):
    """One IRModule whose functions are each import's ``main`` under its own name.

    ``with_attr`` copies the function node only: its parameters and bindings are the same
    objects, so the Var tags of each import still hold.
    """
    import tvm

    funcs = {}
    for name, imp in imports.items():
        others = [gv.name_hint for gv in imp.mod.functions if gv.name_hint != "main"]
        if others:  # a torch import has only main; anything else would need renaming too
            raise ProbeError(f"the {name} import has functions besides main ({', '.join(others)})")
        funcs[tvm.ir.GlobalVar(name)] = imp.mod["main"].with_attr("global_symbol", name)
    return tvm.IRModule(funcs)


class HFAdapter(ModelAdapter):
    """transformers ``*ForCausalLM`` models: prefill and decode with a functional KV cache; in a
    config, a factory returning the model (``model: {hf: FILE.py:FUNCTION}`` with ``generate:``).
    Its values are a PyTorch model's: the default reference is eager PyTorch (a generation is
    compared with :func:`tvm_probe.llm.reference_generate`, the same cache in eager mode)."""

    kind, described, reference, config, functions = "hf", "a transformers causal LM", "torch", "factory", True

    def load(self, source, shapes=None):
        return load_factory(source, self.kind)()

    def record(self, source, shapes=None) -> dict:
        return {self.kind: source}

    def owns(self, model) -> bool:
        transformers = sys.modules.get("transformers")
        return transformers is not None and isinstance(model, transformers.PreTrainedModel)

    def import_functions(self, model, max_len: int = 64, import_fixes: bool = True,
                         quantize=None) -> ImportedFunctions:
        return import_hf(model, max_len, import_fixes, quantize)
