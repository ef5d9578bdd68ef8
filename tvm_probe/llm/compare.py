"""A generation compared with its eager reference, call by call by module path, and token by token.

Two ways, one result (:class:`GenerationComparison`):

* a ``Probe.from_hf`` probe against its own model (or another transformers model with the same
  names): each step's values by module path, decode steps from the second on read at once from
  the teacher-forced forward (:func:`_stacked`);
* any LLM probe against a transformers model whose module paths it shares only in part (an
  MLC-style nn model: fused ``qkv_proj``, an ``embed`` call per step, the prefill's logits for
  the last position only): :func:`_by_steps` compares, at every step, every path both have, the
  reference cut to the positions the probe keeps (the table says where), and lists the paths
  only one side has.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..core.errors import InputError, NameLookupError, ProbeError
from ..probe.calls import compare_calls, compare_stacked
from ..probe.columns import StackedReference
from ..probe.generate import Generation
from .reference import ReferenceGeneration, reference_generate


def relative_error(snr_db: float) -> float:
    """``‖got − ref‖ / ‖ref‖`` from ``snr_db = 10 log10(Σref² / Σ(got − ref)²)`` (inf for NaN or a
    shape mismatch: nothing agrees)."""
    return math.inf if math.isnan(snr_db) else 10 ** (-snr_db / 20)


@dataclass
class GenerationComparison:
    """A generation against its reference: per step by module path, and token by token.

    Truthy when every compared value of every step is within tolerance and every token agrees
    (paths only one side has are listed, not failed).

    Attributes:
        calls: the :class:`~tvm_probe.probe.calls.CallsComparison` (one Comparison per call compared).
        tokens, reference_tokens: the generation's tokens, and eager's at each step (by default
            eager fed the generation's tokens: after a first difference it goes on from them).
        first_token_step: the first step whose token differs, or None.
        steps_of_calls: the step of each of ``calls.by_call`` (None: one call per step, in order).
        notes: per step, ``{path: how it was compared}`` where not as a whole (``"the last 1 of
            5 positions"``: the probe keeps fewer positions than the reference).
        only_probe, only_reference: module paths one side has and the other lacks (not compared).
        skipped: the shared paths ``skip=`` left out.
    """

    calls: Any
    tokens: list[int]
    reference_tokens: list[int]
    steps_of_calls: list[int] | None = None
    notes: list[dict] = field(default_factory=list)
    only_probe: list[str] = field(default_factory=list)
    only_reference: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def first_token_step(self) -> int | None:
        return next((i for i, (a, b) in enumerate(zip(self.tokens, self.reference_tokens)) if a != b), None)

    def by_step(self) -> list[list]:
        """Per step, its calls' :class:`~tvm_probe.probe.calls.CallComparison`\ s, in call order."""
        steps = self.steps_of_calls or range(len(self.calls.by_call))
        grouped: list[list] = [[] for _ in range(max(steps, default=-1) + 1)]
        for step, compared in zip(steps, self.calls.by_call):
            grouped[step].append(compared)
        return grouped

    @property
    def first_divergent(self):
        """``(step, value name)`` of the earliest step's first divergent value, or None (the
        step: its place in the generation, 0 for the prefill, whatever calls the probe made before)."""
        return next(((step, comparison.first_divergent.name)
                     for step, calls in enumerate(self.by_step()) for _, _, comparison in calls
                     if comparison.first_divergent is not None), None)

    def __bool__(self) -> bool:
        return bool(self.calls) and self.tokens == self.reference_tokens

    def table(self):
        """DataFrame: one row per step — compared, diverged, unchecked, first divergent value, max
        abs error, the tokens, and where a path was compared in part (``note``)."""
        import pandas as pd

        rows = []
        for step, calls in enumerate(self.by_step()):
            values = [v for _, _, c in calls for v in c.values]
            first = next((c.first_divergent.name for _, _, c in calls if c.first_divergent is not None), None)
            notes = self.notes[step] if step < len(self.notes) else {}
            rows.append({"step": step, "call": calls[-1].call if calls else None,
                         "function": "+".join(f for _, f, _ in calls), "compared": len(values),
                         "diverged": sum(not v.passed for v in values),
                         "unchecked": sum(len(c.unchecked) for _, _, c in calls), "first_divergent": first,
                         "max_abs": max((v.max_abs for v in values), default=None),
                         "token": self.tokens[step] if step < len(self.tokens) else None,
                         "reference_token": self.reference_tokens[step] if step < len(self.reference_tokens) else None,
                         "note": "; ".join(f"{path}: {note}" for path, note in notes.items())})
        return pd.DataFrame(rows, columns=["step", "call", "function", "compared", "diverged", "unchecked",
                                           "first_divergent", "max_abs", "token", "reference_token", "note"])

    def by_path(self):
        """DataFrame: one row per compared path, sorted by where the error jumps most.

        ``relative_error`` is ``‖probe − reference‖ / ‖reference‖`` (from the SNR), its largest over
        the steps; ``error_added`` how far it exceeds the largest relative error of the values
        computed before it in the same step (what it inherited, at most), largest over the steps
        (``at_step``).  The path where quantization or a kernel first hurts heads the table; the
        values that merely carry its error follow.  ``first_diverged_step``: the first step the
        value is out of tolerance (None: never)."""
        import pandas as pd

        rows: dict[str, dict] = {}
        for step, calls in enumerate(self.by_step()):
            worst_before = 0.0
            for _, _, comparison in calls:
                for v in comparison.values:
                    path = v.name.removeprefix("module:")
                    row = rows.setdefault(path, {"path": path, "error_added": 0.0, "at_step": None,
                                                 "first_diverged_step": None, "relative_error": 0.0})
                    relative = relative_error(v.snr_db)
                    added = max(0.0, relative - worst_before)
                    if row["at_step"] is None or added > row["error_added"]:
                        row["error_added"], row["at_step"] = added, step
                    row["relative_error"] = max(row["relative_error"], relative)
                    if not v.passed and row["first_diverged_step"] is None:
                        row["first_diverged_step"] = step
                    worst_before = max(worst_before, relative)
        frame = pd.DataFrame(list(rows.values()),
                             columns=["path", "error_added", "at_step", "first_diverged_step", "relative_error"])
        return frame.sort_values("error_added", ascending=False, kind="stable").reset_index(drop=True)

    def verdict(self) -> str:
        parts = []
        if self:
            parts.append(f"all {len(self.tokens)} steps within tolerance; the same {len(self.tokens)} tokens")
        if not self and self.first_divergent is not None:
            step, name = self.first_divergent
            parts.append(f"first divergent value at step {step}: {name}")
        if not self and self.first_token_step is not None:
            parts.append(f"first different token at step {self.first_token_step}")
        if not parts:
            parts.append("some value could not be checked")
        for label, paths in (("only the probe has", self.only_probe), ("only the reference has", self.only_reference),
                             ("skipped", self.skipped)):
            if paths:
                parts.append(f"{label} {len(paths)} paths ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})")
        return "; ".join(parts)


def compare_generation(probe, reference=None, atol=None, rtol=None, generation: Generation | None = None,
                       skip: Iterable[str] = ()) -> GenerationComparison:
    """Compare the probe's last ``generate`` with ``reference``, step by step, by module path.

    ``reference``: a transformers causal LM (``hf_model``: the original of an MLC-style model, the
    float original of a quantized one), or a :class:`ReferenceGeneration`; default (``from_hf``
    probes): the probe's own model.  A model is run now in eager PyTorch, teacher-forced with the
    generation's own tokens (:func:`~tvm_probe.llm.reference.teacher_forced`: two eager calls
    whatever the number of steps): each step's values are what eager computes from the same
    context, and its tokens eager's argmax there, so the first different token is where the two
    first disagree.  Pass ``reference=reference_generate(model, prompt, steps)`` for eager's own
    free-running generation instead.

    Every module path both have is compared at every step; where the probe keeps fewer positions
    (MLC's prefill computes ``lm_head`` for the last one) its trailing positions are, and the
    table says so; the paths only one side has are listed (``only_probe``, ``only_reference``).
    ``skip``: patterns (``fnmatch``: ``"model.embed_tokens"``, ``"*.rotary_emb"``) of shared paths
    to leave out, where the two implementations define a path differently."""
    if reference is None and getattr(probe, "hf", None) is None:
        raise InputError("compare_generation(probe): this probe was not made from a transformers model; pass "
                         "reference=hf_model (a transformers causal LM with the same weights)")
    generations = getattr(probe, "generations", None) or []
    if not generations and generation is None:
        raise ProbeError("compare_generation() needs a probe that has run generate()")
    generation = generation or generations[-1]
    skip = [skip] if isinstance(skip, str) else list(skip)
    steps = len(generation.tokens)
    if reference is None:
        reference = reference_generate(probe, generation.prompt, steps, tokens=generation.tokens)
    elif not isinstance(reference, ReferenceGeneration):
        reference = reference_generate(_causal_lm(reference), generation.prompt, steps, tokens=generation.tokens)
    if probe.hf is None or generation.embed_calls is not None:
        return _by_steps(probe, generation, reference, skip, atol, rtol)
    skipped = _matching(reference.values[0], skip)
    if skip:
        reference = _without(reference, skip)
    stacked_from, resolvable = 2, {}
    # (decode steps from the second on, read at once from the teacher-forced forward where it holds them)
    stacked = _stacked(probe, generation, reference, resolvable) if steps > stacked_from else None
    later = compare_stacked(probe, generation.calls[2:steps], stacked, atol, rtol) if stacked is not None else None
    one_by_one = steps if later is None else 2
    refs = [_served(probe, generation.calls[i], reference.values[i], resolvable) for i in range(one_by_one)]
    calls = compare_calls(probe, refs, atol=atol, rtol=rtol, calls=generation.calls[:one_by_one])
    if later is not None:
        calls.by_call += later.by_call
    return GenerationComparison(calls=calls, tokens=list(generation.tokens), reference_tokens=list(reference.tokens),
                                skipped=skipped)


def _causal_lm(model):
    """``model`` if it is a torch module (a transformers causal LM), else a one-line InputError."""
    if not callable(getattr(model, "named_modules", None)) or not hasattr(model, "forward"):
        raise InputError(f"reference={type(model).__name__}: give a transformers causal LM (e.g. "
                         "LlamaForCausalLM with the same weights) or a ReferenceGeneration")
    return model


def _matching(paths: Iterable[str], patterns: list[str]) -> list[str]:
    return sorted(p for p in paths if any(fnmatch.fnmatchcase(p, pattern) for pattern in patterns))


def _without(reference: ReferenceGeneration, patterns: list[str]) -> ReferenceGeneration:
    """``reference`` without the paths ``patterns`` match (its stacked forward too)."""
    from dataclasses import replace

    def kept(values: dict) -> dict:
        return {p: a for p, a in values.items() if not _matching([p], patterns)}
    forward = reference.forward
    if forward is not None:
        forward = (forward[0], kept(forward[1]))
    return replace(reference, values=[kept(v) for v in reference.values], forward=forward)


def _by_steps(probe, generation: Generation, reference: ReferenceGeneration, skip: list[str], atol, rtol):
    """Each step's calls (``embed``, then ``prefill``/``decode``) against the reference's values
    of that step, by the paths both have (each taken from the first of the step's calls that
    computes it), the reference cut to the probe's positions (:func:`aligned`)."""
    steps = len(generation.tokens)
    if len(reference.values) < steps:
        raise InputError(f"the reference has {len(reference.values)} steps; the generation {steps}")
    references, calls, steps_of, notes, resolvable = [], [], [], [], {}
    reference_paths: set[str] = set()
    compared_paths: set[str] = set()
    for step in range(steps):
        left = {p: a for p, a in reference.values[step].items() if not _matching([p], skip)}
        reference_paths.update(reference.values[step])
        notes.append({})
        for call in reversed(generation.calls_of(step)):  # (the embed call first: the order they ran)
            names = _names(probe, call, left, resolvable)
            served = {}
            for path in [p for p in left if names[p]]:
                compared_paths.add(path)
                served[names[path]], note = aligned(left.pop(path), _shape(probe, names[path], call))
                if note:
                    notes[step][path] = note
            references.append(served)
            calls.append(call)
            steps_of.append(step)
    compared = compare_calls(probe, references, atol=atol, rtol=rtol, calls=calls)
    probe_paths = set()
    for function in {probe.call_record(c).function for c in calls}:
        probe_paths.update(probe.functions[function].imported.module_paths or {})
    return GenerationComparison(
        calls=compared, tokens=list(generation.tokens), reference_tokens=list(reference.tokens)[:steps],
        steps_of_calls=steps_of, notes=notes, skipped=_matching(reference_paths | probe_paths, skip),
        only_probe=sorted(p for p in probe_paths - reference_paths if not _matching([p], skip)),
        only_reference=sorted(p for p in reference_paths - compared_paths if not _matching([p], skip)))


def _shape(probe, name: str, call: int):
    """The shape of ``name``'s value in ``call`` (None: it has none to read)."""
    try:
        return probe.get(name, call=call).shape
    except ProbeError:
        return None


def aligned(reference: np.ndarray, shape) -> tuple[np.ndarray, str]:
    """``reference`` as the probe holds that value, and how it was cut (``""``: not at all).

    The same values in another shape (``(5, 64)`` for ``(1, 5, 64)``: MLC's ``embed`` takes 1-D
    ids) are reshaped; where one axis differs and the probe has fewer positions there (MLC's
    prefill computes ``lm_head`` for the last position only), the reference's trailing positions
    are taken.  Anything else is left as it is, to fail as a shape mismatch."""
    reference = np.asarray(reference)
    if shape is None or tuple(shape) == reference.shape:
        return reference, ""
    shape = tuple(int(d) for d in shape)
    if [d for d in shape if d != 1] == [d for d in reference.shape if d != 1]:
        return reference.reshape(shape), ""
    differing = [a for a in range(len(shape)) if len(shape) == reference.ndim and shape[a] != reference.shape[a]]
    if len(differing) == 1 and shape[differing[0]] < reference.shape[differing[0]]:
        axis, kept = differing[0], shape[differing[0]]
        index = (slice(None),) * axis + (slice(reference.shape[axis] - kept, None),)
        return reference[index], f"the last {kept} of {reference.shape[axis]} positions"
    return reference, ""


def _stacked(probe, generation: Generation, reference: ReferenceGeneration, resolvable: dict):
    """The :class:`~tvm_probe.probe.columns.StackedReference` of decode steps 2 on: each module
    path that has a value in decode, by that name, in the teacher-forced forward (None: not a
    teacher-forced reference of this generation whose every module's axis was proved)."""
    if reference.forward is None or len(reference.values) != len(generation.tokens):
        return None
    prompt_len, outputs = reference.forward
    names = _names(probe, generation.calls[2], outputs, resolvable)
    arrays = {names[path]: array for path, (array, _) in outputs.items() if names[path]}
    axes = {names[path]: axis for path, (_, axis) in outputs.items() if names[path]}
    return StackedReference(arrays, axes, [prompt_len + i - 1 for i in range(2, len(generation.tokens))])


def _served(probe, call: int, values: dict, resolvable: dict) -> dict:
    """The reference values whose module path has a value in that call's function (a module that
    computes nothing of its own, e.g. Dropout in eval, has none: it is not compared), by the
    name that value has there.  ``resolvable``: per function, each path's name where it has a
    value, else "" (looked up once: a generation's decode steps ask the same paths)."""
    known = _names(probe, call, values, resolvable)
    return {known[path]: array for path, array in values.items() if known[path]}


def _names(probe, call: int, paths, resolvable: dict) -> dict:
    """Each of ``paths``' name in that call's function where it has a value there, else ""
    (kept in ``resolvable``, per function)."""
    known = resolvable.setdefault(probe.call_record(call).function, {})
    unknown = [path for path in paths if path not in known]
    if unknown:
        with probe.in_call(call) as function_probe:
            for path in unknown:
                known[path] = _name_with_value(function_probe, f"module:{path}")
    return known


def _name_with_value(function_probe, name: str) -> str:
    """``name`` if it names a value in that function, else ""."""
    try:
        function_probe.resolve(name)
    except NameLookupError:
        return ""
    return name
