"""Weights as MLC-LLM stores them on disk: ``tensor-cache.json`` and its ``params_shard_*.bin``.

TVM writes the format (``tvm.contrib.tvmjs.dump_tensor_cache``; MLC's convert step stores float32
weights as bfloat16, ``encode_format="f32-to-bf16"``) and reads it back in the runtime
(``vm.builtin.tensor_cache.load``).  The JSON lists shards (``dataPath``, ``nbytes``, ``md5sum``),
each holding records (``name``, ``shape``, ``dtype``, ``format``, ``byteOffset``, ``nbytes``).
Read here with numpy alone, every record checked against its shard, so that a damaged or
mismatched cache is one line naming the parameter and the file rather than wrong weights.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..core.errors import ModelError

#: The JSON that indexes a cache folder.
INDEX = "tensor-cache.json"
#: Record formats: the bytes as the dtype, or float32 stored as the top half of each value (bfloat16).
RAW, F32_TO_BF16 = "raw", "f32-to-bf16"


def load_tensor_cache(path) -> dict[str, np.ndarray]:
    """``{name: array}`` of every record of the cache at ``path`` (its folder or its JSON), float32
    records stored as bfloat16 widened back to float32 (exactly: bfloat16 is float32's top half).

    Raises:
        ModelError: the index is missing or not JSON, a shard is missing, shorter than its records
            or fails its md5, a record does not fit its shard or its shape, a format is unknown.
    """
    index = Path(path)
    index = index if index.suffix == ".json" else index / INDEX
    if not index.is_file():
        raise ModelError(f"params: '{index}' does not exist: give a folder written by "
                         "tvm.contrib.tvmjs.dump_tensor_cache (MLC's converted weights) or its tensor-cache.json")
    try:
        shards = json.loads(index.read_text(encoding="utf-8"))["records"]
    except (ValueError, KeyError, TypeError) as err:
        raise ModelError(f"params: '{index}' is not a tensor-cache index ({err}): give the tensor-cache.json "
                         "that dump_tensor_cache wrote") from None
    arrays: dict[str, np.ndarray] = {}
    for shard in shards:
        data = _shard_bytes(index.parent / shard["dataPath"], shard)
        for record in shard["records"]:
            arrays[record["name"]] = _decode(record, data, index.parent / shard["dataPath"])
    return arrays


def _shard_bytes(path: Path, shard: dict) -> bytes:
    """A shard's bytes, checked against its record (length, md5 where the index has one)."""
    if not path.is_file():
        raise ModelError(f"params: shard '{path}' listed in {INDEX} is missing")
    data = path.read_bytes()
    if len(data) != shard.get("nbytes", len(data)):
        raise ModelError(f"params: shard '{path}' holds {len(data)} bytes, {INDEX} says {shard['nbytes']}: "
                         "the file is truncated or from another conversion")
    md5 = shard.get("md5sum")
    if md5 and hashlib.md5(data).hexdigest() != md5:
        raise ModelError(f"params: shard '{path}' fails its md5 ({INDEX} says {md5}): the file was changed "
                         "after it was written")
    return data


def _decode(record: dict, data: bytes, shard: Path) -> np.ndarray:
    """One record's array (a copy: the shard's bytes are not kept)."""
    name, shape, dtype = record["name"], tuple(record["shape"]), record["dtype"]
    stored = np.dtype("uint16") if _widened(record) else _numpy_dtype(dtype, name, shard)
    start, nbytes = int(record["byteOffset"]), int(record["nbytes"])
    size = int(np.prod(shape, dtype=np.int64)) * stored.itemsize
    if nbytes != size or start + nbytes > len(data):
        raise ModelError(f"params: '{name}' in '{shard}' is recorded as {nbytes} bytes at offset {start}, but "
                         f"shape {list(shape)} of {dtype} takes {size} and the shard holds {len(data)}")
    values = np.frombuffer(data, dtype=stored, count=size // stored.itemsize, offset=start).reshape(shape)
    if stored == np.uint16 and dtype == "float32":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.copy()


def _widened(record: dict) -> bool:
    """A float32 record stored as bfloat16 (the encoding applies to float32 records only)."""
    fmt = record.get("format", RAW)
    if fmt not in (RAW, F32_TO_BF16):
        raise ModelError(f"params: '{record['name']}' has format {fmt!r}; tvm_probe reads {RAW!r} and "
                         f"{F32_TO_BF16!r}")
    return fmt == F32_TO_BF16 and record["dtype"] == "float32"


def _numpy_dtype(dtype: str, name: str, shard: Path) -> np.dtype:
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ModelError(f"params: '{name}' in '{shard}' is bfloat16: pip install ml_dtypes to read it") \
                from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise ModelError(f"params: '{name}' in '{shard}' has dtype {dtype!r}, which numpy cannot read") from None
