"""A generation compared with its eager reference, call by call by module path, and token by token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import NameLookupError, ProbeError
from ..probe.calls import compare_calls, compare_stacked
from ..probe.columns import StackedReference
from ..probe.generate import Generation
from .reference import ReferenceGeneration, reference_generate


@dataclass
class GenerationComparison:
    """A generation against its reference: per call by module path, and token by token.

    Truthy when every compared value of every call is within tolerance and every token agrees.

    Attributes:
        calls: the :class:`~tvm_probe.probe.calls.CallsComparison` (one Comparison per call).
        tokens, reference_tokens: the generation's tokens, and eager's at each step (by default
            eager fed the generation's tokens: after a first difference it goes on from them).
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
        """``(step, value name)`` of the earliest step's first divergent value, or None (the
        step: its place in the generation, 0 for the prefill, whatever calls the probe made before)."""
        return next(((step, comparison.first_divergent.name)
                     for step, (_, _, comparison) in enumerate(self.calls.by_call)
                     if comparison.first_divergent is not None), None)

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
    """Compare the probe's last ``generate`` with ``reference``, call by call, by module path.

    The default reference is made now in eager PyTorch, teacher-forced with the generation's own
    tokens (:func:`~tvm_probe.llm.reference.teacher_forced`: two eager calls whatever the
    number of steps): each step's values are what eager computes from the same context, and its
    tokens eager's argmax there, so the first different token is where the two first disagree.
    Pass ``reference=reference_generate(probe, prompt, steps)`` for eager's own free-running
    generation instead."""
    hf = getattr(probe, "hf", None)
    if hf is None or not hf.generations:
        raise ProbeError("compare_generation() needs a probe made by Probe.from_hf that has run generate()")
    generation = generation or hf.generations[-1]
    if reference is None:
        reference = reference_generate(probe, generation.prompt, len(generation.tokens), tokens=generation.tokens)
    steps, resolvable = len(generation.tokens), {}
    # (decode steps from the second on, read at once from the teacher-forced forward where it holds them)
    stacked = _stacked(probe, generation, reference, resolvable) if steps > 2 else None
    later = compare_stacked(probe, generation.calls[2:steps], stacked, atol, rtol) if stacked is not None else None
    one_by_one = steps if later is None else 2
    refs = [_served(probe, generation.calls[i], reference.values[i], resolvable) for i in range(one_by_one)]
    calls = compare_calls(probe, refs, atol=atol, rtol=rtol, calls=generation.calls[:one_by_one])
    if later is not None:
        calls.by_call += later.by_call
    return GenerationComparison(calls=calls, tokens=list(generation.tokens), reference_tokens=list(reference.tokens))


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
