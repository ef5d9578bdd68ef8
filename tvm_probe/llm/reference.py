"""The eager reference of a generation: the same :class:`CacheStep` in eager PyTorch, every
module's output recorded per call (issue 24).  torch is imported lazily."""
from __future__ import annotations

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
    values: list[dict]
    past: list | None = field(default=None, repr=False)  # the eager cache after the last step
    logits_shapes: tuple = field(default=(), repr=False)  # the logits' shape at each step


def reference_generate(model_or_probe, input_ids, steps: int, tokens=None) -> ReferenceGeneration:
    """The eager reference of a ``steps``-step generation, recording every module's output per step.

    ``tokens=None``: greedy generation in eager PyTorch with the functional cache, one step at a
    time (its own tokens fed back).  ``tokens`` (the generation under test's: at least
    ``steps - 1``): teacher-forced, those tokens fed, as :func:`teacher_forced` computes it in
    three eager calls; ``tokens`` of the result are then the eager model's argmax at each step
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


def _stepwise(step, shape, ids, steps: int, fed: list[int] | None, start=None) -> ReferenceGeneration:
    """Step by step through the functional cache: the prefill, then one token a call, fed its own
    argmax (``fed=None``) or ``fed[i - 1]`` at step i.  ``start`` = ``(past, i)``: go on from step
    ``i`` with that cache (what an earlier call returned)."""
    torch = require_torch()
    prompt_len = ids.shape[1]
    past, first = start if start is not None else (shape.empty(1), 0)
    tokens, values, shapes = [], [], []
    with ModuleRecorder(getattr(step, WRAPPED)) as recorder, torch.no_grad():
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
    """The reference of a generation that fed ``fed`` (its own tokens), in three eager calls.

    The prefill and the first decode step run as the generation ran them (their values are
    those of the step-by-step reference); then one forward over the prompt and ``fed[:steps-1]``
    (positions from 0, no past) gives every later step at once: decode step i's value is that
    forward's output at position ``prompt_len + i - 1``, taken along the module's sequence axis.
    That axis is proved per module, never guessed (:func:`sequence_axis`: the one axis whose size
    is the prompt's in the prefill, 1 in the decode step and the forward's length in the
    forward, all others equal); a module where none is proved (e.g. one whose output grows with
    the cache) gets its later steps from the step-by-step reference, fed the same tokens."""
    torch = require_torch()
    if len(fed) < steps - 1:
        raise InputError(f"a teacher-forced reference of {steps} steps needs {steps - 1} tokens, got {len(fed)}")
    first = _stepwise(step, shape, ids, min(steps, 2), fed)
    if steps <= 2:
        return ReferenceGeneration(tokens=first.tokens, values=first.values)
    prompt_len, length = ids.shape[1], ids.shape[1] + steps - 1
    whole = torch.cat([ids, torch.tensor([fed[:steps - 1]], dtype=ids.dtype)], dim=1)
    with ModuleRecorder(getattr(step, WRAPPED)) as recorder, torch.no_grad():
        logits = step(whole, positions(0, length, 1), *shape.empty(1))[0]
        forward = recorder.take()
    prefill, decode = first.values
    axes = {path: sequence_axis(prefill[path].shape, decode[path].shape, forward[path].shape, prompt_len, length)
            for path in decode if path in prefill and path in forward}
    unproved = [path for path in decode if axes.get(path) is None]
    logits_axis = sequence_axis(*first.logits_shapes, tuple(logits.shape), prompt_len, length)
    later = None
    if unproved or logits_axis != 1:  # the same tokens fed, one step at a time
        later = _stepwise(step, shape, ids, steps, fed, start=(first.past, 2))
    values, tokens = list(first.values), list(first.tokens)
    for i in range(2, steps):
        at = prompt_len + i - 1
        sliced = {path: _at(forward[path], axes[path], at) for path in decode if axes.get(path) is not None}
        if later is not None:
            sliced.update({path: later.values[i - 2][path] for path in unproved if path in later.values[i - 2]})
        tokens.append(int(logits[0, at].argmax()) if logits_axis == 1 else later.tokens[i - 2])
        values.append(sliced)
    return ReferenceGeneration(tokens=tokens, values=values)


def sequence_axis(prefill: tuple, decode: tuple, forward: tuple, prompt_len: int, length: int) -> int | None:
    """The one axis along which a module's output is per token, or None where it cannot be proved.

    ``prefill``/``decode``/``forward``: the output's shapes in the prefill (``prompt_len``
    tokens), a decode step (one token after the prompt) and the teacher-forced forward
    (``length`` tokens).  Proved when exactly one axis has sizes ``prompt_len``, 1 and
    ``length`` there and every other axis is the same in all three."""
    if not len(prefill) == len(decode) == len(forward) or prompt_len == length:
        return None
    differing = [a for a in range(len(forward)) if not prefill[a] == decode[a] == forward[a]]
    if len(differing) != 1:
        return None
    axis = differing[0]
    sizes = (prefill[axis], decode[axis], forward[axis])
    return axis if sizes == (prompt_len, 1, length) else None


def _at(array: np.ndarray, axis: int, position: int) -> np.ndarray:
    """``array``'s one position along ``axis``, that axis kept (a view)."""
    return array[(slice(None),) * axis + (slice(position, position + 1),)]


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
