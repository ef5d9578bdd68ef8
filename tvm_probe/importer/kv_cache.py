"""TVM's paged KV cache (``relax.frontend.nn.llm.kv_cache``) as seen by a probe.

What can be seen, and what cannot:

* Each layer's attention is one VM call, ``vm.builtin.attention_kv_cache_attention_with_fused_qkv``
  (destination passing: its output is the last argument), so the kernel map makes it a call
  site like any kernel and its output is captured: the attention output of every layer.
* The cache's own kernels (RoPE, the attention itself, appending K/V, page copies) are called
  from the cache's C++, never through a VM Call instruction: no instrument sees them, so the
  values inside (rotated q/k, attention scores) cannot be captured.  Their names answer with
  that note (:func:`opaque_notes`).
* What the cache holds is read after a call with ``vm.builtin.attention_kv_cache_debug_get_kv``
  (:func:`read_kv`): ``<cache parameter>.layers.<i>.k`` / ``.v``, shape
  ``(sequence length, kv heads, head dim)`` of sequence 0.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..core.dtypes import numpy_dtype
from ..core.memory import Chunks

ATTENTION = "vm.builtin.attention_kv_cache_attention_with_fused_qkv"


@dataclass(frozen=True)
class CacheLayout:
    """How a function uses one KV cache parameter.

    Attributes:
        param: position of the cache among the function's parameters.
        name: the parameter's name (K/V names start with it).
        layers: number of layers (one past the highest layer id the function attends with).
        kv_heads, head_dim, dtype: of the K/V the cache holds (read off the fused qkv argument).
    """

    param: int
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    def names(self) -> list[str]:
        """Every K/V name :func:`read_kv` serves: each layer's K, then its V."""
        return list(self.places)

    @cached_property
    def places(self) -> dict[str, tuple[int, int]]:
        """``{K/V name: (0 for K, 1 for V; layer)}``."""
        return {f"{self.name}.layers.{i}.{kv}": (j, i) for i in range(self.layers) for j, kv in enumerate("kv")}


def cache_layouts(func) -> list[CacheLayout]:
    """The KV caches ``func`` attends with (from its ``attention_with_fused_qkv`` calls)."""
    from tvm import relax

    found: dict[int, dict] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            value = b.value
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.call_dps_packed"):
                continue
            if str(getattr(value.args[0], "global_symbol", "")) != ATTENTION:
                continue
            cache, layer, _, qkv = value.args[1].fields
            pos = next((i for i, p in enumerate(func.params) if p.same_as(cache)), None)
            if pos is None:
                continue
            heads = int(b.var.ty.shape.values[1])
            total, dim = (int(d) for d in qkv.ty.shape.values[1:3])
            entry = found.setdefault(pos, {"layers": 0, "kv_heads": (total - heads) // 2, "head_dim": dim,
                                           "dtype": str(qkv.ty.dtype)})
            entry["layers"] = max(entry["layers"], int(layer.value) + 1)
    return [CacheLayout(param=p, name=func.params[p].name, **e) for p, e in found.items()]


def read_kv(cache, layout: CacheLayout, seq: int = 0) -> "KVContents":
    """What ``cache`` holds for sequence ``seq`` now: ``{name: (length, kv heads, head dim)}``.

    Read straight into numpy arrays cut from a chunk made once (wrapped for TVM through DLPack,
    no copy): ``tvm.runtime.empty`` and ``Tensor.numpy()`` cost ~20 us each, and an array of its
    own, aligned, ~2 us, which a decode step that reads its cache every call cannot afford."""
    length, get_kv, from_dlpack = _kv_functions()
    n = int(length(cache, seq))
    shape = (layout.layers, n, layout.kv_heads, layout.head_dim)
    dtype = _numpy(layout.dtype)
    if dtype is None:  # (no numpy form to read into: TVM's tensors, copied)
        import tvm

        k, v = tvm.runtime.empty(shape, layout.dtype), tvm.runtime.empty(shape, layout.dtype)
        if n:
            get_kv(cache, seq, 0, n, k, v)
        return KVContents(layout, k.numpy(), v.numpy())
    nbytes = math.prod(shape) * dtype.itemsize
    k = _BLOCKS.take(nbytes)[0].view(dtype).reshape(shape)
    v = _BLOCKS.take(nbytes)[0].view(dtype).reshape(shape)
    if n:
        get_kv(cache, seq, 0, n, from_dlpack(k), from_dlpack(v))
    return KVContents(layout, k, v)


class KVContents(Mapping):
    """What :func:`read_kv` read: ``{name: (length, kv heads, head dim)}``, each a view of the
    K or V of every layer, made when read (a decode step reads its cache at every call)."""

    def __init__(self, layout: CacheLayout, k: np.ndarray, v: np.ndarray):
        self._places, self._kv = layout.places, (k, v)

    def __getitem__(self, name: str) -> np.ndarray:
        which, layer = self._places[name]
        return self._kv[which][layer]

    def __contains__(self, name) -> bool:
        return name in self._places

    def __iter__(self):
        return iter(self._places)

    def __len__(self) -> int:
        return len(self._places)


_KV_FUNCTIONS: list = []
_BLOCKS = Chunks(1 << 20)  # (what every call's K/V is read into)


def _kv_functions():
    """The paged KV cache's sequence length and debug read builtins, and DLPack's import (looked
    up once)."""
    if not _KV_FUNCTIONS:
        import tvm
        import tvm_ffi

        _KV_FUNCTIONS[:] = [tvm.get_global_func("vm.builtin.attention_kv_cache_get_sequence_length"),
                            tvm.get_global_func("vm.builtin.attention_kv_cache_debug_get_kv"),
                            tvm_ffi.from_dlpack]
    return _KV_FUNCTIONS


_NUMPY_DTYPES: dict = {}


def _numpy(dtype: str):
    """``numpy_dtype(dtype)``, remembered (it costs microseconds; a decode step reads K/V each call)."""
    if dtype not in _NUMPY_DTYPES:
        _NUMPY_DTYPES[dtype] = numpy_dtype(dtype)
    return _NUMPY_DTYPES[dtype]


def opaque_notes(mod, added=(), kv: str | None = None, attention: str | None = None) -> dict[str, str]:
    """``{kernel name: why it has no value}`` for the kernels a KV cache calls from C++: TIR
    kernels inside TVM's paged KV cache, no source values.

    Args:
        mod: the module whose functions create caches (as imported, or as built: a pipeline may
            have swapped the creator, as MLC-LLM's ``DispatchKVCacheCreation`` does).
        added: names of the functions the pipeline added (not in the module imported): a kernel
            of a cache one of them creates says so.
        kv: the name of a K the caches hold, to read instead (``paged_kv_cache.layers.0.k``);
            by default the first that ``mod``'s functions attend with, else its pattern.
        attention: a module path of an attention output to read instead
            (``model.layers.0.self_attn.attention_with_fused_qkv``); by default its pattern.
    """
    from tvm import relax

    kv = kv or next(iter(cache_names(mod)), "<cache>.layers.<i>.k")
    read = f"{kv} / .v (the cache's K/V after a call)"
    attention = attention or "<module>.attention_with_fused_qkv"
    notes = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        creator = gv.name_hint
        made = f"{creator}, a function the pipeline added" if creator in added else creator
        for block in func.body.blocks:
            for b in block.bindings:
                if not _creates_cache(b.value):
                    continue
                for callee in relax.analysis.all_global_vars(b.value):
                    notes[callee.name_hint] = (
                        f"{callee.name_hint} is a TIR kernel inside TVM's paged KV cache, not a source value: the "
                        f"cache (created by {made}) calls it from its C++, not by a VM instruction, so no "
                        "instrument sees it and its values (RoPE'd q/k, attention scores) cannot be captured; read "
                        f"instead {read} or the attention output ({attention})")
    return notes


def cache_names(mod) -> list[str]:
    """The K/V names (``paged_kv_cache.layers.0.k``...) of the caches the functions of ``mod``
    attend with, each once, in the order of the functions."""
    from tvm import relax

    return list(dict.fromkeys(n for func in mod.functions.values() if isinstance(func, relax.Function)
                              for layout in cache_layouts(func) for n in layout.names()))


def _creates_cache(value) -> bool:
    """A call of a ``vm.builtin.*kv_cache_create`` builtin: ``call_pure_packed`` (a module as
    imported) or the direct call lowering leaves of it (a module as built)."""
    from tvm import relax

    if not isinstance(value, relax.Call):
        return False
    if isinstance(value.op, relax.ExternFunc):
        return str(value.op.global_symbol).endswith("kv_cache_create")
    if not value.args:
        return False
    return str(getattr(value.args[0], "global_symbol", "")).endswith("kv_cache_create")
