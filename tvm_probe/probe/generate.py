"""Greedy generation through a probe: prefill, then decode steps (issues 24, 53).

Two protocols, each step a :meth:`Probe.call` of the compiled executable, captured and numbered
as calls are; ``probe.generations[-1]`` (a :class:`Generation`) says which call gave which token:

* a probe made by ``Probe.from_hf``: ``prefill``/``decode`` take the token ids, positions and the
  cache as tensors and return logits and the new cache (:mod:`tvm_probe.importer.hf`);
* an nn model with MLC-LLM's functions (``embed``, ``prefill``, ``decode`` and a paged-KV-cache
  creator), driven as MLC's runtime drives it (:class:`MLCProtocol`): the cache made once and
  sequence 0 added; per step ``embed`` of the 1-D ids, its ``(n, hidden)`` result viewed as
  ``(1, n, hidden)``, then ``prefill``/``decode`` between ``vm.builtin.kv_state_begin_forward``
  and ``kv_state_end_forward``.

The eager reference and the comparison are :mod:`tvm_probe.llm`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..core.errors import InputError, NameLookupError, ProbeError
from ..importer.hf import DECODE, PREFILL


@dataclass
class Generation:
    """One :func:`generate`: the new tokens and the probe calls that produced each.

    ``calls[i]`` is the call whose logits gave ``tokens[i]`` (its prefill or decode call; the
    first is the prefill).  An MLC-style model's step also has an ``embed`` call
    (``embed_calls[i]``), and ``cache_call`` made its KV cache (``kv_cache``: the creator's
    arguments); a ``from_hf`` probe's have neither (None)."""

    prompt: np.ndarray
    tokens: list[int]
    calls: list[int]
    embed_calls: list[int] | None = None
    cache_call: int | None = None
    kv_cache: dict | None = None

    def calls_of(self, step: int) -> list[int]:
        """The calls of step ``step``: its prefill/decode call, then its ``embed`` call if any."""
        if not isinstance(step, (int, np.integer)) or not -len(self.calls) <= step < len(self.calls):
            raise InputError(f"step={step!r}: this generation has steps 0..{len(self.calls) - 1}")
        return [self.calls[step]] + ([self.embed_calls[step]] if self.embed_calls is not None else [])


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


def generate(probe, input_ids, steps: int, capture="all", kv_cache: Mapping | None = None) -> list[int]:
    """``steps`` new tokens, greedy, from the compiled executable (``max_new_tokens=steps``).

    The first step is the prefill (its last logits give the first new token); the others are
    decode steps, each fed the previous token.  Every call is captured (``capture``) and
    numbered as :meth:`Probe.call` numbers them; ``probe.generations[-1]`` says which call gave
    which token.  ``kv_cache``: an MLC-style model's cache-creator arguments by name."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise InputError(f"steps={steps!r}: give the number of new tokens, an int >= 1")
    if probe.hf is None:
        return MLCProtocol.of(probe).generate(prompt_ids(input_ids), steps, capture, kv_cache)
    if kv_cache is not None:
        raise InputError("kv_cache= sets an MLC-style model's cache creator; a Probe.from_hf probe's cache is "
                         "its tensors (make the probe with a larger max_len for longer generations)")
    hf = probe.hf
    ids = prompt_ids(input_ids)
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


def value_at_step(probe, name: str, step: int) -> np.ndarray:
    """``name``'s value in step ``step`` of the probe's last generation: at the step's
    prefill/decode call, else at its ``embed`` call (what only that computes)."""
    if not probe.generations:
        raise InputError(f"get({name!r}, step={step}): step= reads a generation; run probe.generate(...) first")
    main, *others = probe.generations[-1].calls_of(step)
    try:
        return probe.get(name, call=main)
    except NameLookupError:
        for other in others:
            try:
                return probe.get(name, call=other)
            except NameLookupError:
                pass
        raise  # (the step's main call's own error)


# -- MLC-LLM's protocol ---------------------------------------------------------------------------
#: the functions MLC's runtime calls for one sequence, besides a cache creator
MLC_FUNCTIONS = ("embed", "prefill", "decode")
#: the cache creators MLC's runtime looks for, in its order (a build's pipeline picks one:
#: MLC's DispatchKVCacheCreation replaces ``create_paged_kv_cache`` with one of the first two)
CREATORS = ("create_flashinfer_paged_kv_cache", "create_tir_paged_kv_cache", "create_paged_kv_cache")
#: tokens per page: MLC's runtime's, and what TVM's TIR paged KV cache compiles its kernels for
PAGE_SIZE = 16


@dataclass
class MLCProtocol:
    """How to generate with an nn model that has MLC-LLM's functions: the creator to call, and the
    model's serving config (:attr:`Probe.serving`), which gives the creator's arguments and the
    vocabulary size the token ids are checked against (None: the config does not say)."""

    probe: object
    creator: str
    serving: dict

    @property
    def sizes(self) -> dict:
        return creator_sizes(self.serving)

    @property
    def vocab_size(self) -> int | None:
        return self.serving.get("vocab_size")

    @classmethod
    def of(cls, probe) -> "MLCProtocol":
        """The protocol of ``probe``'s executable, or a one-line ProbeError naming what it lacks."""
        have = list(probe.functions)
        creator = next((c for c in CREATORS if c in have), None)
        missing = [f for f in MLC_FUNCTIONS if f not in have]
        if creator is None:
            missing.append(f"a paged-KV-cache creator ({' or '.join(CREATORS[::-1])})")
        needs = ("generate() needs a probe made by Probe.from_hf, or by Probe.from_nn of a model with MLC-LLM's "
                 "functions (embed, prefill, decode and a KV cache creator)")
        if missing and len(have) == 1:  # (a model of one function: no protocol at all)
            raise ProbeError(needs)
        if missing:
            raise ProbeError(f"{needs}; this executable has {', '.join(have)} and lacks {', '.join(missing)}")
        return cls(probe, creator, dict(getattr(probe, "serving", {}) or {}))

    def creator_params(self) -> list[str]:
        """The creator's parameters by name (a trailing ``_``, which a pass's new Vars may carry,
        left out: ``max_total_seq_len_`` is ``max_total_seq_len``)."""
        return [name.rstrip("_") for name, _ in self.probe.functions[self.creator].imported.params]

    def arguments(self, kv_cache: Mapping | None) -> dict:
        """The creator's arguments by name: the config's, then ``kv_cache``'s."""
        params = self.creator_params()
        given = dict(kv_cache or {})
        unknown = [k for k in given if k not in params]
        if unknown:
            raise InputError(f"kv_cache={{{unknown[0]!r}: ...}}: {self.creator} takes {', '.join(params)}")
        chosen = {**{p: self.sizes[p] for p in params if p in self.sizes}, **given}
        missing = [p for p in params if p not in chosen]
        if missing:
            raise InputError(f"{self.creator} needs {', '.join(missing)}, which the model's config does not give: "
                             f"pass kv_cache={{{missing[0]!r}: N}}")
        for name, value in chosen.items():
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
                raise InputError(f"kv_cache={{{name!r}: {value!r}}}: give a non-negative int")
        return {p: int(chosen[p]) for p in params}

    def generate(self, ids: np.ndarray, steps: int, capture, kv_cache: Mapping | None) -> list[int]:
        import tvm

        args = self.arguments(kv_cache)
        self._check(ids, steps, args)
        probe, builtin = self.probe, tvm.get_global_func
        begin, end = builtin("vm.builtin.kv_state_begin_forward"), builtin("vm.builtin.kv_state_end_forward")
        cache = probe.call(self.creator, *[tvm.runtime.ShapeTuple([v]) for v in args.values()], capture=None)
        generation = Generation(prompt=ids, tokens=[], calls=[], embed_calls=[], cache_call=probe.num_calls - 1,
                                kv_cache=args)
        builtin("vm.builtin.kv_state_add_sequence")(cache, 0)
        window = (self.serving.get("sliding_window_size", 0), self.serving.get("attention_sink_size", 0))
        if args.get("support_sliding_window") and window[0] > 0:  # (as MLC's runtime does for such models)
            builtin("vm.builtin.attention_kv_cache_enable_sliding_window_for_seq")(cache, 0, *window)
        feed, sequence = ids[0].astype(np.int32), tvm.runtime.ShapeTuple([0])
        for i in range(steps):
            embedding = probe.call("embed", feed, capture=capture)
            generation.embed_calls.append(probe.num_calls - 1)
            if len(getattr(embedding, "shape", ())) != 2:
                raise ProbeError(f"embed returned {type(embedding).__name__} {getattr(embedding, 'shape', '')}; "
                                 "MLC's protocol takes one (tokens, hidden) tensor from it")
            n, hidden = embedding.shape
            begin(cache, sequence, tvm.runtime.ShapeTuple([n]))
            out = probe.call("prefill" if i == 0 else "decode", embedding._create_view((1, n, hidden)), cache,
                             capture=capture)
            end(cache)
            logits = out[0].numpy()
            generation.tokens.append(int(np.argmax(logits.reshape(-1, logits.shape[-1])[-1])))
            generation.calls.append(probe.num_calls - 1)
            feed = np.array([generation.tokens[-1]], np.int32)
        probe.generations.append(generation)
        return list(generation.tokens)

    def _check(self, ids: np.ndarray, steps: int, args: dict) -> None:
        """One line for a prompt the cache or the vocabulary cannot take (TVM's gather reads past
        its table without a check: an id past the vocabulary would crash the process)."""
        if self.vocab_size is not None and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            raise InputError(f"input_ids: token id {bad} is outside the vocabulary (0..{self.vocab_size - 1}, "
                             "the model's config vocab_size)")
        chunk, total = args.get("prefill_chunk_size"), args.get("max_total_seq_len")
        if chunk is not None and ids.shape[1] > chunk:
            raise InputError(f"a prompt of {ids.shape[1]} tokens is longer than the prefill chunk "
                             f"({chunk}): pass kv_cache={{'prefill_chunk_size': {ids.shape[1]}}} or a shorter prompt")
        if total is not None and ids.shape[1] + steps > total:
            raise InputError(f"a prompt of {ids.shape[1]} tokens + {steps} steps is longer than the KV cache holds "
                             f"(max_total_seq_len={total}): pass kv_cache={{'max_total_seq_len': "
                             f"{ids.shape[1] + steps}}} or fewer steps")


def creator_sizes(serving: Mapping[str, int]) -> dict:
    """A cache creator's sizes from an MLC config's entries, as MLC's runtime derives them: the
    cache holds ``context_window_size`` tokens (else ``max_position_embeddings`` or
    ``max_sequence_length``), a prefill takes ``prefill_chunk_size`` (else at most 8192 of the
    context), one sequence, pages of 16 tokens, no sliding window unless ``sliding_window_size``
    is positive."""
    context = next((serving[k] for k in ("context_window_size", "max_position_embeddings", "max_sequence_length")
                    if serving.get(k, 0) > 0), None)
    window = serving.get("sliding_window_size", 0)
    sizes = {"max_batch_size": 1, "page_size": PAGE_SIZE, "support_sliding_window": int(window > 0)}
    if context is not None:
        sizes["max_total_seq_len"] = context
        sizes["prefill_chunk_size"] = serving.get("prefill_chunk_size") or min(context, 8192)
    elif serving.get("prefill_chunk_size"):
        sizes["prefill_chunk_size"] = serving["prefill_chunk_size"]
    return sizes
