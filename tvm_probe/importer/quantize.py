"""Weight-only group quantization of an exported LLM, the scheme MLC-LLM deploys (issue 34).

``Probe.from_hf(model, quantize="q4f32_1" | "q4f16_1" | QuantSpec(...))`` quantizes every
``nn.Linear`` weight (``lm_head`` included) and the token embedding, symmetric, grouped along
the input (reduction) dimension, weight layout ``(out, in)``::

    max_int = 2^(bits-1) - 1
    scale   = max|w_group| / max_int                       (one per group of ``group_size``)
    q       = clip(round(w / scale) + max_int, 0, 2 * max_int)
    w'      = (q - max_int) * scale

and packs ``32 // bits`` values into each uint32, value ``i`` of a word in bits ``[i*bits,
(i+1)*bits)``.  The packed weights are parameters ``<module path>.q_weight`` (uint32, ``(out,
in * bits / 32)``) and ``<module path>.q_scale`` (``(out, in / group_size)``) of the compiled
functions, held by the probe and passed at every call as MLC passes its weights; the module
unpacks and scales them *in its own kernels*: :func:`quantize_function` rewrites the imported
Relax function so that each quantized weight, once a parameter, is computed from those two by
Relax ops (shift, mask, cast, subtract, multiply) ahead of every use.  The rest of the module
is the float import unchanged (same Vars, so every name the float build answers still
answers), and the weight's own name (``model.layers.0.mlp.down_proj.weight``) now names the
dequantized weight TVM computed.  A group of zeros gets scale 0 and ``q = max_int``.

``QuantSpec(float_switch=True)`` is a layout for analysis, not for deployment: each quantized
weight also keeps its float value (``<path>.float_weight``) and a boolean scalar
``<path>.keep_float`` that picks it instead of the dequantized one (``where``: exact either
way), so one build serves every mix of quantized and float modules by swapping parameters
(``Probe.set_params``); the 4-bit format itself cannot reproduce a float weight (32 weights
share one scale and 15 levels), hence the switch.  ``tvm_probe.tools.quantization.sensitivity_hf``
builds it.

Where the scheme is MLC's and where it is not: MLC's ``GroupQuantize`` dequantizes the
embedding's gathered rows only; here the whole table is dequantized, then gathered (the same
values, more work per call).  A weight shared by two modules (tied embeddings) is quantized
once, under the first path ``named_modules()`` gives.

torch is imported lazily (the module list of a model); TVM where the module is rewritten.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np

from ..core.errors import InputError, ModelError
from ..core.sources import Kind, SourceValue
from .model import InputSpec

_SCALE_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class QuantSpec:
    """How weights are quantized (see the module docstring for the formulas).

    Attributes:
        bits: 4 or 8 (``32 // bits`` values packed per uint32).
        group_size: weights per scale, along the input dimension; a multiple of ``32 // bits``
            that divides every quantized weight's input dimension.
        scale_dtype: ``"float32"`` or ``"float16"``: the scales' dtype and the dtype the model
            computes in (activations too, as MLC's q4f16 deploys).
        skip: module paths (``named_modules()`` spelling) left in float.
        float_switch: also keep each float weight and a switch choosing it (analysis only).
        name: the preset's name (``q4f16_1``), or '' for a spec written out.
    """

    bits: int = 4
    group_size: int = 32
    scale_dtype: str = "float32"
    skip: tuple = ()
    float_switch: bool = False
    name: str = ""

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise InputError(f"QuantSpec(bits={self.bits!r}): give 4 or 8")
        per = 32 // self.bits
        if not isinstance(self.group_size, int) or self.group_size <= 0 or self.group_size % per:
            raise InputError(f"QuantSpec(group_size={self.group_size!r}): give a positive multiple of {per} "
                             f"({per} {self.bits}-bit values share a uint32)")
        if self.scale_dtype not in _SCALE_DTYPES:
            raise InputError(f"QuantSpec(scale_dtype={self.scale_dtype!r}): give one of {', '.join(_SCALE_DTYPES)}")
        if isinstance(self.skip, str) or not all(isinstance(s, str) for s in self.skip):
            raise InputError(f"QuantSpec(skip={self.skip!r}): give a list of module paths")
        object.__setattr__(self, "skip", tuple(self.skip))

    @property
    def max_int(self) -> int:
        """``2^(bits-1) - 1``: the zero point, and the largest magnitude a weight takes in steps."""
        return 2 ** (self.bits - 1) - 1

    @property
    def per_word(self) -> int:
        """Values packed in one uint32."""
        return 32 // self.bits

    def __str__(self) -> str:
        return self.name or (f"QuantSpec(bits={self.bits}, group_size={self.group_size}, "
                             f"scale_dtype={self.scale_dtype!r})")


#: The presets ``quantize=`` takes by name (MLC-LLM's q4f32_1 and q4f16_1).
PRESETS = {"q4f16_1": QuantSpec(4, 32, "float16", name="q4f16_1"),
           "q4f32_1": QuantSpec(4, 32, "float32", name="q4f32_1")}


def quant_spec(quantize) -> QuantSpec | None:
    """What ``quantize=`` asks: None (no quantization), a preset's name, or a :class:`QuantSpec`."""
    if quantize is None or isinstance(quantize, QuantSpec):
        return quantize
    if isinstance(quantize, str) and quantize in PRESETS:
        return PRESETS[quantize]
    raise InputError(f"quantize={quantize!r} is no quantization preset: give one of {', '.join(sorted(PRESETS))}, "
                     "or a QuantSpec(bits=4|8, group_size=32, scale_dtype='float32'|'float16', skip=[module paths])")


# -- the numbers ----------------------------------------------------------------------------------
def quantize_weight(weight: np.ndarray, spec: QuantSpec) -> tuple[np.ndarray, np.ndarray]:
    """``(q_weight, q_scale)`` of a 2-D weight ``(out, in)``: packed uint32 ``(out, in / per_word)``
    and scales ``(out, in / group_size)`` in ``spec.scale_dtype``."""
    w = np.asarray(weight, np.float32)
    rows, cols = w.shape
    groups = w.reshape(rows, cols // spec.group_size, spec.group_size)
    scale = (np.abs(groups).max(axis=-1) / np.float32(spec.max_int)).astype(spec.scale_dtype)
    used = scale.astype(np.float32)[..., None]  # the scale the model multiplies by
    steps = np.divide(groups, used, out=np.zeros_like(groups), where=used != 0)
    q = np.clip(np.round(steps) + spec.max_int, 0, 2 * spec.max_int).astype(np.uint32).reshape(rows, cols)
    words = q.reshape(rows, cols // spec.per_word, spec.per_word)
    shifts = (np.arange(spec.per_word, dtype=np.uint32) * spec.bits)
    return np.bitwise_or.reduce(words << shifts, axis=-1).astype(np.uint32), scale


def dequantize_weight(q_weight: np.ndarray, q_scale: np.ndarray, spec: QuantSpec) -> np.ndarray:
    """``(q - max_int) * scale`` in ``spec.scale_dtype``, unpacked to ``(out, in)``: what the
    compiled kernels compute (here for eager references, never handed to TVM)."""
    shifts = np.arange(spec.per_word, dtype=np.uint32) * spec.bits
    q = (q_weight[..., None] >> shifts) & np.uint32(2 ** spec.bits - 1)
    rows = q_weight.shape[0]
    steps = q.reshape(rows, -1, spec.group_size).astype(spec.scale_dtype) - np.array(spec.max_int, spec.scale_dtype)
    return (steps * q_scale[..., None]).reshape(rows, -1)


# -- which weights ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuantizedWeight:
    """One quantized weight: the module, its weight's state-dict name, and the packed values."""

    path: str
    weight: str
    q_weight: np.ndarray
    q_scale: np.ndarray
    float_weight: np.ndarray

    @property
    def names(self) -> tuple[str, str]:
        """The parameters' names: ``<path>.q_weight``, ``<path>.q_scale``."""
        return f"{self.path}.q_weight", f"{self.path}.q_scale"


def quantized_modules(model, spec: QuantSpec) -> dict[str, str]:
    """``{module path: its weight's state-dict name}`` of what ``spec`` quantizes in ``model``:
    every ``nn.Linear`` and the input embedding, but ``spec.skip``; one-line errors for a skip
    naming no such module and for a weight the groups do not divide."""
    import torch

    params = {id(p): name for name, p in model.named_parameters()}  # tied weights: the first name
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    found, seen = {}, set()
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or (module is embedding and embedding is not None):
            if id(module.weight) not in seen:
                seen.add(id(module.weight))
                found[path] = params[id(module.weight)]
    unknown = [s for s in spec.skip if s not in found]
    if unknown:
        shown = ", ".join(list(found)[:6]) + (", ..." if len(found) > 6 else "")
        raise InputError(f"QuantSpec(skip=...) names {', '.join(map(repr, unknown))}, which the model has no "
                         f"quantizable module at (nn.Linear or the token embedding): {shown}")
    for path in spec.skip:
        del found[path]
    for path in found:
        cols = dict(model.named_modules())[path].weight.shape[1]
        if cols % spec.group_size:
            raise ModelError(f"{path}'s weight has {cols} inputs, which groups of {spec.group_size} do not divide: "
                             f"give a QuantSpec with another group_size or skip=[{path!r}]")
    return found


def quantize_weights(model, spec: QuantSpec) -> dict[str, QuantizedWeight]:
    """``{weight name (relative to the model): QuantizedWeight}`` for every module ``spec`` quantizes."""
    state = dict(model.named_parameters())
    found = {}
    for path, name in quantized_modules(model, spec).items():
        w = state[name].detach().float().cpu().numpy()
        q, s = quantize_weight(w, spec)
        found[name] = QuantizedWeight(path, name, q, s, w.astype(spec.scale_dtype))
    return found


# -- the Relax rewrite --------------------------------------------------------------------------------
@dataclass
class QuantizedFunction:
    """One function rewritten: the module, the parameters it gained (``(name, InputSpec,
    array)``, in order after the caller's inputs) and the sources to add or change."""

    mod: Any
    params: list = field(default_factory=list)


def quantize_function(imported, weights: Mapping[str, QuantizedWeight], spec: QuantSpec) -> QuantizedFunction:
    """Rewrite ``imported`` (a torch import made with ``keep_params_as_input=True``, its weight
    parameters tagged with their names in ``var_keys``): every weight of ``weights`` is computed
    from new parameters by Relax ops at the top of the function; every other weight is bound as
    the float import binds it (a constant).  ``imported``'s sources, tags and constants are
    updated in place; the new parameters come back with their values."""
    from tvm import relax

    func = imported.mod["main"]
    n_user = int(func.attrs["num_input"])
    dataflow = bool(func.body.blocks) and isinstance(func.body.blocks[0], relax.DataflowBlock)
    emitter = _Emitter(dataflow)
    params, bound, added = list(func.params[:n_user]), {}, []
    for var in func.params[n_user:]:
        key = imported.var_keys[var][0]
        if key not in weights:  # a parameter until bound (bind_params binds parameters only)
            bound[var] = relax.const(np.asarray(imported.constants[key]))
            params.append(var)
            continue
        qw = weights[key]
        new = _new_params(qw, spec)
        params += [v for v, _ in new]
        added += [(name, InputSpec(name, tuple(array.shape), str(array.dtype)), array) for (v, array), name
                  in zip(new, _param_names(qw, spec))]
        emitter.dequantize(var, [v for v, _ in new], qw, spec)
        _retag(imported, key, [n for n in _param_names(qw, spec)], new)
    blocks = list(func.body.blocks)
    first = blocks[0] if blocks else relax.BindingBlock([])
    block_type = type(first)
    blocks[:1] = [block_type(emitter.bindings + list(first.bindings))]
    new_func = relax.Function(params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)
    new_func = new_func.without_attr("params").without_attr("num_input")
    new_func = new_func.bind_params(bound) if bound else new_func
    mod = imported.mod.__class__({imported.mod.get_global_var("main"): new_func}, attrs=imported.mod.attrs)
    return QuantizedFunction(mod=mod, params=added)


def _param_names(qw: QuantizedWeight, spec: QuantSpec) -> list[str]:
    names = list(qw.names)
    if spec.float_switch:
        names += [f"{qw.path}.float_weight", f"{qw.path}.keep_float"]
    return names


def _new_params(qw: QuantizedWeight, spec: QuantSpec) -> list:
    """``[(Relax Var, its value)]``: q_weight, q_scale (and float_weight, keep_float)."""
    from tvm import relax

    arrays = [qw.q_weight, qw.q_scale]
    if spec.float_switch:
        arrays += [qw.float_weight, np.array(False)]
    return [(relax.Var(name, relax.TensorType(list(a.shape), str(a.dtype))), a)
            for name, a in zip(_param_names(qw, spec), arrays)]


def _retag(imported, key: str, names: list[str], new: list) -> None:
    """The weight's name now names the dequantized weight (a computed value); the new
    parameters are held weights, known on the host."""
    old = imported.sources[key]
    for name, (var, array) in zip(names, new):
        imported.sources.add(SourceValue(key=name, op_type="Parameter", kind=Kind.PARAM,
                                         shape=tuple(array.shape), dtype=str(array.dtype)))
        imported.constants[name] = array
        imported.var_keys[var] = [name]
    imported.sources.add(replace(old, kind=Kind.VALUE, op_type="dequantize", inputs=tuple(names)))
    if isinstance(imported.constants, dict):
        imported.constants.pop(key, None)


class _Emitter:
    """Bindings that unpack and scale one weight (the Relax ops of MLC's dequantize compute)."""

    def __init__(self, dataflow: bool):
        from tvm import relax

        self.bindings, self.dataflow, self._bb = [], dataflow, relax.BlockBuilder()

    def _emit(self, expr, name: str, var=None):
        from tvm import relax

        expr = self._bb.normalize(expr)
        if var is None:
            var = (relax.DataflowVar if self.dataflow else relax.Var)(name, expr.ty)
        self.bindings.append(relax.VarBinding(var, expr))
        return var

    def dequantize(self, weight_var, new: list, qw: QuantizedWeight, spec: QuantSpec) -> None:
        from tvm import relax

        op = relax.op
        rows, cols = qw.float_weight.shape
        dtype, tag = spec.scale_dtype, qw.path.replace(".", "_")
        q_weight, q_scale = new[0], new[1]
        shifts = relax.const(np.arange(spec.per_word, dtype=np.uint32) * spec.bits, "uint32")
        words = self._emit(op.expand_dims(q_weight, [-1]), f"{tag}_words")
        shifted = self._emit(op.right_shift(words, shifts), f"{tag}_shifted")
        levels = self._emit(op.bitwise_and(shifted, relax.const(2 ** spec.bits - 1, "uint32")), f"{tag}_levels")
        grouped = self._emit(op.reshape(levels, (rows, cols // spec.group_size, spec.group_size)), f"{tag}_grouped")
        cast = self._emit(op.astype(grouped, dtype), f"{tag}_cast")
        steps = self._emit(op.subtract(cast, relax.const(spec.max_int, dtype)), f"{tag}_steps")
        scales = self._emit(op.expand_dims(q_scale, [-1]), f"{tag}_scales")
        scaled = self._emit(op.multiply(steps, scales), f"{tag}_scaled")
        if not spec.float_switch:
            self._emit(op.reshape(scaled, (rows, cols)), tag, var=weight_var)
            return
        dequantized = self._emit(op.reshape(scaled, (rows, cols)), f"{tag}_dequantized")
        self._emit(op.where(new[3], new[2], dequantized), tag, var=weight_var)


def check_weights_found(weights: Iterable[str], imported_keys: Iterable[str]) -> None:
    """Every weight to quantize must be a parameter of the export (one-line error otherwise)."""
    missing = sorted(set(weights) - set(imported_keys))
    if missing:
        raise ModelError(f"the export has no parameter {', '.join(missing[:4])}: torch.export did not keep "
                         "these weights as parameters, so they cannot be quantized; skip their modules")
