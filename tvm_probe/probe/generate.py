"""Greedy generation through a probe made by ``Probe.from_hf``: prefill, then decode steps (issue 24).

Each step is one ``probe.call`` of the compiled executable, captured and numbered as calls are;
``probe.hf.generations[-1]`` (a :class:`Generation`) says which call gave which token.  How the
model was exported is :mod:`tvm_probe.importer.hf`'s; the eager reference and the comparison are
:mod:`tvm_probe.llm`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError, ProbeError
from ..importer.hf import DECODE, PREFILL


@dataclass
class Generation:
    """One :func:`generate`: the new tokens and the probe call that produced each.

    ``calls[i]`` is the call whose logits gave ``tokens[i]`` (call 0 the prefill).
    """

    prompt: np.ndarray
    tokens: list[int]
    calls: list[int]


def prompt_ids(input_ids) -> np.ndarray:
    """One prompt of token ids as int64 of shape (1, length), or a one-line InputError."""
    ids = np.asarray(input_ids.numpy() if hasattr(input_ids, "numpy") else input_ids)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] == 0 or ids.dtype.kind not in "iu":
        raise InputError(f"input_ids of shape {ids.shape} and dtype {ids.dtype}: give one prompt of integer "
                         "token ids, shape (1, length) or (length,)")
    return ids.astype(np.int64)


def empty_past(hf) -> list[np.ndarray]:
    """The zero-length KV cache a prefill takes, in the dtype the build computes in (float32;
    float16 for a ``q4f16_1`` build)."""
    dtype = str(hf.shape.dtype).replace("torch.", "")
    return [np.zeros((1, hf.shape.kv_heads, 0, hf.shape.head_dim), dtype) for _ in range(2 * hf.shape.layers)]


def generate(probe, input_ids, steps: int, capture="all") -> list[int]:
    """``steps`` new tokens, greedy, from the compiled executable (``max_new_tokens=steps``).

    Call 0 is the prefill (its last logits give the first new token); calls 1..steps-1 are
    decode steps, each fed the previous token, its position and the cache the previous call
    returned.  Every call is captured (``capture``) and numbered as :meth:`Probe.call` numbers
    them; ``probe.hf.generations[-1]`` says which call gave which token.
    """
    hf = probe.hf
    if hf is None:
        raise ProbeError("generate() needs a probe made by Probe.from_hf")
    ids = prompt_ids(input_ids)
    if not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps={steps!r}: give the number of new tokens, an int >= 1")
    if ids.shape[1] + steps > hf.max_len:
        raise InputError(f"a prompt of {ids.shape[1]} tokens + {steps} steps is longer than max_len={hf.max_len}: "
                         "make a probe with a larger max_len")
    past = empty_past(hf)
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
