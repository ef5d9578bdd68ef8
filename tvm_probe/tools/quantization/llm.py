"""Which modules' weight-only quantization changes an LLM's generation (issue 34).

``sensitivity_hf(model, "q4f16_1", prompt=ids, steps=8)`` builds the model *once*, in the layout
of :class:`~tvm_probe.importer.quantize.QuantSpec` with ``float_switch=True``: every quantized
module holds its packed weights, its float weight and a switch ``<path>.keep_float`` that picks
one or the other (exactly: a ``where``).  Every variant is then a set of switches
(``Probe.set_params``), never a new build:

* the *float* variant (every switch on) gives the reference tokens and next-token
  distributions: the float model built alike (same build, same dtype; for ``q4f16_1`` the
  model in fp16 without quantization), so that the numbers measure quantization alone;
* ``alone``: only that module quantized; ``kept_float``: only that module in float.

Each variant runs ``steps`` calls teacher-forced with the float variant's tokens (prefill,
then decode steps fed the float tokens), so every step's distribution is conditioned on the
same text: ``kl`` is the mean over the steps of KL(float || variant) of the next-token
distributions, ``first_diff`` the first step whose greedy token differs from the float one (a
greedy generation is the same text up to that step, so it is where generation would first
differ), None when none does.  Why not a 4-bit scale/weight set that reproduces float: 32
weights share one scale and 15 levels, which cannot hold 32 arbitrary floats.

Cost: one build (the switch layout adds the float weights and a ``where`` per module) and
``2 * modules + 2`` teacher-forced generations of ``steps`` calls; ``bench/quantization_llm.py``
measures it against one build and one generation.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ...core.errors import InputError
from ...core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ...importer.hf import DECODE, PREFILL
from ...importer.quantize import quant_spec
from ...probe import Probe
from ...probe.generate import empty_past, prompt_ids


@dataclass(frozen=True)
class VariantRun:
    """One variant's teacher-forced run: mean KL against the float variant, first differing step."""

    kl: float
    first_diff: int | None


@dataclass
class ModuleSensitivity:
    """One quantized module: only it quantized (``alone``), only it kept in float (``kept_float``)."""

    path: str
    alone: VariantRun
    kept_float: VariantRun


class _Variants:
    """Runs variants of one switch-layout build, teacher-forced with the float tokens."""

    def __init__(self, probe, prompt: np.ndarray, modules: Sequence[str]):
        self.probe, self.prompt, self.modules = probe, prompt, list(modules)
        self.runs, self.run_s = 0, 0.0
        self.float_tokens: list[int] = []
        self.float_probs: np.ndarray | None = None

    def logits(self, kept_float: set[str], steps: int, tokens: Sequence[int]) -> np.ndarray:
        """``(steps, vocab)`` next-token logits with ``kept_float`` in float, the rest quantized;
        decode step ``i`` is fed ``tokens[i - 1]`` (None entries: the variant's own choice)."""
        self.probe.set_params({f"{m}.keep_float": np.array(m in kept_float) for m in self.modules})
        start = time.perf_counter()
        probe, ids = self.probe, self.prompt
        feed, position, past = ids, np.arange(ids.shape[1], dtype=np.int64)[None, :], empty_past(probe.hf)
        found = []
        for i in range(steps):
            out = probe.call(PREFILL if i == 0 else DECODE, feed, position, *past, capture=None)
            found.append(out[0].numpy()[0, -1].astype(np.float64))
            past = list(out[1:])
            token = tokens[i] if i < len(tokens) else int(np.argmax(found[-1]))
            feed, position = np.array([[token]], np.int64), np.array([[ids.shape[1] + i]], np.int64)
        probe.forget_calls()
        self.runs, self.run_s = self.runs + 1, self.run_s + time.perf_counter() - start
        return np.stack(found)

    def float_reference(self, steps: int) -> None:
        """The float variant's greedy tokens and distributions for ``steps`` steps."""
        if len(self.float_tokens) >= steps:
            return
        logits = self.logits(set(self.modules), steps, [])
        self.float_tokens = [int(t) for t in logits.argmax(-1)]
        self.float_probs = _softmax(logits)

    def run(self, kept_float: set[str], steps: int) -> VariantRun:
        self.float_reference(steps)
        logits = self.logits(kept_float, steps, self.float_tokens)
        p, log_q = self.float_probs[:steps], _log_softmax(logits)
        kl = float(np.mean(np.sum(p * (np.log(np.maximum(p, 1e-300)) - log_q), axis=-1)))
        differs = [i for i, t in enumerate(logits.argmax(-1)) if int(t) != self.float_tokens[i]]
        return VariantRun(kl=max(kl, 0.0), first_diff=differs[0] if differs else None)


@dataclass
class SensitivityReport:
    """What :func:`sensitivity_hf` found: one :class:`ModuleSensitivity` per quantized module.

    Attributes:
        modules: per module, in the order of :meth:`table` (largest ``alone`` KL first).
        steps: the teacher-forced steps each variant ran.
        quantize: the :class:`~tvm_probe.importer.quantize.QuantSpec` analysed.
        quantized: the variant with every module quantized (what the spec deploys).
        float_tokens: the greedy tokens of the float variant.
        timings: ``build_s`` (the one build), ``runs`` and ``run_s`` (the variants run so far).
    """

    modules: list[ModuleSensitivity]
    steps: int
    quantize: Any
    quantized: VariantRun
    float_tokens: list[int]
    timings: dict = field(default_factory=dict)
    _variants: Any = field(default=None, repr=False)

    def table(self):
        """DataFrame: one row per quantized module path — ``alone_kl``, ``alone_first_diff``,
        ``kept_float_kl``, ``kept_float_first_diff`` (a step, or None: no token differs) —
        largest ``alone_kl`` first."""
        import pandas as pd

        frame = pd.DataFrame([{"module": m.path, "alone_kl": m.alone.kl, "alone_first_diff": m.alone.first_diff,
                               "kept_float_kl": m.kept_float.kl, "kept_float_first_diff": m.kept_float.first_diff}
                              for m in self.modules], columns=["module", "alone_kl", "alone_first_diff",
                                                               "kept_float_kl", "kept_float_first_diff"])
        return frame.astype({"alone_first_diff": "Int64", "kept_float_first_diff": "Int64"})  # None: <NA>

    def keep_float(self, steps: int | None = None) -> list[str]:
        """Module paths to keep in float so that the greedy tokens equal the float model's for
        ``steps`` steps (default: the steps analysed): modules are added in the order of
        :meth:`table` until the tokens agree, then each is dropped again if they still agree
        without it.  Runs variants of the same build (no rebuild)."""
        steps = self.steps if steps is None else steps
        variants = self._variants
        if not isinstance(steps, int) or steps < 1 or variants.prompt.shape[1] + steps > variants.probe.hf.max_len:
            raise InputError(f"keep_float(steps={steps!r}): give an int >= 1 with the prompt "
                             f"({variants.prompt.shape[1]} tokens) + steps <= max_len={variants.probe.hf.max_len}")
        start = variants.runs, variants.run_s
        kept: list[str] = []
        for path in [None] + [m.path for m in self.modules]:
            if path is not None:
                kept.append(path)
            if variants.run(set(kept), steps).first_diff is None:
                break
        for path in list(reversed(kept)):
            trial = set(kept) - {path}
            if variants.run(trial, steps).first_diff is None:
                kept.remove(path)
        self.timings.update(runs=variants.runs, run_s=variants.run_s,
                            keep_float_runs=variants.runs - start[0], keep_float_s=variants.run_s - start[1])
        return kept

    def __str__(self) -> str:
        worst = self.modules[0] if self.modules else None
        first = "no token differs" if self.quantized.first_diff is None else \
            f"the first token differs at step {self.quantized.first_diff}"
        return (f"{self.quantize} over {self.steps} steps: fully quantized, mean KL {self.quantized.kl:.3g} and {first}"
                + (f"; most sensitive alone: {worst.path} (KL {worst.alone.kl:.3g})" if worst else ""))


def sensitivity_hf(model, quantize="q4f16_1", prompt=None, steps: int = 8, pipeline=DEFAULT_PIPELINE,
                   target=DEFAULT_TARGET, max_len: int | None = None) -> SensitivityReport:
    """Rank the modules of a transformers causal LM by what their weight-only quantization does
    to the next-token distributions (see the module docstring).

    Args:
        model: the ``*ForCausalLM`` in float (eval mode).
        quantize: ``"q4f32_1"``, ``"q4f16_1"`` or a :class:`~tvm_probe.importer.quantize.QuantSpec`
            (its ``skip`` modules stay float and are not ranked).
        prompt: the prompt's token ids, shape ``(1, length)`` or ``(length,)``.
        steps: generated steps each variant is measured over.
        pipeline, target: as for ``Probe.from_hf``.
        max_len: the build's ``max_len`` (default: prompt + steps, at least 64).

    Returns:
        A :class:`SensitivityReport` (``table()``, ``keep_float(steps=)``).
    """
    spec = quant_spec(quantize)
    if spec is None:
        raise InputError("sensitivity_hf needs quantize=: give one of q4f16_1, q4f32_1 or a QuantSpec")
    if prompt is None:
        raise InputError("sensitivity_hf needs prompt=: the prompt's token ids, shape (1, length) or (length,)")
    ids = prompt_ids(prompt)
    if not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps={steps!r}: give the number of generated steps to measure, an int >= 1")
    start = time.perf_counter()
    probe = Probe.from_hf(model, pipeline=pipeline, target=target, quantize=replace(spec, float_switch=True),
                          max_len=max_len or max(64, ids.shape[1] + steps))
    build_s = time.perf_counter() - start
    variants = _Variants(probe, ids, probe.hf.quantized)
    quantized = variants.run(set(), steps)
    everything = set(variants.modules)
    rows = [ModuleSensitivity(path, alone=variants.run(everything - {path}, steps),
                              kept_float=variants.run({path}, steps)) for path in variants.modules]
    rows.sort(key=lambda m: -m.alone.kl)
    return SensitivityReport(modules=rows, steps=steps, quantize=spec, quantized=quantized,
                             float_tokens=list(variants.float_tokens[:steps]),
                             timings={"build_s": build_s, "runs": variants.runs, "run_s": variants.run_s},
                             _variants=variants)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _softmax(logits: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(logits))
