"""Checking what a user feeds a model against what it takes, before anything runs.

Every problem is one :class:`~tvm_probe.core.errors.InputError` line naming the input and what to do.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .dtypes import numpy_dtype
from .errors import InputError, Remedy
from .records import shapes_remedy


def check_inputs(specs, inputs, allow_nonfinite: bool = False) -> list[np.ndarray]:
    """The inputs as contiguous arrays in ``specs`` order, or an InputError.

    Args:
        specs: the model's :class:`~tvm_probe.importer.InputSpec` list.
        inputs: ``{name: array}``, a list of arrays in ``specs`` order, or one array for a model
            with one input.
        allow_nonfinite: accept NaN / Inf in float inputs (refused by default: usually a data bug).
    """
    if inputs is None:
        raise InputError(f"no inputs given: run() needs {_expected(specs)}")
    if isinstance(inputs, Mapping):
        inputs = _by_name(specs, inputs)
        names = [s.name for s in specs]
        missing = [n for n in names if n not in inputs]
        extra = [n for n in inputs if n not in names]
        if missing:
            raise InputError(f"missing input(s) {', '.join(map(repr, missing))}: run() needs {_expected(specs)}")
        if extra:
            raise InputError(f"unknown input(s) {', '.join(map(repr, extra))}: the model's inputs are {_expected(specs)}")
        values = [inputs[n] for n in names]
    elif hasattr(inputs, "__array__") or np.isscalar(inputs):  # one array, not a list of them
        if len(specs) != 1:
            raise InputError(f"got one array, the model takes {len(specs)} inputs: give a dict or a list "
                             f"({_expected(specs)})")
        values = [inputs]
    else:
        values = list(inputs)
        if len(values) != len(specs):
            raise InputError(f"got {len(values)} inputs, the model takes {len(specs)}: {_expected(specs)}")
    arrays = [check_input(spec, v, allow_nonfinite) for spec, v in zip(specs, values)]
    _check_symbolic_dims(specs, arrays)
    return arrays


def _expected(specs) -> str:
    """What the model takes, for messages."""
    return ", ".join(f"{s.name} {s.dtype}{shape_text(s.shape)}" for s in specs)


def shape_text(shape) -> str:
    """``[2, 'batch']``, or ``[any rank]`` for an input declared without a rank (``shape`` None)."""
    return "[any rank]" if shape is None else str(list(shape))


def _by_name(specs, inputs: Mapping) -> Mapping:
    """``inputs`` keyed by input names, an alias (a TFLite signature key) taken for its input."""
    alias_of = {a: s.name for s in specs for a in getattr(s, "aliases", ()) if a != s.name}
    if not any(k in alias_of for k in inputs):
        return inputs
    named = {}
    for key, value in inputs.items():
        name = key if key not in alias_of or key in {s.name for s in specs} else alias_of[key]
        if name in named:
            raise InputError(f"input {name!r} is given twice (as {key!r} and by another name): give it once")
        named[name] = value
    return named


def host_array(value) -> np.ndarray:
    """``value`` as a numpy array: a tensor that speaks DLPack (a ``tvm.runtime.Tensor`` a
    deployment holds, a torch tensor) is viewed without a copy where it lives on the host, and
    copied to the host otherwise (``.numpy()``); anything else through ``np.asarray``."""
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError):  # on a device, or not exportable as is
            if hasattr(value, "numpy"):
                return np.asarray(value.numpy())
    return np.asarray(value)


def check_input(spec, value, allow_nonfinite: bool = False) -> np.ndarray:
    """One input: dtype, shape, index bounds of embedding ids, NaN/Inf."""
    array = value if type(value) is np.ndarray else host_array(value)
    if array.dtype == object:
        raise InputError(f"input {spec.name!r} is not a numeric array: give a numpy array of {spec.dtype}")
    if array.dtype != numpy_dtype(spec.dtype):
        raise InputError(f"input {spec.name!r} has dtype {array.dtype}, the model expects {spec.dtype}", remedy=Remedy(
            f"convert it with .astype('{spec.dtype}')", key=f"inputs.{spec.name}",
            value=f"a file of {spec.dtype} values, or {{random: {{dtype: {spec.dtype}}}}}",
            flag=f"--inputs FILE.npz holding {spec.name} as {spec.dtype}"))
    if spec.shape is not None and array.shape != spec.shape and (len(array.shape) != len(spec.shape) or any(
            isinstance(want, int) and got != want for got, want in zip(array.shape, spec.shape))):
        raise InputError(f"input {spec.name!r} has shape {list(array.shape)}, the model expects "
                         f"{list(spec.shape)}", remedy=_pinned_remedy(spec, array.shape))
    _check_ids(spec, array)
    if array.dtype.kind == "f" and not allow_nonfinite and not np.isfinite(array).all():
        nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
        raise InputError(f"input {spec.name!r} holds {nan} NaN and {inf} Inf values", remedy=Remedy(
            "fix the data, or pass allow_nonfinite=True to run() to trace how they propagate",
            cli="fix the data (Python's probe.run(..., allow_nonfinite=True) traces how they propagate)"))
    if array.flags.c_contiguous:
        return array
    return np.require(array, requirements="C")  # not ascontiguousarray: that turns 0-d into 1-d


def _pinned_remedy(spec, shape) -> Remedy | None:
    """For an input whose unknown dimensions tvm_probe pinned (and only those differ): build the
    model for the sizes given."""
    if not spec.pinned or len(shape) != len(spec.shape) or any(
            got != want for axis, (got, want) in enumerate(zip(shape, spec.shape)) if axis not in spec.pinned):
        return None
    return shapes_remedy(spec.name, shape, f"the model leaves those sizes unknown and was built for "
                                           f"{list(spec.shape)}: build it for yours, with ")


def _check_ids(spec, array: np.ndarray) -> None:
    """Ids that index a table must be inside it: TVM's compiled Gather does not check bounds."""
    if spec.index_bound is None or not array.size:
        return
    low, bound = id_range(spec)
    if array.min() < low or array.max() >= bound:
        raise InputError(f"input {spec.name!r} holds values outside [{low}, {bound}) but indexes "
                         f"{spec.indexes!r}, which has {bound} rows (TVM's Gather does not check bounds): "
                         "fix the ids")


def id_range(spec) -> tuple[int, int]:
    """``[low, high)`` of the ids an input that indexes a table takes (``spec.index_bound`` set):
    negative ids count from the end in ONNX, not in TFLite (``negative_ids``)."""
    bound = spec.index_bound
    return (-bound if getattr(spec, "negative_ids", True) else 0), bound


def _check_symbolic_dims(specs, arrays) -> None:
    """A symbolic dimension (dynamic axes) named in several places takes one size per run."""
    sizes: dict[str, tuple[int, str]] = {}
    for spec, array in zip(specs, arrays):
        for want, got in zip(spec.shape or (), array.shape):
            if not isinstance(want, str):
                continue
            first = sizes.setdefault(want, (got, spec.name))
            if first[0] != got:
                raise InputError(f"dimension {want!r} is {first[0]} in input {first[1]!r} but {got} in input "
                                 f"{spec.name!r}: one run takes one size for it")


class InputChecker:
    """:func:`check_inputs` for one model, made once: inputs that are already what the model
    takes (numpy arrays of its dtype and shape, C-contiguous, ids in range) pass with a few
    comparisons and one reduction per id input; anything else goes through
    :func:`check_inputs`, which names the problem.  A run of a sub-millisecond model cannot
    afford generic checks twice per run."""

    def __init__(self, specs):
        self.specs = list(specs)
        self._names = [s.name for s in self.specs]
        # a symbolic dimension is checked across inputs by check_inputs (the slow path)
        self._checks = [fast_check(s) for s in self.specs]
        self._fixed = all(c is not None for c in self._checks)

    def __call__(self, inputs, allow_nonfinite: bool = False) -> list[np.ndarray]:
        values = self._listed(inputs) if self._fixed else None
        if values is not None and all(check(v, allow_nonfinite) for v, check in zip(values, self._checks)):
            return values
        return check_inputs(self.specs, inputs, allow_nonfinite)

    def _listed(self, inputs) -> list | None:
        """``inputs`` in input order when given as a dict of exactly the inputs or a list; else None."""
        n = len(self._names)
        if isinstance(inputs, dict) and len(inputs) == n:
            return [inputs.get(name) for name in self._names]
        if type(inputs) is list and len(inputs) == n:
            return list(inputs)  # (the caller's list may change after the run)
        return None


_MIN, _MAX = np.minimum.reduce, np.maximum.reduce


def fast_check(spec):
    """``check(value, allow_nonfinite) -> bool``: True when ``value`` passes every check of
    :func:`check_input` for ``spec`` as it is (a numpy array of its dtype and static shape,
    C-contiguous, ids in range, finite unless allowed); False means "ask check_input", which
    names the problem.  None for a spec with symbolic dimensions (checked across inputs)."""
    if spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
        return None
    dtype, shape = numpy_dtype(spec.dtype), tuple(spec.shape)
    if dtype is None:
        return None
    floating = dtype.kind == "f"
    low, bound = id_range(spec) if spec.index_bound is not None else (None, None)

    def check(value, allow_nonfinite: bool) -> bool:
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            return False
        if not value.flags.c_contiguous:
            return False
        if low is not None and value.size:
            if value.size == 1:  # (a decode step's token: two reductions cost a microsecond of its ~100)
                if not low <= value.item() < bound:
                    return False
            elif _MIN(value, axis=None) < low or _MAX(value, axis=None) >= bound:
                return False
        return allow_nonfinite or not floating or bool(np.isfinite(value).all())

    return check
