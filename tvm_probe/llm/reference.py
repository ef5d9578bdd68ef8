"""The eager reference of a generation: the same :class:`CacheStep` in eager PyTorch, every
module's output recorded per call (issue 24).  torch is imported lazily."""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..importer.hf import WRAPPED, cache_shape, make_cache_step, positions
from ..core.errors import InputError
from ..importer.torch_export import require_torch
from ..probe.generate import prompt_ids


@dataclass
class ReferenceGeneration:
    """Eager generation through the same :class:`CacheStep`: tokens, and per call every
    module's output by the model's own path (``model.layers.0``, ``lm_head``: its
    ``named_modules()``, as the probe names them)."""

    tokens: list[int]
    values: Sequence[dict]
    past: list | None = field(default=None, repr=False)  # the eager cache after the last step
    logits_shapes: tuple = field(default=(), repr=False)  # the logits' shape at each step
    #: teacher-forced: the module paths taken from eager stepping token by token (no sequence
    #: axis proved for them), the others sliced from one forward (see :func:`teacher_forced`)
    stepwise: list = field(default_factory=list)
    #: teacher-forced with every module's axis proved: ``(prompt length, {path: (the forward's
    #: output, its sequence axis)})``, which holds decode step ``i``'s values (from step 2 on) at
    #: position ``prompt length + i - 1`` (a compare reads them all at once: ``compare_generation``)
    forward: tuple | None = field(default=None, repr=False)


def reference_generate(model_or_probe, input_ids, steps: int, tokens=None) -> ReferenceGeneration:
    """The eager reference of a ``steps``-step generation, recording every module's output per step.

    ``tokens=None``: greedy generation in eager PyTorch with the functional cache, one step at a
    time (its own tokens fed back).  ``tokens`` (the generation under test's: at least
    ``steps - 1``): teacher-forced, those tokens fed, as :func:`teacher_forced` computes it in
    two eager calls; ``tokens`` of the result are then the eager model's argmax at each step
    (after the first difference they continue the generation under test, not eager's own)."""
    step, shape = _eager_step(model_or_probe)
    ids = require_torch().from_numpy(prompt_ids(input_ids))
    if tokens is not None:
        return teacher_forced(step, shape, ids, steps, [int(t) for t in tokens])
    return _stepwise(step, shape, ids, steps, fed=None)


def _eager_step(model_or_probe):
    """The :class:`CacheStep` and its :class:`CacheShape` of a ``from_hf`` probe or a model."""
    hf = getattr(model_or_probe, "hf", None)
    step = hf.step if hf is not None else make_cache_step(model_or_probe)
    shape = (hf.reference_shape or hf.shape) if hf is not None else cache_shape(step)
    return step, shape


def _stepwise(step, shape, ids, steps: int, fed: list[int] | None, start=None, recorder=None) -> ReferenceGeneration:
    """Step by step through the functional cache: the prefill, then one token a call, fed its own
    argmax (``fed=None``) or ``fed[i - 1]`` at step i.  ``start`` = ``(past, i)``: go on from step
    ``i`` with that cache (what an earlier call returned); ``recorder``: a :class:`ModuleRecorder`
    already recording ``step``'s model (else one is put in for these steps)."""
    torch = require_torch()
    prompt_len = ids.shape[1]
    past, first = start if start is not None else (shape.empty(1), 0)
    tokens, values, shapes = [], [], []
    recording = contextlib.nullcontext(recorder) if recorder is not None else ModuleRecorder(getattr(step, WRAPPED))
    with recording as recorder, torch.inference_mode():
        for i in range(first, steps):
            if i == 0:
                feed, position = ids, positions(0, prompt_len, 1)
            else:
                token = tokens[-1] if fed is None else fed[i - 1]
                feed, position = torch.tensor([[token]]), positions(prompt_len + i - 1, 1, 1)
            out = step(feed, position, *past)
            values.append(recorder.take())
            tokens.append(int(out[0][0, -1].argmax()))
            shapes.append(tuple(out[0].shape))
            past = list(out[1:])
    return ReferenceGeneration(tokens=tokens, values=values, past=past, logits_shapes=tuple(shapes))


def teacher_forced(step, shape, ids, steps: int, fed: list[int]) -> ReferenceGeneration:
    """The reference of a generation that fed ``fed`` (its own tokens), in two eager calls.

    One forward over the prompt and ``fed[:steps-1]`` (positions from 0, no past) holds every
    step: the prefill's values are its positions ``[0, prompt_len)``, decode step i's its
    position ``prompt_len + i - 1``, each taken along the module's sequence axis.  That axis is
    proved per module, never guessed: one decode step runs as the generation ran it (fed
    ``fed[0]`` after the forward's own cache of the prompt; its values are step 1's), and
    :func:`sequence_axis` finds the one axis whose size is 1 there and the forward's length in
    the forward, all others equal.  A module where none is proved (an output that grows with the
    cache, one that runs in the prefill only) gets every step from the step-by-step reference,
    fed the same tokens (:attr:`ReferenceGeneration.stepwise` lists them)."""
    torch = require_torch()
    if len(fed) < steps - 1:
        raise InputError(f"a teacher-forced reference of {steps} steps needs {steps - 1} tokens, got {len(fed)}")
    if steps == 1:
        first = _stepwise(step, shape, ids, 1, fed)
        return ReferenceGeneration(tokens=first.tokens, values=first.values)
    prompt_len, length = ids.shape[1], ids.shape[1] + steps - 1
    whole = torch.cat([ids, torch.tensor([fed[:steps - 1]], dtype=ids.dtype)], dim=1)
    # (inference mode: torch keeps no autograd state at all; a tenth of the reference's time here)
    with ModuleRecorder(getattr(step, WRAPPED)) as recorder, torch.inference_mode():
        logits, *present = step(whole, positions(0, length, 1), *shape.empty(1))
        forward = recorder.take()
        # (the cache of the prompt alone: the forward's, up to the prompt's end along the length axis)
        run = _stepwise(step, shape, ids, 2, fed, start=([t[:, :, :prompt_len] for t in present], 1),
                        recorder=recorder)
    decode = run.values[0]
    axes = {path: sequence_axis(decode[path].shape, forward[path].shape, length)
            for path in forward if path in decode}
    unproved = sorted({path for path in (*forward, *decode) if axes.get(path) is None})
    logits_axis = sequence_axis(run.logits_shapes[0], tuple(logits.shape), length)
    stepwise = _stepwise(step, shape, ids, steps, fed) if unproved or logits_axis != 1 else None
    # (each proved module's output and the index tuple that takes positions along its axis)
    sliced = {path: (forward[path], (slice(None),) * axis) for path, axis in axes.items() if axis is not None}
    prefill = [(path, *sliced[path]) for path in forward if path in sliced]
    decoded = [(path, *sliced[path]) for path in decode if path in sliced]
    argmax = logits[0].argmax(-1).tolist() if logits_axis == 1 else None  # (eager's token at each position)

    def values_at(i: int) -> dict:
        span = slice(0, prompt_len) if i == 0 else slice(prompt_len + i - 1, prompt_len + i)
        values = dict(decode) if i == 1 else \
            {path: array[prefix + (span,)] for path, array, prefix in (prefill if i == 0 else decoded)}
        if stepwise is not None and i != 1:
            values.update({path: stepwise.values[i][path] for path in unproved if path in stepwise.values[i]})
        return values
    tokens = [run.tokens[0] if i == 1 else argmax[prompt_len + i - 1 if i else prompt_len - 1] if argmax is not None
              else stepwise.tokens[i] for i in range(steps)]
    forward_values = (prompt_len, {path: (forward[path], axes[path]) for path, _, _ in decoded}) \
        if stepwise is None else None
    return ReferenceGeneration(tokens=tokens, values=StepValues(steps, values_at), stepwise=unproved,
                               forward=forward_values)


class StepValues(Sequence):
    """Each step's values of a teacher-forced reference (``{path: array}``), sliced from the
    forward when a step is first read: a compare that reads them all at once
    (:attr:`ReferenceGeneration.forward`) makes none."""

    def __init__(self, steps: int, values_at):
        self._values: list = [None] * steps
        self._values_at = values_at

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(len(self))[i]]
        values = self._values[i]
        if values is None:
            values = self._values[i] = self._values_at(range(len(self))[i])
        return values


def sequence_axis(decode: tuple, forward: tuple, length: int) -> int | None:
    """The one axis along which a module's output is per token, or None where it cannot be proved.

    ``decode``/``forward``: the output's shapes in a decode step (one token after a past) and in
    a forward over ``length`` tokens (no past).  Proved when exactly one axis differs, of size
    1 in the decode step and ``length`` in the forward (an output whose size follows the cache,
    past included, is not 1 in the decode step; one of several token axes differs twice)."""
    if len(decode) != len(forward) or length < 2:
        return None
    differing = [a for a in range(len(forward)) if decode[a] != forward[a]]
    if len(differing) != 1:
        return None
    axis = differing[0]
    return axis if (decode[axis], forward[axis]) == (1, length) else None


class ModuleRecorder:
    """``with ModuleRecorder(model) as r:`` — every submodule's output by path, for each eager
    call of ``model`` in the block (:meth:`take` after each).  Tuple outputs and transformers'
    ``ModelOutput``s give their first tensor (:func:`first_tensor`); ``forward`` is wrapped per instance, so direct
    ``m.forward(...)`` calls count too.  The wrappers are put in once for a whole generation
    (setting a module attribute goes through ``nn.Module.__setattr__``, which is slow) and the
    instance forwards the modules had come back after."""

    def __init__(self, model):
        self._modules = [(path, m) for path, m in model.named_modules() if path]
        self._found: dict[str, np.ndarray] = {}
        self._own: dict[str, Any] = {}

    def take(self) -> dict[str, np.ndarray]:
        found, self._found = self._found, {}
        return found

    def _recording(self, path, forward):
        tensor_type = require_torch().Tensor

        def wrapper(*a, **k):
            output = forward(*a, **k)
            tensor = first_tensor(output)
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


def first_tensor(output):
    """What a forward hook's ``output[0]`` is: the first element of a tuple or list, the first
    field set of a transformers ``ModelOutput`` (``last_hidden_state`` of a ``LlamaModel``), or
    ``output`` itself."""
    if isinstance(output, (tuple, list)):
        return output[0] if output else output
    to_tuple = getattr(output, "to_tuple", None)
    if callable(to_tuple):
        fields = to_tuple()
        return fields[0] if fields else output
    return output
