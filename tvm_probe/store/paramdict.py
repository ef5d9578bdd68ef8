"""Read and write TVM's param-dict binary format with numpy alone (no TVM import).

This is the format written by ``tvm.runtime.save_param_dict`` and read by
``tvm.runtime.load_param_dict`` (C++: ``SaveParams``/``LoadParams`` in
``src/runtime/file_utils.cc`` and ``SaveDLTensor``/``Tensor::Load`` in
``include/tvm/runtime/tensor.h``).  Every integer is little-endian and there is
no padding or alignment anywhere::

    file   := u64 list_magic          0xF7E58D4F05049CB7 (kTVMTensorListMagic)
              u64 reserved            written as 0, ignored on read
              u64 n_names
              name * n_names
              u64 n_tensors           must equal n_names
              tensor * n_tensors      tensor i belongs to name i
              <end of data>           (TVM ignores trailing bytes; we reject them)

    name   := u64 length, then `length` bytes of UTF-8 (dmlc std::string)

    tensor := u64 tensor_magic        0xDD5E40F096B4A13F (kTVMTensorMagic)
              u64 reserved            written as 0, ignored on read
              i32 device_type         DLDevice; must be 1 (kDLCPU)
              i32 device_id           written as 0, ignored on read
              i32 ndim                0..64 (numpy's limit; TVM sets none)
              u8  dtype_code          DLDataType code (table below)
              u8  dtype_bits
              u16 dtype_lanes         must be 1
              i64 shape[ndim]         each >= 0, row-major
              i64 data_byte_size      == prod(shape) * ((bits + 7) // 8)
              data_byte_size bytes    C-contiguous element data, little-endian

The fixed tensor header (magic through lanes) is 32 bytes.  An ``ndim == 0``
tensor is a scalar with one element; a zero in ``shape`` means zero data bytes.

DLDataType (code, bits) -> dtype name, one element per ``(bits + 7) // 8`` bytes:

    (0, 8|16|32|64)  int8 .. int64        (1, 8|16|32|64)  uint8 .. uint64
    (2, 16|32|64)    float16 .. float64   (6, 8)           bool (bytes 0/1)
    (1, 1)           bool as older TVM releases wrote it (uint1); read only
    (4, 16)          bfloat16             (7..14, 8)       float8_* (see _DTYPES)

bfloat16 and float8_* need the optional ``ml_dtypes`` package to become numpy
arrays; :func:`read_index` works without it.

:func:`load` copies every tensor into memory; :class:`MappedParams` maps the file instead and
reads a tensor's bytes only when it is used (dumps are read this way).  Sub-byte types (int4, float4_e2m1fn,
float6_*: TVM packs them in memory yet records one byte per element here),
complex, opaque handles and vector types (lanes > 1) are refused.

TVM quirk: ``tvm.runtime.load_param_dict`` rejects any zero-size tensor whose
shape[0] != 0, e.g. shape (3, 0) (its 0-byte data read counts as a failure
unless shape[0] == 0), although ``save_param_dict`` writes them.  This module
reads and writes them like any other tensor.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
from dataclasses import dataclass
from collections.abc import Mapping

import numpy as np

from ..core.dtypes import numpy_dtype

__all__ = [
    "LIST_MAGIC",
    "TENSOR_MAGIC",
    "ParamDictError",
    "DtypeUnavailableError",
    "TensorEntry",
    "MappedParams",
    "dumps",
    "loads",
    "save",
    "load",
    "read_index",
    "view",
]

LIST_MAGIC = 0xF7E58D4F05049CB7
TENSOR_MAGIC = 0xDD5E40F096B4A13F
KDL_CPU = 1

_LIST_HEAD = struct.Struct("<QQ")  # list_magic, reserved
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# tensor_magic, reserved, device_type, device_id, ndim, code, bits, lanes
_TENSOR_HEAD = struct.Struct("<QQiiiBBH")

# (DLDataType code, bits) -> dtype name.  Names are numpy / ml_dtypes names.
_DTYPES: dict[tuple[int, int], str] = {
    **{(0, b): f"int{b}" for b in (8, 16, 32, 64)},
    **{(1, b): f"uint{b}" for b in (8, 16, 32, 64)},
    **{(2, b): f"float{b}" for b in (16, 32, 64)},
    (6, 8): "bool",
    (4, 16): "bfloat16",
    (7, 8): "float8_e3m4",
    (8, 8): "float8_e4m3",
    (9, 8): "float8_e4m3b11fnuz",
    (10, 8): "float8_e4m3fn",
    (11, 8): "float8_e4m3fnuz",
    (12, 8): "float8_e5m2",
    (13, 8): "float8_e5m2fnuz",
    (14, 8): "float8_e8m0fnu",
}
_LEGACY_DTYPES: dict[tuple[int, int], str] = {(1, 1): "bool"}
_DTYPE_CODES: dict[str, tuple[int, int]] = {name: key for key, name in _DTYPES.items()}
_MAX_NDIM = 64  # numpy's limit; also bounds what a corrupted ndim can allocate
_MAX_NBYTES = 2**63 - 1  # data_byte_size is an int64


class ParamDictError(ValueError):
    """The bytes are not a valid param dict; the message names what and where."""


class DtypeUnavailableError(ParamDictError):
    """The tensor is valid but its dtype needs the optional ``ml_dtypes`` package."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's data lives inside a param-dict buffer."""

    name: str
    dtype: str  # a key of the dtype table, e.g. "float32", "bool", "bfloat16"
    shape: tuple[int, ...]
    offset: int  # byte offset of the first data byte
    nbytes: int


# --------------------------------------------------------------------------- dtypes


def _dtype_code(dtype: np.dtype) -> tuple[int, int]:
    """(code, bits) for a numpy dtype, or TypeError if TVM's format cannot hold it."""
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype
    key = _DTYPE_CODES.get(native.name)
    if key is None or numpy_dtype(native.name) != native:
        raise TypeError(f"dtype {dtype} cannot be stored in a TVM param dict")
    return key


# --------------------------------------------------------------------------- writing


def _tensor_bytes(name: str, value: object) -> list[bytes | np.ndarray]:
    arr = np.asarray(value)
    try:
        code, bits = _dtype_code(arr.dtype)
    except TypeError as exc:
        raise TypeError(f"tensor {name!r}: {exc}") from None
    if arr.dtype.byteorder in "<>":
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # not ascontiguousarray: that turns 0-d into 1-d
    if sys.byteorder == "big" and arr.dtype.itemsize > 1:
        arr = arr.byteswap()
    head = _TENSOR_HEAD.pack(TENSOR_MAGIC, 0, KDL_CPU, 0, arr.ndim, code, bits, 1)
    shape = struct.pack(f"<{arr.ndim}q", *arr.shape)
    return [head, shape, _I64.pack(arr.nbytes), arr.reshape(-1).view(np.uint8)]


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"param dict keys must be str, got {type(name).__name__}")
    raw = name.encode("utf-8")
    return _U64.pack(len(raw)) + raw


def dumps(tensors: Mapping[str, np.ndarray]) -> bytes:
    """Serialize ``{name: array}`` exactly as ``tvm.runtime.save_param_dict`` does."""
    parts: list[bytes | np.ndarray] = [_LIST_HEAD.pack(LIST_MAGIC, 0), _U64.pack(len(tensors))]
    parts += [_name_bytes(name) for name in tensors]
    parts.append(_U64.pack(len(tensors)))
    for name, value in tensors.items():
        parts += _tensor_bytes(name, value)
    return b"".join(parts)


def save(path: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> None:
    """Write ``tensors`` to ``path`` in the format of :func:`dumps`, one tensor at a time."""
    with open(path, "wb") as f:
        writer = StreamWriter(f, list(tensors))
        for name, value in tensors.items():
            writer.write(name, value)
        writer.close()


class StreamWriter:
    """Writes a param dict whose names are known up front, one tensor at a time, in order.

    The names list precedes the tensors in the format, so a run whose outputs are known in
    advance can stream each tensor to disk as it is produced and hold none of them in memory.
    The bytes are those :func:`dumps` would produce for the same dict.
    """

    def __init__(self, file, names: list[str]):
        self._file, self._names, self._next = file, list(names), 0
        file.write(_LIST_HEAD.pack(LIST_MAGIC, 0) + _U64.pack(len(self._names)))
        for name in self._names:
            file.write(_name_bytes(name))
        file.write(_U64.pack(len(self._names)))

    def write(self, name: str, value) -> None:
        """Append tensor ``name``; names must come in the order given to the constructor."""
        if self._next >= len(self._names) or self._names[self._next] != name:
            expected = self._names[self._next] if self._next < len(self._names) else "nothing more"
            raise ValueError(f"param dict stream: got tensor {name!r}, expected {expected!r}")
        for part in _tensor_bytes(name, value):
            self._file.write(part)
        self._next += 1

    def close(self) -> None:
        """Check that every announced tensor was written."""
        if self._next != len(self._names):
            raise ValueError(f"param dict stream: {len(self._names) - self._next} announced tensors "
                             f"were never written (next: {self._names[self._next]!r})")


# --------------------------------------------------------------------------- reading


class _Cursor:
    """Bounds-checked little-endian reader; every failure is a ParamDictError."""

    def __init__(self, data, source: str):
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.source = source
        self.context = ""

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def fail(self, problem: str, detail: str, at: int | None = None) -> ParamDictError:
        where = self.pos if at is None else at
        ctx = f" while reading {self.context}" if self.context else ""
        return ParamDictError(f"{self.source}: {problem} at byte {where}{ctx}: {detail}")

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise self.fail("truncated", f"expected {n} {what} bytes, found {self.remaining}")

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        self.need(fmt.size, what)
        values = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return values

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)[0]

    def count(self, what: str, min_item_size: int) -> int:
        """A u64 item count, bounded by what the remaining bytes could hold."""
        at = self.pos
        n = self.u64(what)
        if n * min_item_size > self.remaining:
            need = n * min_item_size
            detail = f"{what} {n} needs at least {need} more bytes, found {self.remaining}"
            raise self.fail("truncated", detail, at)
        return n


def _read_names(cur: _Cursor) -> list[str]:
    count = cur.count("names count", _U64.size)
    names: list[str] = []
    seen: set[str] = set()
    for i in range(count):
        cur.context = f"name {i}"
        at = cur.pos
        length = cur.u64("name length")
        cur.need(length, "name")
        try:
            name = bytes(cur.data[cur.pos : cur.pos + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise cur.fail("invalid name", f"not UTF-8 ({exc.reason})", at) from None
        if name in seen:
            raise cur.fail("duplicate name", repr(name), at)
        cur.pos += length
        names.append(name)
        seen.add(name)
    cur.context = ""
    return names


def _element_count(shape: tuple[int, ...], cap: int) -> int | None:
    """prod(shape), or None once it exceeds ``cap`` (avoids huge-int arithmetic)."""
    if 0 in shape:
        return 0
    total = 1
    for dim in shape:
        total *= dim
        if total > cap:
            return None
    return total


def _read_tensor(cur: _Cursor, name: str) -> TensorEntry:
    at = cur.pos
    magic, _, dev_type, _, ndim, code, bits, lanes = cur.unpack(_TENSOR_HEAD, "tensor header")
    if magic != TENSOR_MAGIC:
        raise cur.fail("bad tensor magic", f"0x{magic:016X} != 0x{TENSOR_MAGIC:016X}", at)
    if dev_type != KDL_CPU:
        raise cur.fail("bad device", f"device_type {dev_type}, expected {KDL_CPU} (CPU)", at + 16)
    dtype = _DTYPES.get((code, bits)) or _LEGACY_DTYPES.get((code, bits))
    if dtype is None or lanes != 1:
        detail = f"unsupported DLDataType code={code} bits={bits} lanes={lanes}"
        raise cur.fail("bad dtype", detail, at + 28)
    if not 0 <= ndim <= _MAX_NDIM:
        raise cur.fail("bad ndim", f"{ndim} is outside 0..{_MAX_NDIM}", at + 24)
    shape_at = cur.pos
    shape = cur.unpack(struct.Struct(f"<{ndim}q"), "shape")
    if any(dim < 0 for dim in shape):
        raise cur.fail("bad shape", f"negative dimension in {list(shape)}", shape_at)
    itemsize = (bits + 7) // 8
    size_at = cur.pos
    nbytes = cur.unpack(_I64, "data size")[0]
    count = _element_count(shape, _MAX_NBYTES // itemsize)
    if count is None or nbytes != count * itemsize:
        expected = "more than int64 can hold" if count is None else str(count * itemsize)
        detail = f"data size {nbytes} != {expected} for {dtype}{list(shape)}"
        raise cur.fail("bad data size", detail, size_at)
    cur.need(nbytes, "data")
    entry = TensorEntry(name, dtype, tuple(shape), cur.pos, nbytes)
    cur.pos += nbytes
    return entry


def _parse(data, source: str) -> list[TensorEntry]:
    cur = _Cursor(data, source)
    magic, _ = cur.unpack(_LIST_HEAD, "header")
    if magic != LIST_MAGIC:
        raise cur.fail("bad magic", f"0x{magic:016X} != 0x{LIST_MAGIC:016X}", 0)
    names = _read_names(cur)
    at = cur.pos
    n_tensors = cur.u64("tensor count")
    if n_tensors != len(names):
        raise cur.fail("count mismatch", f"{n_tensors} tensors for {len(names)} names", at)
    entries = []
    for i, name in enumerate(names):
        cur.context = f"tensor {i} ({name!r})"
        entries.append(_read_tensor(cur, name))
    cur.context = ""
    if cur.remaining:
        raise cur.fail("trailing garbage", f"{cur.remaining} bytes after the last tensor")
    return entries


def read_index(data, *, source: str = "<bytes>") -> list[TensorEntry]:
    """Locate every tensor in ``data`` (bytes-like) without copying any tensor data."""
    return _parse(memoryview(data).cast("B"), source)


def view(data, entry: TensorEntry, *, source: str = "<bytes>") -> np.ndarray:
    """The tensor ``entry`` of :func:`read_index` as an array over ``data`` (no copy).

    Read-only when ``data`` is immutable; a copy only on big-endian hosts.
    """
    where = f"{source}: tensor {entry.name!r} at byte {entry.offset}"
    dtype = numpy_dtype(entry.dtype)
    if dtype is None:
        raise DtypeUnavailableError(f"{where}: dtype {entry.dtype} needs the ml_dtypes package "
                                    "(pip install ml_dtypes)")
    raw = np.frombuffer(data, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
    if entry.dtype == "bool" and raw.size and raw.max() > 1:
        raise ParamDictError(f"{where}: bool data holds bytes other than 0 and 1")
    try:
        arr = raw.view(dtype).reshape(entry.shape)
    except ValueError as exc:
        raise ParamDictError(f"{where}: shape {entry.shape} not representable: {exc}") from None
    if sys.byteorder == "big" and dtype.itemsize > 1:
        arr = arr.byteswap()
    return arr


def loads(data, *, source: str = "<bytes>") -> dict[str, np.ndarray]:
    """Parse a param dict into ``{name: array}``; arrays are writable copies."""
    mem = memoryview(data).cast("B")
    return {e.name: view(mem, e, source=source).copy() for e in _parse(mem, source)}


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read a param-dict file written by TVM or :func:`save`."""
    with open(path, "rb") as f:
        data = f.read()
    return loads(data, source=os.fspath(path))


class MappedParams(Mapping):
    """A param-dict file as a read-only ``{name: array}`` mapping that loads nothing up front.

    Opening maps the file into memory and reads the names, dtypes and shapes (:attr:`entries`);
    each ``[name]`` is a read-only array over the mapped bytes, so the operating system reads a
    tensor from disk only when it is used, and keeps it only while memory allows.  Copy an
    array to modify it.

    The mapping stays valid when the file is renamed or deleted (an open file outlives its
    name), but not when it is truncated in place: only map files that are replaced, not
    rewritten, while they are read.

    Raises:
        ParamDictError: the file is not a valid param dict (on opening, for its structure;
            on ``[name]``, for bool data other than 0/1 or a dtype needing ``ml_dtypes``).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            # mmap refuses empty files; an empty buffer gives the parser's "truncated" error
            empty = os.fstat(f.fileno()).st_size == 0
            self._data = b"" if empty else mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.entries: dict[str, TensorEntry] = {e.name: e for e in read_index(self._data, source=self.path)}

    def __getitem__(self, name: str) -> np.ndarray:
        return view(self._data, self.entries[name], source=self.path)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name) -> bool:
        return name in self.entries
