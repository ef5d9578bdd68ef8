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
from dataclasses import dataclass

import numpy as np

from ..core.dtypes import numpy_dtype

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
        """Every K/V name :func:`read_kv` serves."""
        return [f"{self.name}.layers.{i}.{kv}" for i in range(self.layers) for kv in ("k", "v")]


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


def read_kv(cache, layout: CacheLayout, seq: int = 0) -> dict[str, np.ndarray]:
    """What ``cache`` holds for sequence ``seq`` now: ``{name: (length, kv heads, head dim)}``.

    Read straight into numpy arrays made here (wrapped for TVM through DLPack, no copy):
    ``tvm.runtime.empty`` and ``Tensor.numpy()`` cost ~20 us each, which a decode step that
    reads its cache every call cannot afford."""
    import tvm_ffi

    length, get_kv = _kv_functions()
    n = int(length(cache, seq))
    shape = (layout.layers, n, layout.kv_heads, layout.head_dim)
    if _numpy(layout.dtype) is None:  # (no numpy form to read into: TVM's tensors, copied)
        import tvm

        k, v = tvm.runtime.empty(shape, layout.dtype), tvm.runtime.empty(shape, layout.dtype)
        if n:
            get_kv(cache, seq, 0, n, k, v)
        k, v = k.numpy(), v.numpy()
    else:
        k, v = _aligned(shape, layout.dtype), _aligned(shape, layout.dtype)
        if n:
            get_kv(cache, seq, 0, n, tvm_ffi.from_dlpack(k), tvm_ffi.from_dlpack(v))
    out = {}
    for i in range(layout.layers):
        out[f"{layout.name}.layers.{i}.k"] = k[i]
        out[f"{layout.name}.layers.{i}.v"] = v[i]
    return out


_KV_FUNCTIONS: list = []


def _kv_functions():
    """The paged KV cache's sequence length and debug read builtins (looked up once)."""
    if not _KV_FUNCTIONS:
        import tvm

        _KV_FUNCTIONS[:] = [tvm.get_global_func("vm.builtin.attention_kv_cache_get_sequence_length"),
                            tvm.get_global_func("vm.builtin.attention_kv_cache_debug_get_kv")]
    return _KV_FUNCTIONS


def _aligned(shape: tuple, dtype: str, align: int = 64) -> np.ndarray:
    """An uninitialised array starting on an ``align``-byte boundary (what TVM allocates; its
    kernels may assume it)."""
    dt = _numpy(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    skip = -raw.__array_interface__["data"][0] % align
    return raw[skip:skip + nbytes].view(dt).reshape(shape)


_NUMPY_DTYPES: dict = {}


def _numpy(dtype: str):
    """``numpy_dtype(dtype)``, remembered (it costs microseconds; a decode step reads K/V each call)."""
    if dtype not in _NUMPY_DTYPES:
        _NUMPY_DTYPES[dtype] = numpy_dtype(dtype)
    return _NUMPY_DTYPES[dtype]


def opaque_notes(mod) -> dict[str, str]:
    """``{kernel name: why it has no value}`` for the kernels a KV cache calls from C++."""
    from tvm import relax

    notes = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                if not _creates_cache(b.value):
                    continue
                for callee in relax.analysis.all_global_vars(b.value):
                    notes[callee.name_hint] = (
                        f"{callee.name_hint} runs inside TVM's paged KV cache, called from its C++ (not by a VM "
                        "instruction), so no instrument sees it and its values (RoPE'd q/k, attention scores) "
                        "cannot be captured; the attention output is served (<module>.attention_with_fused_qkv) "
                        "and the cache's K/V after any call (<cache>.layers.<i>.k / .v)")
    return notes


def _creates_cache(value) -> bool:
    """A ``call_pure_packed`` of a ``vm.builtin.*kv_cache_create`` builtin."""
    from tvm import relax

    if not isinstance(value, relax.Call) or not value.args:
        return False
    return str(getattr(value.args[0], "global_symbol", "")).endswith("kv_cache_create")
