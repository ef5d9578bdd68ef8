"""The eager reference of a generation: the same :class:`CacheStep` in eager PyTorch, every
module's output recorded per call (issue 24).  torch is imported lazily."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..importer.hf import WRAPPED, cache_shape, make_cache_step, positions
from ..importer.torch_export import require_torch
from ..probe.generate import prompt_ids


@dataclass
class ReferenceGeneration:
    """Eager generation through the same :class:`CacheStep`: tokens, and per call every
    module's output by the model's own path (``model.layers.0``, ``lm_head``: its
    ``named_modules()``, as the probe names them)."""

    tokens: list[int]
    values: list[dict]


def reference_generate(model_or_probe, input_ids, steps: int) -> ReferenceGeneration:
    """Greedy generation in eager PyTorch with the functional cache, recording module outputs."""
    torch = require_torch()
    hf = getattr(model_or_probe, "hf", None)
    step = hf.step if hf is not None else make_cache_step(model_or_probe)
    shape = (hf.reference_shape or hf.shape) if hf is not None else cache_shape(step)
    ids = torch.from_numpy(prompt_ids(input_ids))
    past, feed, position = shape.empty(1), ids, positions(0, ids.shape[1], 1)
    tokens, values = [], []
    with ModuleRecorder(getattr(step, WRAPPED)) as recorder, torch.no_grad():
        for i in range(steps):
            out = step(feed, position, *past)
            values.append(recorder.take())
            tokens.append(int(out[0][0, -1].argmax()))
            past = list(out[1:])
            feed, position = torch.tensor([[tokens[-1]]]), positions(ids.shape[1] + i, 1, 1)
    return ReferenceGeneration(tokens=tokens, values=values)


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
