"""A generation compared with its eager reference, call by call by module path, and token by token."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import NameLookupError, ProbeError
from ..probe.calls import compare_calls
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
    steps = len(generation.tokens)
    resolvable: dict = {}
    refs = [_served(probe, generation.calls[i], reference.values[i], resolvable) for i in range(steps)]
    calls = compare_calls(probe, refs, atol=atol, rtol=rtol, calls=generation.calls)
    return GenerationComparison(calls=calls, tokens=list(generation.tokens), reference_tokens=list(reference.tokens))


def _served(probe, call: int, values: dict, resolvable: dict) -> dict:
    """The reference values whose module path has a value in that call's function (a module that
    computes nothing of its own, e.g. Dropout in eval, has none: it is not compared), by the
    name that value has there.  ``resolvable``: per function, each path's name where it has a
    value, else "" (looked up once: a generation's decode steps ask the same paths)."""
    known = resolvable.setdefault(probe.call_record(call).function, {})
    unknown = [path for path in values if path not in known]
    if unknown:
        with probe.in_call(call) as function_probe:
            for path in unknown:
                known[path] = _name_with_value(function_probe, f"module:{path}")
    return {known[path]: array for path, array in values.items() if known[path]}


def _name_with_value(function_probe, name: str) -> str:
    """``name`` if it names a value in that function, else ""."""
    try:
        function_probe.resolve(name)
    except NameLookupError:
        return ""
    return name
