"""Tensor element types by name: the one home of "dtype name → numpy dtype / size".

TVM names dtypes as numpy does (``float32``, ``int64``, ``bool``) plus types numpy lacks:
``bfloat16`` and ``float8_*``, which the optional ``ml_dtypes`` package provides.  numpy only.
"""
from __future__ import annotations

import functools
import re

import numpy as np

#: dtypes numpy has only through ml_dtypes.
ML_DTYPES = frozenset({"bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                       "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                       "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"})

_BITS = re.compile(r"^(?:u?int|float|bfloat)(\d+)")  # the element's bits: float8_e4m3 → 8


def canonical(dtype) -> str:
    """The TVM/numpy name of ``dtype`` (a name, a numpy dtype or type): ``np.float32`` → ``"float32"``."""
    name = str(dtype)
    if name in ML_DTYPES:
        return name
    try:
        return str(np.dtype(dtype))
    except TypeError:
        return name


@functools.lru_cache(maxsize=None)
def numpy_dtype(name: str) -> np.dtype | None:
    """The numpy dtype holding values of ``name``, or None when numpy cannot (a packed type such
    as ``int4``, or ``bfloat16`` without ``ml_dtypes`` installed)."""
    bits = _BITS.match(name)
    if bits is not None and int(bits.group(1)) % 8:
        return None  # packed (int4, uint1...): numpy's "int4" would be a 4-byte int
    if name in ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            return None
        kind = getattr(ml_dtypes, name, None)
        return None if kind is None else np.dtype(kind)
    try:
        return np.dtype(name)
    except TypeError:
        return None


def itemsize(name: str) -> int | None:
    """Bytes per element of ``name`` (``bfloat16`` 2, with or without ml_dtypes); None when the
    type packs several elements in a byte or is not a tensor dtype."""
    dtype = numpy_dtype(name)
    if dtype is not None:
        return dtype.itemsize
    if name == "bool":
        return 1
    match = _BITS.match(name)
    if match is None or int(match.group(1)) % 8 or re.search(r"x\d+$", name):  # packed, or a vector type
        return None
    return int(match.group(1)) // 8


def nbytes(shape, name: str) -> int:
    """Bytes of a tensor of ``shape`` and dtype ``name`` (0 for a dtype without a byte size)."""
    return int(np.prod(shape, dtype=np.int64)) * (itemsize(name) or 0)


def is_exact(name: str) -> bool:
    """Integers and booleans: compared exactly."""
    dtype = numpy_dtype(name)
    return dtype is not None and dtype.kind in "biu"
