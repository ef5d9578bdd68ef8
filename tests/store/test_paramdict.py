"""Tests for tvm_probe.store.paramdict: TVM compatibility, strictness, no tvm import."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tvm_probe.store.paramdict as pd  # noqa: E402
ParamDictError = pd.ParamDictError

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - optional dependency
    ml_dtypes = None

NUMPY_DTYPES = [
    "bool", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
]  # fmt: skip
ML_DTYPES = [
    "bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
    "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
]  # fmt: skip
ALL_DTYPES = NUMPY_DTYPES + (ML_DTYPES if ml_dtypes is not None else [])
SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (2, 3, 4)]


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in ML_DTYPES else np.dtype(name)


def _sample(dtype_name: str, shape, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = _np_dtype(dtype_name)
    if dtype_name == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(size=shape) * 4).astype(dtype)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def _small_dict() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "mask": np.array([True, False, True]),
        "scalar": np.array(-5, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.uint8),
    }


# ----------------------------------------------------------------- importing


def test_import_does_not_pull_in_tvm():
    code = (
        "import json, sys\n"
        "import tvm_probe.store.paramdict as m\n"
        "m.loads(m.dumps({'x': __import__('numpy').ones(3)}))\n"
        "roots = {k.split('.')[0] for k in sys.modules}\n"
        "print(json.dumps(sorted(roots & {'tvm', 'tvm_ffi'})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes to write the file")
def test_bfloat16_without_ml_dtypes_indexes_but_refuses_to_decode(tmp_path):
    path = tmp_path / "bf16.params"
    pd.save(path, {"x": np.ones(3, ml_dtypes.bfloat16), "y": np.ones(2, np.int8)})
    code = (
        "import sys\n"
        "sys.modules['ml_dtypes'] = None  # makes 'import ml_dtypes' fail\n"
        "import tvm_probe.store.paramdict as m\n"
        f"data = open({str(path)!r}, 'rb').read()\n"
        "print([(e.name, e.dtype, e.nbytes) for e in m.read_index(data)])\n"
        "print(m.view(data, m.read_index(data)[1]).tolist())\n"
        "try: m.loads(data)\n"
        "except m.DtypeUnavailableError as e: print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "[('x', 'bfloat16', 6), ('y', 'int8', 2)]",
        "[1, 1]",
        "<bytes>: tensor 'x' at byte 98: dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)",
    ]


# ----------------------------------------------------------------- TVM round trips

@pytest.fixture(scope="module")
def tvm_runtime():
    return pytest.importorskip("tvm").runtime


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_ours_matches_tvm_bytes_and_loads_in_tvm(tvm_runtime, dtype, shape):
    arr = _sample(dtype, shape)
    params = {"t": arr, "after": np.ones(2, np.float32)}
    ours = pd.dumps(params)
    assert ours == bytes(tvm_runtime.save_param_dict(params))
    if arr.size == 0 and shape[0] != 0:
        pytest.skip("TVM cannot load zero-size tensors with shape[0] != 0 (module doc)")
    back = tvm_runtime.load_param_dict(ours)["t"]
    assert str(back.dtype) == dtype
    _assert_same(back.numpy(), arr)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_tvm_output_loads_here(tvm_runtime, dtype, shape):
    arr = _sample(dtype, shape, seed=1)
    data = bytes(tvm_runtime.save_param_dict({"a": arr, "b.weight": arr.reshape(-1)}))
    got = pd.loads(data)
    assert list(got) == ["a", "b.weight"]
    _assert_same(got["a"], arr)
    _assert_same(got["b.weight"], arr.reshape(-1))
    [entry, _] = pd.read_index(data)
    assert (entry.name, entry.dtype, entry.shape, entry.nbytes) == ("a", dtype, shape, arr.nbytes)


def test_many_tensors_both_directions(tvm_runtime):
    params = {f"layer{i}.é{dtype}": _sample(dtype, (i % 4, 3)[: i % 3], seed=i)
              for i, dtype in enumerate(ALL_DTYPES * 2)}  # fmt: skip
    from_tvm = pd.loads(bytes(tvm_runtime.save_param_dict(params)))
    from_us = tvm_runtime.load_param_dict(pd.dumps(params))
    assert list(from_tvm) == list(params) == list(from_us)
    for name, arr in params.items():
        _assert_same(from_tvm[name], arr)
        _assert_same(from_us[name].numpy(), arr)


def test_empty_dict(tvm_runtime):
    assert pd.dumps({}) == bytes(tvm_runtime.save_param_dict({}))
    assert pd.loads(pd.dumps({})) == {}


def test_non_contiguous_and_big_endian_inputs_are_normalised(tvm_runtime):
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    strided = base[:, ::2]
    big = base.astype(">i4")
    assert pd.dumps({"x": strided}) == bytes(tvm_runtime.save_param_dict({"x": strided.copy()}))
    assert pd.dumps({"x": big}) == bytes(tvm_runtime.save_param_dict({"x": base}))
    _assert_same(pd.loads(pd.dumps({"x": big}))["x"], base)


# ----------------------------------------------------------------- format details


def test_layout_of_a_single_tensor():
    data = pd.dumps({"ab": np.array([1.0, 2.0], dtype=np.float32)})
    want = (
        struct.pack("<QQQ", 0xF7E58D4F05049CB7, 0, 1) + struct.pack("<Q", 2) + b"ab"
        + struct.pack("<Q", 1)
        + struct.pack("<QQiiiBBH", 0xDD5E40F096B4A13F, 0, 1, 0, 1, 2, 32, 1)
        + struct.pack("<qq", 2, 8) + struct.pack("<ff", 1.0, 2.0)
    )  # fmt: skip
    assert data == want


def test_bool_is_code_6_bits_8_and_legacy_uint1_reads_as_bool():
    data = bytearray(pd.dumps({"m": np.array([True, False, True])}))
    [entry] = pd.read_index(data)
    dtype_at = entry.offset - 8 - 8 - 4  # data size, shape[0], dtype
    assert data[dtype_at : dtype_at + 4] == bytes([6, 8, 1, 0])
    data[dtype_at : dtype_at + 2] = bytes([1, 1])
    _assert_same(pd.loads(bytes(data))["m"], np.array([True, False, True]))


def test_read_index_and_view_are_zero_copy():
    params = _small_dict()
    buf = bytearray(pd.dumps(params))
    entries = pd.read_index(buf, source="mem")
    assert [e.name for e in entries] == list(params)
    for entry in entries:
        _assert_same(pd.view(buf, entry), params[entry.name])
    w = next(e for e in entries if e.name == "w")
    arr = pd.view(buf, w)
    buf[w.offset : w.offset + 4] = struct.pack("<f", 42.0)
    assert arr[0, 0] == 42.0


def test_loads_returns_writable_copies():
    got = pd.loads(pd.dumps(_small_dict()))
    got["w"][0, 0] = 7.0
    assert got["w"].flags.writeable and got["w"].flags.c_contiguous


def test_save_and_load_files(tmp_path):
    path = tmp_path / "p.params"
    pd.save(path, _small_dict())
    got = pd.load(path)
    for name, arr in _small_dict().items():
        _assert_same(got[name], arr)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ParamDictError, match=rf"^{path}: truncated at byte \d+ while reading"):
        pd.load(path)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_mapped_file_reads_like_load(tmp_path, dtype):
    path = tmp_path / "m.params"
    params = {f"t{i}": _sample(dtype, shape, seed=i) for i, shape in enumerate(SHAPES)}
    pd.save(path, params)
    mapped = pd.MappedParams(path)
    assert list(mapped) == list(params) and len(mapped) == len(params) and "t0" in mapped and "x" not in mapped
    assert [(e.dtype, e.shape) for e in mapped.entries.values()] == [(dtype, a.shape) for a in params.values()]
    for name, want in params.items():
        got = mapped[name]
        _assert_same(got, want)
        assert not got.flags.writeable, "a view of the mapped file, not a copy"


def test_mapped_file_reads_data_only_when_asked(tmp_path):
    """The index is checked on opening; the bytes of a tensor when it is read."""
    path = tmp_path / "b.params"
    data, _ = _one_tensor(np.array([True, False]), name="m")
    path.write_bytes(data[:-1] + b"\x02")
    mapped = pd.MappedParams(path)
    assert mapped.entries["m"].shape == (2,)
    with pytest.raises(ParamDictError, match=rf"^{path}: tensor 'm' at byte \d+: bool data holds bytes other"):
        mapped["m"]


def test_mapped_file_refuses_empty_and_truncated_files(tmp_path):
    path = tmp_path / "e.params"
    path.write_bytes(b"")
    with pytest.raises(ParamDictError, match=rf"^{path}: truncated at byte 0"):
        pd.MappedParams(path)
    pd.save(path, _small_dict())
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ParamDictError, match=rf"^{path}: truncated at byte \d+ while reading"):
        pd.MappedParams(path)


@pytest.mark.skipif(sys.platform == "win32", reason="an open file cannot be deleted on Windows")
def test_mapped_arrays_outlive_the_file_name(tmp_path):
    """A dump replaced by a newer one (renamed over, old folder deleted) keeps its readers working."""
    path = tmp_path / "p.params"
    pd.save(path, _small_dict())
    mapped = pd.MappedParams(path)
    w = mapped["w"]
    path.unlink()
    _assert_same(w, _small_dict()["w"])
    _assert_same(mapped["mask"], _small_dict()["mask"])


@pytest.mark.parametrize(
    "value, key",
    [(np.zeros(2, np.complex64), "x"), (np.array(["a"], dtype=object), "x"),
     (np.zeros(2, np.float32), 3), (np.zeros(2, "datetime64[s]"), "x")],
)  # fmt: skip
def test_writer_rejects_unsupported(value, key):
    with pytest.raises(TypeError):
        pd.dumps({key: value})


# ----------------------------------------------------------------- strictness


def _corrupt(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new) :]


def _one_tensor(arr=None, name="foo") -> tuple[bytes, int]:
    """A one-tensor file and the offset of its tensor header."""
    arr = np.arange(4, dtype=np.int32) if arr is None else arr
    return pd.dumps({name: arr}), 8 * 4 + len(name.encode()) + 8


def test_truncation_at_every_offset_raises():
    data = pd.dumps(_small_dict())
    for cut in range(len(data)):
        with pytest.raises(ParamDictError, match=r"^f\.params: truncated at byte \d+"):
            pd.loads(data[:cut], source="f.params")


def test_truncated_data_message_names_tensor_and_sizes():
    data, _ = _one_tensor()
    msg = rf"^<bytes>: truncated at byte {len(data) - 16} while reading tensor 0 \('foo'\): "
    with pytest.raises(ParamDictError, match=msg + "expected 16 data bytes, found 6$"):
        pd.loads(data[:-10])


def test_trailing_garbage():
    with pytest.raises(ParamDictError, match="trailing garbage at byte"):
        pd.loads(pd.dumps(_small_dict()) + b"\0")


_Q, _q, _i = struct.Struct("<Q").pack, struct.Struct("<q").pack, struct.Struct("<i").pack
T = _one_tensor()[1]  # offset of the tensor header in _one_tensor()'s file
CORRUPTIONS = {  # case: (offset, replacement bytes, expected message regex)
    "list magic": (0, b"\x00", "bad magic at byte 0"),
    "names count huge": (16, _Q(2**62), "truncated at byte 16: names count"),
    "name length huge": (24, _Q(2**62), "expected 4611686018427387904 name"),
    "name not utf8": (32, b"\xff", "invalid name at byte 24 while reading name 0"),
    "tensor count": (T - 8, _Q(2), "count mismatch at byte 35: 2 tensors for 1 names"),
    "tensor magic": (T, b"\x00", rf"bad tensor magic at byte {T} while reading tensor 0"),
    "device": (T + 16, _i(2), "bad device"),
    "ndim negative": (T + 24, _i(-1), "bad ndim"),
    "ndim huge": (T + 24, _i(2**31 - 1), "bad ndim"),
    "dtype code": (T + 28, b"\x05", "unsupported DLDataType code=5 bits=32 lanes=1"),
    "dtype bits": (T + 29, b"\x07", "unsupported DLDataType code=0 bits=7"),
    "lanes": (T + 30, b"\x02", "lanes=2"),
    "negative dim": (T + 32, _q(-4), "negative dimension"),
    "huge dim": (T + 32, _q(2**62), "bad data size"),
    "data size": (T + 40, _q(2**62), "data size 4611686018427387904 != 16"),
}


@pytest.mark.parametrize("case", CORRUPTIONS, ids=str)
def test_specific_corruptions(case):
    offset, new, pattern = CORRUPTIONS[case]
    data, _ = _one_tensor()
    with pytest.raises(ParamDictError, match=pattern) as info:
        pd.loads(_corrupt(data, offset, new))
    assert "\n" not in str(info.value)


def test_duplicate_names_and_bad_bool_bytes():
    data = pd.dumps({"a": np.zeros(1), "b": np.zeros(1)})
    data = data.replace(_Q(1) + b"b", _Q(1) + b"a")
    with pytest.raises(ParamDictError, match=r"duplicate name at byte 33 while reading name 1"):
        pd.loads(data)
    data, _ = _one_tensor(np.array([True, False]), name="m")
    with pytest.raises(ParamDictError, match="bool data holds bytes other than 0 and 1"):
        pd.loads(data[:-1] + b"\x02")


# ----------------------------------------------------------------- fuzzing

FUZZ_SEED = pd.dumps(
    {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "m": np.array([True, False]),
        "s": np.array(3, dtype=np.int16),
        "e": np.zeros((2, 0), dtype=np.uint8),
    }
)


@st.composite
def _mutations(draw):
    data = bytearray(FUZZ_SEED)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[pos] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
    return bytes(data)


def _parse_or_param_dict_error(data: bytes) -> None:
    try:
        result = pd.loads(data)
    except ParamDictError as exc:
        assert "\n" not in str(exc)
        return
    assert all(isinstance(v, np.ndarray) for v in result.values())


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_fuzz_mutations_raise_only_param_dict_error(data):
    _parse_or_param_dict_error(data)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_random_suffix_after_valid_magic(tail):
    _parse_or_param_dict_error(FUZZ_SEED[:16] + tail)
    _parse_or_param_dict_error(tail)
