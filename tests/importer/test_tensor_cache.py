"""MLC's weights on disk as ``params=`` (issue 53): what ``tvm.contrib.tvmjs.dump_tensor_cache`` writes.

The producer is TVM's own writer (the one MLC's convert step calls, float32 stored as bfloat16 by
default); the reference reading is TVM's own loader, ``tvmjs.load_tensor_cache``.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm.contrib import tvmjs  # noqa: E402
from tvm.relax.frontend import nn  # noqa: E402

from tvm_probe import ModelError, Probe  # noqa: E402
from tvm_probe.importer.tensor_cache import load_tensor_cache  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        self.up, self.down = nn.Linear(8, 16, bias=True), nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.down(nn.op.silu(self.up(x)))


SPEC = {"forward": {"x": nn.spec.Tensor((1, 8), "float32")}}


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(p.shape).astype("float32") for name, p in MLP().named_parameters()}


def dumped(tmp_path, params, encode_format="f32-to-bf16", shard_cap_mb=32):
    folder = tmp_path / "weights"
    tvmjs.dump_tensor_cache(params, str(folder), encode_format=encode_format, shard_cap_mb=shard_cap_mb,
                            show_progress=False)
    return folder


@pytest.mark.parametrize("encode_format", ["f32-to-bf16", "raw"])
def test_a_cache_reads_as_tvms_own_loader_reads_it(tmp_path, encode_format):
    params = {**weights(), "ids": np.arange(5, dtype=np.int32), "half": np.linspace(-1, 1, 6, dtype=np.float16)}
    folder = dumped(tmp_path, params, encode_format)
    expected, _ = tvmjs.load_tensor_cache(str(folder), tvm.cpu())
    got = load_tensor_cache(folder)
    assert sorted(got) == sorted(expected)
    for name, array in got.items():
        np.testing.assert_array_equal(array, expected[name].numpy(), err_msg=name)
        assert array.dtype == params[name].dtype
    if encode_format == "raw":  # stored as is: equal to what was written
        np.testing.assert_array_equal(got["up.weight"], params["up.weight"])
    assert load_tensor_cache(folder / "tensor-cache.json").keys() == got.keys()


def test_from_nn_takes_the_folder_and_runs_on_those_weights(tmp_path):
    folder = dumped(tmp_path, weights())
    stored = load_tensor_cache(folder)  # the bfloat16-rounded weights the model will hold
    probe = Probe.from_nn(MLP(), SPEC, params=folder)
    x = np.random.default_rng(1).standard_normal((1, 8)).astype("float32")
    probe.call("forward", x)
    up = x @ stored["up.weight"].T + stored["up.bias"]
    np.testing.assert_allclose(probe.get("up"), up, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(probe.get("up.weight"), stored["up.weight"])


def test_a_cache_that_does_not_fit_is_one_line_naming_the_parameter_and_the_file(tmp_path):
    missing = dumped(tmp_path / "a", {k: v for k, v in weights().items() if k != "down.weight"})
    with pytest.raises(ModelError, match=r"the tensor cache '.*weights' has no weight 'down.weight'"):
        Probe.from_nn(MLP(), SPEC, params=missing)
    shaped = dumped(tmp_path / "b", {**weights(), "up.bias": np.zeros(15, np.float32)})
    with pytest.raises(ModelError, match=r"'up.bias' in the tensor cache .* is float32 \[15\]; the model's "
                                         r"parameter is float32 \[16\]"):
        Probe.from_nn(MLP(), SPEC, params=shaped)
    damaged = dumped(tmp_path / "c", weights())
    shard = next(damaged.glob("params_shard_*.bin"))
    shard.write_bytes(shard.read_bytes()[:-4])
    with pytest.raises(ModelError, match=r"shard '.*params_shard_0.bin' holds \d+ bytes, tensor-cache.json says"):
        load_tensor_cache(damaged)
    changed = dumped(tmp_path / "d", weights())
    shard = next(changed.glob("params_shard_*.bin"))
    data = bytearray(shard.read_bytes())
    data[0] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="fails its md5"):
        load_tensor_cache(changed)
    index = changed / "tensor-cache.json"
    record = json.loads(index.read_text())
    record["records"][0]["md5sum"] = ""
    record["records"][0]["records"][0]["nbytes"] += 2
    index.write_text(json.dumps(record))
    with pytest.raises(ModelError, match=r"is recorded as \d+ bytes at offset 0, but shape"):
        load_tensor_cache(changed)
    with pytest.raises(ModelError, match="does not exist: give a folder written by tvm.contrib.tvmjs.dump_tensor_cache"):
        load_tensor_cache(tmp_path / "nowhere")
