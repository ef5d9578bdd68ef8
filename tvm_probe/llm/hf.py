"""Hugging Face causal LMs with an explicit, functional KV cache: prefill and decode (issue 24).

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

Both are imported with the usual tagging (fx node names, module paths of the wrapped model:
``model.model.layers.0.self_attn``, ``model.lm_head``) and compiled as two functions of one
executable (the multi-function API of :mod:`tvm_probe.calls`): ``probe.call("prefill", ...)``,
``probe.call("decode", ...)``, ``probe.get(name, call=k)``.  :func:`generate` drives them greedily;
:func:`reference_generate` does the same in eager PyTorch with the same wrapper (the same cache
semantics), recording every module's output per call, and :func:`compare_generation` lines the
two up call by call.

torch and transformers are imported lazily.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..core.errors import InputError, ModelError, ProbeError

PREFILL, DECODE = "prefill", "decode"


def _torch():
    from ..importer.torch import require_torch

    return require_torch()


def _cache_class():
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        raise ModelError("transformers is not installed: pip install transformers") from None
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
            model is ``self.model``, so module paths read ``model.model.layers.0``, ``model.lm_head``.
            """

            def __init__(self, model, layers: int):
                super().__init__()
                self.model, self.layers = model, layers

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


def _positions(start: int, count: int, batch: int):
    torch = _torch()
    return torch.arange(start, start + count, dtype=torch.long).unsqueeze(0).expand(batch, count).contiguous()


def _example_decode(shape: CacheShape, batch: int, past: int) -> tuple:
    torch = _torch()
    gen = torch.Generator().manual_seed(0)
    kv = [torch.randn(batch, shape.kv_heads, past, shape.head_dim, generator=gen, dtype=shape.dtype)
          for _ in range(2 * shape.layers)]
    return (torch.zeros(batch, 1, dtype=torch.long), _positions(past, 1, batch), *kv)


def import_prefill(step, shape: CacheShape, prompt_len: int | None = None, batch: int = 1,
                   import_fixes: bool = True):
    """The prefill program, imported with an empty 4-D past: for prompts of ``prompt_len``
    tokens, or (None) of any length (a symbolic dimension)."""
    from ..importer.torch import import_torch

    torch = _torch()
    length = 4 if prompt_len is None else prompt_len
    args = (torch.zeros(batch, length, dtype=torch.long), _positions(0, length, batch), *shape.empty(batch))
    dynamic = None
    if prompt_len is None:
        prompt = torch.export.Dim.DYNAMIC
        dynamic = ({1: prompt}, {1: prompt}, tuple(None for _ in range(2 * shape.layers)))
    return import_torch(step, args, import_fixes=import_fixes, dynamic_shapes=dynamic)


def import_decode(step, shape: CacheShape, max_len: int, batch: int = 1, import_fixes: bool = True):
    """The decode program, imported with a symbolic past length ``1 <= past < max_len``."""
    from ..importer.torch import import_torch

    torch = _torch()
    past = torch.export.Dim.DYNAMIC  # named ranges trip the model's own guards; export infers them
    args = _example_decode(shape, batch, past=2)
    dynamic = (None, None, tuple({2: past} for _ in range(2 * shape.layers)))  # *past is one tuple
    return import_torch(step, args, import_fixes=import_fixes, dynamic_shapes=dynamic)


# -- one executable: prefill and decode --------------------------------------------------------
@dataclass
class HFModel:
    """What a probe made by :func:`from_hf` knows of its model (``probe.hf``)."""

    step: Any
    shape: CacheShape
    max_len: int
    generations: list = field(default_factory=list)


@dataclass
class Generation:
    """One :func:`generate`: the new tokens and the probe call that produced each.

    ``calls[i]`` is the call whose logits gave ``tokens[i]`` (call 0 the prefill).
    """

    prompt: np.ndarray
    tokens: list[int]
    calls: list[int]


def from_hf(probe_class, model, pipeline, target, max_len: int, import_fixes: bool = True):
    """Import prefill and decode, compile them as two functions of one executable (see module doc)."""
    from ..importer.relax import FunctionModel, function_view

    if not isinstance(max_len, int) or max_len < 2:
        raise InputError(f"max_len={max_len!r}: give the longest prompt + generated length, an int >= 2")
    step = make_cache_step(model)
    shape = cache_shape(step)
    imports = {PREFILL: import_prefill(step, shape, None, import_fixes=import_fixes),
               DECODE: import_decode(step, shape, max_len, import_fixes=import_fixes)}
    merged = _merge(imports)
    models = {name: FunctionModel(mod=function_view(merged, name), sources=imp.sources, var_keys=imp.var_keys,
                                  constants=imp.constants, inputs=imp.inputs, hash_model=imp.hash_model,
                                  fixes=imp.fixes, unfixed=imp.unfixed, function=name,
                                  params=[(s.name, s) for s in imp.inputs])
              for name, imp in imports.items()}
    probe = probe_class._from_functions(merged, models, target, pipeline)
    probe.hf = HFModel(step=step, shape=shape, max_len=max_len)
    return probe


def _merge(imports: dict):
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


def _prompt(input_ids) -> np.ndarray:
    ids = np.asarray(input_ids.numpy() if hasattr(input_ids, "numpy") else input_ids)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"input_ids of shape {ids.shape} and dtype {ids.dtype}: give one prompt of integer "
                         "token ids, shape (1, length) or (length,)")
    return ids.astype(np.int64)


def generate(probe, input_ids, steps: int, capture="all") -> list[int]:
    """``steps`` new tokens, greedy, from the compiled executable (``max_new_tokens=steps``).

    Call 0 is the prefill (its last logits give the first new token); calls 1..steps-1 are
    decode steps, each fed the previous token, its position and the cache the previous call
    returned.  Every call is captured (``capture``) and numbered as :meth:`Probe.call` numbers
    them; ``probe.hf.generations[-1]`` says which call gave which token.
    """
    hf = getattr(probe, "hf", None)
    if hf is None:
        raise ProbeError("generate() needs a probe made by Probe.from_hf")
    ids = _prompt(input_ids)
    if not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps={steps!r}: give the number of new tokens, an int >= 1")
    if ids.shape[1] + steps > hf.max_len:
        raise InputError(f"a prompt of {ids.shape[1]} tokens + {steps} steps is longer than max_len={hf.max_len}: "
                         "make a probe with a larger max_len")
    past = [np.zeros((1, hf.shape.kv_heads, 0, hf.shape.head_dim), np.float32) for _ in range(2 * hf.shape.layers)]
    feed, position = ids, np.arange(ids.shape[1], dtype=np.int64)[None, :]
    tokens, calls = [], []
    for i in range(steps):
        out = probe.call(PREFILL if i == 0 else DECODE, feed, position, *past, capture=capture)
        logits = out[0].numpy()
        tokens.append(int(np.argmax(logits[0, -1])))
        calls.append(probe.num_calls - 1)
        past = list(out[1:])
        length = ids.shape[1] + i
        feed, position = np.array([[tokens[-1]]], np.int64), np.array([[length]], np.int64)
    hf.generations.append(Generation(prompt=ids, tokens=tokens, calls=calls))
    return tokens


# -- the reference: eager PyTorch, same cache semantics ------------------------------------------
@dataclass
class ReferenceGeneration:
    """Eager generation through the same :class:`CacheStep`: tokens, and per call every
    module's output by path (the wrapper's paths: ``model.model.layers.0``)."""

    tokens: list[int]
    values: list[dict]


def reference_generate(model_or_probe, input_ids, steps: int) -> ReferenceGeneration:
    """Greedy generation in eager PyTorch with the functional cache, recording module outputs."""
    torch = _torch()
    hf = getattr(model_or_probe, "hf", None)
    step = hf.step if hf is not None else make_cache_step(model_or_probe)
    shape = hf.shape if hf is not None else cache_shape(step)
    ids = torch.from_numpy(_prompt(input_ids))
    past, feed, position = shape.empty(1), ids, _positions(0, ids.shape[1], 1)
    tokens, values = [], []
    with _ModuleRecorder(step) as recorder, torch.no_grad():
        for i in range(steps):
            out = step(feed, position, *past)
            values.append(recorder.take())
            tokens.append(int(out[0][0, -1].argmax()))
            past = list(out[1:])
            feed, position = torch.tensor([[tokens[-1]]]), _positions(ids.shape[1] + i, 1, 1)
    return ReferenceGeneration(tokens=tokens, values=values)


class _ModuleRecorder:
    """``with _ModuleRecorder(step) as r:`` — every submodule's output by path, for each eager
    call of ``step`` in the block (:meth:`take` after each).  Tuple outputs give their first
    tensor, as forward hooks see it; ``forward`` is wrapped per instance, so direct
    ``m.forward(...)`` calls count too.  The wrappers are put in once for a whole generation
    (setting a module attribute goes through ``nn.Module.__setattr__``, which is slow) and the
    instance forwards the modules had come back after."""

    def __init__(self, step):
        self._modules = [(path, m) for path, m in step.named_modules() if path]
        self._found: dict[str, np.ndarray] = {}
        self._own: dict[str, Any] = {}

    def take(self) -> dict[str, np.ndarray]:
        found, self._found = self._found, {}
        return found

    def _recording(self, path, forward):
        tensor_type = _torch().Tensor

        def wrapper(*a, **k):
            output = forward(*a, **k)
            tensor = output[0] if isinstance(output, (tuple, list)) and output else output
            if isinstance(tensor, tensor_type):  # a copy: a later in-place op must not change it
                self._found[path] = tensor.detach().cpu().numpy().copy()
            return output
        return wrapper

    def __enter__(self):
        for path, m in self._modules:
            self._own[path] = m.__dict__.get("forward")
            m.__dict__["forward"] = self._recording(path, m.forward)
        return self

    def __exit__(self, *exc):
        for path, m in self._modules:
            if self._own[path] is not None:
                m.__dict__["forward"] = self._own[path]
            else:
                m.__dict__.pop("forward", None)
        return False


@dataclass
class GenerationComparison:
    """A generation against its reference: per call by module path, and token by token.

    Truthy when every compared value of every call is within tolerance and every token agrees.

    Attributes:
        calls: the :class:`~tvm_probe.calls.CallsComparison` (one Comparison per call).
        tokens, reference_tokens: the two generations.
        first_token_step: the first step whose token differs, or None.
    """

    calls: Any
    tokens: list[int]
    reference_tokens: list[int]

    @property
    def first_token_step(self) -> int | None:
        return next((i for i, (a, b) in enumerate(zip(self.tokens, self.reference_tokens)) if a != b), None)

    @property
    def first_divergent(self):
        """``(step, value name)`` of the earliest call's first divergent value, or None."""
        found = self.calls.first_divergent
        return None if found is None else (found.call, found.value.name)

    def __bool__(self) -> bool:
        return bool(self.calls) and self.tokens == self.reference_tokens

    def table(self):
        """DataFrame: one row per step — compared, diverged, first divergent value, max abs error, tokens."""
        frame = self.calls.table()
        frame.insert(0, "step", range(len(frame)))
        frame["token"] = self.tokens[:len(frame)]
        frame["reference_token"] = self.reference_tokens[:len(frame)]
        return frame

    def verdict(self) -> str:
        if self:
            return f"all {len(self.tokens)} steps within tolerance; the same {len(self.tokens)} tokens"
        parts = []
        if self.first_divergent is not None:
            step, name = self.first_divergent
            parts.append(f"first divergent value at step {step}: {name}")
        if self.first_token_step is not None:
            parts.append(f"first different token at step {self.first_token_step}")
        return "; ".join(parts) or "some value could not be checked"


def compare_generation(probe, reference: ReferenceGeneration | None = None, atol=None, rtol=None,
                       generation: Generation | None = None) -> GenerationComparison:
    """Compare the probe's last :func:`generate` with ``reference`` (default: made now in eager
    PyTorch with the same prompt and number of steps), call by call, by module path."""
    from ..probe.calls import compare_calls

    hf = getattr(probe, "hf", None)
    if hf is None or not hf.generations:
        raise ProbeError("compare_generation() needs a probe made by Probe.from_hf that has run generate()")
    generation = generation or hf.generations[-1]
    if reference is None:
        reference = reference_generate(probe, generation.prompt, len(generation.tokens))
    steps = len(generation.tokens)
    refs = [_served(probe, generation.calls[i], reference.values[i]) for i in range(steps)]
    calls = compare_calls(probe, refs, atol=atol, rtol=rtol, calls=generation.calls)
    return GenerationComparison(calls=calls, tokens=list(generation.tokens), reference_tokens=list(reference.tokens))


def _served(probe, call: int, values: dict) -> dict:
    """The reference values whose module path has a value in that call's function (a module that
    computes nothing of its own, e.g. Dropout in eval, has none: it is not compared)."""
    from ..core.errors import NameLookupError

    kept = {}
    with probe.in_call(call) as function_probe:
        for path, array in values.items():
            try:
                function_probe.resolve(f"module:{path}")
            except NameLookupError:
                continue
            kept[f"module:{path}"] = array
    return kept


# -- tvm-probe run with model: {hf: ...} and generate: ------------------------------------------
@dataclass
class GenerationOutcome:
    """What ``tvm-probe run`` did for a ``generate:`` config (see :func:`investigate_generation`)."""

    probe: Any
    generation: Generation
    comparison: GenerationComparison
    report: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """OK only when every value of every step passed and every token agrees."""
        from ..core.schema import Exit

        return Exit.OK if self.comparison else Exit.DIVERGED

    def lines(self) -> list[str]:
        """What the CLI prints: the tokens, the step × layer errors, the files, the verdict."""
        import pandas as pd

        table = layer_table(self.comparison)
        with pd.option_context("display.width", 200, "display.float_format", "{:.2g}".format):
            shown = [table.to_string()] if not table.empty else []
        files = [f"{kind}: {path}" for kind, path in self.report.items()]
        return [f"tokens: {self.generation.tokens}", f"transformers (eager, same cache): "
                f"{self.comparison.reference_tokens}", *shown, *files, self.comparison.verdict()]


def layer_table(comparison: GenerationComparison):
    """DataFrame: step × decoder layer, the max abs error of each layer's output at each step."""
    import re

    import pandas as pd

    layer = re.compile(r"^module:(.*\.(?:layers|h)\.(\d+))$")
    rows = {}
    for step, (_, _, call) in enumerate(comparison.calls.by_call):
        for value in call.values:
            found = layer.match(value.name)
            if found:
                rows.setdefault(step, {})[f"layer {int(found[2])}"] = value.max_abs
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "step"
    return frame[sorted(frame.columns, key=lambda c: int(c.split()[1]))] if not frame.empty else frame


def layer_svg(table) -> str:
    """The step × layer table as a heat map (SVG, no plotting library): log10 of the error."""
    import math

    cell, pad = 28, 60
    rows, cols = list(table.index), list(table.columns)
    width, height = pad + cell * len(cols) + 10, pad + cell * len(rows) + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="10">',
             '<text x="4" y="14">max abs error per step (rows) and layer (columns), log10</text>']
    for j, col in enumerate(cols):
        parts.append(f'<text x="{pad + j * cell + 2}" y="{pad - 6}">{col.split()[1]}</text>')
    for i, row in enumerate(rows):
        parts.append(f'<text x="4" y="{pad + i * cell + 18}">step {row}</text>')
        for j, col in enumerate(cols):
            err = table.loc[row, col]
            level = 0.0 if not err or err != err else min(1.0, max(0.0, (math.log10(err) + 8) / 8))
            shade = f"rgb({int(255 * level)},{int(255 * (1 - level))},80)"
            parts.append(f'<rect x="{pad + j * cell}" y="{pad + i * cell}" width="{cell - 2}" height="{cell - 2}" '
                         f'fill="{shade}"><title>{err:.3g}</title></rect>')
    return "\n".join(parts + ["</svg>"])


def investigate_generation(config, progress, probe_class):
    """Build the probe the config names (``probe_class.from_hf``), generate, compare every step,
    write the tables.  (``probe_class`` is passed in: probe.py imports this module.)"""
    spec = config.generate
    with progress.stage("import and compile (prefill, decode)"):
        model = config.model.load_hf()
        prompt = _config_prompt(spec, model)
        probe = probe_class.from_hf(model, pipeline=config.pipeline, target=config.target,
                              max_len=prompt.shape[1] + spec.steps, import_fixes=config.import_fixes)
    with progress.stage(f"generate {spec.steps} tokens"):
        probe.generate(prompt, steps=spec.steps)
    with progress.stage("reference and compare"):
        comparison = compare_generation(probe, atol=config.reference.atol, rtol=config.reference.rtol)
    outcome = GenerationOutcome(probe=probe, generation=probe.hf.generations[-1], comparison=comparison)
    if config.output.report is not None:
        folder = config.output.report
        folder.mkdir(parents=True, exist_ok=True)
        comparison.table().to_csv(folder / "steps.csv", index=False)
        table = layer_table(comparison)
        table.to_csv(folder / "step_layer_errors.csv")
        (folder / "step_layer_errors.svg").write_text(layer_svg(table), encoding="utf-8")
        outcome.report = {"steps": folder / "steps.csv", "table": folder / "step_layer_errors.csv",
                          "plot": folder / "step_layer_errors.svg"}
    return outcome


def _config_prompt(spec, model) -> np.ndarray:
    if spec.prompt != "random":
        vocab = model.config.get_text_config(decoder=True).vocab_size
        if max(spec.prompt) >= vocab:
            raise InputError(f"generate.prompt: token id {max(spec.prompt)} is outside the vocabulary (size {vocab})")
        return np.array([list(spec.prompt)], np.int64)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    return np.random.default_rng(spec.seed).integers(0, vocab, size=(1, spec.length), dtype=np.int64)
